"""A dataset folder's files in the vocabulary report (tokenization/model_inputs.py, launch/vocab_report.py).

QA: a copy of NCBI-disease whose train.tsv had one line with a third column gave "30 model inputs" and exit 0:
format detection found no layout for train.tsv, so the folder's reader skipped it, and only report.json said
so. A file that looks like data (a split's name, or the start of the other files' layout) is now refused at its
first bad line; only what is clearly not data is skipped, and each skip is said on stderr.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from biomed_lm.errors import InputError
from biomed_lm.tokenization.blurb_files import DatasetFormatError
from biomed_lm.tokenization.model_inputs import dataset_source, looks_like_split
from tests.test_coverage import run_cli, write_vocab

REPO = Path(__file__).resolve().parents[1]
NCBI = REPO / "data" / "blurb" / "NCBI-disease"
TOKENS = ["the", "cat", "sat", "on", "mat", "."]


def _third_column_on(path: Path, line: int) -> None:
    lines = path.read_text(encoding="utf-8").split("\n")
    assert "\t" in lines[line - 1]
    lines[line - 1] += "\textra"
    path.write_text("\n".join(lines), encoding="utf-8")


def _report(tmp_path: Path, dataset: Path, *extra: str) -> int:
    vocab = write_vocab(tmp_path / "vocab.txt", TOKENS)
    return run_cli(["--tokenizers", f"x={vocab}", "--terms", "", "--datasets", f"x={dataset}",
                    "--output-dir", str(tmp_path / "out"), *extra])


@pytest.mark.parametrize("line", [20, 5])
def test_a_split_with_one_bad_line_is_refused_not_skipped(tmp_path, capsys, line):
    """The QA case: train.tsv line 20 with a third column; the report was written without the train split.
    Line 5 is inside the file's first sentence: no sentence was read before it, the lines before it fit."""
    folder = tmp_path / "ncbi"
    shutil.copytree(NCBI, folder)
    _third_column_on(folder / "train.tsv", line)
    assert _report(tmp_path, folder) == 2
    err = capsys.readouterr().err
    assert f"{folder / 'train.tsv'}, line {line}: expected 'token<TAB>tag' (2 tab-separated fields), got 3" in err
    assert "other files are token_tags" in err
    assert not (tmp_path / "out").exists()


def test_a_file_the_other_files_layout_nearly_fits_is_refused_whatever_its_name(tmp_path):
    """Not a split's name, but token_tags reads its first sentence: data with a bad line, not a stray file."""
    (tmp_path / "test.tsv").write_text("a\tO\n\nb\tO\n", encoding="utf-8")
    (tmp_path / "extra.tsv").write_text("c\tO\nd\tO\n\ne\tO\tX\n", encoding="utf-8")
    with pytest.raises(DatasetFormatError, match=r"extra\.tsv, line 4: expected 'token<TAB>tag'") as err:
        dataset_source("d", tmp_path)
    assert (err.value.path, err.value.line) == (str(tmp_path / "extra.tsv"), 4)


def test_a_split_that_no_layout_fits_asks_for_its_format(tmp_path):
    (tmp_path / "dev.tsv").write_text("a\tO\n", encoding="utf-8")
    (tmp_path / "train.tsv").write_text("just prose, no columns at all\nmore prose\n", encoding="utf-8")
    with pytest.raises(DatasetFormatError, match=r"train\.tsv: its name says it is a data split.*--dataset-format "
                                                 r"d=FORMAT"):
        dataset_source("d", tmp_path)


def test_a_single_file_with_a_bad_line_names_it(tmp_path):
    """Given alone, the file was 'cannot tell the format' though token_tags read it up to line 3."""
    path = tmp_path / "mine.tsv"
    path.write_text("a\tO\nb\tO\nc\tO\tX\n", encoding="utf-8")
    with pytest.raises(DatasetFormatError,
                       match=r"mine\.tsv, line 3: .*its lines before this one fit token_tags, so its format"):
        dataset_source("d", path)


def test_a_file_the_folder_layout_reads_whole_is_read(tmp_path):
    """A headerless id<TAB>sentence<TAB>label file is not detected from its lines, but the folder's layout
    (sentence_label_tsv, from the other split's header) reads it whole: it is data, not a skipped file."""
    (tmp_path / "dev.tsv").write_text("index\tsentence\tlabel\n1\tA @GENE$ sentence .\t0\n", encoding="utf-8")
    (tmp_path / "train.tsv").write_text("7\tAnother @GENE$ sentence .\t1\n8\tA third one .\t0\n", encoding="utf-8")
    source = dataset_source("d", tmp_path)
    assert [(Path(f.path).name, f.format) for f in source.files] == [("dev.tsv", "sentence_label_tsv"),
                                                                     ("train.tsv", "sentence_label_tsv")]
    assert len(list(source.inputs())) == 3


def test_only_what_is_clearly_not_data_is_skipped_and_said_on_stderr(tmp_path, capsys):
    folder = tmp_path / "pubmedqa"
    folder.mkdir()
    (folder / "ori_pqal.json").write_text(json.dumps({"1": {"QUESTION": "Is it?", "CONTEXTS": ["It is."]}},
                                                     indent=2), encoding="utf-8")
    (folder / "test_ground_truth.json").write_text(json.dumps({"1": "yes"}, indent=2), encoding="utf-8")
    (folder / "README.md").write_text("# PubMedQA\n", encoding="utf-8")
    (folder / "notes.tsv").write_text("", encoding="utf-8")
    assert _report(tmp_path, folder) == 0
    err = capsys.readouterr().err
    assert f"vocab_report: x: skipped {folder / 'test_ground_truth.json'}: fits no dataset format" in err
    assert "README.md" not in err  # documentation: in report.json's skipped, not said (every BLURB folder has one)
    assert f"vocab_report: x: skipped {folder / 'notes.tsv'}: empty" in err
    (source,) = json.loads((tmp_path / "out" / "report.json").read_text())["sources"]
    assert [Path(f["path"]).name for f in source["files"]] == ["ori_pqal.json"]
    assert len(source["skipped"]) == 3


@pytest.mark.parametrize("name, split", [("train.tsv", True), ("devel.tsv", True), ("gad_blurb_test.tsv", True),
                                         ("train_dev.tsv", True), ("test_ground_truth.json", False),
                                         ("ori_pqal.json", False), ("hoc_combined.jsonl", False)])
def test_split_names(name, split):
    assert looks_like_split(Path(name)) is split


def test_the_shipped_dataset_folder_still_reads(tmp_path, capsys):
    source = dataset_source("ncbi", NCBI)
    assert sorted(Path(f.path).name for f in source.files) == ["devel.tsv", "test.tsv", "train.tsv"]
    assert source.skipped == (f"{NCBI / 'LICENSE_CC-BY-4.0.md'}: documentation, not data",)
    with pytest.raises(InputError, match="no dataset file found"):
        (tmp_path / "LICENSE").write_text("licence text\n")
        dataset_source("d", tmp_path)
