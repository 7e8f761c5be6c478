"""``--precision fp8`` (issue 23, item 6): torchao's float8 training in the encoder's Linear layers.

On CPU: the real CLI refuses fp8 (exit 2, before the run directory exists); the refusal reasons
with faked CUDA devices (A100 refused and named, H100 accepted with torchao, the torchao reason
without it, an old torch); which Linear layers the conversion selects, for every family, with a
fake ``torchao.float8`` injected into ``sys.modules`` that swaps layers as torchao's
``swap_linear_layers`` does (post-order, fully qualified names relative to the model); that the
converted model keeps its parameters, state_dict and export; the DeepSpeed config (bf16) and the
FP8 peaks. Where torchao is importable, the same with the real one (emulated on CPU). On an FP8
GPU (``-m gpu``): a converted BERT-tiny trains like bf16 (first loss within 1%).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.machinery
import logging
import os
import sys
import types
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from biomed_lm.pretrain import fp8
from biomed_lm.pretrain.config import (DataArguments, ModelArguments, PretrainConfigError, TrainArguments,
                                       create_ds_config, load_model_preset)
from biomed_lm.pretrain.families import get_family
from biomed_lm.pretrain.flops import device_peak, normalise_precision, peak_flops
from tests import forked_main
from tests.conftest import REPO

T = 1e12
GIB = 1024 ** 3


# ------------------------------------------------------------------------------ a fake torchao

class FakeFloat8Linear(nn.Linear):
    """What torchao's ``Float8Linear.from_float`` does to the module tree: a new module built on the
    meta device, given the old module's weight and bias Parameters (the same objects)."""

    @classmethod
    def from_float(cls, mod: nn.Linear, config=None) -> "FakeFloat8Linear":
        with torch.device("meta"):
            new = cls(mod.in_features, mod.out_features, bias=False)
        new.weight, new.bias, new.fp8_config = mod.weight, mod.bias, config
        return new


@dataclasses.dataclass(frozen=True)
class FakeFloat8LinearConfig:
    recipe: str = "tensorwise"
    pad_inner_dim: bool = False
    emulate: bool = False

    @classmethod
    def from_recipe_name(cls, name: str) -> "FakeFloat8LinearConfig":
        return cls(recipe=name)


def _fake_convert(module: nn.Module, *, module_filter_fn=None, config=None) -> nn.Module:
    """torchao's ``swap_linear_layers``: post-order over ``named_children``, fqn from the root."""
    def visit(node: nn.Module, fqn: str, parent: nn.Module | None) -> None:
        for name, child in node.named_children():
            visit(child, f"{fqn}.{name}" if fqn else name, node)
        if isinstance(node, nn.Linear) and (module_filter_fn is None or module_filter_fn(node, fqn)):
            setattr(parent, fqn.rpartition(".")[2], FakeFloat8Linear.from_float(node, config))

    visit(module, "", None)
    return module


@pytest.fixture
def fake_torchao(monkeypatch):
    import transformers.modeling_utils  # noqa: F401  (it asks whether torchao is installed: before the fake)

    package = types.ModuleType("torchao")
    package.__path__ = []
    package.__version__ = "0.0-fake"
    package.__spec__ = importlib.machinery.ModuleSpec("torchao", None, is_package=True)
    float8 = types.ModuleType("torchao.float8")
    float8.__spec__ = importlib.machinery.ModuleSpec("torchao.float8", None)
    float8.convert_to_float8_training = _fake_convert
    float8.Float8LinearConfig = FakeFloat8LinearConfig
    package.float8 = float8
    monkeypatch.setitem(sys.modules, "torchao", package)
    monkeypatch.setitem(sys.modules, "torchao.float8", float8)
    return float8


@pytest.fixture
def no_torchao(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # import torchao -> ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "torchao.float8", None)


def _fake_gpu(monkeypatch, name: str, capability: tuple[int, int]) -> list:
    """CUDA "available" with one GPU of this name and capability; the indices asked for are recorded."""
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: asked.append(index) or capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: name)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.version, "hip", None)
    return asked


def _model(architecture: str = "bert", preset: str | None = None, vocab: int = 1000, **fields) -> nn.Module:
    family = get_family(architecture)
    preset = preset or ("bert-tiny" if architecture == "roberta" else f"{architecture}-tiny")
    values = {**family.preset_fields(load_model_preset(preset), preset), **fields}
    torch.manual_seed(0)
    return family.build(values, vocab, 0)


