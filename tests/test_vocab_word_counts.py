"""build_vocab's saved word counts: the reading pass runs once per corpus.

A build saves its counts before training; a rerun after a failure in the trainer reuses them without
reading, and ``word_counts_from`` hands them to a build of another size. Reused counts give the same
files as a fresh count, byte for byte; counts of other inputs or options are recounted (own directory)
or refused naming what differs (given by name); a damaged file is named with its line.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from biomed_lm.tokenization import vocab as vocab_module
from biomed_lm.tokenization.vocab import VocabBuildError, VocabConfig, build_vocab
from biomed_lm.tokenization.word_counts import WORD_COUNTS_FILE, WordCountsError, load_counts

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample" / "sywada_PubMedAbstract_1MB.txt"
MODEL_FILE = {"wordpiece": "vocab.txt", "sentencepiece": "spiece.model"}


def _card(out: Path) -> dict:
    return json.loads((out / "vocab_card.json").read_text())


def _not_read(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the inputs were read although counts were reused")
        yield  # a generator, as iter_texts is

    monkeypatch.setattr(vocab_module, "iter_texts", refuse)


@pytest.mark.parametrize("fmt", ["wordpiece", "sentencepiece"])
def test_counts_from_another_build_give_the_same_files(tmp_path, monkeypatch, fmt):
    build_vocab([SAMPLE], tmp_path / "first", VocabConfig(vocab_size=2000, format=fmt))
    fresh = build_vocab([SAMPLE], tmp_path / "fresh", VocabConfig(vocab_size=3000, format=fmt))
    _not_read(monkeypatch)
    reused = build_vocab([SAMPLE], tmp_path / "reused", VocabConfig(vocab_size=3000, format=fmt),
                         word_counts_from=tmp_path / "first")
    name = MODEL_FILE[fmt]
    assert (tmp_path / "reused" / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes()
    assert (reused.trained.documents, reused.trained.text_bytes, reused.trained.distinct_words) == (
        fresh.trained.documents, fresh.trained.text_bytes, fresh.trained.distinct_words)
    assert _card(tmp_path / "reused")["word_counts"] == {"reused_from": str((tmp_path / "first").resolve())}
    assert _card(tmp_path / "fresh")["word_counts"] == {"file": WORD_COUNTS_FILE, "reused": False}


def test_a_rerun_after_the_trainer_failed_reuses_the_counts(tmp_path, monkeypatch):
    out = tmp_path / "vocab"
    config = VocabConfig(vocab_size=2000)

    def trainer_dies(*args, **kwargs):
        raise MemoryError("killed in the trainer")

    with monkeypatch.context() as patch:
        patch.setattr(vocab_module, "wordpiece_merges", trainer_dies)
        with pytest.raises(MemoryError):
            build_vocab([SAMPLE], out, config)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [WORD_COUNTS_FILE]

    _not_read(monkeypatch)
    result = build_vocab([SAMPLE], out, config)  # not refused as a folder that is not empty
    assert _card(out)["word_counts"] == {"file": WORD_COUNTS_FILE, "reused": True}
    assert result.trained.documents == 725 and result.trained.distinct_words > 10_000


def test_changed_inputs_are_recounted_in_their_own_folder_and_refused_by_name(tmp_path, caplog):
    corpus = tmp_path / "abstracts.txt"
    corpus.write_text("".join(SAMPLE.read_text(encoding="utf-8").splitlines(keepends=True)[:100]), encoding="utf-8")
    build_vocab([corpus], tmp_path / "a", VocabConfig(vocab_size=1500))
    with corpus.open("a", encoding="utf-8") as f:
        f.write("zebrafishome zebrafishome\n")
    with pytest.raises(WordCountsError, match=r"other inputs or options.*inputs: .*abstracts\.txt changed"):
        build_vocab([corpus], tmp_path / "b", VocabConfig(vocab_size=1500), word_counts_from=tmp_path / "a")
    with pytest.raises(WordCountsError, match=r"lowercase: true in the finished word counts, false now"):
        build_vocab([corpus], tmp_path / "c", VocabConfig(vocab_size=1500, cased=True),
                    word_counts_from=tmp_path / "a" / WORD_COUNTS_FILE)

    caplog.set_level("INFO")
    rebuilt = build_vocab([corpus], tmp_path / "a", VocabConfig(vocab_size=1500), overwrite=True)
    assert "recounting" in caplog.text and "abstracts.txt changed" in caplog.text
    assert load_counts(tmp_path / "a" / WORD_COUNTS_FILE).counts["zebrafishome"] == 2
    assert rebuilt.trained.documents == load_counts(tmp_path / "a" / WORD_COUNTS_FILE).documents


def test_skipped_records_come_with_reused_counts(tmp_path, monkeypatch):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text('{"text": "alpha beta gamma"}\n{"text": \n{"text": "beta gamma delta"}\n', encoding="utf-8")
    build_vocab([corpus], tmp_path / "a", VocabConfig(vocab_size=200, limit_alphabet=None))
    _not_read(monkeypatch)
    build_vocab([corpus], tmp_path / "b", VocabConfig(vocab_size=210, limit_alphabet=None),
                word_counts_from=tmp_path / "a")
    skipped = _card(tmp_path / "b")["skipped_records"]
    assert skipped == _card(tmp_path / "a")["skipped_records"] and "docs.jsonl" in skipped[0]


def test_damaged_counts_are_named_with_their_line(tmp_path, caplog):
    build_vocab([SAMPLE], tmp_path / "a", VocabConfig(vocab_size=1500))
    path = tmp_path / "a" / WORD_COUNTS_FILE
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = f.readlines()
    lines[3] = "no tab here\n"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(lines)
    with pytest.raises(WordCountsError, match=rf"{WORD_COUNTS_FILE}, line 4: expected 'word<TAB>count'"):
        build_vocab([SAMPLE], tmp_path / "b", VocabConfig(vocab_size=1500), word_counts_from=path)
    caplog.set_level("INFO")
    build_vocab([SAMPLE], tmp_path / "a", VocabConfig(vocab_size=1600), overwrite=True)  # own folder: recounted
    assert "recounting" in caplog.text and load_counts(path).documents == 725


def test_counts_from_a_missing_or_foreign_file_and_for_bytelevel_bpe(tmp_path):
    with pytest.raises(FileNotFoundError, match="no word counts at"):
        build_vocab([SAMPLE], tmp_path / "a", VocabConfig(vocab_size=1500), word_counts_from=tmp_path / "none")
    foreign = tmp_path / "foreign.tsv.gz"
    with gzip.open(foreign, "wt") as f:
        f.write("the\t3\n")
    with pytest.raises(WordCountsError, match="not a word-counts file"):
        build_vocab([SAMPLE], tmp_path / "a", VocabConfig(vocab_size=1500), word_counts_from=foreign)
    with pytest.raises(VocabBuildError, match="bytelevel-bpe.*count the words itself"):
        build_vocab([SAMPLE], tmp_path / "b", VocabConfig(vocab_size=600, format="bytelevel-bpe"),
                    word_counts_from=foreign)
    assert not (tmp_path / "b" / WORD_COUNTS_FILE).exists()


def test_cli_reuses_counts(tmp_path):
    from launch.build_vocab import main

    assert main(["--inputs", str(SAMPLE), "--output-dir", str(tmp_path / "a"), "--vocab-size", "1500",
                 "--no-progress"]) == 0
    assert main(["--inputs", str(SAMPLE), "--output-dir", str(tmp_path / "b"), "--vocab-size", "1800",
                 "--no-progress", "--word-counts-from", str(tmp_path / "a")]) == 0
    assert _card(tmp_path / "b")["word_counts"]["reused_from"] == os.fspath((tmp_path / "a").resolve())
    assert main(["--inputs", str(SAMPLE), "--output-dir", str(tmp_path / "c"), "--vocab-size", "1800",
                 "--no-progress", "--cased", "--word-counts-from", str(tmp_path / "a")]) == 2


def test_counts_cut_short_are_named_damaged_and_a_failed_save_costs_only_the_file(tmp_path, monkeypatch, caplog):
    """Review: a counts file cut in half raised EOFError (a traceback, no recount); a full disk while saving the
    counts threw away the hours of reading before training."""
    build_vocab([SAMPLE], tmp_path / "a", VocabConfig(vocab_size=1500))
    path = tmp_path / "a" / WORD_COUNTS_FILE
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(WordCountsError, match=rf"{WORD_COUNTS_FILE}: damaged after line \d+ \(EOFError"):
        load_counts(path)
    caplog.set_level("INFO")
    build_vocab([SAMPLE], tmp_path / "a", VocabConfig(vocab_size=1600), overwrite=True)  # its own folder: recounted
    assert "recounting" in caplog.text and load_counts(path).documents == 725

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(vocab_module, "save_counts", disk_full)
    result = build_vocab([SAMPLE], tmp_path / "b", VocabConfig(vocab_size=1500))
    assert (tmp_path / "b" / "vocab.txt").is_file() and result.trained.documents == 725
    assert "the word counts were not saved" in caplog.text and not (tmp_path / "b" / WORD_COUNTS_FILE).exists()
