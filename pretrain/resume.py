"""What a resumed run may change: the run signature kept in each checkpoint's manifest.

A checkpoint records the settings the run was trained with (its *signature*). On resume the
current settings are compared with it, field by field:

- **harmless** settings (logging, checkpoint interval, workers, stop and skip policies, where the
  run lives) may change freely; the change is recorded in ``run_config.json``;
- settings that **break exactness** (data, batch shape, world size, seed, optimizer, schedule,
  precision, masking, ALUM) are refused with the list of differences unless
  ``--allow-config-change`` is given, in which case they are recorded;
- settings that **cannot change** (the model's architecture, its initialization, the vocabulary,
  the ZeRO stage) are refused even then: the saved tensors would not fit.

The learning rate is the one exactness-breaking change with its own door: ``--resume-lr-scale``
runs the rest of the schedule at a multiple of the configured peak rate (the override wins over the
scheduler state saved in the checkpoint). The scale is kept in the trainer state, so resuming
again with the same command neither compounds it nor loses it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from biomed_lm.errors import PretrainError
from biomed_lm.pretrain.sampler import SAMPLE_ORDER

# Settings that do not change a single number the run computes (dotted section.field names).
HARMLESS = frozenset({
    "model.init_checkpoint",  # a path: the weights it held are in the checkpoint
    "data.data_dir", "data.tokenizer", "data.num_workers",  # paths (their content is signed) and workers
    "train.output_dir", "train.checkpoint_every", "train.keep_last", "train.export_hf", "train.resume",
    "train.log_every", "train.wandb_mode", "train.wandb_project", "train.run_name",
    "train.max_consecutive_skips", "train.loss_spike_factor", "train.grad_norm_spike_factor",
    "train.spike_window", "train.spike_warmup_steps", "train.loss_ceiling_factor", "train.stop_after_hours",
    "train.allow_config_change",
    "train.resume_lr_scale", "train.continue_from", "train.profile_steps", "train.profile_after",
    "train.stall_timeout",
})
# Settings whose saved tensors would not fit another value.
FIXED = frozenset({"model.init", "model.model", "model.architecture", "data.vocab_sha256", "train.zero_stage"})


# Fields added after checkpoints were already being written, with the value an older checkpoint's
# run had in effect: such a checkpoint resumes as before instead of reporting a change.
ADDED_FIELDS = {"train.schedule_total_steps": 0, "train.continue_from": "", "train.loss_ceiling_factor": 0.0,
                "model.compile_mode": "default", "model.compile_scope": "whole", "model.layers_per_graph": 1,
                "data.sample_order": "permutation", "train.profile_steps": 0, "train.profile_after": 20,
                "model.residual_stream": "fp32", "train.stall_timeout": 300.0, "adversarial.adv_kl_targets": "live"}
# Fields renamed after checkpoints were already being written: old name -> name. An older checkpoint's
# value is compared under the new name, so the rename alone is no change.
RENAMED_FIELDS = {"data.nsp": "data.train_pair"}


class ConfigChangeRefused(PretrainError, ValueError):
    """The resumed run's settings differ from the checkpoint's in a way that breaks it."""


def run_signature(*, model_args, data_args, train_args, adversarial, world_size: int,
                  architecture: dict[str, Any], data_meta: dict[str, Any]) -> dict[str, Any]:
    """Every setting of the run as a flat ``section.field`` mapping (JSON-serializable)."""
    signature: dict[str, Any] = {}
    for section, args in (("model", model_args), ("data", data_args), ("train", train_args),
                          ("adversarial", adversarial)):
        if args is not None:
            signature.update({f"{section}.{k}": v for k, v in dataclasses.asdict(args).items()})
    signature["model.architecture"] = architecture
    signature["train.world_size"] = world_size
    signature["data.sample_order"] = SAMPLE_ORDER  # which instances a step reads (pretrain.sampler)
    for key in ("vocab_sha256", "max_seq_length", "fingerprint", "instances"):
        signature[f"data.{key}"] = data_meta.get(key)
    return json.loads(json.dumps(signature, default=str))  # as a manifest stores it (tuples become lists)


def compare_signatures(saved: dict[str, Any], current: dict[str, Any], *, allow_change: bool) -> dict[str, Any]:
    """The differences between a checkpoint's signature and the current one, as
    ``{field: {"checkpoint": old, "now": new}}``; raises :class:`ConfigChangeRefused` listing them
    when they break the run and are not allowed."""
    saved = _as_current_fields(saved, current)
    changes = {key: {"checkpoint": saved.get(key), "now": current.get(key)}
               for key in sorted(set(saved) | set(current)) if saved.get(key) != current.get(key)}
    fixed = [key for key in changes if key in FIXED or key.startswith("model.architecture")]
    breaking = [key for key in changes if key not in HARMLESS and key not in fixed]
    if fixed:
        raise ConfigChangeRefused(
            "the checkpoint cannot be resumed with these settings (its tensors would not fit): "
            + _describe(changes, fixed) + "; start a new run (--output-dir) or continue from its export with "
            "--init continual --init-checkpoint <checkpoint>/hf")
    if breaking and not allow_change:
        hint = (" (to lower the learning rate, keep --learning-rate and pass --resume-lr-scale)"
                if "train.learning_rate" in breaking else "")
        raise ConfigChangeRefused(
            "the resumed run would not be the run the checkpoint belongs to: " + _describe(changes, breaking)
            + f"{hint}. Restore the settings, or pass --allow-config-change to resume with them anyway")
    return changes


# What a continued run (phase 2 from phase 1's checkpoint) must share with the run it continues: the
# tensors (architecture, vocabulary, ZeRO layout) and the one schedule and optimizer both phases run.
# Everything else may change: data, sequence length, micro batch, accumulation, max_steps, precision.
CONTINUATION_FIXED = frozenset({
    "model.architecture", "data.vocab_sha256", "train.zero_stage", "train.optimizer", "train.learning_rate",
    "train.adam_beta1", "train.adam_beta2", "train.adam_epsilon", "train.weight_decay", "train.schedule",
    "train.warmup_ratio", "train.polynomial_power", "train.schedule_total_steps",
})


def compare_continuation(saved: dict[str, Any], current: dict[str, Any], *, source: str) -> dict[str, Any]:
    """The differences between the continued run's signature (``source`` names its checkpoint) and
    this run's; raises :class:`ConfigChangeRefused` when the model, optimizer or schedule differ."""
    saved = _as_current_fields(saved, current)
    changes = {key: {"checkpoint": saved.get(key), "now": current.get(key)}
               for key in sorted(set(saved) | set(current)) if saved.get(key) != current.get(key)}
    fixed = [key for key in changes if key in CONTINUATION_FIXED or key.startswith("model.architecture")]
    if fixed:
        raise ConfigChangeRefused(
            f"cannot continue {source}: the model, optimizer and schedule must be the run's own, but "
            + _describe(changes, fixed) + " (the schedule spans both phases: give phase 1 and phase 2 the same "
            "learning_rate, warmup_ratio and schedule_total_steps)")
    return changes


