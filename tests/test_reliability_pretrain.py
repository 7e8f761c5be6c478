"""The reliability suite: faults a shared, pre-emptible cluster inflicts on a pretraining run, each
through the real command line (docs/reliability.md lists them with what the toolkit does).

Every resume is either bit-identical to the uninterrupted run (same thread count) or refused with
a message — never silent. Faults are placed at a chosen moment by tests/pretrain_hooks.py.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests import forked_main
from tests.conftest import REPO
from tests.pretrain_runs import (STEPS, copy_run, env, group_ended, losses, pretrain_args, pretrain_command, run,
                                 with_option)

CKPT = "checkpoints"


def resume_ok(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = run(args, **kwargs)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def interrupted_copy(straight_run: Path, tmp_path: Path) -> Path:
    """The straight run as a run killed after its step-20 checkpoint, before the final export."""
    out = copy_run(straight_run, tmp_path / "run")
    shutil.rmtree(out / "model")
    return out


# --- kill -9 -----------------------------------------------------------------------------------

# A "random" step after the first checkpoint, fixed so failures reproduce (tests/test_chaos.py kills
# two ranks at steps its seed draws).
KILL_STEP = random.Random(2026).randrange(11, STEPS)


def test_kill9_at_a_random_step_resumes_bit_identically(pretraining_inputs, straight_run, tmp_path):
    out = tmp_path / "run"
    args = pretrain_args(pretraining_inputs, out)
    killed = run(args, hooks={"kill_at_step": KILL_STEP})
    assert killed.returncode == -signal.SIGKILL
    result = resume_ok(args)
    assert "resumed from" in result.stderr and "step-00000010" in result.stderr
    assert losses(out) == losses(straight_run)


@pytest.mark.parametrize("moment", ["after_engine_save", "before_manifest", "before_latest", "before_prune"])
def test_kill9_inside_a_checkpoint_save_resumes_bit_identically(moment, pretraining_inputs, straight_run, tmp_path):
    out = tmp_path / "run"
    args = pretrain_args(pretraining_inputs, out)
    killed = run(args, hooks={"kill_in_save": [20, moment]})
    assert killed.returncode == -signal.SIGKILL
    assert (out / CKPT / "step-00000010" / "manifest.json").is_file()  # the previous one is untouched
    result = resume_ok(args)
    if moment in ("before_latest", "before_prune"):  # step 20 was complete: nothing left to train
        assert "resumed from" in result.stderr and "step-00000020" in result.stderr
    assert losses(out) == losses(straight_run)
    assert not list((out / CKPT).glob(".partial-*"))


# --- damaged checkpoints --------------------------------------------------------------------------
# Each kind of damage (flipped or truncated bytes, an empty or missing file, a missing manifest) is
# caught by verify_checkpoint: tests/test_reliability_units.py. Here one of them goes through a real
# resume: the fallback to the previous checkpoint, the damaged one kept aside, the same losses.

def flip_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for offset in (len(data) // 2, len(data) // 2 + 97, len(data) - 4096):  # inside the tensors, not the zip index
        data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(pretraining_inputs, straight_run, tmp_path):
    out = interrupted_copy(straight_run, tmp_path)
    flip_bytes(out / CKPT / "step-00000020" / "mp_rank_00_model_states.pt")
    result = resume_ok(pretrain_args(pretraining_inputs, out))
    assert "checkpoint step-00000020 is damaged" in result.stderr
    assert "resumed from" in result.stderr and "step-00000010" in result.stderr
    assert (out / CKPT / "damaged-step-00000020").is_dir()  # kept for inspection, not deleted
    assert losses(out) == losses(straight_run)
    assert (out / "model" / "model.safetensors").is_file()


def test_a_missing_newest_folder_falls_back_and_says_so(pretraining_inputs, straight_run, tmp_path):
    out = interrupted_copy(straight_run, tmp_path)
    shutil.rmtree(out / CKPT / "step-00000020")  # `latest` still names it
    result = resume_ok(pretrain_args(pretraining_inputs, out))
    assert "names step-00000020, which is not there" in result.stderr
    assert losses(out) == losses(straight_run)
    assert (out / CKPT / "step-00000010").is_dir()  # the fallback was not pruned before step 20 was redone


def test_garbage_in_latest_does_not_restart_from_step_0(pretraining_inputs, straight_run, tmp_path):
    out = interrupted_copy(straight_run, tmp_path)
    shutil.rmtree(out / CKPT / "step-00000020")
    (out / CKPT / "latest").write_bytes(b"\x00\xffgarbage")
    result = resume_ok(pretrain_args(pretraining_inputs, out))
    assert "resumed from" in result.stderr and "step-00000010" in result.stderr
    assert losses(out) == losses(straight_run)


def test_no_verified_checkpoint_is_refused_and_nothing_is_lost(pretraining_inputs, straight_run, tmp_path):
    out = interrupted_copy(straight_run, tmp_path)
    for tag in ("step-00000010", "step-00000020"):
        flip_bytes(out / CKPT / tag / "mp_rank_00_model_states.pt")
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    metrics_before = (out / "metrics.jsonl").read_text()
    result = run(pretrain_args(pretraining_inputs, out))
    assert result.returncode == 2
    assert "no verified checkpoint" in result.stderr
    assert "step-00000010" in result.stderr and "step-00000020" in result.stderr and "checksum" in result.stderr
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before  # nothing moved or deleted
    assert (out / "metrics.jsonl").read_text() == metrics_before


def test_latest_without_any_checkpoint_is_refused(pretraining_inputs, straight_run, tmp_path):
    out = interrupted_copy(straight_run, tmp_path)
    for tag in ("step-00000010", "step-00000020"):
        shutil.rmtree(out / CKPT / tag)
    result = run(pretrain_args(pretraining_inputs, out))
    assert result.returncode == 2 and "no checkpoint is there" in result.stderr
    assert len(losses(out)) == STEPS  # the metrics of the lost run are not overwritten


def test_a_half_written_metrics_line_is_dropped_with_a_warning(pretraining_inputs, straight_run, tmp_path):
    out = interrupted_copy(straight_run, tmp_path)
    shutil.rmtree(out / CKPT / "step-00000020")
    with open(out / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 21, "loss": 8.1')  # a crash mid-write
    result = resume_ok(pretrain_args(pretraining_inputs, out))
    assert f"{out / 'metrics.jsonl'}, line {STEPS + 1}: unreadable metrics line dropped" in result.stderr
    assert losses(out) == losses(straight_run)


# --- a changed run on resume -------------------------------------------------------------------

@pytest.fixture
def half_run(pretraining_inputs, straight_run, tmp_path) -> Path:
    """The straight run as it was after its step-10 checkpoint."""
    out = interrupted_copy(straight_run, tmp_path)
    shutil.rmtree(out / CKPT / "step-00000020")
    (out / CKPT / "latest").write_text("step-00000010\n")
    return out


def test_a_changed_batch_shape_is_refused_listing_the_differences(pretraining_inputs, half_run):
    args = pretrain_args(pretraining_inputs, half_run)
    args = with_option(with_option(args, "--micro-batch-size", "4"), "--gradient-accumulation-steps", "4")
    result = run(args)
    assert result.returncode == 2
    assert "train.micro_batch_size: 8 in the checkpoint, 4 now" in result.stderr
    assert "train.gradient_accumulation_steps: 2 in the checkpoint, 4 now" in result.stderr
    assert "--allow-config-change" in result.stderr
    allowed = resume_ok(args + ["--allow-config-change"])
    assert "setting changed on resume: train.micro_batch_size" in allowed.stderr
    resumes = json.loads((half_run / "run_config.json").read_text())["resumes"]
    assert resumes[-1]["config_changes"]["train.micro_batch_size"] == {"checkpoint": 8, "now": 4}


def test_another_model_is_refused_even_when_changes_are_allowed(pretraining_inputs, half_run):
    args = with_option(pretrain_args(pretraining_inputs, half_run), "--model", "bert-small")
    result = run(args + ["--allow-config-change"])
    assert result.returncode == 2
    assert "cannot be resumed with these settings" in result.stderr and "model.architecture" in result.stderr
    assert "Traceback" not in result.stderr


def test_harmless_changes_are_allowed_recorded_and_exact(pretraining_inputs, straight_run, half_run):
    args = with_option(with_option(pretrain_args(pretraining_inputs, half_run), "--checkpoint-every", "5"),
                       "--num-workers", "2")
    result = resume_ok(args)
    assert "setting changed on resume: train.checkpoint_every: 10 -> 5" in result.stderr
    assert losses(half_run) == losses(straight_run)  # workers and checkpoint interval change no number
    changes = json.loads((half_run / "run_config.json").read_text())["resumes"][-1]["config_changes"]
    assert set(changes) == {"train.checkpoint_every", "data.num_workers", "train.output_dir"}  # (a copied run)


def lrs(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["lr"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def test_a_finished_run_run_again_says_it_was_complete(pretraining_inputs, straight_run, tmp_path):
    out = copy_run(straight_run, tmp_path / "run")
    result = resume_ok(pretrain_args(pretraining_inputs, out))
    assert f"the run was already complete (max_steps {STEPS}): nothing to train" in result.stderr
    assert losses(out) == losses(straight_run)


def test_a_finished_run_given_more_steps_follows_the_longer_schedule_from_its_next_step(pretraining_inputs,
                                                                                          straight_run, tmp_path):
    """QA (2026-11-28): the first added step ran at the old schedule's end, lr 0, and the log never said the
    schedule had changed."""
    out = copy_run(straight_run, tmp_path / "run")
    args = with_option(pretrain_args(pretraining_inputs, out), "--max-steps", str(STEPS + 4))
    result = resume_ok(args + ["--allow-config-change"])
    assert f"learning-rate schedule: from step {STEPS + 1} it is the changed one, over {STEPS + 4} steps" \
        in result.stderr
    after = lrs(out)
    added = [after[step] for step in range(STEPS + 1, STEPS + 5)]
    assert added[0] > 0 and added == sorted(added, reverse=True)
    assert added[0] - added[1] == pytest.approx(added[1] - added[2], rel=1e-9)  # the linear decay, from its start


def test_an_allowed_new_learning_rate_wins_over_the_saved_schedule(pretraining_inputs, straight_run, half_run):
    args = with_option(pretrain_args(pretraining_inputs, half_run), "--learning-rate", "5e-4")
    resume_ok(args + ["--allow-config-change"])
    after, before = lrs(half_run), lrs(straight_run)
    assert all(after[s] == before[s] for s in range(1, 11))
    assert all(after[s] == pytest.approx(0.5 * before[s], rel=1e-12) for s in range(11, STEPS + 1))
    record = json.loads((half_run / "run_config.json").read_text())
    assert record["train"]["learning_rate"] == 5e-4
    assert record["resumes"][-1]["config_changes"]["train.learning_rate"] == {"checkpoint": 1e-3, "now": 5e-4}


# --- divergence --------------------------------------------------------------------------------

def test_divergence_is_skipped_aborted_and_resumed_with_a_lower_learning_rate(pretraining_inputs, tmp_path):
    out = tmp_path / "run"
    # The relative spike test, alone: the absolute loss ceiling (which would catch this first) is off.
    args = pretrain_args(pretraining_inputs, out, "--max-consecutive-skips", "3", "--loss-ceiling-factor", "0")
    args = with_option(with_option(args, "--checkpoint-every", "4"), "--keep-last", "3")
    # From step 12 on the learning rate is 1000× the schedule's: the update of step 12 wrecks the model.
    diverged = run(args, hooks={"lr_factor_from_step": [12, 1000.0]})
    assert diverged.returncode == 3, diverged.stderr[-3000:]
    records = {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    assert [records[s].get("skipped") for s in (12, 13, 14, 15)] == [None, "loss_spike", "loss_spike", "loss_spike"]
    assert all(records[s]["loss"] > 2 * records[12]["loss"] for s in (13, 14, 15))  # real losses, no fake zeros
    assert records[15]["skipped_steps"] == 3  # the aborting step is logged too
    # The step-12 checkpoint holds the damaging update: set aside; resuming starts from step 8.
    assert (out / CKPT / "diverged-step-00000012").is_dir()
    assert "Resuming starts from step-00000008" in diverged.stderr

    straight = tmp_path / "straight"
    resume_ok(with_option(args, "--output-dir", str(straight)))
    refused = run(with_option(args, "--learning-rate", "5e-4"))
    assert refused.returncode == 2 and "--resume-lr-scale" in refused.stderr

    resumed = resume_ok(args + ["--resume-lr-scale", "0.5"])
    assert "peaks at 0.5 × 0.001" in resumed.stderr
    after, reference = losses(out), losses(straight)
    assert all(after[s] == reference[s] for s in range(1, 9))
    after_lrs, reference_lrs = lrs(out), lrs(straight)
    assert all(after_lrs[s] == pytest.approx(0.5 * reference_lrs[s], rel=1e-12) for s in range(9, STEPS + 1))
    assert json.loads((out / "run_config.json").read_text())["resumes"][-1]["lr_scale"] == 0.5


# --- pre-emption -------------------------------------------------------------------------------

def wait_for_metrics(out: Path, lines: int, process: subprocess.Popen, timeout: float = 240) -> None:
    metrics = out / "metrics.jsonl"
    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= lines:
            return
        time.sleep(0.05)
    raise AssertionError(f"the run did not log {lines} steps (exit {process.poll()})")


def wait_for_group(pgid: int, timeout: float = 120) -> None:
    """Until every process of the group (ranks, workers, launchers) has exited."""
    assert group_ended(pgid, timeout), "processes of the run were still alive"


def stopped_step(out: Path) -> int:
    return int((out / CKPT / "latest").read_text().strip().split("-")[1])


# SIGTERM to the process group (SLURM's, the deepspeed launcher's) with a DataLoader worker: tests/test_chaos.py,
# on two ranks.
@pytest.mark.parametrize("how", ["SIGUSR1", "time budget"])
def test_preemption_with_workers_checkpoints_and_resumes_exactly(how, pretraining_inputs, straight_run, tmp_path):
    out = tmp_path / "run"
    args = with_option(pretrain_args(pretraining_inputs, out), "--num-workers", "2")
    first = args + (["--stop-after-hours", str(2.0 / 3600)] if how == "time budget" else [])
    process = forked_main.start_command(pretrain_command(first, hooks={"sleep_per_step": 0.3}), env(), new_session=True)
    if how == "SIGUSR1":
        wait_for_metrics(out, 3, process)
        process.send_signal(signal.SIGUSR1)
    _, stderr = process.communicate(timeout=240)
    wait_for_group(process.pid)
    assert process.returncode == 0, stderr[-3000:]
    assert 3 <= stopped_step(out) < STEPS and "stopped after step" in stderr
    assert "with a checkpoint" in stderr
    resume_ok(args)
    assert losses(out) == losses(straight_run)

