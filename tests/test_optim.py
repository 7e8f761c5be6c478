"""Tests for biomed_lm/optim.py: parameter groups, LAMB, implementation choice, learning-rate schedules.

LAMB is checked against a step computed by hand in numpy (bias correction, decoupled weight
decay, trust ratio, the zero-norm cases, global-norm pre-normalization), for both of its kernels;
checkpoints must resume bit-for-bit; it must run as a DeepSpeed client optimizer on CPU. The
schedules are checked at fixed points, by property, and against HF's equivalents. Tests marked
for CUDA compare the fused implementations with the CPU ones and run only where a GPU is.
"""

from __future__ import annotations

import copy
import io
import logging
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from biomed_lm import optim
from biomed_lm.optim import (PAPER_BETAS, PAPER_EPS, PAPER_PEAK_LR, PAPER_WEIGHT_DECAY, Lamb, ScheduleConfig,
                             build_lr_scheduler, build_optimizer, constant_with_warmup, is_norm_module,
                             learning_rate_at, parameter_groups, polynomial_decay, polynomial_from_start,
                             schedule_factor, slanted_triangular, summarize_parameter_groups, warmup_steps)
from tests.conftest import run_single_rank_deepspeed

# gpu: what benchmarks/gpu_check.sh's tests stage selects (-m gpu); without it these never ran on a GPU.
CUDA_MARKS = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def requires_cuda(test):
    for mark in CUDA_MARKS:
        test = mark(test)
    return test


# --------------------------------------------------------------------------------------------
# Parameter groups
# --------------------------------------------------------------------------------------------

def tiny_bert():
    from transformers import BertConfig, BertForPreTraining

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, type_vocab_size=2)
    return BertForPreTraining(config)


def test_parameter_groups_on_bert_for_pretraining():
    model = tiny_bert()
    groups = parameter_groups(model, 0.01)
    assert [g["name"] for g in groups] == ["decay", "no_decay"]
    assert [g["weight_decay"] for g in groups] == [0.01, 0.0]
    decay, no_decay = (dict(zip(g["param_names"], g["params"])) for g in groups)
    for group in groups:
        assert len(group["params"]) == len(group["param_names"])

    # Every trainable tensor exactly once, tied ones (decoder weight = word embeddings) included once.
    named = dict(model.named_parameters())
    assert set(decay) | set(no_decay) == set(named) and not set(decay) & set(no_decay)
    assert all(decay[n] is named[n] for n in decay) and all(no_decay[n] is named[n] for n in no_decay)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight

    layer_norms = {f"{name}.{p}" for name, module in model.named_modules() if isinstance(module, nn.LayerNorm)
                   for p in ("weight", "bias")}
    assert "bert.embeddings.LayerNorm.weight" in layer_norms and len(layer_norms) == 2 * (1 + 2 * 2 + 1)
    biases = {n for n in named if n.endswith("bias")}
    assert "cls.predictions.bias" in biases and "bert.encoder.layer.0.attention.self.query.bias" in biases
    assert set(no_decay) == layer_norms | biases
    assert set(decay) == {n for n in named if n not in layer_norms | biases}
    assert {"bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
            "bert.encoder.layer.1.output.dense.weight", "cls.seq_relationship.weight"} <= set(decay)

    # torch optimizers take the groups as they are and keep their names.
    optimizer = torch.optim.AdamW(groups, lr=1e-3)
    assert optimizer.state_dict()["param_groups"][1]["param_names"] == groups[1]["param_names"]
    summary = summarize_parameter_groups(groups)
    assert [s["name"] for s in summary] == ["decay", "no_decay"]
    assert sum(s["elements"] for s in summary) == sum(p.numel() for p in model.parameters())


class OddNames(nn.Module):
    """Norm layers whose parameters are not called LayerNorm.weight, a frozen tensor, an attention."""

    class ScaleOnlyLayerNorm(nn.Module):  # not an nn.LayerNorm subclass: recognised by class name
        def __init__(self, width: int) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(width))

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.ln_f = nn.LayerNorm(4)
        self.rms = nn.RMSNorm(4)
        self.custom = self.ScaleOnlyLayerNorm(4)
        self.attention = nn.MultiheadAttention(4, 2, add_bias_kv=True)
        self.frozen = nn.Parameter(torch.ones(3), requires_grad=False)
        self.ln_f.weight.data.fill_(1.0)


def test_parameter_groups_decide_by_module_type_not_name():
    groups = {g["name"]: set(g["param_names"]) for g in parameter_groups(OddNames(), 0.1)}
    assert groups["no_decay"] == {"proj.bias", "ln_f.weight", "ln_f.bias", "rms.weight", "custom.scale",
                                  "attention.in_proj_bias", "attention.bias_k", "attention.bias_v",
                                  "attention.out_proj.bias"}
    assert groups["decay"] == {"proj.weight", "attention.in_proj_weight", "attention.out_proj.weight"}
    assert is_norm_module(nn.GroupNorm(2, 4)) and not is_norm_module(nn.Linear(2, 2))


