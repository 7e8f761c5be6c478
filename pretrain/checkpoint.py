"""Verified, atomic, resumable checkpoints of a DeepSpeed pretraining run.

Layout under ``<run>/checkpoints/``::

    step-00000500/          DeepSpeed's model/optimizer/scheduler files (our client state inside),
        rng_state_rank0.pt  one RNG file per rank (dropout and masking continue exactly),
        hf/                 a transformers export: config.json, model.safetensors, tokenizer
        manifest.json       written last: every file with its size and xxh3-128 checksum, the
                            step, the world size, the run's signature (see pretrain/resume.py)
                            and a checksum of the manifest itself
    latest                  the tag of the newest complete checkpoint (for people and tools)
    damaged-step-00000600/  a checkpoint that failed verification, moved aside, never deleted

Saving. Every rank writes into a staging folder; when all are done, rank 0 writes the export,
checksums every file and writes the manifest, then renames the folder into place and updates
``latest``; only then are checkpoints beyond ``keep_last`` pruned. A crash at any moment of a save
leaves the previous checkpoints untouched. Checksumming a BERT-base checkpoint adds a fraction of
a second to its save (``benchmarks/bench_checkpoint.py``).

Resuming. :func:`select_checkpoint` walks the checkpoints from the newest and takes the first one
whose manifest verifies (every listed file present, same size, same checksum; every file a
resume needs listed: model states, each rank's RNG state, each rank's optimizer partition under
ZeRO). Damaged ones are reported and moved aside. When checkpoints exist but none verifies, or
``latest`` names a checkpoint that is gone and nothing else is there, it raises
:class:`CheckpointError`: a run directory with history never silently restarts from step 0.
(Multi-node runs need the run directory on a shared filesystem, as DeepSpeed checkpointing does.)
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import random
import re
import resource
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from biomed_lm.atomic_files import write_text_atomically
from biomed_lm.errors import PretrainError
from biomed_lm.resources import read_json_object

CHECKPOINT_DIR = "checkpoints"
LATEST = "latest"
TAG_PREFIX = "step-"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
DAMAGED_PREFIX = "damaged-"
DIVERGED_PREFIX = "diverged-"
MODEL_STATES = "mp_rank_00_model_states.pt"
_TAG_PATTERN = re.compile(r"^step-(\d{8})$")


class CheckpointError(PretrainError, RuntimeError):
    """No checkpoint can be resumed from although the run has some; the message says what is wrong."""


def tag_for(step: int) -> str:
    return f"{TAG_PREFIX}{step:08d}"


def checkpoints_root(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def checkpoint_tags(run_dir: str | os.PathLike) -> list[str]:
    """Tags of the checkpoint folders in place (complete or not), oldest first."""
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and _TAG_PATTERN.match(p.name))


def latest_tag(run_dir: str | os.PathLike) -> str | None:
    """The tag ``latest`` names if that folder exists, else None (a hint: resuming verifies)."""
    pointer = checkpoints_root(run_dir) / LATEST
    if not pointer.is_file():
        return None
    tag = pointer.read_text(encoding="utf-8", errors="replace").strip()
    return tag if _TAG_PATTERN.match(tag) and (checkpoints_root(run_dir) / tag).is_dir() else None


# --- RNG state ---------------------------------------------------------------------------------

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


def rng_file(rank: int) -> str:
    return f"rng_state_rank{rank}.pt"


# --- manifests ---------------------------------------------------------------------------------

def file_checksum(path: Path) -> str:
    """xxh3-128 of a file's bytes (a corruption check, not a security one). The file is hashed
    through a memory map, in place in the page cache: copying blocks out with read() costs more than
    the hash itself (5.9 against 15 GB/s measured)."""
    import xxhash

    digest = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size:
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
                digest.update(view)
    return digest.hexdigest()


def required_files(world_size: int, zero_stage: int) -> list[str]:
    """The files a resume cannot do without: model (with optimizer, scheduler and client state
    outside ZeRO), each rank's RNG state, and each rank's optimizer partition under ZeRO."""
    files = [MODEL_STATES] + [rng_file(r) for r in range(world_size)]
    if zero_stage > 0:
        files += [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(world_size)]
    return files


def write_manifest(folder: Path, *, step: int, world_size: int, zero_stage: int,
                   signature: dict[str, Any]) -> dict[str, Any]:
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        files[path.relative_to(folder).as_posix()] = {"size": path.stat().st_size, "xxh3_128": file_checksum(path)}
    manifest = {"format": MANIFEST_FORMAT, "step": step, "world_size": world_size, "zero_stage": zero_stage,
                "signature": signature, "files": files}
    manifest["self_xxh3_128"] = _self_checksum(manifest)
    write_text_atomically(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def _self_checksum(manifest: dict[str, Any]) -> str:
    """The checksum of the manifest's own content (its canonical JSON without this field), so a
    changed byte in the manifest is caught like one in any other file."""
    import xxhash

    body = {k: v for k, v in manifest.items() if k != "self_xxh3_128"}
    return xxhash.xxh3_128(json.dumps(body, sort_keys=True).encode("utf-8")).hexdigest()


def read_manifest(folder: Path) -> dict[str, Any]:
    """The folder's manifest, checked against its own checksum and for its shape."""
    path = folder / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"no {MANIFEST} (a save that never finished, or a checkpoint from an older version)")
    manifest = read_json_object(path, CheckpointError, "checkpoint manifest")
    if manifest.get("format") != MANIFEST_FORMAT:
        raise CheckpointError(f"{MANIFEST} is not a format-{MANIFEST_FORMAT} manifest")
    if manifest.get("self_xxh3_128") != _self_checksum(manifest):
        raise CheckpointError(f"{MANIFEST} does not match its own checksum (the manifest was changed)")
    problem = _shape_problem(manifest)
    if problem:
        raise CheckpointError(f"{MANIFEST} is malformed: {problem}")
    return manifest


