"""The GPU path: tests that need CUDA carry the ``gpu`` marker and skip cleanly without it.

On a GPU machine: ``.venv/bin/python -m pytest -m gpu tests/test_gpu.py -v`` (the README names it).
What runs on CPU of the same code — every CPU kernel against eager, the padded/unpadded equivalence
in fp32, the compiled blocks — is tests/test_unpadded.py.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch

from biomed_lm.pretrain.attention import KERNELS, attend, why_not
from biomed_lm.pretrain.modeling import PretrainingModel
from tests.conftest import REPO, free_port
from tests.test_unpadded import _eager_reference, losses_and_grads, masked_batch, tiny_bert

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

BF16_TOLERANCE = 2e-2  # bf16 keeps 8 bits of mantissa: about 4e-3 relative per rounding


def _sequences(lengths: list[int]):
    from biomed_lm.pretrain.attention import Sequences

    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return Sequences.from_offsets(offsets, "cuda")


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_each_cuda_kernel_matches_eager_attention_in_bf16(kernel):
    reason = why_not(kernel, torch.device("cuda"), torch.bfloat16, 0.0)
    if reason is not None:
        pytest.skip(f"{kernel} {reason}")
    seqs = _sequences([128, 1, 77, 512, 300])
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(seqs.offsets[-1], 12, 64, generator=g, device="cuda", dtype=torch.bfloat16)
               .requires_grad_() for _ in range(3))
    out = attend(kernel, q, k, v, seqs, 0.0)
    reference = _eager_reference(q.float(), k.float(), v.float(), seqs)
    assert torch.allclose(out.float(), reference, atol=BF16_TOLERANCE, rtol=BF16_TOLERANCE)
    grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    expected = torch.autograd.grad(reference.square().sum(), (q, k, v))
    for got, want in zip(grads, expected):
        assert torch.allclose(got.float(), want.float(), atol=0.1, rtol=BF16_TOLERANCE)


@pytest.mark.parametrize("kernel", ["varlen", "flash_attn"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_flash_kernels_take_the_packed_projections_views_as_its_copies(kernel, dropout_p):
    """q, k and v as ``unpadded.project_qkv`` hands them over, strided views of one (tokens, 3, heads,
    head size) product, give what contiguous copies of them give: the same output, dropout included (the
    generator reset before each), and the same gradients up to the order of the backward's atomic adds
    (flash's dq accumulates across key blocks nondeterministically): a kernel reading the wrong rows or
    heads would be far off."""
    reason = why_not(kernel, torch.device("cuda"), torch.bfloat16, dropout_p)
    if reason is not None:
        pytest.skip(f"{kernel} {reason}")
    seqs = _sequences([128, 1, 77, 300])
    g = torch.Generator(device="cuda").manual_seed(0)
    packed = torch.randn(seqs.offsets[-1], 3, 12, 64, generator=g, device="cuda", dtype=torch.bfloat16)
    grad_out = torch.randn(seqs.offsets[-1], 12, 64, generator=g, device="cuda", dtype=torch.bfloat16)

    def run(contiguous: bool) -> tuple[torch.Tensor, torch.Tensor]:
        source = packed.clone().requires_grad_()
        q, k, v = source.unbind(1)
        if contiguous:
            q, k, v = (t.contiguous() for t in (q, k, v))
        torch.cuda.manual_seed(7)
        out = attend(kernel, q, k, v, seqs, dropout_p)
        (grad,) = torch.autograd.grad(out, source, grad_out)
        return out, grad

    (out, grad), (want_out, want_grad) = run(contiguous=False), run(contiguous=True)
    assert torch.equal(out, want_out)
    torch.testing.assert_close(grad, want_grad, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("kernel", [name for name, spec in KERNELS.items() if spec.dropout])
def test_each_cuda_kernel_with_attention_dropout_drops_what_its_backward_replays(kernel):
    """Attention dropout inside a kernel: given the random numbers the forward drew, its output is
    linear in the values, out(V) = A V, so the values' gradient A^T g must satisfy
    <g, out(V2) - out(V1)> = <A^T g, V2 - V1> with the generator reset before each forward: a backward
    that replayed other random numbers than the forward's fails it. Averaged over draws the output is
    the output without dropout (inverted dropout keeps the expectation)."""
    reason = why_not(kernel, torch.device("cuda"), torch.bfloat16, 0.1)
    if reason is not None:
        pytest.skip(f"{kernel} {reason}")
    seqs = _sequences([128, 1, 77, 300])
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, other_v, grad_out = (torch.randn(seqs.offsets[-1], 4, 64, generator=g, device="cuda",
                                              dtype=torch.bfloat16) for _ in range(5))

    def seeded(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The same random numbers each call; the values always need a gradient, so SDPA picks the
        same backend each time (its choice can depend on it, and backends draw dropout differently)."""
        values = values.detach().requires_grad_()
        torch.cuda.manual_seed(7)
        return values, attend(kernel, q, k, values, seqs, 0.1)

    v, out = seeded(v)
    (v_grad,) = torch.autograd.grad(out, v, grad_out)
    assert torch.equal(seeded(v)[1].detach(), out.detach()), "the same seed drew other dropout"
    other_out = seeded(other_v)[1].detach()
    change = float((grad_out.double() * (other_out.double() - out.detach().double())).sum())
    predicted = float((v_grad.double() * (other_v.double() - v.detach().double())).sum())
    assert abs(change - predicted) < 0.02 * (abs(change) + abs(predicted)), \
        f"the backward replayed other dropout than the forward: <g, out(V2) - out(V1)> {change:.4f}, " \
        f"<dV, V2 - V1> {predicted:.4f}"
    plain = attend(kernel, q, k, v.detach(), seqs, 0.0).float()
    assert not torch.equal(out.detach().float(), plain), "nothing was dropped"
    mean = sum(attend(kernel, q, k, v.detach(), seqs, 0.1).float() for _ in range(400)) / 400
    error = float((mean - plain).norm() / plain.norm())
    assert error < 0.05, f"400 draws average {error:.4f} (relative) away from the output without dropout"


def test_unpadded_equals_padded_loss_under_bf16_autocast():
    bert = tiny_bert().cuda()
    batch = {k: v.cuda() for k, v in masked_batch([100, 128, 31, 64], whole_word=True).items()}
    results = []
    for attention in ("hf_sdpa", "sdpa_padded", "sdpa_nested", "sdpa_loop"):
        model = PretrainingModel(copy.deepcopy(bert), attention=attention)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            results.append(losses_and_grads(model, batch, train_pair=True)[0])
    for other in results[1:]:
        for key in results[0]:
            assert abs(results[0][key] - other[key]) < 5e-2, (results[0], other)


@pytest.mark.parametrize("kernel, mlm_loss, scope", [
    ("sdpa_padded", "dense", "layers"), ("varlen", "dense", "layers"), ("flash_attn", "dense", "layers"),
    ("flex", "dense", "layers"), ("sdpa_padded", "chunked", "layers"), ("sdpa_padded", "dense", "whole")])
def test_the_forward_compiled_with_inductor_equals_the_padded_model(kernel, mlm_loss, scope):
    """What the trainer runs on a GPU: the layout built on the host, moved, and the forward compiled
    by inductor (by layer, or whole) — a fixed number of graphs over micro-batches of changing sizes,
    the padded loss in bf16."""
    from biomed_lm.pretrain.compiling import compiled_graphs

    reason = why_not(kernel, torch.device("cuda"), torch.bfloat16, 0.0, head_size=16)
    if reason is not None:
        pytest.skip(f"{kernel} {reason}")
    torch._dynamo.reset()
    bert = tiny_bert(hidden_size=64).cuda()  # heads of 16: FlexAttention's CUDA kernels take none narrower
    reference = PretrainingModel(copy.deepcopy(bert), attention="hf_sdpa")
    compiled = PretrainingModel(copy.deepcopy(bert), attention=kernel, pad_to_multiple_of=64, mlm_loss=mlm_loss)
    compiled.compile_losses(scope=scope)
    before = compiled_graphs()
    for seed, lengths in enumerate(([100, 128, 31, 64], [7, 128, 128], [50, 90, 3, 3, 120])):
        batch = masked_batch(lengths, whole_word=True, seed=seed)
        padded = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids", "labels")}
        labels = batch["next_sentence_label"].cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            want = reference(**{k: v.cuda() for k, v in padded.items()}, next_sentence_label=labels).loss
            got = compiled(prepared=compiled.prepare(**padded).to("cuda"), next_sentence_label=labels).loss
        assert abs(float(got) - float(want)) <= BF16_TOLERANCE * abs(float(want))
    assert compiled_graphs() - before <= {"whole": 2, "layers": 6}[scope]  # per region: at most one recompile


def _train_with_accumulation(model: PretrainingModel, micro_batches: list[list[dict]]) -> list[float]:
    """Fused AdamW steps over ``micro_batches`` (each step a list of prepared micro-batches, gradients
    accumulated), as the trainer runs them: begin_micro_batch, forward and backward each, one update."""
    from biomed_lm.optim import build_optimizer

    optimizer = build_optimizer("adamw", model.parameters(), lr=1e-3, device="cuda").optimizer
    losses = []
    for step in micro_batches:
        total = torch.zeros((), device="cuda")
        for batch in step:
            model.begin_micro_batch(accumulating=len(step) > 1)
            out = model(prepared=batch["prepared"], next_sentence_label=batch["labels"])
            out.loss.backward()
            total = total + out.loss.detach()  # summed before the next replay can overwrite the output
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)
    return [float(loss) for loss in losses]