def test_parameter_groups_edge_cases():
    assert [g["name"] for g in parameter_groups(nn.Linear(3, 3, bias=False), 0.0)] == ["decay"]
    assert [g["name"] for g in parameter_groups(nn.LayerNorm(3))] == ["no_decay"]
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        parameter_groups(frozen)
    with pytest.raises(ValueError, match="weight_decay"):
        parameter_groups(nn.Linear(2, 2), -0.1)


# --------------------------------------------------------------------------------------------
# LAMB against a hand-computed step
# --------------------------------------------------------------------------------------------

def numpy_lamb(params, grads_per_step, groups, *, lr, betas, eps, max_grad_norm, use_nvlamb):
    """LAMB written out in numpy, float64, one formula per line (apex FusedLAMB semantics).

    ``params``: name -> initial array; ``groups``: list of (names, weight_decay).
    """
    beta1, beta2 = betas
    w = {k: np.array(v, dtype=np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in w.items()}
    v2 = {k: np.zeros_like(v) for k, v in w.items()}
    for t, grads in enumerate(grads_per_step, start=1):
        global_norm = math.sqrt(sum(float(np.sum(np.square(g))) for g in grads.values()))
        clip = global_norm / max_grad_norm if max_grad_norm is not None and global_norm > max_grad_norm else 1.0
        for names, weight_decay in groups:
            for k in names:
                g = np.asarray(grads[k], dtype=np.float64) / clip
                m[k] = beta1 * m[k] + (1 - beta1) * g
                v2[k] = beta2 * v2[k] + (1 - beta2) * g * g
                m_hat = m[k] / (1 - beta1 ** t)
                v_hat = v2[k] / (1 - beta2 ** t)
                u = m_hat / (np.sqrt(v_hat) + eps) + weight_decay * w[k]
                w_norm, u_norm = np.linalg.norm(w[k]), np.linalg.norm(u)
                trust = w_norm / u_norm if (weight_decay != 0 or use_nvlamb) and w_norm > 0 and u_norm > 0 else 1.0
                w[k] = w[k] - lr * trust * u
    return w


HAND_PARAMS = {
    "W": [[1.0, -2.0], [0.5, 3.0]],  # decayed weight matrix
    "Z": [0.0, 0.0, 0.0],            # decayed, starts at 0: ||w|| = 0, so phi = 1
    "b": [0.5, -0.25],               # no decay: trust ratio only with use_nvlamb
    "c": [1.0, 1.0],                 # no decay and a zero gradient: u = 0, ||u|| = 0, phi = 1, no change
}
HAND_GRADS = [
    # step 1: global norm sqrt(169 + 9 + 16) = 13.93 > 5, so gradients are divided by 13.93 / 5
    {"W": [[3.0, -4.0], [0.0, 12.0]], "Z": [1.0, 2.0, 2.0], "b": [4.0, 0.0], "c": [0.0, 0.0]},
    # step 2: global norm 0.63 < 5: no pre-normalization
    {"W": [[0.1, 0.2], [-0.3, 0.0]], "Z": [0.0, 0.1, 0.0], "b": [0.0, 0.5], "c": [0.0, 0.0]},
]
HAND_GROUPS = [(["W", "Z"], 0.1), (["b", "c"], 0.0)]


@pytest.mark.parametrize("fused", [True, False], ids=["fused_adam_kernel", "foreach"])
@pytest.mark.parametrize("use_nvlamb", [False, True], ids=["apex_default", "nvlamb"])
def test_lamb_matches_hand_computed_steps(fused, use_nvlamb):
    lr, max_grad_norm = 0.05, 5.0
    tensors = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in HAND_PARAMS.items()}
    groups = [{"params": [tensors[k] for k in names], "weight_decay": wd} for names, wd in HAND_GROUPS]
    opt = Lamb(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6, max_grad_norm=max_grad_norm, use_nvlamb=use_nvlamb,
               fused=fused)
    for grads in HAND_GRADS:
        for k, t in tensors.items():
            t.grad = torch.tensor(grads[k], dtype=torch.float64)
        opt.step()
    expected = numpy_lamb(HAND_PARAMS, HAND_GRADS, HAND_GROUPS, lr=lr, betas=(0.9, 0.999), eps=1e-6,
                          max_grad_norm=max_grad_norm, use_nvlamb=use_nvlamb)
    # The fused kernel takes the pre-normalization factor as float32 (AMP's loss-scale input).
    rtol = 1e-7 if fused else 1e-12
    for k, t in tensors.items():
        np.testing.assert_allclose(t.detach().numpy(), expected[k], rtol=rtol, atol=1e-12, err_msg=k)
        assert float(opt.state[t]["step"]) == 2.0
    assert torch.equal(tensors["c"].detach(), torch.tensor(HAND_PARAMS["c"], dtype=torch.float64))
    # The zero-initialised tensor moved by exactly lr * u at step 1 (phi = 1), so it is nonzero now.
    assert torch.count_nonzero(tensors["Z"]).item() == 3


