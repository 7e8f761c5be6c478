"""Rerunning a finished data stage (QA, 2026-11-28: prepare_corpus, build_vocab and create_pretraining_data
run again with the identical command exited 2, "already holds ...; pass --overwrite", as a changed command
did, while pretrain, finetune, blurb and ablate say "already complete" and exit 0: a user rerunning the
pipeline to resume it failed at step 1).

Now the same command on a finished output says so, prints its result again and leaves every file as it
was; a command that would build something else (other settings, other input files or the same files
changed since) is refused with exit status 2, naming what differs. Settings that do not decide the output
(worker processes, batch size, how the output folder is spelled) are no difference. Also: prepare_corpus
removes the temporary files a killed run left and says which finished work a resumed run reuses."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from biomed_lm.launch.build_vocab import main as build_vocab_main
from biomed_lm.launch.create_pretraining_data import main as create_data_main
from biomed_lm.launch.prepare_corpus import main as prepare_main
from biomed_lm.run_lock import ARTIFACT_LOCK_FILE

WORDS = ("protein kinase binds receptor cells tumour growth factor signalling pathway expression gene mutation "
         "patients therapy response clinical trial outcome dose").split()


def document(seed: int) -> str:
    """A 40-word document with three sentences, different for each seed."""
    words = [WORDS[(seed * 7 + i * (seed % 5 + 1)) % len(WORDS)] for i in range(39)] + [f"case{seed}"]
    return " ".join(words[:14]) + ". " + " ".join(words[14:27]) + ". " + " ".join(words[27:]) + "."


@pytest.fixture()
def texts(tmp_path) -> list[Path]:
    files = []
    for part in range(2):
        path = tmp_path / f"part{part}.txt"
        path.write_text("\n".join(document(part * 50 + i) for i in range(30)) + "\n", encoding="utf-8")
        files.append(path)
    return files


def snapshot(folder: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every file's bytes and modification time, and every folder's modification time (a file added or
    removed changes it), under ``folder``; the run lock aside (each run records its holder there)."""
    entries = {".": (None, folder.stat().st_mtime_ns)}
    for path in sorted(folder.rglob("*")):
        if path.name == ARTIFACT_LOCK_FILE:
            continue
        entries[str(path.relative_to(folder))] = (path.read_bytes() if path.is_file() else None,
                                                  path.stat().st_mtime_ns)
    return entries


def prepare(capsys, inputs, out: Path, *extra: str) -> tuple[int, str, str]:
    status = prepare_main(["--inputs", *map(str, inputs), "--output-dir", str(out), "--min-words", "1",
                           "--num-proc", "1", *extra])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def vocab(capsys, inputs, out: Path, *extra: str) -> tuple[int, str, str]:
    status = build_vocab_main(["--inputs", *map(str, inputs), "--output-dir", str(out), "--vocab-size", "200",
                               "--no-progress", *extra])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def data(capsys, corpus: Path, tokenizer: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    status = create_data_main(["--corpus", str(corpus), "--tokenizer", str(tokenizer), "--output-dir", str(out),
                               "--max-seq-length", "32", "--num-proc", "1", *extra])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def touch_later(path: Path, text: str) -> None:
    """Rewrite ``path`` with ``text`` and make sure its modification time moves (a coarse clock may not)."""
    before = path.stat().st_mtime_ns
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(before + 10_000_000, before + 10_000_000))


# ----------------------------------------------------------------------------- prepare_corpus

def test_prepare_corpus_identical_rerun_is_complete_and_touches_nothing(tmp_path, texts, capsys):
    out = tmp_path / "corpus"
    status, printed, _ = prepare(capsys, texts, out)
    assert status == 0
    before = snapshot(out)

    status, printed_again, err = prepare(capsys, texts, out, "--num-proc", "2")  # workers decide nothing
    assert status == 0
    assert err == (f"prepare_corpus: already complete: {out} holds the corpus this command builds (same inputs "
                   "and settings); pass --overwrite to rebuild it\n")
    assert json.loads(printed_again) == json.loads(printed)  # the summary, as the build printed it
    assert snapshot(out) == before

    spelled_otherwise = [str(tmp_path / "*.txt")]  # the same files through a pattern, the folder with a slash
    assert prepare(capsys, spelled_otherwise, Path(f"{out}/"))[0] == 0
    assert snapshot(out) == before


