"""Gold BIO files whose ``I-X`` continues no entity (after ``O``, the sentence start or another type's tag):
read the conlleval way, and said so once per file (QA, 2026-11-28: they were read that way without a word).
IO files, where every entity begins with ``I-``, BIOES files and PICO files are not BIO and must not warn."""

from __future__ import annotations

from pathlib import Path

import pytest

from biomed_lm.finetune.datasets import load_blurb_dataset, load_generic_dataset

BLURB = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "blurb"
CLEAN = "a\tB-Gene\nb\tI-Gene\nc\tO\n\nd\tO\ne\tB-Gene\n\n"


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def test_one_sentence_with_an_i_after_o_is_one_warning_naming_the_file_and_line(tmp_path):
    write(tmp_path, "train.tsv", CLEAN * 3)
    dev = write(tmp_path, "dev.tsv", CLEAN + "f\tO\ng\tI-Gene\nh\tI-Gene\n\n" + CLEAN)
    write(tmp_path, "test.tsv", CLEAN)
    assert load_generic_dataset("ner", tmp_path, labels=["Gene"]).warnings == [
        f"{dev}: 1 sentence has an I- tag that continues no entity, the first at line 9 ('I-Gene' after 'O'); "
        "read as conlleval and seqeval read it, the I- tag begins a new entity, so scores match the official "
        "scorer's"]


def test_sentences_are_counted_once_each_and_the_first_is_named(tmp_path):
    # a sentence start, and another type's tag (twice in one sentence: still one sentence)
    train = write(tmp_path, "train.tsv", CLEAN + "x\tI-Gene\ny\tO\n\nz\tB-Chem\nw\tI-Gene\nv\tO\nu\tI-Chem\n\n")
    write(tmp_path, "test.tsv", CLEAN)
    (warning,) = load_generic_dataset("ner", tmp_path, labels=["Gene", "Chem"]).warnings
    assert warning.startswith(f"{train}: 2 sentences have an I- tag that continues no entity, the first at line 8 "
                              "('I-Gene' after the sentence start)")


def test_clean_bio_data_gives_no_warning(tmp_path):
    write(tmp_path, "train.tsv", CLEAN * 3 + "a\tB-Gene\nb\tB-Gene\nc\tI-Gene\n\n")  # B after B is no fault
    write(tmp_path, "test.tsv", CLEAN)
    assert load_generic_dataset("ner", tmp_path, labels=["Gene"]).warnings == []


@pytest.mark.parametrize("train", [
    "a\tI-Gene\nb\tI-Gene\nc\tO\n\nd\tO\ne\tI-Gene\n\n",  # IO: every entity begins with I-
    "a\tB-Gene\nb\tE-Gene\nc\tO\n\nd\tO\ne\tI-Gene\nf\tE-Gene\n\ng\tS-Gene\n\n",  # BIOES
], ids=["io", "bioes"])
def test_non_bio_files_give_no_warning(tmp_path, train):
    write(tmp_path, "train.tsv", train)
    write(tmp_path, "test.tsv", "x\tO\n")
    assert load_generic_dataset("ner", tmp_path, labels=["Gene"]).warnings == []


def test_pico_gives_no_warning(tmp_path):
    write(tmp_path / "generic", "train.tsv", "a\tO\nb\tI-PAR\nc\tI-INT\n\n")
    assert load_generic_dataset("pico", tmp_path / "generic", labels=["PAR", "INT"]).warnings == []
    docs = "".join(f"-DOCSTART- ({pmid})\n\nw NN O O\nv NN O I-PAR\n\n" for pmid in range(100, 120))
    write(tmp_path / "ebm", "dev.txt", docs)
    write(tmp_path / "ebm", "test.txt", docs)
    assert load_blurb_dataset("ebm_pico", tmp_path / "ebm").warnings == []


def test_a_blurb_ner_dataset_warns_per_file_on_its_one_merged_type(tmp_path):
    # JNLPBA's types merge into one: B-protein I-DNA continues it; an I- after O still begins a new entity
    write(tmp_path, "train.tsv", "a\tB-protein\nb\tI-DNA\n\n" * 3)
    devel = write(tmp_path, "devel.tsv", "a\tB-protein\n\nb\tO\nc\tI-DNA\n\n")
    write(tmp_path, "test.tsv", "a\tO\nb\tI-RNA\n\nc\tB-RNA\n\n")
    warnings = load_blurb_dataset("jnlpba", tmp_path).warnings
    assert [w.split(": ")[0] for w in warnings] == [str(devel), str(tmp_path / "test.tsv")]
    assert "the first at line 4 ('I-Entity' after 'O')" in warnings[0]


@pytest.mark.parametrize("name, relative, allow_missing_train", [
    ("ncbi-disease", "ner/NCBI-disease", False), ("jnlpba", "ner/JNLPBA", True)])
def test_real_blurb_ner_files_give_no_warning(name, relative, allow_missing_train):
    path = BLURB / relative
    if not path.is_dir():
        pytest.skip(f"{path} is absent (the shared data folder is not here)")
    assert load_blurb_dataset(name, path, allow_missing_train=allow_missing_train).warnings == []
