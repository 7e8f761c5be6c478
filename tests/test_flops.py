"""pretrain.flops: the model-FLOPs count by hand and against torch's FlopCounterMode on a real
BertForPreTraining forward + backward, its scaling (attention on each sequence's own length, the
MLM head on masked tokens only), the device-peak table, padding share and MFU. CPU only, fast."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.pretrain.flops import (DevicePeak, attention_multiply_adds_per_pair, device_peak,
                                      layer_multiply_adds_per_token, mfu, mlm_head_multiply_adds,
                                      pair_head_multiply_adds, padded_positions_fraction, peak_flops, step_flops,
                                      step_flops_from_counts)

GIB = 1024 ** 3
T = 1e12


def config(hidden: int = 4, layers: int = 2, intermediate: int = 8, vocab: int = 10, heads: int = 2):
    return SimpleNamespace(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=intermediate,
                           vocab_size=vocab, num_attention_heads=heads)


BERT_BASE = config(hidden=768, layers=12, intermediate=3072, vocab=30522, heads=12)


# --- the count by hand ------------------------------------------------------------------------

def test_hand_count_tiny_config():
    """h=4, 2 layers, intermediate 8, vocab 10, lengths [3, 5], 2 masked tokens, 2 NSP sequences:
    every matrix product written out as (rows, inner, cols); a product costs rows·inner·cols
    multiply-adds = 2·rows·inner·cols FLOPs forward, and training is 3 × forward."""
    h, i, v = 4, 8, 10
    products = []
    for _layer in range(2):
        for n in (3, 5):
            products += [(n, h, h)] * 4  # Q, K, V and attention-output projections: [n,h] @ [h,h]
            products += [(n, h, i), (n, i, h)]  # FFN up [n,h] @ [h,i], down [n,i] @ [i,h]
            products += [(n, h, n), (n, n, h)]  # scores Q @ Kᵀ: [n,h] @ [h,n]; weighted sum A @ V: [n,n] @ [n,h]
    products += [(2, h, h), (2, h, v)]  # MLM head on the 2 masked tokens: transform, decoder
    products += [(2, h, h), (2, h, 2)]  # NSP on the 2 sequences: pooler, classifier
    forward_macs = sum(rows * inner * cols for rows, inner, cols in products)
    # Layer dense: 2 layers × 8 tokens × (4·16 + 2·32) = 2048; attention: 2 × (2·9·4 + 2·25·4) = 544;
    # MLM: 2 × (16 + 40) = 112; NSP: 2 × (16 + 8) = 48; total 2752 multiply-adds.
    assert forward_macs == 2048 + 544 + 112 + 48 == 2752
    assert step_flops(config(), [3, 5], masked_tokens=2, pair_sequences=2) == 3 * 2 * 2752 == 16512


def test_building_blocks_tiny_config():
    c = config()
    assert layer_multiply_adds_per_token(c) == 4 * 4 * 4 + 2 * 4 * 8 == 128
    assert attention_multiply_adds_per_pair(c) * 3 * 3 == 2 * 3 * 3 * 4 == 72
    assert mlm_head_multiply_adds(c) == 4 * 4 + 4 * 10 == 56
    assert pair_head_multiply_adds(c) == 4 * 4 + 2 * 4 == 24


def test_tensor_and_list_lengths_agree():
    c = config()
    expected = step_flops(c, [3, 5], 2, 2)
    assert step_flops(c, torch.tensor([3, 5]), 2, 2) == expected
    assert step_flops(c, torch.tensor([3, 5], dtype=torch.int32), 2, 2) == expected
    assert step_flops(c, (n for n in (3, 5)), 2, 2) == expected


def test_counts_form_matches_lengths_form():
    """What the trainer's reduced StepTotals hold (Σ n, Σ n², masked, NSP) gives the same number."""
    lengths = [17, 128, 64, 3]
    expected = step_flops(BERT_BASE, lengths, 30, 4)
    assert step_flops_from_counts(BERT_BASE, sum(lengths), sum(n * n for n in lengths), 30, 4) == expected
    assert step_flops_from_counts(BERT_BASE, float(sum(lengths)), float(sum(n * n for n in lengths)), 30.0,
                                  4.0) == expected


