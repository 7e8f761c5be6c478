"""``--precision fp8``: torchao's float8 training in the encoder's Linear layers, bf16 autocast elsewhere.

What runs in FP8. Every ``nn.Linear`` inside the encoder's layer stack (``bert.encoder``,
``roberta.encoder``, ``albert.encoder``): each layer's Q, K, V and attention-output projections
and both feed-forward projections (ALBERT: also ``embedding_hidden_mapping_in``, E→H). They hold
nearly all of a step's FLOPs (:mod:`pretrain.flops`: 4·h² + 2·h·i multiply-adds a token a layer).
torchao's ``convert_to_float8_training`` swaps each for a ``Float8Linear`` whose three matmuls
(output, input gradient, weight gradient) run ``torch._scaled_mm`` on FP8 tensor cores.

What does not, and why (:func:`encoder_linear_filter` selects by module path):

* the MLM decoder: its weight *is* the word-embedding matrix (tied), and the vocabulary logits
  feed a softmax over 30k classes; it runs on the masked ~15% of tokens only. Vocabulary sizes are
  rarely multiples of 16 (30,522 is not), which FP8 matmuls need anyway;
* the MLM head's transform (dense + LayerNorm before the decoder): masked tokens only, a few per
  cent of the FLOPs, and the input of that softmax;
* the pooler and the pair head (NSP/SOP/DRP): one row per sequence, so casting to FP8 costs more
  than the matmul saves, and the classifier's 2-3 outputs are not a multiple of 16;
* embeddings, LayerNorms, softmax, attention scores (QKᵀ, AV: the attention kernel's own
  bf16 matmuls) and the losses: bf16 autocast as ``--precision bf16`` runs them (DeepSpeed's
  ``torch_autocast`` section, fp32 weights, gradients and optimizer).

An encoder Linear whose in- or out-features are not a multiple of 16 (``torch._scaled_mm``'s
constraint) is left in bf16 and counted (:class:`Fp8Plan`; a warning names it). Every shipped
preset's sizes are multiples of 16.

Recipe. ``tensorwise`` (torchao's default ``Float8LinearConfig()``): dynamic scaling, one scale per
tensor computed from the current absolute maximum on every call (no amax history, no state);
E4M3 for inputs and weights, E5M2 for output gradients; fast accumulation in the forward matmul
only. ``rowwise`` (``Float8LinearConfig.from_recipe_name("rowwise")``: one scale per row, E4M3
throughout, power-of-2 scales; slower, closer to bf16) is available from Python
(``convert_encoder_to_fp8(..., recipe="rowwise")``) but has no flag and has not been run here.
Both set ``pad_inner_dim=True``: the weight-gradient matmul contracts over the micro-batch's token
count, which varies in the unpadded layout (a multiple of ``bucket_tokens`` only when compiled), and
torchao pads it to a multiple of 16 instead of failing.

Checkpoints and exports are unchanged. ``Float8Linear.from_float`` builds the new module on the
meta device and assigns the old module's ``weight`` and ``bias`` Parameters to it, the same
objects, in the same precision (fp32 here): the casts to FP8 happen inside each matmul and nothing
FP8 is stored. So parameter names, ``state_dict`` keys, shapes and dtypes are those of the plain
model (no buffers are added with dynamic scaling), DeepSpeed checkpoints resume under
``--precision bf16`` or ``fp32`` and back, and ``save_pretrained`` exports plain ``nn.Linear`` weights
that transformers loads as usual. (With ``enable_fsdp_float8_all_gather``, which this module never
sets, the weight would become a tensor subclass.)

Where it runs: an NVIDIA GPU of compute capability 8.9 or newer (Ada: L4, L40S; Hopper: H100,
H200; Blackwell), a torch with ``torch._scaled_mm`` and FP8 dtypes, and torchao
(``pip install torchao``, a release made for the installed torch). :func:`check_fp8` refuses
anything else before the run starts (:class:`PretrainConfigError`, exit 2). Whether FP8 is faster
depends on the matmul sizes: torchao's own tables (H100) show gains from roughly 4096-wide layers
on; at BERT-base sizes (768, 3072) the casts can cost what the FP8 matmuls save. Measure tokens/s
against bf16 before a long run.
"""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

