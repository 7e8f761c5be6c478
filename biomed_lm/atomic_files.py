"""Files written whole or not at all: through a temporary file beside the final one, renamed over it.

A reader (a rerun, a resumed sweep, the report, the next stage) decides from a file's presence and its
contents that the step which wrote it is done, so a process killed mid-write must leave either the old
file or none, never half of the new one: ``os.replace`` within one folder is atomic on POSIX. The
temporary name is the final one plus ``.partial`` (``hidden``: with a leading dot too, for a folder whose
readers take every visible file for theirs). No fsync: a process killed at any moment leaves the
page cache intact, and an fsync per record would flush every other dirty page of a large write (×2.8 a
BERT-base checkpoint's save time on ext4); after a node crash the stages' own checks (checkpoint
checksums, records' fields) find what did not reach the disk.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

__all__ = ["PARTIAL_SUFFIX", "partial_path", "replaced_when_done", "write_json_atomically", "write_lines_atomically",
           "write_text_atomically"]

PARTIAL_SUFFIX = ".partial"


def partial_path(path: str | os.PathLike, hidden: bool = False) -> Path:
    """The temporary file :func:`replaced_when_done` writes ``path``'s new contents to."""
    path = Path(path)
    return path.with_name(("." if hidden else "") + path.name + PARTIAL_SUFFIX)


@contextlib.contextmanager
def replaced_when_done(path: str | os.PathLike, hidden: bool = False) -> Iterator[Path]:
    """Yield the temporary path to write ``path``'s new contents to; when the block ends without an error
    it is renamed over ``path``, when it raises it is removed and ``path`` is left as it was."""
    partial = partial_path(path, hidden)
    try:
        yield partial
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, path)


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """``text`` (UTF-8) at ``path``, whole or not at all."""
    with replaced_when_done(path) as partial:
        partial.write_text(text, encoding="utf-8")


def write_json_atomically(path: str | os.PathLike, record: Any, indent: int | None = 2, **dumps_options) -> None:
    """``record`` as JSON (one trailing newline) at ``path``, whole or not at all."""
    write_text_atomically(path, json.dumps(record, indent=indent, **dumps_options) + "\n")


def write_lines_atomically(path: str | os.PathLike, lines: Iterable[str]) -> None:
    """``lines`` (each ending in its newline) at ``path``, streamed, whole or not at all."""
    with replaced_when_done(path) as partial, partial.open("w", encoding="utf-8") as out:
        out.writelines(lines)
