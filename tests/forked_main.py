"""Run an entry script's ``main`` in a child process forked from the test process.

Most of an end-to-end test's time here is a fresh interpreter importing torch, transformers,
DeepSpeed and datasets (10-15 s on 2 CPU cores) before a 20-step run of 3 s. A child forked from a
test process that has imported them already starts at once, and is still a process of its own:
its exit status (a negative signal number when killed, as ``subprocess`` reports it), its
stdout/stderr, its environment, working directory, signal handlers, resource limits and
monkeypatched modules are its own, and nothing it does reaches the test process.

The child is made to look like a fresh interpreter where the test process differs from one:
default signal handlers, no pytest log handlers or warning filters, no faulthandler, the given
environment, torch's thread count from it, and no compiled-graph caches. A child can lead a process
group of its own (``new_session``), and be left running as a ``subprocess.Popen``-like handle
(:class:`ForkedProcess`) for a test to signal. Tests that need a new interpreter (the reference
runs, the ``deepspeed`` launcher's) start one themselves.
"""

from __future__ import annotations

import faulthandler
import functools
import importlib
import logging
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

REPO = Path(__file__).resolve().parents[1]
# What an entry script's child imports on its way (modeling classes, DeepSpeed's engine, dynamo):
# imported once here before the first fork instead of in every child (a forked 20-step pretraining
# run took 8.2 s with them left to the child, 3.8 s with them imported here, on 2 cores).
CHILDREN_IMPORT = ("deepspeed", "deepspeed.runtime.engine", "torch._dynamo", "transformers.models.bert.modeling_bert",
                   "transformers.models.albert.modeling_albert", "transformers.models.roberta.modeling_roberta")
STEP_TIMEOUT = 900  # seconds for one forked ablation step (a tiny run's take 2-30 s)
# The interpreter's own warning filters, before pytest adds its per-test ones.
_FRESH_WARNING_FILTERS = list(warnings.filters)


def can_fork() -> bool:
    """Whether a child forked now starts clean (:func:`fork_refusal`)."""
    reason = fork_refusal()
    if reason and os.environ.get("BIOMED_LM_TEST_FORK_LOG"):  # which runs started a new interpreter, and why
        with open(os.environ["BIOMED_LM_TEST_FORK_LOG"], "a", encoding="utf-8") as log:
            log.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '?')}: {reason}\n")
    return reason is None


def fork_refusal() -> str | None:
    """Why a child forked now would not start clean, or None: fork is absent, or this process
    started threads the child would wait on without having them (a fork copies only the thread
    that calls it): torch's OpenMP team (more than one intra-op thread: libgomp does not rebuild its
    team in a child), a process group's (whose sockets the child would share too), or SentencePiece's trainer
    pool (a forked child that trains again crashes). Inductor's
    compile workers are dropped in the child instead (:func:`_as_fresh_process`)."""
    if not hasattr(os, "fork"):
        return "no fork"
    if os.environ.get("BIOMED_LM_TEST_NO_FORK"):
        return "BIOMED_LM_TEST_NO_FORK is set"
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() > 1:
        return f"torch runs {torch.get_num_threads()} intra-op threads"
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return "this process is in a process group"
    if getattr(sys.modules.get("sentencepiece"), "trained_in_this_process", False):  # tests/conftest.py
        return "SentencePiece trained in this process (its thread pool crashes a forked child that trains)"
    return None


def run(target: Callable[..., int], args: Sequence[Any], command: list[str], environment: Mapping[str, str],
        timeout: float | None, capture: bool = True, cwd: str | Path = REPO,
        new_session: bool = False) -> subprocess.CompletedProcess:
    """``target(*args)``'s exit status, and its stdout and stderr (``capture``; else they are this
    process's), run in a forked child as ``command`` would run as a new process (``command`` is
    only what the result reports). With ``new_session`` the child leads a process group of its own
    (``start_new_session=True``: its pid is the group's id), and a timeout kills the whole group."""
    process = ForkedProcess(target, args, command, environment, capture, cwd, new_session)
    try:
        stdout, stderr = process.communicate(timeout)
    except subprocess.TimeoutExpired:
        _kill(process.pid, new_session)
        process.communicate()
        raise subprocess.TimeoutExpired(command, timeout) from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


class ForkedProcess:
    """``target(*args)`` started in a forked child (as :func:`run` runs it), seen as
    ``subprocess.Popen`` shows a process: ``pid``, ``returncode``, ``poll``, ``wait``,
    ``send_signal``, ``kill`` and ``communicate`` (its captured stdout and stderr)."""

    def __init__(self, target: Callable[..., int], args: Sequence[Any], command: list[str],
                 environment: Mapping[str, str], capture: bool = True, cwd: str | Path = REPO,
                 new_session: bool = False) -> None:
        self.args, self.returncode = command, None
        _import_what_children_import()
        self._folder = tempfile.TemporaryDirectory(prefix="forked_main-")
        folder = Path(self._folder.name)
        self._out, self._err = (folder / "stdout", folder / "stderr") if capture else (None, None)
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            _child(target, args, environment, cwd, self._out, self._err, new_session)  # never returns

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; past ``timeout`` seconds ``subprocess.TimeoutExpired``, the child left running."""
        if timeout is None:
            if self.returncode is None:
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            return self.returncode
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        self.wait(timeout)
        outputs = tuple(path.read_text(errors="replace") if path else None for path in (self._out, self._err))
        self._folder.cleanup()
        return outputs


def run_script(command: list[str], environment: Mapping[str, str], timeout: float | None = None,
               capture: bool = True, cwd: str | Path = REPO) -> subprocess.CompletedProcess:
    """``command`` (``[python, script.py, *args]``) forked from this process: the script run as
    ``__main__`` with its arguments, as ``python script.py ...`` runs it."""
    return run(_script_main, (command[1], command[2:]), command, environment, timeout, capture, cwd)


def run_command(command: list[str], env: Mapping[str, str] | None = None, cwd: str | Path = REPO,
                timeout: float | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True, ...)``, forked from this process
    where ``command`` runs a Python script (:func:`forkable_script`), a new process otherwise."""
    environment = dict(os.environ if env is None else env)
    if forkable_script(command):
        return run_script(command, environment, timeout, cwd=cwd)
    return subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout)


