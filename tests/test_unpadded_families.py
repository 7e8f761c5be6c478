"""Every family on the unpadded path (pretrain/unpadded.py's adapters): for BERT, RoBERTa and ALBERT
the varlen forward with ``sdpa_loop`` and ``sdpa_padded`` gives transformers' padded forward
(``hf_sdpa``, the reference) to rounding — the loss and every parameter's gradient within 1e-5,
fp32 on CPU, dropout 0 — with the family's pair objective where it has a head (BERT NSP and DRP,
ALBERT SOP), with ALUM (δ on the word embeddings: E-dimensional for ALBERT), and with the token
count bucketed. RoBERTa's positions are ``create_position_ids_from_input_ids``'s, with pad id 1 (its
own) and 0; ALBERT's shared layers follow ``AlbertTransformer``'s group mapping; ``--compile on``'s
dense blocks compile for every family."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from biomed_lm.pretrain.adversarial import AdversarialConfig, AdversarialPretrainingModel
from biomed_lm.pretrain.compiling import compile_dense_blocks, compiled_graphs, dense_blocks
from biomed_lm.pretrain.families import FAMILIES, get_family
from biomed_lm.pretrain.modeling import PretrainingModel
from biomed_lm.pretrain.unpadded import ENCODERS, encode, encoder_for
from tests.test_model_families import collated_batch

VOCAB, CLS, SEP, MASK = 120, 2, 3, 4
TOLERANCE = 1e-5
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
SHAPES = {  # tiny, with the shapes that matter: ALBERT E != H, 4 layers over 2 groups of 2 inner layers
    "bert": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
             "max_position_embeddings": 128},
    "roberta": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
                "max_position_embeddings": 128},
    "albert": {"embedding_size": 16, "hidden_size": 32, "num_hidden_layers": 4, "num_hidden_groups": 2,
               "inner_group_num": 2, "num_attention_heads": 4, "intermediate_size": 64,
               "max_position_embeddings": 128, "hidden_act": "gelu_new", "classifier_dropout_prob": 0.0},
}
#: (family, pair task trained): each family's pair objectives, and MLM only (BERT's: tests/test_unpadded.py)
CASES = [("bert", "nsp"), ("bert", "drp"), ("albert", "sop"), ("albert", "none"), ("roberta", "none")]
KERNELS = ["sdpa_loop", "sdpa_padded"]


def build(architecture: str, pair_task: str | None = None, pad: int = 0, seed: int = 0, **overrides):
    family = get_family(architecture)
    torch.manual_seed(seed)
    return family.build({**SHAPES[architecture], **NO_DROPOUT, **overrides}, VOCAB, pad,
                        attn_implementation="sdpa", pair_task=pair_task)


def masked_batch(lengths, pair_task: str, pad: int = 0, seed: int = 0) -> dict[str, torch.Tensor]:
    """[CLS] A [SEP] B [SEP] pairs of variable lengths (padding in every row but the longest), masked,
    about 70% of the pieces starting a word."""
    return collated_batch(pair_task, seed=seed, lengths=lengths, pad=pad, word_start_rate=0.7)


def varlen_of(model, batch: dict, pad_to_multiple_of: int | None = None):
    """The micro-batch in the unpadded layout, as the pretraining model makes it."""
    unpadded = PretrainingModel(model, attention="sdpa_loop", pad_to_multiple_of=pad_to_multiple_of)
    return unpadded.prepare(*(batch[k] for k in ("input_ids", "attention_mask", "token_type_ids", "labels")))


def losses_and_grads(model: PretrainingModel, batch: dict) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    model.zero_grad()
    out = model(**batch)
    out.loss.backward()
    losses = {"loss": out.loss.item(), "mlm": out.mlm_loss.item(), "pair": out.pair_loss.item(),
              "pair_count": int(out.pair_count)}
    return losses, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def max_differences(reference: tuple, other: tuple) -> tuple[float, float]:
    """The largest loss and gradient differences; the same losses counted and gradients present."""
    (loss_r, grads_r), (loss_o, grads_o) = reference, other
    assert loss_r["pair_count"] == loss_o["pair_count"]
    assert grads_r.keys() == grads_o.keys()
    loss = max(abs(loss_r[key] - loss_o[key]) for key in ("loss", "mlm", "pair"))
    grad = max((grads_r[name] - grads_o[name]).abs().max().item() for name in grads_r)
    return loss, grad


def assert_same(reference: tuple, other: tuple) -> None:
    loss, grad = max_differences(reference, other)
    assert loss <= TOLERANCE and grad <= TOLERANCE, (loss, grad)


LENGTHS = [40, 17, 33, 9, 26]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("architecture, pair_task", CASES)
def test_unpadded_losses_and_gradients_equal_transformers_padded_forward(architecture, pair_task, kernel):
    model = build(architecture, pair_task)
    batch = masked_batch(LENGTHS, pair_task)
    trained = pair_task != "none"
    reference = losses_and_grads(PretrainingModel(copy.deepcopy(model), train_pair=trained, attention="hf_sdpa"), batch)
    unpadded = PretrainingModel(copy.deepcopy(model), train_pair=trained, attention=kernel)
    assert unpadded.unpadded
    result = losses_and_grads(unpadded, batch)
    assert_same(reference, result)
    assert result[0]["pair_count"] == (len(LENGTHS) if trained else 0)
    assert len(result[1]) == len([p for p in unpadded.parameters() if p.requires_grad])  # every parameter trained


@pytest.mark.parametrize("architecture, pair_task", [("albert", "sop"), ("roberta", "none")])
def test_bucketed_unpadded_layout_equals_the_padded_model(architecture, pair_task):
    """The bucket's padding (a sequence of its own) changes nothing, RoBERTa's shifted positions included."""
    model = build(architecture, pair_task)
    batch = masked_batch([37, 50, 11], pair_task)
    reference = losses_and_grads(PretrainingModel(copy.deepcopy(model), attention="hf_sdpa"), batch)
    bucketed = PretrainingModel(copy.deepcopy(model), attention="sdpa_loop", pad_to_multiple_of=32)
    assert_same(reference, losses_and_grads(bucketed, batch))
    prepared = varlen_of(model, batch, pad_to_multiple_of=32)
    assert (prepared.sequences.offsets[-1], prepared.padding) == (128, 128 - 98)


@pytest.mark.parametrize("architecture, pair_task", [("bert", "nsp"), ("albert", "sop"), ("roberta", "none")])
def test_unpadded_alum_equals_the_padded_alum(architecture, pair_task):
    """ALUM perturbs the word embeddings (ALBERT's E-dimensional ones) in either layout alike."""
    model = build(architecture, pair_task)
    batch = masked_batch(LENGTHS, pair_task, seed=4)
    adversarial = AdversarialConfig(adversarial=True, adv_alpha=1.0, adv_epsilon=1e-3, adv_step_size=1e-3)
    results = []
    for attention in ("hf_sdpa", "sdpa_loop"):
        wrapped = AdversarialPretrainingModel(copy.deepcopy(model), adversarial=adversarial, attention=attention)
        torch.manual_seed(7)  # δ's noise comes from the global RNG, as in training
        results.append(losses_and_grads(wrapped, batch))
    assert_same(*results)
    noise_only = dataclasses.replace(adversarial, adv_epsilon=1e-2, adv_sigma=1e-2, adv_steps=0)
    kls = []
    for attention in ("hf_sdpa", "sdpa_loop"):  # the term alone, K = 0: δ is the projected noise
        wrapped = AdversarialPretrainingModel(copy.deepcopy(model), adversarial=noise_only, attention=attention)
        torch.manual_seed(7)
        kls.append(wrapped(**batch).adv_kl.item())
    assert kls[0] > 1e-4 and kls[1] == pytest.approx(kls[0], rel=1e-4)


@pytest.mark.parametrize("pad", [1, 0], ids=["pad-1", "pad-0"])
def test_roberta_positions_are_transformers_after_the_padding_id(pad):
    """Each real token's position row is ``create_position_ids_from_input_ids``'s (pad id + 1 + its
    position), and the encoder's states are transformers' padded ones, with pad id 1 (RoBERTa's) and 0."""
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

    model = build("roberta", pad=pad)
    assert model.config.max_position_embeddings == 128 + pad + 1
    batch = masked_batch([30, 12, 21], "none", pad=pad)
    varlen = varlen_of(model, batch)
    expected = RobertaEmbeddings.create_position_ids_from_input_ids(batch["input_ids"], pad)
    encoder = model.roberta
    assert torch.equal(ENCODERS["roberta"].positions(encoder, varlen), expected.flatten()[varlen.indices])
    assert (ENCODERS["roberta"].token_types(encoder, varlen) == 0).all()  # segment B's ids are not RoBERTa's
    with torch.no_grad():
        padded = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        hidden = encode(encoder, varlen, "sdpa_loop")
    assert torch.allclose(hidden, padded.flatten(0, 1)[varlen.indices], atol=TOLERANCE)


def test_albert_runs_its_shared_groups_as_albert_transformer_does():
    """4 layers over 2 groups of 2: layers 0-1 run group 0 (its two layers each time), 2-3 group 1;
    the last hidden states and the pooled [CLS] are transformers' own."""
    model = build("albert", "sop")
    encoder, adapter = model.albert, ENCODERS["albert"]
    groups = [list(group.albert_layers) for group in encoder.encoder.albert_layer_groups]
    assert adapter.layers(encoder) == groups[0] * 2 + groups[1] * 2
    assert len(dense_blocks(model)) == 4 * 3 + 1  # each distinct layer's once, then the MLM head
    batch = masked_batch([30, 12, 21], "sop")
    varlen = varlen_of(model, batch)
    with torch.no_grad():
        out = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      token_type_ids=batch["token_type_ids"])
        hidden = encode(encoder, varlen, "sdpa_loop")
        pooled = adapter.pool(encoder, hidden, varlen)
    assert torch.allclose(hidden, out.last_hidden_state.flatten(0, 1)[varlen.indices], atol=TOLERANCE)
    assert torch.allclose(pooled, out.pooler_output, atol=TOLERANCE)


