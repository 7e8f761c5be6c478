"""Atomic, resumable checkpoints of a DeepSpeed pretraining run.

Layout under ``<run>/checkpoints/``::

    step-00000500/          DeepSpeed's model/optimizer/scheduler files, our client state,
        rng_state_rank0.pt  one RNG file per rank (dropout and masking continue exactly),
        hf/                 a transformers export: config.json, model.safetensors, tokenizer
    latest                  the tag of the newest complete checkpoint

A checkpoint is written under a temporary name and renamed into place only when every rank has
finished writing; ``latest`` is replaced atomically after that. A crash while saving therefore
leaves the previous checkpoint and ``latest`` untouched. Older checkpoints beyond ``keep_last``
are deleted only after the new one is complete. (Multi-node runs need the run directory on a
shared filesystem, as DeepSpeed checkpointing does.)
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

CHECKPOINT_DIR = "checkpoints"
LATEST = "latest"
TAG_PREFIX = "step-"


def tag_for(step: int) -> str:
    return f"{TAG_PREFIX}{step:08d}"


def checkpoints_root(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def latest_tag(run_dir: str | os.PathLike) -> str | None:
    """The newest complete checkpoint's tag, or None when the run has none."""
    pointer = checkpoints_root(run_dir) / LATEST
    if not pointer.is_file():
        return None
    tag = pointer.read_text(encoding="utf-8").strip()
    return tag if (checkpoints_root(run_dir) / tag).is_dir() else None


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def save_checkpoint(engine, run_dir: str | os.PathLike, step: int, client_state: dict[str, Any], *,
                    rank: int, barrier: Callable[[], None], keep_last: int,
                    export: Callable[[Path], None] | None = None) -> Path:
    """Save every rank's state for ``step`` (the number of optimizer steps done) atomically."""
    root = checkpoints_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    tag = tag_for(step)
    staging_tag = f".partial-{tag}"
    staging = root / staging_tag
    if rank == 0 and staging.exists():
        shutil.rmtree(staging)  # left by a crash during an earlier save of this step
    barrier()
    engine.save_checkpoint(str(root), tag=staging_tag, client_state=client_state, save_latest=False)
    torch.save(rng_state(), staging / f"rng_state_rank{rank}.pt")
    barrier()
    final = root / tag
    if rank == 0:
        if export is not None:
            export(staging / "hf")
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
        _write_atomically(root / LATEST, tag + "\n")
        _prune(root, keep_last)
    barrier()
    return final


def _prune(root: Path, keep_last: int) -> None:
    tags = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(TAG_PREFIX))
    for old in tags[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(engine, run_dir: str | os.PathLike, tag: str, rank: int) -> dict[str, Any]:
    """Restore model, optimizer, scheduler and this rank's RNG; returns the client state."""
    root = checkpoints_root(run_dir)
    path, client_state = engine.load_checkpoint(str(root), tag=tag, load_optimizer_states=True,
                                                load_lr_scheduler_states=True)
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {root / tag}")
    rng_file = root / tag / f"rng_state_rank{rank}.pt"
    if rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=False))
    return client_state or {}
