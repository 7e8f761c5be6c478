"""What a rerun of a data stage compares with the output a finished run left (``prepare_corpus``,
``build_vocab``, ``create_pretraining_data``): a rerun of the same command is told so and exits 0, as
``pretrain`` and ``finetune`` do, and a command that would build another output is refused, naming what
differs. The stages' own records say which settings and files decide their output; these helpers compare
them and word the differences one way.

A finished output is also checked against itself: the stages record the name and size of each file of the dataset
they saved (:func:`saved_files_record`), and a rerun finding one missing or of another size calls the output
damaged (:func:`damaged_file_lines`) instead of complete; the same records let a loader name a missing shard.
Sizes, not digests: the shards are gigabytes at PubMed scale, and a cut-off or deleted shard changes its size.
The size those shards are cut to, ``max_shard_size``, is checked here too (:func:`shard_size_problem`), when a
stage's config is built, for both stages that save one."""

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
    if shipped is not None:  # the sample and BLURB slice: a few MB in all
        with open(path, "rb") as handle:
            digest = hashlib.file_digest(handle, "sha256").hexdigest()
        return {"path": f"{SHIPPED_PREFIX}{shipped}", "bytes": stat.st_size, "sha256": digest}
    return {"path": str(path.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


#: How :func:`file_identity` names a shipped file: ``shipped:data/sample/x.txt``.
SHIPPED_PREFIX = "shipped:"


def changed_files(recorded: Sequence[Mapping], current: Sequence[Mapping], name: str) -> list[str]:
    """At most one line, ``<name>: ...``, saying which files (:func:`file_identity` records) changed, were
    added or were removed since an output was built from ``recorded``; none when they are the same."""
    now = {item["path"]: item for item in current}
    before = {_as_shipped(item, now)["path"]: _as_shipped(item, now) for item in recorded}
    parts = [_listed([p for p in now if p in before and before[p] != now[p]],
                     "changed (another size, modification time or content)"),
             _listed([p for p in now if p not in before], "added"),
             _listed([p for p in before if p not in now], "removed")]
    parts = [part for part in parts if part]
    if not parts and list(before) != list(now):
        parts = ["the same files in another order"]
    return [f"{name}: {'; '.join(parts)}"] if parts else []


def _as_shipped(recorded: Mapping, now: Mapping[str, Mapping]) -> Mapping:
    """A record written before shipped files were named so (by their install path, size and time), as the shipped
    file it was when one of the same name and size is an input now: its bytes are taken as the same (an upgrade
    of the toolkit refused every rerun of an output built from the sample: "added" / "removed")."""
    path = str(recorded.get("path", ""))
    if path.startswith(SHIPPED_PREFIX):
        return recorded
    for name, item in now.items():
        relative = name[len(SHIPPED_PREFIX):]
        if name.startswith(SHIPPED_PREFIX) and path.endswith("/" + relative) and item["bytes"] == recorded.get("bytes"):
            return item
    return recorded


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


# ------------------------------------------------------------------ the files of a saved dataset

#: What ``datasets``' ``save_to_disk`` writes beside its Arrow shards: both are read back by ``load_from_disk``.
DATASET_RECORD_FILES = ("state.json", "dataset_info.json")


def saved_dataset_files(folder: Path) -> list[Path]:
    """The files of the ``datasets`` dataset saved in ``folder``: its two JSON files and the Arrow shards its
    ``state.json`` lists (a shard a larger earlier save left behind is not the dataset's, so it is not listed);
    every ``data-*.arrow`` there when ``state.json`` names none."""
    state = read_record(folder / "state.json") or {}
    listed = [item.get("filename") for item in state.get("_data_files") or [] if isinstance(item, Mapping)]
    shards = [folder / name for name in listed if isinstance(name, str)] or sorted(folder.glob("data-*.arrow"))
    return [folder / name for name in DATASET_RECORD_FILES if (folder / name).is_file()] + shards


def saved_files_record(folder: Path) -> list[dict]:
    """``[{"name", "bytes"}]`` for each file of the dataset saved in ``folder`` (:func:`saved_dataset_files`):
    what a stage's record keeps so that a rerun or a loader can tell a shard deleted or cut off since."""
    return [{"name": path.name, "bytes": path.stat().st_size} for path in saved_dataset_files(folder)]


def damaged_file_lines(folder: Path, recorded: Any) -> list[str]:
    """For each file of ``recorded`` (a :func:`saved_files_record`) that is no longer in ``folder`` as it was
    written: ``<name> is missing`` or ``<name> is N bytes, M when it was written``. None for a record an older
    version wrote (no sizes: nothing to compare) or an intact dataset."""
    if not isinstance(recorded, list):
        return []
    lines = []
    for item in recorded:
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            continue
        path = folder / item["name"]
        if not path.is_file():
            lines.append(f"{item['name']} is missing")
        elif isinstance(item.get("bytes"), int) and path.stat().st_size != item["bytes"]:
            lines.append(f"{item['name']} is {path.stat().st_size:,} bytes, {item.get('bytes'):,} when it was "
                         "written")
    return lines


def damaged_output_message(out: Path, what: str, damage: Sequence[str]) -> str:
    """The refusal of a rerun whose finished output lost or changed files since it was built (the completion
    check would otherwise call it complete, and the loader that found it damaged would send the user back)."""
    return (f"{out} holds {what} that is damaged: its files changed since it was built ({damage_listed(damage)}); "
            "pass --overwrite to rebuild it")


def damage_listed(damage: Sequence[str], most: int = 5) -> str:
    """:func:`damaged_file_lines`' lines, the first ``most`` of them (a deleted folder of PubMed-scale data would
    list hundreds of shards)."""
    return "; ".join(damage[:most]) + (f"; and {len(damage) - most} more files" if len(damage) > most else "")


# ------------------------------------------------------------------ the size shards are cut to

#: The units ``datasets`` reads in a shard size (a lower-case ``b``, as in ``500Mb``, means bits).
SHARD_SIZE_FORMS = "a whole number above 0 and a unit: KB, MB, GB, TB, PB (powers of 1000) or KiB, MiB, GiB, TiB, PiB"


def shard_size_problem(size: Any) -> str | None:
    """What is wrong with ``max_shard_size`` as ``save_to_disk`` reads it, or None where it is a size of at least
    one byte. Checked when a stage's config is built: ``save_to_disk`` refuses a bad one (``abc``) with a
    ValueError, and divides by a zero one (``0MB``), only once every document or instance is built."""
    from datasets.utils.py_utils import convert_file_size_to_int

    try:
        size_bytes = convert_file_size_to_int(size) if isinstance(size, str) else None
    except ValueError:  # what it raises for every form it does not read ("abc", "1.5GB", "500")
        size_bytes = None
    if size_bytes is not None and size_bytes >= 1:
        return None
    why = "is not a size" if size_bytes is None else f"is {size_bytes:,} bytes"
    return f"max_shard_size (--max-shard-size) {size!r} {why}: give {SHARD_SIZE_FORMS}, such as 500MB or 1GiB"