def _shape_problem(manifest: dict[str, Any]) -> str | None:
    """What is missing or of the wrong type in a manifest, or None."""
    for key in ("step", "world_size", "zero_stage"):
        if not isinstance(manifest.get(key), int) or isinstance(manifest.get(key), bool):
            return f"{key} is {manifest.get(key)!r}, not an integer"
    if not isinstance(manifest.get("signature"), dict):
        return "signature is not a mapping"
    if not isinstance(manifest.get("files"), dict):
        return "files is not a mapping"
    for name, entry in manifest["files"].items():
        if not (isinstance(entry, dict) and isinstance(entry.get("size"), int)
                and isinstance(entry.get("xxh3_128"), str)):
            return f"the entry of {name} is not {{size, xxh3_128}}"
    return None


def verify_checkpoint(folder: Path) -> dict[str, Any]:
    """The folder's manifest after checking every file against it; raises :class:`CheckpointError`
    naming the first problem."""
    manifest = read_manifest(folder)
    listed = manifest["files"]
    for name in required_files(manifest["world_size"], manifest["zero_stage"]):
        if name not in listed:
            raise CheckpointError(f"{name} is required to resume but the manifest does not list it")
        if listed[name]["size"] == 0:  # written empty: no state to resume from, whatever the checksum says
            raise CheckpointError(f"{name} is required to resume but was saved empty")
    if manifest["step"] != _step_of(folder.name):
        raise CheckpointError(f"the manifest is for step {manifest['step']}, the folder for {_step_of(folder.name)}")
    for name, expected in listed.items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{name} is missing")
        size = path.stat().st_size
        if size != expected["size"]:
            raise CheckpointError(f"{name} has {size:,} bytes, the manifest says {expected['size']:,} (truncated?)")
        if file_checksum(path) != expected["xxh3_128"]:
            raise CheckpointError(f"{name} does not match its checksum (the bytes were changed)")
    return manifest


def _step_of(tag: str) -> int | None:
    match = _TAG_PATTERN.match(tag)
    return int(match.group(1)) if match else None


# --- saving ------------------------------------------------------------------------------------

class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (disk full, file too large, permission, not a directory):
    the message names the folder and the OS's reason. The previous checkpoints are untouched. Not a
    :class:`BiomedLMError`: nothing in the run's inputs is wrong, and the run exits 1."""


