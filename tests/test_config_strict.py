"""Strict configuration: every value, from the YAML file or a flag, is checked against its field's
annotation and range before anything runs, and the error names the file and key (or the flag).

Before these checks YAML values skipped argparse's conversion: ``precision: fp8`` (then not a
choice; now ``--precision fp8`` is torchao's float8 training, see tests/test_fp8.py) trained in fp32
and exited 0, ``learning_rate: true`` trained at 1.0, ``checkpoint_every: 0`` crashed with a
ZeroDivisionError after the first step, and a ``hiden_size`` typo in a model preset reached the
exported config.json."""

from __future__ import annotations

import re

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from biomed_lm.config import parse_config
from biomed_lm.errors import ConfigError
from biomed_lm.experiments.ablation import load_ablation_config  # noqa: E402
from biomed_lm.pretrain.adversarial import AdversarialConfig  # noqa: E402
from biomed_lm.pretrain.config import (DataArguments, ModelArguments, PretrainConfigError, TrainArguments,  # noqa: E402
                                       load_model_preset)
from biomed_lm.pretrain.instance_builder import PretrainingDataConfig  # noqa: E402
from biomed_lm.tokenization.corpus import CorpusConfig  # noqa: E402
from tests import forked_main  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PRETRAIN = [ModelArguments, DataArguments, TrainArguments, AdversarialConfig]  # launch/pretrain.py's


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _pretrain(tmp_path: Path, text: str, *flags: str):
    return parse_config(PRETRAIN, ["--config", str(_yaml(tmp_path, text)), *flags])


_LAUNCH: dict[str, object] = {}


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory) -> Path:
    """A directory for hypothesis tests (a function-scoped tmp_path is not reset between examples)."""
    return tmp_path_factory.mktemp("config_strict")


def _launch_module(script: str):
    """``launch/<script>.py`` loaded in this process (launch/ is a folder of scripts, not a package);
    kept in sys.modules so its dataclasses' string annotations resolve."""
    if script not in _LAUNCH:
        name = f"launch_{script}_config_strict"
        spec = importlib.util.spec_from_file_location(name, REPO / "launch" / f"{script}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _LAUNCH[script] = module
    return _LAUNCH[script]


# ------------------------------------------------------------------------------ YAML values

def test_yaml_precision_fp4_names_the_file_key_and_choices(tmp_path):
    path = _yaml(tmp_path, "precision: fp4\n")
    with pytest.raises(ConfigError) as err:
        parse_config(PRETRAIN, ["--config", str(path)])
    assert str(err.value) == f"{path}: precision: 'fp4' is not one of fp32, fp16, bf16, fp8"


def test_yaml_true_is_not_a_learning_rate(tmp_path):
    with pytest.raises(ConfigError, match=r"x\.yaml: learning_rate: true is not a number"):
        _pretrain(tmp_path, "learning_rate: true\n")


@pytest.mark.parametrize("text, shown", [("1.5", "1.5"), ("true", "true"), ("1.0", "1.0"), ("'8'", "'8'")])
def test_yaml_int_field_takes_only_whole_numbers(tmp_path, text, shown):
    with pytest.raises(ConfigError, match=rf"x\.yaml: micro_batch_size: {shown} is not an integer"):
        _pretrain(tmp_path, f"micro_batch_size: {text}\n")


@pytest.mark.parametrize("key", ["train_pair", "nsp"])  # nsp: its old name, still read
@pytest.mark.parametrize("text", ["1", "'yes'", "null"])
def test_yaml_bool_field_takes_only_true_or_false(tmp_path, key, text):
    with pytest.raises(ConfigError, match=rf"x\.yaml: {key}: .* is not true or false"):
        _pretrain(tmp_path, f"{key}: {text}\n")


@pytest.mark.parametrize("yaml_text, flags, expected", [
    ("nsp: false\n", [], False), ("train_pair: false\n", [], False), ("", ["--no-nsp"], False),
    ("", ["--no_nsp"], False), ("", ["--no-train-pair"], False), ("nsp: false\n", ["--nsp"], True),
    ("nsp: false\n", ["--train-pair", "true"], True), ("", [], True)])
def test_the_pair_objective_option_reads_its_old_name_nsp(tmp_path, yaml_text, flags, expected):
    _, data, _, _ = _pretrain(tmp_path, yaml_text, *flags)
    assert data.train_pair is expected and not hasattr(data, "nsp")


def test_an_option_under_its_old_and_new_name_at_once_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"x\.yaml: nsp is the old name of train_pair: give one of them"):
        _pretrain(tmp_path, "nsp: true\ntrain_pair: false\n")