def test_lamb_variants_differ_only_where_documented():
    """use_nvlamb changes the no-decay tensors' step and nothing else."""
    finals = {}
    for use_nvlamb in (False, True):
        finals[use_nvlamb] = numpy_lamb(HAND_PARAMS, HAND_GRADS, HAND_GROUPS, lr=0.05, betas=(0.9, 0.999),
                                        eps=1e-6, max_grad_norm=5.0, use_nvlamb=use_nvlamb)
    for k in ("W", "Z", "c"):
        np.testing.assert_array_equal(finals[False][k], finals[True][k])
    assert not np.allclose(finals[False]["b"], finals[True]["b"])


@pytest.mark.parametrize("fused", [None, False])
def test_lamb_single_step_literal_values(fused):
    # A one-element decayed tensor: u = g / (|g| + eps) + wd * w has the sign of w here, and
    # phi * u = ||w|| * sign(u), so the step is exactly lr * |w|: 2.0 -> 1.8.
    w = torch.tensor([2.0], dtype=torch.float64, requires_grad=True)
    # No decay, no trust ratio: a plain bias-corrected Adam step, lr * g / (|g| + eps).
    b = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
    opt = Lamb([{"params": [w], "weight_decay": 0.01}, {"params": [b], "weight_decay": 0.0}], lr=0.1, fused=fused)
    w.grad = torch.tensor([0.5], dtype=torch.float64)
    b.grad = torch.tensor([0.5], dtype=torch.float64)
    opt.step()
    assert w.item() == pytest.approx(1.8, abs=1e-15)
    assert b.item() == pytest.approx(1.0 - 0.1 * 0.5 / (0.5 + 1e-6), abs=1e-15)


def test_lamb_pre_normalization_is_global_and_can_be_turned_off():
    def run(max_grad_norm):
        a = torch.tensor([3.0, 4.0], requires_grad=True, dtype=torch.float64)
        opt = Lamb([a], lr=0.1, weight_decay=0.0, max_grad_norm=max_grad_norm)
        a.grad = torch.tensor([30.0, 40.0], dtype=torch.float64)
        opt.step()
        return a.grad.clone(), opt

    grad, _ = run(1.0)
    assert torch.allclose(grad, torch.tensor([0.6, 0.8], dtype=torch.float64))  # divided by 50 / 1
    grad, opt = run(None)
    assert torch.equal(grad, torch.tensor([30.0, 40.0], dtype=torch.float64))  # untouched
    assert opt.param_groups[0]["max_grad_norm"] is None


def test_lamb_skips_parameters_without_gradients_and_validates():
    a = torch.ones(3, requires_grad=True)
    b = torch.ones(3, requires_grad=True)
    opt = Lamb([a, b], lr=0.1)
    a.grad = torch.ones(3)
    opt.step()
    assert b not in opt.state and torch.equal(b, torch.ones(3)) and not torch.equal(a, torch.ones(3))
    opt.zero_grad()
    assert opt.step() is None  # no gradients at all: nothing happens

    with pytest.raises(ValueError, match="eps"):
        Lamb([a], eps=0.0)
    with pytest.raises(ValueError, match="betas"):
        Lamb([a], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="max_grad_norm"):
        Lamb([a], max_grad_norm=0.0)
    with pytest.raises(ValueError, match="share one max_grad_norm"):
        Lamb([{"params": [a], "max_grad_norm": 1.0}, {"params": [b], "max_grad_norm": 2.0}])
    sparse = torch.ones(3, requires_grad=True)
    opt = Lamb([sparse])
    sparse.grad = torch.ones(3).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()


def test_lamb_kernels_agree_on_a_real_model():
    """fused-Adam kernel vs foreach kernel in float32, over chunk boundaries and both group kinds."""
    model = tiny_bert()
    twin = copy.deepcopy(model)
    optimizers = [Lamb(parameter_groups(m, 0.01), lr=1e-2, fused=f) for m, f in ((model, True), (twin, False))]
    torch.manual_seed(1)
    for _ in range(3):
        for p, q in zip(model.parameters(), twin.parameters()):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        for o in optimizers:
            o.step()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_lamb_chunks_large_tensors(monkeypatch):
    monkeypatch.setattr(optim, "_CHUNK_ELEMENTS", 10)
    sizes = [4, 4, 3, 25, 1, 9]
    chunks = optim._chunks([torch.zeros(n) for n in sizes])
    assert [[t.numel() for t in c] for c in chunks] == [[4, 4], [3], [25], [1, 9]]
    # and the step is the same with tiny chunks as with one chunk
    params = [torch.randn(n, dtype=torch.float64, requires_grad=True) for n in sizes]
    twins = [p.detach().clone().requires_grad_() for p in params]
    small = Lamb(params, lr=0.1)
    for p in params:
        p.grad = torch.randn_like(p)
    small.step()
    monkeypatch.setattr(optim, "_CHUNK_ELEMENTS", 1 << 22)
    large = Lamb(twins, lr=0.1)
    for p, q in zip(params, twins):
        q.grad = p.grad.clone()
    large.step()
    for p, q in zip(params, twins):
        assert torch.equal(p, q)


