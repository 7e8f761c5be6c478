"""Model FLOPs and model-FLOPs utilisation (MFU) for BERT pretraining, counted honestly.

What is counted (the usual MFU convention: PaLM, Chowdhery et al. 2022, appendix B; Megatron-LM,
Narayanan et al. 2021, section 5.1): the multiply-adds of the model's matrix products, at 2 FLOPs
per multiply-add, for the tokens the step really trained on, with training = forward + backward =
3 × forward (the backward pass does two products of each forward one's size: the gradient with
respect to the input and the one with respect to the weight).

- every encoder layer, on every real token: the Q, K, V and attention-output projections (4·h²
  multiply-adds a token) and the feed-forward block (2·h·intermediate);
- attention scores QKᵀ and the weighted sum AV, on each sequence's own length n: 2·n²·h
  multiply-adds a layer, never at a padded length. Padding is compute the hardware spends, not
  work the model needs; :func:`padded_positions_fraction` reports it separately;
- the MLM head on the masked tokens only (dense transform h² + decoder h·vocab a masked token);
- the NSP head (pooler h² + classifier 2·h a sequence), only for sequences with an NSP label; the
  pair head of another pair task likewise, with its classes (DRP: 3·h; ``config.pair_classes``).

ALBERT (``model_type`` "albert") is counted as it computes, not as BERT-shaped: its layers share
their weights, but every one of the ``num_hidden_layers`` still runs, so the per-layer count is
the same; the factorized embedding adds the E→H projection (``embedding_hidden_mapping_in``, E·h a
token), and the MLM head projects h→E before an E→vocab decoder (h·E + E·vocab a masked token,
instead of h² + h·vocab). RoBERTa computes what BERT does (without the pair head).

What is not counted: embedding lookups (a gather does no multiply-adds; Chinchilla, Hoffmann et
al. 2022, appendix F, counts the input embedding as a one-hot matmul, PaLM does not, and neither
do we), layer norms, softmax, GELU, dropout, biases and the loss (elementwise, a few per cent of
the total at BERT sizes, and not what tensor-core peaks measure), and any recomputation
(activation checkpointing would raise *hardware* FLOPs, not model FLOPs).

Peaks are dense (no 2:4 structured sparsity): NVIDIA's data sheets headline the sparse figure,
twice the dense one, for tensor-core math; a pretraining run never uses sparsity. A device this
table does not know yields ``None`` rather than some other device's number: MFU is then not
reported instead of being reported wrong.

An fp8 run (``--precision fp8``, :mod:`pretrain.fp8`) is measured against the device's FP8 peak
(twice its BF16 one on Hopper and Ada), although only the encoder's Linear layers run in FP8:
attention scores, the MLM and pair heads stay in BF16. Its MFU is therefore a lower bound of the
tensor cores' use, and not comparable with a bf16 run's MFU; compare tokens/s between the two.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol

from biomed_lm.pretrain.families import FAMILIES

if TYPE_CHECKING:
    import torch

TRAINING_PASSES = 3  # forward + backward (input gradients + weight gradients) = 3 × forward
FLOPS_PER_MULTIPLY_ADD = 2


class EncoderConfig(Protocol):
    """The fields of a ``transformers.BertConfig`` the count reads (an ALBERT config's
    ``embedding_size`` and ``model_type``, and a ``pair_classes`` other than 2, too)."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    vocab_size: int
    num_attention_heads: int


# ---------------------------------------------------------------------------------------------
# Model FLOPs
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Dims:
    hidden: int
    layers: int
    intermediate: int
    vocab: int


def _dims(config: EncoderConfig) -> _Dims:
    """The config's sizes, checked: positive integers, and a hidden size the heads divide.
    (The head count does not change the count: the heads split h, they do not multiply it.)"""
    values = {}
    for field in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size", "num_attention_heads"):
        value = getattr(config, field)
        if isinstance(value, bool) or operator.index(value) <= 0:
            raise ValueError(f"config.{field} must be a positive integer, not {value!r}")
        values[field] = operator.index(value)
    if values["hidden_size"] % values["num_attention_heads"]:
        raise ValueError(f"hidden_size {values['hidden_size']} is not a multiple of "
                         f"num_attention_heads {values['num_attention_heads']}")
    return _Dims(values["hidden_size"], values["num_hidden_layers"], values["intermediate_size"], values["vocab_size"])


