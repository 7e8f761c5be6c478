"""The trainer's checkpointed state, typed: what the step loop counts, and a variant's own counters.

A checkpoint keeps it as one flat dict, ``client_state["trainer_state"]`` (DeepSpeed pickles it
beside the model), of the shape every version so far has written: so a checkpoint of any age
resumes. A field an older checkpoint lacks takes the value a fresh run starts with (the counter
did not exist yet: nothing was counted), and a key no field names is left out (older versions kept
ALUM's counter in every run's state, ALUM or not).

A variant of the objective (ALUM's adversarial term) keeps its counters in its own
:class:`VariantState` subclass, which its output type names (``PretrainingOutput.state_type``);
the loop holds it in :attr:`TrainerState.variant` without knowing its fields, and it is stored in
the same flat dict under its own names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, TypeVar

_Variant = TypeVar("_Variant", bound="VariantState")


@dataclass
class VariantState:
    """A variant's checkpointed counters: none for the standard objective. A variant subclasses it;
    its fields need defaults (a checkpoint written without the variant has none of them) and names
    of their own (they share the checkpoint's dict with :class:`TrainerState`'s)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[_Variant], saved: Mapping[str, Any]) -> _Variant:
        """The fields ``saved`` has; the others as a fresh run starts them."""
        return cls(**{f.name: saved[f.name] for f in dataclasses.fields(cls) if f.name in saved})


@dataclass
class TrainerState:
    """Where the run is and what it has counted: restored on resume, saved with every checkpoint."""

    step: int = 0  # optimizer steps done (skipped ones included)
    skipped_steps: int = 0  # updates the divergence guard vetoed, in all
    consecutive_skips: int = 0  # ... in a row up to this step (``max_consecutive_skips`` aborts)
    tokens: int = 0  # real tokens trained on, over all ranks
    train_seconds: float = 0.0  # time in steps (not set-up, checkpoints or resumes)
    lr_scale: float = 1.0  # --resume-lr-scale in effect: a later plain resume keeps it, never compounds it
    guard: dict[str, Any] = field(default_factory=dict)  # the divergence guard's history (its state_dict)
    fp16_overflow_steps: int = 0  # updates DeepSpeed skipped on an fp16 overflow (the schedule held still)
    continued_from: str | None = None  # the checkpoint a continued run (--continue-from) started from
    variant: VariantState = field(default_factory=VariantState)  # the objective variant's own counters

    def __post_init__(self) -> None:
        shared = set(self._loop_fields()) & {f.name for f in dataclasses.fields(self.variant)}
        if shared:
            raise TypeError(f"{type(self.variant).__name__} reuses trainer-state names {sorted(shared)}: "
                            "a checkpoint's flat dict could not tell them apart")

    @classmethod
    def _loop_fields(cls) -> tuple[str, ...]:
        """The loop's own field names, in their order."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "variant")

    def to_dict(self) -> dict[str, Any]:
        """The flat dict a checkpoint keeps (``continued_from`` only when set, as before)."""
        saved = {name: getattr(self, name) for name in self._loop_fields()}
        if self.continued_from is None:
            del saved["continued_from"]
        return {**saved, **self.variant.to_dict()}

    @classmethod
    def from_dict(cls, saved: Mapping[str, Any], variant: type[VariantState] = VariantState) -> TrainerState:
        """The state a checkpoint's dict holds, of any version; ``variant`` is this run's variant type."""
        loop = {name: saved[name] for name in cls._loop_fields() if name in saved}
        return cls(**loop, variant=variant.from_dict(saved))
