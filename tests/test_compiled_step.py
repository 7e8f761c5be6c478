"""The step as the GPU runs it, checked on CPU: the forward compiled (by layer, or whole as one
region) equals the padded reference (loss and every gradient within 1e-5, fp32) with a bounded number of graphs over
micro-batches of changing shapes, and nothing in a micro-batch's forward and backward makes the
host wait for the device (the layout is built on the host, by the loader)."""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_syncs import host_syncs, paused  # noqa: E402
from pretrain_runs import pretrain_args, run, with_option  # noqa: E402
from test_unpadded import assert_same, masked_batch, tiny_bert  # noqa: E402

from biomed_lm.pretrain.compiling import compiled_graphs  # noqa: E402
from biomed_lm.pretrain.modeling import MASKED_BUCKET, PretrainingModel  # noqa: E402

PADDED_KEYS = ("input_ids", "attention_mask", "token_type_ids", "labels")
# Micro-batches of changing sizes and counts: a per-shape graph would show as one graph each.
SHAPES = ([37, 64, 11], [50, 20, 33, 9], [64, 64], [12, 40, 40, 5, 7], [3, 64, 17])


def losses_and_grads(model: PretrainingModel, batch: dict, **inputs) -> tuple[dict[str, float], dict]:
    model.zero_grad()
    out = model(**inputs, next_sentence_label=batch["next_sentence_label"])
    out.loss.backward()
    losses = {"loss": out.loss.item(), "mlm": out.mlm_loss.item(), "pair": out.pair_loss.item()}
    return losses, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


# scope -> graphs over all of SHAPES: the whole forward is one; by layer, the embeddings, one graph
# that both of tiny_bert's layers run through, and the heads.
# (scope, layers, layers per graph, graphs): the whole forward; by layer (embeddings, a layer, heads);
# three layers in blocks of two (a block of two and a block of one, each its own graph)
@pytest.mark.parametrize("scope, layers, layers_per_graph, graphs",
                         [("whole", 2, 1, 1), ("layers", 2, 1, 3), ("layers", 3, 2, 4)])
def test_the_compiled_forward_equals_the_padded_model_with_a_fixed_number_of_graphs(scope, layers, layers_per_graph,
                                                                                     graphs):
    """aot_eager traces exactly what inductor would compile (the same graphs, the same guards)
    without generating kernels, which on CPU takes minutes."""
    torch._dynamo.reset()
    bert = tiny_bert(layers=layers)  # more than one layer: else one graph per layer would pass unnoticed
    reference = PretrainingModel(copy.deepcopy(bert), attention="hf_sdpa")
    compiled = PretrainingModel(copy.deepcopy(bert), attention="sdpa_padded", pad_to_multiple_of=32)
    compiled.compile_losses(backend="aot_eager", scope=scope, layers_per_graph=layers_per_graph)
    before = compiled_graphs()
    for seed, lengths in enumerate(SHAPES):
        batch = masked_batch(lengths, whole_word=True, seed=seed)
        padded = {key: batch[key] for key in PADDED_KEYS}
        assert_same(losses_and_grads(reference, batch, **padded),
                    losses_and_grads(compiled, batch, prepared=compiled.prepare(**padded)))
    assert compiled_graphs() - before == graphs
    assert "_compiled_regions" not in dict(compiled.named_modules())  # the state dict is transformers' own
    assert set(compiled.state_dict()) == {f"hf_model.{name}" for name in bert.state_dict()}


def test_compiling_refuses_what_it_cannot_hold_in_one_graph():
    from biomed_lm.pretrain.config import PretrainConfigError

    model = PretrainingModel(tiny_bert(), attention="sdpa_padded")
    with pytest.raises(PretrainConfigError, match="compile scope 'regions'"):
        model.compile_losses(backend="aot_eager", scope="regions")
    with pytest.raises(PretrainConfigError, match="layers_per_graph must be at least 1"):
        model.compile_losses(backend="aot_eager", layers_per_graph=0)
    model.mlm_loss = "liger"
    with pytest.raises(PretrainConfigError, match="breaks the compiled graph"):
        model.compile_losses(backend="aot_eager")


