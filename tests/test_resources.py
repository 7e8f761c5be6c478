"""Shipped paths (biomed_lm/resources.py): found from any directory, by name, pattern and identity."""

from __future__ import annotations

import os
import shutil

import pytest

from biomed_lm.config import ConfigError, load_yaml_mapping
from biomed_lm.finished_output import changed_files, file_identity
from biomed_lm.resources import places_looked, resolve_path, resolve_pattern, shipped_dir, shipped_name
from biomed_lm.tokenization.sources import expand_inputs


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_shipped_pattern_matches_from_any_directory(elsewhere):
    files, problems = expand_inputs(["data/sample/*.xml.gz"])  # the corpus command's --help example
    assert [path.name for path in files] == ["medline16n0902_sample.xml.gz"] and not problems
    assert all(path.resolve().is_relative_to(shipped_dir("data").resolve()) for path in files)
    (elsewhere / "data" / "sample").mkdir(parents=True)  # the working directory's own files come first
    (elsewhere / "data" / "sample" / "mine.txt").write_text("An abstract of mine.\n")
    assert resolve_pattern("data/sample/*.txt") == "data/sample/*.txt"
    assert resolve_pattern("data/nothing/*.txt") == "data/nothing/*.txt"  # the caller's error names it as given


def test_a_missing_shipped_looking_path_says_where_it_was_looked_for(elsewhere):
    with pytest.raises(ConfigError) as caught:
        load_yaml_mapping("configs/corpus/nope.yaml")
    message = str(caught.value)
    assert f"looked in {elsewhere / 'configs/corpus/nope.yaml'}" in message
    assert f"the toolkit's shipped {shipped_dir('configs') / 'corpus/nope.yaml'}" in message
    assert places_looked("runs/x.yaml") == "" and places_looked("/abs/configs/x.yaml") == ""


def test_a_shipped_input_is_identified_by_its_bytes_wherever_it_is_installed(elsewhere):
    sample = resolve_path("data/sample/sywada_PubMedAbstract_1MB.txt")
    assert shipped_name(sample) == "data/sample/sywada_PubMedAbstract_1MB.txt"
    identity = file_identity(sample)
    assert identity["path"] == "shipped:data/sample/sywada_PubMedAbstract_1MB.txt" and "mtime_ns" not in identity
    stat = sample.stat()
    os.utime(sample, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a reinstall's new time, same bytes
    try:
        assert changed_files([identity], [file_identity(sample)], "inputs") == []
    finally:
        os.utime(sample, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    copy = elsewhere / "mine.txt"  # a user's file: path, size and time, not a digest of 30 GB
    shutil.copy(sample, copy)
    assert shipped_name(copy) is None and set(file_identity(copy)) == {"path", "bytes", "mtime_ns"}


def test_only_the_package_data_counts_as_shipped():
    """Review: in a checkout every file below data/ counted as shipped, a user's 30 GB corpus there included, and
    was hashed whole on every rerun."""
    from pathlib import Path

    from biomed_lm.resources import _shipped_file

    assert _shipped_file("data", Path("sample/medline16n0902_sample.xml.gz"))
    assert _shipped_file("data", Path("blurb/NCBI-disease/train.tsv")) and _shipped_file("data", Path("README.md"))
    assert not _shipped_file("data", Path("pubmed/pubmed26n0001.xml.gz"))
    assert not _shipped_file("data", Path("sample/mine/big.txt")) and not _shipped_file("data", Path("corpus.txt"))
    assert _shipped_file("configs", Path("pretrain/demo.yaml")) and not _shipped_file("configs", Path("mine.yaml"))


def test_a_record_from_before_shipped_names_reads_as_the_same_file():
    """Review: records written before this change name the sample by its install path; an upgrade refused every
    rerun of an output built from it ("added" / "removed")."""
    sample = resolve_path("data/sample/sywada_PubMedAbstract_1MB.txt")
    old = {"path": "/old/venv/lib/python3.11/site-packages/biomed_lm/data/sample/sywada_PubMedAbstract_1MB.txt",
           "bytes": sample.stat().st_size, "mtime_ns": 1}
    assert changed_files([old], [file_identity(sample)], "inputs") == []
    assert changed_files([{**old, "bytes": 1}], [file_identity(sample)], "inputs") != []  # another file
