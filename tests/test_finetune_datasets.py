"""Tests of the BLURB dataset readers: counts on the real data (BLURB's Table 3 where the data here is
BLURB's), every reader and generic format on inline fixtures, a malformed line per format (the error
names file, line and field), and the derived splits (fixed by the seed, disjoint, complete)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.errors import InputError
from biomed_lm.finetune.datasets import BLURB as REGISTRY  # name -> entry (BLURB here is the data folder)
from biomed_lm.finetune.datasets import (ACCURACY, BLURB_DATASETS, DEFAULT_SPLIT_SEED, ENTITY_F1, F1_POSITIVE,
                                         HOC_HALLMARKS, METRICS, MICRO_F1_MULTILABEL, MICRO_F1_POSITIVE, PEARSON,
                                         PICO_TOKEN_MACRO_F1, TASK_TYPES, DatasetFormatError, DocumentExample, Entity,
                                         MissingDatasetFileError, PicoExample, QAExample, RelationExample,
                                         SentencePairExample, TokenTaggingExample, UnknownDatasetError,
                                         blurb_dataset_names, blurb_spec, canonical_dataset_name, load_blurb_dataset,
                                         load_generic_dataset, seeded_partition)

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
BLURB = SHARED_DATA / "blurb"
COMMITTED_NCBI = REPO / "data" / "blurb" / "NCBI-disease"


def real_dir(relative: str) -> Path:
    """A dataset directory under ../shared/data/blurb, or a clean skip naming what is missing."""
    path = BLURB / relative
    if not path.is_dir():
        pytest.skip(f"{path} is absent (the shared data folder {SHARED_DATA} is not here)")
    return path


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def format_error(path: Path, line: int | None, field: str | None = None) -> str:
    """The start of the message a DatasetFormatError for this place has."""
    where = re.escape(str(path)) + (f", line {line}" if line is not None else "")
    return where + (f": field {re.escape(repr(field))}:" if field is not None else ":")


def ids(examples) -> list[str]:
    return [e.id for e in examples]


def mentions(examples) -> int:
    return sum(tag.startswith("B-") for e in examples for tag in e.tags)


def assert_partition(dataset, universe: set[str]) -> None:
    """The splits are disjoint and together hold exactly ``universe``."""
    seen: list[str] = [i for examples in dataset.splits.values() for i in ids(examples)]
    assert len(seen) == len(set(seen))
    assert set(seen) == universe


# ====================================================================== real data: counts as in BLURB

@pytest.fixture(scope="module")
def ebm():
    return load_blurb_dataset("ebm-pico", real_dir("pico/ebmnlp"))


@pytest.fixture(scope="module")
def ddi():
    return load_blurb_dataset("DDI", real_dir("re/ddi"))


def test_ncbi_disease_committed_copy_matches_blurb():
    """The copy the repo ships: sentence counts, and BLURB's 5134/787/960 mentions (B- tags)."""
    dataset = load_blurb_dataset("NCBI_Disease", COMMITTED_NCBI)
    assert (dataset.name, dataset.task_type, dataset.metric) == ("ncbi-disease", "ner", ENTITY_F1)
    assert dataset.labels == ("O", "B-Disease", "I-Disease")
    assert dataset.sizes() == {"train": 5424, "dev": 923, "test": 940}
    assert {s: mentions(e) for s, e in dataset.splits.items()} == {"train": 5134, "dev": 787, "test": 960}
    first = dataset.splits["train"][0]
    assert first.tokens[8:11] == ("adenomatous", "polyposis", "coli")
    assert first.tags[8:12] == ("B-Disease", "I-Disease", "I-Disease", "I-Disease")


def test_ncbi_disease_shared_copy_is_the_same():
    shared = load_blurb_dataset("ncbi-disease", real_dir("ner/NCBI-disease"))
    committed = load_blurb_dataset("ncbi-disease", COMMITTED_NCBI)
    assert shared.splits == committed.splits


def test_gad_counts_and_form():
    dataset = load_blurb_dataset("gad", real_dir("re/gad"))
    assert dataset.sizes() == {"train": 4261, "dev": 535, "test": 534}
    assert (dataset.metric, dataset.labels, dataset.negative_label) == (F1_POSITIVE, ("0", "1"), "0")
    for example in dataset.splits["train"]:
        assert example.masked_text == example.text and example.entities == ()
        assert "@GENE$" in example.text and "@DISEASE$" in example.text
    assert Counter(e.label for e in dataset.splits["train"]) == {"1": 2227, "0": 2034}


def test_ddi_counts_labels_and_offsets(ddi):
    assert ddi.sizes() == {"train": 25296, "dev": 2496, "test": 5716}
    assert (ddi.metric, ddi.negative_label) == (MICRO_F1_POSITIVE, "DDI-false")
    assert Counter(e.label for e in ddi.splits["train"]) == {
        "DDI-false": 21745, "DDI-effect": 1486, "DDI-mechanism": 1163, "DDI-advise": 725, "DDI-int": 177}
    discontinuous = 0
    for examples in ddi.splits.values():
        for example in examples:
            assert len(example.entities) == 2 and not example.text.endswith(("\r", "\n"))
            assert example.masked_text.count("@DRUG$") >= 1
            for entity in example.entities:
                if len(entity.spans) == 1:
                    assert example.text[entity.start:entity.end] == entity.text
                else:
                    discontinuous += 1
                    pieces = "".join(example.text[a:b] for a, b in entity.spans)
                    assert "".join(pieces.split()) == "".join(entity.text.split())
    assert discontinuous == 169  # 130 + 9 + 30 entities written 'a-b;c-d' in the three files
    first = ddi.splits["train"][0]
    assert first.entities[0] == Entity(70, 85, "drug_n", "contortrostatin")  # "70-84" has an inclusive end
    # The source's off-by-one "(R)-warfarin" offsets are corrected, and said so.
    assert any("4 example(s) had entity offsets off" in note and "line 5918" in note for note in ddi.notes)


