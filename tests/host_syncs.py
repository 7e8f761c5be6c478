"""Find what makes the host wait for the device: reading a value back (``.item()``, ``bool()``,
``float()``, ``.tolist()``, ``.cpu()``, ``.numpy()``) or a shape decided by data (``nonzero``,
``masked_select``, boolean indexing). On CPU nothing waits, so the operations themselves are
recorded, with where they were called: what would be a synchronization on a GPU.

    with host_syncs() as found:
        ...             # found: [{"op": ..., "at": "file.py:123"}, ...]
        with paused():  # host-side work (the loader's collation) is not counted
            ...
"""

from __future__ import annotations

import contextlib
import traceback
from pathlib import Path
from typing import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

_READS = ("tolist", "cpu", "numpy")
_state = {"found": None}


def _where() -> str:
    frames = [f for f in traceback.extract_stack()[:-3]
              if "/torch/" not in f.filename and "host_syncs" not in f.filename]
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"


def _record(what: str) -> None:
    if _state["found"] is not None:
        _state["found"].append({"op": what, "at": _where()})


class _Spy(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        boolean_index = name.startswith("aten.index.Tensor") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None)
        if name.startswith(("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select")) or boolean_index:
            _record(name)
        return func(*args, **(kwargs or {}))


def _reader(method: str):
    original = getattr(torch.Tensor, method)

    def read(self, *args, **kwargs):
        _record(f"Tensor.{method}")
        return original(self, *args, **kwargs)
    return original, read


@contextlib.contextmanager
def host_syncs() -> Iterator[list[dict]]:
    """Record the block's host synchronizations (see the module doc)."""
    found: list[dict] = []
    originals = {}
    for method in _READS:
        originals[method], replacement = _reader(method)
        setattr(torch.Tensor, method, replacement)
    _state["found"] = found
    try:
        with _Spy():
            yield found
    finally:
        _state["found"] = None
        for method, original in originals.items():
            setattr(torch.Tensor, method, original)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Host-side work inside a spied block, not recorded."""
    found, _state["found"] = _state["found"], None
    try:
        with _disable_current_modes():
            yield
    finally:
        _state["found"] = found
