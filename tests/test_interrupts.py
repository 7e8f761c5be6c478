"""Ctrl-C in an entry script (QA, 2026-11-28: prepare_corpus and create_pretraining_data ended in chained
tracebacks, one more per pool worker, the last one multiprocess's TimeoutError with exit 1; build_vocab,
finetune and ablate in a bare KeyboardInterrupt traceback): one line saying what was kept, exit 130, no
worker left behind, and no wait for the work still queued."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from biomed_lm.errors import EXIT_INTERRUPTED, caused_by_interrupt, exits_cleanly_on_interrupt
from tests.conftest import REPO


def _pool_clean_up_replaced(interrupt: BaseException) -> BaseException:
    """What datasets' map(num_proc=...) raises on Ctrl-C: its finally's own error, the interrupt its context."""
    try:
        try:
            raise interrupt
        finally:
            raise TimeoutError("multiprocess.context.TimeoutError")
    except TimeoutError as err:
        return err


def test_an_interrupt_is_found_behind_the_error_a_pool_clean_up_raised_and_nothing_else_counts():
    assert caused_by_interrupt(KeyboardInterrupt())
    assert caused_by_interrupt(_pool_clean_up_replaced(KeyboardInterrupt()))
    assert not caused_by_interrupt(_pool_clean_up_replaced(ValueError("bad row")))
    assert not caused_by_interrupt(None)
    looped = ValueError("a")
    looped.__context__ = looped
    assert not caused_by_interrupt(looped)


def test_a_wrapped_main_turns_ctrl_c_into_one_line_and_exit_130_and_lets_other_errors_through(capsys):
    @exits_cleanly_on_interrupt("stage", "what was finished is kept")
    def interrupted(argv=None) -> int:
        raise _pool_clean_up_replaced(KeyboardInterrupt())

    @exits_cleanly_on_interrupt("stage")
    def failing(argv=None) -> int:
        raise RuntimeError("a bug")

    assert interrupted([]) == EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err == "stage: interrupted (Ctrl-C): what was finished is kept\n"
    with pytest.raises(RuntimeError, match="a bug"):
        failing([])


def test_the_one_line_starts_a_line_of_its_own_after_an_open_progress_bar():
    """QA: ``...2.10step/s, epoch=1, loss=0.027]finetune: interrupted (Ctrl-C): ...``."""
    import io

    from tqdm import tqdm

    stream, bars = io.StringIO(), []  # the bar still referenced, as by the frames of an interrupted loop

    @exits_cleanly_on_interrupt("stage")
    def interrupted(argv=None) -> int:
        bars.append(tqdm(total=10, file=stream, desc="steps"))
        bars[-1].update(3)
        raise KeyboardInterrupt

    assert interrupted([]) == EXIT_INTERRUPTED
    assert stream.getvalue().endswith("\n") and "3/10" in stream.getvalue()


# prepare_corpus over three files with two workers, each file's parse slowed to a minute; the markers tell the
# test that both workers are inside a parse.
SLOW_PARSE = """
import os, sys, time
from pathlib import Path
import biomed_lm.tokenization.corpus as corpus

def slow_parse(path, shard, config):
    Path(sys.argv[1], f"{os.getpid()}.started").touch()
    time.sleep(60)
    raise AssertionError("not interrupted")

corpus.parse_file = slow_parse  # the workers are forked: they see it too
from biomed_lm.launch.prepare_corpus import main
sys.exit(main(["--inputs", *sys.argv[2:], "--output-dir", str(Path(sys.argv[1]) / "out"), "--num-proc", "2"]))
"""


def _group_alive(group: int) -> list[int]:
    alive = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == group:  # state, ppid, pgrp
            alive.append(int(entry))
    return alive


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_in_prepare_corpus_with_a_pool_is_one_line_exit_130_and_leaves_no_worker(tmp_path):
    inputs = []
    for i in range(3):
        inputs.append(tmp_path / f"part{i}.txt")
        inputs[-1].write_text(f"document {i} " * 200 + "\n", encoding="utf-8")
    stage = subprocess.Popen([sys.executable, "-c", SLOW_PARSE, str(tmp_path), *map(str, inputs)], cwd=REPO,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("*.started"))) < 2 and time.monotonic() < deadline and stage.poll() is None:
        time.sleep(0.1)
    assert len(list(tmp_path.glob("*.started"))) == 2, stage.stderr.read() if stage.poll() is not None else ""
    os.killpg(stage.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to every process of the group
    try:
        _, err = stage.communicate(timeout=30)  # not the minute each queued parse would take
    finally:
        leftovers = _group_alive(stage.pid)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
    assert stage.returncode == EXIT_INTERRUPTED
    lines = [line for line in err.splitlines() if "interrupted" in line or "Traceback" in line]
    assert lines == ["prepare_corpus: interrupted (Ctrl-C): the stages already finished are kept in the output "
                     "folder's _work/: the same command resumes from them"], err
    assert leftovers == []


# A pipeline (ablate, recipe, demo) runs each step as its own process. The step below takes 2 s to stop on
# Ctrl-C (as pretraining finishes its step and writes a checkpoint), or with "stubborn" ignores it.
STEP = """
import signal, sys, time
from pathlib import Path
def stop(*_):
    time.sleep(2)
    Path(sys.argv[1], "stopped cleanly").touch()
    sys.exit(130)