def test_prepare_corpus_changed_settings_or_inputs_are_refused_naming_them(tmp_path, texts, capsys):
    out = tmp_path / "corpus"
    assert prepare(capsys, texts, out)[0] == 0
    before = snapshot(out)

    status, _, err = prepare(capsys, texts, out, "--min-words", "3", "--languages", "eng")
    assert status == 2
    assert err == (f"prepare_corpus: error: {out} already holds a prepared corpus built by another command: "
                   'min_words: 1 in the finished corpus, 3 now; languages: [] in the finished corpus, ["eng"] now; '
                   "pass --overwrite to rebuild it\n")

    status, _, err = prepare(capsys, texts[:1], out)
    assert status == 2 and f"inputs: {texts[1]} removed; pass --overwrite" in err

    touch_later(texts[0], texts[0].read_text(encoding="utf-8").replace("protein", "proteins"))
    status, _, err = prepare(capsys, texts, out)
    assert status == 2 and f"inputs: {texts[0]} changed (another size, modification time or content)" in err
    assert snapshot(out) == before

    assert prepare(capsys, texts, out, "--overwrite")[0] == 0
    assert prepare(capsys, texts, out)[0] == 0


def test_prepare_corpus_record_from_before_the_check_is_refused(tmp_path, texts, capsys):
    out = tmp_path / "corpus"
    assert prepare(capsys, texts, out)[0] == 0
    summary = json.loads((out / "summary.json").read_text())
    del summary["inputs_identity"]
    (out / "summary.json").write_text(json.dumps(summary))

    status, _, err = prepare(capsys, texts, out)
    assert status == 2
    assert err == (f"prepare_corpus: error: {out} already holds a prepared corpus whose summary.json predates the "
                   "record of its input files, so this command cannot tell whether it built it; pass --overwrite "
                   "to rebuild it\n")


def test_prepare_corpus_resume_says_what_it_reuses_and_removes_a_killed_runs_temporary_files(tmp_path, texts,
                                                                                            capsys):
    out = tmp_path / "corpus"
    assert prepare(capsys, texts, out)[0] == 0
    # As a run killed while saving leaves it: the parsed files and the sentence-split documents in _work,
    # no corpus yet, and datasets' temporary files of the killed map.
    for name in ("state.json", "dataset_info.json", "summary.json", *(p.name for p in out.glob("data-*.arrow"))):
        (out / name).unlink()
    (out / "_work" / "tmpab12cd34").write_bytes(b"\0" * 1000)
    (out / "_work" / "parsed" / "0123456789abcdef0123.arrow.tmp").write_bytes(b"\0" * 500)

    status, _, err = prepare(capsys, texts, out)
    assert status == 0
    lines = err.splitlines()
    assert f"prepare_corpus: removed 2 temporary files (0.0 MB) an interrupted run left in {out / '_work'}" in lines
    assert f"prepare_corpus: resuming: 2 of 2 files already parsed in {out / '_work'}" in lines
    assert f"prepare_corpus: resuming: the 60 documents were already split into sentences in {out / '_work'}" in lines
    assert not list((out / "_work").glob("tmp*")) and not list((out / "_work").glob("parsed/*.tmp"))
    assert (out / "state.json").is_file()


# -------------------------------------------------------------------------------- build_vocab

def test_build_vocab_identical_rerun_is_complete_and_touches_nothing(tmp_path, texts, capsys):
    out = tmp_path / "vocab"
    status, printed, _ = vocab(capsys, texts, out)
    assert status == 0
    before = snapshot(out)

    status, printed_again, err = vocab(capsys, [str(tmp_path / "part*.txt")], out, "--progress")
    assert status == 0
    assert err.splitlines()[-1] == (f"build_vocab: already complete: {out} holds the vocabulary this command "
                                    "builds (same inputs and options); pass --overwrite to rebuild it")
    assert printed_again == printed  # size, documents, text and time as recorded
    assert snapshot(out) == before


def test_build_vocab_changed_options_or_inputs_are_refused_naming_them(tmp_path, texts, capsys):
    out = tmp_path / "vocab"
    assert vocab(capsys, texts, out)[0] == 0
    before = snapshot(out)

    status, _, err = vocab(capsys, texts, out, "--vocab-size", "300")
    assert status == 2
    assert err.splitlines()[-1] == (f"build_vocab: error: {out} already holds a vocabulary built by another "
                                    "command: vocab_size: 200 in the finished vocabulary, 300 now; pass --overwrite "
                                    "to rebuild it")

    touch_later(texts[1], texts[1].read_text(encoding="utf-8") + document(999) + "\n")
    status, _, err = vocab(capsys, texts, out)
    assert status == 2 and f"inputs: {texts[1]} changed (another size, modification time or content)" in err
    assert snapshot(out) == before

    card = json.loads((out / "vocab_card.json").read_text())
    del card["input_files"]
    (out / "vocab_card.json").write_text(json.dumps(card))
    status, _, err = vocab(capsys, texts, out)
    assert status == 2 and "whose vocab_card.json predates the record of its inputs and options" in err


# -------------------------------------------------------------------- create_pretraining_data