from biomed_lm.pretrain.config import PretrainConfigError

if TYPE_CHECKING:
    from biomed_lm.pretrain.families import ModelFamily

LOG = logging.getLogger(__name__)

#: FP8 tensor cores: Ada (8.9), Hopper (9.0) and later.
MIN_CAPABILITY = (8, 9)
#: torch._scaled_mm's alignment: both dimensions of an FP8 weight must be multiples of this.
ALIGNMENT = 16
RECIPES = ("tensorwise", "rowwise")
INSTALL_HINT = ("pip install torchao (a release made for torch {torch}; it is not a dependency of this toolkit "
                "and is needed for --precision fp8 only)")


def training_device() -> torch.device:
    """The device this process will train on, as :func:`biomed_lm.backend.local_device` picks it
    (the ``LOCAL_RANK``-th GPU, or the CPU), without making it current."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def fp8_unavailable_reason(device: torch.device | str | None = None) -> str | None:
    """Why FP8 training cannot run on ``device`` (default: :func:`training_device`), or None when
    it can: the device, its compute capability, torch's FP8 support and torchao are checked in that
    order, and the first thing missing is named with what to do."""
    device = training_device() if device is None else torch.device(device)
    if device.type != "cuda":
        return (f"it needs an NVIDIA GPU of compute capability {_version(MIN_CAPABILITY)} or newer (L4, L40S, H100, "
                f"H200, B200), and this process trains on the {device.type.upper()}: use --precision bf16 on an "
                "older GPU, or fp32 on the CPU")
    if not torch.cuda.is_available():
        return "it needs a CUDA GPU, and torch sees none here (torch.cuda.is_available() is false)"
    if getattr(torch.version, "hip", None):
        return "torchao's float8 training is used here on NVIDIA GPUs only (this torch is a ROCm build)"
    index = device.index if device.index is not None else torch.cuda.current_device()
    capability = tuple(torch.cuda.get_device_capability(index))
    if capability < MIN_CAPABILITY:
        return (f"{torch.cuda.get_device_name(index)} (cuda:{index}) has compute capability {_version(capability)}; "
                f"FP8 tensor cores need {_version(MIN_CAPABILITY)} or newer (Ada: L4, L40S; Hopper: H100, H200; "
                "Blackwell): use --precision bf16 on this GPU")
    missing = [name for name in ("float8_e4m3fn", "float8_e5m2", "_scaled_mm") if not hasattr(torch, name)]
    if missing:
        return (f"torch {torch.__version__} has no {', '.join('torch.' + name for name in missing)} (FP8 dtypes and "
                "scaled matmul): upgrade torch, then install the torchao release made for it")
    return _torchao_unavailable_reason()


def check_fp8(device: torch.device | str | None = None) -> None:
    """Refuse ``--precision fp8`` where it cannot run, with :func:`fp8_unavailable_reason`'s reason."""
    reason = fp8_unavailable_reason(device)
    if reason is not None:
        raise PretrainConfigError(f"--precision fp8 (torchao float8 training) cannot run here: {reason}")


def _torchao_unavailable_reason() -> str | None:
    hint = INSTALL_HINT.format(torch=torch.__version__.split("+")[0])
    try:
        float8 = importlib.import_module("torchao.float8")
    except ModuleNotFoundError as err:
        if err.name in ("torchao", "torchao.float8"):
            return f"torchao is not installed: {hint}"
        return f"torchao.float8 cannot be imported ({err}): {hint}"
    except Exception as err:  # an install built for another torch fails in many ways
        return f"torchao.float8 cannot be imported ({type(err).__name__}: {err}); reinstall it: {hint}"
    missing = [name for name in ("convert_to_float8_training", "Float8LinearConfig") if not hasattr(float8, name)]
    if missing:
        return f"this torchao ({getattr(importlib.import_module('torchao'), '__version__', '?')}) lacks " \
               f"torchao.float8.{' and '.join(missing)}: upgrade it: {hint}"
    return None


