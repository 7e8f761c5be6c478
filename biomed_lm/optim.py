"""Optimizers and learning-rate schedules both trainers use: pretraining (the PubMedBERT and BioALBERT
recipes) and fine-tuning.

What the papers prescribe, and what this module provides for it:

* PubMedBERT (Gu et al., section 2.5) follows NVIDIA's TensorFlow BERT recipe: Adam with decoupled
  weight decay, peak learning rate 6e-4, betas (0.9, 0.999), eps 1e-6, weight decay 0.01 on every
  weight except biases and LayerNorm parameters, and a *slanted triangular* schedule: linear warm-up
  from 0 to the peak over the first 10% of the steps, then linear decay to 0 at the end.
  :func:`parameter_groups` + :func:`build_optimizer` ``("adamw", ...)`` + :func:`slanted_triangular`.
  One deliberate difference: NVIDIA's TF ``AdamWeightDecayOptimizer`` has no bias correction;
  ``torch.optim.AdamW`` (and every fused AdamW) has it. Without it, early steps are larger by
  ``(1 - b1^t) / sqrt(1 - b2^t)`` (x6.5 at step 10, x1.26 at step 1,000, within 1% from step
  ~3,900): all inside the paper's 6,250-step warm-up, where the learning rate is still small.
* BioALBERT trains with LAMB, as NVIDIA's large-batch BERT recipe does. :class:`Lamb` is a
  pure-PyTorch LAMB with exactly the semantics of NVIDIA apex's ``FusedLAMB`` (the optimizer of
  NVIDIA's PyTorch BERT recipe), so a run may use apex on a GPU and this class elsewhere and get the
  same algorithm; see the class docstring for the formulas and for why DeepSpeed's ``FusedLamb``,
  a different variant, is never substituted for it.
* Schedules are pure functions of the optimizer step (:func:`slanted_triangular`,
  :func:`polynomial_decay`, :func:`constant_with_warmup`) returning a factor of the peak learning
  rate, and :func:`build_lr_scheduler` turns one into a ``torch.optim.lr_scheduler.LambdaLR`` (which
  multiplies each group's own learning rate by the factor). Being pure functions of the step, a
  resumed run gets exactly the learning rates an uninterrupted one would.

Optional fused implementations (DeepSpeed ops, apex) are imported lazily, only when asked for, and a
missing or broken one costs a logged fallback, never a failed run. Nothing here keeps global state.
"""

from __future__ import annotations

import functools
import logging
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Sequence, get_args

import torch
from torch import nn

from biomed_lm.backend import OptimizerName, ScheduleName


logger = logging.getLogger(__name__)

# The paper's pretraining hyperparameters (PubMedBERT, section 2.5; NVIDIA's TF BERT recipe).
PAPER_PEAK_LR = 6e-4
PAPER_BETAS = (0.9, 0.999)
PAPER_EPS = 1e-6
PAPER_WEIGHT_DECAY = 0.01
PAPER_WARMUP_RATIO = 0.1

# The choice sets are biomed_lm.backend's Literals (what --help and the config checks list), defined once.
OPTIMIZER_NAMES: tuple[str, ...] = get_args(OptimizerName)
SCHEDULE_NAMES: tuple[str, ...] = get_args(ScheduleName)

__all__ = [
    "PAPER_PEAK_LR", "PAPER_BETAS", "PAPER_EPS", "PAPER_WEIGHT_DECAY", "PAPER_WARMUP_RATIO",
    "OPTIMIZER_NAMES", "SCHEDULE_NAMES", "ScheduleConfig", "BuiltOptimizer",
    "is_norm_module", "is_bias_parameter", "parameter_groups", "summarize_parameter_groups",
    "Lamb", "build_optimizer",
    "warmup_steps", "slanted_triangular", "polynomial_decay", "polynomial_from_start", "constant_with_warmup",
    "schedule_factor", "learning_rate_at", "lr_lambda", "build_lr_scheduler",
]


# --------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScheduleConfig:
    """Learning-rate schedule options; the default is the paper's slanted triangular schedule.

    ``warmup_ratio`` is the fraction of the total steps spent warming up linearly from 0 (every
    schedule here has the same warm-up). ``lr_power`` and ``end_lr`` are the polynomial schedules':
    after the warm-up they decay to ``end_lr`` as ``(remaining fraction) ** lr_power``, the fraction of the
    decay's span (``polynomial``, HF's) or of the whole run (``polynomial_from_start``, NVIDIA's);
    ``end_lr`` is absolute, relative to the optimizer's default learning rate (see
    :func:`build_lr_scheduler`), the convention of HF's polynomial schedule.
    """

    lr_schedule: ScheduleName = "slanted_triangular"
    warmup_ratio: float = PAPER_WARMUP_RATIO
    lr_power: float = 1.0
    end_lr: float = 0.0

    def __post_init__(self) -> None:
        if self.lr_schedule not in SCHEDULE_NAMES:
            raise ValueError(f"lr_schedule must be one of {SCHEDULE_NAMES}, got {self.lr_schedule!r}")
        _check_warmup_ratio(self.warmup_ratio)
        if not (self.lr_power > 0 and math.isfinite(self.lr_power)):
            raise ValueError(f"lr_power must be a positive finite number, got {self.lr_power!r}")
        if not (self.end_lr >= 0 and math.isfinite(self.end_lr)):
            raise ValueError(f"end_lr must be a finite number >= 0, got {self.end_lr!r}")