def layer_multiply_adds_per_token(config: EncoderConfig) -> int:
    """One encoder layer's dense products for one token: Q, K, V, output (4·h²) and FFN (2·h·i)."""
    d = _dims(config)
    return 4 * d.hidden * d.hidden + 2 * d.hidden * d.intermediate


def attention_multiply_adds_per_pair(config: EncoderConfig) -> int:
    """One layer's QKᵀ and AV per (query, key) pair of a sequence, all heads together: 2·h, so a
    sequence of n tokens costs 2·n²·h."""
    return 2 * _dims(config).hidden


def _embedding_size(config: EncoderConfig) -> int | None:
    """E of a factorized-embedding model (its family's ``factorized_embeddings``: ALBERT's E-wide
    embeddings, projected to h before the first layer, and an MLM head back through E before the
    E→vocab decoder), None for the others (BERT, RoBERTa, a config of no family: E = h, no projection)."""
    model_type = getattr(config, "model_type", "bert")
    if not any(family.factorized_embeddings for family in FAMILIES.values() if family.model_type == model_type):
        return None
    value = getattr(config, "embedding_size")
    if isinstance(value, bool) or operator.index(value) <= 0:
        raise ValueError(f"config.embedding_size must be a positive integer, not {value!r}")
    return operator.index(value)


def embedding_multiply_adds_per_token(config: EncoderConfig) -> int:
    """The factorized embedding's E→h projection for one token (ALBERT: E·h); 0 for BERT and RoBERTa,
    whose embeddings are gathers (not counted)."""
    e = _embedding_size(config)
    return 0 if e is None else e * _dims(config).hidden


def mlm_head_multiply_adds(config: EncoderConfig) -> int:
    """The MLM head for one masked token: transform dense h² and decoder h·vocab (ALBERT: dense h·E
    and decoder E·vocab)."""
    d, e = _dims(config), _embedding_size(config)
    if e is not None:
        return d.hidden * e + e * d.vocab
    return d.hidden * d.hidden + d.hidden * d.vocab


def pair_head_multiply_adds(config: EncoderConfig) -> int:
    """The pair head for one sequence: pooler dense h² (on [CLS]) and the classifier, 2·h for the
    2-way NSP/SOP head (``config.pair_classes``·h for another, DRP's 3)."""
    d = _dims(config)
    classes = getattr(config, "pair_classes", None) or 2
    return d.hidden * d.hidden + classes * d.hidden


def step_flops_from_counts(config: EncoderConfig, tokens: float, attention_pairs: float, masked_tokens: float,
                           pair_sequences: float) -> float:
    """Training FLOPs of one optimizer step from its summed counts: real ``tokens`` (Σ n),
    ``attention_pairs`` (Σ n², over each sequence's own length n), ``masked_tokens`` (positions
    with an MLM label) and ``pair_sequences`` (sequences with a pair label: NSP, SOP or DRP).

    These are exactly the sums the trainer's ``StepTotals`` already reduces over ranks
    (``tokens``, ``attention_pairs``, ``mlm_count``, ``pair_count``), so the whole step's model
    FLOPs come from them without keeping per-sequence lengths. Integers in, an exact count out
    (as a float); floats are accepted since reduced totals are float tensors."""
    for name, value in (("tokens", tokens), ("attention_pairs", attention_pairs),
                        ("masked_tokens", masked_tokens), ("pair_sequences", pair_sequences)):
        if isinstance(value, bool) or not value >= 0:  # `not >=` also refuses NaN
            raise ValueError(f"{name} must be a non-negative number, not {value!r}")
    d = _dims(config)
    forward = (d.layers * (tokens * layer_multiply_adds_per_token(config)
                           + attention_multiply_adds_per_pair(config) * attention_pairs)
               + tokens * embedding_multiply_adds_per_token(config)
               + masked_tokens * mlm_head_multiply_adds(config)
               + pair_sequences * pair_head_multiply_adds(config))
    return float(TRAINING_PASSES * FLOPS_PER_MULTIPLY_ADD * forward)


