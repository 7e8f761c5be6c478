#!/usr/bin/env python
"""Pretraining step throughput on a GPU: ours (unpadded, each attention kernel, compiled, fused
AdamW) against transformers' family class (``BertForPreTraining``, ``AlbertForPreTraining``,
``RobertaForMaskedLM``) as a user runs it, all under bf16 autocast, measured in the same run.

    python benchmarks/bench_gpu.py                      # BERT-base, seq 128 and 512, on cuda
    python benchmarks/bench_gpu.py --profile            # and the top kernels of ours and the baseline
    python benchmarks/bench_gpu.py --device cpu --quick --compile-backend aot_eager  # what the tests run
    # gpu_check (H100/H200): ours in bf16 and fp8 beside the baselines, then the fp8-vs-bf16 loss check
    python benchmarks/bench_gpu.py --seq-lengths 128 --batch 256 --precision fp8 --convergence-steps 300

Systems, per sequence length, each timed on the same batches (one model copy at a time on the device):

* ``transformers <class> (eager, ...)``: the family's class as loaded (SDPA, padded, the MLM head on
  every position, fused AdamW);
* ``transformers <class> (torch.compile, ...)``: the same model under one ``torch.compile(model)``
  call, what HF Trainer's ``torch_compile=True`` gives; **the baseline**: ``ratio`` (×HFc) is
  against this row, ``ratio_vs_eager`` (×HFe) against the eager one;
* ``transformers <class> (torch.compile, full-length rows ...)``: the compiled model on separate
  batches of the same micro-batch size in which every row has the maximum length (no padding, all
  tokens counted as real): the stock dense ceiling, what transformers reaches when no position is
  wasted. Not a run on the benchmark's data, so it is never the "best" system for the paper budget;
* ``ours [...]``: :func:`systems` — each of our attention kernels that runs on the device (a family
  without the unpadded path: its padded forward with the MLM head on the masked positions only).

``--compile-backend`` (default ``inductor``) is used for our compiled dense blocks and for the
baseline's ``torch.compile``; on CPU inductor takes minutes, so tests use ``aot_eager``.
``--compile`` switches our compiled path only (default: on for cuda); the compiled baselines always
compile. Each system starts from ``torch._dynamo.reset()``, so it compiles during its own warm-up.

Timing, as a training run has it: ``--warmup`` steps (compilation, recompilation for a new padded
shape, allocator, kernel selection; under ``--compile-mode reduce-overhead`` also the window's
batches twice, so every shape is recorded), then ``--windows`` windows (default 3) of the same
``--steps`` optimizer steps, each with one ``torch.cuda.synchronize`` at each end and none in
between; the row's pace is the median window's, ``window_spread`` = (slowest - fastest) / median
(12-step single windows on an H200 varied ±10-20% run to run). Every batch is moved to the device
before the warm-up (all of them staged there: a few MB; no pinned memory, no copy in the window);
every row's step is forward, backward, clipping to ``--max-grad-norm`` (default 1.0, as the trainer
and HF Trainer clip: one foreach norm and multiply) and fused AdamW,
and tokens, padding and model FLOPs are counted from the CPU copies of the window's batches
beforehand, so the benchmark itself reads nothing back (no ``.item()``/``.tolist()``) inside a
window. ``step_seconds`` is the median window's seconds ÷ steps (a mean: a per-step median would need
a synchronize per step); ``graphs_compiled_in_window`` says whether torch.compile still compiled
inside the windows (warm-up too short for the shapes seen).

Batches: BERT's length mix — each sequence is full length with probability 0.5 (instances fill up
to the target), otherwise uniform between 8 and the maximum (short_seq_prob, document ends) — or
the real lengths of instances made by ``launch/create_pretraining_data.py`` (``--instances DIR``).
Reported per system: real (non-pad) tokens/s, step time, MFU (model FLOPs of the real tokens:
``pretrain.flops.step_flops`` ÷ the device's dense peak), peak memory (the device's peak allocated
memory during the system's run; on CPU the process's peak RSS), padding share of the positions
computed, and the ratios. From the best tokens/s on the benchmark's batches (the full-length row
left out) the GPU-hours of the paper's budget (62,500 steps × 8,192 × 128 tokens ≈ 65.5B) here.

``--precision fp8``: each of our rows runs twice, in bf16 and with the encoder's Linear layers in
torchao's float8 (:func:`pretrain.fp8.convert_encoder_to_fp8`, tensorwise scaling, bf16 autocast
elsewhere, converted before compiling as the trainer does), adjacent and on the same batches; an fp8
row's ``ratio_vs_our_bf16`` is its tokens/s over our bf16 row of the same kernel (printed as
``fp8/bf16``). The transformers rows stay in bf16 (the user's alternative). Each row names its
``precision`` and the peak its MFU is measured against (``mfu_peak``: ``fp8`` for the fp8 rows, the
device's dense FP8 peak, so their MFU is not comparable with the bf16 rows'). ``pretrain.fp8.check_fp8``
runs first: where FP8 cannot run (no GPU of compute capability 8.9+, or no torchao) the benchmark exits
2 with the reason before building anything.

``--convergence-steps N`` (0: off): after the throughput rows (``--convergence-only``: instead of
them), ours (the fastest of our bf16 rows at the first ``--seq-lengths``; with ``--convergence-only``
the kernel the trainer's ``auto`` picks, compiled as our rows are) trains N optimizer steps from the
same initial weights on the same N micro-batches of ``--convergence-batch`` (default 64): in bf16 (the
reference), then in fp8 with ``--precision fp8`` (otherwise ``fp8_not_run`` says why, as on the CPU in
the tests), then with a half residual stream where ``--residual-stream`` names half. AdamW at
``--convergence-lr`` (default 5e-4) with 10% warm-up and linear decay (``biomed_lm.optim``'s slanted
triangular schedule), weight decay 0.01 off biases and norms, gradient clipping at 1.0, bf16 autocast,
one seed for the dropout. The batches are
made as the throughput batches are (length mix, the collator's masking, a fixed seed) but from
:class:`StructuredText` (Zipf-distributed ids with a learnable neighbour relation: uniform ids leave
nothing to learn, so any two runs would agree), or the real instances (their ids, not only their
lengths) with ``--instances``. Every step's loss stays on the device until the run ends (one read-back).
The JSON's ``convergence``: ``steps``, ``bf16_final`` and ``fp8_final`` (each the mean of the last 20
steps' losses), ``relative_difference`` ((fp8 - bf16) / bf16), ``passed`` (|difference| <= 1%), every
step's loss (``losses_bf16``, ``losses_fp8``) and each run's seconds (compilation included); the half
stream's run under ``half_stream`` (``final``, ``relative_difference``, ``passed``, ``losses``,
``seconds``); one line is printed.

``--profile``: after its window, ``torch.profiler`` (CPU, and CUDA on a GPU) over
``--profile-steps`` more steps (the window's first batches again) of the compiled baseline and of
each of ours; per profiled system ``<out dir>/profile_<result name>-<system slug>-seq<length>.txt``
and the row's ``profile`` in the JSON list the top kernels by self device time (CUDA kernel time on
a GPU, self CPU time of each op on a CPU) with their share of the profiled steps' wall time and
their calls; the top 10 of the baseline and of our fastest are printed. ``--trace`` also writes a
chrome trace per profiled system (``trace_<system slug>-seq<length>.json``).
"""

