"""Which optimizer steps to skip: non-finite losses, and loss or gradient-norm spikes.

The decision is taken after the step's gradients are reduced and before the optimizer runs, so a
skipped step leaves weights and optimizer state untouched and the last checkpoint stays healthy.
A step is a spike when its loss exceeds ``loss_spike_factor`` × the median loss of the last
``spike_window`` accepted steps, or its gradient norm exceeds ``grad_norm_spike_factor`` × their
median gradient norm; spikes are judged once ``spike_warmup_steps`` steps have been accepted (the
first steps of a run move too fast to have a baseline). A factor of 0 turns that check off. The
history is part of the trainer state, so a resumed run judges exactly as the uninterrupted one.

The guard keeps its history on the training device and judges a step there
(:meth:`DivergenceGuard.judge_on_device`), so the host need not wait for a step's loss to decide.
A rejected step is vetoed where DeepSpeed takes it (:class:`StepGate`): on the device where the
optimizer can skip an update itself (torch's fused Adam/AdamW, given the verdict as its
``found_inf``), otherwise ``with gate.vetoing(verdict.vetoes_update): engine.step()`` after the host
has read the verdict. Either way the optimizer's update is skipped and everything else of the step
runs, so the data stream and the learning-rate schedule stay aligned with the step number.

The spike warm-up leaves the first steps unjudged, and a learning rate far too high wrecks the model
in exactly those steps (at 1e6 the loss is 1e12 from step 2). So one absolute bound holds from step
1: the *loss ceiling*, a multiple (``loss_ceiling_factor``, default 2) of the loss of uniform
predictions, ln V for the MLM over a V-token vocabulary plus ln k for a k-way pair task. A freshly
initialized model starts just above that loss and training only lowers it; a model at twice it is
confidently wrong everywhere, which no healthy model is.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

import torch


@dataclass(frozen=True)
class Verdict:
    skip: bool
    # nonfinite_loss | nonfinite_grad_norm | loss_ceiling | loss_spike | grad_norm_spike, or fp16_overflow
    # (the trainer's reading of a non-finite gradient norm under fp16: pretrain.trainer.fp16_overflow_verdict)
    reason: str | None = None
    detail: str = ""

    @property
    def vetoes_update(self) -> bool:
        """The optimizer must be kept from this step's update: every skip but an fp16 overflow, whose
        update DeepSpeed skips itself."""
        return self.skip and self.reason != "fp16_overflow"


#: Verdicts that say the weights themselves are broken (not one bad batch against a healthy model).
UNHEALTHY_WEIGHTS = frozenset({"nonfinite_loss", "nonfinite_grad_norm", "loss_ceiling"})


def uniform_prediction_loss(vocab_size: int, pair_classes: int) -> float:
    """The loss of a model that predicts every token and pair label uniformly: ln V (+ ln k)."""
    return math.log(vocab_size) + (math.log(pair_classes) if pair_classes > 1 else 0.0)


#: What :meth:`DivergenceGuard.judge_on_device` writes as a step's verdict code: the index of its
#: reason here (0: accepted), the rules in the order they are checked.
REASONS = (None, "nonfinite_loss", "nonfinite_grad_norm", "loss_ceiling", "loss_spike", "grad_norm_spike")
#: The fields of a verdict record (:meth:`DivergenceGuard.judge_on_device`), float64 each.
RECORD_FIELDS = ("code", "loss", "grad_norm", "loss_median", "grad_norm_median")


class DivergenceGuard:
    """The rules above, kept as tensor operations on ``device`` (the training device), so a step is
    judged where its loss and gradient norm are — without the host reading them back — and its
    verdict can veto the update there (:meth:`judge_on_device`). :meth:`judge` is the same on host
    numbers. The history: the last ``window`` accepted losses and gradient norms in two rings, their
    medians computed as :func:`statistics.median` does (the mean of the two middle values of an even
    count), in float64, so both ways give the same verdicts and a resumed run judges as the
    uninterrupted one."""

    def __init__(self, *, loss_spike_factor: float, grad_norm_spike_factor: float, window: int, warmup_steps: int,
                 loss_ceiling: float = 0.0, device: torch.device | str = "cpu"):
        self.loss_factor, self.grad_factor = loss_spike_factor, grad_norm_spike_factor
        self.loss_ceiling = loss_ceiling  # 0: off
        self.warmup_steps = warmup_steps
        self._history = {name: _Ring(window, device) for name in ("losses", "grad_norms")}
        self._accepted = torch.zeros((), dtype=torch.int64, device=device)

    @property
    def accepted(self) -> int:
        return int(self._accepted)

    @property
    def losses(self) -> list[float]:
        """The accepted losses in the window, oldest first (read from the device)."""
        return self._history["losses"].values()

    @property
    def grad_norms(self) -> list[float]:
        return self._history["grad_norms"].values()

    def judge(self, loss: float, grad_norm: float | None) -> Verdict:
        """The verdict on one step; an accepted step joins the history."""
        device = self._accepted.device
        as_tensor = functools.partial(torch.tensor, dtype=torch.float64, device=device)
        record = self.judge_on_device(as_tensor(loss), None if grad_norm is None else as_tensor(grad_norm))
        return self.verdict(record.tolist())

    def judge_on_device(self, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> torch.Tensor:
        """Judge a step from its loss and gradient norm as 0-dim device tensors (``grad_norm`` None:
        not known, as under ZeRO stages 1-2) and fold an accepted step into the history, all on the
        device; returns its record, float64 ``[code, loss, grad_norm, loss_median, grad_norm_median]``
        (:data:`RECORD_FIELDS`; code 0: accepted, else the index of the reason in :data:`REASONS`),
        for :meth:`verdict` to read when the host gets to it."""
        loss = loss.to(torch.float64)
        norm = torch.full_like(loss, math.nan) if grad_norm is None else grad_norm.to(torch.float64)
        losses, norms = self._history["losses"], self._history["grad_norms"]
        loss_median, norm_median = losses.median(), norms.median()
        false = torch.zeros((), dtype=torch.bool, device=loss.device)
        judged = self._accepted >= self.warmup_steps
        rules = [  # in REASONS' order: the first that holds is the reason
            ~torch.isfinite(loss),
            ~torch.isfinite(norm) if grad_norm is not None else false,
            loss > self.loss_ceiling if self.loss_ceiling > 0 else false,
            judged & (losses.count > 0) & (loss > self.loss_factor * loss_median) if self.loss_factor > 0 else false,
            judged & (norms.count > 0) & (norm > self.grad_factor * norm_median)
            if self.grad_factor > 0 and grad_norm is not None else false,
        ]
        code = torch.zeros((), dtype=torch.float64, device=loss.device)
        for index in range(len(rules), 0, -1):
            code = torch.where(rules[index - 1], float(index), code)
        accepted = code == 0
        losses.append_if(accepted, loss)
        if grad_norm is not None:
            norms.append_if(accepted, norm)
        self._accepted += accepted.to(torch.int64)
        return torch.stack([code, loss, norm, loss_median, norm_median])

    def verdict(self, record: list[float]) -> Verdict:
        """The :class:`Verdict` of a record :meth:`judge_on_device` wrote, read back to the host."""
        code, loss, grad_norm, loss_median, norm_median = record
        reason = REASONS[int(code)]
        if reason is None:
            return Verdict(False)
        detail = {
            "nonfinite_loss": f"loss {loss}",
            "nonfinite_grad_norm": f"gradient norm {grad_norm}",
            "loss_ceiling": f"loss {loss:.4g} > ceiling {self.loss_ceiling:.4g}, a multiple of the loss of uniform "
                            "predictions",
            "loss_spike": f"loss {loss:.4g} > {self.loss_factor:g} × median {loss_median:.4g}",
            "grad_norm_spike": f"gradient norm {grad_norm:.4g} > {self.grad_factor:g} × median {norm_median:.4g}",
        }[reason]
        return Verdict(True, reason, detail)

    def state_dict(self) -> dict[str, Any]:
        """The history as lists, oldest first (a read from the device: at checkpoints)."""
        return {"losses": self.losses, "grad_norms": self.grad_norms, "accepted": self.accepted}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._history["losses"].load(state.get("losses", []))
        self._history["grad_norms"].load(state.get("grad_norms", []))
        self._accepted.fill_(int(state.get("accepted", 0)))


class _Ring:
    """The last ``size`` values appended, on a device: slots not yet written hold NaN, and ``count``
    (a device int64) is how many were ever appended, so the next one goes to ``count % size``."""

    def __init__(self, size: int, device: torch.device | str):
        self.size = size
        self.slots = torch.full((size,), math.nan, dtype=torch.float64, device=device)
        self.count = torch.zeros((), dtype=torch.int64, device=device)

    def median(self) -> torch.Tensor:
        """:func:`statistics.median` of the values held (NaN when none): NaN sorts last."""
        held = torch.clamp(self.count, max=self.size)
        ordered = torch.sort(self.slots).values
        low, high = torch.clamp((held - 1) // 2, min=0), held // 2
        # index_select, not ordered[low]: a tensor used as a Python index is read back to the host
        low_value = ordered.index_select(0, low.reshape(1)).reshape(())
        high_value = ordered.index_select(0, torch.clamp(high, max=self.size - 1).reshape(1)).reshape(())
        return torch.where(low == high, low_value, (low_value + high_value) / 2)

    def append_if(self, condition: torch.Tensor, value: torch.Tensor) -> None:
        slot = (self.count % self.size).reshape(1)
        kept = torch.where(condition, value, self.slots.index_select(0, slot).reshape(()))
        self.slots.index_copy_(0, slot, kept.reshape(1))
        self.count += condition.to(self.count.dtype)

    def values(self) -> list[float]:
        count, slots = int(self.count), self.slots.tolist()
        if count <= self.size:
            return slots[:count]
        start = count % self.size
        return slots[start:] + slots[:start]

    def load(self, values: list[float]) -> None:
        values = list(values)[-self.size:]  # a deque of maxlen size keeps the newest
        self.slots.fill_(math.nan)
        if values:
            self.slots[:len(values)] = torch.tensor(values, dtype=torch.float64)
        self.count.fill_(len(values))


class StepGate:
    """Vetoes one optimizer update, in view where the step is taken::

        with gate.vetoing(verdict.vetoes_update):
            engine.step()

    Inside a vetoing block the optimizer's ``step`` does nothing, and DeepSpeed's step goes on
    around it: it clips and zeroes the gradients, advances its counters and steps the learning-rate
    schedule. Weights and optimizer state stay as they were; the data stream and the schedule stay
    aligned with the step number. ``optimizer`` is the torch optimizer the engine was built with:
    DeepSpeed's precision and ZeRO wrappers call its ``step`` by name, so the veto holds under each."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer

    def vetoes_on_device(self) -> bool:
        """Whether the optimizer can skip an update on the device: torch's fused Adam and AdamW take a
        ``found_inf`` tensor (AMP's overflow flag) and leave weights, moments and step count as they
        were where it is 1, inside the kernel, so the verdict need not reach the host first; our
        :class:`~biomed_lm.optim.Lamb` does the same on its fused kernel."""
        from biomed_lm.optim import Lamb

        optimizer = self.optimizer
        if isinstance(optimizer, Lamb):
            return optimizer.skips_on_device()
        return isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) and bool(optimizer.defaults.get("fused"))

    @contextlib.contextmanager
    def vetoing_on_device(self, record: torch.Tensor) -> Iterator[None]:
        """The optimizer's update inside the block is skipped, on the device, when the verdict
        ``record`` (:meth:`DivergenceGuard.judge_on_device`) rejects the step; the rest of DeepSpeed's
        step runs as under :meth:`vetoing`. Only where :meth:`vetoes_on_device`."""
        self.optimizer.found_inf = (record[0] != 0).to(torch.float32)
        try:
            yield
        finally:
            del self.optimizer.found_inf

    @contextlib.contextmanager
    def vetoing(self, veto: bool) -> Iterator[None]:
        """The optimizer's updates are skipped inside the block when ``veto``; restored on any way out."""
        if not veto:
            yield
            return
        own = vars(self.optimizer)
        # An instance's ``step`` is the LR scheduler's wrapper (it counts calls); put back as found.
        before = own.get("step", _NOTHING)
        own["step"] = _skipped_update
        try:
            with warnings.catch_warnings():
                # When the first step of a run is vetoed, the schedule steps before the optimizer ever has,
                # which torch warns about: here that is the point.
                warnings.filterwarnings("ignore", _SCHEDULER_ORDER_WARNINGS, UserWarning)
                yield
        finally:
            if before is _NOTHING:
                del own["step"]
            else:
                own["step"] = before


_NOTHING = object()
_SCHEDULER_ORDER_WARNINGS = (r"(Seems like `optimizer\.step\(\)` has been overridden|"
                             r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`)")


def _skipped_update(*_args: Any, **_kwargs: Any) -> None:
    """A vetoed optimizer step: no update (closures, which pretraining never passes, are not run)."""
    return None