@pytest.mark.parametrize("lengths, masked, nsp, error", [
    ([3, -1], 0, 0, ValueError),
    ([3.0, 5], 0, 0, TypeError),
    ([3, 5], 9, 0, ValueError),  # more masked tokens than tokens
    ([3, 5], 0, 3, ValueError),  # more NSP sequences than sequences
    ([3, 5], -1, 0, ValueError),
])
def test_bad_inputs_are_refused(lengths, masked, nsp, error):
    with pytest.raises(error):
        step_flops(config(), lengths, masked, nsp)


def test_bad_tensor_and_config_are_refused():
    with pytest.raises(TypeError):
        step_flops(config(), torch.tensor([3.0, 5.0]), 0, 0)
    with pytest.raises(ValueError):
        step_flops(config(), torch.tensor([[3, 5]]), 0, 0)
    with pytest.raises(ValueError):
        step_flops(config(hidden=5, heads=2), [3], 0, 0)
    with pytest.raises(ValueError):
        step_flops_from_counts(config(), float("nan"), 0, 0, 0)


# --- against torch's FlopCounterMode on a real model ------------------------------------------

def _tiny_bert(hidden=16, layers=2, heads=4, intermediate=32, vocab=50):
    from transformers import BertConfig, BertForPreTraining

    torch.manual_seed(0)
    bert_config = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                             num_attention_heads=heads, intermediate_size=intermediate, max_position_embeddings=64,
                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    # Eager attention: its QKᵀ and AV are aten.bmm, which FlopCounterMode counts. CPU SDPA
    # (_scaled_dot_product_flash_attention_for_cpu) has no FLOP formula registered, so the counter
    # would silently miss attention there.
    return BertForPreTraining._from_config(bert_config, attn_implementation="eager")


def _counted_flops(model, batches: list[tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]]]]) -> int:
    """FLOPs FlopCounterMode counts over forward + backward of each batch: the encoder, the MLM
    head on the masked positions' hidden states only, NSP on the pooled output."""
    from torch.utils.flop_counter import FlopCounterMode

    vocab = model.config.vocab_size
    with FlopCounterMode(display=False) as counter:
        for input_ids, attention_mask, masked in batches:
            out = model.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=torch.zeros_like(input_ids))
            rows, cols = zip(*masked)
            logits = model.cls.predictions(out.last_hidden_state[list(rows), list(cols)])
            nsp_logits = model.cls.seq_relationship(out.pooler_output)
            loss = torch.nn.functional.cross_entropy(logits, torch.randint(0, vocab, (len(masked),))) \
                + torch.nn.functional.cross_entropy(nsp_logits, torch.zeros(input_ids.shape[0], dtype=torch.long))
            loss.backward()
    # Everything counted is a matmul (addmm/mm/bmm): embeddings are gathers and layer norm, softmax,
    # GELU, biases and the loss are elementwise, none of which FlopCounterMode counts, the same
    # things step_flops leaves out; so the two must agree exactly, with nothing to subtract.
    assert {str(op) for op in counter.get_flop_counts()["Global"]} <= {"aten.addmm", "aten.mm", "aten.bmm"}
    return counter.get_total_flops()


def test_matches_flop_counter_sequence_by_sequence():
    model = _tiny_bert()
    lengths, masked_per_sequence = [3, 5, 11, 32], [1, 2, 3, 5]
    batches = []
    for n, m in zip(lengths, masked_per_sequence):
        ids = torch.randint(5, model.config.vocab_size, (1, n))
        batches.append((ids, torch.ones(1, n, dtype=torch.long), [(0, p) for p in range(1, 1 + m)]))
    counted = _counted_flops(model, batches)
    formula = step_flops(model.config, lengths, masked_tokens=sum(masked_per_sequence), pair_sequences=len(lengths))
    assert formula == pytest.approx(counted, rel=1e-12)
    assert formula == counted  # integers both: exact


