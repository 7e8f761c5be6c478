"""tests/forked_main.py, which the end-to-end tests run entry scripts through: a forked child reports
what a new process would (exit status, signal, output) and changes nothing in the test process."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import forked_main

pytestmark = pytest.mark.skipif(not forked_main.can_fork(), reason="no fork here")


def _report(code: int, text: str) -> int:
    print(f"out {text}")
    print(f"err {os.environ.get('FORKED_MAIN_PROBE')} {os.getcwd()}", file=sys.stderr)
    logging.getLogger("probe").warning("a warning")  # a fresh interpreter's last-resort handler: stderr
    os.environ["LEAKED"] = "1"
    return code


def test_exit_status_output_and_environment_are_the_childs_own(monkeypatch):
    monkeypatch.delenv("LEAKED", raising=False)
    done = forked_main.run(_report, (3, "hello"), ["probe"], {"FORKED_MAIN_PROBE": "set"}, timeout=60)
    assert done.returncode == 3 and done.stdout == "out hello\n"
    assert done.stderr.startswith(f"err set {forked_main.REPO}\n") and "a warning" in done.stderr
    assert "LEAKED" not in os.environ and os.getcwd() != "" and done.args == ["probe"]


def _environment() -> int:
    print(os.environ.get("FORKED_MAIN_PROBE"), os.environ.get("OMP_NUM_THREADS"))
    return 0


def test_os_environ_itself_is_the_childs_environment(monkeypatch):
    """The entry scripts' tests pass ``os.environ``: the child starts with all of it (emptying the
    child's environment before copying that same mapping in once left it empty, torch on every core)."""
    monkeypatch.setenv("FORKED_MAIN_PROBE", "kept")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    done = forked_main.run(_environment, (), ["probe"], os.environ, timeout=60)
    assert done.returncode == 0 and done.stdout == "kept 1\n", done.stderr


def _hang_with_a_child(pid_file: str) -> int:
    grandchild = os.fork()
    if grandchild == 0:  # in the child's group, as a DataLoader worker is
        time.sleep(600)
        os._exit(0)
    Path(pid_file).write_text(f"{os.getpgid(0) == os.getpid()} {grandchild}")
    time.sleep(600)
    return 0


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_new_session_is_its_own_group_and_a_timeout_kills_all_of_it(tmp_path):
    pid_file = tmp_path / "pids"
    with pytest.raises(subprocess.TimeoutExpired):
        forked_main.run(_hang_with_a_child, (str(pid_file),), ["probe"], dict(os.environ), timeout=3, new_session=True)
    leads_its_group, grandchild = pid_file.read_text().split()
    assert leads_its_group == "True"
    deadline = time.monotonic() + 10
    while _alive(int(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.05)
    survived = _alive(int(grandchild))
    if survived:
        os.kill(int(grandchild), signal.SIGKILL)
    assert not survived, "the timeout left the child's child running"


def _die(how: str) -> int:
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "exit":
        sys.exit(2)
    raise RuntimeError("boom")


@pytest.mark.parametrize("how, code, says", [("kill", -signal.SIGKILL, ""), ("exit", 2, ""),
                                             ("raise", 1, "RuntimeError: boom")])
def test_a_killed_exiting_or_raising_child_reports_as_a_process_does(how, code, says):
    done = forked_main.run(_die, (how,), ["probe"], dict(os.environ), timeout=60)
    assert done.returncode == code and says in done.stderr


def _sleep() -> int:
    import time

    time.sleep(60)
    return 0


def test_a_child_past_its_timeout_is_killed():
    with pytest.raises(subprocess.TimeoutExpired):
        forked_main.run(_sleep, (), ["probe"], dict(os.environ), timeout=0.5)


def test_a_script_runs_as_main_with_its_arguments(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint(__name__, sys.argv[1:])\nsys.exit(int(sys.argv[1]))\n")
    done = forked_main.run_script([sys.executable, str(script), "4", "x"], dict(os.environ), timeout=60)
    assert done.returncode == 4 and done.stdout == "__main__ ['4', 'x']\n"
