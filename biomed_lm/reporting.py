"""Small pieces every report shares: how a duration is written and how a figure is saved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["format_duration", "save_figure"]


def format_duration(seconds: float) -> str:
    """``42.0 s``, ``3.5 min``, ``2.10 h``: the unit a reader takes in at a glance."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def save_figure(fig: Any, path: Path, dpi: int = 120) -> None:
    """Lay out a matplotlib figure and write it, making its folder."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
