"""Shared fixtures. Tests that need the real data in ../shared/data skip cleanly without it."""

from __future__ import annotations

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