# ------------------------------------------------------------------------------ the CLI refusal

def test_cli_refuses_fp8_on_cpu_with_exit_2_before_the_run_directory_exists(tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    done = forked_main.run_command([sys.executable, str(REPO / "launch" / "pretrain.py"), "--config",
                                    "configs/pretrain/demo.yaml", "--precision", "fp8", "--output-dir", str(out)],
                                   env=env, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "pretrain: error: --precision fp8 (torchao float8 training) cannot run here" in done.stderr
    assert "compute capability 8.9" in done.stderr and "trains on the CPU" in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()  # refused before the run directory (lock, checkpoints, logs) was made


def test_check_arguments_refuses_fp8_first(tmp_path, monkeypatch):
    from biomed_lm.pretrain.trainer import _check_arguments

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = (ModelArguments(model="bert-tiny"), DataArguments(data_dir=str(tmp_path / "none"), tokenizer="none"),
            TrainArguments(output_dir=str(tmp_path / "run"), precision="fp8"))
    with pytest.raises(PretrainConfigError, match=r"--precision fp8 .*CPU"):
        _check_arguments(*args)
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------ the reasons

def test_cpu_is_refused_with_what_to_use_instead():
    reason = fp8.fp8_unavailable_reason("cpu")
    assert "compute capability 8.9" in reason and "CPU" in reason and "--precision bf16" in reason
    with pytest.raises(PretrainConfigError, match=r"^--precision fp8 \(torchao float8 training\) cannot run here: "):
        fp8.check_fp8(torch.device("cpu"))


def test_cuda_without_a_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "torch sees none" in fp8.fp8_unavailable_reason("cuda:0")
    assert fp8.training_device() == torch.device("cpu")
    assert "CPU" in fp8.fp8_unavailable_reason()  # the default: the device this process would train on


@pytest.mark.parametrize("name, capability", [("NVIDIA A100-SXM4-80GB", (8, 0)), ("NVIDIA A10G", (8, 6)),
                                              ("Tesla V100-SXM2-16GB", (7, 0))])
def test_pre_ada_gpus_are_refused_by_name_and_capability(monkeypatch, fake_torchao, name, capability):
    _fake_gpu(monkeypatch, name, capability)
    reason = fp8.fp8_unavailable_reason(torch.device("cuda", 0))
    assert f"{name} (cuda:0) has compute capability {capability[0]}.{capability[1]}" in reason
    assert "8.9 or newer" in reason and "--precision bf16" in reason
    with pytest.raises(PretrainConfigError, match=name):
        fp8.check_fp8("cuda:0")


@pytest.mark.parametrize("name, capability", [("NVIDIA H100 80GB HBM3", (9, 0)), ("NVIDIA L40S", (8, 9)),
                                              ("NVIDIA H200", (9, 0)), ("NVIDIA B200", (10, 0))])
def test_fp8_gpus_are_accepted_with_torchao(monkeypatch, fake_torchao, name, capability):
    _fake_gpu(monkeypatch, name, capability)
    assert fp8.fp8_unavailable_reason("cuda:0") is None
    fp8.check_fp8("cuda:0")


def test_h100_without_torchao_says_how_to_install_it(monkeypatch, no_torchao):
    _fake_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", (9, 0))
    reason = fp8.fp8_unavailable_reason("cuda:0")
    assert reason.startswith("torchao is not installed: pip install torchao")
    assert f"made for torch {torch.__version__.split('+')[0]}" in reason
    with pytest.raises(PretrainConfigError, match="pip install torchao"):
        fp8.check_fp8("cuda:0")


def test_a_broken_or_old_torchao_is_named(monkeypatch, fake_torchao):
    _fake_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", (9, 0))
    monkeypatch.delattr(fake_torchao, "convert_to_float8_training")
    assert "lacks torchao.float8.convert_to_float8_training" in fp8.fp8_unavailable_reason("cuda:0")

    def broken(name, *args):
        raise OSError("undefined symbol: _ZN3c10")
    monkeypatch.setattr(fp8.importlib, "import_module", broken)
    reason = fp8.fp8_unavailable_reason("cuda:0")
    assert "cannot be imported (OSError: undefined symbol" in reason and "pip install torchao" in reason


def test_a_torch_without_fp8_matmuls_is_refused(monkeypatch, fake_torchao):
    _fake_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", (9, 0))
    monkeypatch.delattr(torch, "_scaled_mm")
    reason = fp8.fp8_unavailable_reason("cuda:0")
    assert f"torch {torch.__version__} has no torch._scaled_mm" in reason and "upgrade torch" in reason


def test_rocm_is_refused(monkeypatch, fake_torchao):
    _fake_gpu(monkeypatch, "AMD Instinct MI300X", (9, 4))
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert "NVIDIA GPUs only" in fp8.fp8_unavailable_reason("cuda:0")


def test_the_default_device_is_this_ranks_gpu(monkeypatch, fake_torchao):
    asked = _fake_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB", (8, 0))
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert fp8.training_device() == torch.device("cuda", 3)
    assert "(cuda:3)" in fp8.fp8_unavailable_reason()
    assert asked == [3]


# ------------------------------------------------------------------------------ the conversion

BERT_ENCODER_LINEARS = ("attention.self.query", "attention.self.key", "attention.self.value",
                        "attention.output.dense", "intermediate.dense", "output.dense")


def test_bert_converts_the_encoder_linears_only(fake_torchao):
    model = _model("bert")
    assert fp8.convert_encoder_to_fp8(model, get_family("bert")) == 2 * 6
    converted = {name for name, module in model.named_modules() if isinstance(module, FakeFloat8Linear)}
    assert converted == {f"bert.encoder.layer.{i}.{path}" for i in range(2) for path in BERT_ENCODER_LINEARS}
    # heads, pooler and the tied decoder stay plain (the module doc of pretrain.fp8 says why)
    for name in ("bert.pooler.dense", "cls.predictions.transform.dense", "cls.predictions.decoder",
                 "cls.seq_relationship"):
        assert type(model.get_submodule(name)) is nn.Linear, name
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight  # still tied
    config = model.bert.encoder.layer[0].intermediate.dense.fp8_config
    assert config == FakeFloat8LinearConfig(recipe="tensorwise", pad_inner_dim=True)


def test_parameters_state_dict_and_export_are_the_plain_models(fake_torchao, tmp_path):
    from transformers import BertForPreTraining

    model = _model("bert")
    plain = copy.deepcopy(model)
    parameters = dict(model.named_parameters())
    fp8.convert_encoder_to_fp8(model)  # the family read off the config
    assert all(parameters[name] is p for name, p in model.named_parameters())  # the same Parameter objects
    state, expected = model.state_dict(), plain.state_dict()
    assert list(state) == list(expected)
    assert all(state[k].dtype == expected[k].dtype == torch.float32 and torch.equal(state[k], expected[k])
               for k in state if k in expected and state[k].is_floating_point())
    model.save_pretrained(tmp_path, safe_serialization=True)
    loaded = BertForPreTraining.from_pretrained(tmp_path)
    assert type(loaded.bert.encoder.layer[0].intermediate.dense) is nn.Linear
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in expected.items())


def test_linears_with_a_dimension_not_a_multiple_of_16_are_skipped_and_counted(fake_torchao, caplog):
    model = _model("bert", hidden_size=32, num_attention_heads=2, intermediate_size=72)
    plan = fp8.plan_fp8(model)
    with caplog.at_level(logging.WARNING, logger="biomed_lm.pretrain.fp8"):
        assert fp8.convert_encoder_to_fp8(model) == 2 * 4 == len(plan.converted)
    assert plan.skipped == {**{f"bert.encoder.layer.{i}.intermediate.dense": (72, 32) for i in range(2)},
                            **{f"bert.encoder.layer.{i}.output.dense": (32, 72) for i in range(2)}}
    assert type(model.bert.encoder.layer[0].intermediate.dense) is nn.Linear
    assert isinstance(model.bert.encoder.layer[0].attention.self.query, FakeFloat8Linear)
    assert "8 encoder Linear layer(s)" in caplog.text and "4 left in bf16" in caplog.text
    assert "bert.encoder.layer.0.intermediate.dense 72x32" in caplog.text


def test_albert_converts_its_shared_layer_and_the_embedding_projection(fake_torchao):
    model = _model("albert")
    expected = {"albert.encoder.embedding_hidden_mapping_in"} | {
        f"albert.encoder.albert_layer_groups.0.albert_layers.0.{path}"
        for path in ("attention.query", "attention.key", "attention.value", "attention.dense", "ffn", "ffn_output")}
    assert set(fp8.plan_fp8(model).converted) == expected
    assert fp8.convert_encoder_to_fp8(model) == len(expected)
    for name in ("albert.pooler", "predictions.dense", "predictions.decoder", "sop_classifier.classifier"):
        assert type(model.get_submodule(name)) is nn.Linear, name


def test_roberta_converts_its_encoder_not_the_lm_head(fake_torchao):
    model = _model("roberta")
    assert fp8.convert_encoder_to_fp8(model) == 2 * 6
    assert all(name.startswith("roberta.encoder.layer.") for name in fp8.plan_fp8(model).converted) is True
    assert type(model.lm_head.dense) is nn.Linear and type(model.lm_head.decoder) is nn.Linear


def test_converting_twice_converts_nothing_more(fake_torchao):
    model = _model("bert")
    assert fp8.convert_encoder_to_fp8(model) == 12
    assert fp8.convert_encoder_to_fp8(model) == 0
    assert fp8.plan_fp8(model).converted == []


def test_recipes(fake_torchao):
    model = _model("bert")
    fp8.convert_encoder_to_fp8(model, recipe="rowwise")
    assert model.bert.encoder.layer[1].output.dense.fp8_config == FakeFloat8LinearConfig("rowwise", pad_inner_dim=True)
    with pytest.raises(PretrainConfigError, match="fp8 recipe 'delayed'"):
        fp8.convert_encoder_to_fp8(_model("bert"), recipe="delayed")
    custom = FakeFloat8LinearConfig(emulate=True)
    other = _model("bert")
    fp8.convert_encoder_to_fp8(other, config=custom)
    assert other.bert.encoder.layer[0].attention.self.key.fp8_config is custom


def test_conversion_imports_torchao_lazily(no_torchao):
    assert fp8.plan_fp8(_model("bert")).converted  # planning needs no torchao
    with pytest.raises(ModuleNotFoundError):
        fp8.convert_encoder_to_fp8(_model("bert"))


def test_the_trainer_converts_the_encoder_under_fp8(fake_torchao):
    from biomed_lm.pretrain.trainer import _pretraining_model

    bert = _model("bert")
    model, execution = _pretraining_model(bert, ModelArguments(compile="off"), True, TrainArguments(precision="fp8"),
                                          None, torch.device("cpu"))
    assert model.hf_model is bert
    assert sum(isinstance(m, FakeFloat8Linear) for m in model.modules()) == 12
    plain, _ = _pretraining_model(_model("bert"), ModelArguments(compile="off"), True, TrainArguments(precision="bf16"),
                                  None, torch.device("cpu"))
    assert not any(isinstance(m, FakeFloat8Linear) for m in plain.modules())


# ------------------------------------------------------------------------------ config and peaks

def test_fp8_is_a_precision_choice_and_runs_deepspeed_in_bf16():
    from biomed_lm.config import parse_config

    from biomed_lm.pretrain.adversarial import AdversarialConfig

    _, _, train, _ = parse_config([ModelArguments, DataArguments, TrainArguments, AdversarialConfig],
                                  ["--precision", "fp8"])
    assert train.precision == "fp8"
    fp8_config = create_ds_config(TrainArguments(precision="fp8", micro_batch_size=4), 1)
    assert fp8_config == create_ds_config(TrainArguments(precision="bf16", micro_batch_size=4), 1)
    assert fp8_config["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"} and "fp16" not in fp8_config


@pytest.mark.parametrize("name, memory_gib, sms, peak", [
    ("NVIDIA H100 80GB HBM3", 79.6, 132, 1978.9), ("NVIDIA H100 PCIe", 79.6, 114, 1513.0),
    ("NVIDIA H100 NVL", 93.1, 132, 1670.5), ("NVIDIA H200", 139.8, 132, 1978.9),
    ("NVIDIA H200 NVL", 139.8, 132, 1670.5),
    ("NVIDIA L40S", 44.4, 142, 733.0)])
def test_dense_fp8_peaks(monkeypatch, name, memory_gib, sms, peak):
    device = device_peak(name, int(memory_gib * GIB), sms)
    assert device.fp8 == device.flops("fp8") == device.flops("float8") == peak * T
    # Hopper and Ada: FP8 is twice BF16, dense (the L40S data sheet's 733 vs 362.05 is 1% off twice)
    assert device.fp8 == pytest.approx(2 * device.bf16, rel=0.015)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda _: SimpleNamespace(name=name, total_memory=int(memory_gib * GIB),
                                                  multi_processor_count=sms))
    assert peak_flops("fp8", "cuda:0") == peak * T


