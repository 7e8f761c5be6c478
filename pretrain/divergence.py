"""Which optimizer steps to skip: non-finite losses, and loss or gradient-norm spikes.

The decision is taken after the step's gradients are reduced and before the optimizer runs, so a
skipped step leaves weights and optimizer state untouched and the last checkpoint stays healthy.
A step is a spike when its loss exceeds ``loss_spike_factor`` × the median loss of the last
``spike_window`` accepted steps, or its gradient norm exceeds ``grad_norm_spike_factor`` × their
median gradient norm; spikes are judged once ``spike_warmup_steps`` steps have been accepted (the
first steps of a run move too fast to have a baseline). A factor of 0 turns that check off. The
history is part of the trainer state, so a resumed run judges exactly as the uninterrupted one.

A rejected step is vetoed where DeepSpeed takes it, ``with gate.vetoing(verdict.vetoes_update):
engine.step()`` (:class:`StepGate`): the optimizer's update is skipped and everything else of the
step runs, so the data stream and the learning-rate schedule stay aligned with the step number.

The spike warm-up leaves the first steps unjudged, and a learning rate far too high wrecks the model
in exactly those steps (at 1e6 the loss is 1e12 from step 2). So one absolute bound holds from step
1: the *loss ceiling*, a multiple (``loss_ceiling_factor``, default 2) of the loss of uniform
predictions, ln V for the MLM over a V-token vocabulary plus ln k for a k-way pair task. A freshly
initialized model starts just above that loss and training only lowers it; a model at twice it is
confidently wrong everywhere, which no healthy model is.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import warnings
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
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


class DivergenceGuard:
    def __init__(self, *, loss_spike_factor: float, grad_norm_spike_factor: float, window: int, warmup_steps: int,
                 loss_ceiling: float = 0.0):
        self.loss_factor, self.grad_factor = loss_spike_factor, grad_norm_spike_factor
        self.loss_ceiling = loss_ceiling  # 0: off
        self.warmup_steps = warmup_steps
        self.losses: deque[float] = deque(maxlen=window)
        self.grad_norms: deque[float] = deque(maxlen=window)
        self.accepted = 0

    def judge(self, loss: float, grad_norm: float | None) -> Verdict:
        """The verdict on one step; an accepted step joins the history."""
        if not math.isfinite(loss):
            return Verdict(True, "nonfinite_loss", f"loss {loss}")
        if grad_norm is not None and not math.isfinite(grad_norm):
            return Verdict(True, "nonfinite_grad_norm", f"gradient norm {grad_norm}")
        if self.loss_ceiling > 0 and loss > self.loss_ceiling:
            return Verdict(True, "loss_ceiling", f"loss {loss:.4g} > ceiling {self.loss_ceiling:.4g}, a multiple of "
                                                 "the loss of uniform predictions")
        if self.accepted >= self.warmup_steps:
            if self.loss_factor > 0 and self.losses and loss > self.loss_factor * statistics.median(self.losses):
                return Verdict(True, "loss_spike", f"loss {loss:.4g} > {self.loss_factor:g} × median "
                                                   f"{statistics.median(self.losses):.4g}")
            if self.grad_factor > 0 and grad_norm is not None and self.grad_norms and \
                    grad_norm > self.grad_factor * statistics.median(self.grad_norms):
                return Verdict(True, "grad_norm_spike", f"gradient norm {grad_norm:.4g} > {self.grad_factor:g} × "
                                                        f"median {statistics.median(self.grad_norms):.4g}")
        self.losses.append(loss)
        if grad_norm is not None:
            self.grad_norms.append(grad_norm)
        self.accepted += 1
        return Verdict(False)

    def state_dict(self) -> dict[str, Any]:
        return {"losses": list(self.losses), "grad_norms": list(self.grad_norms), "accepted": self.accepted}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.losses.clear()
        self.grad_norms.clear()
        self.losses.extend(state.get("losses", []))
        self.grad_norms.extend(state.get("grad_norms", []))
        self.accepted = int(state.get("accepted", 0))


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
