"""``biomed-lm <command>``: the dispatcher is in the top layer (biomed_lm.launch.cli), setup.py's
console script points at it, and every command it lists is an entry script of launch/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from biomed_lm.launch.cli import COMMANDS, as_console_commands, main
from biomed_lm.resources import entry_script

REPO = Path(__file__).resolve().parents[1]


def test_the_console_script_is_the_launch_dispatcher():
    found = re.findall(r'"biomed-lm=([\w.]+):(\w+)"', (REPO / "setup.py").read_text(encoding="utf-8"))
    assert found == [("biomed_lm.launch.cli", "main")]


def test_every_command_is_an_entry_script():
    missing = [f"{command}: launch/{module}.py" for command, (module, _) in COMMANDS.items()
               if not entry_script(f"{module}.py").is_file()]
    assert not missing, missing


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert [c for c in COMMANDS if f"  {c} " not in out] == []


@pytest.mark.parametrize("argv", [[], ["no-such-command"]])
def test_no_or_an_unknown_command_exits_2_with_the_usage_on_stderr(argv, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "usage: biomed-lm <command>" in captured.err and captured.out == ""


def test_a_mistyped_command_gets_the_nearest_one(capsys):
    assert main(["fintune"]) == 2
    assert "biomed-lm: unknown command 'fintune'; did you mean 'finetune'?" in capsys.readouterr().err


def test_a_command_runs_its_entry_script(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["vocab-report", "--help"])
    assert exit_.value.code == 0
    assert "biomed-lm vocab-report" in capsys.readouterr().out


def test_a_commands_help_shows_the_console_forms_of_its_examples(capsys):
    """QA: an installed user's `biomed-lm pretrain --help` showed `python launch/pretrain.py ...`, and they have no
    launch/ folder."""
    from biomed_lm.launch import pretrain

    original = pretrain.__doc__
    try:
        with pytest.raises(SystemExit):
            main(["pretrain", "--help"])
    finally:
        pretrain.__doc__ = original
    out = capsys.readouterr().out
    assert "launch/pretrain.py" not in out
    assert "deepspeed --num_gpus 2 --module biomed_lm.launch.pretrain --config configs/pretrain/demo.yaml" in out
    assert "torchrun --nproc_per_node 2 -m biomed_lm.launch.pretrain --config" in out
    assert "    biomed-lm pretrain --config configs/pretrain/demo.yaml" in out
    assert as_console_commands("python launch/report.py --x; .venv/bin/python launch/nothing.py") == \
        "biomed-lm report --x; .venv/bin/python launch/nothing.py"  # a script that is no command stays as written