from __future__ import annotations

import argparse
import copy
import gc
import re
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from _results import write_results  # benchmarks/ is on sys.path when a benchmark runs

REPO = Path(__file__).resolve().parents[1]
PAPER_TOKENS = 62_500 * 8_192 * 128
VOCAB, CLS, SEP, MASK = 30522, 101, 102, 103  # the batches' ids: bert-base-uncased's vocabulary and specials
#: A family's model is built with its recipe's vocabulary where that is larger than the batches' ids need (the MLM
#: head's size is part of what the family costs: configs/vocab/roberta_bpe.yaml's 50,265 columns for RoBERTa); the
#: others keep bert-base-uncased's 30,522 (ALBERT's recipe has 30,000: ids of real instances reach 30,521).
RECIPE_VOCAB = {"roberta": 50265}
HF_EAGER, HF_COMPILED, HF_FULL_LENGTH, OURS = "hf_eager", "hf_compiled", "hf_full_length", "ours"
FAILED = "failed"  # a system that raised (its row holds the error; the others still run)


@dataclass
class System:
    """One row of the table: a model on the device and how a step runs it."""
    name: str
    role: str  # HF_EAGER, HF_COMPILED (the baseline), HF_FULL_LENGTH or OURS
    model: torch.nn.Module
    loss_fn: Callable
    computed_positions: Callable  # CPU batch -> positions the encoder computes
    # CPU batch -> what loss_fn takes, built on the host before the batch moves (ours: the layout the
    # trainer's loader workers build, so the step has no host sync); transformers' rows take it as is.
    prepare: Callable[[dict], dict] = staticmethod(lambda batch: batch)
    kernel: str | None = None  # ours: the attention kernel
    fp8: bool = False  # ours with the encoder's Linear layers in torchao's float8 (bf16 autocast elsewhere)
    compile_mode: str | None = None  # ours compiled: torch.compile's mode (reduce-overhead: CUDA graphs)
    residual_stream: str = "fp32"  # ours: the trainer's --residual-stream (half: bf16 between sub-layers)


@dataclass(frozen=True)
class Regions:
    """What one compiled region of ours holds and how it runs: the trainer's ``--compile-scope``,
    ``--layers-per-graph`` and ``--compile-mode`` (``reduce-overhead``: replayed as CUDA graphs)."""
    scope: str = "layers"
    layers_per_graph: int = 1
    mode: str | None = None

    @property
    def cuda_graphs(self) -> bool:
        from biomed_lm.pretrain.modeling import CUDA_GRAPH_MODES

        return self.mode in CUDA_GRAPH_MODES

    def describe(self) -> str:
        text = ", whole forward compiled" if self.scope == "whole" else ", compiled by layer" \
            if self.layers_per_graph == 1 else f", compiled in blocks of {self.layers_per_graph} layers"
        autotuned = ", autotuned" if self.mode and self.mode.startswith("max-autotune") else ""
        return text + autotuned + (", CUDA graphs" if self.cuda_graphs else "")


@dataclass
class WindowCounts:
    """What the timed window's batches hold, counted on the host before the window."""
    tokens: int
    positions: int
    flops: float
    sequences: int


def length_mix(count: int, max_length: int, generator: torch.Generator) -> list[int]:
    full = torch.rand(count, generator=generator) < 0.5
    short = torch.randint(8, max_length + 1, (count,), generator=generator)
    return torch.where(full, torch.full_like(short, max_length), short).tolist()


def real_lengths(instances: str, max_length: int) -> list[int]:
    from datasets import load_from_disk

    dataset = load_from_disk(instances)
    return [min(len(ids), max_length) for ids in dataset["input_ids"]]


