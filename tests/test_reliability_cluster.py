"""The faults a cluster still found after the reliability suite (issue 22), each through the real
command line: an error during training with DataLoader workers (used to hang), two runs on one
directory (used to erase each other), damage saved inside the spike warm-up (used to be the resume
point, and the printed advice then exported a diverged model), and ``--resume-lr-scale`` with
nothing to resume (used to be ignored). docs/reliability.md lists them with what the toolkit does.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests import forked_main
from tests.conftest import REPO
from tests.pretrain_runs import STEPS, env, group_ended, losses, pretrain_args, pretrain_command, run, with_option

CKPT = "checkpoints"
PROMPT_EXIT_SECONDS = 120  # a whole 20-step run takes ~15 s here; the old hang lasted until killed


def run_bounded(args: list[str], hooks: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """Run to the end within :data:`PROMPT_EXIT_SECONDS` as a process group of its own (forked from
    this process where it can be: :mod:`tests.forked_main`); a hang fails the test (and the whole
    group, DataLoader workers included, is killed)."""
    started = time.monotonic()
    process = forked_main.start_command(pretrain_command(args, hooks), env(), new_session=True)
    try:
        _, stderr = process.communicate(timeout=PROMPT_EXIT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"the run did not exit within {PROMPT_EXIT_SECONDS} s (hung)")
    assert group_ended(process.pid, timeout=10), "a process of the run (a DataLoader worker?) outlived it"
    return subprocess.CompletedProcess(process.args, process.returncode, None, stderr), time.monotonic() - started


def records(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


# --- an error during training, with DataLoader workers -----------------------------------------

@pytest.mark.parametrize("how, reason", [("file_size_limit", "file too large: a file reached the file-size limit"),
                                         ("checkpoints_replaced_by_a_file", "a file is in the way")])
def test_a_failed_save_with_workers_exits_promptly_naming_the_path_and_cause(how, reason, pretraining_inputs,
                                                                             straight_run, tmp_path):
    out = tmp_path / "run"
    args = with_option(pretrain_args(pretraining_inputs, out), "--num-workers", "1")
    failed, _ = run_bounded(args, hooks={"fail_save": [20, how]})
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert f"checkpoint save to {out / CKPT / '.partial-step-00000020'} failed: {reason}" in failed.stderr
    assert "Traceback" not in failed.stderr
    if how == "checkpoints_replaced_by_a_file":
        assert f"({out / CKPT})" in failed.stderr  # the path in the way
        (out / CKPT).unlink()
        (out / "checkpoints.moved").rename(out / CKPT)
    assert not (out / CKPT / ".partial-step-00000020").exists()  # the partial save is removed
    # The previous checkpoint is untouched and verified: the same command resumes exactly.
    resumed, _ = run_bounded(args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr and "step-00000010" in resumed.stderr
    assert losses(out) == losses(straight_run)


def test_checkpoints_that_is_a_file_is_refused_before_training(pretraining_inputs, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / CKPT).write_text("not a folder\n")
    refused, seconds = run_bounded(with_option(pretrain_args(pretraining_inputs, out), "--num-workers", "1"))
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert f"{out / CKPT} exists and is not a directory" in refused.stderr
    assert not (out / "metrics.jsonl").exists()  # refused before any training


# --- one run per directory ---------------------------------------------------------------------

def wait_for_steps(out: Path, steps: int, process: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if (out / "metrics.jsonl").exists() and len((out / "metrics.jsonl").read_text().splitlines()) >= steps:
            return
        time.sleep(0.05)
    raise AssertionError(f"the run did not log {steps} steps (exit {process.poll()})")


def test_a_second_run_on_a_directory_in_use_is_refused_and_a_dead_holder_blocks_nothing(
        pretraining_inputs, straight_run, tmp_path):
    out = tmp_path / "run"
    args = with_option(pretrain_args(pretraining_inputs, out), "--num-workers", "1")
    # 3 s a step: the holder must outlive two starts on a loaded machine (CI, 2026-11-29: at 0.5 s it had finished
    # its 20 steps before the second start reached the lock, which then resumed its finished run)
    holder = forked_main.start_command(pretrain_command(args, hooks={"sleep_per_step": 3.0}), env(), new_session=True)
    try:
        wait_for_steps(out, 2, holder)
        for second in (args, with_option(args, "--seed", "7")):  # the same run twice, and another run
            logged = len((out / "metrics.jsonl").read_text().splitlines())
            refused, _ = run_bounded(second)
            assert refused.returncode == 2, refused.stderr[-3000:]
            assert f"{out} is in use by another run (pid {holder.pid} on host" in refused.stderr
            assert "started 20" in refused.stderr and "Nothing was read or written" in refused.stderr
            # Nothing of the holder's was rewritten: a starting run would have emptied metrics.jsonl
            # and replaced run_config.json and the lock's record.
            assert len((out / "metrics.jsonl").read_text().splitlines()) >= logged
            assert '"seed": 7' not in (out / "run_config.json").read_text()
            assert json.loads((out / "run.lock").read_text())["pid"] == holder.pid
        os.killpg(holder.pid, signal.SIGKILL)  # the holder dies without releasing anything
        holder.communicate()
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
    resumed, _ = run_bounded(args)  # the dead holder's lock is gone with it
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert losses(out) == losses(straight_run)


def _rank_pid(group: int, rank: int) -> int | None:
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                words = cmdline.read().decode(errors="replace").split("\0")
            if os.getpgid(int(entry)) == group and f"--local_rank={rank}" in words:
                return int(entry)
        except (OSError, ProcessLookupError):
            continue
    return None


def test_a_rank_killed_mid_run_ends_the_other_with_one_line_naming_the_checkpoint(pretraining_inputs, tmp_path):
    """kill -9 of one rank of two: the other's collective fails. It used to print a page of DeepSpeed's
    all-reduce traceback ending in gloo's "Connection reset by peer"; now one line that says another rank is
    gone, where to look and which checkpoint the same command resumes from."""
    from tests.chaos import launch
    from tests.pretrain_runs import deepspeed_launcher

    if deepspeed_launcher() is None:
        pytest.skip("the deepspeed launcher is not installed")
    out = tmp_path / "run"
    job = launch(with_option(pretrain_args(pretraining_inputs, out), "--max-steps", "400"), {"sleep_per_step": 0.1})
    try:
        wait_for_steps(out, 12, job)  # past the checkpoint of step 10
        rank1 = _rank_pid(job.pid, 1)
        assert rank1 is not None, "no process of the launch has --local_rank=1"
        os.kill(rank1, signal.SIGKILL)
        _, stderr = job.communicate(timeout=120)
    finally:
        assert group_ended(job.pid, 30)
    lost = [line for line in stderr.splitlines() if "another rank" in line]
    assert len(lost) == 1 and lost[0].startswith("pretrain: error: rank 0: another rank of the 2 is gone ("), stderr
    assert re.search(rf"resumes from the newest verified checkpoint \({out}/checkpoints/step-000000[1-9]0\)$",
                     lost[0]), lost[0]
    assert "Traceback" not in stderr


@pytest.mark.parametrize("error, reason", [
    (RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
                  "[127.0.0.1]:19146: Connection reset by peer. This is typically caused by a remote worker hanging"),
     "Read error [127.0.0.1]:19146: Connection reset by peer"),
    (torch.distributed.DistBackendError("NCCL communicator was aborted on rank 0.\nmore"),
     "NCCL communicator was aborted on rank 0."),
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), None),  # this rank's own failure
    (ValueError("Connection reset by peer"), None),  # not a collective's error
    (RuntimeError(""), None),
])
def test_only_a_collective_that_lost_its_peer_is_reported_as_a_lost_rank(error, reason):
    from biomed_lm.backend import lost_peer_reason

    assert lost_peer_reason(error) == reason


# --- divergence inside the spike warm-up, and the advice after it -------------------------------

def lrs(run_dir: Path) -> dict[int, float]:
    return {step: record["lr"] for step, record in records(run_dir).items()}


@pytest.mark.parametrize("learning_rate", ["1e3", "1e6"])
def test_damage_inside_the_warm_up_is_never_the_resume_point(learning_rate, pretraining_inputs, straight_run,
                                                              tmp_path):
    out = tmp_path / "run"
    args = with_option(with_option(pretrain_args(pretraining_inputs, out), "--learning-rate", learning_rate),
                       "--checkpoint-every", "2")
    args = with_option(args, "--keep-last", "0")
    diverged, _ = run_bounded(args)
    assert diverged.returncode == 3, diverged.stderr[-3000:]
    # Every accepted step's loss is one a healthy model gives (the ceiling: 2 × (ln V + ln 2) ≈ 17.4
    # for this 3,000-token vocabulary), and no checkpoint is left past the last such step.
    accepted = [s for s, r in records(out).items() if r.get("skipped") is None]
    assert all(records(out)[s]["loss"] < 17.4 for s in accepted)
    left = sorted((out / CKPT).glob("step-*"))
    assert all(int(p.name.split("-")[1]) < max(accepted) for p in left)
    assert "Resuming starts from nothing" in diverged.stderr and "applies from step 1" in diverged.stderr
    if learning_rate == "1e6":  # the issue's own case: a NaN gradient norm from step 3; the advice is checked at 1e3
        return

    # The advice, followed as printed (--resume-lr-scale 0.5), still diverges: exit 3 again, not a
    # diverged model exported with exit 0.
    again, _ = run_bounded(args + ["--resume-lr-scale", "0.5"])
    assert again.returncode == 3 and not (out / "model").exists(), again.stderr[-3000:]
    # A scale that brings the rate back to 1e-3 trains the run of the straight one, from step 1.
    scale = f"{1e-3 / float(learning_rate):g}"
    healthy, _ = run_bounded(args + ["--resume-lr-scale", scale])
    assert healthy.returncode == 0, healthy.stderr[-3000:]
    assert f"the whole schedule, from step 1, peaks at {scale} × {float(learning_rate):g}" in healthy.stderr
    after, reference = lrs(out), lrs(straight_run)
    assert all(after[s] == pytest.approx(reference[s], rel=1e-9) for s in range(1, STEPS + 1))
    assert all(math.isfinite(r["loss"]) and r["loss"] < 10 for r in records(out).values())


def test_resume_lr_scale_on_a_fresh_run_applies_from_step_1_and_says_so(pretraining_inputs, straight_run, tmp_path):
    out = tmp_path / "run"
    result = run(pretrain_args(pretraining_inputs, out, "--resume-lr-scale", "0.5"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the whole schedule, from step 1, peaks at 0.5 × 0.001" in result.stderr
    after, reference = lrs(out), lrs(straight_run)
    assert all(after[s] == pytest.approx(0.5 * reference[s], rel=1e-12) for s in range(1, STEPS + 1))
    assert json.loads((out / "run_config.json").read_text())["train"]["resume_lr_scale"] == 0.5


# --- units: the run lock, the save diagnosis, the loss ceiling, the workers' shutdown ----------

# The holder keeps the lock until the test kills it (its process group): a fixed minute ran out on a loaded
# machine before a two-rank launch got to the lock, which it then took (seen once, 2026-11-28).
HOLD_LOCK = """
import os, sys, time
from biomed_lm.run_lock import acquire_run_lock
lock = acquire_run_lock(sys.argv[1], *sys.argv[3:])
if sys.argv[2] == "fork" and os.fork() == 0:  # a child that outlives its parent, as a DataLoader worker can
    time.sleep(900)
    os._exit(0)
