"""One root for the errors a user fixes by changing an input, a config or a flag.

Every entry script catches :class:`BiomedLMError` (and ``FileNotFoundError`` for a path that is
not there) and exits with status 2 and the message, which names the file, line or field at fault.
Callers catch the root or one stage's class, never a list of unrelated ones. Errors that are not
the user's to fix (a bug, a diverged run: ``pretrain.trainer.DivergenceAbort``, exit 3) stay
outside this tree.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable, Iterator

#: The exit status of every entry script for unusable options or inputs (nothing was done).
EXIT_BAD_INPUT = 2
#: The exit status of a stage stopped part-way by the filesystem (a full disk, a folder that turned read-only).
EXIT_IO_FAILURE = 1
#: The exit status of a stage stopped by Ctrl-C (SIGINT), 128 + 2, as a shell reports a process SIGINT ended.
EXIT_INTERRUPTED = 130


class BiomedLMError(Exception):
    """The root: an input, config or flag that cannot be used; the message says where and why."""


class ConfigError(BiomedLMError, ValueError):
    """A configuration file or value that cannot be used; the message names the file and key."""


class InputError(BiomedLMError, ValueError):
    """A data file (corpus, dataset, vocabulary, run directory) that cannot be read or used."""


class TokenizationError(BiomedLMError):
    """Corpus ingestion, vocabulary building or coverage reports cannot go on."""


class PretrainError(BiomedLMError):
    """Pretraining inputs, options or checkpoints that cannot work; raised before training starts."""


class FinetuneError(BiomedLMError):
    """Fine-tuning inputs or options that cannot work."""


class ExperimentError(BiomedLMError):
    """An ablation, its report or a calibration study that cannot go on."""


def bad_input(program: str, err: BaseException) -> int:
    """Print ``err`` as ``program: error: ...`` on stderr and return :data:`EXIT_BAD_INPUT`."""
    print(f"{program}: error: {err}", file=sys.stderr)
    return EXIT_BAD_INPUT


def io_failure(program: str, err: OSError, output: object = None) -> int:
    """Print an ``OSError`` that stopped a stage part-way as one line, ``program: error: <the OS's reason>:
    <the file it names>`` (where it names none, as a full disk often does not: the stage's ``output``),
    and return :data:`EXIT_IO_FAILURE`. What was written stays: the same command resumes where the
    stage can."""
    reason = err.strerror or str(err) or type(err).__name__
    where = err.filename or (f"while writing under {output}" if output else "")
    print(f"{program}: error: {reason}{': ' + str(where) if where else ''}", file=sys.stderr)
    return EXIT_IO_FAILURE


def exits_cleanly_on_interrupt(program: str, kept: str = "the same command starts it again"
                               ) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Wrap an entry script's ``main``: Ctrl-C ends it with one line, ``program: interrupted (Ctrl-C): <kept>``
    (what was kept and how to go on), and :data:`EXIT_INTERRUPTED`, instead of a traceback."""
    def wrap(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def run(*args, **kwargs) -> int:
            try:
                return main(*args, **kwargs)
            except BaseException as err:  # noqa: BLE001 - re-raised unless Ctrl-C is behind it
                if not caused_by_interrupt(err):
                    raise
                _end_progress_bars()
                print(f"{program}: interrupted (Ctrl-C): {kept}", file=sys.stderr)
                return EXIT_INTERRUPTED
        return run
    return wrap


def _end_progress_bars() -> None:
    """Close the tqdm bars the interrupt left open, so the line that follows starts a line of its own (QA:
    ``...2.10step/s, epoch=1, loss=0.027]finetune: interrupted (Ctrl-C): ...``). tqdm is not imported here:
    a script that showed no bar has none to close."""
    tqdm_module = sys.modules.get("tqdm.std")
    for bar in list(getattr(getattr(tqdm_module, "tqdm", None), "_instances", ())):
        bar.close()


def exception_chain(err: BaseException | None) -> Iterator[BaseException]:
    """``err`` and the exceptions it was raised while handling (or from), each once."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        yield err
        seen.add(id(err))
        err = err.__context__ or err.__cause__


def caused_by_interrupt(err: BaseException | None) -> bool:
    """Whether ``err`` is a ``KeyboardInterrupt`` or was raised while one was being handled. A process
    pool's clean-up replaces the interrupt with its own error (``datasets``' ``map(num_proc=...)`` raises
    ``multiprocess``'s ``TimeoutError`` from its ``finally``), so the chain of contexts is searched."""
    return any(isinstance(e, KeyboardInterrupt) for e in exception_chain(err))