def make_batches(lengths: list[int], batch: int, steps: int, seed: int, text: str = "uniform",
                 rows: list[dict] | None = None) -> list[dict]:
    """Masked batches (the toolkit's collator: whole-word masking, 15%) of the given lengths.

    ``text``: ``uniform`` (token ids drawn uniformly: all a throughput measurement needs) or
    ``structured`` (:class:`StructuredText`: something to learn, for the convergence runs).
    ``rows``: real instances (``input_ids``, ``token_type_ids``, ``word_starts``,
    ``next_sentence_label``) to mask instead of generated ones (``lengths`` is then ignored)."""
    from biomed_lm.pretrain.masking import MaskingConfig, PretrainingCollator

    generator = torch.Generator().manual_seed(seed)
    collator = PretrainingCollator(pad_token_id=0, cls_token_id=CLS, sep_token_id=SEP, mask_token_id=MASK,
                                   vocab_size=VOCAB, config=MaskingConfig(whole_word=True), pad_to_multiple_of=8)
    structured = StructuredText(generator) if text == "structured" else None
    batches = []
    for step in range(steps):
        if rows is not None:
            batches.append(dict(collator(rows[step * batch:(step + 1) * batch], generator=generator)))
            continue
        chunk = []
        for n in lengths[step * batch:(step + 1) * batch]:
            body = structured.sample(n - 2) if structured is not None \
                else torch.randint(1000, VOCAB, (n - 2,), generator=generator).tolist()
            chunk.append({"input_ids": [CLS, *body, SEP], "token_type_ids": [0] * (n // 2) + [1] * (n - n // 2),
                          "word_starts": [1] * n, "next_sentence_label": int(torch.randint(2, (1,)))})
        batches.append(dict(collator(chunk, generator=generator)))
    return batches


class StructuredText:
    """Synthetic text a model can learn from in a few hundred steps (uniform ids cannot be: the
    masked loss would stay near ln 30k whatever the precision): ids 1000..30521 drawn from a Zipf
    distribution (frequency ∝ 1 / (rank + 2.7), a random rank order), and every odd position, with
    probability 1/2, the fixed successor (a random permutation) of the id before it. So the loss
    falls from ~10.3 as the unigram frequencies are learnt, then further as attention learns to look
    at the neighbour."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator
        size = VOCAB - 1000
        self.probs = 1.0 / (torch.arange(size, dtype=torch.float64) + 2.7)
        self.ids = 1000 + torch.randperm(size, generator=generator)
        self.successor = 1000 + torch.randperm(size, generator=generator)

    def sample(self, n: int) -> list[int]:
        if n <= 0:
            return []
        ids = self.ids[torch.multinomial(self.probs, n, replacement=True, generator=self.generator)]
        pairs = n // 2
        follow = torch.rand(pairs, generator=self.generator) < 0.5
        ids[1:2 * pairs:2] = torch.where(follow, self.successor[ids[0:2 * pairs:2] - 1000], ids[1:2 * pairs:2])
        return ids.tolist()


def real_rows(instances: str, max_length: int, count: int) -> list[dict]:
    """``count`` instances of ``--instances`` in order as they are (their token ids, segments, word starts and
    pair labels), each cut to ``max_length`` with its last id made [SEP]; from the start again where the
    folder holds fewer (further passes over the data, as a run's epochs are)."""
    from datasets import load_from_disk

    dataset = load_from_disk(instances)
    rows = []
    for row in dataset.select(range(min(count, len(dataset)))):
        keep = min(len(row["input_ids"]), max_length)
        cut = {key: list(row[key][:keep]) for key in ("input_ids", "token_type_ids", "word_starts")}
        cut["input_ids"][-1] = SEP
        rows.append({**cut, "next_sentence_label": int(row.get("next_sentence_label", 0))})
    if not rows:
        raise SystemExit(f"bench_gpu: {instances} holds no instances")
    if len(rows) < count:
        print(f"bench_gpu: {instances} holds {len(rows)} instances; the convergence runs take {count}: "
              f"{count / len(rows):.1f} passes over them")
    return [rows[index % len(rows)] for index in range(count)]


def window_counts(cpu_batches: list[dict], config, computed_positions: Callable) -> WindowCounts:
    """Real tokens, computed positions and model FLOPs of the window's batches, from their CPU copies
    (so the window itself never reads a device tensor back). The pair head counts where the family has
    one (RoBERTa has none), as the trainer counts it."""
    from biomed_lm.pretrain.families import family_of
    from biomed_lm.pretrain.flops import step_flops

    pair_head = family_of(config).pair_head is not None
    tokens, positions, flops, sequences = 0, 0, 0.0, 0
    for batch in cpu_batches:
        lengths = batch["attention_mask"].sum(1).tolist()
        tokens, sequences = tokens + sum(lengths), sequences + len(lengths)
        positions += computed_positions(batch)
        flops += step_flops(config, lengths, int((batch["labels"] != -100).sum()), len(lengths) if pair_head else 0)
    return WindowCounts(tokens, positions, flops, sequences)


def make_step(model, loss_fn: Callable, optimizer, device: torch.device, dtype,
              max_grad_norm: float = 0.0) -> Callable[[dict], None]:
    """One optimizer step on a device batch, the gradients clipped to ``max_grad_norm`` first (0: not
    clipped), with one foreach norm and multiply as the trainer and HF Trainer clip; returns nothing, so
    nothing waits for the device."""
    begin_micro_batch = getattr(model, "begin_micro_batch", lambda: None)  # ours: a generation of the graph trees

    def step(batch: dict) -> None:
        begin_micro_batch()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = loss_fn(model, batch)
        loss.backward()
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def time_window(step: Callable[[dict], None], batches: list[dict], sync: Callable[[], None],
                clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds for ``step`` over all ``batches``: one ``sync`` before (it also drains the warm-up's
    queued work) and one after, none per step, as a training loop runs."""
    sync()
    start = clock()
    for batch in batches:
        step(batch)
    sync()
    return clock() - start


def device_sync(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None  # CPU ops run synchronously


def run_system(system: System, cpu_batches: list[dict], warmup: int, device: torch.device, dtype, config,
               sync: Callable[[], None], windows: int = 3, max_grad_norm: float = 0.0
               ) -> tuple[dict, Callable, list[dict]]:
    """Warm-up steps, then ``windows`` timed windows, each over the rest of ``cpu_batches``; the row's
    pace is the median window's (each window's is kept, with their spread). Returns the row, the step
    function and the device batches (for a profile right after, while the model is warm)."""
    from biomed_lm.pretrain.compiling import compiled_graphs, cudagraph_skips
    from biomed_lm.pretrain.flops import peak_flops
    from biomed_lm.pretrain.metrics import cuda_allocator_counts
    from biomed_lm.optim import build_optimizer

    counts = window_counts(cpu_batches[warmup:], config, system.computed_positions)
    device_batches = [{key: value.to(device) for key, value in system.prepare(batch).items()}
                      for batch in cpu_batches]
    optimizer = build_optimizer("adamw", system.model.parameters(), lr=1e-4, device=device)
    step = make_step(system.model, system.loss_fn, optimizer.optimizer, device, dtype, max_grad_norm)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    cuda_graphs, skips_before = getattr(system.model, "cuda_graphs", False), cudagraph_skips()
    warmup_start = time.perf_counter()
    for batch in warmup_batches(device_batches, warmup, cuda_graphs):
        step(batch)
    graphs_before, allocator_before = compiled_graphs(), cuda_allocator_counts(device)
    window_seconds = [time_window(step, device_batches[warmup:], sync) for _ in range(windows)]
    # the first window's opening sync ends the warm-up
    warmup_seconds = time.perf_counter() - warmup_start - sum(window_seconds)
    seconds = statistics.median(window_seconds)
    steps = len(cpu_batches) - warmup
    precision = "fp8" if system.fp8 else "bf16" if dtype == torch.bfloat16 else "fp32"
    peak = peak_flops(precision, device)  # an fp8 row: against the FP8 peak (mfu_peak says which)
    row = {"system": system.name, "role": system.role, "kernel": system.kernel, "precision": precision,
           "compile_mode": system.compile_mode, "residual_stream": system.residual_stream,
           "optimizer": optimizer.implementation,
           "tokens_per_s": counts.tokens / seconds, "step_seconds": seconds / steps, "window_seconds": seconds,
           "steps": steps, "warmup_steps": warmup, "mfu": counts.flops / seconds / peak if peak else None,
           "windows": windows, "window_tokens_per_s": [counts.tokens / each for each in window_seconds],
           "window_spread": (max(window_seconds) - min(window_seconds)) / seconds,
           "mfu_peak": precision,
           "padding_fraction": 1 - counts.tokens / counts.positions, "mean_length": counts.tokens / counts.sequences,
           "peak_memory_gib": _peak_memory(device),
           "graphs_compiled_in_window": compiled_graphs() - graphs_before, "warmup_seconds": warmup_seconds}
    for key, after in cuda_allocator_counts(device).items():  # the trainer's metrics log the same counts
        if key != "peak_memory_gib":  # the row has the peak since the warm-up began
            row[f"{key}_in_windows"] = after - allocator_before[key]
    if cuda_graphs:  # compiled graphs inductor ran without CUDA graphs (TORCH_LOGS=cudagraphs: why)
        row["cudagraph_skips"] = cudagraph_skips() - skips_before
    mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "n/a"
    # each row as it lands: a stage cut off by its timeout keeps them
    print(f"  measured {system.name}: {row['tokens_per_s']:,.0f} tok/s (median of {windows} windows, spread "
          f"{row['window_spread']:.1%}), MFU {mfu}, warm-up (compile) {warmup_seconds:.0f} s", flush=True)
    return row, step, device_batches[warmup:]


def warmup_batches(batches: list, warmup: int, cuda_graphs: bool) -> list:
    """The first ``warmup`` batches; under CUDA graphs then the window's batches twice over: a shape runs
    uncaptured the first time it is seen and is recorded the second, so the window only replays (as a long
    run does, once its bucketed shapes have all been seen)."""
    window = batches[warmup:]
    return batches[:warmup] + (window + window if cuda_graphs else [])


def _peak_memory(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # process peak RSS (KiB -> GiB)


def profile_steps(step: Callable[[dict], None], batches: list[dict], device: torch.device,
                  sync: Callable[[], None], trace_path: Path | None) -> tuple[list[dict], dict]:
    """torch.profiler over ``batches`` (the model already warm): the top kernels by self device time,
    each with its share of the profiled steps' wall time (profiler overhead included, so shares are
    lower bounds) and its calls; and :func:`kernel_totals` over every kernel."""
    from torch.profiler import ProfilerActivity, profile

    from biomed_lm.pretrain.profiling import kernel_totals, top_kernels

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        seconds = time_window(step, batches, sync)
    if trace_path is not None:
        profiler.export_chrome_trace(str(trace_path))
    averages, on_device = profiler.key_averages(), device.type == "cuda"
    return top_kernels(averages, seconds, on_device), kernel_totals(averages, seconds, len(batches), on_device)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def write_profile(path: Path, row: dict, kernels: list[dict], totals: dict, steps: int) -> None:
    from biomed_lm.pretrain.profiling import profile_text

    title = f"{row['system']}, seq {row['seq']}, micro-batch {row['batch']}"
    path.write_text(profile_text(title, kernels, totals, steps), encoding="utf-8")


def print_profile(row: dict, kernels: list[dict], top: int = 10) -> None:
    from biomed_lm.pretrain.profiling import totals_line

    print(f"\nprofile of {row['system']} (seq {row['seq']}): top {top} kernels, share of the profiled step time; "
          f"{totals_line(row['profile_totals'])}")
    for kernel in kernels[:top]:
        print(f"  {kernel['share']:>7.2%} {kernel['calls']:>6}  {kernel['name'][:100]}")


def hf_inputs(family, config, batch: dict) -> dict:
    """The batch as the family's transformers class takes it (token types, its pair label's name)."""
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "labels")}
    if family.takes_token_type_ids(config):
        inputs["token_type_ids"] = batch["token_type_ids"]
    if family.pair_label_argument:
        inputs[family.pair_label_argument] = batch["next_sentence_label"]
    return inputs


def systems(bert, device: torch.device, dtype, compile_: bool, bucket: int, kernels: list[str] | None = None,
            backend: str = "inductor", fp8: bool = False, baselines: str = "all",
            regions: tuple[Regions, ...] = (Regions(),), residual_streams: tuple[str, ...] = ("fp32",)):
    """The :class:`System` rows, built one at a time from ``bert`` (kept on the CPU; each row gets its own
    copy on ``device``, so only one is there while it runs): transformers' family class eager, compiled
    (the baseline) and compiled on full-length rows, then each of our kernels (``fp8``: each in bf16,
    then with its encoder Linear layers in FP8; the transformers rows stay in bf16), in each of
    ``residual_streams``."""
    from biomed_lm.pretrain.families import family_of

    family = family_of(bert.config)
    ours = (bert, family, device, dtype, compile_, bucket, kernels, backend, fp8, regions, residual_streams)

    def hf_loss(model, batch):
        return model(**hf_inputs(family, bert.config, batch)).loss

    def padded(batch) -> int:
        return batch["input_ids"].numel()

    recipe, hf = "SDPA, padded, full MLM head", f"transformers {family.model_class}"
    if baselines == "none":  # ours only (e.g. fp8 against our bf16, where the stage before measured transformers)
        yield from _our_systems(*ours)
        return
    if baselines == "all":
        yield System(f"{hf} (eager, {recipe})", HF_EAGER, _copy_to(bert, device), hf_loss, padded)
    yield System(f"{hf} (torch.compile, {recipe})", HF_COMPILED,
                 torch.compile(_copy_to(bert, device), backend=backend), hf_loss, padded)
    if baselines == "all":
        yield System(f"{hf} (torch.compile, full-length rows: the stock dense ceiling)", HF_FULL_LENGTH,
                     torch.compile(_copy_to(bert, device), backend=backend), hf_loss, padded)
    yield from _our_systems(*ours)


def _copy_to(bert, device: torch.device):
    return copy.deepcopy(bert).to(device)


def _our_loss(model, batch):
    return model(**batch).loss


def our_kernels(family, device: torch.device, dtype, dropout: float, kernels: list[str] | None = None,
                quiet: bool = False) -> list[str]:
    """Our kernels that run here, in :data:`KERNELS`' order (``hf_sdpa``, the padded forward, for a
    family without the unpadded path); on a CPU sdpa_loop only (the others are slow there)."""
    from biomed_lm.pretrain.attention import KERNELS, why_not

    if not family.unpadded:
        return ["hf_sdpa"]
    chosen = []
    for kernel in KERNELS:
        if kernels is not None and kernel not in kernels:
            continue
        reason = why_not(kernel, device, dtype, dropout)
        # On CPU only sdpa_loop unless --kernels names others (whole-forward compilation needs one that traces).
        if reason is not None or (device.type == "cpu" and kernel != "sdpa_loop" and kernels is None):
            if not quiet:
                print(f"ours [{kernel}]: skipped ({reason or 'slow on cpu'})")
            continue
        chosen.append(kernel)
    return chosen


def our_system(bert, family, kernel: str, device: torch.device, compile_: bool, bucket: int, backend: str,
               fp8: bool = False, regions: Regions = Regions(), residual_stream: str = "fp32") -> System:
    """Our model with ``kernel`` on ``device`` (``fp8``: the encoder's Linear layers converted first;
    ``regions``: what one compiled region holds and how it runs, ``residual_stream`` the residual stream's
    dtype (half: bf16, the bench's autocast dtype), as the trainer's options say)."""
    from biomed_lm.pretrain.attention import KERNELS

    suffix = ", fp8 encoder Linear layers" if fp8 else ""
    half = residual_stream == "half" and kernel != "hf_sdpa"  # the padded forward keeps autocast's dtypes
    if kernel == "hf_sdpa":
        model = _our_model(bert, device, fp8=fp8, train_pair=family.pair_head is not None, attention="hf_sdpa")
        return System(f"ours [hf_sdpa, padded, MLM head on masked positions{suffix}]", OURS, model, _our_loss,
                      lambda batch: batch["input_ids"].numel(), _layout_of(model), kernel, fp8)
    model = _our_model(bert, device, fp8=fp8, attention=kernel, pad_to_multiple_of=bucket if compile_ else None,
                       compile_backend=backend if compile_ else None, regions=regions,
                       residual_dtype=torch.bfloat16 if half else None)
    forward_compiled = None if not compile_ else KERNELS[kernel].traceable
    region = {None: "", True: regions.describe(), False: ", dense blocks compiled"}[forward_compiled]
    suffix += ", half residual stream" if half else ""
    # A mode applies to the compiled forward only: dense blocks compile in torch.compile's default.
    return System(f"ours [{kernel}{region}{suffix}]", OURS, model, _our_loss,
                  _unpadded_positions(bucket if compile_ else 1), _layout_of(model), kernel, fp8,
                  regions.mode if forward_compiled else None, "half" if half else "fp32")


def _our_systems(bert, family, device: torch.device, dtype, compile_: bool, bucket: int,
                 kernels: list[str] | None, backend: str, fp8: bool = False,
                 regions: tuple[Regions, ...] = (Regions(),), residual_streams: tuple[str, ...] = ("fp32",)):
    """Each of our kernels that runs here (a family without the unpadded path: its padded forward with
    the MLM head on the masked positions), with ``fp8`` each in bf16 and then in FP8, where its
    forward compiles in each of ``regions`` (e.g. without and with CUDA graphs), and where it runs
    unpadded with each of ``residual_streams``. Models are built inside the yield, never bound to a
    local, so the previous row's model is freed before the next is built."""
    from biomed_lm.pretrain.attention import KERNELS

    dropout = float(bert.config.attention_probs_dropout_prob)
    for kernel in our_kernels(family, device, dtype, dropout, kernels):
        forward_compiled = compile_ and kernel in KERNELS and KERNELS[kernel].traceable
        for in_fp8 in (False, True) if fp8 else (False,):
            for way in regions if forward_compiled else regions[:1]:  # a mode needs a compiled forward
                for stream in residual_streams if kernel != "hf_sdpa" else ("fp32",):
                    yield our_system(bert, family, kernel, device, compile_, bucket, backend, fp8=in_fp8,
                                     regions=way, residual_stream=stream)


def _our_model(bert, device: torch.device, compile_backend: str | None = None, fp8: bool = False,
               regions: Regions = Regions(), **options):
    """Our model as the trainer builds it: the encoder's Linear layers converted to torchao's float8 when
    ``fp8`` (before compiling, as pretrain.trainer does), then the whole forward compiled as one region
    where the kernel traces (pretrain.trainer._compile), the dense blocks otherwise."""
    from biomed_lm.pretrain.attention import KERNELS
    from biomed_lm.pretrain.compiling import compile_dense_blocks
    from biomed_lm.pretrain.mlm_loss import resolve_implementation
    from biomed_lm.pretrain.modeling import PretrainingModel

    bert = copy.deepcopy(bert)
    if fp8:
        from biomed_lm.pretrain.families import family_of
        from biomed_lm.pretrain.fp8 import convert_encoder_to_fp8

        convert_encoder_to_fp8(bert, family_of(bert.config))
    ours = PretrainingModel(bert, **options).to(device)
    forward_compiled = compile_backend is not None and KERNELS[ours.attention].traceable
    if "mlm_loss" not in options:  # the trainer's pick for the device and the compiled region
        ours.mlm_loss = resolve_implementation("auto", device, compiled=forward_compiled)[0]
    if forward_compiled:
        ours.compile_losses(backend=compile_backend, mode=regions.mode, scope=regions.scope,
                            layers_per_graph=regions.layers_per_graph)
    elif compile_backend is not None:
        compile_dense_blocks(ours.hf_model, backend=compile_backend)
    return ours


def _layout_of(model) -> Callable[[dict], dict]:
    """The micro-batch in ``model``'s layout, built on the host (the trainer's loader does this)."""
    layout = model.layout

    def prepare(batch: dict) -> dict:
        prepared = layout(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], batch["labels"])
        return {"prepared": prepared, "next_sentence_label": batch["next_sentence_label"]}
    return prepare