def _recorded_cuda_graphs() -> int:
    """CUDA graphs inductor's graph trees hold on this device (every node of every recorded path)."""
    from torch._inductor import cudagraph_trees

    manager = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)

    def count(children) -> int:
        return sum(1 + count(node.children) for nodes in children.values() for node in nodes)
    return 0 if manager is None else count(manager.roots)


@pytest.mark.parametrize("scope, graphs_per_micro_batch", [("layers", 2 * (3 + 2)), ("whole", 2)])
def test_cuda_graphs_train_as_the_compiled_forward_does(scope, graphs_per_micro_batch):
    """--compile-mode reduce-overhead: the compiled regions replayed as CUDA graphs (each layer its own
    node of the recorded path), three micro-batches of three shapes accumulated a step in a random
    order: the same losses and weights, fp32, as the same compiled model without graphs, and one
    recorded path per shape (each micro-batch is a generation of the trees; were a step one, each
    order of shapes would be recorded anew)."""
    torch._dynamo.reset()
    bert = tiny_bert(layers=3).cuda()
    shapes = ([100, 128, 31, 64], [7, 128, 128], [64, 64])  # 323, 263 and 128 tokens: buckets of 64 apart
    orders = torch.stack([torch.randperm(3, generator=torch.Generator().manual_seed(step)) for step in range(8)])
    models = {}
    for mode in (None, "reduce-overhead"):
        model = PretrainingModel(copy.deepcopy(bert), attention="sdpa_padded", pad_to_multiple_of=64)
        model.compile_losses(mode=mode, scope=scope)
        models[mode] = model
    steps = {}
    for mode, model in models.items():
        batches = []
        for seed, lengths in enumerate(shapes):
            batch = masked_batch(lengths, whole_word=True, seed=seed)
            padded = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids", "labels")}
            batches.append({"prepared": model.prepare(**padded).to("cuda"),
                            "labels": batch["next_sentence_label"].cuda()})
        steps[mode] = [[batches[i] for i in order.tolist()] for order in orders]
    plain = _train_with_accumulation(models[None], steps[None])
    graphed = _train_with_accumulation(models["reduce-overhead"], steps["reduce-overhead"])
    assert models["reduce-overhead"].masked_multiple_of == 256
    assert graphed == pytest.approx(plain, rel=1e-4)
    for (name, want), got in zip(models[None].named_parameters(), models["reduce-overhead"].parameters()):
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), name
    assert 0 < _recorded_cuda_graphs() <= len(shapes) * graphs_per_micro_batch