def test_pubmedqa_splits():
    directory = real_dir("qa/pubmedqa")
    dataset = load_blurb_dataset("PubMedQA", directory)
    assert dataset.sizes() == {"train": 450, "dev": 50, "test": 500}
    assert (dataset.metric, dataset.labels) == (ACCURACY, ("yes", "no", "maybe"))
    truth = json.loads((directory / "test_ground_truth.json").read_text(encoding="utf-8"))
    assert {e.id: e.label for e in dataset.splits["test"]} == truth
    questions = json.loads((directory / "ori_pqal.json").read_text(encoding="utf-8"))
    assert_partition(dataset, set(questions))
    example = dataset.splits["test"][0]
    assert example.question == questions[example.id]["QUESTION"]
    assert example.context == " ".join(questions[example.id]["CONTEXTS"])


def test_hoc_abstract_level_labels_and_split():
    directory = real_dir("classification/hoc")
    dataset = load_blurb_dataset("HoC", directory)
    assert dataset.sizes() == {"train": 1295, "dev": 186, "test": 371}  # BLURB's sizes, sum 1852
    assert (dataset.metric, dataset.labels) == (MICRO_F1_MULTILABEL, HOC_HALLMARKS)
    records = [json.loads(line) for line in (directory / "hoc_combined.jsonl").open(encoding="utf-8")]
    assert_partition(dataset, {r["pmid"] for r in records})
    by_id = {e.id: e for examples in dataset.splits.values() for e in examples}
    for record in records:
        example = by_id[record["pmid"]]
        assert example.labels <= set(HOC_HALLMARKS)
        assert example.labels == set(record["doc_hallmarks"])
        assert example.text == " ".join(record["sentences"])
    assert sum(not e.labels for e in by_id.values()) == 272  # the control abstracts with no hallmark
    assert by_id["11724768"].labels == {"Sustaining proliferative signaling"}


def test_biosses_blue_split():
    dataset = load_blurb_dataset("biosses", real_dir("similarity/biosses"))
    assert dataset.sizes() == {"train": 70, "dev": 16, "test": 14}
    assert (dataset.metric, dataset.labels) == (PEARSON, ())
    assert_partition(dataset, {str(i) for i in range(100)})  # BLUE's old_index, unique over the 100 pairs
    assert all(0.0 <= e.score <= 4.0 for examples in dataset.splits.values() for e in examples)
    # dev.tsv's second pair has a quoted sentence holding a tab: it is one field.
    quoted = next(e for e in dataset.splits["dev"] if e.id == "78")
    assert quoted.text_b.startswith("GATA2lox/lox") and "\t" in quoted.text_b and quoted.score == 1.4
    assert any("64/16/20" in note for note in dataset.notes)


def test_ebm_pico_trains_on_dev(ebm):
    assert ebm.labels == ("PAR", "INT", "OUT") and ebm.metric == PICO_TOKEN_MACRO_F1
    abstracts = {s: {e.id.split("-")[0] for e in examples} for s, examples in ebm.splits.items()}
    assert (len(abstracts["train"]), len(abstracts["dev"]), len(abstracts["test"])) == (864, 96, 191)
    assert not abstracts["train"] & abstracts["dev"]
    # Only one tag per token in SciBERT's file: every set holds at most one element.
    assert all(len(s) <= 1 for examples in ebm.splits.values() for e in examples for s in e.elements)
    tokens = Counter(x for e in ebm.splits["test"] for s in e.elements for x in s)
    assert tokens == {"OUT": 5138, "PAR": 4060, "INT": 2710}
    assert any("training uses dev.txt" in note for note in ebm.notes)


def test_jnlpba_needs_train_unless_allowed():
    directory = real_dir("ner/JNLPBA")
    with pytest.raises(MissingDatasetFileError, match=r"no train file.*train\.tsv.*allow_missing_train"):
        load_blurb_dataset("jnlpba", directory)
    dataset = load_blurb_dataset("jnlpba", directory, allow_missing_train=True)
    assert dataset.labels == ("O", "B-Entity", "I-Entity")
    assert mentions(dataset.splits["train"]) + mentions(dataset.splits["dev"]) == 4551  # BLURB's dev mentions
    assert mentions(dataset.splits["test"]) == 8662
    assert any("carved from devel.tsv" in note for note in dataset.notes)
    assert any("merged into one type" in note for note in dataset.notes)


def test_bioasq_proxy_carves_dev_from_train():
    directory = real_dir("qa/bioasq-yesno-proxy")
    dataset = load_blurb_dataset("bioasq", directory)
    assert dataset.sizes() == {"train": 655, "dev": 73, "test": 128}
    assert dataset.labels == ("yes", "no")
    questions = {s: {e.question for e in examples} for s, examples in dataset.splits.items()}
    assert not questions["train"] & questions["dev"]  # a repeated question stays on one side


def test_derived_splits_are_fixed_by_the_seed(ebm):
    """Same seed, same ids (and the default seed is what a plain call uses); another seed, another split."""
    directory = real_dir("classification/hoc")
    default = load_blurb_dataset("hoc", directory)
    again = load_blurb_dataset("hoc", directory, split_seed=DEFAULT_SPLIT_SEED)
    other = load_blurb_dataset("hoc", directory, split_seed=DEFAULT_SPLIT_SEED + 1)
    assert {s: ids(e) for s, e in default.splits.items()} == {s: ids(e) for s, e in again.splits.items()}
    assert ids(default.splits["test"]) != ids(other.splits["test"]) and other.sizes() == default.sizes()
    qa = real_dir("qa/pubmedqa")
    first, second = load_blurb_dataset("pubmedqa", qa, split_seed=7), load_blurb_dataset("pubmedqa", qa, split_seed=7)
    assert ids(first.splits["dev"]) == ids(second.splits["dev"])
    assert ids(first.splits["test"]) == ids(load_blurb_dataset("pubmedqa", qa).splits["test"])  # test never moves
    assert ids(ebm.splits["test"]) == ids(load_blurb_dataset("ebm-pico", real_dir("pico/ebmnlp"), split_seed=3)
                                          .splits["test"])


# ============================================================================== names and the registry