def test_padded_batch_costs_what_step_flops_says_for_the_padded_length():
    """A padded batch does its matmuls at the padded length: the counter sees step_flops of every
    sequence at that length, more than the model FLOPs of the real lengths."""
    model = _tiny_bert()
    lengths, padded = [3, 9], 9
    ids = torch.randint(5, model.config.vocab_size, (2, padded))
    mask = torch.tensor([[1] * n + [0] * (padded - n) for n in lengths])
    masked = [(0, 1), (1, 1), (1, 4)]
    counted = _counted_flops(model, [(ids, mask, masked)])
    assert counted == step_flops(model.config, [padded, padded], masked_tokens=3, pair_sequences=2)
    assert step_flops(model.config, lengths, 3, 2) < counted
    assert padded_positions_fraction(lengths, 2 * padded) == pytest.approx(6 / 18)


# --- scaling ------------------------------------------------------------------------------------

def test_attention_is_counted_on_each_sequences_own_length():
    """Two sequences of 64 against one of 128: the same tokens, so the difference is attention
    alone: 3 × 2 × layers × 2·h·(128² − 2·64²)."""
    layers, h = BERT_BASE.num_hidden_layers, BERT_BASE.hidden_size
    two, one = step_flops(BERT_BASE, [64, 64], 0, 0), step_flops(BERT_BASE, [128], 0, 0)
    assert two < one
    assert one - two == 3 * 2 * layers * 2 * h * (128 ** 2 - 2 * 64 ** 2)


def test_mlm_head_is_proportional_to_masked_tokens():
    lengths = [128] * 8
    base = step_flops(BERT_BASE, lengths, 0, 0)
    per_masked = 3 * 2 * (768 * 768 + 768 * 30522)
    for masked in (1, 20, 154):
        assert step_flops(BERT_BASE, lengths, masked, 0) - base == masked * per_masked


def test_pair_head_counts_only_with_pair_sequences():
    base = step_flops(BERT_BASE, [128, 64], 10, 0)
    assert step_flops(BERT_BASE, [128, 64], 10, 2) - base == 2 * 3 * 2 * (768 * 768 + 2 * 768)


def test_lower_than_the_old_whole_sequence_estimate():
    """The old estimate: 6 × (layer params + MLM head on every position) + 12·L·h·max_len a token."""
    lengths, max_len = [200, 90, 512, 37], 512
    tokens = sum(lengths)
    h, layers, i, v = 768, 12, 3072, 30522
    old = tokens * (6.0 * (layers * (4 * h * h + 2 * h * i) + h * v) + 12.0 * layers * h * max_len)
    assert step_flops(BERT_BASE, lengths, masked_tokens=int(0.15 * tokens), pair_sequences=4) < old


@settings(max_examples=60, deadline=None)
@given(a=st.lists(st.integers(0, 512), max_size=12), b=st.lists(st.integers(0, 512), max_size=12),
       masked_share=st.floats(0, 1), nsp_share=st.floats(0, 1))
def test_additive_over_sequences_and_linear_in_heads(a, b, masked_share, nsp_share):
    """Sequences add up independently (no term couples two sequences), the head terms add on top
    linearly, and a longer sequence always costs more."""
    c = BERT_BASE
    body = step_flops(c, a + b, 0, 0)
    assert body == step_flops(c, a, 0, 0) + step_flops(c, b, 0, 0)
    masked, nsp = int(masked_share * sum(a + b)), int(nsp_share * len(a + b))
    heads = masked * 6 * mlm_head_multiply_adds(c) + nsp * 6 * pair_head_multiply_adds(c)
    assert step_flops(c, a + b, masked, nsp) == body + heads
    if a:
        longer = [a[0] + 1] + a[1:]
        assert step_flops(c, longer, 0, 0) > step_flops(c, a, 0, 0)


# --- padding share ------------------------------------------------------------------------------