# --------------------------------------------------------------------------------------------
# Checkpoint round trip
# --------------------------------------------------------------------------------------------

def toy_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 3))


def fixed_gradients(model: nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=generator).to(p.device)


def test_lamb_state_dict_round_trip_resumes_exactly():
    model = toy_model()
    opt = Lamb(parameter_groups(model, 0.01), lr=0.01, max_grad_norm=0.5, use_nvlamb=True)
    scheduler = build_lr_scheduler(opt, ScheduleConfig(warmup_ratio=0.2), total_steps=10)
    for seed in range(3):
        fixed_gradients(model, seed)
        opt.step()
        scheduler.step()

    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": scheduler.state_dict()},
               buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer)

    resumed = toy_model()
    resumed.load_state_dict(checkpoint["model"])
    # Built with other hyperparameters on purpose: the checkpoint's must win.
    resumed_opt = Lamb(parameter_groups(resumed, 0.5), lr=1.0, max_grad_norm=None, use_nvlamb=False)
    resumed_scheduler = build_lr_scheduler(resumed_opt, ScheduleConfig(warmup_ratio=0.2), total_steps=10)
    resumed_opt.load_state_dict(checkpoint["optimizer"])
    resumed_scheduler.load_state_dict(checkpoint["scheduler"])
    assert resumed_opt.param_groups[0]["max_grad_norm"] == 0.5 and resumed_opt.param_groups[0]["use_nvlamb"]

    for seed in range(3, 6):
        for m, o, s in ((model, opt, scheduler), (resumed, resumed_opt, resumed_scheduler)):
            fixed_gradients(m, seed)
            o.step()
            s.step()
        assert scheduler.get_last_lr() == resumed_scheduler.get_last_lr()
    for (name, p), q in zip(model.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), name
    for p, q in zip(model.parameters(), resumed.parameters()):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.state[p][key], resumed_opt.state[q][key])


def _lamb_snapshot(model: nn.Module, opt: Lamb) -> list[torch.Tensor]:
    return [t.clone() for p in model.parameters() for t in (p, *(opt.state[p][k] for k in sorted(opt.state[p])))]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA_MARKS)])
@pytest.mark.parametrize("use_nvlamb", [False, True])
def test_lamb_found_inf_skips_the_update_on_the_device_and_zero_changes_nothing(use_nvlamb, device):
    """A found_inf of 1 (the trainer's device-side veto) leaves weights, moments and step counts as they
    were, decayed tensors too; 0 gives the very update of a step without it."""
    model, reference = toy_model().to(device), toy_model().to(device)
    opt = Lamb(parameter_groups(model, 0.01), lr=0.01, max_grad_norm=1.0, use_nvlamb=use_nvlamb, fused=True)
    ref_opt = Lamb(parameter_groups(reference, 0.01), lr=0.01, max_grad_norm=1.0, use_nvlamb=use_nvlamb, fused=True)
    assert opt.skips_on_device()
    for seed in range(2):
        for m, o in ((model, opt), (reference, ref_opt)):
            fixed_gradients(m, seed)
            o.step()
    before = _lamb_snapshot(model, opt)
    fixed_gradients(model, 7)
    opt.found_inf = torch.ones((), dtype=torch.float32, device=device)
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, _lamb_snapshot(model, opt)))
    for m, o, found_inf in ((model, opt, torch.zeros((), dtype=torch.float32, device=device)),
                            (reference, ref_opt, None)):
        fixed_gradients(m, 8)
        o.found_inf = found_inf
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(_lamb_snapshot(model, opt), _lamb_snapshot(reference, ref_opt)))


def test_lamb_on_foreach_cannot_skip_on_the_device_and_says_so():
    from pretrain.divergence import StepGate

    fused, foreach = (Lamb(toy_model().parameters(), fused=kind) for kind in (True, False))
    assert StepGate(fused).vetoes_on_device() and not StepGate(foreach).vetoes_on_device()
    foreach.found_inf = torch.ones(())
    for p in foreach.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    with pytest.raises(RuntimeError, match="skips_on_device"):
        foreach.step()


def test_lamb_resumes_from_apex_fused_lamb_state_with_its_bias_correction():
    """apex FusedLAMB counts steps per group and keeps none per tensor; a run apex began (where it was
    the first choice) resumes on this class with the same step count, as if it had never stopped."""
    model, resumed = toy_model(), toy_model()
    opt = Lamb(parameter_groups(model, 0.01), lr=0.01)
    for seed in range(3):
        fixed_gradients(model, seed)
        opt.step()
    apex_layout = copy.deepcopy(opt.state_dict())  # its per-tensor dicts are the live ones
    for state in apex_layout["state"].values():
        del state["step"]
    for group in apex_layout["param_groups"]:
        group["step"] = 3
    resumed.load_state_dict(model.state_dict())
    resumed_opt = Lamb(parameter_groups(resumed, 0.01), lr=0.01)
    resumed_opt.load_state_dict(apex_layout)
    for m, o in ((model, opt), (resumed, resumed_opt)):
        fixed_gradients(m, 3)
        o.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), resumed.parameters()))