@dataclass(frozen=True)
class BuiltOptimizer:
    """What :func:`build_optimizer` chose, for the run log.

    ``implementation`` names the class that runs the step (e.g. ``"apex.optimizers.FusedLAMB"``,
    ``"torch.optim.AdamW(fused=True)"``, ``"biomed_lm.optim.Lamb(kernel=fused_adam)"``);
    ``fallbacks`` says, in order, why each preferred implementation was not used.
    """

    optimizer: torch.optim.Optimizer
    implementation: str
    fallbacks: tuple[str, ...] = ()


def _check_hyperparameters(lr: float, betas: Sequence[float], eps: float, weight_decay: float) -> None:
    if not (lr >= 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a finite number >= 0, got {lr!r}")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"betas must be two numbers in [0, 1), got {tuple(betas)!r}")
    # eps > 0, not >= 0: a parameter whose gradient has always been 0 has m = v = 0, and 0/0 is NaN.
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
    if not (weight_decay >= 0 and math.isfinite(weight_decay)):
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}")


def _check_max_grad_norm(max_grad_norm: float | None) -> None:
    if max_grad_norm is not None and not (max_grad_norm > 0):
        raise ValueError(f"max_grad_norm must be > 0, or None to turn the pre-normalization off; "
                         f"got {max_grad_norm!r}")


# --------------------------------------------------------------------------------------------
# Parameter groups
# --------------------------------------------------------------------------------------------

# Normalization layers, by type. The class-name suffixes below catch the many that do not subclass
# these (HF's T5LayerNorm and LlamaRMSNorm, apex's FusedLayerNorm, DeepSpeed's kernels...), whose
# parameters may be called weight/bias, gamma/beta (TF-converted checkpoints) or scale.
_NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.BatchNorm1d, nn.BatchNorm2d,
    nn.BatchNorm3d, nn.SyncBatchNorm, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d,
)
_NORM_CLASS_SUFFIXES = ("layernorm", "rmsnorm", "groupnorm", "batchnorm", "instancenorm")


def is_norm_module(module: nn.Module) -> bool:
    """Whether ``module`` is a normalization layer (by type, or by a ``...LayerNorm``-style class name).

    Deciding by module, not by parameter name, is what makes every LayerNorm count: a name rule
    (``"LayerNorm" in name``) misses ``ln_f.weight``, ``norm.gamma`` or ``final_layer_norm.scale``.
    """
    return isinstance(module, _NORM_TYPES) or type(module).__name__.lower().endswith(_NORM_CLASS_SUFFIXES)


def is_bias_parameter(local_name: str) -> bool:
    """Whether a parameter's own name (without its module path) makes it a bias.

    ``bias``, and names with ``bias`` as an underscore-separated part, such as
    ``nn.MultiheadAttention``'s ``in_proj_bias``, ``bias_k`` and ``bias_v``.
    """
    return "bias" in local_name.lower().split("_")


def parameter_groups(model: nn.Module, weight_decay: float = PAPER_WEIGHT_DECAY) -> list[dict[str, Any]]:
    """Split ``model``'s trainable parameters into a weight-decay group and a no-decay group.

    No decay for biases and for every parameter of a normalization layer (decided by module type,
    see :func:`is_norm_module`; this includes the embeddings' LayerNorm), as in BERT's recipe
    (``exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]``): decaying a LayerNorm gain
    towards 0 or a bias towards 0 is a prior nobody wants. Embedding matrices are decayed, as in
    BERT. Shared (tied) parameters appear once, under their first name, exactly as in
    ``model.named_parameters()``; frozen parameters (``requires_grad=False``) are left out.

    Returns torch param-group dicts that say what they hold: ``{"name": "decay" | "no_decay",
    "params": [...], "param_names": [...], "weight_decay": float}``; an empty group is omitted.
    ``param_names`` is torch's own key for named parameters, so optimizers keep it in their
    ``state_dict`` and checkpoints name every tensor.
    """
    if not (weight_decay >= 0 and math.isfinite(weight_decay)):
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}")
    decay: list[tuple[str, nn.Parameter]] = []
    no_decay: list[tuple[str, nn.Parameter]] = []
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        norm = is_norm_module(module)
        for local_name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            if not param.requires_grad:
                continue
            full_name = f"{module_name}.{local_name}" if module_name else local_name
            (no_decay if norm or is_bias_parameter(local_name) else decay).append((full_name, param))
    if not decay and not no_decay:
        raise ValueError(f"{type(model).__name__} has no trainable parameters")
    groups = []
    for name, members, group_decay in (("decay", decay, float(weight_decay)), ("no_decay", no_decay, 0.0)):
        if members:
            groups.append({"name": name, "params": [p for _, p in members],
                           "param_names": [n for n, _ in members], "weight_decay": group_decay})
    return groups


