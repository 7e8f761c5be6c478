"""The pretraining loop: MLM + a sentence-pair objective under DeepSpeed, resumable to the exact step.

The model family (BERT, ALBERT, RoBERTa) and the pair task (NSP, SOP, DRP or none) are looked up,
never branched on, here: :mod:`pretrain.families` says how each family is built, run and
exported, and which pair tasks its head takes (refused before training otherwise).

One code path serves a laptop CPU, ``deepspeed --num_gpus 2`` on one machine (gloo on CPU, NCCL on
GPUs) and multi-node runs with a hostfile: DeepSpeed owns data parallelism, gradient
accumulation, mixed precision, ZeRO and clipping under ZeRO or fp16 (its config is generated from the typed
arguments, see :mod:`pretrain.config`); this module owns the data stream, masking, metrics,
checkpoints and faults. :func:`train` is set-up (:func:`_prepare_run`), a short step loop, and the
final export; a step is :func:`_accumulate_step` (forward/backward per micro-batch, the verdict, the
optimizer step), queued on the device without reading anything back, and at the read points (logged
steps, checkpoints, every :data:`MICRO_BATCHES_BETWEEN_READS` micro-batches) :func:`_read_steps` brings the steps since
the last read to the host in one read for :func:`_account_step` (counting, logging, the divergence
abort). Variants of the
objective plug in through the model's output type (``PretrainingModel.output_type``): ALUM's term
brings its own totals, state and metrics (:class:`pretrain.adversarial.AdversarialPretrainingOutput`),
and the loop never asks which variant runs.

Reproducibility. Everything random is a function of the seed and the step: which instances a
rank reads (:mod:`pretrain.sampler`), the masks of each micro-batch (a generator seeded with
(seed, step, micro-batch, rank)), and dropout (the RNG state is checkpointed per rank). So a run
that is killed and resumed produces the same losses as one that never stopped. What the loop counts
is checkpointed with it (:class:`pretrain.trainer_state.TrainerState`).

Faults. Checkpoints are verified before a resume and a damaged one falls back to the previous
(:mod:`pretrain.checkpoint`); a resumed run with other settings is refused or recorded
(:mod:`pretrain.resume`); a non-finite or spiking step is skipped before the optimizer touches the
weights (:mod:`pretrain.divergence`: its update is vetoed on the device, or around ``engine.step()``), and after
``max_consecutive_skips`` in a row the run aborts, keeping its last (healthy) checkpoint; SIGTERM,
SIGUSR1, SIGINT, a time budget or a vanished launcher finish the steps up to the next read point (at
most :data:`MICRO_BATCHES_BETWEEN_READS` micro-batches, or the step) on every rank, write a checkpoint
and exit cleanly (:mod:`pretrain.preemption`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypedDict

import numpy as np
import torch

from biomed_lm.backend import (decided_on_rank0, initialize_engine, lost_peer_reason,  # shared with fine-tuning
                               lost_rank, start_distributed)
from biomed_lm.pretrain.attention import KERNELS, PADDED
from biomed_lm.pretrain.checkpoint import (Selection, checkpoint_tags, checkpoints_root, latest_tag, load_checkpoint,
                                           save_checkpoint, select_checkpoint, set_aside_diverged)
from biomed_lm.pretrain.config import (DataArguments, ModelArguments, PretrainConfigError, TrainArguments,
                                       create_ds_config, load_model_preset, resolve_batch, schedule_steps,
                                       trainer_clips_gradients)
from biomed_lm.pretrain.divergence import (UNHEALTHY_WEIGHTS, DivergenceGuard, StepGate, Verdict,
                                           uniform_prediction_loss)
from biomed_lm.pretrain.families import ModelFamily, family_of, get_family, resolve_pair_objective
from biomed_lm.pretrain.flops import mfu, peak_flops, step_flops_from_counts
from biomed_lm.pretrain.layout import IGNORE_INDEX, Layout, PaddedBatch, VarlenBatch
from biomed_lm.pretrain.metrics import MetricsLogger, cuda_allocator_counts
from biomed_lm.pretrain.modeling import PretrainingModel, count_parameters, hf_attention
from biomed_lm.pretrain.preemption import StopRequests, ignore_stop_signals, stop_workers
from biomed_lm.pretrain.profiling import StepProfiler
from biomed_lm.pretrain.resume import (SCHEDULE_FIELDS, apply_learning_rate, compare_continuation, compare_signatures,
                                      follow_changed_schedule, run_signature)
from biomed_lm.finished_output import read_record
from biomed_lm.run_lock import RunLock, acquire_run_lock
from biomed_lm.pretrain.sampler import BatchPlan
from biomed_lm.pretrain.trainer_state import TrainerState, VariantState
from biomed_lm.stall import StallWatchdog

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from biomed_lm.pretrain.adversarial import AdversarialConfig

LOG = logging.getLogger(__name__)

EXIT_DIVERGED = 3


class DivergenceAbort(RuntimeError):
    """Too many optimizer steps in a row were skipped (non-finite or spiking)."""


def micro_batch_seed(seed: int, step: int, micro: int, rank: int) -> int:
    return int(np.random.SeedSequence([seed, step, micro, rank]).generate_state(1, dtype=np.uint64)[0] >> 1)


class MicroBatch(TypedDict):
    """One collated micro-batch, as the loader hands it to the step."""

    prepared: PaddedBatch | VarlenBatch  # in the model's layout, on the host
    next_sentence_label: torch.Tensor | None  # the pair task's labels (None: no pair objective)
    step: int  # the 0-based step it belongs to (the step checks the stream is aligned)
    mlm_probability: float  # the masking rate it was masked at


class MicroBatchStream(torch.utils.data.IterableDataset):
    """Collated micro-batches of one rank for steps ``start``..``end``-1, in order.

    Collation (padding and masking) and the model's layout (:class:`pretrain.layout.Layout`: every
    data-dependent size, so the step never waits on the device for one) run in DataLoader workers;
    worker ``w`` of ``W`` builds every W-th micro-batch and the DataLoader interleaves them back in order."""

    def __init__(self, dataset, plan: BatchPlan, collator, start: int, end: int, mask_rate, layout: Layout):
        self.dataset, self.plan, self.collator = dataset, plan, collator
        self.start, self.end, self.mask_rate, self.layout = start, end, mask_rate, layout

    def __iter__(self) -> Iterator[MicroBatch]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        k = 0
        for step in range(self.start, self.end):
            for micro, indices in enumerate(self.plan.micro_batches(step)):
                if k % workers == worker:
                    features = self.dataset[indices]
                    rows = [dict(zip(features, values)) for values in zip(*features.values())]
                    generator = torch.Generator().manual_seed(
                        micro_batch_seed(self.plan.seed, step, micro, self.plan.rank))
                    masked = self.collator(rows, generator=generator, mlm_probability=self.mask_rate(step))
                    prepared = self.layout(masked["input_ids"], masked["attention_mask"], masked["token_type_ids"],
                                           masked["labels"])
                    yield MicroBatch(prepared=prepared, next_sentence_label=masked.get("next_sentence_label"),
                                     step=step, mlm_probability=masked.mlm_probability)
                k += 1


@dataclasses.dataclass
class Run:
    """Everything the step loop needs, built by :func:`_prepare_run`."""

    model_args: ModelArguments
    data_args: DataArguments
    train_args: TrainArguments
    rank: int
    world_size: int
    device: torch.device
    run_dir: Path
    lock: RunLock | None  # rank 0's hold on run_dir (None on the other ranks)
    hf_model: PreTrainedModel  # the family's transformers model: what is exported
    model: PretrainingModel  # hf_model with the losses (ALUM's subclass when on): what the engine runs
    tokenizer: PreTrainedTokenizerBase
    engine: DeepSpeedEngine
    gate: StepGate  # vetoes the optimizer step the guard rejects, around engine.step() or on the device
    guard: DivergenceGuard  # on the run's device: judges each step there
    stops: StopRequests
    batches: Iterator[MicroBatch]
    logger: MetricsLogger
    state: TrainerState  # checkpointed with every save
    signature: dict[str, Any]  # the run's settings as a checkpoint's manifest keeps them (pretrain.resume)
    peak: float | None  # the device's dense FLOP/s at the run's precision; None where unknown (MFU not reported)
    graphs: CompiledGraphs | None  # torch.compile's graphs so far (None: not compiled)


#: The host reads the device's numbers (sums, verdicts) at least once per this many micro-batches
#: (rounded to whole steps: every step when a step has more), logged or not: a stop request (SIGTERM,
#: the time budget) takes effect at the next read, so a pre-empted rank has this much left to run
#: before its checkpoint (DeepSpeed's launcher allows 30 s). One read per step costs little when a
#: step is many micro-batches long.
MICRO_BATCHES_BETWEEN_READS = 16


@dataclasses.dataclass
class PendingStep:
    """An optimizer step whose sums and verdict are still on the device; :func:`_read_steps` brings a
    run of them to the host in one read."""

    number: int  # 1-based: the steps done once this one is
    totals: StepTotals
    sums: torch.Tensor  # the totals reduced over ranks, float64, on the device (StepTotals' order)
    record: torch.Tensor  # the guard's verdict record (pretrain.divergence.RECORD_FIELDS), on the device
    grad_norm_known: bool  # False where the gradients are not in param.grad (ZeRO stages 1-2)
    lr: float  # the rate this step's update used
    started: float  # perf_counter when its first micro-batch was queued
    result: StepResult | None = None  # once read


@dataclasses.dataclass
class StepResult:
    """One optimizer step as :func:`_read_steps` read it back, for accounting, logging and the loop."""

    number: int  # 1-based: the steps done once this one is
    totals: StepTotals  # reduced over all ranks
    verdict: Verdict
    lr: float  # the rate this step's update used
    grad_norm: float | None  # unscaled, before clipping; None where it is not in param.grad (ZeRO)
    seconds: float

    @property
    def stopping(self) -> bool:
        """Some rank was asked to stop (every rank sees the same reduced totals)."""
        return self.totals["stop"] > 0


def train(model_args: ModelArguments, data_args: DataArguments, train_args: TrainArguments,
          adversarial: AdversarialConfig | None = None) -> dict[str, Any]:
    """Run (or resume) pretraining; returns a summary. Raises on unusable inputs before training.
    ``adversarial`` with ``adversarial=True`` adds ALUM's adversarial term (:mod:`pretrain.adversarial`)."""
    import torch.distributed as dist

    run = _prepare_run(model_args, data_args, train_args, adversarial)
    try:
        step = _run_steps(run)
        final_dir = None
        if step == train_args.max_steps and run.rank == 0:
            final_dir = run.run_dir / "model"
            _export_hf(run.hf_model, run.tokenizer, final_dir)
        dist.barrier()
    except Exception as err:
        if lost_peer_reason(err) is None:
            raise
        newest = latest_tag(run.run_dir)
        resume = (f"The same command resumes from the newest verified checkpoint "
                  f"({checkpoints_root(run.run_dir) / newest})" if newest else
                  "No checkpoint was written yet: the same command starts again")
        raise lost_rank(err, run.rank, run.world_size, resume) from err
    finally:  # the directory is the run's until the export is written, then free on any way out
        if run.lock is not None:
            run.lock.release()
    return {"step": step, "completed": step == train_args.max_steps, "skipped_steps": run.state.skipped_steps,
            "tokens": run.state.tokens, "model_dir": str(final_dir) if final_dir else None}


