"""A pipeline's steps as processes of their own (``ablate``, ``recipe`` and ``demo`` run each entry script
so), and Ctrl-C.

A terminal sends Ctrl-C to its whole foreground process group, so a step gets it together with the
pipeline, and each step knows how to stop: pretraining finishes its step and writes a checkpoint
(:mod:`pretrain.preemption`), a data stage ends its pool and says what it kept. ``subprocess.run`` gave
the step a quarter of a second and then SIGKILL: a pretraining step lost every step since its last
checkpoint. Here the pipeline waits for its steps to stop on their own, then raises the
``KeyboardInterrupt``; a second Ctrl-C ends the wait and kills them. (An interrupt sent to the pipeline's
process alone, ``kill -INT <pid>``, lets the running steps finish; nothing after them starts.)
"""

from __future__ import annotations

import subprocess
from typing import Mapping, Sequence


def run_step_process(command: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """Run ``command`` with this process's output; its exit status. Ctrl-C: see the module docstring."""
    process = subprocess.Popen(list(command), env=env)
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
