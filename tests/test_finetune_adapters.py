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
        '"zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": true, '
        '"torch_autocast": {"enabled": true, "dtype": "bfloat16"}, "data_types": {"grad_accum_dtype": "fp32"}}')
    pre = ds_config(global_batch_size=8192, micro_batch_size=64, gradient_accumulation_steps=2, max_grad_norm=1.0,
                    precision="bf16", zero_stage=0)
    assert list(pre)[-2:] == ["torch_autocast", "data_types"] and "bf16" not in pre
    assert pre["data_types"] == {"grad_accum_dtype": "fp32"}
    fp16 = ds_config(global_batch_size=8, micro_batch_size=8, gradient_accumulation_steps=1, max_grad_norm=1.0,
                     precision="fp16", zero_stage=0)
    assert fp16["fp16"] == {"enabled": True, "loss_scale": 0, "initial_scale_power": 16} and "bf16" not in fp16
    assert set(ds_config(global_batch_size=8, micro_batch_size=8, gradient_accumulation_steps=1, max_grad_norm=1.0,
                         precision="fp32", zero_stage=0)) == set(list(fine)[:-2])


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
                                                   precision="bf16", zero_stage=1)
    # at ZeRO stage 0 the pretraining trainer clips the gradients itself: DeepSpeed's clipping is off
    stage0 = TrainArguments(micro_batch_size=8, gradient_accumulation_steps=3, precision="bf16")
    assert create_ds_config(stage0, 2) == ds_config(global_batch_size=48, micro_batch_size=8,
                                                    gradient_accumulation_steps=3, max_grad_norm=0.0,
                                                    precision="bf16", zero_stage=0)


SYNC_AUDIT = """
import collections, json, sys
sys.path.insert(0, "tests")
import deepspeed, torch
from host_syncs import host_syncs
from test_finetune_modeling import TokenTaggingModel, batch, tag_labels, tiny_bert
from biomed_lm.backend import ensure_distributed_env
from biomed_lm.finetune import trainer
from biomed_lm.optim import build_optimizer

ensure_distributed_env()
deepspeed.init_distributed(dist_backend="gloo")
model = TokenTaggingModel(tiny_bert(), num_labels=3)
optimizer = build_optimizer("adamw", model.parameters(), lr=1e-3, device="cpu").optimizer
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
args = trainer.FinetuneArgs(model="m", dataset="d", data_dir="x", output_dir="o", batch_size=3, deepspeed=True,
                            precision="bf16")
engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                  config=trainer.finetune_ds_config(args, 1))
step = trainer._DeepSpeedStepper(engine)
input_ids, attention_mask, word_mask = batch(0)
inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": tag_labels(word_mask, 3, 0)}
step(inputs)
with host_syncs() as found:
    step(inputs)
print(json.dumps({"optimizer": type(engine.optimizer).__name__,
                  "reads": sorted({entry["at"] for entry in found})}))
"""


def test_a_bf16_fine_tuning_step_through_deepspeed_reads_nothing_back(tmp_path):
    """--deepspeed --precision bf16 runs as autocast with fp32 weights: the engine steps our AdamW itself. In
    DeepSpeed's bf16 mode it wrapped it in FP16_UnfusedOptimizer, whose step read each parameter's overflow
    check and two norms back to the host (42 reads a step for this 2-layer model), each a wait on a GPU."""
    import subprocess
    import sys

    from tests.conftest import REPO

    done = subprocess.run([sys.executable, "-c", SYNC_AUDIT], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    audit = json.loads(done.stdout.strip().splitlines()[-1])
    assert audit["optimizer"] == "AdamW"  # the client optimizer itself, not DeepSpeed's fp16/bf16 wrapper
    assert audit["reads"] == []
