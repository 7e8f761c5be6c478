"""biomed_lm.worker_lifetime: the pools' workers of a data stage die with it (QA, 2026-11-28: killing
prepare_corpus or create_pretraining_data alone left 2-3 workers of 130 MB each waiting forever)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

# Each worker marks that it holds its task before the parent prints their pids: a worker still waiting for
# one when its parent dies reads the end of the task pipe and leaves by itself (CI, once, under load), which
# is not the fault the hook mends.
POOL = """
import os, sys, time
from pathlib import Path

def task(_):
    Path(sys.argv[3], str(os.getpid())).touch()
    time.sleep(60)

if sys.argv[1] == "on":
    from biomed_lm.worker_lifetime import workers_die_with_this_process
    workers_die_with_this_process()
if sys.argv[2] == "multiprocess":  # datasets' map(num_proc=...)
    import multiprocess
    pool = multiprocess.Pool(2)
    pool.map_async(task, [0, 1], chunksize=1)
else:  # prepare_corpus's parsing
    from concurrent.futures import ProcessPoolExecutor
    pool = ProcessPoolExecutor(2)
    [pool.submit(task, i) for i in range(2)]
while len(os.listdir(sys.argv[3])) < 2:
    time.sleep(0.05)
print(" ".join(sorted(os.listdir(sys.argv[3]))), flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie awaiting its reaper is gone for our purpose
        return stat.read().split(")")[-1].split()[0] != "Z"


def _workers_after_parent_killed(hook: str, pool: str, wait_s: float, markers: Path) -> list[int]:
    markers.mkdir()
    parent = subprocess.Popen([sys.executable, "-c", POOL, hook, pool, str(markers)], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
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
def test_workers_die_with_a_killed_parent_and_without_the_hook_they_did_not(pool, tmp_path):
    assert _workers_after_parent_killed("on", pool, wait_s=10, markers=tmp_path / "on") == []
    assert len(_workers_after_parent_killed("off", pool, wait_s=2, markers=tmp_path / "off")) == 2  # the fault
