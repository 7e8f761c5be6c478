"""The runs of a BLURB sweep, one at a time in this process or several side by side, each in a process
of its own on a GPU of its own (``parallel_runs``).

A BLURB sweep is hundreds of small, independent runs (480 for the paper's grid and seeds); one run
leaves most of a GPU node idle. With ``parallel_runs N`` the sweep keeps N runs going in N worker
processes, worker i seeing only GPU i (``CUDA_VISIBLE_DEVICES``, set before the worker touches CUDA;
an existing ``CUDA_VISIBLE_DEVICES`` is divided, not ignored). On a machine without a GPU the workers
share its cores (``torch`` threads = cores / N). A run's outcome is the same either way: its own
folder, ``run.json`` and resumption (:func:`finetune.trainer.run_finetune`); only the order in which
runs finish changes. As one at a time, a run that fails stops the runs of its dataset that have not
started yet. A worker dies with the sweep's process however that ends (``kill -9`` included:
:func:`biomed_lm.worker_lifetime.die_with`), so a re-run never meets a run still held by an orphan; a run
whose folder another live process holds is reported as not attempted, not as its dataset's failure.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from biomed_lm.backend import LostRank
from biomed_lm.errors import BiomedLMError, ConfigError
from biomed_lm.run_lock import RunDirectoryLocked

__all__ = ["RunOutcome", "SweepRunFailed", "WorkerLost", "device_slots", "outcomes", "visible_gpus"]


class SweepRunFailed(BiomedLMError):
    """A run of a sweep with ``stop_on_error`` failed in a worker process: its error's type and message (the
    traceback is in the run's error file)."""


class WorkerLost(RuntimeError):
    """A worker process died in the middle of a run (killed, out of memory): the pool cannot go on; the message
    says which run and what a re-run does."""


@dataclass
class RunOutcome:
    """What the sweep keeps of one run: its summary line's figures, or its error; and its warnings."""

    skipped: bool = False
    dev: float | None = None
    test: float | None = None
    seconds: float | None = None
    error: str | None = None  # "Type: message"
    in_use: bool = False  # another live process holds the run's folder: not attempted, not a failure
    details: str = ""  # the traceback, for the run's error file
    exception: BaseException | None = None  # one at a time: the error itself (stop_on_error raises it)
    warnings: list[str] = field(default_factory=list)


def visible_gpus() -> list[str] | None:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them (an existing value is divided,
    not ignored); None on a machine without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return [g.strip() for g in visible.split(",") if g.strip()] if visible else \
        [str(i) for i in range(torch.cuda.device_count())]


def device_slots(parallel_runs: int) -> list[str | None]:
    """What each of ``parallel_runs`` workers sees: one GPU each (its ``CUDA_VISIBLE_DEVICES`` value),
    or None each on a machine without CUDA. Refused when there are fewer GPUs than workers."""
    gpus = visible_gpus()
    if gpus is None:
        return [None] * parallel_runs
    if parallel_runs > len(gpus):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ConfigError(f"parallel_runs {parallel_runs} needs a GPU per run, and {len(gpus)} are visible "
                          f"({'CUDA_VISIBLE_DEVICES=' + visible if visible else 'torch.cuda.device_count()'})")
    return gpus[:parallel_runs]


def outcomes(runs: Sequence, run_one: Callable[..., Any], fingerprints: Mapping[str, Mapping[str, str]],
             failed: Mapping[str, str], parallel_runs: int,
             log_for: Callable[[Any], Callable[[str], None]]) -> Iterator[tuple[Any, RunOutcome]]:
    """``(run, outcome)`` for each planned run whose dataset has not failed (``failed``, which the caller
    fills as outcomes arrive), in plan order one at a time, or as they finish with ``parallel_runs`` > 1.
    ``run_one`` is :func:`finetune.trainer.run_finetune` (looked up by the caller, so tests can wrap it);
    ``log_for(run)`` is the run's log one at a time (its warnings as they come), while a worker's warnings
    come back in the outcome. Close the iterator (``contextlib.closing``) to stop the workers early."""
    if parallel_runs <= 1:
        for run in runs:
            if run.dataset not in failed:
                yield run, _attempt(run_one, run.args, fingerprints[run.args.data_dir], log_for(run))
        return
    yield from _side_by_side(runs, fingerprints, failed, parallel_runs)