@pytest.mark.parametrize("key", ["checkpoint_every", "log_every"])
def test_zero_intervals_are_refused_from_yaml_and_flags(tmp_path, key):
    # both used to divide the step number: ZeroDivisionError after the first step
    with pytest.raises(ConfigError, match=rf"x\.yaml: {key}: 0 is out of range: must be >= 1"):
        _pretrain(tmp_path, f"{key}: 0\n")
    with pytest.raises(ConfigError, match=rf"^--{key}: -3 is out of range: must be >= 1"):
        parse_config(PRETRAIN, [f"--{key}", "-3"])


def test_probabilities_are_refused_outside_0_1(tmp_path):
    with pytest.raises(ConfigError, match=r"mlm_probability: 1\.5 is out of range: must be in \[0, 1\]"):
        _pretrain(tmp_path, "mlm_probability: 1.5\n")
    with pytest.raises(ConfigError, match=r"warmup_ratio: 1\.0 is out of range: must be in \[0, 1\)"):
        _pretrain(tmp_path, "warmup_ratio: 1.0\n")
    with pytest.raises(ConfigError, match=r"^--mask_rate_end: -0\.1 is out of range"):
        parse_config(PRETRAIN, ["--mask_rate_end", "-0.1"])


def test_a_mask_schedule_typo_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"mask_schedule: 'stepwize' is not one of constant, stepwise, linear"):
        _pretrain(tmp_path, "mask_schedule: stepwize\n")


def test_non_finite_numbers_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"learning_rate: nan is not a finite number"):
        _pretrain(tmp_path, "learning_rate: .nan\n")


def test_the_value_used_is_the_value_checked(tmp_path, caplog):
    # a flag replaces a YAML value (only the flag's value is used, the file's bad one is named); an error names
    # the flag, not the file
    with caplog.at_level("WARNING", logger="biomed_lm.config"):
        *_, train, _ = _pretrain(tmp_path, "checkpoint_every: 0\nlearning_rate: 2e-4\n", "--checkpoint_every", "5",
                                 "--learning_rate", "1e-4")
    assert train.checkpoint_every == 5
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / 'x.yaml'}: checkpoint_every: 0 is out of range: must be >= 1 "
        "(not used here: --checkpoint_every replaces it; fix the file)"]
    with pytest.raises(ConfigError, match=r"^--checkpoint_every: 0 is out of range"):
        _pretrain(tmp_path, "checkpoint_every: 5\n", "--checkpoint-every", "0")


def test_yaml_numbers_are_normalized(tmp_path):
    # an int for a float field becomes a float; YAML 1.2's 1e-4 (text to PyYAML) is a float
    *_, train, _ = _pretrain(tmp_path, "learning_rate: 1\nadam_epsilon: 1e-8\nzero_stage: 1\n")
    assert type(train.learning_rate) is float and train.learning_rate == 1.0
    assert train.adam_epsilon == 1e-8 and train.zero_stage == 1


def test_list_fields_check_their_items(tmp_path):
    path = _yaml(tmp_path, "inputs: data/sample/x.txt\n")  # a string, not a list: its letters were the inputs
    with pytest.raises(ConfigError, match=r"inputs: 'data/sample/x.txt' is not a list of strings"):
        parse_config([CorpusConfig], ["--config", str(path)])
    path = _yaml(tmp_path, "inputs: [a.txt]\nlanguages: [eng, 7]\n")
    with pytest.raises(ConfigError, match=r"languages: item 2 of \['eng', 7\]: 7 is not a string"):
        parse_config([CorpusConfig], ["--config", str(path)])


def test_data_recipe_ranges(tmp_path):
    path = _yaml(tmp_path, "dupe_factor: 0\n")
    with pytest.raises(ConfigError, match=r"dupe_factor: 0 is out of range: must be >= 1"):
        parse_config([PretrainingDataConfig], ["--config", str(path)])


# ------------------------------------------------------------------------------------ flags

@pytest.mark.parametrize("flag, value", [("--mask_schedule", "stepwize"), ("--attn_implementation", "flash"),
                                         ("--zero_stage", "3"), ("--precision", "fp4")])
