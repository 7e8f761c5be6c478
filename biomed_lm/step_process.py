"""A pipeline's steps as processes of their own (``ablate``, ``recipe`` and ``demo`` run each entry script
so), and Ctrl-C.

A terminal sends Ctrl-C to its whole foreground process group, so a step gets it together with the
pipeline, and each step knows how to stop: pretraining finishes its step and writes a checkpoint
(:mod:`pretrain.preemption`), a data stage ends its pool and says what it kept. ``subprocess.run`` gave
the step a quarter of a second and then SIGKILL: a pretraining step lost every step since its last
checkpoint. Here the pipeline waits for its steps to stop on their own, then raises the
``KeyboardInterrupt``; a second Ctrl-C ends the wait and kills them. (An interrupt sent to the pipeline's
process alone, ``kill -INT <pid>``, lets the running steps finish; nothing after them starts.)

A step does not outlive its pipeline: on Linux the kernel sends it SIGTERM when the pipeline's process dies,
however it dies (``kill -9`` included), and pretraining then stops after its step with a checkpoint, as for a
scheduler's SIGTERM. Before, a killed ``ablate`` left its pretraining step training on as an orphan, holding
its folder's lock, so the rerun that should resume it was refused (QA).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from typing import Callable, Mapping, Sequence

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def start_step_process(command: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """Start ``command`` with this process's output, to be stopped when this process dies (module docstring).
    Call it from the main thread: the kernel's signal follows the thread that started the step."""
    return subprocess.Popen(list(command), env=env, preexec_fn=_stop_when_parent_dies())


def _stop_when_parent_dies() -> Callable[[], None] | None:
    """The child's half of the module docstring's last paragraph: runs between fork and exec, so it only
    calls a function looked up beforehand (``PR_SET_PDEATHSIG`` survives the exec)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()

    def request() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the request took effect
            os.kill(os.getpid(), signal.SIGTERM)
    return request


def run_step_process(command: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """Run ``command`` with this process's output; its exit status. Ctrl-C: see the module docstring."""
    process = start_step_process(command, env)
    try:
        return process.wait()
    except KeyboardInterrupt:
        wait_for_interrupted([process])
        raise


def wait_for_interrupted(processes: Sequence[subprocess.Popen]) -> None:
    """After a Ctrl-C: wait until ``processes`` (which had it too) have stopped on their own; on a second
    Ctrl-C kill those still running and wait for them."""
    try:
        for process in processes:
            process.wait()
    except KeyboardInterrupt:
        for process in processes:
            if process.poll() is None:
                process.kill()
        for process in processes:
            process.wait()