@pytest.fixture()
def corpus_and_tokenizer(tmp_path, texts, capsys) -> tuple[Path, Path]:
    corpus, tokenizer = tmp_path / "corpus", tmp_path / "vocab"
    assert prepare(capsys, texts, corpus)[0] == 0
    assert vocab(capsys, [corpus], tokenizer)[0] == 0
    return corpus, tokenizer


def test_create_pretraining_data_identical_rerun_is_complete_and_touches_nothing(tmp_path, corpus_and_tokenizer,
                                                                                 capsys):
    corpus, tokenizer = corpus_and_tokenizer
    out = tmp_path / "data"
    status, printed, _ = data(capsys, corpus, tokenizer, out)
    assert status == 0
    before = snapshot(out)

    copy = tmp_path / "same_vocab"  # another folder holding the same tokenizer: the same instances
    shutil.copytree(tokenizer, copy)
    status, printed_again, err = data(capsys, corpus, copy, out, "--num-proc", "2", "--batch-size", "7")
    assert status == 0
    assert err == (f"create_pretraining_data: already complete: {out} holds the pretraining data this command "
                   "builds (same corpus, tokenizer and options); pass --overwrite to rebuild it\n")
    assert printed_again == printed
    assert snapshot(out) == before


def test_create_pretraining_data_changed_options_or_inputs_are_refused_naming_them(tmp_path, corpus_and_tokenizer,
                                                                                   texts, capsys):
    corpus, tokenizer = corpus_and_tokenizer
    out = tmp_path / "data"
    assert data(capsys, corpus, tokenizer, out)[0] == 0
    before = snapshot(out)

    status, _, err = data(capsys, corpus, tokenizer, out, "--seed", "7", "--pair-task", "sop")
    assert status == 2
    assert err == (f"create_pretraining_data: error: {out} already holds pretraining data built by another command: "
                   'pair_task: "nsp" in the finished data, "sop" now; seed: 12345 in the finished data, 7 now; '
                   "pass --overwrite to rebuild it\n")

    other = tmp_path / "other_vocab"
    assert vocab(capsys, [corpus], other, "--cased")[0] == 0
    status, _, err = data(capsys, corpus, other, out)
    assert status == 2 and f"tokenizer: {tokenizer} in the finished data, {other} now" in err

    assert prepare(capsys, texts, corpus, "--overwrite")[0] == 0  # the same corpus, rebuilt: other files
    status, _, err = data(capsys, corpus, tokenizer, out)
    assert status == 2 and f"corpus: {corpus}/data-00000-of-00001.arrow changed" in err
    assert snapshot(out) == before


# ------------------------------------------------------------ a finished output damaged since it was built
#
# QA, 2026-11-29: a shard of finished pretraining data cut off or deleted made pretrain stop ("... rebuild it with
# launch/create_pretraining_data.py"), and that command answered "already complete" (exit 0) with the old
# instance count, so the user went round in a loop; prepare_corpus did the same with a truncated corpus shard.
# Now each stage records the name and size of every file it saved, and a rerun finding one missing or resized
# refuses (exit 2), naming the file and what differs, and asks for --overwrite.

SMALL_SHARDS = ("--max-shard-size", "8KB")  # several shards from a few dozen documents