# --------------------------------------------------------------------------------------------
# DeepSpeed client optimizer (CPU)
# --------------------------------------------------------------------------------------------

DEEPSPEED_SCRIPT = textwrap.dedent("""
    import json, logging, sys
    import torch
    import deepspeed
    from torch import nn
    from biomed_lm.optim import Lamb, ScheduleConfig, build_lr_scheduler, parameter_groups

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 1))
    x = torch.randn(64, 8)
    y = x @ torch.randn(8, 1) + 0.1 * torch.randn(64, 1)
    optimizer = Lamb(parameter_groups(model, 0.01), lr=0.1)
    scheduler = build_lr_scheduler(optimizer, ScheduleConfig(warmup_ratio=0.1), total_steps=30)
    engine, ds_optimizer, _, ds_scheduler = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler,
        config={"train_micro_batch_size_per_gpu": 64, "gradient_accumulation_steps": 1,
                "gradient_clipping": 1.0, "steps_per_print": 10**9, "wall_clock_breakdown": False})
    losses, lrs = [], []
    for _ in range(30):
        loss = nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        lrs.append(ds_scheduler.get_last_lr()[0])
    print("RESULT " + json.dumps({"losses": losses, "lrs": lrs, "optimizer": type(ds_optimizer).__name__,
                                  "steps": int(optimizer.state[next(model.parameters())]["step"])}))
""")


def test_lamb_as_deepspeed_client_optimizer_on_cpu():
    result = run_single_rank_deepspeed(DEEPSPEED_SCRIPT)
    assert result["optimizer"] == "Lamb" and result["steps"] == 30
    losses, lrs = result["losses"], result["lrs"]
    assert losses[-1] < 0.25 * losses[0]
    assert max(lrs) == pytest.approx(0.1) and lrs[-1] == 0.0  # DeepSpeed stepped our schedule to its end


# --------------------------------------------------------------------------------------------
# Choosing an implementation
# --------------------------------------------------------------------------------------------

def test_build_optimizer_on_cpu_uses_paper_defaults():
    model = toy_model()
    built = build_optimizer("adamw", parameter_groups(model, PAPER_WEIGHT_DECAY), device="cpu")
    assert built.implementation == "torch.optim.AdamW(fused=True)" and built.fallbacks == ()
    opt = built.optimizer
    assert isinstance(opt, torch.optim.AdamW)
    assert (opt.defaults["lr"], opt.defaults["betas"], opt.defaults["eps"]) == (PAPER_PEAK_LR, PAPER_BETAS, PAPER_EPS)
    assert [(g["name"], g["weight_decay"]) for g in opt.param_groups] == [("decay", 0.01), ("no_decay", 0.0)]

    plain = build_optimizer("AdamW", model.parameters(), device="cpu", prefer_fused=False)
    assert plain.implementation == "torch.optim.AdamW(foreach=True)" and plain.optimizer.defaults["foreach"]

    lamb = build_optimizer("lamb", parameter_groups(model), lr=1e-3, device="cpu", max_grad_norm=None)
    assert lamb.implementation == "biomed_lm.optim.Lamb(kernel=fused_adam)"
    assert isinstance(lamb.optimizer, Lamb) and lamb.optimizer.param_groups[0]["max_grad_norm"] is None
    assert build_optimizer("lamb", model.parameters(), prefer_fused=False).implementation == \
        "biomed_lm.optim.Lamb(kernel=foreach)"


def test_build_optimizer_errors():
    model = toy_model()
    with pytest.raises(ValueError, match="unknown optimizer"):
        build_optimizer("sgd", model.parameters())
    with pytest.raises(ValueError, match="move"):
        build_optimizer("adamw", model.parameters(), device="cuda")
    with pytest.raises(ValueError, match="no parameters"):
        build_optimizer("adamw", [])


def test_cuda_preference_order_never_substitutes_deepspeed_fused_lamb():
    def labels(name, prefer_fused=True):
        return [c.label for c in optim._optimizer_candidates(
            name, lambda: [], lr=1e-3, betas=PAPER_BETAS, eps=PAPER_EPS, weight_decay=0.01, device_type="cuda",
            prefer_fused=prefer_fused, max_grad_norm=1.0, use_nvlamb=False)]

    # The kernels that skip a rejected update on the device (found_inf) first; DeepSpeed's and apex's after
    assert labels("adamw") == ["torch.optim.AdamW(fused=True)", "deepspeed.ops.adam.FusedAdam",
                               "apex.optimizers.FusedAdam", "torch.optim.AdamW(foreach=True)"]
    assert labels("lamb") == ["biomed_lm.optim.Lamb(kernel=fused_adam)", "apex.optimizers.FusedLAMB",
                              "biomed_lm.optim.Lamb(kernel=foreach)"]
    assert labels("adamw", prefer_fused=False) == ["torch.optim.AdamW(foreach=True)"]


