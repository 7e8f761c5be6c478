"""Where benchmark results go: one JSON file per benchmark under benchmarks/results/ (not committed)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from biomed_lm.atomic_files import write_json_atomically


def write_results(path: str | os.PathLike, result: Any, *, quiet: bool = False) -> None:
    """``result`` as JSON at ``path``, through a temporary file renamed over it: a benchmark that saves as it
    goes (a stage's timeout may cut it) never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(path, result)
    if not quiet:
        print(f"wrote {path}")