def step_flops(config: EncoderConfig, sequence_lengths: "Iterable[int] | torch.Tensor", masked_tokens: int,
               pair_sequences: int) -> float:
    """Training (forward + backward) model FLOPs of one optimizer step's real tokens.

    ``sequence_lengths``: every sequence's real length (a list of ints or a 1-D integer tensor),
    over all micro-batches and ranks of the step. ``masked_tokens``: positions the MLM head ran
    on. ``pair_sequences``: sequences with a pair label (0 when no pair objective is trained). Attention is counted
    on each sequence's own length, so two sequences of 64 cost less than one of 128."""
    lengths = _lengths(sequence_lengths)
    masked = _count(masked_tokens, "masked_tokens")
    pairs = _count(pair_sequences, "pair_sequences")
    tokens = sum(lengths)
    if masked > tokens:
        raise ValueError(f"{masked} masked tokens but only {tokens} real tokens")
    if pairs > len(lengths):
        raise ValueError(f"{pairs} pair-labelled sequences but only {len(lengths)} sequences")
    return step_flops_from_counts(config, tokens, sum(n * n for n in lengths), masked, pairs)


def padded_positions_fraction(sequence_lengths: "Iterable[int] | torch.Tensor", computed_positions: int) -> float:
    """Share of the positions the encoder computed that were padding: 1 − Σ n / computed.

    ``computed_positions`` is what the encoder really processed: batch × padded length for a
    padded batch, the bucketed (rounded-up) token total for an unpadded one. Model FLOPs
    (:func:`step_flops`) leave this share out; this says how much compute it was."""
    real = sum(_lengths(sequence_lengths))
    positions = _count(computed_positions, "computed_positions")
    if positions < real:
        raise ValueError(f"computed_positions {positions} is fewer than the {real} real tokens")
    return (positions - real) / positions if positions else 0.0