def test_fallbacks_are_logged_and_returned(caplog):
    def missing():
        raise ImportError("No module named 'apex'")

    def broken():
        raise RuntimeError("Error building extension 'fused_adam'\nlong compiler log")

    def works():
        return torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)

    candidates = [optim._Candidate("apex", missing), optim._Candidate("deepspeed", broken),
                  optim._Candidate("torch", works)]
    with caplog.at_level(logging.INFO, logger="biomed_lm.optim"):
        built = optim._first_that_builds(candidates)
    assert built.implementation == "torch"
    assert built.fallbacks == ("apex: ImportError: No module named 'apex'",
                               "deepspeed: RuntimeError: Error building extension 'fused_adam'")
    assert "apex" in caplog.text and "could not be built" in caplog.text and "optimizer: torch" in caplog.text
    with pytest.raises(RuntimeError):
        optim._first_that_builds([optim._Candidate("only", broken)])


# --------------------------------------------------------------------------------------------
# Learning-rate schedules
# --------------------------------------------------------------------------------------------

def test_slanted_triangular_values_at_fractions_of_training():
    total = 62_500  # the paper's run: warm-up over 6,250 steps
    assert warmup_steps(total, 0.1) == 6_250
    lr = [learning_rate_at(s, ScheduleConfig(), total, PAPER_PEAK_LR) for s in (0, 3_125, 6_250, 34_375, 62_500)]
    assert lr == pytest.approx([0.0, 3e-4, 6e-4, 3e-4, 0.0], abs=1e-15)
    assert slanted_triangular(6_250, total) == 1.0
    assert slanted_triangular(62_499, total) == pytest.approx(1 / 56_250)
    assert slanted_triangular(70_000, total) == 0.0


def test_schedules_are_monotonic_in_each_piece():
    total, w = 1_000, warmup_steps(1_000, 0.1)
    for fn in (lambda s: slanted_triangular(s, total), lambda s: polynomial_decay(s, total, 0.1, 2.0, 0.1),
               lambda s: polynomial_decay(s, total, 0.1, 0.5), lambda s: constant_with_warmup(s, total)):
        values = [fn(s) for s in range(total + 1)]
        assert all(a < b for a, b in zip(values[:w], values[1:w + 1]))  # strictly up to the peak
        assert all(a >= b for a, b in zip(values[w:], values[w + 1:]))  # never up afterwards
        assert values[w] == 1.0


def test_polynomial_from_start_is_nvidias_schedule():
    """NVIDIA's PolyWarmUpScheduler: linear warm-up, then (1 - step / total) ** degree of the peak, so the
    rate drops at the warm-up's end; its phase 1 (7,038 steps, warm-up 0.2843, degree 0.5)."""
    total, ratio = 7_038, 0.2843
    w = warmup_steps(total, ratio)
    assert [polynomial_from_start(s, total, ratio, 0.5) for s in (0, w // 2)] == [0.0, (w // 2) / w]
    for step in (w, 4_000, total - 1):
        assert polynomial_from_start(step, total, ratio, 0.5) == pytest.approx((1 - step / total) ** 0.5, rel=1e-12)
    assert polynomial_from_start(w, total, ratio, 0.5) == pytest.approx(0.846, abs=1e-3)
    assert polynomial_from_start(total, total, ratio, 0.5) == 0.0
    assert polynomial_from_start(total // 2 + w // 2, total, ratio, 0.5) < polynomial_decay(total // 2 + w // 2, total,
                                                                                          ratio, 0.5)
    config = ScheduleConfig("polynomial_from_start", warmup_ratio=ratio, lr_power=0.5, end_lr=6e-4)
    assert learning_rate_at(total, config, total, 6e-3) == pytest.approx(6e-4)
    assert learning_rate_at(4_000, config, total, 6e-3) == pytest.approx(6e-4 + 5.4e-3 * (1 - 4_000 / total) ** 0.5)


def test_the_nvidia_lamb_recipes_run_nvidias_schedule():
    import yaml

    for phase in (1, 2):
        recipe = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "pretrain"
                                 / f"nvidia_lamb_phase{phase}.yaml").read_text())
        assert (recipe["schedule"], recipe["polynomial_power"], recipe["optimizer"]) == \
            ("polynomial_from_start", 0.5, "lamb")