def _unpadded_positions(bucket: int):
    def positions(batch) -> int:
        real = int(batch["attention_mask"].sum())
        return -(-real // bucket) * bucket
    return positions


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (the benchmark's purpose), or cpu to try its path "
                                                          "with --quick (BERT-base on a CPU takes all its memory)")
    parser.add_argument("--model", default=None, help="a model preset (default: the family's base size)")
    parser.add_argument("--architecture", default="bert", help="the model family: bert, albert or roberta")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="the model's vocabulary (default: 50,265 for roberta, its recipe's; 30,522 for the "
                             "others); the batches' ids are bert-base-uncased's, below 30,522")
    parser.add_argument("--seq-lengths", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch", type=int, nargs="+", default=[256, 64], help="micro-batch per length")
    parser.add_argument("--steps", type=int, default=30,
                        help="steps in the timed window (after the warm-up); 12 on an H200 gave ±10-20%% run to run")
    parser.add_argument("--windows", type=int, default=3,
                        help="timed windows per system (each over the same --steps batches, synchronized at its two "
                             "ends); the row's pace is the median window's, window_spread the (max - min) / median")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed steps first: compilation, and recompilation for a second padded shape")
    parser.add_argument("--precision", choices=("bf16", "fp32", "fp8"), default=None,
                        help="default: bf16 on cuda; fp8: our rows in bf16 and in FP8 (torchao float8 in the encoder's "
                             "Linear layers), the transformers rows in bf16")
    parser.add_argument("--compile", choices=("on", "off"), default=None,
                        help="our compiled dense blocks (default: on for cuda); the compiled baselines always compile")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile backend for ours and the baselines (aot_eager: fast, for CPU tests)")
    parser.add_argument("--compile-scope", choices=("layers", "whole"), default="layers",
                        help="what one compiled region of ours holds (the trainer's --compile-scope)")
    parser.add_argument("--compile-mode", choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs"),
                        nargs="+", default=["default"],
                        help="torch.compile's mode for ours (the trainer's --compile-mode), a row each: "
                             "reduce-overhead replays the regions as CUDA graphs, after a warm-up over the "
                             "window's batches twice")
    parser.add_argument("--layers-per-graph", type=int, default=1,
                        help="with --compile-scope layers: consecutive layers per compiled region (the trainer's)")
    parser.add_argument("--residual-stream", choices=("fp32", "half"), nargs="+", default=["fp32"],
                        help="our unpadded rows' residual stream (the trainer's --residual-stream), a row each: half "
                             "keeps the hidden states between sub-layers in bf16 (needs --precision bf16 or fp8)")
    parser.add_argument("--bucket-tokens", type=int, default=128)
    parser.add_argument("--max-grad-norm", type=float, default=1.0,
                        help="every row's step clips the gradients to this global norm before the optimizer, as "
                             "launch/pretrain.py and HF Trainer do by default (0: no clipping, as runs A-C timed)")
    parser.add_argument("--attention-dropout", type=float, default=None,
                        help="override the preset's attention_probs_dropout_prob (0 lets the kernels without "
                             "dropout run, as MosaicBERT and ModernBERT train)")
    parser.add_argument("--kernels", nargs="+", default=None,
                        help="only these of our kernels (default: each that runs)")
    parser.add_argument("--baselines", choices=("all", "compiled", "none"), default="all",
                        help="transformers rows: eager, compiled and full-length (all); the compiled baseline alone "
                             "(a short device lease); none (ratios then null: e.g. fp8 against our bf16)")
    parser.add_argument("--no-baselines", dest="baselines", action="store_const", const="none",
                        help="the same as --baselines none")
    parser.add_argument("--instances", default=None, help="real instances (their lengths) instead of the mix")
    parser.add_argument("--profile", action="store_true",
                        help="profile the compiled baseline and ours after their windows (files beside --out)")
    parser.add_argument("--profile-steps", type=int, default=3, help="steps profiled (from the window's batches)")
    parser.add_argument("--trace", action="store_true", help="with --profile: a chrome trace per profiled system")
    parser.add_argument("--convergence-steps", type=int, default=0,
                        help="after the throughput rows: train ours this many steps in bf16 and in fp8 (where fp8 "
                             "runs) from the same weights on the same batches and compare the losses (0: off)")
    parser.add_argument("--convergence-only", action="store_true",
                        help="the convergence runs without the throughput rows")
    parser.add_argument("--convergence-batch", type=int, default=64, help="micro-batch of the convergence runs")
    parser.add_argument("--convergence-lr", type=float, default=5e-4,
                        help="peak AdamW learning rate of the convergence runs (10%% warm-up, then linear decay)")
    parser.add_argument("--quick", action="store_true", help="bert-tiny, 2 timed steps, batch 4: a smoke test")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "gpu.json"))
    args = parser.parse_args(argv)
    args.profile = args.profile or args.trace
    if args.quick:
        args.steps, args.windows, args.batch, args.convergence_batch = 2, 1, [4] * len(args.seq_lengths), 4
    if args.vocab_size is not None and args.vocab_size < VOCAB:
        parser.error(f"--vocab-size must be at least {VOCAB:,}: the batches' ids are bert-base-uncased's")
    if args.convergence_only and args.convergence_steps <= 0:
        parser.error("--convergence-only needs --convergence-steps N (N > 0)")
    args.precision = args.precision or ("bf16" if torch.device(args.device).type == "cuda" else "fp32")
    if args.device.startswith("cuda") and not torch.cuda.is_available():  # it fell back to BERT-base on the CPU
        parser.error("no CUDA device: this benchmark measures a GPU; --device cpu --quick runs its path on a CPU")
    if "half" in args.residual_stream and args.precision not in ("bf16", "fp8"):
        parser.error("--residual-stream half keeps the hidden states in bf16: it needs --precision bf16 or fp8 "
                     "(the default on cuda)")
    args.profile_steps = min(args.profile_steps, args.steps)
    return args


