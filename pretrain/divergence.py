"""Which optimizer steps to skip: non-finite losses, and loss or gradient-norm spikes.

The decision is taken after the step's gradients are reduced and before the optimizer runs, so a
skipped step leaves weights and optimizer state untouched and the last checkpoint stays healthy.
A step is a spike when its loss exceeds ``loss_spike_factor`` × the median loss of the last
``spike_window`` accepted steps, or its gradient norm exceeds ``grad_norm_spike_factor`` × their
median gradient norm; spikes are judged once ``spike_warmup_steps`` steps have been accepted (the
first steps of a run move too fast to have a baseline). A factor of 0 turns that check off. The
history is part of the trainer state, so a resumed run judges exactly as the uninterrupted one.

The spike warm-up leaves the first steps unjudged, and a learning rate far too high wrecks the model
in exactly those steps (at 1e6 the loss is 1e12 from step 2). So one absolute bound holds from step
1: the *loss ceiling*, a multiple (``loss_ceiling_factor``, default 2) of the loss of uniform
predictions, ln V for the MLM over a V-token vocabulary plus ln k for a k-way pair task. A freshly
initialized model starts just above that loss and training only lowers it; a model at twice it is
confidently wrong everywhere, which no healthy model is.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Verdict:
    skip: bool
    reason: str | None = None  # nonfinite_loss | nonfinite_grad_norm | loss_ceiling | loss_spike | grad_norm_spike
    detail: str = ""


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