def test_flag_choices_are_argparse_choices(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_config(PRETRAIN, [flag, value])
    assert exit_.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_help_lists_choices_and_ranges(capsys):
    with pytest.raises(SystemExit):
        parse_config(PRETRAIN, ["--help"])
    out = capsys.readouterr().out
    kernels = "{auto,flash_attn,varlen,sdpa_padded,flex,sdpa_nested,sdpa_loop,hf_sdpa,hf_eager}"
    assert "{constant,stepwise,linear}" in out and kernels in out and "{0,1,2}" in out
    assert "{fp32,fp16,bf16,fp8}" in out and "{bert,albert,roberta}" in out
    assert "in [0, 1)" in out and ">= 1" in out
    # a --no_<name> flag says what it does (QA, 2026-11-28: it repeated --<name>'s help and its "(default: True)")
    no_flag = re.search(r"--no_resume, --no-resume\s+(.*?)\n  --", out, re.S)
    assert no_flag and " ".join(no_flag.group(1).split()) == "the same as --resume false"
    # QA (2026-11-29): "(default: )" on an option that must be given, "(default: None)" after a help text that
    # says its default; a real default is still shown
    assert "(default: )" not in out and "(default: None)" not in out and "(default: 0.1)" in out


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=-10 ** 12, max_value=10 ** 12))
def test_checkpoint_interval_is_accepted_exactly_when_positive(every):
    if every >= 1:
        *_, train, _ = parse_config(PRETRAIN, [f"--checkpoint_every={every}"])
        assert train.checkpoint_every == every
    else:
        with pytest.raises(ConfigError, match=rf"^--checkpoint_every: {every} is out of range: must be >= 1$"):
            parse_config(PRETRAIN, [f"--checkpoint_every={every}"])


