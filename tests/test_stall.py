"""biomed_lm.stall: a rank whose peers freeze without exiting ends with one line instead of waiting in a
collective for the process group's timeout (30 minutes on gloo: QA found a two-node run hung at step 12)."""

from __future__ import annotations

import io
import os
import signal
import threading
import time

import pytest

from biomed_lm.stall import EXIT_STALLED, SLOWEST_MULTIPLE, StallWatchdog


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Ended:
    """Stands in for ``os._exit``: records the status and lets the test wait for it."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.event = threading.Event()

    def __call__(self, status: int) -> None:
        self.status = status
        self.event.set()


def watchdog(limit_s: float = 10.0) -> tuple[StallWatchdog, FakeClock, Ended, io.StringIO]:
    clock, ended, stream = FakeClock(), Ended(), io.StringIO()
    dog = StallWatchdog(limit_s, lambda: "rank 0 of 2 ends after step 7", stream=stream, end=ended, clock=clock)
    return dog, clock, ended, stream


def test_a_silence_past_the_limit_ends_the_process_with_one_line():
    dog, clock, ended, stream = watchdog(limit_s=10.0)
    try:
        dog.beat()
        clock.now += 9.0
        assert not ended.event.wait(0.3)  # within the limit
        clock.now += 2.0
        assert ended.event.wait(10), "the watchdog did not end the process"
        assert ended.status == EXIT_STALLED == 1
        line = stream.getvalue().strip()
        assert line.startswith("pretrain: error: no progress for 11 s (--stall-timeout 10, the slowest step so far "
                               "0.0 s): rank 0 of 2 ends after step 7"), line
    finally:
        dog.stop()


def test_nothing_is_counted_before_the_first_beat_or_during_a_pause():
    dog, clock, ended, _ = watchdog(limit_s=10.0)
    clock.now += 1000.0  # the first step's compilation: not armed yet
    assert dog._thread is None
    dog.beat()
    try:
        with dog.paused():
            clock.now += 1000.0  # a checkpoint save
            assert not ended.event.wait(0.3)
        clock.now += 5.0  # the limit counts again from the pause's end
        assert not ended.event.wait(0.3)
        clock.now += 6.0
        assert ended.event.wait(10)
    finally:
        dog.stop()


def test_a_run_with_slow_steps_is_not_ended_for_being_slow():
    dog, clock, ended, _ = watchdog(limit_s=10.0)
    try:
        dog.beat()
        clock.now += 30.0  # one slow step (a recompile, a big model on a CPU): the limit becomes 20 x 30 s
        dog.beat()
        clock.now += SLOWEST_MULTIPLE * 30.0 - 1.0
        assert not ended.event.wait(0.3)
        clock.now += 2.0
        assert ended.event.wait(10)
    finally:
        dog.stop()


def test_a_limit_of_zero_starts_no_thread():
    dog, clock, ended, _ = watchdog(limit_s=0)
    dog.beat()
    clock.now += 1e6
    assert dog._thread is None and not ended.event.wait(0.2)
    dog.stop()


def test_a_frozen_rank_ends_its_peer_with_one_line_naming_the_checkpoint(pretraining_inputs, tmp_path):
    """Two ranks; rank 1 frozen (SIGSTOP) after step 12: rank 0 used to wait in DeepSpeed's gradient all-reduce
    for the process group's timeout. With --stall-timeout 3 it ends with one line and status 1."""
    from tests.chaos import launch
    from tests.pretrain_runs import deepspeed_launcher, group_ended, pretrain_args, process_alive, with_option
    from tests.test_reliability_cluster import _rank_pid, wait_for_steps

    if deepspeed_launcher() is None:
        pytest.skip("the deepspeed launcher is not installed")
    out = tmp_path / "run"
    args = with_option(with_option(pretrain_args(pretraining_inputs, out), "--max-steps", "400"),
                       "--stall-timeout", "3")
    job = launch(args, {"sleep_per_step": 0.1})
    rank1 = None
    try:
        wait_for_steps(out, 12, job)  # past the checkpoint of step 10
        rank0, rank1 = _rank_pid(job.pid, 0), _rank_pid(job.pid, 1)
        assert rank0 is not None and rank1 is not None
        os.kill(rank1, signal.SIGSTOP)
        frozen_at = time.monotonic()
        while time.monotonic() - frozen_at < 120 and process_alive(rank0):
            time.sleep(0.2)
        waited = time.monotonic() - frozen_at
        assert not process_alive(rank0), "rank 0 still waits 120 s after its peer froze"
        os.kill(rank1, signal.SIGKILL)  # what a scheduler does with a frozen job
        _, stderr = job.communicate(timeout=60)
    finally:
        if rank1 is not None and process_alive(rank1):
            os.kill(rank1, signal.SIGKILL)
        assert group_ended(job.pid, 30)
    lines = [line for line in stderr.splitlines() if "no progress for" in line]
    assert len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith("pretrain: error: no progress for ") and "rank 0 of 2 ends after step" in lines[0]
    assert lines[0].endswith("the same command resumes from the checkpoint of step 10"), lines[0]
    assert waited < 90, waited
    print(lines[0], f"(rank 0 gone {waited:.1f} s after rank 1 froze)")



def test_a_checkpoint_from_before_the_option_resumes_as_before_and_a_changed_limit_is_harmless():
    from biomed_lm.pretrain.resume import compare_signatures

    current = {"train.learning_rate": 1e-3, "train.stall_timeout": 300.0}
    assert compare_signatures({"train.learning_rate": 1e-3}, current, allow_change=False) == {}
    changed = compare_signatures({**current, "train.stall_timeout": 60.0}, current, allow_change=False)
    assert changed == {"train.stall_timeout": {"checkpoint": 60.0, "now": 300.0}}  # reported, not refused
