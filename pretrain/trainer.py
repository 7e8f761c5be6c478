"""The pretraining loop: BERT MLM + NSP under DeepSpeed, resumable to the exact step.

One code path serves a laptop CPU, ``deepspeed --num_gpus 2`` on one machine (gloo on CPU, NCCL on
GPUs) and multi-node runs with a hostfile: DeepSpeed owns data parallelism, gradient
accumulation, clipping, mixed precision and ZeRO (its config is generated from the typed
arguments, see :mod:`pretrain.config`); this module owns the data stream, masking, metrics,
checkpoints and faults.

Reproducibility. Everything random is a function of the seed and the step: which instances a
rank reads (:mod:`pretrain.sampler`), the masks of each micro-batch (a generator seeded with
(seed, step, micro-batch, rank)), and dropout (the RNG state is checkpointed per rank). So a run
that is killed and resumed produces the same losses as one that never stopped.

Faults. A non-finite loss on any rank skips that optimizer step on every rank (weights and
optimizer state untouched, the step's data consumed) and is counted; after
``max_consecutive_nonfinite`` skips in a row the run aborts, keeping its last checkpoint.
SIGTERM (a scheduler's pre-emption notice) finishes the current step, writes a checkpoint and
exits cleanly.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import signal
import time
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import torch

from pretrain.checkpoint import latest_tag, load_checkpoint, save_checkpoint
from pretrain.config import (DataArguments, ModelArguments, PretrainConfigError, TrainArguments, create_ds_config,
                             load_model_preset, mask_rate_schedule, resolve_batch)
from pretrain.metrics import MetricsLogger, peak_flops
from pretrain.modeling import PretrainingModel, count_parameters, flops_per_token
from pretrain.sampler import BatchPlan

if TYPE_CHECKING:
    from pretrain.adversarial import AdversarialConfig

LOG = logging.getLogger(__name__)

EXIT_NONFINITE = 3


class NonFiniteAbort(RuntimeError):
    """Too many optimizer steps in a row had a non-finite loss."""


def ensure_distributed_env() -> None:
    """Let ``python launch/pretrain.py`` run as a single process: without these variables
    DeepSpeed would try to discover an MPI launcher."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("MASTER_PORT", str(port)))


