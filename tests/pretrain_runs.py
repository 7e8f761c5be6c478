"""Helpers for tests that run launch/pretrain.py end to end: inputs made with the toolkit's own
scripts, the standard tiny-run arguments, and subprocess runners (a process group lives for the
whole process, so every run is its own process)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests import forked_main
from tests.conftest import REPO, SAMPLE_DIR

PYTHON = sys.executable
STEPS = 20
HOOKS = REPO / "tests" / "pretrain_hooks.py"


def make_pretraining_inputs(root: Path) -> dict[str, Path]:
    """A small corpus, vocabulary and 64-token instances made with the toolkit's own scripts."""
    from biomed_lm.pretrain.instance_builder import PretrainingDataConfig, create_pretraining_data
    from biomed_lm.tokenization.corpus import CorpusConfig, prepare_corpus
    from biomed_lm.tokenization.vocab import VocabConfig, build_vocab

    prepare_corpus(CorpusConfig(inputs=[str(SAMPLE_DIR / "sywada_PubMedAbstract_1MB.txt")],
                                output_dir=str(root / "corpus"), min_words=0, num_proc=1))
    build_vocab([str(root / "corpus")], root / "vocab", VocabConfig(vocab_size=3000))
    create_pretraining_data(PretrainingDataConfig(corpus=str(root / "corpus"), tokenizer=str(root / "vocab"),
                                                  output_dir=str(root / "data"), max_seq_length=64, num_proc=1),
                            progress=False)
    return {"root": root, "vocab": root / "vocab", "data": root / "data"}


def pretrain_args(inputs: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["--model", "bert-tiny", "--data-dir", str(inputs["data"]), "--tokenizer", str(inputs["vocab"]),
            "--output-dir", str(out), "--max-steps", str(STEPS), "--micro-batch-size", "8",
            "--gradient-accumulation-steps", "2", "--learning-rate", "1e-3", "--checkpoint-every", "10",
            "--keep-last", "2", "--num-workers", "0", "--wandb-mode", "disabled", *extra]


def with_option(args: list[str], flag: str, value: str) -> list[str]:
    """``args`` with ``flag``'s value replaced (or the flag appended)."""
    args = list(args)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    return args


def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                               "MASTER_PORT")}
    return {**clean, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def pretrain_command(args: list[str], hooks: dict | None = None) -> list[str]:
    if hooks:
        return [PYTHON, str(HOOKS), "--hooks", json.dumps(hooks), *args]
    return [PYTHON, str(REPO / "launch" / "pretrain.py"), *args]


def run(args: list[str], hooks: dict | None = None, timeout: int = 300,
        fresh: bool = False) -> subprocess.CompletedProcess:
    """launch/pretrain.py with ``args`` (and test ``hooks``) as its own process: forked from this
    one where it can be (:mod:`tests.forked_main`: the same script in a child process, without the
    10-15 s of imports a fresh interpreter spends here), or with ``fresh`` a new interpreter, as a
    user starts it."""
    if fresh:
        return subprocess.run(pretrain_command(args, hooks), cwd=REPO, env=env(), capture_output=True, text=True,
                              timeout=timeout)
    return forked_main.run_command(pretrain_command(args, hooks), env(), timeout=timeout)


def deepspeed_launcher() -> str | None:
    return shutil.which("deepspeed", path=str(Path(PYTHON).parent))


def losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines)}


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie, exited but not yet reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def group_ended(pgid: int, timeout: float) -> bool:
    """Whether every process of the group (launchers, ranks, DataLoader workers) exits within
    ``timeout`` seconds; those still alive then are killed, so no test leaves one behind."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    return False


def copy_run(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target