def start_command(command: list[str], env: Mapping[str, str], new_session: bool = False
                  ) -> "ForkedProcess | subprocess.Popen":
    """``command`` started and left running, as ``subprocess.Popen(command, stdout=DEVNULL,
    stderr=PIPE, text=True, start_new_session=new_session)`` starts it: a forked child
    (:class:`ForkedProcess`) where ``command`` runs a Python script, a new process otherwise.
    ``communicate()`` gives its stderr second."""
    if forkable_script(command):
        return ForkedProcess(_script_main, (command[1], command[2:]), command, env, new_session=new_session)
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=new_session)


def forkable_script(command: Sequence[str]) -> bool:
    """Whether ``command`` runs a Python script with this interpreter (what :func:`run_script` takes)."""
    return len(command) >= 2 and command[0] == sys.executable and command[1].endswith(".py") and can_fork()


def fork_ablation_steps(patch: Callable[[Any, str, Any], Any]) -> None:
    """Make the ablation runner (:mod:`experiments.ablation`) fork the entry scripts it runs as
    steps (``patch``: ``setattr`` or ``monkeypatch.setattr``); other commands (``deepspeed ...``)
    still start a new process."""
    from biomed_lm.experiments import ablation

    execute = ablation._execute

    def fork_or_execute(command: list[str], env: Mapping[str, str]) -> int:
        if forkable_script(command):  # a step that hangs fails the test instead of the suite
            return run_script(command, env, timeout=STEP_TIMEOUT, capture=False).returncode
        return execute(command, env)

    patch(ablation, "_execute", fork_or_execute)


def run_script_forking_steps(command: list[str], environment: Mapping[str, str],
                             timeout: float | None = None) -> subprocess.CompletedProcess:
    """:func:`run_script` for a script that runs an ablation (launch/ablate.py, launch/recipe.py),
    whose steps are forked from it in turn."""
    def forking(script: str, args: list[str]) -> int:
        fork_ablation_steps(setattr)
        return _script_main(script, args)

    return run(forking, (command[1], command[2:]), command, environment, timeout)


def _script_main(script: str, args: list[str]) -> int:
    sys.argv = [script, *args]
    sys.path[0:0] = [str(Path(script).resolve().parent)]  # as the interpreter puts the script's folder first
    runpy.run_path(script, run_name="__main__")
    return 0


@functools.cache
def _import_what_children_import() -> None:
    if "torch" not in sys.modules:  # a test of plain Python: its children need none of it
        return
    for name in CHILDREN_IMPORT:
        try:
            importlib.import_module(name)
        except ImportError:  # not installed here: the child fails or skips as a new process would
            pass


def _kill(pid: int, group: bool) -> None:
    try:
        if group:
            os.killpg(pid, signal.SIGKILL)  # the child and what it started (DataLoader workers)
            return
    except ProcessLookupError:  # not yet its own group's leader
        pass
    os.kill(pid, signal.SIGKILL)


def _child(target: Callable[..., int], args: Sequence[Any], environment: Mapping[str, str], cwd: str | Path,
           out: Path | None, err: Path | None, new_session: bool) -> None:
    code = 1
    try:
        if new_session:
            os.setsid()
        _as_fresh_process(environment, cwd, out, err)
        result = target(*args)
        code = result if isinstance(result, int) else 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, (int, type(None))):
            print(exit_.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - what an uncaught exception does to a fresh interpreter
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)  # no atexit handlers or finalizers of the test process (pytest's, execnet's)


def _as_fresh_process(environment: Mapping[str, str], cwd: str | Path, out: Path | None, err: Path | None) -> None:
    for fd, path in ((1, out), (2, err)):
        if path is not None:
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    environment = dict(environment)  # a copy first: ``environment`` may be os.environ itself
    os.environ.clear()
    os.environ.update(environment)
    if "tokenizers" in sys.modules:  # its Rust thread pool, if this process used it, is not the child's
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.chdir(cwd)
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGALRM):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    faulthandler.disable()
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    warnings.filters[:] = _FRESH_WARNING_FILTERS
    if "torch" in sys.modules:
        import torch

        torch.set_num_threads(int(environment.get("OMP_NUM_THREADS") or os.cpu_count() or 1))
        if "torch._dynamo" in sys.modules:
            torch._dynamo.reset()
    _forget_compile_workers()


def _forget_compile_workers() -> None:
    """Inductor's compile thread pool and worker processes are the test process's: the child
    starts its own when it compiles (shutting them down here would stop the parent's)."""
    async_compile = sys.modules.get("torch._inductor.async_compile")
    if async_compile is None:
        return
    async_compile._pool_set.clear()
    async_compile.AsyncCompile.pool.cache_clear()
    async_compile.AsyncCompile.process_pool.cache_clear()
    async_compile.AsyncCompile._ready_future = None
