"""The SentencePiece (ALBERT) and byte-level BPE (RoBERTa) vocabulary formats of
tokenization/vocab.py, end to end: the directories load with AutoTokenizer as their model family's
fast tokenizer with its special-token ids, SentencePiece segments with the model's own Viterbi,
casing is explicit, builds are byte-for-byte deterministic and keep to vocab_size, meaningless
option combinations are refused, pretraining instances are framed by the format's [CLS]/[SEP] and
mark its word starts, and the coverage report compares all three formats (and a bare .model).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.pretrain.instance_recipe import starts_sentencepiece_word, word_start_rule, word_start_table
from biomed_lm.run_lock import ARTIFACT_LOCK_FILE
from biomed_lm.tokenization.coverage import (ReportSettings, build_report, count_words, load_vocabulary, parse_terms,
                                             segment_sample, source_statistics)
from biomed_lm.tokenization.model_inputs import corpus_source
from biomed_lm.tokenization.tokenizer_io import CasingMismatchError, albert_preprocessor, load_tokenizer
from biomed_lm.tokenization.vocab import (FORMATS, ChunkCounter, VocabBuildError, VocabConfig, VocabSizeError,
                                          build_vocab)
from biomed_lm.tokenization.word_counts import WORD_COUNTS_FILE
from biomed_lm.tokenization.words import WordSplitter
from tests.test_vocab import built, docs_file, sample_documents  # noqa: F401  (fixtures: read this module's docs)

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample" / "sywada_PubMedAbstract_1MB.txt"
N_DOCS = 150
EXTRA = ["RecA binds single-stranded DNA in Escherichia coli.",
         "Müller and Ångström measured the DNA of HeLa cells."] * 3
ALBERT_IDS = {"<pad>": 0, "<unk>": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
ROBERTA_IDS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4}
MARKERS = {"sentencepiece": "\u2581", "bytelevel-bpe": "\u0120"}
VOLATILE_CARD_KEYS = {"created_utc", "training_seconds", "inputs"}


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return sample_documents(N_DOCS) + EXTRA


def card(path: Path) -> dict:
    return json.loads((path / "vocab_card.json").read_text(encoding="utf-8"))


def auto(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


# ------------------------------------------------------------------------------ SentencePiece

@pytest.mark.parametrize("cased", [False, True])
def test_sentencepiece_directory_is_an_albert_tokenizer(built, cased):
    out = built(format="sentencepiece", cased=cased)
    written = {p.name for p in out.iterdir()} - {ARTIFACT_LOCK_FILE}
    assert written == {"tokenizer.json", "tokenizer_config.json", "spiece.model",
                       "vocab_card.json", WORD_COUNTS_FILE}
    tok = auto(out)
    assert type(tok).__name__ == "AlbertTokenizer" and tok.is_fast
    assert {t: tok.convert_tokens_to_ids(t) for t in ALBERT_IDS} == ALBERT_IDS
    assert (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id,
            tok.mask_token_id) == (0, 1, 2, 3, 4)
    assert len(tok) == 3000 and tok.model_max_length == 512
    pair = tok("the patients", "were treated")
    tokens = tok.convert_ids_to_tokens(pair["input_ids"])
    first_sep = tokens.index("[SEP]")
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and tokens.count("[SEP]") == 2
    assert pair["token_type_ids"] == [0] * (first_sep + 1) + [1] * (len(tokens) - first_sep - 1)
    assert tokens[1].startswith("\u2581") and tokens[first_sep + 1].startswith("\u2581")
    c = card(out)
    assert (c["format"], c["algorithm"], c["lowercase"], c["vocab_size"], c["vocab_size_requested"]) == \
        ("sentencepiece", "unigram", not cased, 3000, 3000)
    assert c["special_token_ids"] == ALBERT_IDS and c["sentencepiece_model"] == "spiece.model"
    assert set(c["library_versions"]) == {"tokenizers", "transformers", "sentencepiece"}
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert (config["tokenizer_class"], config["do_lower_case"], config["keep_accents"]) == \
        ("AlbertTokenizer", not cased, cased)


@pytest.mark.parametrize("cased", [False, True])
def test_sentencepiece_segments_with_the_models_own_viterbi(built, docs, cased):
    """The fast tokenizer gives exactly SentencePiece's segmentation of ALBERT-prepared text."""
    import sentencepiece as spm

    out = built(format="sentencepiece", cased=cased)
    sp = spm.SentencePieceProcessor(model_file=str(out / "spiece.model"))
    prepare = albert_preprocessor(lowercase=not cased)
    tok = auto(out)
    for text in docs:
        assert (tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
                == sp.encode(prepare.normalize_str(text)))
    assert [sp.id_to_piece(i) for i in range(5)] == list(ALBERT_IDS)
    assert all(sp.is_control(i) for i in (2, 3, 4)) and sp.is_unknown(1)