def test_under_cuda_graphs_the_masked_count_is_bucketed_and_changes_nothing():
    """compile_losses(mode="reduce-overhead") rounds the masked positions up (one CUDA graph per
    shape); the padding rows are ignored: same loss and gradients as the unbucketed layout."""
    from biomed_lm.pretrain.layout import Layout

    bert = tiny_bert()
    batch = masked_batch([37, 64, 11], whole_word=True)
    padded = {key: batch[key] for key in PADDED_KEYS}
    plain = PretrainingModel(copy.deepcopy(bert), attention="sdpa_padded", pad_to_multiple_of=32)
    bucketed_layout = Layout(True, 32, 0, masked_multiple_of=64)
    prepared = bucketed_layout(*padded.values())
    assert prepared.masked_positions.numel() == 64 and int((prepared.masked_labels != -100).sum()) < 64
    assert_same(losses_and_grads(plain, batch, prepared=plain.prepare(**padded)),
                losses_and_grads(plain, batch, prepared=prepared))


@pytest.mark.parametrize("mode, graphs", [("reduce-overhead", True), ("max-autotune", True),
                                         ("max-autotune-no-cudagraphs", False), (None, False)])
def test_the_modes_that_replay_cuda_graphs_bucket_the_masked_count(mode, graphs):
    """max-autotune replays CUDA graphs as reduce-overhead does, so it takes the same care (the masked
    bucket, a graph-tree generation per micro-batch); its no-cudagraphs variant only autotunes."""
    model = PretrainingModel(tiny_bert(), attention="sdpa_padded", pad_to_multiple_of=32)
    model.compile_losses(backend="aot_eager", mode=mode)
    assert model.cuda_graphs is graphs and model.masked_multiple_of == (MASKED_BUCKET if graphs else None)


@pytest.fixture
def graph_marks(monkeypatch) -> list[int]:
    """The calls of torch.compiler.cudagraph_mark_step_begin (on CPU no graph is recorded; the calls are
    what can be checked)."""
    marks: list[int] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    return marks


def reference_and_graphed(scope: str = "layers") -> tuple[PretrainingModel, PretrainingModel]:
    """The padded reference and the same tiny BERT compiled (aot_eager) with mode reduce-overhead."""
    torch._dynamo.reset()
    bert = tiny_bert()
    graphed = PretrainingModel(copy.deepcopy(bert), attention="sdpa_padded", pad_to_multiple_of=32)
    graphed.compile_losses(backend="aot_eager", mode="reduce-overhead", scope=scope)
    return PretrainingModel(bert, attention="hf_sdpa"), graphed


@pytest.mark.parametrize("scope", ["layers", "whole"])
def test_cuda_graphs_bucket_the_masked_count_and_mark_each_micro_batch(scope, graph_marks):
    """mode reduce-overhead in either scope: the layout rounds the masked count up to MASKED_BUCKET, the
    losses and gradients stay the padded model's, and begin_micro_batch tells the graph trees a
    generation begins (nothing without graphs). On CPU inductor records no graph; tests/test_gpu.py
    replays them."""
    plain = PretrainingModel(tiny_bert(), attention="sdpa_padded", pad_to_multiple_of=32)
    plain.begin_micro_batch(accumulating=True)
    assert graph_marks == [] and all(parameter.grad is None for parameter in plain.parameters())
    reference, graphed = reference_and_graphed(scope)
    batch = masked_batch([37, 64, 11], whole_word=True)
    padded = {key: batch[key] for key in PADDED_KEYS}
    prepared = graphed.prepare(**padded)
    assert prepared.masked_positions.numel() == MASKED_BUCKET
    graphed.begin_micro_batch()
    assert graph_marks == [1]
    assert all(parameter.grad is None for parameter in graphed.parameters())  # one micro-batch: autograd's own
    assert_same(losses_and_grads(reference, batch, **padded), losses_and_grads(graphed, batch, prepared=prepared))