@settings(max_examples=30, deadline=None)
@given(st.one_of(st.booleans(), st.floats(allow_nan=False), st.text(max_size=5)))
def test_a_yaml_int_field_takes_no_other_type(shared_dir, value):
    path = shared_dir / "x.yaml"
    path.write_text(yaml.safe_dump({"log_every": value}), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^\S+x\.yaml: log_every: .* is not an integer$"):
        parse_config(PRETRAIN, ["--config", str(path)])


# ------------------------------------------------------------------------------ model preset

def test_model_preset_key_typo_is_refused_with_the_close_match(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("hiden_size: 128\nnum_hidden_layers: 2\n", encoding="utf-8")
    with pytest.raises(PretrainConfigError) as err:
        load_model_preset(str(path))
    message = str(err.value)
    assert str(path) in message and "'hiden_size'" in message and "hidden_size" in message.split("mean", 1)[1]


@pytest.mark.parametrize("text, fragment", [("hidden_size: 128.0", "hidden_size: 128.0 is not an integer"),
                                            ("num_hidden_layers: true", "num_hidden_layers: true is not an integer"),
                                            ("hidden_dropout_prob: 1.5", "hidden_dropout_prob: 1.5 is out of range"),
                                            ("hidden_size: 100\nnum_attention_heads: 3", "not a multiple")])
def test_model_preset_values_are_checked(tmp_path, text, fragment):
    path = tmp_path / "model.yaml"
    path.write_text(text + "\n", encoding="utf-8")
    with pytest.raises(PretrainConfigError, match=fragment):
        load_model_preset(str(path))


# ------------------------------------------------------------------- the committed configs

def _configs_of(folder: str) -> list[Path]:
    return sorted((REPO / "configs" / folder).glob("*.yaml"))


def _parsers() -> dict:
    """configs/<folder> -> how its launch script reads a file of it (dataclasses + flags it needs)."""
    from biomed_lm.finetune.sweep import SweepArgs
    from biomed_lm.finetune.trainer import FinetuneArgs
    from biomed_lm.tokenization.vocab import VocabConfig

    build_vocab = _launch_module("build_vocab")
    return {"pretrain": (PRETRAIN, {}),                                        # launch/pretrain.py
            "data": ([PretrainingDataConfig], {}),                             # launch/create_pretraining_data.py
            "corpus": ([CorpusConfig], {}),                                    # launch/prepare_corpus.py
            "vocab": ([build_vocab.BuildVocabArgs, VocabConfig], {"inputs": "x", "output_dir": "y"}),
            "finetune": ([FinetuneArgs], {}),                                  # launch/finetune.py
            "blurb": ([SweepArgs], {"model": "m", "output_dir": "o"})}         # launch/blurb.py (both "")


def test_every_config_folder_is_checked_here():
    folders = {p.name for p in (REPO / "configs").iterdir() if p.is_dir() and any(p.glob("*.yaml"))}
    # ablation: launch/ablate.py (load_ablation_config); model: presets (load_model_preset);
    # recipes: launch/recipe.py (load_recipe; tests/test_recipes.py loads each, full and tiny)
    assert folders == set(_parsers()) | {"ablation", "model", "recipes"}


@pytest.mark.parametrize("folder", ["pretrain", "data", "corpus", "vocab", "finetune", "blurb"])
def test_committed_configs_parse(folder):
    dataclass_types, needed = _parsers()[folder]
    for path in _configs_of(folder):
        values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        flags = [arg for name, value in needed.items() if not values.get(name) for arg in (f"--{name}", value)]
        parsed = parse_config(dataclass_types, ["--config", str(path), *flags])
        merged = {k: v for dc in parsed for k, v in vars(dc).items()}
        for key, value in values.items():  # what the file says is what the script gets
            if key not in {"tagging_scheme"} and not (key in needed and not value):
                assert merged[key] == value, (path, key)


def test_committed_ablations_and_model_presets_load():
    for path in _configs_of("ablation"):
        load_ablation_config(path)
    for path in _configs_of("model"):
        assert load_model_preset(path.stem)


def test_ablation_pretrain_budget_is_checked(tmp_path):
    values = yaml.safe_load((REPO / "configs" / "ablation" / "tiny.yaml").read_text(encoding="utf-8"))
    values["pretrain"]["max_steps"] = 0
    values["output_dir"] = str(tmp_path / "out")
    path = tmp_path / "ablation.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"ablation\.yaml: pretrain\.max_steps: 0 is out of range"):
        load_ablation_config(path)


# ------------------------------------------------------------------------ launch scripts

def test_pretrain_cli_exits_2_on_fp4_before_anything_starts(tmp_path):
    out = tmp_path / "run"
    config = _yaml(tmp_path, f"precision: fp4\nmodel: bert-tiny\noutput_dir: {out}\nmax_steps: 2\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = forked_main.run_command([sys.executable, str(REPO / "launch" / "pretrain.py"), "--config", str(config)],
                                   env=env, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"pretrain: error: {config}: precision: 'fp4' is not one of fp32, fp16, bf16, fp8" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()  # refused before the run directory was made


def _bad_cli_cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    ablation = yaml.safe_load((REPO / "configs" / "ablation" / "tiny.yaml").read_text(encoding="utf-8"))
    ablation["pretrain"]["micro_batch_size"] = 2.5
    ablation["output_dir"] = str(tmp_path / "out")
    (tmp_path / "ablation.yaml").write_text(yaml.safe_dump(ablation), encoding="utf-8")
    (tmp_path / "blurb.yaml").write_text("epochs: true\n", encoding="utf-8")
    (tmp_path / "finetune.yaml").write_text("batch_size: 1.5\n", encoding="utf-8")
    (tmp_path / "report.yaml").write_text("ablation_dir: 5\n", encoding="utf-8")
    out = str(tmp_path / "out")
    return {
        "ablate": (["--config", str(tmp_path / "ablation.yaml")], "pretrain.micro_batch_size: 2.5 is not an integer"),
        "blurb": (["--config", str(tmp_path / "blurb.yaml"), "--model", "m", "--output_dir", out],
                  "epochs: true is not an integer or null"),
        "build_vocab": (["--inputs", "x", "--output_dir", out, "--min_frequency", "-1"], "--min_frequency: -1"),
        "calibrate": (["--simulations", "0", "--output_dir", out], "--simulations: 0 is out of range"),
        "cli": (["no-such-command"], "unknown command 'no-such-command'"),  # biomed-lm, the dispatcher
        "create_pretraining_data": (["--dupe_factor", "0"], "--dupe_factor: 0 is out of range"),
        "demo": (["--scale", "0"], "--scale: 0.0 is out of range: must be > 0"),
        "finetune": (["--config", str(tmp_path / "finetune.yaml")], "batch_size: 1.5 is not an integer"),
        "prepare_corpus": (["--inputs", "x", "--output_dir", out, "--min_words", "-1"], "--min_words: -1"),
        "pretrain": (["--log_every", "0"], "--log_every: 0 is out of range: must be >= 1"),
        "recipe": (["pubmedbert", "--scale", "0"], "--scale: 0.0 is out of range: must be > 0"),
        "report": (["--config", str(tmp_path / "report.yaml")], "ablation_dir: 5 is not a string"),
        "sweep_report": (["--sweeps", f"a={tmp_path / 'absent'}", "--output_dir", out], "is not a directory"),
        "vocab_report": (["--tokenizers", "a=b", "--output_dir", out, "--top_words", "-1"], "--top_words: -1"),
    }


def test_every_launch_script_exits_2_naming_the_bad_value(tmp_path, capsys):
    cases = _bad_cli_cases(tmp_path)
    # a new script needs a case here
    assert set(cases) == {p.stem for p in (REPO / "launch").glob("*.py") if p.stem != "__init__"}
    for script, (argv, fragment) in cases.items():
        assert _launch_module(script).main(argv) == 2, script
        assert fragment in capsys.readouterr().err, script
    assert not (tmp_path / "out").exists()


def test_launch_dataclass_defaults_pass_their_own_checks():
    import dataclasses

    from biomed_lm.config import check_fields
    from biomed_lm.finetune.sweep import SweepArgs
    from biomed_lm.finetune.trainer import FinetuneArgs
    from biomed_lm.tokenization.vocab import VocabConfig

    types = [*PRETRAIN, PretrainingDataConfig, CorpusConfig, VocabConfig, FinetuneArgs, SweepArgs]
    for script in ("ablate", "calibrate", "demo", "report", "sweep_report", "vocab_report", "build_vocab"):
        module = _launch_module(script)
        types += [v for v in vars(module).values()
                  if dataclasses.is_dataclass(v) and isinstance(v, type) and v.__module__ == module.__name__]
    for dc in types:
        defaults = {}
        for f in dataclasses.fields(dc):
            if f.default is not dataclasses.MISSING:
                defaults[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                defaults[f.name] = f.default_factory()
        check_fields(dc, defaults, dc.__name__)


def test_a_key_given_twice_in_a_yaml_file_is_refused_naming_both_lines(tmp_path):
    """QA (2026-11-28): PyYAML kept the last of two micro_batch_size keys without a word."""
    from biomed_lm.config import load_yaml_mapping

    config = tmp_path / "twice.yaml"
    config.write_text("micro_batch_size: 16\nmax_steps: 3\nmicro_batch_size: 8\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"twice.yaml: not valid YAML: 'micro_batch_size' is given twice "
                                          r"\(lines 1 and 3\)"):
        load_yaml_mapping(config)


def test_an_unknown_yaml_option_names_the_close_match(tmp_path):
    with pytest.raises(ConfigError, match=r"x\.yaml: unknown option\(s\) learning_rat "
                                          r"\(did you mean learning_rate\?\); valid: .*\blearning_rate\b"):
        _pretrain(tmp_path, "learning_rat: 1e-4\n")


def test_a_shortened_flag_is_not_taken_for_a_longer_one():
    """QA (2026-11-28): --learning_rat ran as --learning_rate (argparse's prefix matching)."""
    from biomed_lm.pretrain.config import TrainArguments

    with pytest.raises(SystemExit) as exit_:
        parse_config([TrainArguments], ["--learning_rat", "1e-3"])
    assert exit_.value.code == 2


def test_null_on_the_command_line_is_none_as_in_yaml(tmp_path):
    """`--limit-alphabet null`, as --help spells it ("null: all"), was "invalid int value: 'null'"."""
    from biomed_lm.tokenization.vocab import VocabConfig

    (from_flag,) = parse_config([VocabConfig], ["--limit-alphabet", "null", "--max-distinct-words", "null"])
    config = tmp_path / "vocab.yaml"
    config.write_text("limit_alphabet: null\nmax_distinct_words: null\n")
    (from_yaml,) = parse_config([VocabConfig], ["--config", str(config)])
    assert (from_flag.limit_alphabet, from_flag.max_distinct_words) == (None, None) == \
        (from_yaml.limit_alphabet, from_yaml.max_distinct_words)
    (given,) = parse_config([VocabConfig], ["--limit-alphabet", "500"])
    assert given.limit_alphabet == 500
    with pytest.raises(SystemExit):  # any other word is still argparse's error
        parse_config([VocabConfig], ["--limit-alphabet", "all"])
