"""``--residual-stream half``: the unpadded encoder's hidden states between sub-layers in the autocast
dtype (pretrain/unpadded.py's top). On the CPU, under bf16 autocast, for every family: the stream is
bf16 where it was fp32, the losses and gradients stay those of autocast's fp32 stream to bf16's
rounding, the parameters' gradients stay fp32, and the compiled regions take the dtype as they take
the kernel. Asking for it where it cannot apply is refused (fp32) or said (the padded forward)."""

from __future__ import annotations

import pytest
import torch

from biomed_lm.pretrain.config import DataArguments, ModelArguments, PretrainConfigError, TrainArguments
from biomed_lm.pretrain.modeling import PretrainingModel
from biomed_lm.pretrain.unpadded import encoder_for
from tests.test_unpadded_families import CASES, build, masked_batch

LENGTHS = (40, 17, 33, 9)


def stream_dtypes(model: PretrainingModel, batch: dict) -> set[torch.dtype]:
    """The dtypes of every encoder layer's output in one forward under CPU bf16 autocast."""
    seen: set[torch.dtype] = set()
    hooks = [layer.register_forward_hook(lambda _module, _args, output: seen.add(output.dtype))
             for layer in _top_modules(model)]
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(**batch)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def _top_modules(model: PretrainingModel) -> list[torch.nn.Module]:
    """The modules whose outputs are the residual stream: BERT's and RoBERTa's self-outputs and outputs
    (LayerNorm after the residual), ALBERT's two LayerNorms a layer."""
    layers = dict.fromkeys(encoder_for(model.hf_model.config).layers(model.encoder))
    if model.family.name == "albert":
        return [norm for layer in layers for norm in (layer.attention.LayerNorm, layer.full_layer_layer_norm)]
    return [module for layer in layers for module in (layer.attention.output, layer.output)]


def losses_and_grads(model: PretrainingModel, batch: dict, autocast: bool = True):
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(**batch)
    out.loss.backward()
    return out.loss.detach().float(), {name: p.grad.clone() for name, p in model.named_parameters()
                                       if p.grad is not None}


@pytest.mark.parametrize("architecture,pair_task", CASES)
def test_the_half_stream_is_bf16_between_sub_layers_and_trains_as_the_fp32_one(architecture, pair_task):
    hf_model = build(architecture, pair_task if pair_task != "none" else None)
    batch = masked_batch(LENGTHS, pair_task)
    train_pair = pair_task != "none"
    fp32_stream = PretrainingModel(hf_model, train_pair=train_pair, attention="sdpa_loop")
    half_stream = PretrainingModel(hf_model, train_pair=train_pair, attention="sdpa_loop",
                                   residual_dtype=torch.bfloat16)
    # CPU autocast's LayerNorm keeps its input's dtype (CUDA's returns fp32): BERT's and RoBERTa's stream starts
    # from fp32 embeddings and stays fp32, ALBERT's from its embedding mapping, a Linear, so bf16 already here
    assert torch.float32 in stream_dtypes(fp32_stream, batch) or architecture == "albert"
    assert stream_dtypes(half_stream, batch) == {torch.bfloat16}

    loss_fp32, grads_fp32 = losses_and_grads(fp32_stream, batch)
    loss_half, grads_half = losses_and_grads(half_stream, batch)
    assert grads_half.keys() == grads_fp32.keys()
    assert all(grad.dtype == torch.float32 for grad in grads_half.values())  # fp32 weights, fp32 gradients
    # measured: losses within 2.2e-5 of each other (relative), cosine similarity 0.99998 or above
    assert torch.isclose(loss_half, loss_fp32, rtol=1e-3), (loss_half, loss_fp32)
    flat_fp32 = torch.cat([grads_fp32[name].flatten() for name in grads_fp32])
    flat_half = torch.cat([grads_half[name].flatten() for name in grads_fp32])
    cosine = torch.nn.functional.cosine_similarity(flat_fp32, flat_half, dim=0)
    assert cosine > 0.999, f"{architecture}: the gradients' cosine similarity is {cosine:.4f}"