def test_an_accumulating_step_under_cuda_graphs_sums_into_gradients_outside_the_graphs(graph_marks):
    """Each micro-batch its own generation of the graph trees: before an accumulating step's first
    micro-batch every parameter gets a zeroed .grad in the model's one buffer (allocated once), autograd
    adds each micro-batch's gradients into it, and the sums are the padded model's over the step."""
    reference, graphed = reference_and_graphed()
    steps = [[masked_batch(lengths, whole_word=True, seed=seed) for seed, lengths in enumerate(SHAPES[:2])],
             [masked_batch(lengths, whole_word=True, seed=seed) for seed, lengths in enumerate(SHAPES[2:5], 2)]]
    buffer_address = None
    for step in steps:
        want = {}
        for batch in step:
            padded = {key: batch[key] for key in PADDED_KEYS}
            for name, grad in losses_and_grads(reference, batch, **padded)[1].items():
                want[name] = want.get(name, 0) + grad
            graphed.begin_micro_batch(accumulating=True)
            (buffer,) = graphed.__dict__["_gradient_buffers"].values()
            buffer_address = buffer_address or buffer.data_ptr()
            assert buffer.data_ptr() == buffer_address  # allocated once, for every step
            out = graphed(prepared=graphed.prepare(**padded), next_sentence_label=batch["next_sentence_label"])
            out.loss.backward()
        for name, parameter in graphed.named_parameters():
            assert parameter.grad.untyped_storage().data_ptr() == buffer_address, name  # summed in place
            torch.testing.assert_close(parameter.grad, want[name], rtol=1e-5, atol=1e-5, msg=name)
        graphed.zero_grad(set_to_none=True)  # as the optimizer leaves them
    assert len(graph_marks) == 5


def test_compiling_the_whole_forward_needs_the_unpadded_layout():
    from biomed_lm.pretrain.config import PretrainConfigError

    with pytest.raises(PretrainConfigError, match="unpadded"):
        PretrainingModel(tiny_bert(), attention="hf_sdpa").compile_losses(backend="aot_eager")


# Not hf_sdpa: transformers' padded forward reads its attention mask back (masking_utils, to skip an
# all-ones mask); it is the reference, and no family trains through it any more.
@pytest.mark.parametrize("attention", ["sdpa_loop", "sdpa_padded"])
def test_a_prepared_micro_batch_runs_forward_and_backward_without_a_host_sync(attention):
    model = PretrainingModel(tiny_bert(), attention=attention, pad_to_multiple_of=32)
    batch = masked_batch([37, 64, 11, 5], whole_word=True)
    prepared = model.prepare(*(batch[key] for key in PADDED_KEYS))  # the loader's work, on the host
    with host_syncs() as found:
        out = model(prepared=prepared, next_sentence_label=batch["next_sentence_label"])
        out.loss.backward()
    assert found == []


def test_the_spy_sees_every_kind_of_host_sync():
    values = torch.arange(6.0)
    with host_syncs() as found:
        values.sum().item()
        bool((values > 2).any())
        values.tolist()
        values[values > 2]
        torch.nonzero(values)
        with paused():
            values.tolist()  # host-side work, left out
    assert [entry["op"].split(".")[1] for entry in found] == [
        "_local_scalar_dense", "_local_scalar_dense", "tolist", "index", "nonzero"]
    assert all(entry["at"].startswith("test_compiled_step.py:") for entry in found)


@pytest.mark.parametrize("optimizer", ["adamw", "lamb"])
def test_the_trainers_steps_make_no_host_sync_and_are_read_at_the_logged_steps(pretraining_inputs, tmp_path,
                                                                               optimizer):
    """Through launch/pretrain.py with fused AdamW or our LAMB on the fused kernel: every step — each
    micro-batch's forward and backward, the sums, the gradient norm and clipping, the guard's verdict,
    the update it vetoes or lets through — is queued without reading anything back; the host reads the
    device's numbers once per logged step, covering the steps since the last read."""
    report = tmp_path / "syncs.json"
    args = with_option(with_option(with_option(pretrain_args(pretraining_inputs, tmp_path / "run"), "--max-steps",
                                               "8"), "--log-every", "4"), "--optimizer", optimizer)
    done = run(args, hooks={"host_syncs": str(report)})
    assert done.returncode == 0, done.stderr[-3000:]
    spied = json.loads(report.read_text())
    assert spied["steps"] == 8 and spied["syncs"] == []
    assert spied["reads"] == [[1, 2, 3, 4], [5, 6, 7, 8]]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [4, 8] and all(record["loss"] > 0 for record in records)


