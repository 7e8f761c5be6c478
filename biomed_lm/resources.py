"""The files the toolkit ships: its configs (``configs/``) and the embedded sample data (``data/``).

In a checkout they are the repository's ``configs/`` and ``data/`` folders; in an installed wheel
they are package data (``biomed_lm/configs``, ``biomed_lm/data``). A path such as
``configs/pretrain/demo.yaml`` or ``data/sample/...`` in a config or on the command line means the
file relative to the working directory when it is there, and the shipped file otherwise, so the
same configs work from a checkout and from ``pip install biomed-lm`` anywhere.
"""

from __future__ import annotations

import fnmatch
import glob
from importlib.resources import files
from pathlib import Path

#: The first component of a shipped path → the package that holds those files.
SHIPPED_PACKAGES = {"configs": "biomed_lm.configs", "data": "biomed_lm.data"}
#: The files each shipped folder ships (setup.py's package_data, tests/test_packaging.py checks they agree): in a
#: checkout, anything else below data/ is the user's own (a corpus, an output folder), not the toolkit's.
SHIPPED_FILES = {"configs": ("*/*.yaml", "*/*.txt"), "data": ("README.md", "sample/*", "blurb/*/*")}


def shipped_dir(kind: str) -> Path:
    """The directory of the shipped ``configs`` or ``data``."""
    if kind not in SHIPPED_PACKAGES:
        raise KeyError(f"unknown shipped folder {kind!r}; valid: {', '.join(SHIPPED_PACKAGES)}")
    return Path(str(files(SHIPPED_PACKAGES[kind])))


def resolve_path(path: str | Path) -> Path:
    """``path`` as given when it exists (or is absolute, or is not a shipped path); else the
    shipped file of the same name. A path that exists nowhere comes back as given, so the caller's
    error names what the user wrote (and :func:`places_looked` where it was looked for)."""
    given = Path(path)
    if given.is_absolute() or given.exists():
        return given
    shipped = _shipped_counterpart(given)
    return shipped if shipped is not None and shipped.exists() else given


def resolve_pattern(pattern: str) -> str:
    """A glob pattern as given when it matches a file from the working directory; else the same pattern
    under the shipped folder (``data/sample/*.xml.gz``) when that matches; else as given. Only a relative
    ``configs/`` or ``data/`` pattern is looked at (a corpus's pattern is globbed once, by its reader)."""
    shipped = _shipped_counterpart(Path(pattern))
    if shipped is None or glob.glob(pattern, recursive=True):
        return pattern
    return str(shipped) if glob.glob(str(shipped), recursive=True) else pattern


def places_looked(path: str | Path) -> str:
    """Where :func:`resolve_path` looked for a shipped-looking path it did not find, to append to the
    error that names it: `` (looked in <cwd>/configs/x.yaml and in the shipped .../configs/x.yaml)``;
    empty for other paths."""
    shipped = _shipped_counterpart(Path(path))
    if shipped is None:
        return ""
    return f" (looked in {Path(path).absolute()} and in the toolkit's shipped {shipped})"


def shipped_name(path: str | Path) -> str | None:
    """``data/sample/x.txt`` for a file among the shipped ones (:data:`SHIPPED_FILES`), wherever the toolkit is
    installed (a checkout's ``data/``, a wheel's ``biomed_lm/data``); None for any other file, a user's corpus
    in a checkout's ``data/`` included."""
    resolved = Path(path).resolve()
    for kind in SHIPPED_PACKAGES:
        root = shipped_dir(kind).resolve()
        if resolved.is_relative_to(root) and _shipped_file(kind, resolved.relative_to(root)):
            return (Path(kind) / resolved.relative_to(root)).as_posix()
    return None


def _shipped_file(kind: str, relative: Path) -> bool:
    """Whether ``relative`` (below the shipped folder ``kind``) matches one of its package-data globs part for
    part (a ``*`` never spans folders, as in setup.py's package_data)."""
    return any(len(relative.parts) == len(Path(pattern).parts)
               and all(fnmatch.fnmatchcase(part, glob_part) for part, glob_part in zip(relative.parts,
                                                                                    Path(pattern).parts))
               for pattern in SHIPPED_FILES[kind])


def _shipped_counterpart(given: Path) -> Path | None:
    """The shipped file a relative ``configs/...`` or ``data/...`` path would name; None for other paths."""
    if given.is_absolute():
        return None
    head, *rest = given.parts or ("",)
    if head not in SHIPPED_PACKAGES or not rest:
        return None
    return shipped_dir(head).joinpath(*rest)


def entry_script(name: str) -> Path:
    """The file of an entry script of ``launch/`` (``pretrain.py``), in a checkout or an installed wheel.

    Found from the import system's record of the ``biomed_lm.launch`` package, without running it:
    the layers below launch start its scripts as subprocesses (the ablation runner) but never import
    it (``tests/test_architecture.py``)."""
    from importlib.util import find_spec

    spec = find_spec("biomed_lm.launch")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the biomed_lm.launch package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / name


def read_json_object(path: str | Path, error: type[Exception], what: str = "JSON object") -> dict:
    """The JSON object in ``path``; ``error`` (the caller's stage error) naming the file when it
    cannot be read, is not JSON, or holds something other than an object."""
    import json

    path = Path(path)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise error(f"{path}: not a readable {what} ({err})") from None
    if not isinstance(value, dict):
        raise error(f"{path}: not a {what} (a JSON {type(value).__name__}, not an object)")
    return value
