"""Worker processes that die with the process that started them.

``prepare_corpus`` and ``create_pretraining_data`` fan work out to process pools (``datasets``'
``map(num_proc=...)``, ``concurrent.futures``). A pool's workers wait on pipes that they hold open
themselves, so when the stage's own process is killed (``kill -9``, or a ``kill -TERM`` sent to it
alone, as a scheduler or a user can) they never see an end of file and wait forever: QA found 2-3
idle workers of 130 MB each per killed run, still there minutes later.

:func:`workers_die_with_this_process` registers an after-fork hook with ``multiprocessing`` and its
``dill``-based twin ``multiprocess`` (which ``datasets`` uses): in every worker forked from this
process's main thread, Linux's ``PR_SET_PDEATHSIG`` has the kernel send it SIGKILL when this process
dies, however it dies. Workers forked from another thread are left alone (the signal follows the
forking *thread*, which could end while its workers still work). Elsewhere than Linux it does nothing.

The same workers ignore SIGINT. Ctrl-C reaches every process of the terminal's foreground group: each
worker used to print its own ``KeyboardInterrupt`` traceback, one per worker, around the stage's one
line. The stage's process takes the interrupt alone, and its pool's clean-up ends the workers.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class _Parent:
    """What a forked worker checks against: the process that registered the hook, and its main thread."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.main_thread = threading.main_thread().ident


#: One registration per process: the fork registries hold their objects weakly, so these keep them alive.
_REGISTERED: dict[int, _Parent] = {}


def workers_die_with_this_process() -> None:
    """Have every worker this process forks (from its main thread) killed when this process dies, and
    leave Ctrl-C to this process."""
    if not sys.platform.startswith("linux") or os.getpid() in _REGISTERED:
        return
    parent = _REGISTERED[os.getpid()] = _Parent()
    import multiprocessing.process
    import multiprocessing.util

    multiprocessing.util.register_after_fork(parent, functools.partial(_die_with_parent, multiprocessing.process))
    try:
        import multiprocess.process
        import multiprocess.util
    except ImportError:  # datasets' pools are multiprocess's; without it only the standard library's exist
        return
    multiprocess.util.register_after_fork(parent, functools.partial(_die_with_parent, multiprocess.process))


def die_with(parent_pid: int) -> None:
    """In a worker *spawned* by ``parent_pid`` (a fresh interpreter, where the after-fork hook above never
    runs): SIGKILL when that process dies, however it dies; end now if it already has. Ctrl-C is left to the
    worker (the sweep's runs clean their folders up on it). Elsewhere than Linux it does nothing."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def _die_with_parent(process_module, parent: _Parent) -> None:
    """In the forked worker: ask the kernel for SIGKILL when the parent ends; end now if it already has.
    The parent is the one the worker's own ``multiprocessing`` records, not ``os.getppid()``, which is
    already another process if the parent died before this ran."""
    started_by = process_module.parent_process()
    if started_by is None or started_by.pid != parent.pid or threading.get_ident() != parent.main_thread:
        return  # a grandchild, or forked from another thread of the parent
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle (module docstring)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent.pid:  # the parent died before the request took effect
        os._exit(1)