signal.signal(signal.SIGINT, signal.SIG_IGN if sys.argv[2] == "stubborn" else stop)
Path(sys.argv[1], "step started").touch()
time.sleep(60)
"""
PIPELINE = """
import sys
from pathlib import Path
from biomed_lm.step_process import run_step_process
try:
    run_step_process([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
except KeyboardInterrupt:
    Path(sys.argv[2], "pipeline saw the step end" if Path(sys.argv[2], "stopped cleanly").exists()
         else "pipeline ended first").touch()
    sys.exit(130)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("step", ["stops in 2 s", "stubborn"])
def test_a_pipeline_waits_for_its_interrupted_step_to_stop_and_a_second_ctrl_c_kills_it(step, tmp_path):
    pipeline = subprocess.Popen([sys.executable, "-c", PIPELINE, STEP, str(tmp_path), step.split()[0]], cwd=REPO,
                                start_new_session=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "step started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(pipeline.pid, signal.SIGINT)
    if step == "stubborn":
        time.sleep(1)
        assert pipeline.poll() is None  # still waiting for its step
        os.killpg(pipeline.pid, signal.SIGINT)  # the second Ctrl-C
    try:
        assert pipeline.wait(timeout=30) == EXIT_INTERRUPTED
    finally:
        leftovers = _group_alive(pipeline.pid)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
    assert leftovers == []
    expected = "pipeline saw the step end" if step == "stops in 2 s" else "pipeline ended first"
    assert (tmp_path / expected).exists()  # subprocess.run killed the step after 0.25 s: "pipeline ended first"


# A step that records the SIGTERM it gets (as pretraining stops after its step with a checkpoint on one).
STEP_ON_SIGTERM = """
import signal, sys, time
from pathlib import Path
def stop(*_):
    Path(sys.argv[1], "step got SIGTERM").touch()
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
Path(sys.argv[1], "step started").touch()
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc")
def test_a_step_is_stopped_with_sigterm_when_its_pipeline_is_killed(tmp_path):
    """QA: ``kill -9`` of ablate left its pretraining step training on as an orphan, holding the folder's lock."""
    pipeline = subprocess.Popen([sys.executable, "-c", PIPELINE, STEP_ON_SIGTERM, str(tmp_path)], cwd=REPO,
                                start_new_session=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "step started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(pipeline.pid, signal.SIGKILL)
    pipeline.wait()
    while _group_alive(pipeline.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    leftovers = _group_alive(pipeline.pid)
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert leftovers == [] and (tmp_path / "step got SIGTERM").exists()


def test_a_pretraining_run_that_has_ended_ignores_ctrl_c_during_the_interpreters_exit(monkeypatch):
    """QA: a second Ctrl-C a second after the first, while the stopped run exited, killed it by SIGINT (status
    -2, no line): the interpreter's exit resets Python's handlers. An ended run ignores it instead."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("launch_pretrain_interrupts", REPO / "launch" / "pretrain.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "parse_config", lambda *args, **kwargs: (None, None, None, None))
    monkeypatch.setattr(module, "train", lambda *args: {"completed": False, "model_dir": None, "step": 3})
    monkeypatch.setattr(module, "end_distributed", lambda: None)
    previous = signal.getsignal(signal.SIGINT)
    try:
        assert module.main([]) == 0
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
