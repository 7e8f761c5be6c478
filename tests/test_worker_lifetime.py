"""biomed_lm.worker_lifetime: the pools' workers of a data stage die with it (QA, 2026-11-28: killing
prepare_corpus or create_pretraining_data alone left 2-3 workers of 130 MB each waiting forever)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

POOL = """
import sys, time
if sys.argv[1] == "on":
    from biomed_lm.worker_lifetime import workers_die_with_this_process
    workers_die_with_this_process()
if sys.argv[2] == "multiprocess":  # datasets' map(num_proc=...)
    import multiprocess
    pool = multiprocess.Pool(2)
    pool.map_async(time.sleep, [60, 60])
    pids = [p.pid for p in pool._pool]
else:  # prepare_corpus's parsing
    from concurrent.futures import ProcessPoolExecutor
    pool = ProcessPoolExecutor(2)
    [pool.submit(time.sleep, 60) for _ in range(2)]
    time.sleep(1)
    pids = list(pool._processes)
print(" ".join(map(str, pids)), flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie awaiting its reaper is gone for our purpose
        return stat.read().split(")")[-1].split()[0] != "Z"


def _workers_after_parent_killed(hook: str, pool: str, wait_s: float) -> list[int]:
    parent = subprocess.Popen([sys.executable, "-c", POOL, hook, pool], cwd=REPO, stdout=subprocess.PIPE, text=True)
    workers = [int(pid) for pid in parent.stdout.readline().split()]
    assert len(workers) == 2
    parent.kill()  # SIGKILL: the parent runs nothing more
    parent.wait()
    deadline = time.monotonic() + wait_s
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = [pid for pid in workers if _alive(pid)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    return survivors


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("pool", ["multiprocess", "concurrent.futures"])
def test_workers_die_with_a_killed_parent_and_without_the_hook_they_did_not(pool):
    assert _workers_after_parent_killed("on", pool, wait_s=10) == []
    assert len(_workers_after_parent_killed("off", pool, wait_s=2)) == 2  # the fault the hook mends
