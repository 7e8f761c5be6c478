"""Where pretraining metrics go: a JSONL file in the run directory, a tqdm bar, and wandb.

Only rank 0 writes. ``metrics.jsonl`` gets one JSON object per logged step (appended, so a resumed
run continues the same file), ``run_config.json`` the run's configuration; wandb gets the same.
wandb is optional and offline by default (``wandb_mode``: offline | online | disabled): it is
imported only when enabled, and a missing package is a logged warning, not a failure.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from biomed_lm.atomic_files import write_lines_atomically

LOG = logging.getLogger(__name__)
#: Keys metrics.jsonl had before they were renamed: old -> current. The pair objective (NSP, SOP or
#: DRP) was logged as nsp_*; :func:`read_metrics_file` reads an older file's lines under the new keys.
RENAMED_KEYS = {"nsp_loss": "pair_loss", "nsp_accuracy": "pair_accuracy"}


class MetricsLogger:
    def __init__(self, run_dir: str | os.PathLike, enabled: bool, wandb_mode: str, wandb_project: str,
                 run_name: str, config: dict[str, Any], total_steps: int, initial_step: int):
        self.enabled = enabled
        self._file = None
        self._bar = None
        self._wandb = None
        if not enabled:
            return
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / "metrics.jsonl"
        if path.is_file():  # a resumed run: drop lines of steps the checkpoint does not include
            records, bad_lines = read_metrics_file(path)
            for line in bad_lines:  # a crash mid-write leaves a half line; it must not block the resume
                LOG.warning("%s, line %d: unreadable metrics line dropped", path, line)
            kept = [r for r in records if r.get("step", 0) <= initial_step]
            write_lines_atomically(path, (json.dumps(r) + "\n" for r in kept))
        self._file = open(path, "a", encoding="utf-8")
        # The run's full configuration beside its metrics: what experiment reports read.
        (run_dir / "run_config.json").write_text(json.dumps(config, indent=2, default=str) + "\n", encoding="utf-8")
        from tqdm.auto import tqdm

        self._bar = tqdm(total=total_steps, initial=initial_step, desc="pretrain", unit="step", dynamic_ncols=True)
        if wandb_mode != "disabled":
            self._wandb = _start_wandb(run_dir, wandb_mode, wandb_project, run_name or run_dir.name, config)

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=record["step"])

    def progress(self, step: int, postfix: dict[str, str]) -> None:
        if self._bar is not None:
            self._bar.update(step - self._bar.n)
            self._bar.set_postfix(postfix, refresh=False)

    def message(self, text: str) -> None:
        """A log line (to stderr, with the progress bar), from rank 0."""
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        elif self.enabled:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._file is not None:
            self._file.close()
        if self._wandb is not None:
            self._wandb.finish()


def _start_wandb(run_dir: Path, mode: str, project: str, name: str, config: dict[str, Any]):
    try:
        import wandb
    except ImportError:
        LOG.warning("wandb is not installed; metrics go to metrics.jsonl only (pip install wandb)")
        return None
    return wandb.init(project=project, name=name, dir=str(run_dir), mode=mode, config=config,
                      resume="allow", id=_stable_run_id(run_dir))


def _stable_run_id(run_dir: Path) -> str:
    """One wandb run per run directory, so a resumed run continues its curves."""
    import hashlib

    return hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16]


def cuda_allocator_counts(device) -> dict[str, float]:
    """The CUDA caching allocator's counts so far on ``device`` (none elsewhere): ``cuda_alloc_retries``,
    the times it freed its cache and retried an allocation that did not fit (each a device-wide
    synchronize and cudaFree: shapes that change every step can fragment the cache until this happens),
    ``cuda_mallocs``, its cudaMalloc calls (flat after warm-up when the cache serves every step), and the
    peak of allocated memory. Host-side bookkeeping: reading them waits for nothing on the device."""
    if getattr(device, "type", None) != "cuda":
        return {}
    import torch

    stats = torch.cuda.memory_stats(device)
    return {"cuda_alloc_retries": stats.get("num_alloc_retries", 0),
            "cuda_mallocs": stats.get("num_device_alloc", 0),
            "peak_memory_gib": stats.get("allocated_bytes.all.peak", 0) / 2 ** 30}


def read_metrics_file(path: Path, required_key: str | None = None) -> tuple[list[dict[str, Any]], list[int]]:
    """The records of a metrics file (old keys read as the current ones: :data:`RENAMED_KEYS`) and
    the numbers of its unreadable lines (a record without ``required_key`` counts as one)."""
    records, bad = [], []
    text = path.read_text(encoding="utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            bad.append(number)
            continue
        if isinstance(record, dict) and (required_key is None or required_key in record):
            records.append({RENAMED_KEYS.get(key, key): value for key, value in record.items()})
        else:
            bad.append(number)
    return records, bad