def main(argv: list[str] | None = None) -> None:
    from biomed_lm.pretrain.families import get_family

    args = parse_args(argv)
    family = get_family(args.architecture)
    args.model = args.model or family.default_preset
    if args.quick:  # the family's tiny preset where there is one (RoBERTa's layout takes BERT's presets)
        tiny = f"{family.name}-tiny"
        args.model = tiny if (REPO / "configs" / "model" / f"{tiny}.yaml").is_file() else "bert-tiny"
    device = torch.device(args.device)
    fp8 = args.precision == "fp8"
    if fp8:  # refused before anything is built, as the trainer refuses it (exit 2, the reason)
        from biomed_lm.pretrain.config import PretrainConfigError
        from biomed_lm.pretrain.fp8 import check_fp8

        try:
            check_fp8(device)
        except PretrainConfigError as err:
            print(f"bench_gpu: {err}", file=sys.stderr)
            raise SystemExit(2) from None
    dtype = torch.bfloat16 if args.precision in ("bf16", "fp8") else torch.float32
    compile_ = (args.compile or ("on" if device.type == "cuda" else "off")) == "on"
    print(f"device {device_name(device)}, model {args.model}, "
          f"{dtype}{' (ours also with fp8 encoder Linear layers)' if fp8 else ''}, compile ours {compile_}, "
          f"backend {args.compile_backend}, {args.warmup} warm-up steps then one window of {args.steps}")
    results, dropout = [], None

    def report(rows_so_far: Sequence[dict] = (), **more) -> dict:
        return {"device": str(device), "device_name": device_name(device), "torch": torch.__version__,
                "architecture": family.name, "model": args.model, "vocab_size": model_vocab(args, family),
                "dtype": str(dtype), "precision": args.precision, "compile": compile_ and family.unpadded,
                "compile_backend": args.compile_backend, "attention_dropout": dropout,
                "warmup_steps": args.warmup, "timed_steps": args.steps, "max_grad_norm": args.max_grad_norm,
                "timing": f"{args.windows} windows per system, each synchronized at its two ends only; tokens_per_s "
                          "and step_seconds (window / steps) from the median window",
                "baseline": "role hf_compiled (ratio); ratio_vs_eager: role hf_eager"
                            + ("; ratio_vs_our_bf16 (fp8 rows): our bf16 row of the same kernel" if fp8 else ""),
                "results": results + list(rows_so_far), **more}

    def save_so_far(rows: Sequence[dict]) -> None:  # after each system: a stage's timeout keeps what ran
        write_results(args.out, report(rows, complete=False, cut_off="while measuring the systems"), quiet=True)

    for max_length, batch_size in zip(args.seq_lengths, args.batch):
        if args.convergence_only:
            break
        bert = build_model(args, family)
        dropout = float(bert.config.attention_probs_dropout_prob)
        results += measure_length(args, bert, device, dtype, compile_, max_length, batch_size, fp8, save_so_far)
    final = report(paper_budget_device_hours=paper_budget_hours(args, results))
    if args.convergence_steps > 0:
        write_results(args.out, {**final, "complete": False, "cut_off": "in the convergence runs"}, quiet=True)
        final["convergence"] = convergence(args, family, device, compile_, results)
    write_results(args.out, {**final, "complete": True})