@pytest.mark.parametrize("optimizer", ["adamw", "lamb"])
def test_a_skipped_step_is_vetoed_on_the_device_and_reported_at_the_next_read(pretraining_inputs, tmp_path,
                                                                              optimizer):
    """A NaN loss at step 3, found by the guard on the device between reads: its update is skipped
    there (applied, its NaN gradients would leave every later loss NaN), and the host learns of it
    at the read after step 4."""
    args = with_option(with_option(with_option(pretrain_args(pretraining_inputs, tmp_path / "run"), "--max-steps",
                                               "4"), "--log-every", "4"), "--optimizer", optimizer)
    hooks = {"loss_factor_at_steps": {"factor": float("nan"), "steps": [3], "micro_per_step": 2}}
    done = run(args, hooks=hooks)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 3: optimizer step skipped, nonfinite loss" in done.stderr
    skipped, last = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert skipped["step"] == 3 and skipped["skipped"] == "nonfinite_loss" and skipped["loss"] is None
    assert last["step"] == 4 and last["skipped_steps"] == 1 and math.isfinite(last["loss"])


def test_the_run_log_says_when_cuda_graphs_cannot_apply():
    """sdpa_loop (and ALUM) compile the dense blocks only: --compile-mode reduce-overhead has no forward to
    record, and the execution line says so rather than leaving it to be assumed."""
    from biomed_lm.pretrain.trainer import _compile

    model = PretrainingModel(tiny_bert(), attention="sdpa_loop")
    assert _compile(model, "sdpa_loop", False, "reduce-overhead", "layers") == (
        "the dense blocks (sdpa_loop does not trace; mode reduce-overhead applies to compiled forwards only, not used)")
    assert not model.cuda_graphs


def test_graphs_run_without_cuda_graphs_are_counted_for_the_log():
    """Inductor bumps its cudagraph_skips counter for each compiled graph it runs uncaptured (on a CPU: every
    one); the trainer's CompiledGraphs reports those new since it last looked."""
    from torch._dynamo.utils import counters

    from biomed_lm.pretrain.trainer import CompiledGraphs

    skips = CompiledGraphs().cudagraph_skips
    assert skips.new_since_last_look() == 0
    counters["inductor"]["cudagraph_skips"] += 3
    assert skips.total >= 3 and skips.new_since_last_look() == 3 and skips.new_since_last_look() == 0


ONE_RANK_ENGINE = """
import json, torch
from biomed_lm.pretrain.config import TrainArguments
from biomed_lm.pretrain.modeling import PretrainingModel
from biomed_lm.pretrain.trainer import _build_engine
from tests.test_unpadded import masked_batch, tiny_bert

KEYS = ("input_ids", "attention_mask", "token_type_ids", "labels")
batches = [masked_batch(lengths, whole_word=True, seed=seed) for seed, lengths in enumerate(([37, 64, 11], [9, 50]))]
reference = PretrainingModel(tiny_bert(), attention="sdpa_loop")
reference.masked_multiple_of = 256  # the layout of a model compiled for CUDA graphs (the mark is a no-op on CPU)
for batch in batches:  # the accumulated gradients: DeepSpeed scales each micro-batch's loss by 1/2
    (reference(**{key: batch[key] for key in KEYS}, next_sentence_label=batch["next_sentence_label"]).loss / 2
     ).backward()
model = PretrainingModel(tiny_bert(), attention="sdpa_loop")
model.masked_multiple_of = 256
engine, _, _ = _build_engine(model, TrainArguments(max_steps=2, micro_batch_size=3, gradient_accumulation_steps=2),
                             1, torch.device("cpu"))
for batch in batches:  # as the trainer runs an accumulating step under CUDA graphs
    model.begin_micro_batch(accumulating=True)
    engine.backward(engine(**{key: batch[key] for key in KEYS}, next_sentence_label=batch["next_sentence_label"]).loss)
    if batch is batches[0]:
        engine.step()  # within the accumulation: nothing is updated
(buffer,) = model.__dict__["_gradient_buffers"].values()
grads = dict(reference.named_parameters())
print("RESULT " + json.dumps({
    "allreduce": engine.enable_backward_allreduce,
    "in_buffer": all(p.grad.untyped_storage().data_ptr() == buffer.data_ptr() for p in model.parameters()),
    "same": all(torch.allclose(p.grad, grads[name].grad, rtol=1e-5, atol=1e-6)
                for name, p in model.named_parameters())}))
"""