def test_every_family_has_an_adapter_and_no_pooler_means_none():
    assert all(family.unpadded and encoder_for(build(name).config) is ENCODERS[family.unpadded_encoder]
               for name, family in FAMILIES.items())
    for name in FAMILIES:
        assert get_family(name).resolve_attention("sdpa_loop", "on") == ("sdpa_loop", [])
    roberta = build("roberta")
    batch = masked_batch([9, 7], "none")
    varlen = varlen_of(roberta, batch)
    hidden = encode(roberta.roberta, varlen, "sdpa_loop")
    assert ENCODERS["roberta"].pool(roberta.roberta, hidden, varlen) is None  # RobertaForMaskedLM has no pooler


@pytest.mark.parametrize("architecture, pair_task, blocks", [("albert", "sop", 3 + 1), ("roberta", "none", 2 * 3 + 1)])
def test_compiled_dense_blocks_of_every_family_give_the_same_gradients(architecture, pair_task, blocks):
    """``--compile on``'s blocks (aot_eager here, as in tests/test_unpadded.py): the same numbers and
    parameter names, a bounded number of graphs over batches of other lengths. ALBERT as its presets
    are, one shared layer run twice (its blocks compiled once)."""
    shared = {"num_hidden_layers": 2, "num_hidden_groups": 1, "inner_group_num": 1} if architecture == "albert" else {}
    model = build(architecture, pair_task, **shared)
    reference = PretrainingModel(copy.deepcopy(model), attention="sdpa_loop", pad_to_multiple_of=32)
    compiled = PretrainingModel(copy.deepcopy(model), attention="sdpa_loop", pad_to_multiple_of=32)
    assert compile_dense_blocks(compiled.hf_model, backend="aot_eager") == blocks
    before = compiled_graphs()
    for seed, lengths in enumerate(([20, 33, 9], [50, 60])):  # 64 and 128 tokens bucketed
        batch = masked_batch(lengths, pair_task, seed=seed)
        assert_same(losses_and_grads(reference, batch), losses_and_grads(compiled, batch))
    assert compiled_graphs() - before <= blocks  # at most one per module, not one per shape or layer
    assert list(compiled.state_dict()) == list(reference.state_dict())