def test_sentencepiece_casing_is_explicit(built):
    uncased, cased = auto(built(format="sentencepiece")), auto(built(format="sentencepiece", cased=True))
    assert "".join(uncased.tokenize("Müller RecA")).replace("\u2581", "") == "mullerreca"
    assert "".join(cased.tokenize("RecA HeLa")).replace("\u2581", "") == "RecAHeLa"
    with pytest.raises(CasingMismatchError):
        load_tokenizer(built(format="sentencepiece"), lowercase=False)
    # A bare model file: casing inferred from its pieces, ALBERT's pipeline around it.
    bare = load_tokenizer(built(format="sentencepiece", cased=True) / "spiece.model")
    assert bare.init_kwargs["do_lower_case"] is False and bare.tokenize("RecA") == cased.tokenize("RecA")
    assert load_tokenizer(built(format="sentencepiece") / "spiece.model").init_kwargs["do_lower_case"] is True


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=30))
def test_chunk_counter_ascii_path_is_albert_preparation(text):
    for lowercase in (False, True):
        counter = ChunkCounter(lowercase)
        if text.isprintable():
            assert counter.prepare(text) == albert_preprocessor(lowercase).normalize_str(text)


# ---------------------------------------------------------------------------- byte-level BPE

def test_bytelevel_bpe_directory_is_a_roberta_tokenizer(built):
    out = built(format="bytelevel-bpe", cased=True)
    written = {p.name for p in out.iterdir()} - {ARTIFACT_LOCK_FILE}
    assert written == {"tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                       "vocab_card.json"}
    tok = auto(out)
    assert type(tok).__name__ == "RobertaTokenizer" and tok.is_fast
    assert (tok.cls_token_id, tok.pad_token_id, tok.sep_token_id, tok.unk_token_id,
            tok.mask_token_id) == (0, 1, 2, 3, 4)
    vocab = json.loads((out / "vocab.json").read_text(encoding="utf-8"))
    assert {t: vocab[t] for t in ROBERTA_IDS} == ROBERTA_IDS and len(vocab) == len(tok) == 3000
    assert len((out / "merges.txt").read_text(encoding="utf-8").splitlines()) > 2000
    tokens = tok.convert_ids_to_tokens(tok("The patients", "were treated")["input_ids"])
    assert tokens[0] == "<s>" and tokens[-1] == "</s>" and tokens.count("</s>") == 3  # <s> A </s></s> B </s>
    assert tokens[1] == "The" and tokens[2] == "\u0120patients"  # no prefix space: the first word has no Ġ
    ids = tok("the <mask> was", add_special_tokens=False)["input_ids"]
    assert ids == [vocab["the"], 4, vocab["\u0120was"]]  # <mask> takes the space before it, as RoBERTa's
    c = card(out)
    assert (c["format"], c["algorithm"], c["lowercase"], c["add_prefix_space"], c["vocab_size"]) == \
        ("bytelevel-bpe", "bpe", False, False, 3000)
    assert c["special_token_ids"] == ROBERTA_IDS and c["alphabet_size"] == 256
    assert json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))["add_prefix_space"] is False


def test_bytelevel_bpe_prefix_space_and_casing(built):
    spaced = auto(built(format="bytelevel-bpe", cased=True, add_prefix_space=True))
    assert spaced.tokenize("patients")[0].startswith("\u0120")
    assert card(built(format="bytelevel-bpe", cased=True, add_prefix_space=True))["add_prefix_space"] is True
    uncased_dir = built(format="bytelevel-bpe")
    uncased = auto(uncased_dir)  # RoBERTa's class has no normalizer: uncased is a generic fast tokenizer
    assert (json.loads((uncased_dir / "tokenizer_config.json").read_text())["tokenizer_class"]
            == "PreTrainedTokenizerFast")
    assert uncased.tokenize("DNA Müller") == uncased.tokenize("dna muller")
    assert (uncased.cls_token_id, uncased.pad_token_id, uncased.sep_token_id, uncased.mask_token_id) == (0, 1, 2, 4)
    with pytest.raises(CasingMismatchError):
        load_tokenizer(uncased_dir, lowercase=False)