print("held", flush=True)
time.sleep(900)
"""


def hold_lock(run_dir: Path, fork: bool, *lock_file: str) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run_dir), "fork" if fork else "-", *lock_file],
                              cwd=REPO, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.mark.parametrize("fork", [False, True], ids=["holder alone", "holder with a forked child"])
def test_the_lock_names_its_holder_and_dies_with_it(fork, tmp_path):
    from biomed_lm.run_lock import RunDirectoryLocked, acquire_run_lock

    holder = hold_lock(tmp_path, fork)
    try:
        with pytest.raises(RunDirectoryLocked, match=rf"in use by another run \(pid {holder.pid} on host "):
            acquire_run_lock(tmp_path)
        os.kill(holder.pid, signal.SIGKILL)  # the holder only: its forked child lives on
        holder.wait()
        lock = acquire_run_lock(tmp_path)
        assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()
        lock.release()
    finally:
        try:
            os.killpg(holder.pid, signal.SIGKILL)  # the forked child, if any
        except ProcessLookupError:
            pass


def _prepare_corpus_into(out: Path) -> None:
    from biomed_lm.tokenization.corpus import CorpusConfig, prepare_corpus

    prepare_corpus(CorpusConfig(inputs=[str(REPO / "data" / "sample")], output_dir=str(out)))


def _build_vocab_into(out: Path) -> None:
    from biomed_lm.tokenization.vocab import VocabConfig, build_vocab

    build_vocab([REPO / "data" / "sample"], out, VocabConfig(vocab_size=2000))


def _create_pretraining_data_into(out: Path) -> None:
    from biomed_lm.pretrain.instance_builder import PretrainingDataConfig, create_pretraining_data
    from biomed_lm.reference_models import general_bert_dir

    config = PretrainingDataConfig(corpus=str(REPO / "data" / "sample"), tokenizer=str(general_bert_dir()),
                                   output_dir=str(out))
    create_pretraining_data(config, progress=False)


def _blurb_sweep_into(out: Path) -> None:
    from biomed_lm.finetune.sweep import SweepArgs, run_sweep
    from biomed_lm.reference_models import general_bert_dir

    run_sweep(SweepArgs(model=str(general_bert_dir()), output_dir=str(out), data_root=str(REPO / "data" / "blurb"),
                        datasets=["ncbi-disease"]), log=lambda _message: None, progress=False)


def _finetune_into(out: Path) -> None:
    from biomed_lm.finetune.trainer import FinetuneArgs, run_finetune
    from biomed_lm.reference_models import general_bert_dir

    run_finetune(FinetuneArgs(model=str(general_bert_dir()), dataset="ncbi-disease", output_dir=str(out),
                              data_dir=str(REPO / "data" / "blurb" / "NCBI-disease")), log=lambda _message: None)


@pytest.mark.parametrize("build", [_prepare_corpus_into, _build_vocab_into, _create_pretraining_data_into,
                                   _blurb_sweep_into, _finetune_into],
                         ids=["prepare_corpus", "build_vocab", "create_pretraining_data", "blurb", "finetune"])
def test_a_second_data_build_into_a_folder_in_use_is_refused_before_it_touches_it(build, tmp_path):
    """Two corpus builds on one folder left a corpus of a fifth of its documents with exit 0; two vocabulary
    builds both said they wrote theirs. The second one now stops at once, naming the first."""
    from biomed_lm.run_lock import ARTIFACT_LOCK_FILE, RunDirectoryLocked

    out = tmp_path / "out"
    holder = hold_lock(out, False, ARTIFACT_LOCK_FILE)
    try:
        with pytest.raises(RunDirectoryLocked, match=rf"{out} is in use by another run \(pid {holder.pid} on host "):
            build(out)
        assert [p.name for p in out.iterdir()] == [ARTIFACT_LOCK_FILE]  # nothing read or written
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()


def test_a_two_rank_blurb_sweep_on_a_folder_in_use_is_refused_on_every_rank_without_a_hang(tmp_path):
    """Under the deepspeed launcher every rank runs the sweep; rank 0 alone holds the lock, and its refusal
    reaches the other rank, which would otherwise wait in the first run's collectives."""
    from biomed_lm.reference_models import general_bert_dir
    from biomed_lm.run_lock import ARTIFACT_LOCK_FILE
    from tests.conftest import free_port
    from tests.pretrain_runs import deepspeed_launcher

    launcher = deepspeed_launcher()
    if launcher is None:
        pytest.skip("the deepspeed launcher is not installed")
    out = tmp_path / "sweep"
    holder = hold_lock(out, False, ARTIFACT_LOCK_FILE)
    try:
        refused = subprocess.run(
            [launcher, "--num_gpus", "2", "--master_port", str(free_port()), "launch/blurb.py", "--deepspeed",
             "--model", str(general_bert_dir()), "--output_dir", str(out), "--data_root", str(REPO / "data" / "blurb"),
             "--datasets", "ncbi-disease"], cwd=REPO, env=env(), capture_output=True, text=True, timeout=240)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.count(f"blurb: error: {out} is in use by another run (pid {holder.pid} on host") == 2
    assert [p.name for p in out.iterdir()] == [ARTIFACT_LOCK_FILE]