def paper_budget_hours(args: argparse.Namespace, results: list[dict]) -> float | None:
    """Device-hours for the paper's budget at the fastest row's pace on the real lengths (printed), or None."""
    real_data = [r for r in results if r["role"] not in (HF_FULL_LENGTH, FAILED) and r["seq"] == min(args.seq_lengths)]
    if not real_data:
        return None
    best = max(real_data, key=lambda r: r["tokens_per_s"])
    # 65.5B positions, 128 a sequence; the batches' sequences hold mean_length real tokens, and the row's
    # pace counts real tokens: the budget's real tokens are its positions at that share
    real_share = min(1.0, best["mean_length"] / best["seq"])
    hours = PAPER_TOKENS * real_share / best["tokens_per_s"] / 3600
    print(f"paper budget (65.5B positions at seq {best['seq']}, {real_share:.1%} of them real tokens as in these "
          f"batches) with {best['system']}: {hours:,.0f} device-hours here")
    return hours


def regions_of(args: argparse.Namespace) -> tuple[Regions, ...]:
    """Our compiled regions as the options say, one per ``--compile-mode``."""
    return tuple(Regions(args.compile_scope, args.layers_per_graph, None if mode == "default" else mode)
                 for mode in args.compile_mode)


def build_model(args: argparse.Namespace, family):
    """The family's model from the preset, on the CPU (each system copies it to the device)."""
    from biomed_lm.pretrain.config import load_model_preset

    torch.manual_seed(0)
    preset = load_model_preset(args.model)
    if args.attention_dropout is not None:
        preset = {**preset, "attention_probs_dropout_prob": args.attention_dropout}
    return family.build(family.preset_fields(preset, args.model), model_vocab(args, family), 0)


def model_vocab(args: argparse.Namespace, family) -> int:
    return args.vocab_size or RECIPE_VOCAB.get(family.name, VOCAB)