@pytest.mark.parametrize("lengths, computed, expected", [
    ([3, 5], 10, 0.2),  # padded batch of 2 × 5
    ([128, 128], 256, 0.0),  # nothing padded
    ([100, 27], 128, 1 / 128),  # unpadded, bucketed up to a multiple of 64
    ([], 0, 0.0),
    ([0, 0], 8, 1.0),
])
def test_padded_positions_fraction(lengths, computed, expected):
    assert padded_positions_fraction(lengths, computed) == pytest.approx(expected)
    assert padded_positions_fraction(torch.tensor(lengths, dtype=torch.long), computed) == pytest.approx(expected)


def test_padded_positions_fraction_refuses_fewer_positions_than_tokens():
    with pytest.raises(ValueError):
        padded_positions_fraction([3, 5], 7)


# --- device peaks -------------------------------------------------------------------------------

@pytest.mark.parametrize("name, memory_gib, sms, variant, bf16", [
    ("NVIDIA H100 80GB HBM3", 79.1, 132, "NVIDIA H100 SXM", 989.4 * T),
    ("NVIDIA H100 PCIe", 79.6, 114, "NVIDIA H100 PCIe", 756.5 * T),
    ("NVIDIA H100 NVL", 93.1, 132, "NVIDIA H100 NVL", 835.5 * T),
    ("NVIDIA H200", 139.8, 132, "NVIDIA H200 SXM", 989.4 * T),
    ("NVIDIA H200 NVL", 139.8, 132, "NVIDIA H200 NVL", 835.5 * T),
    ("NVIDIA A100-SXM4-40GB", 39.4, 108, "NVIDIA A100 SXM4 40GB", 312 * T),
    ("NVIDIA A100-SXM4-80GB", 79.2, 108, "NVIDIA A100 SXM4 80GB", 312 * T),
    ("NVIDIA A100 80GB PCIe", 79.2, 108, "NVIDIA A100 PCIe 80GB", 312 * T),
    ("NVIDIA A100-PCIE-40GB", 39.4, 108, "NVIDIA A100 PCIe 40GB", 312 * T),
    ("NVIDIA L40S", 44.4, 142, "NVIDIA L40S", 362.05 * T),
    ("Tesla V100-SXM2-16GB", 15.8, 80, "NVIDIA V100 SXM2", None),
    ("Tesla V100-PCIE-32GB", 31.7, 80, "NVIDIA V100 PCIe", None),
])
def test_real_device_names_map_to_their_variant(name, memory_gib, sms, variant, bf16):
    peak = device_peak(name, int(memory_gib * GIB), sms)
    assert peak is not None and peak.name == variant
    assert peak.bf16 == bf16
    assert device_peak(name) == peak  # the name alone is enough for every one of these


