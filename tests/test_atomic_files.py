"""Whole-or-nothing writes (biomed_lm/atomic_files.py) and the word counts' use of them."""

from __future__ import annotations

import json

import pytest

from biomed_lm.atomic_files import partial_path, replaced_when_done, write_json_atomically, write_lines_atomically


def test_a_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "record.json"
    write_json_atomically(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1} and path.read_text().endswith("}\n")
    write_lines_atomically(path, (f"{i}\n" for i in range(3)))
    assert path.read_text() == "0\n1\n2\n" and sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


@pytest.mark.parametrize("hidden, partial_name", [(False, "counts.tsv.partial"), (True, ".counts.tsv.partial")])
def test_a_failed_write_leaves_the_old_file_and_no_partial(tmp_path, hidden, partial_name):
    path = tmp_path / "counts.tsv"
    path.write_text("old\n")
    assert partial_path(path, hidden) == tmp_path / partial_name
    with pytest.raises(OSError, match="No space"):
        with replaced_when_done(path, hidden=hidden) as partial:
            assert partial.name == partial_name
            partial.write_text("half of the new")
            raise OSError(28, "No space left on device")
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["counts.tsv"]


def test_word_counts_cut_off_mid_write_leave_no_partial(tmp_path, monkeypatch):
    from collections import Counter

    from biomed_lm.tokenization import word_counts
    from biomed_lm.tokenization.word_counts import CountedCorpus, partial_name, save_counts

    corpus = CountedCorpus(counts=Counter({"aspirin": 3, "dose": 2}), documents=2, text_bytes=40,
                           word_pruning=None, skipped_records=())
    path = tmp_path / "word_counts.tsv.gz"
    save_counts(path, {"counter": "bert"}, corpus)
    before = path.read_bytes()
    opened = []

    class FullDisk:  # the header is written once the partial file is open
        @staticmethod
        def dumps(record):
            opened.extend(p.name for p in tmp_path.iterdir())
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(word_counts, "json", FullDisk)
    with pytest.raises(OSError):
        save_counts(path, {"counter": "bert", "lowercase": False}, corpus)
    assert partial_name(path.name) in opened and partial_name(path.name).startswith(".")
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