def _as_current_fields(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """``saved`` under the current field names (:data:`RENAMED_FIELDS`), with the value each field
    added since had in effect, for the fields this run has."""
    renamed = {RENAMED_FIELDS.get(key, key): value for key, value in saved.items()}
    return {**{key: value for key, value in ADDED_FIELDS.items() if key in current}, **renamed}


def _describe(changes: dict[str, Any], keys: list[str]) -> str:
    return ", ".join(f"{key}: {changes[key]['checkpoint']!r} in the checkpoint, {changes[key]['now']!r} now"
                     for key in keys)


#: Settings that reshape the learning-rate schedule (max_steps: where the schedule ends with it).
SCHEDULE_FIELDS = frozenset({"train.max_steps", "train.schedule_total_steps", "train.warmup_ratio",
                             "train.schedule", "train.polynomial_power"})


def follow_changed_schedule(optimizer, scheduler) -> None:
    """The next step's learning rate from the schedule as it is now. The optimizer state loaded from a
    checkpoint holds the rate the checkpoint's schedule set for that step, which the scheduler replaces
    only after it: a finished run extended with a larger max_steps ran its next step at the old end's 0
    (QA, 2026-11-28). The formula is LambdaLR's own, so an unchanged schedule gives the same rates."""
    for group, base, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def apply_learning_rate(optimizer, scheduler, *, learning_rate: float, scale: float) -> None:
    """Make the rest of the schedule peak at ``learning_rate × scale``, overriding the scheduler
    state loaded from the checkpoint (the current step's rate is rescaled at once)."""
    peak = learning_rate * scale
    old_bases = list(scheduler.base_lrs)
    scheduler.base_lrs = [peak for _ in old_bases]
    for group, old_base in zip(optimizer.param_groups, old_bases):
        group["lr"] = group["lr"] * (peak / old_base) if old_base else group["lr"]
        group["initial_lr"] = peak
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