def test_one_rank_skips_deepspeeds_all_reduce_and_accumulates_in_the_gradient_buffer():
    """biomed_lm.backend.initialize_engine (both trainers build their engine with it): DeepSpeed would
    flatten, all-reduce over the one rank and copy back every gradient, each step. And through the
    engine, an accumulating step under CUDA graphs sums its micro-batches' gradients in the model's
    buffer, equal to autograd's accumulation."""
    from tests.conftest import run_single_rank_deepspeed

    assert run_single_rank_deepspeed(ONE_RANK_ENGINE) == {"allreduce": False, "in_buffer": True, "same": True}


GLOBAL_MEAN_ENGINE = """
import dataclasses, json, torch
from biomed_lm.pretrain.config import TrainArguments
from biomed_lm.pretrain.modeling import PretrainingModel
from biomed_lm.pretrain.trainer import _build_engine, mlm_denominator
from tests.test_unpadded import masked_batch, tiny_bert

KEYS = ("input_ids", "attention_mask", "token_type_ids", "labels", "next_sentence_label")
whole = masked_batch([120, 9, 64, 12, 10, 8], whole_word=True, seed=3)  # the global batch, masked once
micro = [{key: whole[key][rows] for key in KEYS} for rows in (slice(0, 3), slice(3, 6))]
torch.manual_seed(0)
reference = PretrainingModel(tiny_bert(), attention="sdpa_padded")
model = PretrainingModel(tiny_bert(), attention="sdpa_padded")
model.load_state_dict(reference.state_dict())
old = PretrainingModel(tiny_bert(), attention="sdpa_padded")
old.load_state_dict(reference.state_dict())
for m in (reference, model, old):
    m.eval()  # no dropout: the gradients are compared exactly
reference(**whole).loss.backward()  # one large batch: the mean over its masked tokens
engine, _, _ = _build_engine(model, TrainArguments(max_steps=2, micro_batch_size=3, gradient_accumulation_steps=2),
                             1, torch.device("cpu"))
prepared = [model.prepare(*(batch[key] for key in KEYS[:4])) for batch in micro]
denominator = mlm_denominator(prepared, world_size=1)
for batch, layout in zip(micro, prepared):  # as the trainer's step runs them
    layout = dataclasses.replace(layout, mlm_denominator=denominator)
    engine.backward(engine(prepared=layout, next_sentence_label=batch["next_sentence_label"]).loss)
    if batch is micro[0]:
        engine.step()  # within the accumulation: nothing is updated
for batch in micro:  # before: each micro-batch's own mean, averaged
    (old(**batch).loss / 2).backward()
grads = dict(reference.named_parameters())
olds = dict(old.named_parameters())
print("RESULT " + json.dumps({
    "masked": [int((batch["labels"] != -100).sum()) for batch in micro],
    "gap": max((p.grad - grads[name].grad).abs().max().item() for name, p in model.named_parameters()),
    "mean_of_means_gap": max((p.grad - grads[name].grad).abs().max().item() for name, p in olds.items())}))
"""


def test_an_accumulated_step_trains_on_the_mean_over_the_global_batchs_masked_tokens():
    """The MLM loss of a step is the mean over all its masked tokens, as one large batch of the same sequences
    gives it: two micro-batches of unequal masked counts, accumulated through the DeepSpeed engine (which
    scales each by 1/2) with pretrain.trainer.mlm_denominator, give that batch's gradient within 1e-5 (fp32).
    Before, each micro-batch divided by its own count: a mean of means, off by far more."""
    from tests.conftest import run_single_rank_deepspeed

    result = run_single_rank_deepspeed(GLOBAL_MEAN_ENGINE)
    assert result["masked"][0] > 2 * result["masked"][1]
    assert result["gap"] < 1e-5 and result["mean_of_means_gap"] > 100 * max(result["gap"], 1e-7), result