# ------------------------------------------------------------------------ every format

def directory_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())
            if p.name not in ("vocab_card.json", ARTIFACT_LOCK_FILE)}


@pytest.mark.parametrize("fmt", ["sentencepiece", "bytelevel-bpe"])
def test_builds_are_deterministic(docs_file, tmp_path, fmt):
    config = VocabConfig(vocab_size=2000, format=fmt, cased=True)
    first, second = (build_vocab([docs_file], tmp_path / name, config).output_dir for name in ("a", "b"))
    assert directory_bytes(first) == directory_bytes(second)
    strip = lambda c: {k: v for k, v in c.items() if k not in VOLATILE_CARD_KEYS}  # noqa: E731
    assert strip(card(first)) == strip(card(second))


@pytest.mark.parametrize("fmt", ["sentencepiece", "bytelevel-bpe"])
def test_vocab_size_counts_the_special_tokens(docs_file, tmp_path, fmt):
    out = build_vocab([docs_file], tmp_path / "v", VocabConfig(vocab_size=700, format=fmt)).output_dir
    assert len(auto(out)) == card(out)["vocab_size"] == 700
    big = build_vocab([docs_file], tmp_path / "big", VocabConfig(vocab_size=200_000, format=fmt)).output_dir
    assert card(big)["vocab_size"] < 200_000 and card(big)["vocab_size_requested"] == 200_000
    assert len(auto(big)) == card(big)["vocab_size"]


