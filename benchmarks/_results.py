"""Where benchmark results go: one JSON file per benchmark under benchmarks/results/ (not committed)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_results(path: str | os.PathLike, result: Any, *, quiet: bool = False) -> None:
    """``result`` as JSON at ``path``, through a temporary file renamed over it: a benchmark that saves as it
    goes (a stage's timeout may cut it) never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)
    if not quiet:
        print(f"wrote {path}")
