"""A vocabulary folder holding only vocab.txt, and a vocab.txt whose line numbers cannot be its ids
(tokenization/tokenizer_io.py's loader, used by vocab_report and create_pretraining_data).

QA: a folder with only vocab.txt ended in transformers' "Couldn't instantiate the backend tokenizer ... install
sentencepiece or tiktoken" (the file itself loaded); a vocab.txt with "the" on two lines was "vocabulary ids are
not contiguous from 0 (missing e.g. [273])" in create_pretraining_data and a 600-token vocabulary in
vocab_report; beside an intact tokenizer.json the damaged vocab.txt went unnoticed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from biomed_lm.pretrain.data import vocabulary_fingerprint
from biomed_lm.pretrain.instance_builder import load_tokenizer_info
from biomed_lm.tokenization.tokenizer_io import VocabularyFileError, load_tokenizer, save_tokenizer_dir
from biomed_lm.tokenization.vocab import build_wordpiece_tokenizer, special_tokens
from tests.test_coverage import run_cli

WORDS = ["the", "insulin", "receptor", "binds", "dna", "in", "cells", ".", "##s", "##ing"]
CASED_WORDS = ["The", "Insulin", "RecA", "binds", "DNA", "in", "cells", ".", "##s"]


def _vocab_lines(words: list[str]) -> list[str]:
    return [*special_tokens("compact"), *words]


def _write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _tokenizer_folder(folder: Path, words: list[str], lowercase: bool = True) -> Path:
    """A folder as build_vocab writes it (tokenizer.json, vocab.txt, configs, card), without training."""
    save_tokenizer_dir(build_wordpiece_tokenizer(_vocab_lines(words), lowercase=lowercase), folder, lowercase)
    return folder


@pytest.mark.parametrize("words, lowercase", [(WORDS, True), (CASED_WORDS, False)])
def test_a_folder_with_only_vocab_txt_loads_as_the_file_does(tmp_path, words, lowercase):
    vocab = _write(tmp_path / "only" / "vocab.txt", _vocab_lines(words))
    from_folder, from_file = load_tokenizer(vocab.parent), load_tokenizer(vocab)
    assert from_folder.init_kwargs["do_lower_case"] is lowercase  # casing from the vocabulary, as the file's
    assert from_folder.get_vocab() == from_file.get_vocab()
    text = "The Insulin receptor binds DNA"
    assert from_folder.tokenize(text) == from_file.tokenize(text)
    assert vocabulary_fingerprint(from_folder) == vocabulary_fingerprint(from_file)
    assert load_tokenizer_info(vocab.parent).vocab_size == len(_vocab_lines(words))  # create_pretraining_data's


def test_a_folder_with_only_vocab_txt_in_the_report(tmp_path, capsys):
    vocab = _write(tmp_path / "only" / "vocab.txt", _vocab_lines(WORDS))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The insulin receptor binds DNA in cells.\n", encoding="utf-8")
    assert run_cli(["--tokenizers", f"v={vocab.parent}", "--corpus", str(corpus), "--terms", "",
                    "--output-dir", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    assert f"v: {len(_vocab_lines(WORDS))}-token wordpiece, uncased" in out
    assert "sentencepiece or tiktoken" not in err


@pytest.mark.parametrize("where", ["file", "folder"])
def test_a_duplicate_token_is_refused_naming_the_token_and_both_lines(tmp_path, where):
    lines = _vocab_lines(WORDS)
    vocab = _write(tmp_path / "dup" / "vocab.txt", [*lines, "the"])
    with pytest.raises(VocabularyFileError, match=rf"{vocab}: the token 'the' is on line 6 and again on line "
                                                  rf"{len(lines) + 1}"):
        load_tokenizer(vocab if where == "file" else vocab.parent)


def test_a_blank_line_is_refused_naming_it(tmp_path):
    lines = _vocab_lines(WORDS)
    vocab = _write(tmp_path / "vocab.txt", [*lines[:7], "", *lines[7:]])
    with pytest.raises(VocabularyFileError, match=rf"{vocab}: line 8 is blank"):
        load_tokenizer(vocab)


def test_create_pretraining_data_and_the_report_name_the_duplicate(tmp_path, capsys):
    """Both stages load through load_tokenizer: the duplicate is named, not 'ids not contiguous' or accepted."""
    lines = _vocab_lines(WORDS)
    vocab = _write(tmp_path / "dup" / "vocab.txt", [*lines, "the"])
    with pytest.raises(VocabularyFileError, match=r"'the' is on line 6 and again on line 16"):
        load_tokenizer_info(vocab.parent)
    assert run_cli(["--tokenizers", f"v={vocab}", "--terms", "", "--output-dir", str(tmp_path / "out")]) == 2
    assert f"tokenizer 'v': cannot load {vocab}: {vocab}: the token 'the' is on line 6" in capsys.readouterr().err


def test_a_damaged_vocab_txt_beside_an_intact_tokenizer_json_names_both_files(tmp_path):
    folder = _tokenizer_folder(tmp_path / "tok", WORDS)
    lines = (folder / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert load_tokenizer(folder).get_vocab()["the"] == lines.index("the")  # intact: loads
    _write(folder / "vocab.txt", [*lines, "the"])
    with pytest.raises(VocabularyFileError, match=rf"{folder / 'vocab.txt'} and {folder / 'tokenizer.json'} "
                                                  rf"disagree: in vocab.txt the token 'the' is on line 6 and again "
                                                  rf"on line {len(lines) + 1}, where tokenizer.json has it once, "
                                                  r"as id 5"):
        load_tokenizer(folder)


def test_a_vocab_txt_edited_apart_from_its_tokenizer_json_is_refused(tmp_path):
    """No duplicate, but another token at an id: the slow and the fast tokenizer would disagree on ids."""
    folder = _tokenizer_folder(tmp_path / "tok", WORDS)
    lines = (folder / "vocab.txt").read_text(encoding="utf-8").splitlines()
    _write(folder / "vocab.txt", [*lines[:6], "zebrafish", *lines[7:]])
    with pytest.raises(VocabularyFileError, match=r"vocab.txt's line 7 is 'zebrafish' where tokenizer.json has "
                                                  r"'insulin' as id 6"):
        load_tokenizer(folder)
    shutil.copy(folder / "vocab.txt", tmp_path / "alone.txt")  # the file alone holds no duplicate: it loads
    assert load_tokenizer(tmp_path / "alone.txt").get_vocab()["zebrafish"] == 6


def test_tokens_added_above_the_vocabulary_and_what_shifts_no_id_are_accepted(tmp_path):
    """Review: transformers saves added tokens (relation markers) in tokenizer.json and added_tokens.json, above
    the vocab.txt it writes; a whitespace token is a token; blank lines at the end shift no id."""
    folder = _tokenizer_folder(tmp_path / "tok", WORDS)
    tokenizer = load_tokenizer(folder)
    tokenizer.add_tokens(["[E1]", "[/E1]"], special_tokens=True)
    tokenizer.save_pretrained(folder)
    assert (folder / "vocab.txt").read_text(encoding="utf-8").splitlines() == _vocab_lines(WORDS)
    assert load_tokenizer(folder).convert_tokens_to_ids("[E1]") == len(_vocab_lines(WORDS))
    spaced = _write(tmp_path / "spaced.txt", [*_vocab_lines(WORDS), "\u3000", "", ""])
    assert load_tokenizer(spaced).convert_tokens_to_ids("insulin") == 6  # loads (was refused as a blank line)
