"""Task adapters (finetune/adapters/), the loop that asks them (finetune/trainer.py), and the DeepSpeed
config both trainers share (biomed_lm/backend.py)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from biomed_lm.backend import ds_config  # noqa: E402
from biomed_lm.errors import InputError  # noqa: E402
from biomed_lm.finetune.adapters import ADAPTERS, TaskAdapter, adapter_for  # noqa: E402
from biomed_lm.finetune.blurb import BLURB, TASK_TYPES  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def test_one_adapter_per_family_and_an_error_naming_the_valid_ones():
    assert tuple(ADAPTERS) == TASK_TYPES
    assert all(issubclass(a, TaskAdapter) and a.family == family for family, a in ADAPTERS.items())
    assert {adapter_for(entry.task_type).family for entry in BLURB.values()} == set(TASK_TYPES)
    with pytest.raises(InputError, match="no task adapter for 'ranking'; valid task types: ner, pico, relation"):
        adapter_for("ranking")


def _functions(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))], tree


def test_the_loop_has_no_task_type_branches():
    """trainer.py neither compares with a task family's name nor imports the names to compare with."""
    _, tree = _functions(REPO / "finetune" / "trainer.py")
    families = set(TASK_TYPES) | {"NER", "PICO", "RELATION", "SIMILARITY", "CLASSIFICATION", "QA"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            values = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)}
            assert not (names | values) & families, ast.unparse(node)
        if isinstance(node, ast.ImportFrom):
            assert not {a.name for a in node.names} & families, ast.unparse(node)


@pytest.mark.parametrize("path", ["finetune/trainer.py", *sorted(
    str(p.relative_to(REPO)) for p in (REPO / "finetune" / "adapters").glob("*.py"))])
def test_no_function_over_60_lines(path):
    functions, _ = _functions(REPO / path)
    long = {f.name: f.end_lineno - f.lineno + 1 for f in functions if f.end_lineno - f.lineno + 1 > 60}
    assert not long


def test_ds_config_is_the_one_both_trainers_had():
    """The configs the two generators wrote before they became one (key order included)."""
    fine = ds_config(global_batch_size=32, micro_batch_size=16, gradient_accumulation_steps=1, max_grad_norm=1.0,
                     precision="bf16", zero_stage=1)
    assert json.dumps(fine) == (
        '{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1, '
        '"gradient_clipping": 1.0, "steps_per_print": 1000000000, "wall_clock_breakdown": false, '
        '"zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": true, "bf16": {"enabled": true}}')
    pre = ds_config(global_batch_size=8192, micro_batch_size=64, gradient_accumulation_steps=2, max_grad_norm=1.0,
                    precision="bf16", zero_stage=0, bf16_mode="autocast")
    assert list(pre)[-2:] == ["torch_autocast", "data_types"]
    assert pre["data_types"] == {"grad_accum_dtype": "fp32"}
    fp16 = ds_config(global_batch_size=8, micro_batch_size=8, gradient_accumulation_steps=1, max_grad_norm=1.0,
                     precision="fp16", zero_stage=0)
    assert fp16["fp16"] == {"enabled": True, "loss_scale": 0, "initial_scale_power": 16} and "bf16" not in fp16
    assert set(ds_config(global_batch_size=8, micro_batch_size=8, gradient_accumulation_steps=1, max_grad_norm=1.0,
                         precision="fp32", zero_stage=0)) == set(list(fine)[:-1])


def test_pretraining_and_fine_tuning_configs_come_from_the_backend():
    from biomed_lm.finetune.trainer import FinetuneArgs, finetune_ds_config
    from biomed_lm.pretrain.config import TrainArguments, create_ds_config

    args = FinetuneArgs(model="m", dataset="d", data_dir="x", output_dir="o", batch_size=32, deepspeed=True,
                        precision="fp16", zero_stage=2)
    assert finetune_ds_config(args, 2) == ds_config(global_batch_size=32, micro_batch_size=16,
                                                    gradient_accumulation_steps=1, max_grad_norm=1.0,
                                                    precision="fp16", zero_stage=2)
    train = TrainArguments(micro_batch_size=8, gradient_accumulation_steps=3, precision="bf16", zero_stage=1)
    assert create_ds_config(train, 2) == ds_config(global_batch_size=48, micro_batch_size=8,
                                                   gradient_accumulation_steps=3, max_grad_norm=train.max_grad_norm,
                                                   precision="bf16", zero_stage=1, bf16_mode="autocast")
    # at ZeRO stage 0 the pretraining trainer clips the gradients itself: DeepSpeed's clipping is off
    stage0 = TrainArguments(micro_batch_size=8, gradient_accumulation_steps=3, precision="bf16")
    assert create_ds_config(stage0, 2) == ds_config(global_batch_size=48, micro_batch_size=8,
                                                    gradient_accumulation_steps=3, max_grad_norm=0.0,
                                                    precision="bf16", zero_stage=0, bf16_mode="autocast")