def test_thirteen_names_with_their_metrics_and_labels():
    assert blurb_dataset_names() == ("bc5-chem", "bc5-disease", "ncbi-disease", "bc2gm", "jnlpba", "ebm-pico",
                                     "chemprot", "ddi", "gad", "biosses", "hoc", "pubmedqa", "bioasq")
    assert BLURB_DATASETS == blurb_dataset_names()  # the names, a tuple here as in the registry
    metrics = {name: spec.metric for name, spec in REGISTRY.items()}
    assert metrics == {"bc5-chem": ENTITY_F1, "bc5-disease": ENTITY_F1, "ncbi-disease": ENTITY_F1,
                       "bc2gm": ENTITY_F1, "jnlpba": ENTITY_F1, "ebm-pico": PICO_TOKEN_MACRO_F1,
                       "chemprot": MICRO_F1_POSITIVE, "ddi": MICRO_F1_POSITIVE, "gad": F1_POSITIVE,
                       "biosses": PEARSON, "hoc": MICRO_F1_MULTILABEL, "pubmedqa": ACCURACY, "bioasq": ACCURACY}
    assert {spec.task_type for spec in REGISTRY.values()} == set(TASK_TYPES)
    assert all(spec.metric in METRICS for spec in REGISTRY.values())
    assert blurb_spec("chemprot").labels == ("False", "CPR:3", "CPR:4", "CPR:5", "CPR:6", "CPR:9")
    for spec in REGISTRY.values():
        assert spec.negative_label is None or spec.negative_label == spec.labels[0]


@pytest.mark.parametrize("spelling, name", [
    ("NCBI-disease", "ncbi-disease"), ("ncbi_disease", "ncbi-disease"), ("BC5-CHEM", "bc5-chem"),
    ("bc5cdr_chem", "bc5-chem"), ("BC2GM", "bc2gm"), ("EBM-NLP", "ebm-pico"), ("ebm_pico", "ebm-pico"),
    ("PubMedQA", "pubmedqa"), ("bio-asq", "bioasq"), ("HoC", "hoc"),
])
def test_names_ignore_case_and_separators(spelling, name):
    assert canonical_dataset_name(spelling) == name


def test_unknown_name_lists_the_valid_ones(tmp_path):
    with pytest.raises(UnknownDatasetError, match=r"unknown BLURB dataset 'mednli'; valid names: bc5-chem, "
                                                   r"bc5-disease, .*, bioasq$"):
        load_blurb_dataset("mednli", tmp_path)


# ========================================================================================= NER

NER_TRAIN = "Aspirin\tB\nand\tO\nsodium\tB-Chemical\nsalicylate\tI-chemical\n\nNone\tO\n"


def ner_dir(root: Path, train: str = NER_TRAIN, dev: str = "x\tO\n", test: str = "y\tB\n") -> Path:
    write(root, "train.tsv", train)
    write(root, "devel.tsv", dev)
    write(root, "test.tsv", test)
    return root


def test_ner_tags_are_mapped_to_the_dataset_type(tmp_path):
    dataset = load_blurb_dataset("bc5-chem", ner_dir(tmp_path))
    assert dataset.labels == ("O", "B-Chemical", "I-Chemical")
    assert dataset.splits["train"] == [
        TokenTaggingExample("train-0", ("Aspirin", "and", "sodium", "salicylate"),
                            ("B-Chemical", "O", "B-Chemical", "I-Chemical")),
        TokenTaggingExample("train-1", ("None",), ("O",))]
    assert dataset.splits["test"][0].tags == ("B-Chemical",)


def test_ner_rejects_another_entity_type(tmp_path):
    root = ner_dir(tmp_path, train="Aspirin\tB-Chemical\n\nfever\tB-Disease\n")
    with pytest.raises(DatasetFormatError, match=format_error(root / "train.tsv", 3, "tag") + ".*'Disease'"):
        load_blurb_dataset("bc5-chem", root)


@pytest.mark.parametrize("line, field", [("Aspirin\tB\tx", None), ("Aspirin", None), ("\tO", "token"),
                                         ("Aspirin\t", "tag"), ("Aspirin\tX-Chemical", "tag")])
def test_ner_malformed_line(tmp_path, line, field):
    root = ner_dir(tmp_path, dev=f"ok\tO\n\n{line}\n")
    with pytest.raises(DatasetFormatError, match=format_error(root / "devel.tsv", 3, field)) as err:
        load_blurb_dataset("bc5-chem", root)
    assert err.value.line == 3 and err.value.field == field and err.value.path == str(root / "devel.tsv")


def test_ner_missing_file_names_the_expected_path(tmp_path):
    write(tmp_path, "train.tsv", NER_TRAIN)
    write(tmp_path, "test.tsv", NER_TRAIN)
    with pytest.raises(MissingDatasetFileError, match=re.escape(str(tmp_path / "dev.tsv"))):
        load_blurb_dataset("bc2gm", tmp_path)
    with pytest.raises(MissingDatasetFileError, match=r"no such directory"):
        load_blurb_dataset("bc2gm", tmp_path / "absent")
    with pytest.raises(MissingDatasetFileError, match=rf"{re.escape(str(tmp_path / 'train.tsv'))} is a file; "
                                                      "data_dir is the directory"):  # was "no such directory"
        load_generic_dataset("ner", tmp_path / "train.tsv")


def test_exact_split_names_win_and_ties_are_errors(tmp_path):
    root = ner_dir(tmp_path)
    write(root, "train_dev.tsv", "z\tO\n")  # BioBERT's extra file must not be taken for dev
    assert load_blurb_dataset("bc5-chem", root).splits["dev"][0].tokens == ("x",)
    write(root, "dev.tsv", "z\tO\n")
    with pytest.raises(InputError, match=r"more than one dev file \(dev\.tsv, devel\.tsv\)"):
        load_blurb_dataset("bc5-chem", root)


def test_carving_train_from_devel_keeps_documents_whole(tmp_path):
    docs = "".join(f"-DOCSTART-\tO\n\nw{d}a\tB-protein\n\nw{d}b\tI-DNA\nx\tO\n\n" for d in range(30))
    write(tmp_path, "devel.tsv", docs)
    write(tmp_path, "test.tsv", "y\tB-RNA\n")
    dataset = load_blurb_dataset("jnlpba", tmp_path, allow_missing_train=True, split_seed=5)
    assert dataset.sizes() == {"train": 54, "dev": 6, "test": 1}  # 3 of 30 documents (10%) to dev
    documents = {s: {e.tokens[0][:-1] for e in examples} for s, examples in dataset.splits.items() if s != "test"}
    assert not documents["train"] & documents["dev"] and len(documents["dev"]) == 3
    assert_partition(dataset, {f"devel-{i}" for i in range(60)} | {"test-0"})
    again = load_blurb_dataset("jnlpba", tmp_path, allow_missing_train=True, split_seed=5)
    assert ids(again.splits["dev"]) == ids(dataset.splits["dev"])


