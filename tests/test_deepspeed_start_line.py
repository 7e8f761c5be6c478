"""The line a stage prints before DeepSpeed JIT-builds its CPU op (QA, 2026-11-28: a recipe's first
pretraining step showed nothing for about a minute): printed by rank 0 when the build is ahead, not when
this install's build is already in torch's extension folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from biomed_lm import backend
from biomed_lm.backend import SHM_COMM_OP

LINE = "pretrain: starting DeepSpeed (the first launch with this install builds its CPU op deepspeed_shm_comm in "


@pytest.fixture
def cpu_jit(monkeypatch, tmp_path) -> Path:
    """A CPU machine whose DeepSpeed JIT-builds the op into an empty extension folder; that folder."""
    from deepspeed.git_version_info import installed_ops

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(installed_ops, SHM_COMM_OP, False)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.delenv("RANK", raising=False)
    return tmp_path


def write_build(root: Path, sources: Path, torch_dir: Path) -> None:
    """What torch leaves in the op's folder after a build: its build.ninja (naming the install) and the .so."""
    folder = root / SHM_COMM_OP
    folder.mkdir()
    (folder / "build.ninja").write_text(f"cflags = -isystem {torch_dir / 'include'}\n"
                                        f"build shm.o: compile {sources / 'cpu' / 'comm' / 'shm.cpp'}\n",
                                        encoding="utf-8")
    (folder / f"{SHM_COMM_OP}.so").write_bytes(b"")
    (folder / ".ninja_log").write_text("# ninja log v7\n", encoding="utf-8")


def this_install() -> tuple[Path, Path]:
    import deepspeed

    return Path(deepspeed.__file__).parent / "ops" / "csrc", Path(torch.__file__).parent


def test_a_build_ahead_is_announced_once_by_rank_0(cpu_jit, capsys):
    backend.announce_op_build("pretrain")
    assert capsys.readouterr().err == f"{LINE}{cpu_jit / SHM_COMM_OP}: about a minute)\n"


def test_other_ranks_say_nothing(cpu_jit, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    backend.announce_op_build("pretrain")
    assert capsys.readouterr().err == ""


def test_this_installs_build_is_not_announced_another_installs_is(cpu_jit, capsys):
    write_build(cpu_jit, *this_install())
    backend.announce_op_build("pretrain")
    assert capsys.readouterr().err == ""
    (cpu_jit / SHM_COMM_OP / "build.ninja").write_text("build shm.o: compile /other/venv/deepspeed/ops/csrc/x.cpp\n",
                                                       encoding="utf-8")
    backend.announce_op_build("pretrain")  # ninja rebuilds for this install: announced
    assert capsys.readouterr().err.startswith(LINE)


def test_a_gpu_or_a_prebuilt_op_is_not_announced(cpu_jit, capsys, monkeypatch):
    from deepspeed.git_version_info import installed_ops

    monkeypatch.setitem(installed_ops, SHM_COMM_OP, True)
    backend.announce_op_build("pretrain")
    monkeypatch.setitem(installed_ops, SHM_COMM_OP, False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    backend.announce_op_build("pretrain")
    assert capsys.readouterr().err == ""


def test_the_line_comes_before_deepspeed_starts(cpu_jit, capsys, monkeypatch):
    import deepspeed

    seen = []

    def init_distributed(**_kwargs):
        seen.append(capsys.readouterr().err)
        raise RuntimeError("stop here")

    monkeypatch.setattr(deepspeed, "init_distributed", init_distributed)
    monkeypatch.setattr(backend, "ensure_distributed_env", lambda: None)
    with pytest.raises(RuntimeError, match="stop here"):
        backend.start_distributed(program="finetune")
    assert len(seen) == 1 and seen[0].startswith(LINE.replace("pretrain:", "finetune:"))


def test_a_build_left_without_its_ninja_log_is_announced(cpu_jit, capsys):
    """QA: after an interrupted build the folder kept build.ninja and the .so but no .ninja_log, and ninja
    rebuilt for a minute ("build log version is too old; starting over") without the line."""
    write_build(cpu_jit, *this_install())
    (cpu_jit / SHM_COMM_OP / ".ninja_log").unlink()
    backend.announce_op_build("pretrain")
    assert capsys.readouterr().err.startswith(LINE)


def test_ctrl_c_during_the_op_build_is_an_interrupt_not_a_build_error(cpu_jit, monkeypatch):
    """QA: Ctrl-C a minute into a two-rank CPU run stopped ninja (exit 130) and each rank printed torch's
    "Error building extension ... interrupted by user" traceback. It is now a KeyboardInterrupt, which the
    entry scripts end with their one line and exit 130; another build error stays what it is."""
    import subprocess

    import deepspeed

    from biomed_lm.errors import caused_by_interrupt

    def failed_build(returncode: int, text: str):
        def init_distributed(**_kwargs):
            try:
                raise subprocess.CalledProcessError(returncode, ["ninja", "-v"])
            except subprocess.CalledProcessError as err:
                raise RuntimeError(f"Error building extension 'deepspeed_shm_comm': {text}") from err
        return init_distributed

    monkeypatch.setattr(backend, "ensure_distributed_env", lambda: None)
    monkeypatch.setattr(deepspeed, "init_distributed", failed_build(130, "ninja: build stopped: interrupted by user."))
    with pytest.raises(KeyboardInterrupt) as interrupted:
        backend.start_distributed(program="pretrain")
    assert caused_by_interrupt(interrupted.value)
    monkeypatch.setattr(deepspeed, "init_distributed", failed_build(1, "shm.cpp:12: error: expected ';'"))
    with pytest.raises(RuntimeError, match="expected ';'"):
        backend.start_distributed(program="pretrain")


def test_each_install_builds_in_a_folder_of_its_own(monkeypatch):
    """Two virtualenvs on one host rebuilt the op in turn in torch's one folder, about a minute a launch (QA)."""
    import importlib.util

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    backend.use_extensions_dir_of_this_install()
    ours = Path(os.environ["TORCH_EXTENSIONS_DIR"])
    assert ours == backend.extensions_dir_of_this_install() and ours.name.startswith("install-")
    assert ours.parent == backend._torch_default_extensions_dir()
    real = importlib.util.find_spec

    def another_install(name, *args):
        spec = real(name, *args)
        return importlib.util.spec_from_file_location(name, "/other/venv/deepspeed/__init__.py") \
            if name == "deepspeed" else spec

    monkeypatch.setattr(importlib.util, "find_spec", another_install)
    assert backend.extensions_dir_of_this_install() != ours
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/mine")  # the user's choice stands
    backend.use_extensions_dir_of_this_install()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == "/mine"
