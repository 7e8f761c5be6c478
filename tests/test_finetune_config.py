"""Fine-tuning's options in the shared configuration dialect: choice sets are Literals that
``biomed_lm.config`` checks and ``--help`` lists (launch/finetune.py and launch/blurb.py alike), and
the sweep's run options are the run's own fields, passed to every run it plans."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import typing
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from biomed_lm.errors import ConfigError  # noqa: E402
from biomed_lm.finetune.sweep import SweepArgs, plan_sweep  # noqa: E402
from biomed_lm.finetune.trainer import FinetuneArgs, RunOptions  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# The script of each dataclass, and the flags it needs besides the one under test.
SCRIPTS = {"finetune": (FinetuneArgs, ["--model", "m", "--dataset", "gad", "--data_dir", "d", "--output_dir", "o"]),
           "blurb": (SweepArgs, ["--model", "m", "--output_dir", "o"])}


def _launch_module(script: str):
    """``launch/<script>.py`` loaded in this process (launch/ is a folder of scripts, not a package)."""
    name = f"launch_{script}_finetune_config"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "launch" / f"{script}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _choice_fields(dataclass_type: type) -> dict[str, tuple]:
    """Field name -> its choices, for every field annotated with a Literal (or an optional one)."""
    choices = {}
    for name, hint in typing.get_type_hints(dataclass_type).items():
        literal = next((arg for arg in (hint, *typing.get_args(hint)) if typing.get_origin(arg) is typing.Literal),
                       None)
        if literal is not None:
            choices[name] = typing.get_args(literal)
    return choices


def test_every_choice_set_of_a_run_is_a_literal():
    assert set(_choice_fields(FinetuneArgs)) == {
        "task_type", "tagging_scheme", "tagging_layer", "ner_f1_mode", "relation_transformation",
        "relation_representation", "precision", "zero_stage"}
    assert _choice_fields(SweepArgs) == {name: choices for name, choices in _choice_fields(FinetuneArgs).items()
                                         if name != "task_type"}  # a sweep runs BLURB's datasets, not generic ones


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_help_lists_every_choice_set(script, capsys):
    dataclass_type, _ = SCRIPTS[script]
    with pytest.raises(SystemExit) as exit_:
        _launch_module(script).main(["--help"])
    assert exit_.value.code == 0
    shown = capsys.readouterr().out
    for name, choices in _choice_fields(dataclass_type).items():
        assert f"--{name} {{{','.join(map(str, choices))}}}" in shown, name


@pytest.mark.parametrize("script, name", [(script, name) for script, (dc, _) in sorted(SCRIPTS.items())
                                          for name in sorted(_choice_fields(dc))])
def test_a_bad_choice_as_a_flag_exits_2_naming_the_flag_and_its_choices(script, name, capsys):
    dataclass_type, needed = SCRIPTS[script]
    with pytest.raises(SystemExit) as exit_:
        _launch_module(script).main([*needed, f"--{name}", "bogus"])
    assert exit_.value.code == 2
    choices = ", ".join(f"'{choice}'" if isinstance(choice, str) else str(choice)
                        for choice in _choice_fields(dataclass_type)[name])
    flags = f"--{name}" + (f"/--{name.replace('_', '-')}" if "_" in name else "")  # the dashed spelling too
    assert f"argument {flags}: invalid choice: 'bogus' (choose from {choices})" in capsys.readouterr().err


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_a_bad_choice_in_the_config_file_exits_2_naming_file_field_and_choices(script, tmp_path, capsys):
    config = tmp_path / "x.yaml"
    config.write_text("tagging_layer: lstm\n", encoding="utf-8")
    assert _launch_module(script).main(["--config", str(config), *SCRIPTS[script][1]]) == 2
    assert f"{script}: error: {config}: tagging_layer: 'lstm' is not one of linear, bilstm, crf" \
        in capsys.readouterr().err


def test_arguments_built_in_code_are_checked_the_same_way():
    with pytest.raises(ConfigError, match=r"^relation_representation: 'pooled' is not one of cls, "
                                          r"mention_max_pool, entity_start$"):
        FinetuneArgs(model="m", dataset="gad", data_dir="d", output_dir="o", relation_representation="pooled")
    with pytest.raises(ConfigError, match=r"^learning_rates: -1\.0 \(in \[3e-05, -1\.0\]\) is out of range: "
                                          r"must be > 0$"):
        SweepArgs(model="m", output_dir="o", learning_rates=[3e-5, -1.0])
    with pytest.raises(ConfigError, match="^precision fp16 needs --deepspeed"):  # a rule between two fields
        SweepArgs(model="m", output_dir="o", precision="fp16")


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_old_tagging_scheme_names_still_work_and_the_scheme_is_recorded(script, tmp_path):
    from biomed_lm.config import parse_config

    dataclass_type, needed = SCRIPTS[script]
    (flagged,) = parse_config([dataclass_type], [*needed, "--tagging_scheme", "iob2"])
    config = tmp_path / "x.yaml"
    config.write_text("tagging_scheme: bilou\n", encoding="utf-8")
    (from_file,) = parse_config([dataclass_type], ["--config", str(config), *needed])
    assert (flagged.tagging_scheme, from_file.tagging_scheme) == ("bio", "bioul")


# --------------------------------------------------------------------------- the sweep's run options

# The run fields a sweep sets for each run (its data, output directory, grid point and seed), and
# those a BLURB sweep leaves at their defaults: the generic-dataset options and the launcher's rank.
SET_PER_RUN = {"dataset", "data_dir", "output_dir", "learning_rate", "batch_size", "epochs", "seed"}
NOT_SWEPT = {"task_type", "negative_label", "labels", "local_rank"}


def test_every_run_field_is_a_sweep_option_or_set_per_run():
    run_fields = {f.name for f in dataclasses.fields(FinetuneArgs)}
    options = {f.name for f in dataclasses.fields(RunOptions)}
    # A field added to FinetuneArgs itself (not RunOptions) fails here: a sweep could not set it.
    assert run_fields - options == SET_PER_RUN | NOT_SWEPT
    # The sweep takes the run options as they are declared: not one is declared (or defaulted) again.
    for name in options:
        assert SweepArgs.__dataclass_fields__[name] is RunOptions.__dataclass_fields__[name], name


def _other_value(f: dataclasses.Field, hint) -> object:
    """A valid value of run option ``f`` that is not its default."""
    literal = next((arg for arg in (hint, *typing.get_args(hint)) if typing.get_origin(arg) is typing.Literal), None)
    if literal is not None:
        return next(choice for choice in typing.get_args(literal) if choice != f.default)
    if hint is bool:
        return not f.default
    if hint is str:
        return f.default + "-other"
    if int in (hint, *typing.get_args(hint)):
        return 9  # >= every int option's minimum (max_length: 8)
    if hint is float:
        return f.default / 2
    raise AssertionError(f"run option {f.name}: no test value for {hint}; add one here")


def test_the_sweep_passes_every_run_option_to_each_run(tmp_path):
    hints = typing.get_type_hints(RunOptions)
    changed = {f.name: _other_value(f, hints[f.name]) for f in dataclasses.fields(RunOptions)}
    assert changed["precision"] != "fp32" and changed["deepspeed"] is True
    for dataset in ("ncbi-disease", "gad"):
        (tmp_path / dataset).mkdir()
    args = SweepArgs(**changed, output_dir=str(tmp_path / "out"), learning_rates=[1e-5], batch_sizes=[16],
                     num_seeds=1, datasets=["ncbi-disease", "gad"],
                     data_dirs=[f"ncbi-disease={tmp_path / 'ncbi-disease'}", f"gad={tmp_path / 'gad'}"])
    runs = {run.dataset: run.args for run in plan_sweep(args).runs}
    for dataset, run in runs.items():
        passed_on = {name: getattr(run, name) for name in changed}
        # allow_missing_train applies to NER datasets only (a relation dataset needs its train file).
        expected = changed | {"allow_missing_train": dataset == "ncbi-disease"}
        assert passed_on == expected, dataset