class StepGate:
    """Lets the trainer veto one optimizer step without touching DeepSpeed's bookkeeping.

    DeepSpeed counts micro-steps and steps the optimizer at each accumulation boundary; to skip a
    step whose loss was non-finite, the optimizer's ``step`` is wrapped so that the next call
    does nothing (DeepSpeed still zeroes the gradients and advances its counters and the LR
    schedule, so the data stream and the schedule stay aligned with the step number)."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.closed = False
        inner_step = optimizer.step

        def gated_step(_optimizer, *args, **kwargs):
            if self.closed:
                self.closed = False
                return None
            return inner_step(*args, **kwargs)

        # A bound method, as torch's LR scheduler expects to find (it wraps it in turn).
        optimizer.step = types.MethodType(gated_step, optimizer)  # type: ignore[method-assign]


def micro_batch_seed(seed: int, step: int, micro: int, rank: int) -> int:
    return int(np.random.SeedSequence([seed, step, micro, rank]).generate_state(1, dtype=np.uint64)[0] >> 1)


class MicroBatchStream(torch.utils.data.IterableDataset):
    """Collated micro-batches of one rank for steps ``start``..``end``-1, in order.

    Collation (padding and masking) runs in DataLoader workers; worker ``w`` of ``W`` builds every
    W-th micro-batch and the DataLoader interleaves them back in order."""

    def __init__(self, dataset, plan: BatchPlan, collator, start: int, end: int, mask_rate):
        self.dataset, self.plan, self.collator = dataset, plan, collator
        self.start, self.end, self.mask_rate = start, end, mask_rate

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        k = 0
        for step in range(self.start, self.end):
            for micro, indices in enumerate(self.plan.micro_batches(step)):
                if k % workers == worker:
                    features = self.dataset[indices]
                    rows = [dict(zip(features, values)) for values in zip(*features.values())]
                    generator = torch.Generator().manual_seed(micro_batch_seed(self.plan.seed, step, micro, self.plan.rank))
                    masked = self.collator(rows, generator=generator, mlm_probability=self.mask_rate(step))
                    yield {**masked, "step": torch.tensor(step),
                           "mlm_probability": torch.tensor(masked.mlm_probability, dtype=torch.float64)}
                k += 1


def _device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def train(model_args: ModelArguments, data_args: DataArguments, train_args: TrainArguments,
          adversarial: AdversarialConfig | None = None) -> dict[str, Any]:
    """Run (or resume) pretraining; returns a summary. Raises on unusable inputs before training.
    ``adversarial`` with ``adversarial=True`` adds ALUM's adversarial term (:mod:`pretrain.adversarial`)."""
    import deepspeed
    import torch.distributed as dist

    from pretrain.adversarial import AdversarialPretrainingModel
    from pretrain.data import load_pretraining_data
    from pretrain.masking import MaskingConfig, PretrainingCollator
    from pretrain.initialization import initialize_model, load_checkpoint_config
    from pretrain.optim import ScheduleConfig, build_lr_scheduler, build_optimizer, parameter_groups
    from tokenization.tokenizer_io import load_tokenizer

    if not train_args.output_dir:
        raise PretrainConfigError("output_dir is required")
    if not data_args.data_dir or not data_args.tokenizer:
        raise PretrainConfigError("data_dir and tokenizer are required")
    ensure_distributed_env()
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo", verbose=False)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = _device(local_rank)
    resolve_batch(train_args, world_size)
    mask_schedule = mask_rate_schedule(data_args)
    run_dir = Path(train_args.output_dir)

    # Everything that can be wrong with the inputs is found here, before any training.
    tokenizer = load_tokenizer(data_args.tokenizer)
    if model_args.init == "scratch":
        model_fields = load_model_preset(model_args.model or "bert-base")
        max_positions = int(model_fields.get("max_position_embeddings", 512))
    else:
        model_fields = load_model_preset(model_args.model) if model_args.model else None
        max_positions = load_checkpoint_config(model_args.init_checkpoint).max_position_embeddings
    dataset, data_meta = load_pretraining_data(data_args.data_dir, tokenizer=tokenizer,
                                               max_position_embeddings=max_positions, expect_nsp=data_args.nsp)
    plan = BatchPlan(len(dataset), train_args.micro_batch_size, train_args.gradient_accumulation_steps,
                     world_size, rank, train_args.seed)

    torch.manual_seed(train_args.seed)  # identical initial weights on every rank
    bert, init_report = initialize_model(model_args.init, tokenizer=tokenizer, model_fields=model_fields,
                                         init_checkpoint=model_args.init_checkpoint or None,
                                         attn_implementation=model_args.attn_implementation)
    if adversarial is not None and adversarial.adversarial:
        model = AdversarialPretrainingModel(bert, nsp=data_args.nsp, adversarial=adversarial)
    else:
        model = PretrainingModel(bert, nsp=data_args.nsp)
    model.to(device)
    # DeepSpeed clips gradients (gradient_clipping), so LAMB's own global-norm pre-normalization,
    # the same operation, is off.
    built = build_optimizer(
        train_args.optimizer, parameter_groups(model, train_args.weight_decay), lr=train_args.learning_rate,
        betas=(train_args.adam_beta1, train_args.adam_beta2), eps=train_args.adam_epsilon,
        weight_decay=train_args.weight_decay, device=device, max_grad_norm=None)
    optimizer, optimizer_impl = built.optimizer, built.implementation
    gate = StepGate(optimizer)  # before the scheduler, which wraps optimizer.step in turn
    scheduler = build_lr_scheduler(optimizer, ScheduleConfig(lr_schedule=train_args.schedule,
                                                             warmup_ratio=train_args.warmup_ratio,
                                                             lr_power=train_args.polynomial_power),
                                   total_steps=train_args.max_steps)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=create_ds_config(train_args, world_size))
    torch.manual_seed(train_args.seed + rank)  # dropout differs across ranks, reproducibly

    state = {"step": 0, "skipped_steps": 0, "consecutive_nonfinite": 0, "adversarial_fallbacks": 0, "tokens": 0,
             "train_seconds": 0.0}
    tag = latest_tag(run_dir) if train_args.resume else None
    if tag is not None:
        state.update(load_checkpoint(engine, run_dir, tag, rank).get("trainer_state", {}))
    start_step = state["step"]

    collator = PretrainingCollator.from_tokenizer(
        tokenizer, MaskingConfig(mlm_probability=data_args.mlm_probability, whole_word=data_args.whole_word_masking),
        pad_to_multiple_of=8)
    stream = MicroBatchStream(dataset, plan, collator, start_step, train_args.max_steps,
                              functools.partial(mask_schedule.rate, total_steps=train_args.max_steps))
    # The loader gets its own generator: drawing its base seed from the global one would shift the
    # dropout stream of a resumed run by one draw.
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=data_args.num_workers,
                                         prefetch_factor=4 if data_args.num_workers else None,
                                         generator=torch.Generator().manual_seed(train_args.seed))

    run_config = {"model": dataclasses.asdict(model_args), "data": dataclasses.asdict(data_args),
                  "train": dataclasses.asdict(train_args), "world_size": world_size,
                  "adversarial": dataclasses.asdict(adversarial) if adversarial is not None else None,
                  "optimizer_impl": optimizer_impl, "parameters": count_parameters(bert),
                  "initialization": init_report.as_dict(),
                  "data_meta": {k: v for k, v in data_meta.items() if k != "summary"}}
    logger = MetricsLogger(run_dir, enabled=rank == 0, wandb_mode=train_args.wandb_mode,
                           wandb_project=train_args.wandb_project, run_name=train_args.run_name,
                           config=run_config, total_steps=train_args.max_steps, initial_step=start_step)
    if tag is not None:
        logger.message(f"resumed from {run_dir / 'checkpoints' / tag} at step {start_step}")
    else:
        logger.message(init_report.describe())
    logger.message(f"{count_parameters(bert) / 1e6:.1f}M parameters, {len(dataset):,} instances, global batch "
                   f"{train_args.global_batch_size} ({world_size} rank(s) × {train_args.micro_batch_size} × "
                   f"{train_args.gradient_accumulation_steps}), optimizer {optimizer_impl}, device {device}")

    stop = {"requested": False}
    previous_handler = signal.signal(signal.SIGTERM, lambda *_: stop.update(requested=True))
    flops_token = flops_per_token(bert.config, int(data_meta.get("max_seq_length", max_positions)))
    peak = peak_flops(torch.cuda.get_device_name(device), train_args.precision) if device.type == "cuda" else None

    def checkpoint(step: int) -> None:
        export = (lambda path: _export_hf(bert, tokenizer, path)) if train_args.export_hf else None
        save_checkpoint(engine, run_dir, step, {"trainer_state": dict(state, step=step)}, rank=rank,
                        barrier=dist.barrier, keep_last=train_args.keep_last, export=export)
        logger.message(f"checkpoint: step {step}")

    batches = iter(loader)
    step = start_step
    try:
        while step < train_args.max_steps:
            started = time.perf_counter()
            totals = StepTotals()
            for micro in range(train_args.gradient_accumulation_steps):
                batch = next(batches)
                assert int(batch.pop("step")) == step, "data stream out of step"
                mask_rate = float(batch.pop("mlm_probability", data_args.mlm_probability))
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                out = engine(**batch)
                finite = torch.isfinite(out.loss.detach()).to(torch.float64)
                dist.all_reduce(finite, op=dist.ReduceOp.MIN)  # every rank must agree to skip
                if finite.item() < 1:
                    totals.add(nonfinite_micro=1)
                    engine.backward(sum(p.sum() for p in engine.module.parameters()) * 0.0)
                else:
                    engine.backward(out.loss)
                    totals.add(mlm_loss=out.mlm_loss.item(), nsp_loss=out.nsp_loss.item(),
                               mlm_correct=out.mlm_correct.item(), mlm_count=out.mlm_count.item(),
                               nsp_correct=out.nsp_correct.item(), nsp_count=out.nsp_count.item(),
                               tokens=batch["attention_mask"].sum().item())
                    if hasattr(out, "adv_kl"):
                        totals.add(adv_kl=out.adv_kl.item(), adv_nonfinite=out.adv_nonfinite.item())
                if micro == train_args.gradient_accumulation_steps - 1:
                    lr = engine.get_lr()[0]  # the rate this step's update uses
                    grad_norm = _gradient_norm(engine)
                    gate.closed = totals["nonfinite_micro"] > 0
                engine.step()
            totals.add(stop=float(stop["requested"]))
            finite_micro = train_args.gradient_accumulation_steps - totals["nonfinite_micro"]
            totals.all_reduce(dist)
            step += 1
            elapsed = time.perf_counter() - started
            state["step"] = step
            state["train_seconds"] += elapsed
            state["adversarial_fallbacks"] += int(totals["adv_nonfinite"])
            skipped = totals["nonfinite_micro"] > 0
            if skipped:
                state["skipped_steps"] += 1
                state["consecutive_nonfinite"] += 1
                logger.message(f"step {step}: non-finite loss, optimizer step skipped "
                               f"({state['consecutive_nonfinite']} in a row)")
                if state["consecutive_nonfinite"] >= train_args.max_consecutive_nonfinite:
                    raise NonFiniteAbort(
                        f"{state['consecutive_nonfinite']} consecutive optimizer steps had a non-finite loss "
                        f"(steps {step - state['consecutive_nonfinite'] + 1}..{step}); aborting. The last "
                        f"checkpoint ({latest_tag(run_dir) or 'none'}) is kept; lower the learning rate or "
                        "check the data before resuming")
            else:
                state["consecutive_nonfinite"] = 0
            tokens = int(totals["tokens"])
            state["tokens"] += tokens
            if rank == 0 and (step % train_args.log_every == 0 or step == train_args.max_steps or skipped):
                record = _metrics_record(step, totals, engine, lr, grad_norm, elapsed, tokens, flops_token, peak, world_size,
                                         mask_rate, state, finite_micro * world_size,
                                         adversarial_on=isinstance(model, AdversarialPretrainingModel))
                logger.log(record)
                logger.progress(step, {"loss": f"{record['loss']:.3f}", "lr": f"{record['lr']:.2e}",
                                       "tok/s": f"{record['tokens_per_s']:.0f}"})
            stop_now = totals["stop"] > 0
            if step % train_args.checkpoint_every == 0 or step == train_args.max_steps or stop_now:
                checkpoint(step)
            if stop_now:
                logger.message(f"SIGTERM: stopped after step {step}; resume with the same command")
                break
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        logger.close()

    final_dir = None
    if step == train_args.max_steps and rank == 0:
        final_dir = run_dir / "model"
        _export_hf(bert, tokenizer, final_dir)
    dist.barrier()
    return {"step": step, "completed": step == train_args.max_steps, "skipped_steps": state["skipped_steps"],
            "tokens": state["tokens"], "model_dir": str(final_dir) if final_dir else None}


