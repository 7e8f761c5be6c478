"""Shared fixtures. Tests that need the real data in ../shared/data skip cleanly without it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
SAMPLE_DIR = REPO / "data" / "sample"


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent")
    return SHARED_DATA


def shared_file(relative: str) -> Path:
    """A file under ../shared/data, or a clean skip naming what is missing."""
    path = SHARED_DATA / relative
    if not path.is_file():
        pytest.skip(f"{path} is absent (the shared data folder is not here)")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_single_rank_deepspeed(script: str) -> dict:
    """Run ``script`` as a one-rank DeepSpeed process on the CPU and return the JSON it prints on its
    last ``RESULT `` line. A separate process, because ``deepspeed.initialize`` sets up
    torch.distributed and DeepSpeed's communication backend for the whole process."""
    pytest.importorskip("deepspeed")
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "",
           "DS_ACCELERATOR": "cpu"}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])