def test_schedule_edge_cases():
    # No warm-up: the first step runs at the peak.
    assert warmup_steps(100, 0.0) == 0
    assert slanted_triangular(0, 100, 0.0) == 1.0 and slanted_triangular(50, 100, 0.0) == 0.5
    # One step in all: it runs at the peak (not at 0), whatever the warm-up ratio.
    for ratio in (0.0, 0.1, 0.5, 0.99):
        assert warmup_steps(1, ratio) == 0
        assert slanted_triangular(0, 1, ratio) == 1.0 and slanted_triangular(1, 1, ratio) == 0.0
        assert polynomial_decay(0, 1, ratio, 2.0) == 1.0 and constant_with_warmup(0, 1, ratio) == 1.0
    assert warmup_steps(3, 0.5) == 2 and warmup_steps(10, 0.95) == 9  # half up; capped at total - 1
    assert polynomial_decay(100, 100, 0.1, 2.0, 0.25) == 0.25 and polynomial_decay(500, 100, end_factor=0.25) == 0.25
    assert polynomial_decay(55, 100, 0.1, 2.0) == pytest.approx(0.25)  # half-way down the decay, squared
    assert constant_with_warmup(10_000, 100) == 1.0
    for bad in (lambda: slanted_triangular(-1, 10), lambda: slanted_triangular(0, 0),
                lambda: slanted_triangular(0, 10, 1.0), lambda: polynomial_decay(0, 10, power=0.0),
                lambda: polynomial_decay(0, 10, end_factor=1.5), lambda: ScheduleConfig(lr_schedule="cosine")):
        with pytest.raises(ValueError):
            bad()
    with pytest.raises(TypeError):
        slanted_triangular(1.5, 10)


@settings(max_examples=300, deadline=None)
@given(total=st.integers(1, 200_000), ratio=st.floats(0.0, 0.99), position=st.floats(0.0, 1.2),
       power=st.floats(0.1, 4.0), end=st.floats(0.0, 1.0))
def test_schedule_properties(total, ratio, position, power, end):
    step = int(position * total)
    w = warmup_steps(total, ratio)
    assert 0 <= w < total
    for factor in (slanted_triangular(step, total, ratio), polynomial_decay(step, total, ratio, power, end),
                   constant_with_warmup(step, total, ratio)):
        assert 0.0 <= factor <= 1.0
    assert slanted_triangular(w, total, ratio) == 1.0
    assert polynomial_decay(w, total, ratio, power, end) == 1.0
    assert slanted_triangular(total, total, ratio) == 0.0
    assert polynomial_decay(total, total, ratio, power, end) == end
    assert polynomial_decay(step, total, ratio, power, end) >= end or step < w
    if step < w:
        assert slanted_triangular(step, total, ratio) == step / w


@settings(max_examples=100, deadline=None)
@given(total=st.integers(1, 5_000), ratio=st.floats(0.0, 0.99), power=st.floats(0.1, 4.0),
       end_lr=st.floats(0.0, 5.9e-4))  # HF insists on end < peak
def test_schedules_match_huggingface(total, ratio, power, end_lr):
    from transformers import (get_constant_schedule_with_warmup, get_linear_schedule_with_warmup,
                              get_polynomial_decay_schedule_with_warmup)

    w = warmup_steps(total, ratio)
    steps = sorted({0, max(w - 1, 0), w, (w + total) // 2, total - 1, total})
    pairs = [(ScheduleConfig("slanted_triangular", ratio),
              get_linear_schedule_with_warmup, dict(num_warmup_steps=w, num_training_steps=total)),
             (ScheduleConfig("polynomial", ratio, power, end_lr),
              get_polynomial_decay_schedule_with_warmup,
              dict(num_warmup_steps=w, num_training_steps=total, lr_end=end_lr, power=power)),
             (ScheduleConfig("constant_with_warmup", ratio), get_constant_schedule_with_warmup,
              dict(num_warmup_steps=w))]
    for config, hf, kwargs in pairs:
        reference = hf(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=6e-4), **kwargs).lr_lambdas[0]
        for s in steps:
            assert learning_rate_at(s, config, total, 6e-4) == pytest.approx(6e-4 * reference(s), rel=1e-9,
                                                                             abs=1e-15)


def test_lambda_lr_scheduler_drives_every_group():
    params = [torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)]
    opt = torch.optim.AdamW([{"params": params[:1]}, {"params": params[1:], "lr": 3e-4}], lr=6e-4)
    scheduler = build_lr_scheduler(opt, ScheduleConfig(), total_steps=20)
    seen = []
    for _ in range(20):
        seen.append([g["lr"] for g in opt.param_groups])
        opt.step()
        scheduler.step()
    assert seen[0] == [0.0, 0.0]
    assert seen[2] == pytest.approx([6e-4, 3e-4])  # warm-up of round(0.1 * 20) = 2 steps
    assert seen[11] == pytest.approx([3e-4, 1.5e-4])
    assert [g["lr"] for g in opt.param_groups] == [0.0, 0.0]  # after the last step

    poly = ScheduleConfig(lr_schedule="polynomial", warmup_ratio=0.0, lr_power=1.0, end_lr=1e-4)
    opt = torch.optim.AdamW(params, lr=6e-4)
    scheduler = build_lr_scheduler(opt, poly, total_steps=10)
    assert schedule_factor(10, poly, 10, end_factor=1e-4 / 6e-4) == pytest.approx(1 / 6)
    for _ in range(10):
        opt.step()
        scheduler.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-4)
    with pytest.raises(ValueError, match="end_lr"):
        build_lr_scheduler(opt, ScheduleConfig(lr_schedule="polynomial", end_lr=1e-2), total_steps=10)