def test_meaningless_combinations_are_refused(tmp_path, docs_file, capsys):
    assert FORMATS == ("wordpiece", "sentencepiece", "bytelevel-bpe")
    with pytest.raises(VocabBuildError, match="algorithm 'unigram' chooses how a WordPiece vocabulary"):
        VocabConfig(format="sentencepiece", algorithm="unigram")
    with pytest.raises(VocabBuildError, match="special_token_layout 'compact'.*<s> <pad> </s> <unk> <mask>"):
        VocabConfig(format="bytelevel-bpe", special_token_layout="compact")
    with pytest.raises(VocabBuildError, match="add_prefix_space applies to format bytelevel-bpe only"):
        VocabConfig(format="sentencepiece", add_prefix_space=True)
    with pytest.raises(VocabBuildError, match="unknown format 'bpe'"):
        VocabConfig(format="bpe")
    with pytest.raises(VocabSizeError, match="special tokens and the 256 bytes alone take 261 ids"):
        VocabConfig(format="bytelevel-bpe", vocab_size=261)
    with pytest.raises(VocabSizeError, match="too small.*alphabet"):
        build_vocab([docs_file], tmp_path / "small", VocabConfig(format="sentencepiece", vocab_size=40))
    config = tmp_path / "bad.yaml"
    config.write_text("format: sentencepiece\nspecial_token_layout: compact\n", encoding="utf-8")
    spec = importlib.util.spec_from_file_location("build_vocab_formats_cli", REPO / "launch" / "build_vocab.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    assert module.main(["--config", str(config), "--inputs", str(docs_file), "--output-dir", str(tmp_path / "o")]) == 2
    assert "special_token_layout 'compact'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------- pretraining instances

def sentence_documents(docs: list[str], n: int = 40) -> list[list[str]]:
    return [[s for s in re.split(r"(?<=\.) (?=[A-Z])", text) if s] for text in docs[:n]]


@pytest.mark.parametrize("fmt", ["sentencepiece", "bytelevel-bpe"])
def test_pretraining_instances_are_framed_and_mark_word_starts(docs, tmp_path, fmt):
    from biomed_lm.pretrain.data import load_pretraining_data
    from biomed_lm.pretrain.instance_builder import PretrainingDataConfig, create_pretraining_data
    from tests.test_pretraining_data import save_corpus

    documents = sentence_documents(docs)
    corpus = save_corpus(documents, tmp_path / "corpus")
    vocab = build_vocab([str(corpus)], tmp_path / "vocab", VocabConfig(vocab_size=1500, format=fmt)).output_dir
    out = tmp_path / "instances"
    metadata = create_pretraining_data(PretrainingDataConfig(corpus=str(corpus), tokenizer=str(vocab),
                                                             output_dir=str(out),
                                                             max_seq_length=64, num_proc=1), progress=False)
    tokenizer = load_tokenizer(vocab)
    dataset, _ = load_pretraining_data(out, tokenizer=tokenizer)  # the vocabulary fingerprint and casing agree
    assert metadata["summary"]["instances"] == len(dataset) > 20
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    assert (cls, sep) == ((2, 3) if fmt == "sentencepiece" else (0, 2))
    marker, marked, continuations = MARKERS[fmt], 0, 0
    starts = starts_sentencepiece_word if fmt == "sentencepiece" else lambda t: t.startswith(marker)
    for row in dataset:
        ids = row["input_ids"]
        assert ids[0] == cls and ids[-1] == sep and ids.count(sep) == 2 and ids.count(cls) == 1
        tokens = tokenizer.convert_ids_to_tokens(ids)
        after_special = [False] + [i in (cls, sep) for i in ids[:-1]]
        expected = [0 if i in (cls, sep) else int(starts(t) or after) for i, t, after in
                    zip(ids, tokens, after_special)]
        assert row["word_starts"] == expected
        marked += sum(t.startswith(marker) for t in tokens)
        assert 0 < sum(row["word_starts"])
        continuations += len(ids) - 3 - sum(row["word_starts"])
    assert marked > 100 and continuations > len(dataset)  # words of several pieces exist


def test_sentencepiece_words_start_where_albert_starts_them():
    """Data audit (2026-11-28): a SentencePiece word started only at ``▁``, so punctuation stayed glued
    to the word before it (``▁( standard / d evi ant ) :`` one word). ALBERT's create_pretraining_data
    starts a word at ``▁``, at ``<...>`` symbols, at punctuation pieces and at pieces with characters
    other than ASCII letters; byte-level BPE keeps fairseq's rule (the marker alone)."""
    pieces = ["▁(", "▁standard", "/", "d", "evi", "ant", ")", ":", "▁il", "-", "6", "▁α", "s.", "<unk>", "[CLS]"]
    vocab = {piece: index for index, piece in enumerate(pieces)}
    table = word_start_table(vocab, [vocab["[CLS]"]], start_marker="▁")
    assert dict(zip(pieces, table.tolist())) == {
        "▁(": 1, "▁standard": 1, "/": 1, "d": 0, "evi": 0, "ant": 0, ")": 1, ":": 1, "▁il": 1, "-": 1, "6": 1,
        "▁α": 1, "s.": 0, "<unk>": 1, "[CLS]": 0}
    bpe = word_start_table({"Ġthe": 0, "(": 1, "ant": 2}, [], start_marker="Ġ")
    assert bpe.tolist() == [1, 0, 0]
    assert word_start_rule("▁") and not word_start_rule("Ġ") and not word_start_rule(None)


def test_a_byte_level_bpe_sentence_keeps_the_space_before_it(built):
    """QA: instances are built sentence by sentence, and byte-level BPE without a prefix space gave each
    sentence's first word no ``Ġ``: ``field.Compared`` decoded, 8,350 of 13,426 tokens after a full stop
    unmarked, and whole-word masking read ``field.Compared`` as one word. Each sentence is now tokenized
    as it stands in running text; SentencePiece and WordPiece are unchanged."""
    from biomed_lm.pretrain.instance_builder import encode_documents, pipeline_tokenizer

    for fmt, cased in (("bytelevel-bpe", True), ("bytelevel-bpe", False)):
        tokenizer = auto(built(format=fmt, cased=cased))
        pipeline = pipeline_tokenizer(tokenizer)
        encoded = encode_documents(pipeline, [["The test field.", "Compared to normals, the cells died."]])
        second = encoded.ids[encoded.sentence_offsets[1]:encoded.sentence_offsets[2]].tolist()
        running_text = tokenizer(" Compared to normals, the cells died.", add_special_tokens=False)["input_ids"]
        assert second == running_text and tokenizer.convert_ids_to_tokens(second)[0].startswith("\u0120")
        assert tokenizer.convert_ids_to_tokens(second[:1]) != ["Compared"]
    from tokenizers import Tokenizer

    from biomed_lm.tokenization.tokenizer_io import with_prefix_space

    for fmt in ("sentencepiece", "wordpiece"):  # no byte-level pre-tokenizer: nothing to change
        backend = Tokenizer.from_str(auto(built(format=fmt)).backend_tokenizer.to_str())
        assert not with_prefix_space(backend)


# --------------------------------------------------------------------------- coverage report

@pytest.fixture(scope="module")
def three(built):
    """The same corpus, uncased, as WordPiece, SentencePiece (directory and bare model) and byte-level BPE."""
    sp_dir = built(format="sentencepiece")
    return [load_vocabulary("wordpiece", built(format="wordpiece")), load_vocabulary("sentencepiece", sp_dir),
            load_vocabulary("spm_file", sp_dir / "spiece.model"), load_vocabulary("bpe", built(format="bytelevel-bpe"))]


def test_coverage_report_compares_the_three_formats(three, docs, tmp_path):
    wordpiece, sentencepiece, spm_file, bpe = three
    assert [v.info.format for v in three] == ["wordpiece", "sentencepiece", "sentencepiece", "bytelevel-bpe"]
    assert spm_file.info.kind == "SentencePiece .model file" and spm_file.info.lowercase
    held_out = tmp_path / "held_out.txt"
    held_out.write_text("".join(line + "\n" for line in
                                SAMPLE.read_text(encoding="utf-8").splitlines()[N_DOCS + 50:N_DOCS + 150]))
    # Words every vocabulary holds whole (word-start form), and two it cannot.
    common = ["patients", "the", "cells", "with", "protein"]
    assert all(f"\u2581{w}" in sentencepiece.engine.get_vocab() and f"\u0120{w}" in bpe.engine.get_vocab()
               and w in wordpiece.engine.get_vocab() for w in common)
    terms = parse_terms(common + ["oropharyngeal", "chloramphenicol"])
    report = build_report(three, [corpus_source("held_out", held_out)], terms, settings=ReportSettings(top_words=5))
    for name in ("wordpiece", "sentencepiece", "spm_file", "bpe"):
        assert [row.whole[name] for row in report.terms.rows][:len(common)] == [True] * len(common)
        assert not report.terms.rows[-1].whole[name]  # a rare term is split by every small vocabulary
    (source,) = report.sources
    stats = {s.vocabulary: s for s in source.stats}
    for s in stats.values():
        assert s.pieces_per_word >= 1.0 and 0.5 < s.whole_fraction < 1.0 and s.pieces_per_instance > 100
    assert stats["bpe"].unk_words == 0  # every byte is in the alphabet
    assert stats["sentencepiece"] == dataclass_replace(stats["spm_file"], vocabulary="sentencepiece")
    overlap = {(o.a, o.b): o for o in report.overlaps}
    assert overlap[("sentencepiece", "spm_file")].jaccard == 1.0
    assert (0.1 < overlap[("wordpiece", "bpe")].jaccard < 1.0
            and 0.1 < overlap[("wordpiece", "sentencepiece")].jaccard < 1)
    print("\n" + "\n".join(f"{n}: pieces/word {s.pieces_per_word:.3f}, pieces/instance {s.pieces_per_instance:.1f}, "
                           f"whole {s.whole_fraction:.1%}, [UNK] {s.unk_rate:.2%}" for n, s in stats.items()))
    print("terms kept whole:", report.terms.whole_counts, "overlap wordpiece/sentencepiece/bpe:",
          {k: round(o.jaccard, 3) for k, o in overlap.items()})


def dataclass_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)