def test_gpus_without_fp8_have_no_fp8_peak():
    assert normalise_precision("FP8") == "fp8"
    for name in ("NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB"):
        assert device_peak(name).flops("fp8") is None
    assert peak_flops("fp8", "cpu") is None
    mig = device_peak("NVIDIA H100 80GB HBM3", 80 * GIB, 66)
    assert mig.fp8 == pytest.approx(1978.9 * T / 2)


# ------------------------------------------------------------------------------ the real torchao

def _train_losses(bert: nn.Module, device: torch.device, steps: int, convert=None) -> list[float]:
    """Losses of ``steps`` AdamW steps of the pretraining model on one fixed micro-batch (206 real
    tokens: not a multiple of 16, so the weight-gradient matmul needs pad_inner_dim) under bf16
    autocast, the encoder converted by ``convert`` first when given."""
    from biomed_lm.pretrain.attention import choose_kernel
    from biomed_lm.pretrain.modeling import PretrainingModel

    bert = copy.deepcopy(bert)
    if convert is not None:
        convert(bert)
    attention, _ = choose_kernel("auto", device, torch.bfloat16, 0.0)
    model = PretrainingModel(bert, train_pair=True, attention=attention).to(device)
    generator = torch.Generator().manual_seed(0)
    lengths, width = [100, 37, 64, 5], 104
    ids = torch.randint(10, bert.config.vocab_size, (len(lengths), width), generator=generator)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    labels = torch.where((torch.rand(ids.shape, generator=generator) < 0.15) & mask.bool(), ids, -100)
    batch = {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
             "labels": labels, "next_sentence_label": torch.tensor([0, 1, 1, 0])}
    batch = {k: v.to(device) for k, v in batch.items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def _bert_tiny(vocab: int = 1024) -> nn.Module:
    return _model("bert", vocab=vocab, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def test_real_torchao_keeps_the_parameters_and_trains_on_cpu():
    """With torchao installed: its Float8Linear, FP8 casts emulated on CPU (torchao's ``emulate``)."""
    pytest.importorskip("torchao.float8", reason="torchao is not installed (pip install torchao)")
    from torchao.float8.float8_linear import Float8Linear

    bert = _bert_tiny()
    converted = copy.deepcopy(bert)
    keys = {k: (v.shape, v.dtype) for k, v in converted.state_dict().items()}
    assert fp8.convert_encoder_to_fp8(converted, config=fp8.fp8_config(emulate=True)) == 12
    assert sum(isinstance(m, Float8Linear) for m in converted.modules()) == 12
    assert {k: (v.shape, v.dtype) for k, v in converted.state_dict().items()} == keys
    emulated = _train_losses(bert, torch.device("cpu"), 3, lambda m: fp8.convert_encoder_to_fp8(
        m, config=fp8.fp8_config(emulate=True)))
    reference = _train_losses(bert, torch.device("cpu"), 3)
    assert emulated[0] == pytest.approx(reference[0], rel=0.01)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("recipe", fp8.RECIPES)
def test_fp8_trains_like_bf16_on_an_fp8_gpu(recipe):
    device = torch.device("cuda", torch.cuda.current_device())
    reason = fp8.fp8_unavailable_reason(device)
    if reason is not None:
        pytest.skip(reason)
    if recipe == "rowwise" and torch.cuda.get_device_capability(device) < (9, 0):
        pytest.skip("rowwise scaling runs CUTLASS kernels made for Hopper")
    bert = _bert_tiny()
    reference = _train_losses(bert, device, 8)
    losses = _train_losses(bert, device, 8, lambda m: fp8.convert_encoder_to_fp8(m, recipe=recipe))
    assert losses[0] == pytest.approx(reference[0], rel=0.01)  # the same weights: FP8 rounding only
    assert losses[-1] < losses[0] and reference[-1] < reference[0]
    assert losses[-1] == pytest.approx(reference[-1], rel=0.05)  # training follows bf16's