def cut_in_half(path: Path) -> tuple[int, int]:
    """Truncate ``path`` to half its bytes; returns its size before and after."""
    before = path.stat().st_size
    path.write_bytes(path.read_bytes()[: before // 2])
    return before, before // 2


def shards(folder: Path) -> list[Path]:
    found = sorted(folder.glob("data-*.arrow"))
    assert len(found) >= 2, "the test needs a dataset of several shards"
    return found


def test_prepare_corpus_rerun_on_a_truncated_or_deleted_shard_is_refused_naming_it(tmp_path, texts, capsys):
    out = tmp_path / "corpus"
    assert prepare(capsys, texts, out, *SMALL_SHARDS)[0] == 0
    recorded = json.loads((out / "summary.json").read_text())["output_files"]
    assert {item["name"] for item in recorded} == {"state.json", "dataset_info.json", *(p.name for p in shards(out))}
    truncated, deleted = shards(out)[-1], shards(out)[0]
    full, half = cut_in_half(truncated)

    status, printed, err = prepare(capsys, texts, out, *SMALL_SHARDS)
    assert (status, printed) == (2, "")
    assert err == (f"prepare_corpus: error: {out} holds a prepared corpus that is damaged: its files changed since "
                   f"it was built ({truncated.name} is {half:,} bytes, {full:,} when it was written); pass "
                   "--overwrite to rebuild it\n")
    deleted.unlink()
    status, _, err = prepare(capsys, texts, out, *SMALL_SHARDS)
    assert status == 2 and f"({deleted.name} is missing; {truncated.name} is {half:,} bytes" in err
    from biomed_lm.pretrain.prepared_corpus import PretrainingDataError, open_corpus

    with pytest.raises(PretrainingDataError) as caught:  # the next stage names the files too (was "not a corpus")
        open_corpus(out)
    assert str(caught.value) == (f"{out}: prepared corpus cannot be read: {deleted.name} is missing; {truncated.name} "
                                 f"is {half:,} bytes, {full:,} when it was written; rebuild it with "
                                 "launch/prepare_corpus.py --overwrite")

    assert prepare(capsys, texts, out, *SMALL_SHARDS, "--overwrite")[0] == 0
    status, _, err = prepare(capsys, texts, out, *SMALL_SHARDS)
    assert status == 0 and "already complete" in err


def test_create_pretraining_data_rerun_on_a_truncated_or_deleted_shard_is_refused_naming_it(
        tmp_path, corpus_and_tokenizer, capsys):
    corpus, tokenizer = corpus_and_tokenizer
    out = tmp_path / "data"
    assert data(capsys, corpus, tokenizer, out, *SMALL_SHARDS)[0] == 0
    truncated, deleted = shards(out)[1], shards(out)[0]
    full, half = cut_in_half(truncated)
    deleted.unlink()
    from biomed_lm.pretrain.data import PretrainingDataError, load_pretraining_data

    with pytest.raises(PretrainingDataError, match=rf"{deleted.name} is missing; .*; rebuild it with "
                                                   r"launch/create_pretraining_data\.py --overwrite$"):
        load_pretraining_data(out)  # pretraining (a bare FileNotFoundError for a deleted shard)

    status, printed, err = data(capsys, corpus, tokenizer, out, *SMALL_SHARDS)
    assert (status, printed) == (2, "")
    assert err == (f"create_pretraining_data: error: {out} holds pretraining data that is damaged: its files changed "
                   f"since it was built ({deleted.name} is missing; {truncated.name} is {half:,} bytes, {full:,} "
                   "when it was written); pass --overwrite to rebuild it\n")

    status, printed, _ = data(capsys, corpus, tokenizer, out, *SMALL_SHARDS, "--overwrite")
    assert status == 0
    status, printed_again, err = data(capsys, corpus, tokenizer, out, *SMALL_SHARDS)
    assert status == 0 and "already complete" in err and printed_again == printed


def test_outputs_recorded_without_file_sizes_keep_the_completion_check_they_had(tmp_path, corpus_and_tokenizer,
                                                                               texts, capsys):
    """Records an older version wrote name no file sizes: nothing to compare, so a rerun says complete as it did."""
    corpus, tokenizer = corpus_and_tokenizer
    out = tmp_path / "data"
    assert data(capsys, corpus, tokenizer, out)[0] == 0
    forget_file_sizes_and_cut_a_shard(out / "pretraining_data.json")
    status, _, err = data(capsys, corpus, tokenizer, out)
    assert status == 0 and "create_pretraining_data: already complete" in err

    forget_file_sizes_and_cut_a_shard(corpus / "summary.json")  # after the data: it reads the corpus
    status, _, err = prepare(capsys, texts, corpus)
    assert status == 0 and "prepare_corpus: already complete" in err


def forget_file_sizes_and_cut_a_shard(record: Path) -> None:
    """Make ``record`` as an older version wrote it (no ``output_files``), then truncate a shard beside it."""
    values = json.loads(record.read_text())
    del values["output_files"]
    record.write_text(json.dumps(values))
    cut_in_half(sorted(record.parent.glob("data-*.arrow"))[0])


def test_damage_to_many_files_is_listed_five_at_a_time(tmp_path):
    from biomed_lm.finished_output import damaged_file_lines, damaged_output_message

    recorded = [{"name": f"data-{i:05d}-of-00008.arrow", "bytes": 100} for i in range(8)]
    (tmp_path / recorded[3]["name"]).write_bytes(b"\0" * 100)  # intact: not listed
    damage = damaged_file_lines(tmp_path, recorded)
    assert len(damage) == 7 and damage[0] == "data-00000-of-00008.arrow is missing"
    assert damaged_output_message(tmp_path, "pretraining data", damage) == (
        f"{tmp_path} holds pretraining data that is damaged: its files changed since it was built "
        "(data-00000-of-00008.arrow is missing; data-00001-of-00008.arrow is missing; data-00002-of-00008.arrow is "
        "missing; data-00004-of-00008.arrow is missing; data-00005-of-00008.arrow is missing; and 2 more files); "
        "pass --overwrite to rebuild it")
    assert damaged_file_lines(tmp_path, None) == []  # a record an older version wrote: nothing to compare