def test_word_level_pieces_track_running_text(three, docs):
    """Words are segmented one by one; for the formats that mark word starts the sum stays within
    3% of tokenizing the documents themselves (WordPiece: exactly)."""
    sample = count_words(WordSplitter()(doc) for doc in docs)
    for vocab in three:
        direct = sum(len(e.tokens) for e in vocab.engine.encode_batch(docs, add_special_tokens=False))
        pieces = source_statistics(sample, segment_sample(vocab, sample)).pieces
        if vocab.info.format == "wordpiece":
            assert pieces == direct
        else:
            assert abs(pieces / direct - 1) < 0.03, (vocab.name, pieces, direct)


def test_segments_and_wordpiece_forms(three):
    _, sentencepiece, _, bpe = three
    assert bpe.segment(["patients", ","]) == [("\u0120patients",), (",",)]  # a comma is attached, not spaced
    assert sentencepiece.segment(["patients", "("])[0] == ("\u2581patients",)
    assert "patients" in bpe.tokens and "patients" in sentencepiece.tokens
    assert not any(t.startswith(("\u2581", "\u0120")) for t in sentencepiece.tokens | bpe.tokens)
    assert sentencepiece.segment(["\u4e2d"]) == [("\u2581", "<unk>")] or \
        sentencepiece.segment(["\u4e2d"]) == [("<unk>",)]  # an unknown character reads as <unk>


