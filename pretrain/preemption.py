"""Stopping cleanly when a cluster says so.

A run is asked to stop by SIGTERM (SLURM's ``scancel`` and pre-emption, Kubernetes, DeepSpeed's
launcher passing on its own SIGTERM), SIGUSR1 (SLURM's ``--signal=USR1@secs`` warning), SIGINT
(Ctrl-C; a second one interrupts at once), a time budget (``stop_after_hours``), or the launcher
that started this rank going away (a SIGTERM sent to the ``deepspeed`` command alone kills it at
once without passing the signal on; the ranks notice it is gone). The trainer asks
:meth:`StopRequests.reason` once per step and all-reduces the answer, so every rank stops after
the same step and writes one checkpoint.

Signals sent to the whole process group also reach the DataLoader workers; they ignore them
(:func:`ignore_stop_signals`, their ``worker_init_fn``) so that the main process can finish the
step: by default a worker dies and takes the run with it. DeepSpeed's launcher gives its ranks 30
seconds after a SIGTERM before it kills them; a step plus a checkpoint must fit in that.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
# Command-line fragments of the processes that launch ranks (deepspeed's runner and per-node
# launcher, torchrun); a rank watches those among its ancestors.
_LAUNCHER_MARKS = ("deepspeed", "torch.distributed.run", "torch.distributed.launch", "torchrun")


def ignore_stop_signals(_worker_id: int = 0) -> None:
    """DataLoader ``worker_init_fn``: leave SIGTERM/SIGINT/SIGUSR1 to the main process."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def stop_workers(batches, grace_seconds: float = 5.0) -> None:
    """Stop and join the workers of a DataLoader iterator (a no-op without workers).

    Workers that ignore SIGTERM outlive every polite way of ending them: torch's own shutdown ends
    with ``terminate()``, and at interpreter exit multiprocessing terminates its daemon children and
    then joins them, forever (an error during training used to hang the run that way). So after
    torch's shutdown (the workers are told to finish and joined), any worker still alive is killed."""
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    for worker in getattr(batches, "_workers", ()):
        if worker.is_alive():
            worker.kill()
            worker.join(timeout=grace_seconds)


class StopRequests:
    """Collects the reasons to stop after the current step; install() / restore() the handlers."""

    def __init__(self, stop_after_hours: float = 0.0, watch_launcher: bool = True):
        self.deadline = time.monotonic() + stop_after_hours * 3600 if stop_after_hours > 0 else None
        self.stop_after_hours = stop_after_hours
        self._signal: str | None = None
        self._previous: dict[int, Any] = {}
        self._launchers = _launcher_ancestors() if watch_launcher else []

    def install(self) -> "StopRequests":
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, _frame) -> None:
        if signum == signal.SIGINT and self._signal is not None:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self._signal = self._signal or signal.Signals(signum).name

    def reason(self) -> str | None:
        """Why the run should stop after this step, or None."""
        if self._signal:
            return self._signal
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return f"time budget of {self.stop_after_hours:g} h reached"
        for process in self._launchers:
            if not _alive(process):
                return f"the launcher (pid {process.pid}) is gone"
        return None

    @property
    def watched_launchers(self) -> list[int]:
        return [p.pid for p in self._launchers]


def _alive(process) -> bool:
    import psutil

    try:  # a killed launcher that nobody has reaped yet is a zombie: gone all the same
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _launcher_ancestors() -> list:
    """This process's consecutive launcher ancestors (psutil processes), nearest first."""
    try:
        import psutil
    except ImportError:  # psutil comes with DeepSpeed; without it the launcher is not watched
        return []
    found = []
    try:
        for parent in psutil.Process(os.getpid()).parents():
            command = " ".join(parent.cmdline())
            if not any(mark in command for mark in _LAUNCHER_MARKS):
                break
            found.append(parent)
    except (psutil.Error, OSError):
        pass
    return found