def save_checkpoint(engine, run_dir: str | os.PathLike, step: int, client_state: dict[str, Any], *,
                    rank: int, world_size: int, barrier: Callable[[], None], keep_last: int,
                    signature: dict[str, Any], export: Callable[[Path], None] | None = None) -> Path:
    """Save every rank's state for ``step`` (the number of optimizer steps done), verified and atomic.
    Raises :class:`CheckpointSaveError` when this rank cannot write its part."""
    root = checkpoints_root(run_dir)
    staging = root / f".partial-{tag_for(step)}"
    with _explained_save_failure(staging):
        root.mkdir(parents=True, exist_ok=True)
        if rank == 0 and staging.exists():
            shutil.rmtree(staging)  # left by a crash during an earlier save of this step
    barrier()
    with _explained_save_failure(staging):
        engine.save_checkpoint(str(root), tag=staging.name, client_state=client_state, save_latest=False)
        torch.save(rng_state(), staging / rng_file(rank))
    barrier()
    final = root / tag_for(step)
    if rank == 0:
        with _explained_save_failure(staging):
            if export is not None:
                export(staging / "hf")
            write_manifest(staging, step=step, world_size=world_size, zero_stage=engine.zero_optimization_stage(),
                           signature=signature)
            if final.exists():  # a damaged or superseded save of the same step
                shutil.rmtree(final)
            os.replace(staging, final)
            write_text_atomically(root / LATEST, final.name + "\n")
        _prune(root, keep_last)
    barrier()
    return final


@contextlib.contextmanager
def _explained_save_failure(staging: Path):
    """Turn any failure to write ``staging`` into a :class:`CheckpointSaveError` that says why, and
    remove the partial folder (on a full disk, its space is what the next attempt needs)."""
    try:
        yield
    except Exception as err:  # torch's writer reports a short write as an opaque RuntimeError
        reason = diagnose_write_failure(err, staging)
        shutil.rmtree(staging, ignore_errors=True)
        raise CheckpointSaveError(f"checkpoint save to {staging} failed: {reason}. The partial save was removed; "
                                  "the previous checkpoints are untouched, and re-running the same command "
                                  "resumes from the newest of them once the cause is fixed") from err


def diagnose_write_failure(err: BaseException, folder: Path) -> str:
    """The OS's reason a write under ``folder`` failed, in words. An ``OSError`` carries it; torch's
    C++ writer does not (``basic_ios::clear``, ``unexpected pos``), so then the usual causes are
    checked: a path that is not a directory, no write permission, the file-size limit
    (``ulimit -f``, which a file cut at exactly that size shows) and free space."""
    if isinstance(err, OSError) and err.errno:
        where = f" ({err.filename})" if err.filename else ""
        return f"{_ERRNO_WORDS.get(err.errno, os.strerror(err.errno))}{where}"
    found = f"{type(err).__name__}: {err}"
    existing = next(p for p in [folder, *folder.parents] if p.exists())  # the root always exists
    if not existing.is_dir():
        return f"{existing} is not a directory ({found})"
    if not os.access(existing, os.W_OK):
        return f"permission denied: {existing} is not writable ({found})"
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and any(p.stat().st_size == limit for p in _files_under(folder)):
        return f"file too large: a file reached the file-size limit (ulimit -f) of {limit:,} bytes ({found})"
    free = shutil.disk_usage(existing).free
    if free < _NEARLY_FULL_BYTES:
        return f"disk full: {free:,} bytes free on the filesystem of {folder} ({found})"
    return found


_ERRNO_WORDS = {errno.ENOSPC: "disk full (no space left on device)", errno.EDQUOT: "disk quota exceeded",
                errno.EFBIG: "file too large (the file-size limit, ulimit -f, or the filesystem's)",
                errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
                errno.EROFS: "read-only filesystem",
                errno.ENOTDIR: "not a directory (a file is where a folder must go)",
                errno.EEXIST: "a file is in the way (it exists and is not a directory)"}
_NEARLY_FULL_BYTES = 64 * 2**20


def _files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []


def _prune(root: Path, keep_last: int) -> None:
    """Delete verified-era checkpoints beyond the newest ``keep_last`` (the newest is the one just
    verified and renamed into place; damaged ones were moved aside and are never pruned)."""
    tags = sorted(p for p in root.iterdir() if p.is_dir() and _TAG_PATTERN.match(p.name))
    for old in tags[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


# --- resuming ----------------------------------------------------------------------------------

@dataclass
class Selection:
    """What :func:`select_checkpoint` found: the tag to resume from (None: start fresh), its
    manifest, and what was skipped on the way, as messages for the run log."""

    tag: str | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def select_checkpoint(run_dir: str | os.PathLike, *, move_damaged: bool = True) -> Selection:
    """The newest verified checkpoint of ``run_dir``; damaged newer ones are moved aside and
    reported. Raises :class:`CheckpointError` when the run has checkpoints (or a ``latest``) but
    none verifies."""
    root = checkpoints_root(run_dir)
    selection = Selection()
    pointer = _read_pointer(root)
    tags = checkpoint_tags(run_dir)
    if pointer is not None and pointer not in tags:
        selection.notes.append(f"{root / LATEST} names {pointer or 'nothing readable'}, which is not there")
    problems, damaged = [], []
    for tag in reversed(tags):
        try:
            selection.manifest = verify_checkpoint(root / tag)
        except CheckpointError as err:
            problems.append(f"{root / tag}: {err}")
            damaged.append((tag, str(err)))
            continue
        selection.tag = tag
        for bad, why in damaged:  # only once a good one is found: otherwise everything stays as it was
            where = f"moved to {_move_aside(root, bad).name}" if move_damaged else "skipped"
            selection.notes.append(f"checkpoint {bad} is damaged ({why}); {where}; resuming from {tag}")
        return selection
    if problems or pointer is not None:
        detail = "; ".join(problems) or (f"{root / LATEST} names {pointer or 'nothing readable'} "
                                         "but no checkpoint is there")
        raise CheckpointError(f"cannot resume {run_dir}: no verified checkpoint ({detail}). Nothing was trained or "
                              "deleted; to start over, use a new --output-dir")
    return selection


def _read_pointer(root: Path) -> str | None:
    """The text of ``latest`` ('' when unreadable), or None when there is no such file."""
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    try:
        return pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _move_aside(root: Path, tag: str, prefix: str = DAMAGED_PREFIX) -> Path:
    target = root / f"{prefix}{tag}"
    n = 1
    while target.exists():
        n += 1
        target = root / f"{prefix}{tag}-{n}"
    os.replace(root / tag, target)
    return target


def set_aside_diverged(run_dir: str | os.PathLike, first_step: int) -> list[str]:
    """Move checkpoints of step ``first_step`` or later aside as ``diverged-…`` (kept, never
    resumed from) and point ``latest`` at the newest one left; returns the new folder names.

    A spike shows in the loss of the step *after* the update that caused it, so the checkpoint
    written right after that update already holds the damage: a divergence abort sets aside
    everything from the last accepted step on."""
    root = checkpoints_root(run_dir)
    moved = [_move_aside(root, tag, DIVERGED_PREFIX).name for tag in checkpoint_tags(run_dir)
             if _step_of(tag) >= first_step]
    remaining = checkpoint_tags(run_dir)
    if moved and remaining:
        write_text_atomically(root / LATEST, remaining[-1] + "\n")
    elif moved:
        (root / LATEST).unlink(missing_ok=True)
    return moved


def load_checkpoint(engine, run_dir: str | os.PathLike, tag: str, rank: int) -> dict[str, Any]:
    """Restore model, optimizer, scheduler and this rank's RNG from a verified checkpoint; returns
    the client state. Every file is required."""
    root = checkpoints_root(run_dir)
    folder = root / tag
    try:
        path, client_state = engine.load_checkpoint(str(root), tag=tag, load_optimizer_states=True,
                                                    load_lr_scheduler_states=True)
    except Exception as err:  # a verified file that does not fit this model (e.g. another architecture)
        raise CheckpointError(f"cannot load {folder}: {type(err).__name__}: {err}") from err
    if path is None:
        raise CheckpointError(f"DeepSpeed could not load {folder}")
    rng_path = folder / rng_file(rank)
    if not rng_path.is_file():
        raise CheckpointError(f"{rng_path} is missing: this rank's RNG state is required for an exact resume")
    try:
        set_rng_state(torch.load(rng_path, weights_only=False))
    except Exception as err:
        raise CheckpointError(f"{rng_path} is unreadable: {type(err).__name__}: {err}") from err
    trainer_state = (client_state or {}).get("trainer_state")
    if not isinstance(trainer_state, dict) or not isinstance(trainer_state.get("step"), int):
        raise CheckpointError(f"{folder} has no trainer state with a step (pretrain.trainer_state): not one of ours")
    return client_state