def _run_steps(run: Run) -> int:
    """The step loop, from the resumed step to ``max_steps`` or a stop request; the step reached."""
    args, step = run.train_args, run.state.step
    pending: list[PendingStep] = []
    since: float | None = None  # where the next read's window starts (None: at its first step's start)
    profiler = StepProfiler(args.profile_steps if run.rank == 0 else 0, args.profile_after, run.run_dir, run.device,
                            f"launch/pretrain.py, {run.model_args.architecture}, micro-batch {args.micro_batch_size} "
                            f"x {args.gradient_accumulation_steps} x {run.world_size}")
    saved = step if run.state.step else None  # the newest checkpoint, for the watchdog's line
    # Alone, a rank has no peer to wait for: a slow step is just slow.
    watchdog = StallWatchdog(args.stall_timeout if run.world_size > 1 else 0, lambda: _stall_line(run, step, saved))
    try:
        while step < args.max_steps:
            profiler.before_step(step)
            pending.append(_accumulate_step(run, step))
            step += 1
            watchdog.beat()  # the first beat arms it: the first step's compilation is not counted
            report = profiler.after_step(step)
            if report is not None:
                run.logger.message(f"profile of steps {profiler.first}-{profiler.last}: {report}")
            if not _is_read_point(args, step):
                continue  # the device runs ahead; nothing of this step is read yet
            done = _read_steps(run, pending, since)
            since = time.perf_counter()  # the accounting and logging below are the next window's host time
            watchdog.beat()
            pending.clear()
            for result in done:
                _account_step(run, result)
            stopping = any(result.stopping for result in done)
            if step % args.checkpoint_every == 0 or step == args.max_steps or stopping:
                with watchdog.paused():
                    _checkpoint(run, step)
                saved = step
                since = None  # a save is not the steps' time
            if stopping:
                reason = run.stops.reason() or "another rank was asked to stop"
                run.logger.message(f"{reason}: stopped after step {step} with a checkpoint; resume with the same "
                                   "command")
                break
    finally:
        watchdog.stop()
        # Workers ignore SIGTERM (pre-emption is the main process's to handle), so they are stopped
        # here on every way out: left to interpreter exit, multiprocessing would wait for them forever.
        stop_workers(run.batches)
        run.stops.restore()
        run.logger.close()
    return step


def _stall_line(run: Run, step: int, saved: int | None) -> str:
    """The watchdog's words (:mod:`biomed_lm.stall`), from the step last queued and the newest checkpoint the
    loop saved: no file is read, the file system may be what hangs."""
    resume = (f"the same command resumes from the checkpoint of step {saved}" if saved is not None else
              "no checkpoint was written yet: the same command starts again")
    return (f"rank {run.rank} of {run.world_size} ends after step {step} was queued rather than wait in a "
            f"collective for the process group's timeout: a rank stopped answering without exiting (a stopped node, a "
            f"network partition, a hung device or file system); {resume}")


