"""What a rerun of a data stage compares with the output a finished run left (``prepare_corpus``,
``build_vocab``, ``create_pretraining_data``): a rerun of the same command is told so and exits 0, as
``pretrain`` and ``finetune`` do, and a command that would build another output is refused, naming what
differs. The stages' own records say which settings and files decide their output; these helpers compare
them and word the differences one way."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

from biomed_lm.resources import shipped_name


def file_identity(path: str | os.PathLike) -> dict:
    """What a rerun compares of an input file: its resolved path, size and modification time (the parse
    cache's identity too; hashing the bytes would read a 30 GB corpus again on every rerun). A file the
    toolkit ships (the sample) is named as shipped and identified by its bytes' digest: a reinstall, an
    upgrade or another virtual environment gives it another path and time, not other contents (QA: a
    reinstall made every output built from the sample refuse its rerun)."""
    path = Path(path)
    stat = path.stat()
    shipped = shipped_name(path)
    if shipped is not None:  # a few MB in all
        return {"path": f"shipped:{shipped}", "bytes": stat.st_size,
                "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    return {"path": str(path.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def changed_files(recorded: Sequence[Mapping], current: Sequence[Mapping], name: str) -> list[str]:
    """At most one line, ``<name>: ...``, saying which files (:func:`file_identity` records) changed, were
    added or were removed since an output was built from ``recorded``; none when they are the same."""
    before = {item["path"]: item for item in recorded}
    now = {item["path"]: item for item in current}
    parts = [_listed([p for p in now if p in before and before[p] != now[p]],
                     "changed (another size, modification time or content)"),
             _listed([p for p in now if p not in before], "added"),
             _listed([p for p in before if p not in now], "removed")]
    parts = [part for part in parts if part]
    if not parts and list(before) != list(now):
        parts = ["the same files in another order"]
    return [f"{name}: {'; '.join(parts)}"] if parts else []


def _listed(paths: list[str], what: str, most: int = 3) -> str:
    """``a, b, c and 2 more <what>``; empty for no path."""
    if not paths:
        return ""
    more = f" and {len(paths) - most} more" if len(paths) > most else ""
    return f"{', '.join(paths[:most])}{more} {what}"


def read_record(path: Path) -> dict | None:
    """A stage's JSON record (summary, card, metadata), or None where it is missing, unreadable or not an
    object: the callers then say the output cannot tell which command built it."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def setting_change_lines(recorded: Mapping[str, Any], current: Mapping[str, Any], what: str) -> list[str]:
    """``name: <recorded> in the finished <what>, <current> now`` for each setting that differs."""
    return [f"{name}: {json.dumps(recorded.get(name))} in the finished {what}, {json.dumps(value)} now"
            for name, value in current.items() if recorded.get(name) != value]


def dataclass_defaults(cls: type) -> dict[str, Any]:
    """Each field of a config dataclass with its default (fields without one are left out)."""
    defaults = {}
    for item in fields(cls):
        if item.default is not MISSING:
            defaults[item.name] = item.default
        elif item.default_factory is not MISSING:
            defaults[item.name] = item.default_factory()
    return defaults


def other_output_message(out: Path, what: str, changes: Sequence[str]) -> str:
    """The refusal of a command that would replace ``out``'s finished output with another one."""
    return (f"{out} already holds {what} built by another command: {'; '.join(changes)}; "
            "pass --overwrite to rebuild it")