def test_form_factors_differ():
    sxm, pcie, nvl = (device_peak(n) for n in ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL"))
    assert pcie.bf16 < nvl.bf16 < sxm.bf16
    assert (sxm.fp32, pcie.fp32, nvl.fp32) == (66.9 * T, 51.0 * T, 60.0 * T)
    assert (sxm.tf32, pcie.tf32, nvl.tf32) == (494.7 * T, 378.0 * T, 417.5 * T)
    a100_sxm, a100_pcie = device_peak("NVIDIA A100-SXM4-80GB"), device_peak("NVIDIA A100 80GB PCIe")
    assert a100_sxm.name != a100_pcie.name and a100_sxm.bf16 == a100_pcie.bf16 == 312 * T
    assert device_peak("NVIDIA H200").fp32 == 66.9 * T and device_peak("NVIDIA H200 NVL").fp32 == 60.0 * T


def test_bare_h100_name_is_told_apart_by_properties():
    assert device_peak("NVIDIA H100", 79 * GIB, 132).name == "NVIDIA H100 SXM"
    assert device_peak("NVIDIA H100", 93 * GIB, 132).name == "NVIDIA H100 NVL"
    assert device_peak("NVIDIA H100", 79 * GIB, 114).name == "NVIDIA H100 PCIe"
    assert device_peak("NVIDIA H100") is None  # ambiguous: not guessed


def test_a100_capacity_from_memory_when_the_name_lacks_it():
    assert device_peak("NVIDIA A100-SXM4", 79 * GIB).name == "NVIDIA A100 SXM4 80GB"
    assert device_peak("NVIDIA A100-SXM4", 39 * GIB).name == "NVIDIA A100 SXM4 40GB"


def test_precisions_per_device():
    v100 = device_peak("Tesla V100-SXM2-16GB")
    assert (v100.fp16, v100.bf16, v100.tf32, v100.fp32) == (125 * T, None, None, 15.7 * T)
    assert device_peak("Tesla V100-PCIE-16GB").fp16 == 112 * T
    l40s = device_peak("NVIDIA L40S")
    assert (l40s.bf16, l40s.fp16, l40s.tf32, l40s.fp32) == (362.05 * T, 362.05 * T, 183 * T, 91.6 * T)
    a100 = device_peak("NVIDIA A100-SXM4-40GB")
    assert a100.flops("bf16") == a100.flops("bfloat16") == 312 * T
    assert a100.flops("FP32") == a100.flops("float32") == 19.5 * T
    assert a100.flops("fp8") is None  # no FP8 tensor cores before Ada/Hopper
    with pytest.raises(ValueError):
        a100.flops("fp4")


@pytest.mark.parametrize("name", [
    "NVIDIA GH200 480GB",  # Grace Hopper: not an H200, not in the table
    "NVIDIA L40",  # not an L40S
    "NVIDIA L4",
    "NVIDIA GeForce RTX 4090",
    "Tesla V100S-PCIE-32GB",  # a V100S, not a V100
    "Tesla V100-SXM3-32GB",  # other clocks, no figures here
    "NVIDIA B200",
    "AMD Instinct MI300X",
    "cpu",
    "",
])
def test_unknown_devices_are_none(name):
    assert device_peak(name) is None


def test_mig_slice_gets_its_share_of_sms():
    whole = device_peak("NVIDIA A100-SXM4-40GB", 39 * GIB, 108)
    slice_ = device_peak("NVIDIA A100-SXM4-40GB MIG 1g.5gb", 4 * GIB, 14)
    assert "MIG" in slice_.name
    assert slice_.bf16 == pytest.approx(whole.bf16 * 14 / 108)
    assert device_peak("NVIDIA H100 80GB HBM3", 80 * GIB, 140) is None  # more SMs than the part has


def _fake_properties(name: str, memory_gib: float, sms: int):
    return SimpleNamespace(name=name, total_memory=int(memory_gib * GIB), multi_processor_count=sms)


def test_peak_flops_reads_cuda_device_properties(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: _fake_properties("NVIDIA H100 PCIe", 79.6, 114))
    assert peak_flops("bf16", torch.device("cuda", 0)) == 756.5 * T
    assert peak_flops("fp32", "cuda:0") == 51.0 * T
    assert peak_flops("tf32", 0) == 378.0 * T
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: _fake_properties("Tesla V100-SXM2-16GB", 15.8, 80))
    assert peak_flops("bf16", "cuda") is None  # Volta has no BF16
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: _fake_properties("NVIDIA GeForce RTX 4090", 23.6, 128))
    assert peak_flops("bf16", "cuda") is None


def test_peak_flops_on_cpu_is_none(monkeypatch):
    assert peak_flops("bf16", torch.device("cpu")) is None
    assert peak_flops("fp32", "cpu") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert peak_flops("bf16") is None
    with pytest.raises(ValueError):
        peak_flops("int8", "cpu")


def test_device_peak_is_immutable():
    peak = device_peak("NVIDIA L40S")
    assert isinstance(peak, DevicePeak)
    with pytest.raises(AttributeError):
        peak.bf16 = 1.0


# --- MFU ----------------------------------------------------------------------------------------

def test_mfu():
    assert mfu(989.4e12 * 0.5 * 8, 1.0, 989.4e12, 8) == pytest.approx(0.5)
    assert mfu(3e15, 2.0, 312e12, 4) == pytest.approx(3e15 / (2.0 * 312e12 * 4))
    for bad in ((1e12, 0.0, 1e12, 1), (1e12, 1.0, 0.0, 1), (1e12, 1.0, 1e12, 0)):
        with pytest.raises(ValueError):
            mfu(*bad)