def _is_read_point(args: TrainArguments, step: int) -> bool:
    """Whether the host reads the steps since the last read after step ``step``: to log it, to
    checkpoint it, at the end, and at least every :data:`MICRO_BATCHES_BETWEEN_READS` micro-batches.
    Every rank reads at the same steps, so all see a stop request at the same one."""
    unread_at_most = max(1, MICRO_BATCHES_BETWEEN_READS // args.gradient_accumulation_steps)
    return any(step % every == 0 for every in (args.log_every, args.checkpoint_every, unread_at_most)) \
        or step == args.max_steps


def _prepare_run(model_args: ModelArguments, data_args: DataArguments, train_args: TrainArguments,
                 adversarial: AdversarialConfig | None) -> Run:
    """Check the inputs, build the model and engine, and restore the newest verified checkpoint;
    everything that can be wrong is found here, before any training."""
    family, model_fields, max_positions = _check_arguments(model_args, data_args, train_args)
    rank, world_size, device = _start_distributed(train_args)
    run_dir = Path(train_args.output_dir)
    lock = _take_run_directory(run_dir, rank)  # before anything in run_dir is read or written
    try:
        return _prepare_locked_run(model_args, data_args, train_args, adversarial, family, model_fields,
                                   max_positions, (rank, world_size, device), lock)
    except BaseException:
        if lock is not None:  # a refused start leaves no folder behind (nothing else was written in it)
            lock.release(failed=True)
        raise


def _prepare_locked_run(model_args: ModelArguments, data_args: DataArguments, train_args: TrainArguments,
                        adversarial: AdversarialConfig | None, family: ModelFamily, model_fields: dict | None,
                        max_positions: int | None, placement: tuple[int, int, torch.device], lock: RunLock | None
                        ) -> Run:
    """:func:`_prepare_run` once the run directory is held."""
    rank, world_size, device = placement
    run_dir = Path(train_args.output_dir)
    selection = _select_resume_checkpoint(run_dir, train_args, rank)  # rank 0's choice, shared: one path for all
    export = _own_export(run_dir, selection) if model_args.init != "scratch" else None
    general_unread = max_positions is None
    max_positions = _model_positions(export, max_positions, model_args, family, selection)
    tokenizer, dataset, data_meta, pair = _load_data(data_args, max_positions, family)

    torch.manual_seed(train_args.seed)  # identical initial weights on every rank
    if export is not None:
        hf_model, init_report = _model_of_own_export(export, run_dir, model_args, family, pair.task, general_unread)
    else:
        hf_model, init_report = _initial_model(model_args, tokenizer, model_fields, family, pair.task,
                                               resuming=selection.tag is not None)
    signature = run_signature(model_args=model_args, data_args=data_args, train_args=train_args,
                              adversarial=adversarial, world_size=world_size, data_meta=data_meta,
                              architecture=family.signature(hf_model.config))
    config_changes = compare_signatures(selection.manifest["signature"], signature,
                                        allow_change=train_args.allow_config_change) if selection.tag else {}
    model, execution = _pretraining_model(hf_model, model_args, pair.trained, train_args, adversarial, device)
    engine, gate, optimizer_impl = _build_engine(model, train_args, world_size, device)
    torch.manual_seed(train_args.seed + rank)  # dropout differs across ranks, reproducibly
    variant = model.output_type.state_type  # the objective variant's own counters (ALUM's)
    if selection.tag is None and train_args.continue_from:
        state, config_changes = _continue(engine, train_args, signature, rank, variant)
    else:
        state = _restore(engine, run_dir, selection, train_args, config_changes, rank, variant)

    run_config = {"model": dataclasses.asdict(model_args), "data": dataclasses.asdict(data_args),
                  "train": dataclasses.asdict(train_args), "world_size": world_size,
                  "adversarial": dataclasses.asdict(adversarial) if adversarial is not None else None,
                  "optimizer_impl": optimizer_impl, "execution": dataclasses.asdict(execution),
                  "model_class": family.model_class, "pair_task": pair.as_dict(),
                  "parameters": count_parameters(hf_model), "initialization": init_report.as_dict(),
                  "data_meta": data_meta, "resumes": _resume_history(run_dir, rank, selection, config_changes, state)}
    logger = MetricsLogger(run_dir, enabled=rank == 0, wandb_mode=train_args.wandb_mode,
                           wandb_project=train_args.wandb_project, run_name=train_args.run_name,
                           config=run_config, total_steps=train_args.max_steps, initial_step=state.step)
    _log_objective(logger, lock, family, pair, adversarial, train_args.precision, data_args)
    _log_start(logger, selection, state, config_changes, init_report, train_args, run_dir)
    logger.message(execution.describe())
    logger.message(f"{count_parameters(hf_model) / 1e6:.1f}M parameters, {len(dataset):,} instances, global batch "
                   f"{train_args.global_batch_size} ({world_size} rank(s) × {train_args.micro_batch_size} × "
                   f"{train_args.gradient_accumulation_steps}), optimizer {optimizer_impl}, device {device}")
    plan = BatchPlan(len(dataset), train_args.micro_batch_size, train_args.gradient_accumulation_steps,
                     world_size, rank, train_args.seed)
    return Run(model_args=model_args, data_args=data_args, train_args=train_args, rank=rank, world_size=world_size,
               device=device, run_dir=run_dir, lock=lock, hf_model=hf_model, model=model, tokenizer=tokenizer,
               engine=engine, gate=gate, guard=_divergence_guard(train_args, state, len(tokenizer), pair, device),
               stops=StopRequests(train_args.stop_after_hours).install(),
               batches=_batches(dataset, plan, data_args, train_args, tokenizer, state.step, model.layout, device),
               logger=logger, state=state, signature=signature,
               peak=peak_flops(train_args.precision, device) if device.type == "cuda" else None,
               graphs=CompiledGraphs() if execution.compiled else None)


def _initial_model(model_args: ModelArguments, tokenizer, model_fields: dict | None, family: ModelFamily,
                   pair_task: str, *, resuming: bool):
    """The model as initialization makes it, with its report. On a resume the general checkpoint's weights are
    replaced by the run's own: transformers' report on its missing heads (a MISSING table, "This checkpoint
    seem corrupted") is not about this run then, and is not shown (QA)."""
    from biomed_lm.pretrain.initialization import initialize_model, quiet_loading

    with quiet_loading() if resuming else contextlib.nullcontext():
        return initialize_model(model_args.init, tokenizer=tokenizer, model_fields=model_fields,
                                init_checkpoint=model_args.init_checkpoint or None,
                                attn_implementation=hf_attention(model_args.attn_implementation),
                                architecture=family.name, pair_task=pair_task)


def _model_of_own_export(export: Path, run_dir: Path, model_args: ModelArguments, family: ModelFamily,
                         pair_task: str, general_unread: bool):
    """A continual run's model on a resume: the architecture of its checkpoint's export, built without weights
    (the resume loads all of them), so the general checkpoint is neither needed (QA: moved or deleted, it stopped
    the resume) nor read. The report is the run's first start's, from its run_config.json."""
    from biomed_lm.pretrain.initialization import InitReport

    config = _export_config(export, family)
    model = family.transformers_class(family.model_class)._from_config(
        config, attn_implementation=hf_attention(model_args.attn_implementation))
    family.set_pair_task(model, pair_task)
    if general_unread:
        LOG.warning("init_checkpoint %s cannot be read: the model is built from this run's checkpoint %s, whose "
                    "weights the resume loads", model_args.init_checkpoint, export.parent.name)
    first = (read_record(run_dir / "run_config.json") or {}).get("initialization")
    try:
        return model, InitReport(**first)
    except TypeError:  # no record, or one of another version
        return model, InitReport(mode=model_args.init, checkpoint=model_args.init_checkpoint,
                                 vocab_size=int(config.vocab_size))


def _check_arguments(model_args: ModelArguments, data_args: DataArguments, train_args: TrainArguments
                     ) -> tuple[ModelFamily, dict | None, int | None]:
    """The model family, its preset's fields and the position limit; a bad preset, or a layout the
    family cannot run, is refused before DeepSpeed starts. The limit is None for a continual run whose general
    checkpoint cannot be read but whose run directory has checkpoints to resume from (only listed here):
    the resumed checkpoint's export gives it once the directory is locked."""
    from biomed_lm.pretrain.initialization import InitializationError, load_checkpoint_config

    if not train_args.output_dir:
        raise PretrainConfigError("output_dir is required")
    if not data_args.data_dir or not data_args.tokenizer:
        raise PretrainConfigError("data_dir and tokenizer are required")
    if train_args.precision == "fp8":  # the GPU, torch and torchao must run it: refused before anything starts
        from biomed_lm.pretrain.fp8 import check_fp8

        check_fp8()
    if model_args.residual_stream == "half" and train_args.precision == "fp32":
        raise PretrainConfigError("residual_stream half keeps the hidden states in the autocast dtype, and precision "
                                  "fp32 has none: use --precision bf16 (or fp16, fp8), or --residual-stream fp32")
    if data_args.max_ngram > 1 and not data_args.whole_word_masking:
        raise PretrainConfigError(f"max_ngram {data_args.max_ngram} masks spans of whole words: it needs "
                                  "whole_word_masking (drop --no-whole-word-masking, or set max_ngram 1)")
    family = get_family(model_args.architecture)
    family.resolve_attention(model_args.attn_implementation, model_args.compile)
    preset = model_args.model or (family.default_preset if model_args.init == "scratch" else "")
    model_fields = family.preset_fields(load_model_preset(preset), preset) if preset else None
    if model_args.init == "scratch":
        return family, model_fields, int(model_fields.get("max_position_embeddings", 512))
    try:
        return family, model_fields, family.usable_positions(load_checkpoint_config(model_args.init_checkpoint,
                                                                                    family.name))
    except InitializationError:
        if train_args.resume and checkpoint_tags(Path(train_args.output_dir)):
            return family, model_fields, None  # the run's own checkpoint is the model: _own_export
        raise


def _own_export(run_dir: Path, selection: Selection) -> Path | None:
    """The transformers export of the checkpoint a run resumes from (None: a fresh start, or a checkpoint saved
    under --no-export-hf)."""
    if selection.tag is None:
        return None
    export = checkpoints_root(run_dir) / selection.tag / "hf"
    return export if (export / "config.json").is_file() else None


def _export_config(export: Path, family: ModelFamily):
    return family.transformers_class(family.config_class).from_pretrained(str(export), local_files_only=True)


def _model_positions(export: Path | None, known: int | None, model_args: ModelArguments, family: ModelFamily,
                     selection: Selection) -> int:
    """The positions the data is checked against: the resumed export's, else the preset's or the general
    checkpoint's (``known``, None where it could not be read before the directory was locked)."""
    if export is not None:
        return family.usable_positions(_export_config(export, family))
    return known if known is not None else _general_checkpoint_positions(model_args, family, selection)


def _general_checkpoint_positions(model_args: ModelArguments, family: ModelFamily, selection: Selection) -> int:
    """The general checkpoint's positions where a continual run needs its weights (a fresh start, or a resume
    from a checkpoint without an export): its error, naming what is wrong, if it still cannot be read."""
    from biomed_lm.pretrain.initialization import InitializationError, load_checkpoint_config

    try:
        return family.usable_positions(load_checkpoint_config(model_args.init_checkpoint, family.name))
    except InitializationError as err:
        if selection.tag is None:
            raise
        raise InitializationError(f"{err}; the run's checkpoint {selection.tag} has no transformers export (hf/: "
                                  "left out by --no-export-hf) to build the model from instead") from None


def _start_distributed(train_args: TrainArguments) -> tuple[int, int, torch.device]:
    """Join the process group (the backend's, shared with fine-tuning); the batch is resolved for its size."""
    context = start_distributed(program="pretrain")
    resolve_batch(train_args, context.world_size)
    return context.rank, context.world_size, context.device


def _load_data(data_args: DataArguments, max_positions: int, family: ModelFamily):
    """The tokenizer, the instances, their metadata (checked against the tokenizer and model) and
    the pair objective the run trains (checked against the family's head)."""
    from biomed_lm.pretrain.data import load_pretraining_data, load_tokenizer_or_fail

    tokenizer = load_tokenizer_or_fail(data_args.tokenizer, PretrainConfigError)
    dataset, data_meta = load_pretraining_data(data_args.data_dir, tokenizer=tokenizer,
                                               max_position_embeddings=max_positions,
                                               expect_pair=data_args.train_pair and family.pair_head is not None)
    pair = resolve_pair_objective(family, data_meta, data_args.train_pair, source=data_args.data_dir)
    data_meta = {k: v for k, v in data_meta.items() if k != "summary"}
    data_meta.setdefault("instances", len(dataset))
    data_meta.setdefault("fingerprint", getattr(dataset, "_fingerprint", None))
    return tokenizer, dataset, data_meta, pair


def _restore(engine: DeepSpeedEngine, run_dir: Path, selection: Selection, train_args: TrainArguments,
             config_changes: dict[str, Any], rank: int, variant: type[VariantState]) -> TrainerState:
    """The trainer state: fresh, or the checkpoint's with the learning-rate override applied."""
    if selection.tag is None:  # nothing to resume: the scale applies from step 1 (the abort message's advice)
        state = TrainerState(variant=variant())
        if train_args.resume_lr_scale is not None:
            state.lr_scale = train_args.resume_lr_scale
            apply_learning_rate(engine.optimizer, engine.lr_scheduler, learning_rate=train_args.learning_rate,
                                scale=train_args.resume_lr_scale)
        return state
    state = TrainerState.from_dict(load_checkpoint(engine, run_dir, selection.tag, rank)["trainer_state"], variant)
    saved_scale = state.lr_scale
    lr_scale = saved_scale if train_args.resume_lr_scale is None else train_args.resume_lr_scale
    if lr_scale != saved_scale or lr_scale != 1.0 or "train.learning_rate" in config_changes:
        apply_learning_rate(engine.optimizer, engine.lr_scheduler, learning_rate=train_args.learning_rate,
                            scale=lr_scale)
    if SCHEDULE_FIELDS & set(config_changes):
        follow_changed_schedule(engine.optimizer, engine.lr_scheduler)
    state.lr_scale = lr_scale
    return state


def _continue(engine: DeepSpeedEngine, train_args: TrainArguments, signature: dict[str, Any], rank: int,
              variant: type[VariantState]) -> tuple[TrainerState, dict[str, Any]]:
    """Start from another run's checkpoint (phase 2 from phase 1): its model, optimizer, scheduler
    and step count carry over, so the learning-rate schedule goes on where it stopped (no second
    warm-up). The data position does not: it belonged to the other run's data, and this run's stream
    is read from its own plan at the continued step. The divergence guard starts afresh (losses at
    another sequence length have another baseline)."""
    source_dir, tag, manifest = _continuation_checkpoint(Path(train_args.continue_from))
    source = f"continue_from {source_dir / 'checkpoints' / tag}"
    changes = compare_continuation(manifest.get("signature", {}), signature, source=source)
    saved = TrainerState.from_dict(load_checkpoint(engine, source_dir, tag, rank)["trainer_state"], variant)
    if saved.step >= train_args.max_steps:
        raise PretrainConfigError(f"{source} is at step {saved.step}, not before max_steps "
                                  f"{train_args.max_steps}: nothing to continue")
    # The count of steps, tokens and time goes on; the skip streak, the guard and the variant start afresh.
    state = TrainerState(step=saved.step, skipped_steps=saved.skipped_steps, tokens=saved.tokens,
                         train_seconds=saved.train_seconds, lr_scale=saved.lr_scale,
                         fp16_overflow_steps=saved.fp16_overflow_steps,
                         continued_from=str(source_dir / "checkpoints" / tag), variant=variant())
    if train_args.resume_lr_scale is not None:  # given now, it wins over the continued run's
        state.lr_scale = train_args.resume_lr_scale
    if state.lr_scale != 1.0:
        apply_learning_rate(engine.optimizer, engine.lr_scheduler, learning_rate=train_args.learning_rate,
                            scale=state.lr_scale)
    return state, changes


def _continuation_checkpoint(path: Path) -> tuple[Path, str, dict[str, Any]]:
    """(run directory, tag, manifest) of ``--continue-from``: a run directory (its newest verified
    checkpoint) or one checkpoint directory inside one."""
    from biomed_lm.pretrain.checkpoint import CHECKPOINT_DIR, verify_checkpoint

    if path.parent.name == CHECKPOINT_DIR and path.is_dir():
        return path.parent.parent, path.name, verify_checkpoint(path)
    if not (path / CHECKPOINT_DIR).is_dir():
        raise PretrainConfigError(f"continue_from {path}: no such run directory with checkpoints (expected "
                                  f"{path / CHECKPOINT_DIR}, or a checkpoint directory inside it)")
    found = select_checkpoint(path, move_damaged=False)
    if found.tag is None:
        raise PretrainConfigError(f"continue_from {path}: the run has no verified checkpoint")
    return path, found.tag, found.manifest


def _divergence_guard(train_args: TrainArguments, state: TrainerState, vocab_size: int, pair,
                      device: torch.device) -> DivergenceGuard:
    uniform = uniform_prediction_loss(vocab_size, pair.classes if pair.trained else 0)
    guard = DivergenceGuard(loss_spike_factor=train_args.loss_spike_factor,
                            grad_norm_spike_factor=train_args.grad_norm_spike_factor,  # norms are unscaled
                            window=train_args.spike_window, warmup_steps=train_args.spike_warmup_steps,
                            loss_ceiling=train_args.loss_ceiling_factor * uniform, device=device)
    guard.load_state_dict(state.guard)
    return guard


def _log_objective(logger: MetricsLogger, lock: RunLock | None, family: ModelFamily, pair,
                   adversarial: AdversarialConfig | None, precision: str, data_args: DataArguments) -> None:
    """The run directory's lock note, then what the run trains: the family, the pair objective, masking
    settings the schedule ignores, and ALUM's settings when it is on (else only metrics.jsonl's adv_* columns
    would say so)."""
    from biomed_lm.pretrain.masking import unused_masking_settings

    if lock is not None and lock.note:
        logger.message(lock.note)
    logger.message(f"model family {family.name} ({family.model_class}); {pair.describe()}")
    for line in unused_masking_settings(data_args):
        logger.message(f"warning: {line}")
    if adversarial is not None and adversarial.adversarial:
        logger.message(adversarial.describe())
        caveat = adversarial.precision_caveat(precision)
        if caveat:
            logger.message(f"warning: {caveat}")


#: The learning rate above which an AdamW run from a pretrained checkpoint is warned (see _log_start). LAMB's
#: is a step relative to each layer's weight norm (its trust ratio), not comparable: BioALBERT continues
#: ALBERT at 8.8e-4 (configs/pretrain/bioalbert.yaml), so LAMB runs are not warned.
CONTINUAL_LR_WARNING = 5e-4


def _log_start(logger: MetricsLogger, selection: Selection, state: TrainerState, config_changes: dict[str, Any],
               init_report, train_args: TrainArguments, run_dir: Path) -> None:
    """What the run starts from: the checkpoint and what changed since, or the initialization."""
    for note in selection.notes:
        logger.message(f"warning: {note}")
    if selection.tag is None and state.continued_from:
        logger.message(f"continued from {state.continued_from} at step {state.step}: model, optimizer, "
                       "learning-rate schedule and step count carried over; data from this run's data_dir")
        for key, change in config_changes.items():
            logger.message(f"setting changed from the continued run: {key}: {change['checkpoint']!r} -> "
                           f"{change['now']!r}")
    elif selection.tag is None:
        logger.message(init_report.describe())
        adamw_too_fast = train_args.optimizer == "adamw" and train_args.learning_rate > CONTINUAL_LR_WARNING
        if init_report.checkpoint and adamw_too_fast:
            logger.message(
                f"warning: learning rate {train_args.learning_rate:g} on a pretrained encoder: continuing runs use "
                f"1e-4 or less (BioBERT 1e-4; configs/pretrain/demo_continual.yaml). Above "
                f"{CONTINUAL_LR_WARNING:g} a new head's first gradients can take the encoder apart while the loss "
                "still falls (QA: all-MiniLM-L6-v2 at 1e-3, 20 steps: every token's state the same, NER F1 0.49 "
                "-> 0.00)")
    else:
        logger.message(f"resumed from {run_dir / 'checkpoints' / selection.tag} at step {state.step} (verified)")
        if state.step >= train_args.max_steps:  # a re-run of a finished run: say so before the export is redone
            logger.message(f"the run was already complete (max_steps {train_args.max_steps}): nothing to train; "
                           "the model is exported again (a larger --max-steps with --allow-config-change trains on)")
        if state.continued_from:  # a run resumed after continuing another keeps saying where it began
            logger.message(f"this run continued {state.continued_from}")
        for key, change in config_changes.items():
            logger.message(f"setting changed on resume: {key}: {change['checkpoint']!r} -> {change['now']!r}")
        if SCHEDULE_FIELDS & set(config_changes):
            logger.message(f"learning-rate schedule: from step {state.step + 1} it is the changed one, over "
                           f"{schedule_steps(train_args)} steps (warm-up {train_args.warmup_ratio:g} of them), "
                           "as if the run had started with these settings")
    if state.lr_scale != 1.0:
        where = ("the rest of the schedule" if state.step else
                 "nothing to resume, so the whole schedule, from step 1,")
        logger.message(f"learning rate: {where} peaks at {state.lr_scale:g} × {train_args.learning_rate:g} "
                       "(--resume-lr-scale; it overrides any saved scheduler state)")


@dataclasses.dataclass
class Execution:
    """How the model runs: the layout, the attention kernel (and why faster ones were passed over),
    compilation and its token bucketing. Recorded in run_config.json and said in the run log."""

    attention: str
    passed_over: list[str]
    unpadded: bool
    compiled: bool
    bucket_tokens: int | None
    compiled_region: str | None = None  # what torch.compile covers (:func:`_compile`)
    mlm_loss: str = "dense"  # how the MLM head and its cross-entropy run (pretrain.mlm_loss)
    fp8_layers: int | None = None  # encoder Linear layers in torchao's float8 (--precision fp8); None: not fp8
    residual_stream: str | None = None  # the residual stream's dtype where not autocast's fp32 (--residual-stream half)

    def describe(self) -> str:
        layout = "unpadded (real tokens only)" if self.unpadded else "padded (transformers' forward)"
        text = f"execution: {layout}, attention {self.attention}, MLM loss {self.mlm_loss}"
        if self.residual_stream:
            text += f", residual stream in {self.residual_stream}"
        if self.passed_over:  # "name: reason" each; kernels passed over for the same reason said once
            by_reason: dict[str, list[str]] = {}
            for entry in self.passed_over:
                name, _, reason = entry.partition(": ")
                by_reason.setdefault(reason, []).append(name)
            text += " (passed over: " + "; ".join(f"{', '.join(names)}: {reason}"
                                                  for reason, names in by_reason.items()) + ")"
        if self.compiled:
            text += (f", torch.compile on {self.compiled_region}, token counts rounded up to a multiple of "
                     f"{self.bucket_tokens}")
        if self.fp8_layers is not None:
            text += (f", fp8: torchao float8 (tensorwise scaling) in {self.fp8_layers} encoder Linear layers, "
                     "bf16 autocast elsewhere")
        return text


def _pretraining_model(hf_model, model_args: ModelArguments, train_pair: bool, train_args: TrainArguments,
                       adversarial: AdversarialConfig | None, device: torch.device):
    """The trained module around ``hf_model``: the attention kernel chosen for this device, precision
    and model family, compiled when asked, ALUM's wrapper when on, the pair objective trained when
    ``train_pair``; moved to ``device``."""
    from biomed_lm.pretrain.adversarial import AdversarialPretrainingModel
    from biomed_lm.pretrain.attention import choose_kernel
    from biomed_lm.pretrain.compiling import should_compile
    from biomed_lm.pretrain.mlm_loss import resolve_implementation

    family = family_of(hf_model.config)
    requested, family_notes = family.resolve_attention(model_args.attn_implementation, model_args.compile)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(train_args.precision, torch.float32)
    fp8_layers = None  # encoder Linear layers running torchao's float8 matmuls (--precision fp8)
    if train_args.precision == "fp8":  # bf16 autocast around them (the DeepSpeed config's bf16 section)
        from biomed_lm.pretrain.fp8 import convert_encoder_to_fp8

        dtype, fp8_layers = torch.bfloat16, convert_encoder_to_fp8(hf_model, family)
    config = hf_model.config
    dropout = float(config.attention_probs_dropout_prob)
    attention, passed_over = choose_kernel(requested, device, dtype, dropout,
                                           head_size=config.hidden_size // config.num_attention_heads)
    compiled = should_compile(model_args.compile, device.type) and family.unpadded
    execution = Execution(attention, family_notes + passed_over, unpadded=attention not in PADDED, compiled=compiled,
                          bucket_tokens=model_args.bucket_tokens if compiled and attention not in PADDED else None,
                          fp8_layers=fp8_layers)
    # One decision, read twice: the MLM loss's pick below and _compile's region.
    forward_compiled = compiled and KERNELS[attention].traceable and not (adversarial and adversarial.adversarial)
    execution.mlm_loss, why_not_faster = resolve_implementation("auto", device, compiled=forward_compiled)
    if why_not_faster:
        execution.passed_over.append(f"a faster MLM loss: {why_not_faster}")
    half_stream = model_args.residual_stream == "half"
    if half_stream and not execution.unpadded:
        execution.passed_over.append("a half residual stream: transformers' padded forward keeps autocast's fp32")
    residual_dtype = dtype if half_stream and execution.unpadded else None
    if residual_dtype is not None:
        execution.residual_stream = str(residual_dtype).removeprefix("torch.")
    layout = {"attention": attention, "pad_to_multiple_of": execution.bucket_tokens, "mlm_loss": execution.mlm_loss,
              "residual_dtype": residual_dtype}
    if adversarial is not None and adversarial.adversarial:
        model = AdversarialPretrainingModel(hf_model, train_pair=train_pair, adversarial=adversarial, **layout)
    else:
        model = PretrainingModel(hf_model, train_pair=train_pair, **layout)
    model.to(device)
    if compiled:
        execution.compiled_region = _compile(model, attention, forward_compiled, model_args.compile_mode,
                                             model_args.compile_scope, model_args.layers_per_graph)
    return model, execution


def _compile(model: PretrainingModel, attention: str, forward_compiled: bool, mode: str, scope: str,
             layers_per_graph: int = 1) -> str:
    """Compile ``model``'s forward (autograd compiles each region's backward as one graph too) by
    ``scope`` when ``forward_compiled`` (the attention kernel traces and ALUM is off:
    :meth:`PretrainingModel.compile_losses`), otherwise the dense blocks (ALUM's several passes per
    micro-batch; ``sdpa_loop``'s loop over host-side lengths). Says which."""
    from biomed_lm.pretrain.compiling import compile_dense_blocks

    if forward_compiled:
        model.compile_losses(mode=None if mode == "default" else mode, scope=scope, layers_per_graph=layers_per_graph)
        block = "one encoder layer" if layers_per_graph == 1 else f"blocks of {layers_per_graph} encoder layers"
        regions = "the whole forward and backward" if scope == "whole" else \
            f"the embeddings, {block} (a graph every block shares) and the heads"
        return f"{regions} (mode {mode})"
    compile_dense_blocks(model.hf_model)
    why = "ALUM runs several passes" if type(model) is not PretrainingModel else f"{attention} does not trace"
    unused = "" if mode == "default" else f"; mode {mode} applies to compiled forwards only, not used"
    return f"the dense blocks ({why}{unused})"


def _select_resume_checkpoint(run_dir: Path, train_args: TrainArguments, rank: int) -> Selection:
    """Rank 0 picks the newest verified checkpoint (moving damaged ones aside) and tells the others;
    every rank raises the same :class:`CheckpointError` when the run cannot be resumed."""
    if not train_args.resume:
        if checkpoint_tags(run_dir):
            raise PretrainConfigError(f"{run_dir} already has checkpoints and resume is off: starting over would "
                                      "overwrite them; use a new --output-dir")
        return Selection()
    return decided_on_rank0(rank, lambda: select_checkpoint(run_dir))  # damaged ones are moved by rank 0 alone


def _take_run_directory(run_dir: Path, rank: int) -> RunLock | None:
    """Rank 0 locks ``run_dir`` (:mod:`biomed_lm.run_lock`) and checks that checkpoints can go where
    they will; every rank raises the same error when the directory is another run's or unusable."""
    def take() -> RunLock:
        lock = acquire_run_lock(run_dir)
        root = checkpoints_root(run_dir)
        if root.exists() and not root.is_dir():
            lock.release()
            raise PretrainConfigError(f"{root} exists and is not a directory: checkpoints cannot be saved there "
                                      "(move it away, or use another --output-dir)")
        return lock

    return decided_on_rank0(rank, take, share=False)  # the lock (an open file) stays on rank 0


def _build_engine(model, train_args: TrainArguments, world_size: int, device: torch.device):
    from biomed_lm.optim import ScheduleConfig, build_lr_scheduler, build_optimizer, parameter_groups

    # The gradients are clipped before the optimizer runs (by the trainer, or DeepSpeed's gradient_clipping:
    # pretrain.config.trainer_clips_gradients), so LAMB's own global-norm pre-normalization, the same
    # operation, is off.
    built = build_optimizer(
        train_args.optimizer, parameter_groups(model, train_args.weight_decay), lr=train_args.learning_rate,
        betas=(train_args.adam_beta1, train_args.adam_beta2), eps=train_args.adam_epsilon,
        weight_decay=train_args.weight_decay, device=device, max_grad_norm=None)
    gate = StepGate(built.optimizer)  # the optimizer itself: DeepSpeed's wrappers call its step
    scheduler = build_lr_scheduler(built.optimizer, ScheduleConfig(lr_schedule=train_args.schedule,
                                                                   warmup_ratio=train_args.warmup_ratio,
                                                                   lr_power=train_args.polynomial_power),
                                   total_steps=schedule_steps(train_args))
    engine = initialize_engine(model, built.optimizer, scheduler, create_ds_config(train_args, world_size))
    return engine, gate, built.implementation


def _batches(dataset, plan: BatchPlan, data_args: DataArguments, train_args: TrainArguments, tokenizer,
             start_step: int, layout: Layout, device: torch.device) -> Iterator[MicroBatch]:
    from biomed_lm.pretrain.masking import MaskingConfig, PretrainingCollator, mask_rate_schedule

    collator = PretrainingCollator.from_tokenizer(
        tokenizer, MaskingConfig(mlm_probability=data_args.mlm_probability, whole_word=data_args.whole_word_masking,
                                 max_ngram=data_args.max_ngram, max_predictions=data_args.max_predictions),
        pad_to_multiple_of=8)
    schedule = mask_rate_schedule(data_args)
    stream = MicroBatchStream(dataset, plan, collator, start_step, train_args.max_steps,
                              functools.partial(schedule.rate, total_steps=train_args.max_steps), layout)
    # The loader gets its own generator: drawing its base seed from the global one would shift the
    # dropout stream of a resumed run by one draw. Workers leave stop signals to the main process.
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=data_args.num_workers,
                                         prefetch_factor=4 if data_args.num_workers else None,
                                         worker_init_fn=ignore_stop_signals if data_args.num_workers else None,
                                         pin_memory=device.type == "cuda",  # so the copies to the device do not block
                                         generator=torch.Generator().manual_seed(train_args.seed))
    return iter(loader)


def _resume_history(run_dir: Path, rank: int, selection: Selection, changes: dict[str, Any],
                    state: TrainerState) -> list[dict[str, Any]]:
    """Earlier resumes of this run (from its run_config.json) plus this one, if it is one."""
    history: list[dict[str, Any]] = []
    path = run_dir / "run_config.json"
    if rank == 0 and selection.tag is not None and path.is_file():
        try:
            history = list(json.loads(path.read_text(encoding="utf-8")).get("resumes", []))
        except (OSError, ValueError, AttributeError):
            history = []
    if selection.tag is not None:
        history.append({"step": state.step, "checkpoint": selection.tag, "notes": selection.notes,
                         "config_changes": changes, "lr_scale": state.lr_scale,
                         "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    return history


def _accumulate_step(run: Run, step: int) -> PendingStep:
    """Forward and backward over this rank's micro-batches of step ``step`` + 1, the verdict on the
    step (taken on numbers reduced over all ranks, before the optimizer runs), and the optimizer step.

    Where the optimizer can skip an update on the device (fused AdamW, our fused LAMB:
    :meth:`StepGate.vetoes_on_device`), the verdict stays there and vetoes the update there: the step
    queues its work and returns without waiting for the device, which the host reads at the next read
    point (:func:`_read_steps`).
    Otherwise the host reads the step now, before the optimizer, to veto around ``engine.step()``."""
    engine, accumulation = run.engine, run.train_args.gradient_accumulation_steps
    started, lr = time.perf_counter(), engine.get_lr()[0]  # the rate this step's update uses
    totals = StepTotals(run.device, extra=run.model.output_type.EXTRA_TOTALS)
    batches = [next(run.batches) for _ in range(accumulation)]
    for batch in batches:
        assert batch["step"] == step, "data stream out of step"
        batch["prepared"] = batch["prepared"].to(run.device, non_blocking=True)
    # one micro-batch on one rank: its own masked count is the step's, which the model divides by already
    denominator = (mlm_denominator([batch["prepared"] for batch in batches], run.world_size)
                   if accumulation * run.world_size > 1 else None)
    for micro, batch in enumerate(batches):
        _forward_backward(run, batch, dataclasses.replace(batch["prepared"], mlm_denominator=denominator), totals)
        if micro < accumulation - 1:
            engine.step()  # within the accumulation: DeepSpeed counts the micro-step, nothing is updated
    pending_step = PendingStep(step + 1, totals, *_judge_on_device(run, totals), lr=lr, started=started)
    # The boundary: DeepSpeed steps the optimizer (a rejected step's update is vetoed here, all else
    # runs), zeroes the gradients and steps the learning-rate schedule.
    if run.gate.vetoes_on_device():
        with run.gate.vetoing_on_device(pending_step.record):
            engine.step()
        return pending_step
    (result,) = _read_steps(run, [pending_step])
    with run.gate.vetoing(result.verdict.vetoes_update):
        engine.step()
    result.seconds = time.perf_counter() - pending_step.started
    return pending_step


def mlm_denominator(batches: list[PaddedBatch | VarlenBatch], world_size: int) -> torch.Tensor:
    """What each micro-batch of a step divides its summed MLM loss by, so that the step's gradient is that
    of the mean over the global batch's masked tokens — every micro-batch's and every rank's, as one large
    batch would have it — and not a mean of per-micro-batch means, which weighs a masked token by how few
    share its micro-batch. DeepSpeed scales each micro-batch's loss by 1 / accumulation and averages the
    ranks' gradients, so the divisor is the global count over the micro-batches of all ranks. Counted and
    summed over ranks on the device (``batches`` are there): nothing waits for it."""
    import torch.distributed as dist

    count = torch.stack([(batch.masked_labels != IGNORE_INDEX).sum() for batch in batches]).sum().float()
    if world_size > 1:
        dist.all_reduce(count)
    return count.clamp(min=1) / (len(batches) * world_size)


def _forward_backward(run: Run, batch: dict, prepared: PaddedBatch | VarlenBatch, totals: StepTotals) -> None:
    """One micro-batch (``prepared``: its layout on the device): forward, backward and its sums, kept on the
    device. A non-finite loss is backpropagated like any other (its gradients are not finite, and the
    verdict skips the update); its sums are left out, and it is counted."""
    engine, accumulation = run.engine, run.train_args.gradient_accumulation_steps
    totals.add(mask_rate=batch["mlm_probability"] / accumulation, **_shape_counts(prepared))
    labels = batch["next_sentence_label"]
    run.model.begin_micro_batch(accumulating=accumulation > 1)  # under CUDA graphs: a new generation
    out = engine(prepared=prepared,
                 next_sentence_label=labels.to(run.device, non_blocking=True) if labels is not None else None)
    engine.backward(out.loss)
    finite = torch.isfinite(out.loss.detach())
    kept = {name: torch.where(finite, value, torch.zeros_like(value)) for name, value in
            {"mlm_loss": out.mlm_loss, "pair_loss": out.pair_loss, "mlm_correct": out.mlm_correct,
             "mlm_count": out.mlm_count, "pair_correct": out.pair_correct, "pair_count": out.pair_count,
             **out.extra_totals()}.items()}
    totals.add_on_device(nonfinite_micro=~finite, **kept)


def _judge_on_device(run: Run, totals: StepTotals) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """After the last backward, on the device: the gradient norm (and the clipping by it), the totals
    reduced over ranks, and the guard's verdict record on the step's mean loss and that norm (and
    whether the norm was known)."""
    import torch.distributed as dist

    engine = run.engine
    totals.add(stop=float(run.stops.reason() is not None))
    norm = _gradient_norm(engine)
    _clip_gradients(engine, run.train_args, norm)
    sums = totals.reduce(dist)
    micro_batches = run.train_args.gradient_accumulation_steps * run.world_size
    loss = torch.where(sums[totals.index("nonfinite_micro")] > 0, math.nan,
                       (sums[totals.index("mlm_loss")] + sums[totals.index("pair_loss")]) / micro_batches)
    return sums, run.guard.judge_on_device(loss, norm), norm is not None


def _read_steps(run: Run, steps: list[PendingStep], since: float | None = None) -> list[StepResult]:
    """Bring the pending steps' sums and verdicts to the host in one read (the wait for the device),
    as results for accounting. The device ran them back to back, so the window's time is shared out by
    their real tokens: every step of the window logs the window's tokens/s. The window runs from
    ``since`` (the last read, so the host's accounting and logging in between count, as a run pays for
    them) or, after a checkpoint or at the start, from its first step's start. Steps already read keep
    their result."""
    unread = [pending for pending in steps if pending.result is None]
    if unread:
        rows = torch.stack([torch.cat([pending.sums, pending.record]) for pending in unread]).cpu().tolist()
        start = unread[0].started if since is None else min(since, unread[0].started)
        window = time.perf_counter() - start
        tokens = [pending.totals.host[pending.totals.index("tokens")] for pending in unread]
        for pending, row, share in zip(unread, rows, _shares(tokens)):
            pending.totals.read(row[:len(pending.totals.names)])
            record = row[len(pending.totals.names):]
            loss, grad_norm = record[1], (record[2] if pending.grad_norm_known else None)
            verdict = fp16_overflow_verdict(run.guard.verdict(record), loss, run.engine.fp16_enabled())
            pending.result = StepResult(pending.number, pending.totals, verdict, pending.lr, grad_norm,
                                        window * share)
    return [pending.result for pending in steps]


def _shares(amounts: list[float]) -> list[float]:
    """Each amount's share of their sum (equal shares when the sum is 0)."""
    total = sum(amounts)
    return [amount / total for amount in amounts] if total > 0 else [1.0 / len(amounts)] * len(amounts)


def _shape_counts(prepared: PaddedBatch | VarlenBatch) -> dict[str, float]:
    """Real tokens, computed positions, sequences and Σ length² of a micro-batch (for throughput and
    attention FLOPs), read off the layout the loader built on the host."""
    return {"tokens": float(prepared.real_tokens), "positions": float(prepared.computed_positions),
            "sequences": float(prepared.num_sequences), "attention_pairs": float(sum(n * n for n in prepared.lengths))}


def _account_step(run: Run, done: StepResult) -> None:
    """Count the step, log it, and abort after too many skipped steps in a row."""
    state, args, step, verdict = run.state, run.train_args, done.number, done.verdict
    state.step = step
    state.train_seconds += done.seconds
    state.tokens += int(done.totals["tokens"])
    run.model.output_type.account_step(done.totals, state.variant)
    if verdict.reason == "fp16_overflow":
        state.fp16_overflow_steps += 1
        run.logger.message(
            f"step {step}: fp16 overflow ({verdict.detail}); DeepSpeed skipped the update and lowered the loss "
            f"scale to {loss_scale(run.engine):g}. The learning-rate schedule did not advance: it is now "
            f"{state.fp16_overflow_steps} step(s) behind the step count (the data stream is not), so the run "
            "ends that many steps short of the schedule's end")
    elif verdict.skip:
        state.skipped_steps += 1
        state.consecutive_skips += 1
        run.logger.message(f"step {step}: optimizer step skipped, {verdict.reason.replace('_', ' ')} "
                           f"({verdict.detail}; {state.consecutive_skips} in a row)")
    else:
        state.consecutive_skips = 0
    # The last step's update is never judged by a later loss: a run that ends on a step whose loss no
    # healthy model gives (non-finite, over the ceiling) holds broken weights and is not exported.
    ends_broken = step == args.max_steps and verdict.reason in UNHEALTHY_WEIGHTS
    aborting = state.consecutive_skips >= args.max_consecutive_skips or ends_broken
    if run.graphs is not None and (new_graphs := run.graphs.made.new_since_last_look()) and step > COMPILE_WARMUP_STEPS:
        run.logger.message(f"step {step}: torch.compile made {new_graphs} new graph(s) after warm-up (a shape or "
                           "guard changed; --bucket-tokens bounds the token counts)")
    if run.model.cuda_graphs and (skipped := run.graphs.cudagraph_skips.new_since_last_look()):
        run.logger.message(f"step {step}: inductor ran {skipped} compiled graph(s) without CUDA graphs, their kernels "
                           "launched one by one (TORCH_LOGS=cudagraphs gives its reasons)")
    if run.rank == 0 and (step % args.log_every == 0 or step == args.max_steps or verdict.skip):
        record = _metrics_record(run, done)
        run.logger.log(record)
        run.logger.progress(step, {"loss": f"{record['loss'] or math.nan:.3f}", "lr": f"{done.lr:.2e}",
                                   "tok/s": f"{record['tokens_per_s']:.0f}"})
    if aborting:
        _abort_diverged(run, first_skipped=step - state.consecutive_skips + 1, last=step, reason=verdict.reason)


def _abort_diverged(run: Run, first_skipped: int, last: int, reason: str | None) -> None:
    """Set aside the checkpoints that may hold the damaging update, then raise :class:`DivergenceAbort`."""
    import torch.distributed as dist

    moved = set_aside_diverged(run.run_dir, first_skipped - 1) if run.rank == 0 else []
    dist.barrier()
    skips = run.state.consecutive_skips
    why = (f"{skips} consecutive optimizer steps were skipped" if skips >= run.train_args.max_consecutive_skips
           else "the last step was skipped, so the final weights are broken and are not exported")
    resume_point = latest_tag(run.run_dir)
    raise DivergenceAbort(
        f"{why} (steps {first_skipped}..{last}, last: {reason.replace('_', ' ') if reason else '?'}); aborting. "
        f"The skipped steps did not touch the weights. Checkpoints holding the update of step {first_skipped - 1}, "
        f"which the spike followed, are set aside as suspect: {', '.join(moved) or 'none'}. Resuming starts from "
        f"{resume_point or 'nothing (there is no earlier checkpoint)'}: lower the learning rate with "
        f"--resume-lr-scale 0.5{'' if resume_point else ' (with nothing to resume it applies from step 1)'}, "
        "or check the data")


def _checkpoint(run: Run, step: int) -> None:
    import torch.distributed as dist

    run.state.guard = run.guard.state_dict()  # the guard's history lives on the device: read at saves only

    export = (lambda path: _export_hf(run.hf_model, run.tokenizer, path)) if run.train_args.export_hf else None
    save_checkpoint(run.engine, run.run_dir, step, {"trainer_state": run.state.to_dict()}, rank=run.rank,
                    world_size=run.world_size, barrier=dist.barrier, keep_last=run.train_args.keep_last,
                    signature=run.signature, export=export)
    run.logger.message(f"checkpoint: step {step}")


def _metrics_record(run: Run, done: StepResult) -> dict[str, Any]:
    """One line of metrics.jsonl. A skipped step says why; values it does not have are null (a
    non-finite loss is not a number to average)."""
    totals, verdict, elapsed = done.totals, done.verdict, done.seconds
    n = max(run.train_args.gradient_accumulation_steps * run.world_size - totals["nonfinite_micro"], 1)
    grad_norm = done.grad_norm
    if grad_norm is None and not verdict.skip:  # ZeRO keeps reduced gradients in its partitions
        grad_norm = run.engine.get_global_grad_norm()
    nonfinite = totals["nonfinite_micro"] > 0
    if nonfinite:  # its backward was a zero-gradient stand-in: the norm of that is no measurement
        grad_norm = None
    tokens = int(totals["tokens"])
    record = {
        "step": done.number,
        "loss": None if nonfinite else (totals["mlm_loss"] + totals["pair_loss"]) / n,
        "mlm_loss": None if nonfinite else totals["mlm_loss"] / n,
        "pair_loss": None if nonfinite else totals["pair_loss"] / n,
        "mlm_accuracy": totals["mlm_correct"] / totals["mlm_count"] if totals["mlm_count"] else None,
        "pair_accuracy": totals["pair_correct"] / totals["pair_count"] if totals["pair_count"] else None,
        "lr": done.lr,
        "grad_norm": _finite_or_none(grad_norm),
        "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,  # real tokens, padding not counted
        "padding_fraction": 1.0 - tokens / totals["positions"] if totals["positions"] else 0.0,
        "step_seconds": elapsed,
        "mask_rate": totals["mask_rate"] / run.world_size,
        "skipped_steps": run.state.skipped_steps,
        "fp16_overflow_steps": run.state.fp16_overflow_steps,  # updates DeepSpeed skipped, schedule held
        "tokens_seen": run.state.tokens,
    }
    if verdict.skip:
        record["skipped"] = verdict.reason
    record.update(run.model.output_type.step_metrics(totals, n, nonfinite, run.state.variant))
    if run.graphs is not None:
        record["compiled_graphs"] = run.graphs.made.total
    if run.model.cuda_graphs:
        record["cudagraph_skips"] = run.graphs.cudagraph_skips.total
    record.update(cuda_allocator_counts(run.device))
    if run.peak and elapsed > 0:  # model FLOPs of the real tokens and the masked positions only
        flops = step_flops_from_counts(run.hf_model.config, totals["tokens"], totals["attention_pairs"],
                                       totals["mlm_count"], totals["pair_count"])
        record["mfu"] = mfu(flops, elapsed, run.peak, run.world_size)
    return record


def _finite_or_none(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(float(value)) else None


#: Steps in which compiling is expected (the first micro-batch shapes, the dynamic-shape recompile).
COMPILE_WARMUP_STEPS = 3


class CompileCounter:
    """One of torch.compile's process-wide counts, looked at once per step: what it grew by since the
    last look."""

    def __init__(self, read: Callable[[], int]) -> None:
        self.read = read
        self.seen = read()

    @property
    def total(self) -> int:
        return self.read()

    def new_since_last_look(self) -> int:
        total = self.read()
        new, self.seen = total - self.seen, total
        return new


class CompiledGraphs:
    """torch.compile's graphs: those made (growth after warm-up is a recompilation; steady state should
    have none) and, under CUDA graphs, those inductor ran without them
    (:func:`pretrain.compiling.cudagraph_skips`). The run log reports both."""

    def __init__(self) -> None:
        from biomed_lm.pretrain.compiling import compiled_graphs, cudagraph_skips

        self.made = CompileCounter(compiled_graphs)
        self.cudagraph_skips = CompileCounter(cudagraph_skips)


class StepTotals:
    """Per-step sums over this rank's micro-batches, by name, reduced over ranks in one call: those
    the host knows before a micro-batch moves (its shape, from the loader), and those only the
    device knows (losses, correct predictions), summed there so nothing is read back per micro-batch.
    ``extra`` names a variant's own device sums (``PretrainingOutput.EXTRA_TOTALS``), the same on every rank."""

    HOST = ("tokens", "positions", "sequences", "attention_pairs", "stop", "mask_rate")
    DEVICE = ("mlm_loss", "pair_loss", "mlm_correct", "mlm_count", "pair_correct", "pair_count", "nonfinite_micro")

    def __init__(self, device: torch.device, extra: tuple[str, ...] = ()) -> None:
        self.names = self.HOST + self.DEVICE + tuple(extra)
        self._index = {name: i for i, name in enumerate(self.names)}
        self.host = [0.0] * len(self.HOST)  # plain floats: adding to them touches no tensor
        self.device = torch.zeros(len(self.names) - len(self.HOST), dtype=torch.float64, device=device)
        self.values: list[float] | None = None  # every sum, reduced over ranks, read back to the host

    def add(self, **amounts: float) -> None:
        for name, amount in amounts.items():
            self.host[self._index[name]] += amount

    def add_on_device(self, **amounts: torch.Tensor) -> None:
        order = self.names[len(self.HOST):]
        self.device += torch.stack([amounts[name].to(torch.float64) for name in order])

    def __getitem__(self, name: str) -> float:
        return self.values[self._index[name]]

    def index(self, name: str) -> int:
        return self._index[name]

    def reduce(self, dist) -> torch.Tensor:
        """Every sum, reduced over ranks, as one float64 device tensor in :attr:`names`' order (NCCL
        reduces device tensors only); nothing is read back. The host's sums travel through pinned
        memory on CUDA: a copy from pageable memory would wait for the device's queue."""
        host = torch.tensor(self.host, dtype=torch.float64)
        if self.device.device.type == "cuda":
            host = host.pin_memory()
        values = torch.cat([host.to(self.device.device, non_blocking=True), self.device])
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values

    def read(self, values: list[float]) -> None:
        """The reduced sums, read back (:func:`_read_steps`)."""
        self.values = values


def _gradient_norm(engine) -> torch.Tensor | None:
    """The global L2 norm of the (already reduced, not yet clipped) gradients, unscaled, as a device
    scalar: under fp16 ``param.grad`` holds the gradients times the loss scale, which the norm is
    divided by, so the logged and judged norm is the true one. None when the gradients do not live
    in ``param.grad`` (ZeRO stages 1-2)."""
    grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
    if not grads or engine.zero_optimization_stage() > 0:
        return None
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)), dtype=torch.float32)
    return norm / loss_scale(engine)


def _clip_gradients(engine, train_args: TrainArguments, norm: torch.Tensor | None) -> None:
    """Scale the gradients to at most ``max_grad_norm`` given their global ``norm``, on the device,
    where the trainer clips rather than DeepSpeed (:func:`pretrain.config.trainer_clips_gradients`)."""
    if norm is not None and trainer_clips_gradients(train_args):
        torch.nn.utils.clip_grads_with_norm_(engine.module.parameters(), train_args.max_grad_norm, norm, foreach=True)


def loss_scale(engine) -> float:
    """The fp16 loss scale the gradients are multiplied by (1 outside fp16)."""
    if not engine.fp16_enabled():
        return 1.0
    optimizer = engine.optimizer
    config = getattr(optimizer, "loss_scale_config", None)
    scale = config.cur_scale if config is not None else getattr(optimizer, "cur_scale", None)
    return float(scale) if scale else 1.0


def fp16_overflow_verdict(verdict: Verdict, loss: float, fp16: bool) -> Verdict:
    """Under fp16 a non-finite gradient norm with a finite loss is a loss-scale overflow, not a
    diverging run: DeepSpeed skips that update itself, lowers the loss scale and does not advance
    the learning-rate schedule. The step is logged as ``fp16_overflow`` and not counted towards
    ``max_consecutive_skips`` (the first steps overflow as the scale comes down from 2^16)."""
    if fp16 and verdict.reason == "nonfinite_grad_norm" and math.isfinite(loss):
        return Verdict(True, "fp16_overflow", verdict.detail)
    return verdict


def _export_hf(hf_model, tokenizer, path: Path) -> None:
    """A transformers-format copy: loads with the family's class (BertForPreTraining,
    AlbertForPreTraining, RobertaForMaskedLM) and AutoModel; a BERT with DRP's 3-way head exports
    as BertForMaskedLM with the head beside it (:meth:`pretrain.families.ModelFamily.export`)."""
    family_of(hf_model.config).export(hf_model, tokenizer, path)
