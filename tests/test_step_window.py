"""The time a step logs is its share of a read window, on a fake clock: a real tiny pretraining run
(launch/pretrain.py, forked from the test process as the other end-to-end tests run it) whose
trainer reads a clock that moves only where this test moves it.

The host reads the device's results at the read points (:func:`pretrain.trainer._is_read_point`);
:func:`pretrain.trainer._read_steps` times the steps since the last read as one window, which runs
from the previous read (the host's accounting and logging in between are the run's time) or, at the
start and after a checkpoint save, from the window's first step's start (a save is not the steps'
time), and shares it out among the window's steps by their real tokens. The clock moves by known
amounts: each step, the wait at each read, each step's accounting, each metrics line and each
checkpoint save (far longer than everything else together), so each window's time is known exactly
and nothing here depends on how fast the machine is.

Run as a script (``python tests/test_step_window.py --record FILE <pretrain args>``) it is that run:
the fake clock installed, each read and each step's result recorded in FILE, then launch/pretrain.py.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# What the fake clock moves by (exact in binary, so the windows' sums are exact).
STEP = 1.0  # one optimizer step, from its start (its first micro-batch queued) to the next's
WAIT = 0.5  # each read's wait for the device
ACCOUNT = 0.0625  # each step's accounting on the host (_account_step), after its read
LOG = 0.25  # each metrics.jsonl line written (within the accounting of a logged step)
SAVE = 1024.0  # each checkpoint save: more than all the steps together

# 12 steps of 2 micro-batches: read after steps 4 and 8 (logged), 6 (a checkpoint) and 12 (logged, the
# end, a checkpoint); none of the every-16-micro-batches kind. Windows: 1-4 from the start, 5-6 after a
# plain read, 7-8 after a save, 9-12 after a plain read.
MAX_STEPS, LOG_EVERY, CHECKPOINT_EVERY = 12, 4, 6
WINDOWS = [[1, 2, 3, 4], [5, 6], [7, 8], [9, 10, 11, 12]]
LOGGED = [4, 8, 12]
# Each window's time on the fake clock: its steps and the wait at its read, and, where it follows a read
# without a save, the host's accounting of the previous window's steps and its metrics line.
EXPECTED = {
    (1, 2, 3, 4): 4 * STEP + WAIT,  # from step 1's start: the set-up before it is not a step's time
    (5, 6): 4 * ACCOUNT + LOG + 2 * STEP + WAIT,  # from the read after step 4: steps 1-4 accounted, 4 logged
    (7, 8): 2 * STEP + WAIT,  # after the save at step 6: from step 7's start, neither the save nor 5-6's accounting
    (9, 10, 11, 12): 2 * ACCOUNT + LOG + 4 * STEP + WAIT,  # from the read after step 8: 7-8 accounted, 8 logged
}


class FakeClock:
    """The trainer's ``time`` module with ``perf_counter`` on a counter that only :meth:`advance` moves
    (its other functions, ``strftime`` and the rest, are the real module's)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __getattr__(self, name: str):
        return getattr(time, name)


def install(record_path: Path) -> None:
    """In the run's process: the trainer's clock made fake and moved at each step, read, accounting,
    metrics line and save; each read's steps and each step's result written to ``record_path``."""
    import biomed_lm.pretrain.metrics as metrics
    import biomed_lm.pretrain.trainer as trainer

    clock = FakeClock()
    trainer.time = clock  # `import time` there: perf_counter is looked up on it at each call
    record = {"reads": [], "steps": []}

    def save_record() -> None:
        record_path.write_text(json.dumps(record))

    accumulate_step, read_steps = trainer._accumulate_step, trainer._read_steps
    account_step, checkpoint, log = trainer._account_step, trainer._checkpoint, metrics.MetricsLogger.log

    def timed_accumulate_step(run, step):
        pending = accumulate_step(run, step)  # its start is read at its beginning
        clock.advance(STEP)
        return pending

    def timed_read_steps(run, steps, since=None):
        record["reads"].append({"steps": [pending.number for pending in steps], "from_last_read": since is not None})
        clock.advance(WAIT)
        return read_steps(run, steps, since)

    def timed_account_step(run, done):
        clock.advance(ACCOUNT)
        record["steps"].append({"step": done.number, "seconds": done.seconds, "tokens": done.totals["tokens"]})
        save_record()
        account_step(run, done)

    def timed_log(self, entry):
        clock.advance(LOG)
        log(self, entry)

    def timed_checkpoint(run, step):
        checkpoint(run, step)
        clock.advance(SAVE)

    trainer._accumulate_step, trainer._read_steps = timed_accumulate_step, timed_read_steps
    trainer._account_step, trainer._checkpoint = timed_account_step, timed_checkpoint
    metrics.MetricsLogger.log = timed_log


def main() -> None:
    args = sys.argv[1:]
    at = args.index("--record")
    record_path, args = Path(args[at + 1]), args[:at] + args[at + 2:]
    install(record_path)
    script = REPO / "launch" / "pretrain.py"
    sys.argv = [str(script), *args]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()


pytestmark = pytest.mark.xdist_group("step_window")  # the module's tests share one run: one worker


@pytest.fixture(scope="module")
def timed_run(pretraining_inputs, tmp_path_factory) -> dict:
    """The 12-step run on the fake clock: its reads, each step's result, and its metrics.jsonl lines."""
    from tests import forked_main
    from tests.pretrain_runs import PYTHON, env, pretrain_args, with_option

    root = tmp_path_factory.mktemp("step_window")
    args = pretrain_args(pretraining_inputs, root / "run")
    for flag, value in (("--max-steps", MAX_STEPS), ("--log-every", LOG_EVERY),
                        ("--checkpoint-every", CHECKPOINT_EVERY)):
        args = with_option(args, flag, str(value))
    command = [PYTHON, str(Path(__file__).resolve()), "--record", str(root / "record.json"), *args]
    # forked from this process where it can be, else a new interpreter (which finds `tests` by PYTHONPATH)
    done = forked_main.run_command(command, {**env(), "PYTHONPATH": str(REPO)}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((root / "record.json").read_text())
    lines = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = {entry["step"]: entry for entry in record["steps"]}
    assert [entry["step"] for entry in record["steps"]] == list(range(1, MAX_STEPS + 1))
    # The steps are read in windows, not one by one (fused AdamW vetoes on the device): else nothing here is a window.
    assert [read["steps"] for read in record["reads"]] == WINDOWS
    assert [line["step"] for line in lines] == LOGGED
    return {"reads": record["reads"], "steps": steps, "metrics": {line["step"]: line for line in lines}}


def window_seconds(run: dict, window: list[int]) -> float:
    return sum(run["steps"][step]["seconds"] for step in window)


def test_no_window_includes_a_checkpoint_save(timed_run):
    """The window after the save at step 6 starts at step 7's start: it is steps 7-8 and the wait, with
    neither the 1024 s save nor the accounting before it; and no window holds a save's time."""
    assert window_seconds(timed_run, [7, 8]) == pytest.approx(EXPECTED[(7, 8)], abs=1e-9)
    assert [read["from_last_read"] for read in timed_run["reads"]] == [False, True, False, True]
    assert all(window_seconds(timed_run, window) < SAVE for window in WINDOWS)
    # Step 8's logged throughput is its window's tokens over the steps' time, not over a save.
    tokens = sum(timed_run["steps"][step]["tokens"] for step in (7, 8))
    assert timed_run["metrics"][8]["tokens_per_s"] == pytest.approx(tokens / EXPECTED[(7, 8)], rel=1e-9)


def test_a_window_after_a_plain_read_includes_the_hosts_accounting_and_logging(timed_run):
    """Windows 5-6 and 9-12 run from the previous read: they hold the accounting of the previous
    window's steps and its metrics line, besides their steps and the wait. The first window starts at
    step 1's start (the set-up before it is not counted)."""
    for window in WINDOWS:
        assert window_seconds(timed_run, window) == pytest.approx(EXPECTED[tuple(window)], abs=1e-9), window
    assert window_seconds(timed_run, [5, 6]) > 2 * STEP + WAIT  # more than its own steps: the host's time between
    tokens = sum(timed_run["steps"][step]["tokens"] for step in WINDOWS[3])
    assert timed_run["metrics"][12]["tokens_per_s"] == pytest.approx(tokens / EXPECTED[(9, 10, 11, 12)], rel=1e-9)


def test_a_windows_steps_share_its_time_by_their_real_tokens(timed_run):
    """Each step's time is the window's times its share of the window's real tokens: the steps sum to
    the window, and every step of a window logs the window's tokens/s."""
    steps = timed_run["steps"]
    # steps of unequal tokens in a window: else an equal split would pass
    assert any(len({steps[step]["tokens"] for step in window}) > 1 for window in WINDOWS)
    for window in WINDOWS:
        total, expected = sum(steps[step]["tokens"] for step in window), EXPECTED[tuple(window)]
        for step in window:
            assert steps[step]["seconds"] == pytest.approx(expected * steps[step]["tokens"] / total, rel=1e-9), step
            assert steps[step]["tokens"] / steps[step]["seconds"] == pytest.approx(total / expected, rel=1e-9)
        assert window_seconds(timed_run, window) == pytest.approx(expected, abs=1e-9)
    for step, line in timed_run["metrics"].items():
        assert line["step_seconds"] == pytest.approx(steps[step]["seconds"], rel=1e-12)
        assert line["tokens_per_s"] == pytest.approx(steps[step]["tokens"] / steps[step]["seconds"], rel=1e-9)