def _version(capability: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in capability)


# ----------------------------------------------------------------------------- the conversion

@dataclass
class Fp8Plan:
    """Which of a model's Linear layers run in FP8 (``converted``) and which encoder Linear layers
    stay in bf16 because a dimension is not a multiple of 16 (``skipped``: path -> shape), by module
    path in the model."""

    converted: list[str] = field(default_factory=list)
    skipped: dict[str, tuple[int, int]] = field(default_factory=dict)

    def describe(self, recipe: str = "tensorwise") -> str:
        text = (f"fp8: torchao float8 training ({recipe} scaling) in {len(self.converted)} encoder Linear layer(s), "
                "bf16 autocast elsewhere")
        if self.skipped:
            text += (f"; {len(self.skipped)} left in bf16 (a dimension not a multiple of {ALIGNMENT}: "
                     + ", ".join(f"{path} {out}x{inp}" for path, (out, inp) in self.skipped.items()) + ")")
        return text


def encoder_linear_filter(family: ModelFamily, plan: Fp8Plan | None = None) -> Callable[[nn.Module, str], bool]:
    """torchao's ``module_filter_fn(module, fqn)``: true for a plain ``nn.Linear`` inside the
    family's encoder layer stack (``<encoder>.encoder.``) whose dimensions are multiples of 16.
    Heads, pooler and decoder are outside that path (the module doc says why). ``plan`` collects
    the verdicts. A module already converted (a subclass of ``nn.Linear``) is not selected again."""
    prefix = f"{family.encoder}.encoder."

    def module_filter_fn(module: nn.Module, fqn: str) -> bool:
        if type(module) is not nn.Linear or not fqn.startswith(prefix):
            return False
        if module.in_features % ALIGNMENT or module.out_features % ALIGNMENT:
            if plan is not None:
                plan.skipped[fqn] = (module.out_features, module.in_features)
            return False
        if plan is not None and fqn not in plan.converted:
            plan.converted.append(fqn)
        return True

    return module_filter_fn


def plan_fp8(model: nn.Module, family: ModelFamily | None = None) -> Fp8Plan:
    """What :func:`convert_encoder_to_fp8` would convert and skip, without torchao or any change."""
    plan = Fp8Plan()
    select = encoder_linear_filter(family or _family(model), plan)
    for fqn, module in model.named_modules():
        select(module, fqn)
    return plan


def fp8_config(recipe: str = "tensorwise", **overrides: Any):
    """torchao's ``Float8LinearConfig`` for ``recipe`` with ``pad_inner_dim=True`` (and ``overrides``)."""
    import dataclasses

    from torchao.float8 import Float8LinearConfig

    if recipe not in RECIPES:
        raise PretrainConfigError(f"fp8 recipe {recipe!r}: choose one of {', '.join(RECIPES)}")
    config = Float8LinearConfig() if recipe == "tensorwise" else Float8LinearConfig.from_recipe_name(recipe)
    return dataclasses.replace(config, **{"pad_inner_dim": True, **overrides})


def convert_encoder_to_fp8(model: nn.Module, family: ModelFamily | None = None, *, recipe: str = "tensorwise",
                           config: Any = None) -> int:
    """Swap the encoder's Linear layers of ``model`` (a ``BertForPreTraining``, ``AlbertForPreTraining``
    or ``RobertaForMaskedLM``; ``family`` read off its config when not given) for torchao's
    ``Float8Linear``, in place; the number converted. torchao is imported here, not before.
    ``config``: a ``Float8LinearConfig`` to use instead of :func:`fp8_config`'s for ``recipe``."""
    from torchao.float8 import convert_to_float8_training

    plan = Fp8Plan()
    convert_to_float8_training(model, module_filter_fn=encoder_linear_filter(family or _family(model), plan),
                               config=config if config is not None else fp8_config(recipe))
    if plan.skipped:
        LOG.warning(plan.describe(recipe))
    else:
        LOG.info(plan.describe(recipe))
    return len(plan.converted)


def _family(model: nn.Module) -> ModelFamily:
    from biomed_lm.pretrain.families import family_of

    return family_of(model.config)