def test_a_launcher_of_several_ranks_with_deepspeed_off_is_refused(monkeypatch):
    """Each rank would fine-tune alone on the same data and write the same files."""
    from biomed_lm.backend import start_distributed
    from biomed_lm.errors import ConfigError

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"--deepspeed false, but a launcher started this run as 2 ranks"):
        start_distributed(deepspeed=False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert start_distributed(deepspeed=False).world_size == 1


def test_a_filesystem_without_locks_warns_and_runs(tmp_path, monkeypatch, caplog):
    import errno
    import fcntl

    from biomed_lm.run_lock import ARTIFACT_LOCK_FILE, acquire_run_lock

    def no_locks(*_args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "lockf", no_locks)
    lock = acquire_run_lock(tmp_path / "run")
    assert lock.handle is None and "does not support file locks" in lock.note
    with caplog.at_level("WARNING", logger="biomed_lm.run_lock"):  # as a data stage holds it: the user is told
        with acquire_run_lock(tmp_path / "corpus", ARTIFACT_LOCK_FILE):
            pass
    assert [r.getMessage() for r in caplog.records] == [
        f"warning: {tmp_path / 'corpus'}'s filesystem does not support file locks (No locks available): nothing "
        "stops a second run from using this directory at the same time"]


def test_a_failed_start_removes_only_the_folders_its_lock_made(tmp_path):
    """A refused run left a folder holding nothing but its lock file (QA 2026-11-29)."""
    from biomed_lm.run_lock import ARTIFACT_LOCK_FILE, acquire_run_lock

    acquire_run_lock(tmp_path / "a" / "b" / "run").release(failed=True)  # refused: every folder it made goes
    assert list(tmp_path.iterdir()) == []
    acquire_run_lock(tmp_path / "made").release()  # ended well: the folder stays with its lock file
    assert [p.name for p in (tmp_path / "made").iterdir()] == ["run.lock"]
    acquire_run_lock(tmp_path / "made").release(failed=True)  # not made by this start: it stays
    assert (tmp_path / "made" / "run.lock").exists()
    with pytest.raises(ValueError), acquire_run_lock(tmp_path / "x" / "built", ARTIFACT_LOCK_FILE):
        (tmp_path / "x" / "kept.txt").write_text("a file someone else wrote\n")
        raise ValueError("the build failed")
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["kept.txt"]  # its own folder went, not the parent
    with pytest.raises(ValueError), acquire_run_lock(tmp_path / "partial", ARTIFACT_LOCK_FILE):
        (tmp_path / "partial" / "work.txt").write_text("partial work\n")
        raise ValueError("the build failed")
    assert sorted(p.name for p in (tmp_path / "partial").iterdir()) == [ARTIFACT_LOCK_FILE, "work.txt"]


def test_an_output_dir_that_is_a_file_is_refused(tmp_path):
    from biomed_lm.run_lock import RunDirectoryError, acquire_run_lock

    (tmp_path / "run").write_text("a file\n")
    with pytest.raises(RunDirectoryError, match="exists and is not a directory"):
        acquire_run_lock(tmp_path / "run")


def test_a_write_failure_is_explained_in_the_oss_words(tmp_path, monkeypatch):
    import errno
    import resource
    import shutil

    from biomed_lm.pretrain.checkpoint import diagnose_write_failure

    folder = tmp_path / "checkpoints" / ".partial-step-00000010"
    folder.mkdir(parents=True)
    full = OSError(errno.ENOSPC, "No space left on device", str(folder / "x.pt"))
    assert diagnose_write_failure(full, folder) == f"disk full (no space left on device) ({folder / 'x.pt'})"
    assert diagnose_write_failure(PermissionError(errno.EACCES, "denied", "p"), folder) == "permission denied (p)"
    opaque = RuntimeError("basic_ios::clear: iostream error")  # torch's writer says no more than this
    assert diagnose_write_failure(opaque, folder) == "RuntimeError: basic_ios::clear: iostream error"
    (folder / "mp_rank_00_model_states.pt").write_bytes(b"\0" * 4096)  # cut at exactly the limit
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (4096, resource.RLIM_INFINITY))
    assert diagnose_write_failure(opaque, folder).startswith("file too large: a file reached the file-size limit "
                                                              "(ulimit -f) of 4,096 bytes")
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    assert diagnose_write_failure(opaque, folder).startswith("disk full: 1,000 bytes free")
    in_the_way = tmp_path / "file"
    in_the_way.write_text("x")
    assert diagnose_write_failure(opaque, in_the_way / "checkpoints").startswith(f"{in_the_way} is not a directory")