@pytest.mark.parametrize("architecture", ["bert", "albert"])
def test_an_fp32_stream_without_autocast_is_the_default_model_exactly(architecture):
    hf_model = build(architecture, "nsp" if architecture == "bert" else "sop")
    batch = masked_batch(LENGTHS, "nsp" if architecture == "bert" else "sop")
    default = losses_and_grads(PretrainingModel(hf_model, attention="sdpa_loop"), batch, autocast=False)
    explicit = losses_and_grads(PretrainingModel(hf_model, attention="sdpa_loop", residual_dtype=torch.float32),
                                batch, autocast=False)
    assert torch.equal(default[0], explicit[0])
    assert all(torch.equal(default[1][name], explicit[1][name]) for name in default[1])


def test_the_compiled_regions_take_the_streams_dtype():
    hf_model = build("bert", "nsp")
    batch = masked_batch(LENGTHS, "nsp")
    eager = PretrainingModel(hf_model, attention="sdpa_padded", pad_to_multiple_of=16, residual_dtype=torch.bfloat16)
    compiled = PretrainingModel(hf_model, attention="sdpa_padded", pad_to_multiple_of=16,
                                residual_dtype=torch.bfloat16)
    compiled.compile_losses(backend="aot_eager")
    prepared = eager.prepare(*(batch[key] for key in ("input_ids", "attention_mask", "token_type_ids", "labels")))
    inputs = {"prepared": prepared, "next_sentence_label": batch["next_sentence_label"]}
    loss_eager, grads_eager = losses_and_grads(eager, inputs)
    loss_compiled, grads_compiled = losses_and_grads(compiled, inputs)
    assert torch.equal(loss_eager, loss_compiled)  # aot_eager runs the same aten ops
    assert all(torch.allclose(grads_eager[name], grads_compiled[name], atol=1e-6) for name in grads_eager)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # hooks do not fire inside compiled regions: the output
        hidden, _ = compiled.encode(prepared, regions=compiled.__dict__["_compiled_regions"])
    assert hidden.dtype == torch.bfloat16


def test_half_stream_with_fp32_precision_is_refused_before_the_run(tmp_path):
    from biomed_lm.pretrain.trainer import _check_arguments

    args = (ModelArguments(model="bert-tiny", residual_stream="half"),
            DataArguments(data_dir=str(tmp_path / "none"), tokenizer="none"),
            TrainArguments(output_dir=str(tmp_path / "run"), precision="fp32"))
    with pytest.raises(PretrainConfigError, match=r"residual_stream half .*--precision bf16"):
        _check_arguments(*args)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("attention,expected", [("sdpa_loop", "bfloat16"), ("hf_sdpa", None)])
def test_the_execution_says_where_the_half_stream_runs(attention, expected):
    from biomed_lm.pretrain.trainer import _pretraining_model

    model_args = ModelArguments(compile="off", attn_implementation=attention, residual_stream="half")
    model, execution = _pretraining_model(build("bert", "nsp"), model_args, True, TrainArguments(precision="bf16"),
                                          None, torch.device("cpu"))
    assert execution.residual_stream == expected
    assert model.residual_dtype == (torch.bfloat16 if expected else None)
    if expected:
        assert "residual stream in bfloat16" in execution.describe()
    else:
        assert any("half residual stream" in note for note in execution.passed_over)


def test_alum_runs_on_the_half_stream_as_on_the_fp32_one():
    """ALUM's perturbed word embeddings go through the same embedding, cast and layers: its loss (the
    adversarial term included) stays the fp32 stream's to bf16's rounding."""
    from biomed_lm.pretrain.adversarial import AdversarialConfig, AdversarialPretrainingModel

    hf_model = build("bert", "nsp")
    batch = masked_batch(LENGTHS, "nsp")
    losses = {}
    for residual_dtype in (None, torch.bfloat16):
        model = AdversarialPretrainingModel(hf_model, attention="sdpa_loop", residual_dtype=residual_dtype,
                                            adversarial=AdversarialConfig(adversarial=True))
        torch.manual_seed(0)  # the same initial perturbation
        losses[residual_dtype], grads = losses_and_grads(model, batch)
        assert all(torch.isfinite(grad).all() for grad in grads.values())
    assert torch.isclose(losses[torch.bfloat16], losses[None], rtol=1e-3), losses