def length_batches(args: argparse.Namespace, max_length: int, batch_size: int) -> tuple[list[dict], list[dict]]:
    """The warm-up and window batches at ``max_length``: BERT's mix (or real lengths), and full-length rows."""
    steps = args.warmup + args.steps
    count = steps * batch_size
    if args.instances:  # the instances' lengths in order, from the start again where a window needs more
        real = real_lengths(args.instances, max_length)
        lengths = (real * -(-count // len(real)))[:count]
    else:
        lengths = length_mix(count, max_length, torch.Generator().manual_seed(max_length))
    return (make_batches(lengths, batch_size, steps, seed=max_length),
            make_batches([max_length] * count, batch_size, steps, seed=max_length))


def measure_length(args: argparse.Namespace, bert, device: torch.device, dtype, compile_: bool, max_length: int,
                   batch_size: int, fp8: bool = False,
                   save_so_far: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Every system at one sequence length, one after the other, each from a fresh torch.compile state;
    ``save_so_far`` gets the rows after each system."""
    padded_batches, full_length_batches = length_batches(args, max_length, batch_size)
    sync, rows, profiles, failed = device_sync(device), [], {}, []
    for system in systems(bert, device, dtype, compile_, args.bucket_tokens, args.kernels, args.compile_backend, fp8,
                          baselines=args.baselines, regions=regions_of(args),
                          residual_streams=tuple(args.residual_stream)):
        torch._dynamo.reset()  # each system compiles in its own warm-up, no cache limit shared between them
        gc.collect()
        batches = full_length_batches if system.role == HF_FULL_LENGTH else padded_batches
        try:
            row, step, window = run_system(system, batches, args.warmup, device, dtype, bert.config, sync,
                                           args.windows, args.max_grad_norm)
        except Exception as error:  # noqa: BLE001  one system's failure must not cost a one-shot GPU run the rest
            failed.append(failed_row(system, error, max_length, batch_size))
            del system
            if save_so_far is not None:
                save_so_far(rows + failed)
            continue
        row.update(seq=max_length, batch=batch_size)
        if args.profile and system.role in (HF_COMPILED, OURS):
            profiles[row["system"]] = profile_row(args, row, step, window, device, sync)
        rows.append(row)
        del system, step, window  # the model leaves the device before the next is built
        if save_so_far is not None:
            add_ratios(rows)
            save_so_far(rows + failed)
    add_ratios(rows)
    _print(rows, max_length, batch_size)
    for row in (next((r for r in rows if r["role"] == HF_COMPILED), None), _fastest_ours(rows)):
        if row is not None and row["system"] in profiles:
            print_profile(row, profiles[row["system"]])
    return rows + failed


def device_name(device: torch.device) -> str:
    """The GPU's name (what benchmarks/README.md records each figure with), or "cpu"."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def failed_row(system: System, error: Exception, max_length: int, batch_size: int) -> dict:
    """A system that raised: its name, what it was (``failed_role``) and the error, printed as it happens;
    role FAILED keeps it out of every ratio and pick."""
    print(f"FAILED {system.name}: {type(error).__name__}: {error}", flush=True)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"system": system.name, "role": FAILED, "failed_role": system.role, "kernel": system.kernel,
            "compile_mode": system.compile_mode, "precision": "fp8" if system.fp8 else None, "seq": max_length,
            "batch": batch_size, "error": f"{type(error).__name__}: {error}"[:2000]}


def profile_row(args: argparse.Namespace, row: dict, step: Callable, window: list[dict], device: torch.device,
                sync: Callable[[], None]) -> list[dict]:
    # the result's name first: the stages share a folder (fp8large's rows share fp8's system names)
    out_dir, name = Path(args.out).parent, slug(f"{Path(args.out).stem} {row['system']} seq{row['seq']}")
    out_dir.mkdir(parents=True, exist_ok=True)
    trace = out_dir / f"trace_{name}.json" if args.trace else None
    kernels, totals = profile_steps(step, window[:args.profile_steps], device, sync, trace)
    write_profile(out_dir / f"profile_{name}.txt", row, kernels, totals, args.profile_steps)
    row["profile"], row["profile_totals"] = kernels, totals
    return kernels


def add_ratios(rows: list[dict]) -> None:
    """``ratio`` against the compiled transformers row (the baseline), ``ratio_vs_eager`` against the eager one;
    an fp8 row's ``ratio_vs_our_bf16`` against our bf16 row of the same kernel, compile mode and residual
    stream, a half residual stream's ``ratio_vs_fp32_stream`` against the fp32 stream's row of the same kernel,
    compile mode and precision (same run, same batches)."""
    compiled = next((r["tokens_per_s"] for r in rows if r["role"] == HF_COMPILED), None)
    eager = next((r["tokens_per_s"] for r in rows if r["role"] == HF_EAGER), None)
    ours = [r for r in rows if r["role"] == OURS]
    ours_bf16 = {(r["kernel"], r.get("compile_mode"), r.get("residual_stream")): r for r in ours
                 if r["precision"] != "fp8"}
    fp32_streams = {(r["kernel"], r.get("compile_mode"), r["precision"]): r for r in ours
                    if r.get("residual_stream", "fp32") == "fp32"}
    for row in rows:  # None where --no-baselines left the transformers rows out
        row.update(ratio=row["tokens_per_s"] / compiled if compiled else None,
                   ratio_vs_eager=row["tokens_per_s"] / eager if eager else None, baseline=row["role"] == HF_COMPILED)
        same = ours_bf16.get((row["kernel"], row.get("compile_mode"), row.get("residual_stream")))
        if row["precision"] == "fp8" and same is not None:
            row["ratio_vs_our_bf16"] = row["tokens_per_s"] / same["tokens_per_s"]
        fp32_stream = fp32_streams.get((row["kernel"], row.get("compile_mode"), row["precision"]))
        if row.get("residual_stream") == "half" and fp32_stream is not None:
            row["ratio_vs_fp32_stream"] = row["tokens_per_s"] / fp32_stream["tokens_per_s"]


def _fastest_ours(rows: list[dict], precision: str | None = None) -> dict | None:
    ours = [r for r in rows if r["role"] == OURS and (precision is None or r["precision"] == precision)]
    return max(ours, key=lambda r: r["tokens_per_s"]) if ours else None


def _print(rows: list[dict], max_length: int, batch_size: int) -> None:
    print(f"\nseq {max_length}, micro-batch {batch_size}")
    print(f"{'system':<80} {'tok/s':>10} {'×HFc':>6} {'×HFe':>6} {'MFU':>6} {'pad':>6} {'GiB':>6} {'graphs':>6}")
    for r in rows:
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        ratios = " ".join(f"{r[key]:>6.2f}" if r[key] is not None else f"{'-':>6}"
                          for key in ("ratio", "ratio_vs_eager"))
        print(f"{r['system']:<80} {r['tokens_per_s']:>10,.0f} {ratios} {mfu:>6} "
              f"{r['padding_fraction']:>6.1%} {r['peak_memory_gib']:>6.2f} {r['graphs_compiled_in_window']:>6}")
    baseline = next((r for r in rows if r["baseline"]), None)
    print(f"baseline (×HFc = 1.00): {baseline['system'] if baseline else 'none (--no-baselines)'}; ×HFe: against the "
          "eager row; graphs: torch.compile graphs compiled inside the timed window (0 when the warm-up covered them)")
    for r in rows:
        if "ratio_vs_our_bf16" in r:
            print(f"fp8/bf16 of ours [{r['kernel']}]: {r['ratio_vs_our_bf16']:.2f}x tokens/s "
                  f"(MFU of fp8 rows against the FP8 peak, of the others against the bf16 peak)")
        if "ratio_vs_fp32_stream" in r:
            print(f"half/fp32 residual stream of ours [{r['kernel']}, {r['precision']}]: "
                  f"{r['ratio_vs_fp32_stream']:.2f}x tokens/s")


# ----------------------------------------------------------------------------- convergence: fp8 against bf16

FINAL_WINDOW = 20  # a run's final loss: the mean of its last 20 steps' losses
CONVERGENCE_TOLERANCE = 0.01  # fp8 passes when its final loss is within 1% of bf16's


def convergence(args: argparse.Namespace, family, device: torch.device, compile_: bool, rows: list[dict]) -> dict:
    """``--convergence-steps`` optimizer steps of ours from the same initial weights on the same batches: in
    bf16 (the reference), in fp8 where ``--precision fp8`` asked for it, and with a half residual stream where
    ``--residual-stream`` names half: every step's loss, the final losses and each variant's relative
    difference from the reference."""
    max_length, batch_size, steps = args.seq_lengths[0], args.convergence_batch, args.convergence_steps
    bert = build_model(args, family)
    kernel = convergence_kernel(args, family, device, bert, rows, max_length)
    batches = convergence_batches(args, max_length, batch_size, steps)
    system = our_system(bert, family, kernel, device, compile_, args.bucket_tokens, args.compile_backend,
                        regions=regions_of(args)[0]).name
    text = "real instances" if args.instances else "StructuredText"
    recipe = (f"AdamW lr {args.convergence_lr:g} (10% warm-up, linear decay), weight decay 0.01 (not on biases and "
              f"norms), gradient clipping 1.0, bf16 autocast; {text}")
    reference, seconds = train_losses(args, bert, family, kernel, batches, device, compile_)
    result = {"steps": steps, "seq": max_length, "batch": batch_size, "system": system, "kernel": kernel,
              "recipe": recipe, "final": f"mean of the last {min(FINAL_WINDOW, steps)} steps' losses",
              "tolerance": CONVERGENCE_TOLERANCE, "bf16_final": final_loss(reference), "losses_bf16": reference,
              "seconds_bf16": seconds}
    # fp8 keeps its unprefixed keys (relative_difference, passed): the JSON's readers had them first
    fp8 = compare_variant(args, bert, family, kernel, batches, device, compile_, reference, fp8=True)
    result.update(fp8_final=fp8["final"], relative_difference=fp8["relative_difference"], passed=fp8["passed"],
                  losses_fp8=fp8["losses"], seconds_fp8=fp8["seconds"])
    if "not_run" in fp8:
        result["fp8_not_run"] = fp8["not_run"]
    verdicts = [_verdict("fp8", fp8)]
    if "half" in args.residual_stream:
        half = compare_variant(args, bert, family, kernel, batches, device, compile_, reference,
                               residual_stream="half")
        result["half_stream"] = half
        verdicts.append(_verdict("half residual stream", half))
    print(f"\nconvergence, {steps} steps of {system} at seq {max_length}, micro-batch {batch_size}: loss "
          f"{reference[0]:.3f} -> bf16 final {result['bf16_final']:.4f}; " + "; ".join(verdicts))
    return result


def compare_variant(args: argparse.Namespace, bert, family, kernel: str, batches: list[dict], device: torch.device,
                    compile_: bool, reference: list[float], fp8: bool = False, residual_stream: str = "fp32") -> dict:
    """One variant's run against the reference's losses: its ``final`` loss, ``relative_difference`` and
    ``passed`` (within :data:`CONVERGENCE_TOLERANCE`), every step's ``losses`` and its ``seconds``; all None,
    with ``not_run`` saying why, where it cannot run here or was not asked for."""
    from biomed_lm.pretrain.fp8 import fp8_unavailable_reason

    reason = None
    if fp8:
        reason = "not asked for: --precision fp8" if args.precision != "fp8" else fp8_unavailable_reason(device)
    elif residual_stream == "half" and not family.unpadded:
        reason = f"the {family.name} family runs transformers' padded forward, whose stream stays fp32"
    if reason is not None:
        return {"final": None, "relative_difference": None, "passed": None, "losses": None, "seconds": None,
                "not_run": reason}
    losses, seconds = train_losses(args, bert, family, kernel, batches, device, compile_, fp8=fp8,
                                   residual_stream=residual_stream)
    final, reference_final = final_loss(losses), final_loss(reference)
    difference = (final - reference_final) / reference_final
    return {"final": final, "relative_difference": difference, "passed": abs(difference) <= CONVERGENCE_TOLERANCE,
            "losses": losses, "seconds": seconds}


def _verdict(name: str, variant: dict) -> str:
    if "not_run" in variant:
        return f"{name} not run ({variant['not_run']})"
    return (f"{name} final {variant['final']:.4f}, relative difference {variant['relative_difference']:+.2%}: "
            f"{'passed' if variant['passed'] else 'FAILED'} (tolerance {CONVERGENCE_TOLERANCE:.0%})")


def convergence_kernel(args: argparse.Namespace, family, device: torch.device, bert, rows: list[dict],
                       max_length: int) -> str:
    """The fastest of our bf16 rows at ``max_length``; without throughput rows (``--convergence-only``) the
    kernel the trainer's ``auto`` picks here, if it is among ours, else our first that runs."""
    from biomed_lm.pretrain.attention import choose_kernel

    fastest = _fastest_ours([r for r in rows if r["seq"] == max_length], precision="bf16")
    if fastest is not None:
        return fastest["kernel"]
    dropout = float(bert.config.attention_probs_dropout_prob)
    runs = our_kernels(family, device, torch.bfloat16, dropout, args.kernels, quiet=True)
    if not runs:
        raise SystemExit(f"bench_gpu: none of the kernels {args.kernels} runs here")
    auto = choose_kernel("auto", device, torch.bfloat16, dropout)[0] if family.unpadded else "hf_sdpa"
    return auto if auto in runs else runs[0]


def convergence_batches(args: argparse.Namespace, max_length: int, batch_size: int, steps: int) -> list[dict]:
    """``steps`` micro-batches made as the throughput batches are (BERT's length mix, masking), from
    :class:`StructuredText` (learnable, unlike uniform ids), or the real instances with ``--instances``; a
    fixed seed, so both runs see the same sequence."""
    count = steps * batch_size
    if args.instances:
        return make_batches([], batch_size, steps, seed=max_length, rows=real_rows(args.instances, max_length, count))
    lengths = length_mix(count, max_length, torch.Generator().manual_seed(max_length))
    return make_batches(lengths, batch_size, steps, seed=max_length, text="structured")


def train_losses(args: argparse.Namespace, bert, family, kernel: str, cpu_batches: list[dict], device: torch.device,
                 compile_: bool, fp8: bool = False, residual_stream: str = "fp32") -> tuple[list[float], float]:
    """Train a fresh copy of ``bert`` (compiled as our rows are, ``fp8`` and ``residual_stream`` as
    :func:`our_system` takes them) one optimizer step per batch; every step's loss, kept on the device and
    read back once at the end (no per-step sync), and the run's seconds (compilation included)."""
    from biomed_lm.optim import ScheduleConfig, build_lr_scheduler, build_optimizer, parameter_groups

    torch._dynamo.reset()
    gc.collect()
    system = our_system(bert, family, kernel, device, compile_, args.bucket_tokens, args.compile_backend, fp8=fp8,
                        regions=regions_of(args)[0], residual_stream=residual_stream)
    model = system.model
    device_batches = [{key: value.to(device) for key, value in system.prepare(batch).items()} for batch in cpu_batches]
    optimizer = build_optimizer("adamw", parameter_groups(model), lr=args.convergence_lr, device=device).optimizer
    scheduler = build_lr_scheduler(optimizer, ScheduleConfig("slanted_triangular", warmup_ratio=0.1), len(cpu_batches))
    losses = torch.zeros(len(cpu_batches), device=device)
    torch.manual_seed(0)  # the same dropout stream for both runs
    sync = device_sync(device)
    sync()
    start = time.perf_counter()
    for index, batch in enumerate(device_batches):
        model.begin_micro_batch()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = system.loss_fn(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses[index] = loss.detach()
    sync()
    seconds = time.perf_counter() - start
    return losses.tolist(), seconds


def final_loss(losses: list[float]) -> float:
    tail = losses[-FINAL_WINDOW:]
    return sum(tail) / len(tail)


if __name__ == "__main__":
    main()