def summarize_parameter_groups(groups: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per group for the run log: name, weight decay, number of tensors and of elements."""
    return [{"name": group.get("name", f"group{i}"), "weight_decay": group.get("weight_decay"),
             "tensors": len(group["params"]), "elements": sum(p.numel() for p in group["params"])}
            for i, group in enumerate(groups)]


# --------------------------------------------------------------------------------------------
# LAMB
# --------------------------------------------------------------------------------------------

# Tensors are processed in chunks of at most this many elements (a tensor larger than that is a
# chunk of its own), so the update buffer LAMB needs before it knows the trust ratio is bounded by
# one chunk, not a full copy of the model, and stays cache-resident between the passes over it.
_CHUNK_ELEMENTS = 1 << 22
_FUSED_DEVICE_TYPES = ("cpu", "cuda")
LambKernel = Literal["fused_adam", "foreach"]


class Lamb(torch.optim.Optimizer):
    r"""LAMB (You et al., 2019) with the semantics of NVIDIA apex's ``FusedLAMB``, in pure PyTorch.

    For every parameter tensor ``w`` with gradient ``g``, at its step ``t`` (counted per tensor):

    1. global pre-normalization (apex's ``max_grad_norm``): with ``N = ||(g_1, ..., g_n)||_2`` over
       *all* gradients of *all* groups, ``g <- g / max(1, N / max_grad_norm)``; ``None`` turns it off;
    2. Adam moments ``m <- b1 m + (1 - b1) g``, ``v <- b2 v + (1 - b2) g^2``, bias-corrected
       ``m^ = m / (1 - b1^t)``, ``v^ = v / (1 - b2^t)``;
    3. update ``u = m^ / (sqrt(v^) + eps) + weight_decay * w`` (decoupled decay, apex's
       ``adam_w_mode=True``);
    4. trust ratio ``phi = ||w|| / ||u||``, or ``phi = 1`` when either norm is 0 (a freshly
       zero-initialised tensor, or a zero update); ``w <- w - lr * phi * u``.

    Step 4's trust ratio is applied to the tensors of groups with ``weight_decay != 0`` and, in
    groups with ``weight_decay == 0`` (biases and LayerNorm parameters under
    :func:`parameter_groups`), only if ``use_nvlamb=True``; otherwise those take the plain Adam step
    ``w <- w - lr * u``. The default is the variant the recipes ran: apex ``FusedLAMB``'s default
    (``use_nvlamb=False``), which NVIDIA's BERT recipe uses with the decay / no-decay groups and
    apex's defaults (``eps=1e-6``, ``weight_decay=0.01``, ``max_grad_norm=1.0``), and the LAMB
    authors' TF optimizer in ALBERT's code, on which BioALBERT is built: it excludes from layer
    adaptation exactly what it excludes from weight decay (``LayerNorm``, ``layer_norm``, ``bias``).
    The reason is sound, too: the trust ratio makes each step a fixed fraction of ``||w||``, which
    suits weight matrices but would keep a bias that starts at 0 stuck near 0. No clamping of
    ``phi`` (the LAMB paper's optional ``phi(||w||)`` scaling): neither apex nor ALBERT has one.
    ALBERT's LAMB has no bias correction, and clips the gradients to global norm 1 before it, which
    is what the pre-normalization does.

    Steps are counted per tensor (torch's convention; apex counts per group, which is the same
    while every tensor gets a gradient at every step).

    Why not DeepSpeed's ``FusedLamb``: it is another variant. Its CUDA kernel folds the bias
    correction into the step size (``lr * sqrt(1 - b2^t) / (1 - b1^t)`` times
    ``m / (sqrt(v) + eps) + wd * w``, so eps and the decay term are scaled differently), clamps the
    trust ratio to ``[min_coeff, max_coeff] = [0.01, 10]``, applies it to every tensor whatever its
    weight decay, and pre-normalizes only when ``step()`` is handed the gradient norms.
    :func:`build_optimizer` therefore never substitutes it for this class.

    The step runs per parameter group and (device, dtype), in chunks of tensors: the moments and
    ``m^ / (sqrt(v^) + eps)`` come from PyTorch's fused Adam kernel (``torch._fused_adam_``, one
    vectorized multithreaded pass on CPU, multi-tensor-apply on CUDA) writing into a scratch buffer,
    then weight decay, per-tensor norms and the update are ``torch._foreach_*`` calls; ``fused=False``
    (or a device without that kernel) computes the moments with ``torch._foreach_*`` ops instead,
    which is slower and reads each step counter back to the host. Both compute the same function.

    Optimizer state per tensor is torch's Adam layout (``step`` as a float32 0-dim tensor on the
    parameter's device, ``exp_avg``, ``exp_avg_sq``), and every hyperparameter, ``max_grad_norm``
    included, lives in the param groups, so ``state_dict()`` / ``load_state_dict()`` resume a run
    bit-for-bit, and DeepSpeed can drive it as a client optimizer (``deepspeed.initialize(...,
    optimizer=Lamb(...))``), which its config-file ``"Lamb"`` (CUDA-only ``FusedLamb``) cannot be
    on CPU. With pre-normalization on, ``p.grad`` holds the pre-normalized gradient after
    ``step()``, as after ``torch.nn.utils.clip_grad_norm_``. Parameters should be fp32 (DeepSpeed's
    bf16/fp16 modes hand the optimizer fp32 master weights).

    Under DeepSpeed, keep ZeRO at stage 0: stages 1 and 2 replace each group's tensors by one
    flattened fp32 partition (and want ``zero_allow_untested_optimizer``), which turns the
    per-tensor trust ratio into one ratio per group, no longer LAMB. DeepSpeed's
    ``gradient_clipping`` clips with the same formula as the pre-normalization (up to its 1e-6), so
    with it set to the same threshold, ``max_grad_norm=None`` saves computing the norm twice.
    """

    def __init__(self, params: Iterable[torch.Tensor] | Iterable[dict[str, Any]], lr: float = 1e-3,
                 betas: tuple[float, float] = PAPER_BETAS, eps: float = PAPER_EPS,
                 weight_decay: float = PAPER_WEIGHT_DECAY, *, max_grad_norm: float | None = 1.0,
                 use_nvlamb: bool = False, fused: bool | None = None) -> None:
        _check_hyperparameters(lr, betas, eps, weight_decay)
        _check_max_grad_norm(max_grad_norm)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        max_grad_norm=max_grad_norm, use_nvlamb=bool(use_nvlamb), fused=fused)
        super().__init__(params, defaults)
        # Reused update buffers for CPU tensors, one per dtype (see _scratch); never checkpointed.
        self._cpu_scratch: dict[torch.dtype, torch.Tensor] = {}
        for group in self.param_groups:
            _check_hyperparameters(group["lr"], group["betas"], group["eps"], group["weight_decay"])
            for p in group["params"]:
                self.kernel(group, p.device, p.dtype)  # fused=True where it cannot run fails here, not at step 1
        self._global_max_grad_norm()

    @staticmethod
    def kernel(group: dict[str, Any], device: torch.device, dtype: torch.dtype) -> LambKernel:
        """The moment-update implementation ``group`` gets for tensors of ``dtype`` on ``device``."""
        available = (device.type in _FUSED_DEVICE_TYPES and dtype.is_floating_point
                     and hasattr(torch, "_fused_adam_"))
        if group["fused"] and not available:
            raise ValueError(f"fused=True needs floating-point parameters on {'/'.join(_FUSED_DEVICE_TYPES)} "
                             f"and torch._fused_adam_; got {dtype} on {device}")
        return "fused_adam" if available and group["fused"] is not False else "foreach"

    def _global_max_grad_norm(self) -> float | None:
        """The pre-normalization threshold: one value for the whole model, stored in every group."""
        values = {g["max_grad_norm"] for g in self.param_groups}
        if len(values) != 1:
            raise ValueError(f"all parameter groups must share one max_grad_norm (the gradient norm it "
                             f"bounds is global), got {sorted(values, key=str)}")
        value = values.pop()
        _check_max_grad_norm(value)
        return value

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One LAMB update of every parameter that has a gradient; returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        with_grads: list[list[torch.Tensor]] = []
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if p.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
            with_grads.append(params)
        if not any(with_grads):
            return loss

        grad_scale = self._grad_scales([p.grad for params in with_grads for p in params])
        found_inf = getattr(self, "found_inf", None)  # set around step() by a caller that vetoes on the device
        if found_inf is not None and not self.skips_on_device():
            raise RuntimeError("found_inf needs the fused kernel for every parameter (Lamb.skips_on_device)")
        for group, params in zip(self.param_groups, with_grads):
            if params:
                self._step_group(group, params, grad_scale, found_inf)
        return loss

    def skips_on_device(self) -> bool:
        """Whether a ``found_inf`` tensor (1: skip) set on the optimizer around ``step()`` can skip the update
        inside the kernels, as torch's fused Adam does, so a caller's verdict need not reach the host: only
        where every tensor runs the fused kernel (the ``foreach`` one reads its step counts back anyway)."""
        return all(self.kernel(group, p.device, p.dtype) == "fused_adam"
                   for group in self.param_groups for p in group["params"])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Also apex ``FusedLAMB``'s layout, which counts steps per group and keeps none per tensor (a run
        that began where apex was picked resumes here with the same bias correction)."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            if "step" not in group:
                continue
            for p in group["params"]:
                state = self.state.get(p)
                if state and "step" not in state:
                    state["step"] = torch.tensor(float(group["step"]), dtype=torch.float32, device=p.device)

    def _grad_scales(self, grads: list[torch.Tensor]) -> dict[torch.device, torch.Tensor] | None:
        """``max(1, N / max_grad_norm)`` as a 0-dim tensor per device (no host sync), or None if off.

        Computed in the widest gradient dtype (at least float32); :meth:`_step_group` casts it to
        what its kernel takes (float32 for the fused kernel, as for AMP's loss scale).
        """
        max_grad_norm = self._global_max_grad_norm()
        if max_grad_norm is None:
            return None
        buckets: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for g in grads:
            buckets.setdefault((g.device, g.dtype), []).append(g)
        first_device = grads[0].device
        dtype = functools.reduce(torch.promote_types, (d for _, d in buckets), torch.float32)
        squares = [torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.promote_types(d, torch.float32)))
                   .to(device=first_device, dtype=dtype).square().sum() for (_, d), tensors in buckets.items()]
        global_norm = torch.stack(squares).sum().sqrt()
        scale = torch.clamp(global_norm / max_grad_norm, min=1.0)
        return {device: scale.to(device) for device in {d for d, _ in buckets}}

    def _step_group(self, group: dict[str, Any], params: list[torch.Tensor],
                    grad_scale: dict[torch.device, torch.Tensor] | None, found_inf: torch.Tensor | None) -> None:
        buckets: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for p in params:
            buckets.setdefault((p.device, p.dtype), []).append(p)
        for (device, dtype), bucket in buckets.items():
            kernel = self.kernel(group, device, dtype)
            scale = None
            if grad_scale is not None:
                scale = grad_scale[device].to(torch.float32 if kernel == "fused_adam"
                                              else torch.promote_types(dtype, torch.float32))
            chunks = _chunks(bucket)
            scratch = self._scratch(max(sum(p.numel() for p in chunk) for chunk in chunks), dtype, device)
            for chunk in chunks:
                self._step_chunk(group, chunk, scratch, scale, kernel, found_inf)

    def _scratch(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A buffer for one chunk's updates, contents undefined.

        On CPU it is kept between steps: a fresh allocation of the largest chunk (the word
        embeddings, 94 MB in bert-base) is page-faulted in at every step, which cost ~20 ms of a
        ~300 ms step on the benchmark machine. CUDA's caching allocator already recycles blocks.
        """
        if device.type != "cpu":
            return torch.empty(numel, dtype=dtype, device=device)
        buffer = self._cpu_scratch.get(dtype)
        if buffer is None or buffer.numel() < numel:
            buffer = self._cpu_scratch[dtype] = torch.empty(numel, dtype=dtype)
        return buffer[:numel]

    def _state_tensors(self, params: list[torch.Tensor]) -> tuple[list[torch.Tensor], ...]:
        exp_avgs, exp_avg_sqs, steps = [], [], []
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif state["step"].device != p.device:  # e.g. loaded with map_location="cpu", then moved
                state["step"] = state["step"].to(device=p.device, dtype=torch.float32)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        return exp_avgs, exp_avg_sqs, steps

    def _step_chunk(self, group: dict[str, Any], params: list[torch.Tensor], scratch: torch.Tensor,
                    grad_scale: torch.Tensor | None, kernel: LambKernel, found_inf: torch.Tensor | None) -> None:
        grads = [p.grad for p in params]
        exp_avgs, exp_avg_sqs, steps = self._state_tensors(params)
        updates, offset = [], 0
        for p in params:
            updates.append(scratch[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        beta1, beta2 = group["betas"]
        if kernel == "fused_adam":
            _adam_direction_fused(updates, grads, exp_avgs, exp_avg_sqs, steps, grad_scale=grad_scale, beta1=beta1,
                                  beta2=beta2, eps=group["eps"], found_inf=found_inf)
        else:
            _adam_direction_foreach(updates, grads, exp_avgs, exp_avg_sqs, steps, grad_scale=grad_scale,
                                    beta1=beta1, beta2=beta2, eps=group["eps"])
        lr = float(group["lr"])
        weight_decay = group["weight_decay"]
        if weight_decay != 0:
            torch._foreach_add_(updates, params, alpha=weight_decay)
        # A skipped step's direction is 0 but its decay term is not: the step size is multiplied by 0 there.
        kept = None if found_inf is None else 1.0 - found_inf.to(torch.promote_types(params[0].dtype, torch.float32))
        if weight_decay != 0 or group["use_nvlamb"]:
            norm_dtype = torch.promote_types(params[0].dtype, torch.float32)
            param_norms = torch.stack(torch._foreach_norm(params, 2, dtype=norm_dtype))
            update_norms = torch.stack(torch._foreach_norm(updates, 2, dtype=norm_dtype))
            trust = torch.where((param_norms > 0) & (update_norms > 0), param_norms / update_norms, 1.0)
            step_sizes = trust * -lr if kept is None else trust * -lr * kept
            torch._foreach_addcmul_(params, updates, list(step_sizes.unbind()))
        else:
            if kept is not None:
                torch._foreach_mul_(updates, kept)
            torch._foreach_add_(params, updates, alpha=-lr)


def _chunks(params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Consecutive runs of tensors with at most ``_CHUNK_ELEMENTS`` elements (or one larger tensor)."""
    chunks: list[list[torch.Tensor]] = []
    current: list[torch.Tensor] = []
    size = 0
    for p in params:
        if current and size + p.numel() > _CHUNK_ELEMENTS:
            chunks.append(current)
            current, size = [], 0
        current.append(p)
        size += p.numel()
    if current:
        chunks.append(current)
    return chunks


def _adam_direction_fused(out: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                          exp_avg_sqs: list[torch.Tensor], steps: list[torch.Tensor], *,
                          grad_scale: torch.Tensor | None, beta1: float, beta2: float, eps: float,
                          found_inf: torch.Tensor | None = None) -> None:
    """Update the moments and write ``m^ / (sqrt(v^) + eps)`` into ``out``, with torch's fused Adam.

    Adam's step on a zero "parameter" with learning rate -1 and no weight decay is exactly
    ``0 - (-1) * m^ / (sqrt(v^) + eps)``; ``grad_scale`` divides the gradients (the kernel's
    loss-scale input, here the global-norm pre-normalization) and is written back to them. Where
    ``found_inf`` is 1 the kernel leaves the moments and ``out`` (0) as they were, and the step counts are
    taken back, as torch's fused Adam does.
    """
    torch._foreach_zero_(out)
    torch._foreach_add_(steps, 1)
    torch._fused_adam_(out, grads, exp_avgs, exp_avg_sqs, [], steps, lr=-1.0, beta1=beta1, beta2=beta2,
                       weight_decay=0.0, eps=eps, amsgrad=False, maximize=False, grad_scale=grad_scale,
                       found_inf=found_inf)
    if found_inf is not None:
        torch._foreach_sub_(steps, [found_inf] * len(steps))


def _adam_direction_foreach(out: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                            exp_avg_sqs: list[torch.Tensor], steps: list[torch.Tensor], *,
                            grad_scale: torch.Tensor | None, beta1: float, beta2: float, eps: float) -> None:
    """:func:`_adam_direction_fused` with ``torch._foreach_*`` ops, for devices without the fused kernel."""
    if grad_scale is not None:
        torch._foreach_div_(grads, grad_scale)
    torch._foreach_add_(steps, 1)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
    step_values = [s.item() for s in steps]
    torch._foreach_copy_(out, exp_avg_sqs)
    torch._foreach_sqrt_(out)
    torch._foreach_div_(out, [math.sqrt(1 - beta2 ** t) for t in step_values])
    torch._foreach_add_(out, eps)
    torch._foreach_mul_(out, [1 - beta1 ** t for t in step_values])
    for denominator, exp_avg in zip(out, exp_avgs):
        torch.div(exp_avg, denominator, out=denominator)


# --------------------------------------------------------------------------------------------
# Choosing an implementation
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Candidate:
    label: str
    build: Callable[[], torch.optim.Optimizer]


def _optimizer_candidates(name: str, groups: Callable[[], list[dict[str, Any]]], *, lr: float,
                          betas: tuple[float, float], eps: float, weight_decay: float, device_type: str,
                          prefer_fused: bool, max_grad_norm: float | None, use_nvlamb: bool) -> list[_Candidate]:
    """The implementations to try, best first; each one's ``build`` imports what it needs.

    ``groups()`` gives each candidate fresh group dicts: torch optimizers write their defaults into
    the dicts they are given, and a candidate that fails after that must leave no trace.
    """

    def torch_adamw(**kind: bool) -> torch.optim.Optimizer:
        return torch.optim.AdamW(groups(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kind)

    def deepspeed_adam() -> torch.optim.Optimizer:
        from deepspeed.ops.adam import FusedAdam  # JIT-builds its CUDA op unless prebuilt
        return FusedAdam(groups(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adam_w_mode=True,
                         bias_correction=True)

    def apex_adam() -> torch.optim.Optimizer:
        from apex.optimizers import FusedAdam
        return FusedAdam(groups(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adam_w_mode=True,
                         bias_correction=True)

    def apex_lamb() -> torch.optim.Optimizer:
        from apex.optimizers import FusedLAMB
        # apex divides by max_grad_norm unconditionally: "off" is an infinite threshold there.
        return FusedLAMB(groups(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=True,
                         adam_w_mode=True, grad_averaging=True,
                         max_grad_norm=math.inf if max_grad_norm is None else max_grad_norm,
                         use_nvlamb=use_nvlamb)

    def our_lamb(fused: bool | None) -> Callable[[], torch.optim.Optimizer]:
        return lambda: Lamb(groups(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                            max_grad_norm=max_grad_norm, use_nvlamb=use_nvlamb, fused=fused)

    # Torch's fused AdamW and our fused LAMB come first: they skip a rejected update inside the kernel
    # (found_inf), so the trainer's step never waits for the device; DeepSpeed's and apex's kernels (same
    # math) cannot, and are the fallbacks on CUDA.
    fused_kernel = device_type in _FUSED_DEVICE_TYPES
    on_cuda = prefer_fused and device_type == "cuda"
    if name == "adamw":
        candidates = []
        if prefer_fused and fused_kernel:
            candidates.append(_Candidate("torch.optim.AdamW(fused=True)", lambda: torch_adamw(fused=True)))
        if on_cuda:
            candidates += [_Candidate("deepspeed.ops.adam.FusedAdam", deepspeed_adam),
                           _Candidate("apex.optimizers.FusedAdam", apex_adam)]
        candidates.append(_Candidate("torch.optim.AdamW(foreach=True)", lambda: torch_adamw(foreach=True)))
        return candidates
    candidates = []
    if prefer_fused and fused_kernel:
        candidates.append(_Candidate("biomed_lm.optim.Lamb(kernel=fused_adam)", our_lamb(True)))
    if on_cuda:
        candidates.append(_Candidate("apex.optimizers.FusedLAMB", apex_lamb))
    candidates.append(_Candidate("biomed_lm.optim.Lamb(kernel=foreach)", our_lamb(False)))
    return candidates


def _fallback_reason(label: str, error: BaseException) -> str:
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{label}: {type(error).__name__}{': ' + message if message else ''}"


def build_optimizer(name: str, param_groups: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
                    lr: float = PAPER_PEAK_LR, betas: tuple[float, float] = PAPER_BETAS, eps: float = PAPER_EPS,
                    weight_decay: float = PAPER_WEIGHT_DECAY, device: torch.device | str = "cpu",
                    prefer_fused: bool = True, *, max_grad_norm: float | None = 1.0,
                    use_nvlamb: bool = False) -> BuiltOptimizer:
    """The fastest available implementation of ``name`` ("adamw" or "lamb") for ``device``.

    ``param_groups`` is what torch optimizers take (tensors, or group dicts such as
    :func:`parameter_groups` returns; a group's own ``weight_decay`` overrides the argument). Order
    of preference, each tried only if the previous one cannot be imported or built:

    * adamw: ``torch.optim.AdamW(fused=True)`` (on CPU torch's vectorized multithreaded kernel, about
      5x faster than ``foreach`` on a bert-base parameter set, see ``benchmarks/bench_optim.py``); on
      CUDA then DeepSpeed ``FusedAdam`` and apex ``FusedAdam``; then ``torch.optim.AdamW(foreach=True)``.
      All of them are AdamW with bias correction: same math.
    * lamb: :class:`Lamb` on the fused-Adam kernel; on CUDA then apex ``FusedLAMB`` (same math, and
      :meth:`Lamb.load_state_dict` reads its state); then :class:`Lamb` on ``foreach``. DeepSpeed's
      ``FusedLamb`` implements a different LAMB variant and is never picked (see :class:`Lamb`).

    The first of each can skip a rejected update on the device (``found_inf``), which the trainer's
    divergence guard uses to keep the host from waiting for the device every step.

    ``prefer_fused=False`` skips straight to the ``foreach`` implementations. ``max_grad_norm`` and
    ``use_nvlamb`` are LAMB's. The choice and every fallback reason are logged and returned.
    """
    name = name.lower()
    if name not in OPTIMIZER_NAMES:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {OPTIMIZER_NAMES}")
    _check_hyperparameters(lr, betas, eps, weight_decay)
    _check_max_grad_norm(max_grad_norm)
    device = torch.device(device)
    groups = _as_groups(param_groups)
    for group in groups:
        for p in group["params"]:
            tensor = p[1] if isinstance(p, tuple) else p
            if tensor.device.type != device.type:
                raise ValueError(f"parameter on {tensor.device} but the optimizer is built for {device}: move "
                                 f"the model first (fused kernels run where the parameters are)")
    candidates = _optimizer_candidates(name, lambda: _as_groups(groups), lr=lr, betas=tuple(betas), eps=eps,
                                       weight_decay=weight_decay, device_type=device.type, prefer_fused=prefer_fused,
                                       max_grad_norm=max_grad_norm, use_nvlamb=use_nvlamb)
    return _first_that_builds(candidates)


def _first_that_builds(candidates: Sequence[_Candidate]) -> BuiltOptimizer:
    fallbacks: list[str] = []
    for index, candidate in enumerate(candidates):
        last = index == len(candidates) - 1
        try:
            optimizer = candidate.build()
        except ImportError as error:
            if last:
                raise
            fallbacks.append(_fallback_reason(candidate.label, error))
            logger.info("optimizer %s not available (%s); trying %s", candidate.label, fallbacks[-1],
                        candidates[index + 1].label)
            continue
        except Exception as error:  # a broken optional kernel (JIT build, driver...) must not end the run
            if last:
                raise
            fallbacks.append(_fallback_reason(candidate.label, error))
            logger.warning("optimizer %s could not be built (%s); falling back to %s", candidate.label,
                           fallbacks[-1], candidates[index + 1].label)
            continue
        logger.info("optimizer: %s", candidate.label)
        return BuiltOptimizer(optimizer=optimizer, implementation=candidate.label, fallbacks=tuple(fallbacks))
    raise ValueError("no optimizer implementation to try")


def _as_groups(param_groups: Iterable[torch.Tensor] | Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """A fresh list of fresh group dicts (so a failed candidate cannot leave changes in the caller's)."""
    items = list(param_groups)
    if not items:
        raise ValueError("no parameters to optimize")
    if all(isinstance(item, dict) for item in items):
        return [{**group, "params": [group["params"]] if isinstance(group["params"], torch.Tensor)
                 else list(group["params"])} for group in items]
    if any(isinstance(item, dict) for item in items):
        raise TypeError("param_groups must be all tensors or all group dicts")
    return [{"params": items}]


# --------------------------------------------------------------------------------------------
# Learning-rate schedules
# --------------------------------------------------------------------------------------------
#
# Convention (HF's ``get_linear_schedule_with_warmup`` and NVIDIA's TF BERT alike): ``step`` is the
# number of optimizer steps already taken, so the k-th update (k = 0 .. total_steps - 1) runs at
# ``factor(k)``, the value LambdaLR holds after k calls of ``scheduler.step()``. With W warm-up
# steps, ``factor(0) = 0`` (the warm-up starts from zero), ``factor(W) = 1`` (the peak) and, for the
# slanted triangular schedule, ``factor(total_steps) = 0``: the learning rate reaches zero when
# training ends.

def _check_total_steps(total_steps: int) -> int:
    total_steps = operator.index(total_steps)
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    return total_steps


def _check_step(step: int) -> int:
    step = operator.index(step)
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return step


def _check_warmup_ratio(warmup_ratio: float) -> None:
    if not (0.0 <= warmup_ratio < 1.0):
        raise ValueError(f"warmup_ratio must be in [0, 1), got {warmup_ratio!r}")


def warmup_steps(total_steps: int, warmup_ratio: float = PAPER_WARMUP_RATIO) -> int:
    """Warm-up length in whole steps: ``warmup_ratio * total_steps`` rounded half up.

    Whole steps, so the peak is *reached* (``factor(W) == 1`` exactly); capped at
    ``total_steps - 1`` so some step always runs at the peak (a 1-step run runs at the peak, not at 0).
    """
    total_steps = _check_total_steps(total_steps)
    _check_warmup_ratio(warmup_ratio)
    return min(math.floor(warmup_ratio * total_steps + 0.5), total_steps - 1)


def slanted_triangular(step: int, total_steps: int, warmup_ratio: float = PAPER_WARMUP_RATIO) -> float:
    """The paper's schedule: linear 0 -> 1 over the warm-up, then linear 1 -> 0 at ``total_steps``.

    Returns the factor of the peak learning rate; 0 beyond ``total_steps``.
    """
    step = _check_step(step)
    warmup = warmup_steps(total_steps, warmup_ratio)
    if step < warmup:
        return step / warmup
    if step >= total_steps:
        return 0.0
    return (total_steps - step) / (total_steps - warmup)


def polynomial_decay(step: int, total_steps: int, warmup_ratio: float = 0.0, power: float = 1.0,
                     end_factor: float = 0.0) -> float:
    """Linear warm-up (optional), then ``end + (1 - end) * (remaining fraction) ** power``.

    ``end_factor`` is the final learning rate as a factor of the peak; ``power=1, end_factor=0`` is
    :func:`slanted_triangular`; the remaining fraction is of the decay's span, ``(total - step) / (total -
    W)``, as HF's ``get_polynomial_decay_schedule_with_warmup`` counts it (NVIDIA's count over the whole run
    is :func:`polynomial_from_start`). Stays at ``end_factor`` beyond ``total_steps``.
    """
    step = _check_step(step)
    if not (power > 0 and math.isfinite(power)):
        raise ValueError(f"power must be a positive finite number, got {power!r}")
    if not (0.0 <= end_factor <= 1.0):
        raise ValueError(f"end_factor must be in [0, 1], got {end_factor!r}")
    warmup = warmup_steps(total_steps, warmup_ratio)
    if step < warmup:
        return step / warmup
    if step >= total_steps:
        return end_factor
    remaining = (total_steps - step) / (total_steps - warmup)
    return end_factor + (1.0 - end_factor) * remaining ** power


def polynomial_from_start(step: int, total_steps: int, warmup_ratio: float = 0.0, power: float = 1.0,
                          end_factor: float = 0.0) -> float:
    """:func:`polynomial_decay` with the remaining fraction counted over the whole run, ``1 - step /
    total_steps``, as NVIDIA's BERT recipe (``schedulers.py``'s ``PolyWarmUpScheduler``) and MLPerf's BERT
    schedule count it: the learning rate drops at the warm-up's end from the peak to ``(1 - W / total) **
    power`` of it (0.846 for NVIDIA's phase 1) and sums to less over the run than :func:`polynomial_decay`'s."""
    step = _check_step(step)
    factor = polynomial_decay(step, total_steps, warmup_ratio, power, end_factor)  # checks the arguments
    if step < warmup_steps(total_steps, warmup_ratio) or step >= total_steps:
        return factor
    return end_factor + (1.0 - end_factor) * (1.0 - step / total_steps) ** power


def constant_with_warmup(step: int, total_steps: int, warmup_ratio: float = PAPER_WARMUP_RATIO) -> float:
    """Linear warm-up to the peak, then constant (for short runs and learning-rate sweeps)."""
    step = _check_step(step)
    warmup = warmup_steps(total_steps, warmup_ratio)
    return step / warmup if step < warmup else 1.0


def schedule_factor(step: int, config: ScheduleConfig, total_steps: int, end_factor: float = 0.0) -> float:
    """``config``'s schedule at ``step``, as a factor of the peak learning rate."""
    if config.lr_schedule == "slanted_triangular":
        return slanted_triangular(step, total_steps, config.warmup_ratio)
    if config.lr_schedule == "polynomial":
        return polynomial_decay(step, total_steps, config.warmup_ratio, config.lr_power, end_factor)
    if config.lr_schedule == "polynomial_from_start":
        return polynomial_from_start(step, total_steps, config.warmup_ratio, config.lr_power, end_factor)
    return constant_with_warmup(step, total_steps, config.warmup_ratio)


def _end_factor(config: ScheduleConfig, peak_lr: float) -> float:
    if not config.lr_schedule.startswith("polynomial") or config.end_lr == 0:
        return 0.0
    if not (peak_lr > 0) or config.end_lr > peak_lr:
        raise ValueError(f"end_lr ({config.end_lr}) must not exceed the peak learning rate ({peak_lr})")
    return config.end_lr / peak_lr


def learning_rate_at(step: int, config: ScheduleConfig, total_steps: int, peak_lr: float) -> float:
    """The learning rate of the update after ``step`` steps, for a peak of ``peak_lr``."""
    return peak_lr * schedule_factor(step, config, total_steps, _end_factor(config, peak_lr))


def lr_lambda(config: ScheduleConfig, total_steps: int, peak_lr: float) -> Callable[[int], float]:
    """``step -> factor`` for ``LambdaLR`` (a ``functools.partial``: picklable, no closure state)."""
    _check_total_steps(total_steps)
    return functools.partial(schedule_factor, config=config, total_steps=total_steps,
                             end_factor=_end_factor(config, peak_lr))


def build_lr_scheduler(optimizer: torch.optim.Optimizer, config: ScheduleConfig, total_steps: int,
                       last_epoch: int = -1) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` running ``config``'s schedule over ``total_steps`` optimizer steps.

    Call ``scheduler.step()`` after each ``optimizer.step()`` (DeepSpeed does when given the
    scheduler). Each group's learning rate is its own initial lr times the factor, so groups keep
    their proportions; the polynomial ``end_lr`` is taken relative to ``optimizer.defaults["lr"]``.
    """
    peak_lr = float(optimizer.defaults.get("lr", optimizer.param_groups[0]["lr"]))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(config, total_steps, peak_lr), last_epoch=last_epoch)