def test_generic_ner_infers_labels_or_takes_them(tmp_path):
    write(tmp_path, "train.tsv", "a\tB-Gene\nb\tI-Gene\nc\tB-Chem\n\nd\tO\n")
    write(tmp_path, "test.tsv", "e\tS-Chem\n")
    dataset = load_generic_dataset("ner", tmp_path)
    assert dataset.labels == ("O", "B-Chem", "S-Chem", "B-Gene", "I-Gene")
    assert (dataset.metric, dataset.name, dataset.sizes()) == (ENTITY_F1, tmp_path.name, {"train": 2, "test": 1})
    fixed = ("O", "B-Gene", "I-Gene", "B-Chem", "S-Chem")
    assert load_generic_dataset("ner", tmp_path, labels=fixed, name="mine").labels == fixed
    with pytest.raises(DatasetFormatError, match=format_error(tmp_path / "train.tsv", 3, "tag") + ".*'B-Chem'"):
        load_generic_dataset("ner", tmp_path, labels=["O", "B-Gene", "I-Gene"])


def test_generic_ner_sentences_run_together_are_a_warning_naming_the_file(tmp_path):
    """QA, 2026-11-28: a NER file without the blank lines between sentences trained and scored as one
    sentence of 150 tokens, with no word about it."""
    sentence = "".join(f"w{i}\t{'B-Gene' if i % 5 == 0 else 'O'}\n" for i in range(30))
    write(tmp_path, "train.tsv", sentence * 5)  # 5 sentences of 30 tokens, blank lines missing
    write(tmp_path, "dev.tsv", (sentence + "\n") * 11)  # 11 of 30, as they should be
    write(tmp_path, "test.tsv", "".join(f"w{i}\tO\n" for i in range(301)))
    warnings = load_generic_dataset("ner", tmp_path, labels=["Gene"]).warnings
    assert warnings == [
        f"{tmp_path / 'train.tsv'}: 1 sentence, the longest of 150 tokens (from line 1): are blank lines between "
        "sentences missing? Each sentence ends with an empty line",
        f"{tmp_path / 'test.tsv'}: 1 sentence, the longest of 301 tokens (from line 1): are blank lines between "
        "sentences missing? Each sentence ends with an empty line"]


# ========================================================================================= PICO

EBM_DEV = ("-DOCSTART- (111)\n\nAspirin NN O I-INT\nin NN O O\nadults NN O I-PAR\n\n\n\n"
           "-DOCSTART- (222)\n\nPain NN O I-OUT\n\nfell NN O O\n")


def test_ebm_format_and_train_on_dev(tmp_path):
    dev_docs = "".join(f"-DOCSTART- ({pmid})\n\nw NN O I-PAR\n\nv NN O O\n\n\n" for pmid in range(100, 120))
    write(tmp_path, "dev.txt", dev_docs)
    write(tmp_path, "test.txt", EBM_DEV)
    dataset = load_blurb_dataset("ebm_pico", tmp_path)
    assert dataset.splits["test"] == [
        PicoExample("111-0", ("Aspirin", "in", "adults"), (frozenset({"INT"}), frozenset(), frozenset({"PAR"}))),
        PicoExample("222-0", ("Pain",), (frozenset({"OUT"}),)),
        PicoExample("222-1", ("fell",), (frozenset(),))]
    dev_abstracts = {e.id.split("-")[0] for e in dataset.splits["dev"]}
    train_abstracts = {e.id.split("-")[0] for e in dataset.splits["train"]}
    assert len(dev_abstracts) == 2 and not dev_abstracts & train_abstracts  # 10% of 20, whole abstracts
    assert dev_abstracts | train_abstracts == {str(p) for p in range(100, 120)}


def test_ebm_malformed_line(tmp_path):
    write(tmp_path, "dev.txt", EBM_DEV)
    write(tmp_path, "test.txt", "-DOCSTART- (1)\n\nAspirin NN I-INT\n")
    with pytest.raises(DatasetFormatError, match=format_error(tmp_path / "test.txt", 3) + r" expected 'token POS O"):
        load_blurb_dataset("ebm-pico", tmp_path)
    write(tmp_path, "test.txt", "-DOCSTART- (1)\n\nAspirin NN O I-CMP\n")
    with pytest.raises(DatasetFormatError, match=format_error(tmp_path / "test.txt", 3, "tag") + ".*'CMP'"):
        load_blurb_dataset("ebm-pico", tmp_path)


def test_generic_pico_allows_several_elements_per_token(tmp_path):
    write(tmp_path, "train.tsv", "Aspirin\tI-INT|I-PAR\nusers\tPAR\nslept\tO\n")
    dataset = load_generic_dataset("pico", tmp_path)
    assert dataset.labels == ("INT", "PAR") and dataset.metric == PICO_TOKEN_MACRO_F1
    assert dataset.splits["train"][0].elements == (frozenset({"INT", "PAR"}), frozenset({"PAR"}), frozenset())
    write(tmp_path, "train.tsv", "Aspirin\tI-INT|\n")
    with pytest.raises(DatasetFormatError, match=format_error(tmp_path / "train.tsv", 1, "tag")):
        load_generic_dataset("pico", tmp_path)


# ===================================================================================== relation