def test_fused_optimizer_step_matches_the_cpu_implementation():
    from biomed_lm.optim import build_optimizer

    torch.manual_seed(0)
    params = [torch.randn(256, 256), torch.randn(256)]
    grads = [torch.randn_like(p) for p in params]
    after = {}
    for device in ("cpu", "cuda"):
        tensors = [p.clone().to(device).requires_grad_() for p in params]
        for tensor, grad in zip(tensors, grads):
            tensor.grad = grad.to(device)
        built = build_optimizer("adamw", tensors, lr=1e-3, device=device)
        built.optimizer.step()
        after[device] = ([t.detach().cpu() for t in tensors], built.implementation)
    assert "fused" in after["cuda"][1].lower() or "Fused" in after["cuda"][1]
    for cpu, cuda in zip(after["cpu"][0], after["cuda"][0]):
        assert torch.allclose(cpu, cuda, atol=1e-6)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_gpu_deepspeed_pretraining_steps(tmp_path):
    from tests.pretrain_runs import deepspeed_launcher, make_pretraining_inputs, pretrain_args

    launcher = deepspeed_launcher()
    if launcher is None:
        pytest.skip("the deepspeed launcher is not installed")
    inputs = make_pretraining_inputs(tmp_path / "inputs")
    args = pretrain_args(inputs, tmp_path / "run", "--precision", "bf16", "--max-steps", "4")
    done = subprocess.run([launcher, "--num_gpus", "2", "--master_port", str(free_port()),
                           str(REPO / "launch" / "pretrain.py"), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "run" / "model" / "model.safetensors").is_file()


def test_bench_gpu_runs_on_the_gpu(tmp_path):
    script = REPO / "benchmarks" / "bench_gpu.py"
    if not script.is_file():
        pytest.skip("benchmarks/bench_gpu.py is not there yet")
    done = subprocess.run([sys.executable, str(script), "--quick", "--out", str(tmp_path / "gpu.json")], cwd=REPO,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