def _metrics_record(step, totals: "StepTotals", engine, lr, grad_norm, elapsed, tokens, flops_token, peak, world_size,
                    mask_rate, state, finite_micro_batches, adversarial_on: bool) -> dict[str, Any]:
    n = max(finite_micro_batches, 1)
    if grad_norm is None:  # ZeRO keeps reduced gradients in its own partitions; DeepSpeed knows the norm
        grad_norm = engine.get_global_grad_norm()
    record = {
        "step": step,
        "loss": (totals["mlm_loss"] + totals["nsp_loss"]) / n,
        "mlm_loss": totals["mlm_loss"] / n,
        "nsp_loss": totals["nsp_loss"] / n,
        "mlm_accuracy": totals["mlm_correct"] / totals["mlm_count"] if totals["mlm_count"] else math.nan,
        "nsp_accuracy": totals["nsp_correct"] / totals["nsp_count"] if totals["nsp_count"] else math.nan,
        "lr": lr,
        "grad_norm": float(grad_norm) if grad_norm is not None else math.nan,
        "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
        "step_seconds": elapsed,
        "mask_rate": mask_rate,
        "skipped_steps": state["skipped_steps"],
        "tokens_seen": state["tokens"],
    }
    if adversarial_on:
        record["adv_symmetric_kl"] = totals["adv_kl"] / n
        record["adv_fallbacks"] = state["adversarial_fallbacks"]
    if peak:
        record["mfu"] = flops_token * tokens / elapsed / (peak * world_size)
    return record