def relation_dir(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        write(root, name, text)
    return root


def test_gad_tsv_with_and_without_header(tmp_path):
    root = relation_dir(tmp_path, {
        "gad_blurb_train.tsv": "sentence\tlabel\n@GENE$ is linked to @DISEASE$.\t1\r\n",
        "gad_blurb_dev.tsv": "@GENE$ and @DISEASE$.\t0\n",
        "gad_blurb_test.tsv": "index\tsentence\tlabel\n7\t@GENE$ in @DISEASE$.\t1\n"})
    dataset = load_blurb_dataset("gad", root)
    assert dataset.splits["train"] == [RelationExample("train-2", "@GENE$ is linked to @DISEASE$.",
                                                       "@GENE$ is linked to @DISEASE$.", (), "1")]
    assert dataset.splits["dev"][0].id == "dev-1" and dataset.splits["test"][0].id == "7"


@pytest.mark.parametrize("line, field", [("@GENE$ and @DISEASE$.\t2", "label"), ("@GENE$\t1\textra", None),
                                         ("\t1", "sentence"), ("@GENE$ and @GENE$.\t1", "sentence"),
                                         ("No placeholder here.\t0", "sentence")])
def test_relation_tsv_malformed_line(tmp_path, line, field):
    root = relation_dir(tmp_path, {"train.tsv": "sentence\tlabel\nok @GENE$ @DISEASE$\t1\n" + line + "\n",
                                   "dev.tsv": "a\t0\n", "test.tsv": "b\t1\n"})
    with pytest.raises(DatasetFormatError, match=format_error(root / "train.tsv", 3, field)):
        load_blurb_dataset("gad", root)


def test_chemprot_tsv_and_jsonl(tmp_path):
    tsv = relation_dir(tmp_path / "tsv", {
        "train.tsv": "@CHEMICAL$ inhibits @GENE$.\tCPR:4\n", "dev.tsv": "@CHEMICAL$ and @GENE$.\tfalse\n",
        "test.tsv": "index\tsentence\tlabel\n1.T1.T2\t@CHEMICAL$ binds @GENE$.\tCPR:9\n"})
    dataset = load_blurb_dataset("ChemProt", tsv)
    assert [e.label for s in ("train", "dev", "test") for e in dataset.splits[s]] == ["CPR:4", "False", "CPR:9"]
    assert dataset.negative_label == "False"
    record = {"id": "c1", "sentence": "Aspirin inhibits COX-1.", "masked": "@CHEMICAL$ inhibits @GENE$.",
              "e1": {"text": "Aspirin", "type": "CHEMICAL", "offset": "0-7"},       # exclusive end
              "e2": {"text": "COX-1", "type": "GENE", "offset": "17-21"}, "label": "CPR:4"}  # inclusive end
    js = relation_dir(tmp_path / "jsonl", {f"{s}.jsonl": jsonl([record]) for s in ("train", "dev", "test")})
    example = load_blurb_dataset("chemprot", js).splits["dev"][0]
    assert example.entities == (Entity(0, 7, "CHEMICAL", "Aspirin"), Entity(17, 22, "GENE", "COX-1"))
    assert example.masked_text == "@CHEMICAL$ inhibits @GENE$."
    write(js, "train.tsv", "x\tCPR:3\n")
    with pytest.raises(InputError, match=r"both train\.tsv and train\.jsonl"):
        load_blurb_dataset("chemprot", js)


DDI_RECORD = {"id": "d1", "sentence": "Synthetic estrogen and progestogen given with aspirin.\r\n",
              "masked": "@DRUG$ given with @DRUG$.\r\n",
              "e1": {"text": "Synthetic progestogen", "type": "group", "offset": "0-8;23-33"},
              "e2": {"text": "aspirin", "type": "drug", "offset": "46-52"}, "label": "DDI-effect"}


def ddi_dir(root: Path, record: dict) -> Path:
    return relation_dir(root, {f"ddi_blurb_{s}.jsonl": jsonl([record]) for s in ("train", "dev", "test")})


def test_ddi_record_with_discontinuous_entity(tmp_path):
    example = load_blurb_dataset("ddi", ddi_dir(tmp_path, DDI_RECORD)).splits["train"][0]
    assert example.text == "Synthetic estrogen and progestogen given with aspirin."
    assert example.masked_text == "@DRUG$ given with @DRUG$."
    assert example.entities == (Entity(0, 34, "group", "Synthetic progestogen", ((0, 9), (23, 34))),
                                Entity(46, 53, "drug", "aspirin"))


def test_ddi_offset_one_off_is_corrected_and_noted(tmp_path):
    record = dict(DDI_RECORD, e2={"text": "aspirin", "type": "drug", "offset": "45-51"})
    dataset = load_blurb_dataset("ddi", ddi_dir(tmp_path, record))
    assert dataset.splits["dev"][0].entities[1] == Entity(46, 53, "drug", "aspirin")
    assert any("ddi_blurb_dev.jsonl: 1 example(s)" in n and "e2 offset 45-51 shifted by +1" in n
               for n in dataset.notes)


@pytest.mark.parametrize("change, field", [
    ({"e2": {"text": "aspirin", "type": "drug", "offset": "10-16"}}, "e2.offset"),
    ({"e2": {"text": "aspirin", "type": "drug", "offset": "46"}}, "e2.offset"),
    ({"e1": {"text": "x", "offset": "0-0"}}, "e1.type"),
    ({"e1": "aspirin"}, "e1"),
    ({"label": "DDI-maybe"}, "label"),
    ({"sentence": 3}, "sentence"),
    ({"e2": {"text": "aspirin", "type": "DRUG", "offset": "46-52"}}, "e2.type"),  # not one of DDI's types
])
def test_ddi_malformed_record(tmp_path, change, field):
    root = ddi_dir(tmp_path, DDI_RECORD)
    write(root, "ddi_blurb_test.jsonl", jsonl([DDI_RECORD, dict(DDI_RECORD, id="d2", **change)]))
    with pytest.raises(DatasetFormatError, match=format_error(root / "ddi_blurb_test.jsonl", 2, field)):
        load_blurb_dataset("ddi", root)


def test_ddi_invalid_json_and_duplicate_id(tmp_path):
    root = ddi_dir(tmp_path, DDI_RECORD)
    write(root, "ddi_blurb_train.jsonl", jsonl([DDI_RECORD]) + '{"id": "d2", "sentence": \n')
    with pytest.raises(DatasetFormatError, match=format_error(root / "ddi_blurb_train.jsonl", 2)
                       + r" not valid JSON: Expecting value at column 26$"):
        load_blurb_dataset("ddi", root)
    write(root, "ddi_blurb_train.jsonl", jsonl([DDI_RECORD]) + '{"id": "d2", "sentence": "open\n')
    with pytest.raises(DatasetFormatError, match=format_error(root / "ddi_blurb_train.jsonl", 2)  # once "at at column"
                       + r" not valid JSON: Unterminated string starting at column 26$"):
        load_blurb_dataset("ddi", root)
    for document in (json.dumps([DDI_RECORD]), json.dumps(DDI_RECORD, indent=2)):  # an array; pretty-printed
        write(root, "ddi_blurb_train.jsonl", document + "\n")
        with pytest.raises(DatasetFormatError, match=format_error(root / "ddi_blurb_train.jsonl", 1) + ".*; a JSON "
                           "Lines file holds one JSON object per line, not a JSON array or an object spread over"):
            load_blurb_dataset("ddi", root)
    write(root, "ddi_blurb_train.jsonl", jsonl([DDI_RECORD, DDI_RECORD]))
    with pytest.raises(DatasetFormatError, match=format_error(root / "ddi_blurb_train.jsonl", 2, "id")
                       + r" duplicate id 'd1' \(first on line 1\)"):
        load_blurb_dataset("ddi", root)


def test_generic_relation_jsonl(tmp_path):
    record = {"id": "r1", "text": "BRCA1 causes breast cancer.", "label": "causes",
              "entities": [{"start": 0, "end": 5, "type": "gene"}, {"start": 13, "end": 26, "type": "disease",
                                                                      "text": "breast cancer"}]}
    write(tmp_path, "train.jsonl", jsonl([record, dict(record, id="r2", label="none")]))
    dataset = load_generic_dataset("relation", tmp_path, negative_label="none")
    assert (dataset.labels, dataset.metric, dataset.negative_label) == (("causes", "none"), MICRO_F1_POSITIVE, "none")
    assert dataset.splits["train"][0] == RelationExample(
        "r1", "BRCA1 causes breast cancer.", None,
        (Entity(0, 5, "gene", "BRCA1"), Entity(13, 26, "disease", "breast cancer")), "causes")
    assert load_generic_dataset("relation", tmp_path).metric == ACCURACY
    bad = dict(record, entities=[{"start": 0, "end": 6, "type": "gene", "text": "BRCA1"}])
    write(tmp_path, "train.jsonl", jsonl([record, bad]))
    with pytest.raises(DatasetFormatError, match=format_error(tmp_path / "train.jsonl", 2, "entities[0].text")):
        load_generic_dataset("relation", tmp_path)
    write(tmp_path, "train.jsonl", jsonl([dict(record, entities=[{"start": 0, "end": 99, "type": "gene"}])]))
    with pytest.raises(DatasetFormatError, match=format_error(tmp_path / "train.jsonl", 1, "entities[0].end")):
        load_generic_dataset("relation", tmp_path)


GENERIC_PAIR = [{"start": 0, "end": 5, "type": "gene"}, {"start": 13, "end": 26, "type": "disease"}]


@pytest.mark.parametrize("entities, field, message", [
    (GENERIC_PAIR + [{"start": 6, "end": 12, "type": "verb"}], "entities", "two entities, got 3"),
    (GENERIC_PAIR[:1], "entities", "two entities, got 1"),
    ([GENERIC_PAIR[0], {"start": 12, "end": 13, "type": "disease"}], "entities[1].end", "only whitespace"),
    ([GENERIC_PAIR[0], dict(GENERIC_PAIR[1], type="a disease")], "entities[1].type", "upper-case letters"),
])
def test_generic_relation_record_fine_tuning_could_not_use(tmp_path, entities, field, message):
    """What encoding a relation needs (two entities, each covering a token, each type a placeholder
    name) is checked where the line is read, not found out by a ValueError during featurization."""
    record = {"id": "r1", "text": "BRCA1 causes breast cancer.", "label": "causes", "entities": GENERIC_PAIR}
    write(tmp_path, "train.jsonl", jsonl([record, dict(record, id="r2", entities=entities)]))
    with pytest.raises(DatasetFormatError, match=format_error(tmp_path / "train.jsonl", 2, field) + ".*" + message):
        load_generic_dataset("relation", tmp_path)


def test_generic_relation_tsv_needs_two_placeholders(tmp_path):
    write(tmp_path, "train.tsv", "@X$ binds @Y$.\tyes\nOne @X$ only.\tno\n")
    with pytest.raises(DatasetFormatError, match=format_error(tmp_path / "train.tsv", 2, "sentence") + ".*found 1"):
        load_generic_dataset("relation", tmp_path)
    write(tmp_path, "train.tsv", "@X$ binds @Y$.\tyes\nThe @X-Y$ complex.\tno\n")
    assert len(load_generic_dataset("relation", tmp_path).splits["train"]) == 2


# =================================================================================== similarity

BLUE_HEADER = "\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"


def test_biosses_blue_format_with_quoted_tab(tmp_path):
    write(tmp_path, "train.tsv", BLUE_HEADER + "0\tG\tB\t1997\t43\tB\tB\tA gene.\tAnother gene.\t3.0\n")
    write(tmp_path, "dev.tsv", BLUE_HEADER + '0\tG\tB\t1997\t78\tB\tB\tTRAF6:\t"lox\tloss"\t1.4\n')
    write(tmp_path, "test.tsv", BLUE_HEADER + "0\tG\tB\t1997\t3\tB\tB\tx.\ty.\t0\n")
    dataset = load_blurb_dataset("biosses", tmp_path)
    assert dataset.splits["dev"] == [SentencePairExample("78", "TRAF6:", "lox\tloss", 1.4)]
    write(tmp_path, "test.tsv", BLUE_HEADER + "0\tG\tB\t1997\t3\tB\tB\tx.\ty.\t4.5\n")
    with pytest.raises(DatasetFormatError, match=format_error(tmp_path / "test.tsv", 2, "score") + ".*outside"):
        load_blurb_dataset("biosses", tmp_path)


def test_generic_similarity(tmp_path):
    write(tmp_path, "train.tsv", "A cat.\tA feline.\t4.5\nA dog.\tA car.\t0.25\n")
    write(tmp_path, "dev.tsv", "text_a\ttext_b\tscore\nx\ty\t1\n")
    dataset = load_generic_dataset("similarity", tmp_path)
    assert (dataset.metric, dataset.labels) == (PEARSON, ())
    assert dataset.splits["train"][1] == SentencePairExample("train-2", "A dog.", "A car.", 0.25)
    assert dataset.splits["dev"][0].id == "dev-2"
    for bad, field in (("x\ty\thigh", "score"), ("x\ty", None), ("x\t\t1", "text_b"), ('"x\ty\t1', None)):
        write(tmp_path, "train.tsv", f"a\tb\t1\n{bad}\n")
        with pytest.raises(DatasetFormatError, match=format_error(tmp_path / "train.tsv", 2, field)):
            load_generic_dataset("similarity", tmp_path)


# =============================================================================== classification

def hoc_record(pmid: str, labels: list[list[str]], **extra) -> dict:
    return {"pmid": pmid, "sentences": [f"Sentence {i} ." for i in range(len(labels))],
            "sentence_labels": labels, **extra}


def test_hoc_labels_are_top_level_hallmarks(tmp_path):
    records = [hoc_record("1", [["Resisting cell death--Apoptosis"], [],
                                ["Tumor promoting inflammation--Immune response", "Cellular energetics--"]],
                          doc_hallmarks=["Resisting cell death", "Tumor promoting inflammation",
                                         "Cellular energetics"]),
               hoc_record("2", [["NULL"]], doc_hallmarks=[])]
    records += [hoc_record(str(p), [[]]) for p in range(3, 23)]
    write(tmp_path, "hoc_combined.jsonl", jsonl(records))
    dataset = load_blurb_dataset("hoc", tmp_path)
    by_id = {e.id: e for examples in dataset.splits.values() for e in examples}
    assert by_id["1"] == DocumentExample(
        "1", "Sentence 0 . Sentence 1 . Sentence 2 .", ("Sentence 0 .", "Sentence 1 .", "Sentence 2 ."),
        frozenset({"Resisting cell death", "Tumor promoting inflammation", "Cellular energetics"}))
    assert by_id["2"].labels == frozenset()
    assert dataset.sizes() == {"train": 16, "dev": 2, "test": 4}  # BLURB's proportions on 22 abstracts
    assert_partition(dataset, {str(p) for p in range(1, 23)})


@pytest.mark.parametrize("record, field", [
    (hoc_record("9", [["Growing wings--Fast"]]), "sentence_labels"),
    (hoc_record("9", [["Cellular energetics--"]], doc_hallmarks=["Inducing angiogenesis"]), "doc_hallmarks"),
    (dict(hoc_record("9", [[]]), sentence_labels=[[], []]), "sentence_labels"),
    (dict(hoc_record("9", [[]]), pmid=None), "pmid"),
])
def test_hoc_malformed_record(tmp_path, record, field):
    write(tmp_path, "hoc_combined.jsonl", jsonl([hoc_record("1", [[]]), record]))
    with pytest.raises(DatasetFormatError, match=format_error(tmp_path / "hoc_combined.jsonl", 2, field)):
        load_blurb_dataset("hoc", tmp_path)


def test_hoc_given_split_files_are_used_as_they_are(tmp_path):
    for split, pmid in (("train", "1"), ("dev", "2"), ("test", "3")):
        write(tmp_path, f"{split}.jsonl", jsonl([hoc_record(pmid, [["Cellular energetics--Glycolysis"]])]))
    dataset = load_blurb_dataset("hoc", tmp_path)
    assert {s: ids(e) for s, e in dataset.splits.items()} == {"train": ["1"], "dev": ["2"], "test": ["3"]}
    (tmp_path / "dev.jsonl").unlink()
    with pytest.raises(MissingDatasetFileError, match=re.escape(str(tmp_path / "dev.jsonl"))):
        load_blurb_dataset("hoc", tmp_path)


def test_generic_classification(tmp_path):
    write(tmp_path, "train.jsonl", jsonl([{"id": "a", "text": "Tumour cells.", "labels": ["x", "y"]},
                                          {"text": "Nothing.", "labels": []}]))
    dataset = load_generic_dataset("classification", tmp_path)
    assert (dataset.labels, dataset.metric) == (("x", "y"), MICRO_F1_MULTILABEL)
    assert dataset.splits["train"] == [DocumentExample("a", "Tumour cells.", ("Tumour cells.",), {"x", "y"}),
                                       DocumentExample("train-2", "Nothing.", ("Nothing.",), frozenset())]
    with pytest.raises(DatasetFormatError, match=format_error(tmp_path / "train.jsonl", 1, "labels") + ".*'y'"):
        load_generic_dataset("classification", tmp_path, labels=["x"])
    write(tmp_path, "train.jsonl", jsonl([{"text": "a", "labels": "x"}]))
    with pytest.raises(DatasetFormatError, match=format_error(tmp_path / "train.jsonl", 1, "labels")):
        load_generic_dataset("classification", tmp_path)


# =========================================================================================== QA

def pubmedqa_dir(root: Path, n: int = 40, tests: int = 20, truth: dict | None = None) -> Path:
    answers = ["yes", "no", "maybe"]
    questions = {str(1000 + i): {"QUESTION": f"Q{i}?", "CONTEXTS": [f"Background {i}.", "Results."],
                                 "final_decision": answers[i % 3], "LONG_ANSWER": "Conclusion."}
                 for i in range(n)}
    write(root, "ori_pqal.json", json.dumps(questions, indent=4))
    truth = truth if truth is not None else {p: q["final_decision"] for p, q in list(questions.items())[:tests]}
    write(root, "test_ground_truth.json", json.dumps(truth, indent=4))
    return root


def test_pubmedqa_split_on_a_fixture(tmp_path):
    dataset = load_blurb_dataset("pubmedqa", pubmedqa_dir(tmp_path))
    assert dataset.sizes() == {"train": 18, "dev": 2, "test": 20}  # 10% of the 20 non-test questions to dev
    assert ids(dataset.splits["test"]) == [str(1000 + i) for i in range(20)]
    assert dataset.splits["test"][1] == QAExample("1001", "Q1?", "Background 1. Results.", "no")
    assert_partition(dataset, {str(1000 + i) for i in range(40)})


def test_pubmedqa_errors_name_file_and_line(tmp_path):
    root = pubmedqa_dir(tmp_path, truth={"1000": "yes", "1001": "yes"})
    with pytest.raises(DatasetFormatError, match=format_error(root / "test_ground_truth.json", 3)
                       + " PMID '1001': answer 'yes' disagrees"):
        load_blurb_dataset("pubmedqa", root)
    pubmedqa_dir(tmp_path, truth={"1000": "yes", "77": "no"})
    with pytest.raises(DatasetFormatError, match=format_error(root / "test_ground_truth.json", 3)
                       + " PMID '77' is not a question"):
        load_blurb_dataset("pubmedqa", root)
    questions = json.loads((root / "ori_pqal.json").read_text())
    questions["1002"]["final_decision"] = "perhaps"
    write(root, "ori_pqal.json", json.dumps(questions, indent=4))
    lines = (root / "ori_pqal.json").read_text().splitlines()
    entry = next(i for i, text in enumerate(lines, 1) if '"1002"' in text)
    line = next(i for i, text in enumerate(lines, 1) if i > entry and '"final_decision"' in text)  # the field's own
    with pytest.raises(DatasetFormatError, match=format_error(root / "ori_pqal.json", line, "final_decision")):
        load_blurb_dataset("pubmedqa", root)
    questions["1002"]["final_decision"] = "yes"
    questions["1003"]["CONTEXTS"] = "one passage, not a list"
    write(root, "ori_pqal.json", json.dumps(questions, indent=4))
    lines = (root / "ori_pqal.json").read_text().splitlines()
    entry = next(i for i, text in enumerate(lines, 1) if '"1003"' in text)
    line = next(i for i, text in enumerate(lines, 1) if i > entry and '"CONTEXTS"' in text)
    with pytest.raises(DatasetFormatError, match=format_error(root / "ori_pqal.json", line, "CONTEXTS")):
        load_blurb_dataset("pubmedqa", root)
    (root / "test_ground_truth.json").unlink()
    with pytest.raises(MissingDatasetFileError, match=re.escape(str(root / "test_ground_truth.json"))):
        load_blurb_dataset("pubmedqa", root)


def test_bioasq_tsv_with_and_without_header(tmp_path):
    train = "yesno_label\tquestion\tideal_answer\n" + "".join(
        f"{i % 2}\tIs {i // 2} a question?\tAnswer {i}.\n" for i in range(40))
    write(tmp_path, "x_yesno_train.tsv", train)
    write(tmp_path, "x_yesno_test.tsv", "1\tIs it?\tYes it is.\n")
    dataset = load_blurb_dataset("BioASQ", tmp_path)
    assert dataset.splits["test"] == [QAExample("test-1", "Is it?", "Yes it is.", "yes")]
    dev_questions = {e.question for e in dataset.splits["dev"]}
    assert len(dev_questions) == 2 and len(dataset.splits["dev"]) == 4  # 10% of 20 questions, asked twice each
    assert not dev_questions & {e.question for e in dataset.splits["train"]}
    write(tmp_path, "x_yesno_test.tsv", "1\tIs it?\tYes.\nmaybe\tIs it?\tPerhaps.\n")
    with pytest.raises(DatasetFormatError, match=format_error(tmp_path / "x_yesno_test.tsv", 2, "label")):
        load_blurb_dataset("bioasq", tmp_path)


def test_generic_qa(tmp_path):
    write(tmp_path, "train.jsonl", jsonl([{"id": "q", "question": "Does it?", "context": "It does.", "label": "yes"}]))
    write(tmp_path, "test.jsonl", jsonl([{"question": "Does it?", "context": "No.", "label": "no"}]))
    dataset = load_generic_dataset("qa", tmp_path, labels=["yes", "no"])
    assert dataset.splits["test"] == [QAExample("test-1", "Does it?", "No.", "no")]
    assert dataset.labels == ("yes", "no") and dataset.metric == ACCURACY
    write(tmp_path, "test.jsonl", jsonl([{"question": "Does it?", "label": "no"}]))
    with pytest.raises(DatasetFormatError, match=format_error(tmp_path / "test.jsonl", 1, "context") + " missing"):
        load_generic_dataset("qa", tmp_path)


# ====================================================================================== generic

def test_generic_needs_train_and_a_known_task(tmp_path):
    write(tmp_path, "dev.jsonl", "")
    with pytest.raises(MissingDatasetFileError, match=re.escape(str(tmp_path / "train.jsonl"))):
        load_generic_dataset("qa", tmp_path)
    with pytest.raises(InputError, match=r"unknown task type 'parsing'; valid task types: ner, pico"):
        load_generic_dataset("parsing", tmp_path)
    write(tmp_path, "train.jsonl", "\n")
    with pytest.raises(DatasetFormatError, match=format_error(tmp_path / "train.jsonl", None) + " holds no examples"):
        load_generic_dataset("qa", tmp_path)


# =============================================================================== derived splits

@settings(max_examples=60, deadline=None)
@given(units=st.lists(st.text(min_size=1, max_size=6), min_size=3, max_size=40, unique=True),
       seed=st.integers(0, 2**32), data=st.data())
def test_seeded_partition_is_fixed_disjoint_and_complete(units, seed, data):
    dev = data.draw(st.integers(0, len(units) // 2))
    test = data.draw(st.integers(0, len(units) - dev))
    sizes = {"test": test, "dev": dev}
    assignment = seeded_partition(units, sizes, "train", seed=seed, salt="hoc")
    assert set(assignment) == set(units)
    parts = Counter(assignment.values())
    assert parts["test"] == test and parts["dev"] == dev and parts["train"] == len(units) - test - dev
    shuffled = data.draw(st.permutations(units))
    assert seeded_partition(shuffled + units[:2], sizes, "train", seed=seed, salt="hoc") == assignment


def test_seeded_partition_refuses_more_than_it_has():
    with pytest.raises(InputError, match="cannot carve"):
        seeded_partition(["a", "b"], {"dev": 3}, "train", seed=0, salt="x")
