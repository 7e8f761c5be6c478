"""A rank whose peers stop answering without exiting: end it, with one line, instead of hanging
(pretraining's step loop; shared, like :mod:`biomed_lm.backend`, with any loop of several ranks).

A rank that dies closes its connections, and its peers' next collective fails at once (the trainer's
``LostRank``: "another rank ... is gone"). A rank that *freezes* (a node stopped or swapping, a network
partition, a hung device or file system) keeps them open, and its peers wait inside the collective until
the process group's timeout. The groups DeepSpeed makes for its gradient all-reduce are made without a
timeout, so torch gives them its default, 30 minutes on gloo (10 on NCCL, whose watchdog then aborts the
process without a word from us); ``DEEPSPEED_TIMEOUT`` sets only the world group's. QA (2026-11-29): two
simulated nodes on gloo, one frozen by SIGSTOP at step 12, and the other waited in DeepSpeed's
``allreduce_bucket`` for as long as it was watched (190 s, then more than 3 minutes with
``DEEPSPEED_TIMEOUT=1``).

:class:`StallWatchdog` is a daemon thread that the step loop tells of its progress (:meth:`beat` after every
optimizer step and every read of the device's results). It is armed at the loop's first beat, so the first
steps' compilation does not count, and paused while a checkpoint is written. When no beat comes for
``limit_s`` seconds it writes one line to stderr and ends the process with status 1. ``os._exit`` is the
only way out: the main thread waits inside the collective's C++ code, where no Python exception or signal
handler runs. The checkpoints already written are whole (each is renamed into place complete), and this
process's closed connections make its live peers' collectives fail, so they end with ``LostRank``'s message.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TextIO

#: The exit status of a process the watchdog ends (that of ``LostRank``, also a lost peer).
EXIT_STALLED = 1

#: A silence this many times the longest interval between beats so far also counts as healthy: a run
#: whose steps are slow (a large model on CPU, a recompile) is not ended for being slow.
SLOWEST_MULTIPLE = 20


class StallWatchdog:
    """Ends this process when no :meth:`beat` comes, while armed, for ``limit_s`` seconds or
    :data:`SLOWEST_MULTIPLE` times the longest interval between beats so far, whichever is longer.

    ``describe()`` gives the line's second half: where the run was and how to resume it; ``program``
    starts the line. ``limit_s`` 0 makes a watchdog that never starts a thread."""

    def __init__(self, limit_s: float, describe: Callable[[], str], *, program: str = "pretrain",
                 stream: TextIO | None = None, end: Callable[[int], None] = os._exit,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = float(limit_s)
        self._describe, self._program, self._stream, self._end, self._clock = describe, program, stream, end, clock
        self._last: float | None = None  # None: not armed (before the first beat, or paused)
        self._slowest = 0.0  # the longest interval between two beats (a pause's not counted)
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """The loop made progress: the limit counts from now (the first beat arms the watchdog)."""
        if self.limit_s <= 0:
            return
        now = self._clock()
        with self._lock:
            if self._last is not None:
                self._slowest = max(self._slowest, now - self._last)
            self._last = now
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="stall-watchdog", daemon=True)
            self._thread.start()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Work that is not a step and may be long (a checkpoint save): not counted; the limit counts
        again from its end."""
        with self._lock:
            armed, self._last = self._last is not None, None
        try:
            yield
        finally:
            if armed:
                self.beat()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        poll = min(max(self.limit_s / 10, 0.05), 10.0)
        while not self._stopped.wait(poll):
            with self._lock:
                silent = None if self._last is None else self._clock() - self._last
                limit = max(self.limit_s, SLOWEST_MULTIPLE * self._slowest)
            if silent is not None and silent > limit:
                stream = self._stream or sys.stderr
                print(f"\n{self._program}: error: no progress for {silent:.0f} s (--stall-timeout "
                      f"{self.limit_s:g}, the slowest step so far {self._slowest:.1f} s): {self._describe()}",
                      file=stream, flush=True)
                self._end(EXIT_STALLED)
                return