def _count(value: Any, name: str) -> int:
    """A non-negative integer (Python, numpy or 0-d integer tensor), or a clear error."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, not a bool")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, not {type(value).__name__} {value!r}") from None
    if number < 0:
        raise ValueError(f"{name} must be non-negative, not {number}")
    return number


def _lengths(sequence_lengths: "Iterable[int] | torch.Tensor") -> list[int]:
    """Sequence lengths as Python ints; a tensor must be 1-D and of an integer dtype."""
    if type(sequence_lengths).__module__.startswith("torch"):
        import torch

        if isinstance(sequence_lengths, torch.Tensor):
            if sequence_lengths.dim() != 1:
                raise ValueError(f"sequence_lengths must be 1-D, not of shape {tuple(sequence_lengths.shape)}")
            if sequence_lengths.dtype.is_floating_point or sequence_lengths.dtype.is_complex \
                    or sequence_lengths.dtype == torch.bool:
                raise TypeError(f"sequence_lengths must have an integer dtype, not {sequence_lengths.dtype}")
            sequence_lengths = sequence_lengths.tolist()
    return [_count(n, "a sequence length") for n in sequence_lengths]


# ---------------------------------------------------------------------------------------------
# Device peaks
# ---------------------------------------------------------------------------------------------

PRECISIONS = ("bf16", "fp16", "tf32", "fp32", "fp8")
_PRECISION_ALIASES = MappingProxyType({"bfloat16": "bf16", "float16": "fp16", "half": "fp16",
                                       "float32": "fp32", "float": "fp32", "float8": "fp8"})


@dataclass(frozen=True)
class DevicePeak:
    """One GPU's dense peak throughput in FLOP/s (no sparsity), by math mode.

    ``bf16``/``fp16``: tensor cores with FP32 accumulation (what PyTorch's mixed precision runs);
    ``tf32``: tensor cores on FP32 inputs (only if TF32 matmuls are enabled); ``fp32``: the
    non-tensor FP32 units (plain FP32 training, PyTorch's default); ``fp8``: tensor cores on FP8
    (E4M3/E5M2) inputs, from Ada and Hopper on (``torch._scaled_mm``, which torchao's float8
    training runs). ``None``: no such math."""

    name: str
    bf16: float | None
    fp16: float | None
    tf32: float | None
    fp32: float | None
    fp8: float | None = None

    def flops(self, precision: str) -> float | None:
        """The peak for a precision name: bf16, fp16, tf32, fp32 or fp8 (or bfloat16, float16, ...)."""
        return getattr(self, normalise_precision(precision))


def normalise_precision(precision: str) -> str:
    """``bf16``/``fp16``/``tf32``/``fp32``/``fp8`` for a precision name; an unknown one is an error."""
    key = str(precision).strip().lower()
    key = _PRECISION_ALIASES.get(key, key)
    if key not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    return key


@dataclass(frozen=True)
class _Spec:
    peak: DevicePeak
    sms: int  # streaming multiprocessors of the whole product; a MIG slice has fewer


def _spec(name: str, sms: int, *, tensor16: float | None, tf32: float | None, fp32: float,
          fp16: float | None = None, fp8: float | None = None) -> _Spec:
    """A row: ``tensor16`` is the BF16 and FP16 tensor peak (equal from Ampere on); ``fp16``
    overrides FP16 alone (Volta: FP16 tensor cores, no BF16); ``fp8`` is the FP8 tensor peak
    (None before Ada and Hopper)."""
    return _Spec(DevicePeak(name, bf16=tensor16, fp16=tensor16 if fp16 is None else fp16, tf32=tf32, fp32=fp32,
                            fp8=fp8), sms)


_T = 1e12
# Dense figures. "N*" below is a data-sheet figure quoted with 2:4 sparsity; the dense peak is
# N*/2 ("specifications one-half lower without sparsity", in NVIDIA's footnotes).
_SPECS: Mapping[str, _Spec] = MappingProxyType({
    # NVIDIA H100 Tensor Core GPU Architecture whitepaper, table "NVIDIA A100 vs H100 data center
    # GPUs", H100 SXM5 column: FP32 66.9, TF32 494.7 (989.4*), BF16/FP16 989.4 (1978.9*), FP8
    # 1978.9 (3957.8*) TFLOPS. The data sheet (https://www.nvidia.com/en-us/data-center/h100/)
    # rounds these to 67, 989*, 1,979*, 3,958*.
    "h100-sxm": _spec("NVIDIA H100 SXM", 132, tensor16=989.4 * _T, tf32=494.7 * _T, fp32=66.9 * _T,
                      fp8=1978.9 * _T),
    # https://www.nvidia.com/en-us/data-center/h100/ (H100 PCIe product brief PB-11133, same
    # figures): FP32 51, TF32 756*, BF16/FP16 1,513*, FP8 3,026* TFLOPS -> 378, 756.5 and 1,513 dense.
    "h100-pcie": _spec("NVIDIA H100 PCIe", 114, tensor16=756.5 * _T, tf32=378.0 * _T, fp32=51.0 * _T,
                       fp8=1513.0 * _T),
    # https://www.nvidia.com/en-us/data-center/h100/, H100 NVL column (per GPU; 94 GB):
    # FP32 60, TF32 835*, BF16/FP16 1,671*, FP8 3,341* TFLOPS -> 417.5, 835.5 and 1,670.5 dense.
    # (The launch data sheet of 2023 quoted the NVL pair: twice the SXM figures; the page now
    # lists one GPU.)
    "h100-nvl": _spec("NVIDIA H100 NVL", 132, tensor16=835.5 * _T, tf32=417.5 * _T, fp32=60.0 * _T,
                      fp8=1670.5 * _T),
    # https://www.nvidia.com/en-us/data-center/h200/, H200 SXM column: FP32 67, TF32 989*,
    # BF16/FP16 1,979*, FP8 3,958* TFLOPS: the H100 SXM5's GH100 configuration (132 SMs, same
    # clocks) with more memory, so the whitepaper's unrounded H100 SXM5 figures above.
    "h200-sxm": _spec("NVIDIA H200 SXM", 132, tensor16=989.4 * _T, tf32=494.7 * _T, fp32=66.9 * _T,
                      fp8=1978.9 * _T),
    # https://www.nvidia.com/en-us/data-center/h200/, H200 NVL column: FP32 60, TF32 835*,
    # BF16/FP16 1,671*, FP8 3,341* TFLOPS -> 417.5, 835.5 and 1,670.5 dense.
    "h200-nvl": _spec("NVIDIA H200 NVL", 132, tensor16=835.5 * _T, tf32=417.5 * _T, fp32=60.0 * _T,
                      fp8=1670.5 * _T),
    # https://www.nvidia.com/en-us/data-center/a100/ and the A100 data sheet
    # (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): FP32 19.5, TF32 156 (312*),
    # BF16/FP16 312 (624*) TFLOPS, the same for 40 GB and 80 GB, PCIe and SXM4. The name is made
    # per variant (see _a100). No FP8 tensor cores (compute capability 8.0).
    "a100": _spec("NVIDIA A100", 108, tensor16=312.0 * _T, tf32=156.0 * _T, fp32=19.5 * _T),
    # https://www.nvidia.com/en-us/data-center/l40s/ (L40S data sheet): FP32 91.6, TF32 183
    # (366*), BF16/FP16 362.05 (733*), FP8 733 (1,466*) TFLOPS; the dense figures are used.
    # Caveat: the L40 data sheet gives the same AD102 die (142 SMs, 2.49 vs 2.52 GHz) 181.05 dense
    # BF16 and 362 dense FP8, so NVIDIA's L40S figures are likely the FP16-accumulate rates; if
    # PyTorch's FP32-accumulate GEMMs run at half of them, MFU on an L40S is understated by up to
    # 2x (conservative, never overstated).
    "l40s": _spec("NVIDIA L40S", 142, tensor16=362.05 * _T, tf32=183.0 * _T, fp32=91.6 * _T, fp8=733.0 * _T),
    # NVIDIA Tesla V100 data sheet and https://developer.nvidia.com/programming-tensor-cores-cuda-9-0
    # ("up to 125 Tensor TFLOPS"): V100 SXM2 tensor 125 TFLOPS (FP16 in, FP32 accumulate; Volta
    # has no sparsity), FP32 15.7; V100 PCIe tensor 112, FP32 14. No BF16, no TF32 on Volta.
    "v100-sxm2": _spec("NVIDIA V100 SXM2", 80, tensor16=None, fp16=125.0 * _T, tf32=None, fp32=15.7 * _T),
    "v100-pcie": _spec("NVIDIA V100 PCIe", 80, tensor16=None, fp16=112.0 * _T, tf32=None, fp32=14.0 * _T),
})

_GIB = 1024 ** 3


def _has(name: str, token: str) -> bool:
    """Whether ``token`` is a whole word of ``name`` (so "H200" does not match "GH200")."""
    return re.search(rf"(?<![A-Z0-9]){re.escape(token)}(?![A-Z0-9])", name) is not None


def _h100(name: str, memory: int | None, sms: int | None) -> str | None:
    if "NVL" in name:
        return "h100-nvl"
    if "PCIE" in name:
        return "h100-pcie"
    if "SXM" in name or "HBM3" in name:  # "NVIDIA H100 80GB HBM3" is the SXM5 board
        return "h100-sxm"
    if sms == 114:  # a bare "H100": tell the boards apart by their SM count and memory
        return "h100-pcie"
    if sms == 132 and memory is not None:
        return "h100-nvl" if memory > 86 * _GIB else "h100-sxm"  # 94 GB vs 80 GB
    return None


def _h200(name: str, memory: int | None, sms: int | None) -> str | None:
    return "h200-nvl" if "NVL" in name else "h200-sxm"


def _a100(name: str, memory: int | None, sms: int | None) -> str | None:
    return "a100"


def _l40s(name: str, memory: int | None, sms: int | None) -> str | None:
    return "l40s"


def _v100(name: str, memory: int | None, sms: int | None) -> str | None:
    if "SXM2" in name:
        return "v100-sxm2"
    if "PCIE" in name:
        return "v100-pcie"
    return None  # SXM3 (DGX-2), FHHL, ...: other clocks, no figures here


# Family token -> variant chooser. Order matters only in that the tokens are whole words.
_FAMILIES: tuple[tuple[str, Callable[[str, int | None, int | None], str | None]], ...] = (
    ("H100", _h100), ("H200", _h200), ("A100", _a100), ("L40S", _l40s), ("V100", _v100),
)


def device_peak(name: str, total_memory_bytes: int | None = None,
                multiprocessor_count: int | None = None) -> DevicePeak | None:
    """The dense peaks of the GPU called ``name`` (``torch.cuda.get_device_name``), told apart
    by name and, where the name is not enough, by memory and SM count; ``None`` if unknown.

    A MIG slice (fewer SMs than the whole product) gets the whole product's peaks scaled by its
    share of SMs; more SMs than the product has means a part this table does not describe."""
    upper = name.upper()
    for token, choose in _FAMILIES:
        if _has(upper, token):
            key = choose(upper, total_memory_bytes, multiprocessor_count)
            break
    else:
        return None
    if key is None:
        return None
    spec = _SPECS[key]
    peak = spec.peak
    if key == "a100":
        peak = replace(peak, name=_a100_name(upper, total_memory_bytes))
    return _sliced(peak, spec.sms, multiprocessor_count)


def _a100_name(name: str, memory: int | None) -> str:
    """"NVIDIA A100 SXM4 80GB" and the like: the form factor and memory the name or memory say."""
    parts = ["NVIDIA A100"]
    if "PCIE" in name:
        parts.append("PCIe")
    elif "SXM" in name:
        parts.append("SXM4")
    if "80GB" in name or (memory is not None and "40GB" not in name and memory > 60 * _GIB):
        parts.append("80GB")
    elif "40GB" in name or memory is not None:
        parts.append("40GB")
    return " ".join(parts)


def _sliced(peak: DevicePeak, full_sms: int, sms: int | None) -> DevicePeak | None:
    if sms is None or sms == full_sms:
        return peak
    if sms <= 0 or sms > full_sms:
        return None
    share = sms / full_sms

    def scale(value: float | None) -> float | None:
        return None if value is None else value * share

    return DevicePeak(f"{peak.name} (MIG slice, {sms}/{full_sms} SMs)", bf16=scale(peak.bf16),
                      fp16=scale(peak.fp16), tf32=scale(peak.tf32), fp32=scale(peak.fp32), fp8=scale(peak.fp8))


def peak_flops(precision: str, device: "torch.device | str | int | None" = None) -> float | None:
    """Dense peak FLOP/s of one GPU for ``precision`` (bf16, fp16, tf32, fp32 or fp8), read off
    ``torch.cuda.get_device_properties``; ``None`` on a CPU, on an unknown GPU, or where the GPU
    has no such math (BF16 on a V100, FP8 on an A100). ``device=None``: the current CUDA device,
    if any. (fp8: see the module doc on what an fp8 run's MFU means.)

    Pass ``tf32`` rather than ``fp32`` when FP32 training runs its matmuls on TF32 tensor cores
    (``torch.backends.cuda.matmul.allow_tf32``); PyTorch's default is true FP32."""
    normalise_precision(precision)  # an unknown precision is an error even on a CPU
    import torch

    if device is None:
        if not torch.cuda.is_available():
            return None
        device = torch.device("cuda", torch.cuda.current_device())
    elif isinstance(device, int):
        device = torch.device("cuda", device)
    else:
        device = torch.device(device)
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    peak = device_peak(props.name, props.total_memory, props.multi_processor_count)
    return None if peak is None else peak.flops(precision)


def mfu(flops: float, seconds: float, peak: float, world_size: int) -> float:
    """Model-FLOPs utilisation: ``flops`` done by all ``world_size`` GPUs in ``seconds``, over
    what they could do at ``peak`` FLOP/s each."""
    if not seconds > 0:
        raise ValueError(f"seconds must be positive, not {seconds!r}")
    if not peak > 0:
        raise ValueError(f"peak must be positive, not {peak!r}")
    if _count(world_size, "world_size") < 1:
        raise ValueError("world_size must be at least 1")
    return flops / (seconds * peak * world_size)