def test_vocab_report_cli_takes_every_format(three, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("vocab_report_formats_cli", REPO / "launch" / "vocab_report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    out = tmp_path / "report"
    argv = ["--tokenizers", *(f"{v.name}={v.info.path}" for v in three), "--corpus", f"sample={SAMPLE}",
            "--max-instances", "50", "--output-dir", str(out)]
    assert module.main(argv) == 0
    printed = capsys.readouterr().out
    assert "sentencepiece, uncased" in printed and "bytelevel-bpe, uncased" in printed
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "| `spm_file` | sentencepiece |" in markdown and "| `bpe` | bytelevel-bpe |" in markdown
    data = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert [v["format"] for v in data["vocabularies"]] == ["wordpiece", "sentencepiece", "sentencepiece",
                                                           "bytelevel-bpe"]


def test_fine_tuning_gives_an_uncased_byte_level_bpe_its_prefix_space(built):
    """QA: an uncased byte-level BPE export loads as transformers' generic fast tokenizer, which ignores
    ``add_prefix_space=True``, so NER's pre-split words were tokenized as text starts
    (``['p','ati','ent']`` where running text has ``Ġpatient``). prepare_tokenizer sets it on the backend."""
    from transformers import AutoTokenizer

    from biomed_lm.finetune.adapters.tagging import _word_pieces
    from biomed_lm.finetune.model_families import checkpoint_family, prepare_tokenizer

    roberta = checkpoint_family("roberta")
    for cased in (False, True):
        tokenizer = AutoTokenizer.from_pretrained(str(built(format="bytelevel-bpe", cased=cased)),
                                                  **roberta.tokenizer_kwargs())
        notes = prepare_tokenizer(tokenizer, roberta)
        assert bool(notes) == (not cased)  # the cased RobertaTokenizer applied the option itself
        words = ["the", "patient", "had", "breast", "cancer"]
        pieces = _word_pieces(tokenizer, [words])[0]
        running = tokenizer(" " + " ".join(words), add_special_tokens=False)["input_ids"]
        assert sum(pieces, []) == running
        assert all(tokenizer.convert_ids_to_tokens(p)[0].startswith("\u0120") for p in pieces)


def test_one_file_of_a_tokenizer_directory_is_refused_naming_the_directory(built):
    """QA: ``--tokenizer vocab/vocab.json`` (RoBERTa's) was read as a bare vocab.txt, and
    create_pretraining_data ended in a traceback from the WordPiece model; ``tokenizer.json`` gave "ids
    are not contiguous". Every stage loads through load_tokenizer, which now names the directory."""
    out = built(format="bytelevel-bpe", cased=True)
    for name in ("vocab.json", "tokenizer.json", "merges.txt", "tokenizer_config.json"):
        with pytest.raises(ValueError, match=rf"{name} is one file of a tokenizer directory, .*pass the directory "
                                             rf"\({re.escape(str(out))}\)"):
            load_tokenizer(out / name)
    assert load_tokenizer(out).is_fast  # the directory itself loads


def test_a_worker_that_trained_sentencepiece_still_forks_its_steps(built, docs_file, tmp_path):
    """SentencePiece keeps its trainer's thread pool after training; a child forked afterwards crashed (SIGSEGV)
    when it trained again (CI: the bioalbert recipe's vocabulary step). tests/conftest.py trains in a forked
    child of the test process, so the worker's later steps are forked too (a new interpreter each cost 6-15 s)."""
    from tests import forked_main

    built(format="sentencepiece", cased=False)  # trained for this process (or earlier in this module)
    assert forked_main.fork_refusal() is None
    done = forked_main.run_command([sys.executable, "launch/build_vocab.py", "--format", "sentencepiece",
                                    "--vocab-size", "1500", "--inputs", str(docs_file), "--output-dir",
                                    str(tmp_path / "again"), "--no-progress"], timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