class StepTotals:
    """Per-step sums over this rank's micro-batches, by name, reduced over ranks in one call."""

    FIELDS = ("mlm_loss", "nsp_loss", "mlm_correct", "mlm_count", "nsp_correct", "nsp_count", "tokens",
              "nonfinite_micro", "stop", "adv_kl", "adv_nonfinite")
    _INDEX = {name: i for i, name in enumerate(FIELDS)}

    def __init__(self) -> None:
        self.values = torch.zeros(len(self.FIELDS), dtype=torch.float64)

    def add(self, **amounts: float) -> None:
        for name, amount in amounts.items():
            self.values[self._INDEX[name]] += amount

    def __getitem__(self, name: str) -> float:
        return float(self.values[self._INDEX[name]])

    def all_reduce(self, dist) -> None:
        dist.all_reduce(self.values, op=dist.ReduceOp.SUM)


def _gradient_norm(engine) -> float | None:
    """The global L2 norm of the (already reduced, not yet clipped) gradients, or None when the
    gradients do not live in ``param.grad`` (ZeRO stages 1-2)."""
    grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
    if not grads or engine.zero_optimization_stage() > 0:
        return None
    return float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))))


def _export_hf(bert, tokenizer, path: Path) -> None:
    """A transformers-format copy: loads with BertForPreTraining, BertForMaskedLM, AutoModel."""
    path.mkdir(parents=True, exist_ok=True)
    bert.save_pretrained(str(path), safe_serialization=True)
    tokenizer.save_pretrained(str(path))