def test_the_loss_ceiling_holds_from_step_1_through_the_spike_warm_up():
    from biomed_lm.pretrain.divergence import DivergenceGuard, uniform_prediction_loss

    assert uniform_prediction_loss(30522, 2) == pytest.approx(math.log(30522) + math.log(2))
    assert uniform_prediction_loss(30522, 0) == pytest.approx(math.log(30522))  # MLM only
    ceiling = 2 * uniform_prediction_loss(3000, 2)
    guard = DivergenceGuard(loss_spike_factor=2.0, grad_norm_spike_factor=10.0, window=50, warmup_steps=10,
                            loss_ceiling=ceiling)
    assert not guard.judge(8.7, 2.0).skip  # a fresh model's loss: just above ln V
    verdict = guard.judge(2.6e12, 1e5)  # step 2, inside the warm-up
    assert verdict.skip and verdict.reason == "loss_ceiling" and guard.accepted == 1
    off = DivergenceGuard(loss_spike_factor=2.0, grad_norm_spike_factor=10.0, window=50, warmup_steps=10)
    assert not off.judge(8.7, 2.0).skip and not off.judge(2.6e12, 1e5).skip  # the old behaviour: accepted


class _Stuck(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield torch.zeros(1)
        time.sleep(600)  # a worker busy for minutes: torch's shutdown cannot join it
        yield torch.zeros(1)


def test_workers_that_ignore_sigterm_are_stopped_and_joined():
    from biomed_lm.pretrain.preemption import ignore_stop_signals, stop_workers

    loader = torch.utils.data.DataLoader(_Stuck(), batch_size=None, num_workers=1,
                                         worker_init_fn=ignore_stop_signals)
    batches = iter(loader)
    next(batches)
    worker = batches._workers[0]
    started = time.monotonic()
    stop_workers(batches, grace_seconds=5)
    assert not worker.is_alive() and time.monotonic() - started < 30


def test_an_output_dir_that_cannot_be_created_is_named(tmp_path):
    from biomed_lm.run_lock import RunDirectoryError, acquire_run_lock

    (tmp_path / "a file").write_text("x")
    with pytest.raises(RunDirectoryError, match=r"output_dir .*/a file/run: cannot create .*run.lock: Not a directory"):
        acquire_run_lock(tmp_path / "a file" / "run")


def test_a_lock_file_removed_between_open_and_lock_is_taken_again_not_shared(tmp_path, monkeypatch):
    """QA (2026-11-29): a start that opened run.lock just before a failed start removed it locked the deleted
    file, and a third start locked a new one: two holders of one folder. The start now checks that it locked the
    file at the path, and takes the lock again otherwise; a '..' in the path removes nothing it did not make."""
    import fcntl

    from biomed_lm import run_lock
    from biomed_lm.run_lock import acquire_run_lock

    run = tmp_path / "runs" / "exp1"
    real_lockf, calls = fcntl.lockf, {"n": 0}

    def lockf_after_a_failed_start_removed_the_file(handle, flags):
        calls["n"] += 1
        if calls["n"] == 1:  # between this start's open and its lock, a failed start removes what it made
            (run / "run.lock").unlink()
            run.rmdir()
        return real_lockf(handle, flags)

    monkeypatch.setattr(run_lock.fcntl, "lockf", lockf_after_a_failed_start_removed_the_file)
    lock = acquire_run_lock(run)
    monkeypatch.setattr(run_lock.fcntl, "lockf", real_lockf)
    assert calls["n"] == 2  # the held descriptor is the file at the path, which the next start finds locked
    assert os.fstat(lock.handle.fileno()).st_ino == os.stat(run / "run.lock").st_ino
    lock.release()

    # The failed start still holds the file it is removing: this start's lock is refused (EAGAIN) on the old file,
    # which is no longer the one at the path: it retries rather than report the folder in use.
    import errno

    calls["n"] = 0

    def held_while_removed(handle, flags):
        calls["n"] += 1
        if calls["n"] == 1:
            (run / "run.lock").unlink()
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        return real_lockf(handle, flags)

    monkeypatch.setattr(run_lock.fcntl, "lockf", held_while_removed)
    acquire_run_lock(run).release()
    monkeypatch.setattr(run_lock.fcntl, "lockf", real_lockf)
    assert calls["n"] == 2

    # A lasting cause is reported as it is, not as a race (a dangling run.lock link)
    dangling = tmp_path / "dangling"
    dangling.mkdir()
    (dangling / "run.lock").symlink_to(tmp_path / "nowhere" / "run.lock")
    with pytest.raises(run_lock.RunDirectoryError, match=r"cannot create .*run.lock: No such file or directory"):
        acquire_run_lock(dangling)

    (tmp_path / "results").mkdir()
    acquire_run_lock(tmp_path / "new" / ".." / "results").release(failed=True)
    assert (tmp_path / "results").is_dir()  # the user's folder, not made by this start, stays