def _attempt(run_one: Callable[..., Any], args, data_files: Mapping[str, str],
             log: Callable[[str], None] | None = None) -> RunOutcome:
    """One run in this process, its errors caught (but a lost rank, which is every later run's too); without
    ``log`` its warnings are kept in the outcome."""
    warnings: list[str] = []
    if log is None:
        log = lambda message: warnings.append(message) if message.startswith("warning: ") else None  # noqa: E731
    try:
        result = run_one(args, log=log, data_files=data_files)
    except LostRank:
        raise
    except Exception as err:  # noqa: BLE001 - recorded and reported; one dataset's failure is not the sweep's
        return RunOutcome(error=f"{type(err).__name__}: {err}", in_use=isinstance(err, RunDirectoryLocked),
                          details=traceback.format_exc(), exception=err, warnings=warnings)
    if result.skipped:
        return RunOutcome(skipped=True, warnings=warnings)
    record = result.record
    return RunOutcome(dev=record["best_dev_score"], test=record["test_score"], seconds=record["wall_time_s"],
                      warnings=warnings)


def _side_by_side(runs: Sequence, fingerprints: Mapping[str, Mapping[str, str]], failed: Mapping[str, str],
                  parallel_runs: int) -> Iterator[tuple[Any, RunOutcome]]:
    slots = device_slots(parallel_runs)
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: CUDA is set up after the pinning
    queue = context.Queue()
    for slot in slots:
        queue.put(slot)
    threads = max(1, (os.cpu_count() or 1) // parallel_runs)
    pool = concurrent.futures.ProcessPoolExecutor(parallel_runs, mp_context=context, initializer=_start_worker,
                                                  initargs=(queue, threads, os.getpid()))
    pending = iter(runs)
    running: dict[concurrent.futures.Future, Any] = {}
    try:
        while True:
            while len(running) < parallel_runs:
                run = next((r for r in pending if r.dataset not in failed), None)
                if run is None:
                    break
                running[pool.submit(_worker_run, run.args, fingerprints[run.args.data_dir])] = run
            if not running:
                break
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                run = running.pop(future)
                try:
                    outcome = future.result()
                except concurrent.futures.process.BrokenProcessPool:
                    raise WorkerLost(f"the worker running {run.dataset} {run.grid_point} seed {run.seed} died (killed, "
                                     "or out of memory?), and the sweep cannot go on without it. Finished runs are "
                                     "kept: the same command runs the others") from None
                yield run, outcome
    except KeyboardInterrupt:
        raise  # every worker had the interrupt too, and ends its run as one at a time does (its folder cleaned)
    except BaseException:  # the sweep stops on an error (stop_on_error): the runs under way end now, not hours later
        _end_workers(list((getattr(pool, "_processes", None) or {}).values()))
        raise
    finally:  # queued runs are dropped
        pool.shutdown(wait=not running, cancel_futures=True)


def _end_workers(processes: list, grace: float = 30.0) -> None:
    """Stop the workers' runs (SIGTERM: a run ends as one stopped by hand, its folder and lock released) and wait
    for them, then kill any left: the sweep exits once its workers are gone (CI: a worker still running when the
    stopped sweep had exited, under load)."""
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + grace
    for process in processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(timeout=5)


def _start_worker(slots, threads: int, sweep_pid: int) -> None:
    """A worker's one GPU (before anything in it initializes CUDA) and its share of the cores; it dies with the
    sweep's process (QA: after a kill -9 of the sweep, its workers trained on, then waited forever, holding
    their runs' folders and GPUs against the re-run)."""
    from biomed_lm.worker_lifetime import die_with

    die_with(sweep_pid)
    slot = slots.get()
    if slot is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = slot
    import torch

    torch.set_num_threads(threads)


def _worker_run(args, data_files: Mapping[str, str]) -> RunOutcome:
    from biomed_lm.finetune.trainer import run_finetune

    outcome = _attempt(run_finetune, args, data_files)
    outcome.exception = None  # its traceback is in details; an exception object may not pickle
    return outcome
