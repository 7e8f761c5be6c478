"""Where benchmark results go: one JSON file per benchmark under benchmarks/results/ (not committed)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_results(path: str | os.PathLike, result: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")