# --------------------------------------------------------------------------------------------
# Fused (CUDA) implementations against the CPU ones; run where a GPU is
# --------------------------------------------------------------------------------------------

def run_steps(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], grads: list[list[torch.Tensor]]) -> None:
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.to(p.device).clone()
        optimizer.step()


def cuda_problem(seed: int = 0, steps: int = 5):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(64, 32), (32,), (32,), (1000, 16), (7,), (3, 5, 2)]
    initial = [torch.randn(s, generator=generator) * 0.05 for s in shapes]
    grads = [[torch.randn(s, generator=generator) for s in shapes] for _ in range(steps)]
    groups_of = lambda ps: [{"name": "decay", "params": [ps[0], ps[3], ps[5]], "weight_decay": 0.01},
                            {"name": "no_decay", "params": [ps[1], ps[2], ps[4]], "weight_decay": 0.0}]
    return initial, grads, groups_of


@requires_cuda
@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_fused_cuda_optimizer_matches_cpu(name):
    initial, grads, groups_of = cuda_problem()
    cuda_params = [t.clone().cuda().requires_grad_() for t in initial]
    cpu_params = [t.clone().requires_grad_() for t in initial]
    built = build_optimizer(name, groups_of(cuda_params), lr=1e-2, device="cuda")
    if name == "adamw":
        reference = torch.optim.AdamW(groups_of(cpu_params), lr=1e-2, betas=PAPER_BETAS, eps=PAPER_EPS, foreach=True)
    else:
        reference = Lamb(groups_of(cpu_params), lr=1e-2, fused=False)
    run_steps(built.optimizer, cuda_params, grads)
    run_steps(reference, cpu_params, grads)
    for p, q in zip(cuda_params, cpu_params):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6,
                                   msg=f"{built.implementation} vs CPU")


@requires_cuda
@pytest.mark.parametrize("fused", [True, False])
def test_our_lamb_on_cuda_matches_cpu(fused):
    initial, grads, groups_of = cuda_problem(seed=1)
    cuda_params = [t.clone().cuda().requires_grad_() for t in initial]
    cpu_params = [t.clone().requires_grad_() for t in initial]
    run_steps(Lamb(groups_of(cuda_params), lr=1e-2, max_grad_norm=2.0, fused=fused), cuda_params, grads)
    run_steps(Lamb(groups_of(cpu_params), lr=1e-2, max_grad_norm=2.0, fused=False), cpu_params, grads)
    for p, q in zip(cuda_params, cpu_params):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)


@requires_cuda
@pytest.mark.parametrize("use_nvlamb", [False, True])
def test_apex_fused_lamb_matches_ours(use_nvlamb):
    apex_optimizers = pytest.importorskip("apex.optimizers")
    initial, grads, groups_of = cuda_problem(seed=2)
    apex_params = [t.clone().cuda().requires_grad_() for t in initial]
    our_params = [t.clone().cuda().requires_grad_() for t in initial]
    try:
        apex_lamb = apex_optimizers.FusedLAMB(groups_of(apex_params), lr=1e-2, max_grad_norm=1.0,
                                              use_nvlamb=use_nvlamb)
    except RuntimeError as error:  # apex installed without its CUDA extensions
        pytest.skip(f"apex FusedLAMB unavailable: {error}")
    run_steps(apex_lamb, apex_params, grads)
    run_steps(Lamb(groups_of(our_params), lr=1e-2, max_grad_norm=1.0, use_nvlamb=use_nvlamb), our_params, grads)
    for p, q in zip(apex_params, our_params):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@requires_cuda
def test_deepspeed_fused_adam_matches_torch_adamw():
    adam = pytest.importorskip("deepspeed.ops.adam")
    initial, grads, groups_of = cuda_problem(seed=3)
    ds_params = [t.clone().cuda().requires_grad_() for t in initial]
    torch_params = [t.clone().cuda().requires_grad_() for t in initial]
    try:
        ds_adam = adam.FusedAdam(groups_of(ds_params), lr=1e-2, eps=PAPER_EPS, adam_w_mode=True)
    except Exception as error:  # the op is JIT-built; no compiler or toolkit means no FusedAdam
        pytest.skip(f"DeepSpeed FusedAdam unavailable: {type(error).__name__}: {error}")
    run_steps(ds_adam, ds_params, grads)
    run_steps(torch.optim.AdamW(groups_of(torch_params), lr=1e-2, eps=PAPER_EPS, fused=True), torch_params, grads)
    for p, q in zip(ds_params, torch_params):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
