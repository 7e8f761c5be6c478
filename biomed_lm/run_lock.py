"""One output directory, one run: an advisory lock on ``<output_dir>/run.lock`` (``.run.lock`` for the
data stages' folders).

Two runs started on one ``--output-dir`` would interleave what they write: two pretraining runs each
other's checkpoints and ``metrics.jsonl``; two corpus, vocabulary or instance builds each other's work
files and results, one of them ending with a result that is not what it printed. The second one to
start must stop before it touches anything. Each stage that writes an output directory
(``prepare_corpus``, ``build_vocab``, ``create_pretraining_data``, ``pretrain``: rank 0, whose other
ranks learn the outcome from it) takes the lock before it reads or writes anything there and holds it
until it ends.

The lock is a POSIX record lock (``fcntl.lockf``), not ``flock``, for two reasons: the kernel drops it
when the holding process dies however it dies (``kill -9`` included), and it is not inherited by
forked children, so a DataLoader worker that outlives its parent for a few seconds never keeps the
directory locked against the resume. It also works across the nodes of an NFS filesystem (through
its lock manager). A filesystem without locking support is reported (a warning when a data stage enters the
lock as a context; pretraining logs it) and the run goes on unlocked.

The lock file of a directory that holds anything else is never deleted. A start that fails before
writing anything removes the folder it made, lock file included, so a refused run leaves nothing behind
(:meth:`RunLock.release`); deleting a lock file races with a process that opened it and is about to lock
it, so a start checks, once locked, that its descriptor is still the file at the path, and takes the
lock again if not. The lock file holds the holder's host, pid, start time and command line, which a
refused run prints. (A POSIX lock is also dropped when its process closes *any* descriptor of the file,
so the holder never opens it a second time: only a refused run reads it.)
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from biomed_lm.errors import BiomedLMError

LOCK_FILE = "run.lock"
#: The data stages' lock: hidden, so that a corpus, vocabulary or instance folder lists only what it holds
#: (input scanners and tokenizer loaders pass over dot files).
ARTIFACT_LOCK_FILE = ".run.lock"
_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class RunDirectoryError(BiomedLMError):
    """An output directory that cannot be used (not a directory, or no lock file can be made in it)."""


class RunDirectoryLocked(RunDirectoryError, RuntimeError):
    """Another live process holds the run directory; the message names it."""


@dataclass
class RunLock:
    """The held lock (``handle`` None where the filesystem cannot lock: ``note`` says so)."""

    path: Path
    handle: Any = None
    note: str = ""
    made: Path | None = None  # the topmost folder that taking the lock created (None: the folder was there)

    def release(self, failed: bool = False) -> None:
        """Drop the lock. With ``failed`` (the run stopped with an error), the folders taking the lock made are
        removed with the lock file when nothing else was written in them, while the lock is still held."""
        if self.handle is None:
            return
        if failed and self.made is not None:
            _remove_unused(Path(os.path.abspath(self.path)), self.made)
        self.handle.close()  # closing the descriptor drops a POSIX lock
        self.handle = None

    def __enter__(self) -> "RunLock":
        if self.note:  # the data stages hold the lock as a context: this is where their user learns it is not held
            logging.getLogger(__name__).warning(self.note)
        return self

    def __exit__(self, exc_type, *exc_info) -> None:
        self.release(failed=exc_type is not None)


def _remove_unused(lock_path: Path, made: Path) -> None:
    """Remove ``lock_path`` and its folders up to ``made`` if the lock file is all they hold (a folder that
    holds anything else stays, and so do the ones above it)."""
    if [entry.name for entry in lock_path.parent.iterdir()] != [lock_path.name]:
        return
    try:
        lock_path.unlink()
        for folder in (lock_path.parent, *lock_path.parent.parents):
            folder.rmdir()  # fails, and stops, on a folder another process has just written into
            if folder == made:
                break
    except OSError:
        pass


def acquire_run_lock(run_dir: str | os.PathLike, lock_file: str = LOCK_FILE) -> RunLock:
    """Take ``run_dir``'s lock (creating the directory), or raise :class:`RunDirectoryLocked`
    naming the holder. Nothing else in the directory is read or written."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirectoryError(f"output_dir {run_dir} exists and is not a directory")
    path = run_dir / lock_file
    made = _first_missing(Path(os.path.abspath(run_dir)))  # "new/../results" made nothing of "results"
    for _ in range(_ATTEMPTS):
        handle = _open_lock_file(run_dir, path)
        if handle is None:
            continue  # a failed start removed the folder between this one's mkdir and open
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            removed = not _is_the_file_at(handle, path)  # held by a failed start that is removing it: retry
            handle.close()
            if err.errno in (errno.EACCES, errno.EAGAIN) and removed:
                continue
            if err.errno in (errno.EACCES, errno.EAGAIN):
                raise RunDirectoryLocked(f"{run_dir} is in use by another run ({describe_holder(path)}): two runs "
                                         "must not share an output directory. Nothing was read or written; wait for "
                                         "that run to end, stop it, or use another --output-dir") from None
            if err.errno in _UNSUPPORTED:
                return RunLock(path, None, f"warning: {run_dir}'s filesystem does not support file locks "
                                           f"({err.strerror}): nothing stops a second run from using this directory "
                                           "at the same time")
            raise
        if _is_the_file_at(handle, path):
            _write_holder(handle)
            return RunLock(path, handle, made=made)
        handle.close()  # locked a file a failed start had just removed (RunLock.release): take the new one
    raise RunDirectoryError(f"output_dir {run_dir}: {path} was removed {_ATTEMPTS} times while this run took it; "
                            "another process keeps starting and failing there")


#: How often a start retries a lock file removed under it by a failed start (each retry takes microseconds).
_ATTEMPTS = 20


def _open_lock_file(run_dir: Path, path: Path):
    """The lock file opened for appending (created with its folders), or None when the folder vanished between
    the two (a failed start removing what it made)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        return open(path, "a+", encoding="utf-8")  # never truncates: the holder's record stays readable
    except FileNotFoundError as err:
        if not run_dir.is_dir():
            return None
        error = err  # the folder is there: a lasting cause (a dangling run.lock link), not a race
    except OSError as err:
        error = err
    raise RunDirectoryError(f"output_dir {run_dir}: cannot create {path}: {error.strerror}") from error


def _is_the_file_at(handle, path: Path) -> bool:
    """Whether the locked descriptor is still the file at ``path`` (a failed start may have removed it, and
    another start created a new one there, between this one's open and its lock)."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(handle.fileno())
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def _first_missing(folder: Path) -> Path | None:
    """The topmost of ``folder`` and its parents that does not exist yet (None when ``folder`` exists)."""
    missing = None
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return missing
        missing = candidate
    return missing


def _write_holder(handle) -> None:
    record = {"host": socket.gethostname(), "pid": os.getpid(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(sys.argv)}
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps(record) + "\n")
    handle.flush()


def describe_holder(path: Path) -> str:
    """'pid N on host H, started T: command' from the lock file, as far as it can be read."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return (f"pid {record['pid']} on host {record['host']}, started {record['started']}: "
                f"{record.get('command', '?')}")
    except (OSError, ValueError, KeyError, TypeError):
        return f"its holder did not say who it is in {path}"
