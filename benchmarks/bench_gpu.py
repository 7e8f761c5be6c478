#!/usr/bin/env python
"""Pretraining step throughput on a GPU: ours (unpadded, each attention kernel, compiled, fused
AdamW) against transformers' family class (``BertForPreTraining``, ``AlbertForPreTraining``,
``RobertaForMaskedLM``) as a user runs it, all under bf16 autocast, measured in the same run.

    python benchmarks/bench_gpu.py                      # BERT-base, seq 128 and 512, on cuda
    python benchmarks/bench_gpu.py --profile            # and the top kernels of ours and the baseline
    python benchmarks/bench_gpu.py --device cpu --quick --compile-backend aot_eager  # what the tests run

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
shape, allocator, kernel selection), then ONE window of ``--steps`` optimizer steps with one
``torch.cuda.synchronize`` at each end and none in between. Every batch is moved to the device
before the warm-up (all of them staged there: a few MB; no pinned memory, no copy in the window),
and tokens, padding and model FLOPs are counted from the CPU copies of the window's batches
beforehand, so the benchmark itself reads nothing back (no ``.item()``/``.tolist()``) inside the
window; what a model reads back itself (our unpadded path's lengths) a training run reads too. ``step_seconds`` is the window's seconds ÷ steps
(a mean: a per-step median would need a synchronize per step); ``graphs_compiled_in_window`` says
whether torch.compile still compiled inside the window (warm-up too short for the shapes seen).

Batches: BERT's length mix — each sequence is full length with probability 0.5 (instances fill up
to the target), otherwise uniform between 8 and the maximum (short_seq_prob, document ends) — or
the real lengths of instances made by ``launch/create_pretraining_data.py`` (``--instances DIR``).
Reported per system: real (non-pad) tokens/s, step time, MFU (model FLOPs of the real tokens:
``pretrain.flops.step_flops`` ÷ the device's dense peak), peak memory (the device's peak allocated
memory during the system's run; on CPU the process's peak RSS), padding share of the positions
computed, and the ratios. From the best tokens/s on the benchmark's batches (the full-length row
left out) the GPU-hours of the paper's budget (62,500 steps × 8,192 × 128 tokens ≈ 65.5B) here.

``--profile``: after its window, ``torch.profiler`` (CPU, and CUDA on a GPU) over
``--profile-steps`` more steps (the window's first batches again) of the compiled baseline and of
each of ours; per profiled system ``<out dir>/profile_<system slug>-seq<length>.txt``
and the row's ``profile`` in the JSON list the top kernels by self device time (CUDA kernel time on
a GPU, self CPU time of each op on a CPU) with their share of the profiled steps' wall time and
their calls; the top 10 of the baseline and of our fastest are printed. ``--trace`` also writes a
chrome trace per profiled system (``trace_<system slug>-seq<length>.json``).
"""

from __future__ import annotations

import argparse
import copy
import re
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from _results import write_results  # benchmarks/ is on sys.path when a benchmark runs

REPO = Path(__file__).resolve().parents[1]
PAPER_TOKENS = 62_500 * 8_192 * 128
VOCAB, CLS, SEP, MASK = 30522, 101, 102, 103
HF_EAGER, HF_COMPILED, HF_FULL_LENGTH, OURS = "hf_eager", "hf_compiled", "hf_full_length", "ours"
PROFILE_KEEP = 30  # kernels kept per profile (file and JSON); the top 10 are printed


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


@dataclass
class WindowCounts:
    """What the timed window's batches hold, counted on the host before the window."""
    tokens: int
    positions: int
    flops: float


def length_mix(count: int, max_length: int, generator: torch.Generator) -> list[int]:
    full = torch.rand(count, generator=generator) < 0.5
    short = torch.randint(8, max_length + 1, (count,), generator=generator)
    return torch.where(full, torch.full_like(short, max_length), short).tolist()


def real_lengths(instances: str, max_length: int) -> list[int]:
    from datasets import load_from_disk

    dataset = load_from_disk(instances)
    return [min(len(ids), max_length) for ids in dataset["input_ids"]]


def make_batches(lengths: list[int], batch: int, steps: int, seed: int) -> list[dict]:
    """Masked batches (the toolkit's collator: whole-word masking, 15%) of the given lengths."""
    from biomed_lm.pretrain.masking import MaskingConfig, PretrainingCollator

    generator = torch.Generator().manual_seed(seed)
    collator = PretrainingCollator(pad_token_id=0, cls_token_id=CLS, sep_token_id=SEP, mask_token_id=MASK,
                                   vocab_size=VOCAB, config=MaskingConfig(whole_word=True), pad_to_multiple_of=8)
    batches = []
    for step in range(steps):
        rows = []
        for n in lengths[step * batch:(step + 1) * batch]:
            ids = [CLS, *torch.randint(1000, VOCAB, (n - 2,), generator=generator).tolist(), SEP]
            rows.append({"input_ids": ids, "token_type_ids": [0] * (n // 2) + [1] * (n - n // 2),
                         "word_starts": [1] * n, "next_sentence_label": int(torch.randint(2, (1,)))})
        batches.append(dict(collator(rows, generator=generator)))
    return batches


def window_counts(cpu_batches: list[dict], config, computed_positions: Callable) -> WindowCounts:
    """Real tokens, computed positions and model FLOPs of the window's batches, from their CPU copies
    (so the window itself never reads a device tensor back)."""
    from biomed_lm.pretrain.flops import step_flops

    tokens, positions, flops = 0, 0, 0.0
    for batch in cpu_batches:
        lengths = batch["attention_mask"].sum(1).tolist()
        tokens += sum(lengths)
        positions += computed_positions(batch)
        flops += step_flops(config, lengths, int((batch["labels"] != -100).sum()), len(lengths))
    return WindowCounts(tokens, positions, flops)


def make_step(model, loss_fn: Callable, optimizer, device: torch.device, dtype) -> Callable[[dict], None]:
    """One optimizer step on a device batch; returns nothing, so nothing waits for the device."""
    def step(batch: dict) -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = loss_fn(model, batch)
        loss.backward()
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
               sync: Callable[[], None]) -> tuple[dict, Callable, list[dict]]:
    """Warm-up steps, then one timed window over the rest of ``cpu_batches``. Returns the row, the
    step function and the device batches (for a profile right after, while the model is warm)."""
    from biomed_lm.pretrain.compiling import compiled_graphs
    from biomed_lm.pretrain.flops import peak_flops
    from biomed_lm.pretrain.optim import build_optimizer

    counts = window_counts(cpu_batches[warmup:], config, system.computed_positions)
    device_batches = [{key: value.to(device) for key, value in system.prepare(batch).items()}
                      for batch in cpu_batches]
    optimizer = build_optimizer("adamw", system.model.parameters(), lr=1e-4, device=device)
    step = make_step(system.model, system.loss_fn, optimizer.optimizer, device, dtype)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for batch in device_batches[:warmup]:
        step(batch)
    graphs_before = compiled_graphs()
    seconds = time_window(step, device_batches[warmup:], sync)
    steps = len(cpu_batches) - warmup
    peak = peak_flops("bf16" if dtype == torch.bfloat16 else "fp32", device)
    row = {"system": system.name, "role": system.role, "optimizer": optimizer.implementation,
           "tokens_per_s": counts.tokens / seconds, "step_seconds": seconds / steps, "window_seconds": seconds,
           "steps": steps, "warmup_steps": warmup, "mfu": counts.flops / seconds / peak if peak else None,
           "padding_fraction": 1 - counts.tokens / counts.positions, "peak_memory_gib": _peak_memory(device),
           "graphs_compiled_in_window": compiled_graphs() - graphs_before}
    return row, step, device_batches[warmup:]


def _peak_memory(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # process peak RSS (KiB -> GiB)


def profile_steps(step: Callable[[dict], None], batches: list[dict], device: torch.device,
                  sync: Callable[[], None], trace_path: Path | None) -> list[dict]:
    """torch.profiler over ``batches`` (the model already warm): the top kernels by self device time,
    each with its share of the profiled steps' wall time (profiler overhead included, so shares are
    lower bounds) and its calls."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        seconds = time_window(step, batches, sync)
    if trace_path is not None:
        profiler.export_chrome_trace(str(trace_path))
    return top_kernels(profiler.key_averages(), seconds, on_device=device.type == "cuda")


def top_kernels(averages, seconds: float, on_device: bool, keep: int = PROFILE_KEEP) -> list[dict]:
    """On a GPU the CUDA kernels (and copies) by self CUDA time: the ops that launched them and the
    record_function ranges mirrored on the GPU are left out, they would count the same time twice.
    On a CPU every op by self CPU time (self times of nested ops do not overlap)."""
    from torch.autograd import DeviceType

    def self_microseconds(event) -> float:
        if on_device:
            kernel = event.device_type == DeviceType.CUDA and not getattr(event, "is_user_annotation", False)
            return event.self_device_time_total if kernel else 0.0
        return event.self_cpu_time_total if event.device_type == DeviceType.CPU else 0.0

    timed = sorted(((self_microseconds(event), event) for event in averages), key=lambda pair: -pair[0])
    return [{"name": event.key, "share": microseconds / (seconds * 1e6), "calls": event.count}
            for microseconds, event in timed[:keep] if microseconds > 0]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def write_profile(path: Path, row: dict, kernels: list[dict], steps: int) -> None:
    lines = [f"{row['system']}, seq {row['seq']}, micro-batch {row['batch']}: top {len(kernels)} kernels by self "
             f"device time over {steps} profiled steps ({sum(k['share'] for k in kernels):.1%} of their wall time)",
             f"{'share':>7} {'calls':>7}  name"]
    lines += [f"{k['share']:>7.2%} {k['calls']:>7}  {k['name']}" for k in kernels]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def print_profile(row: dict, kernels: list[dict], top: int = 10) -> None:
    print(f"\nprofile of {row['system']} (seq {row['seq']}): top {top} kernels, share of the profiled step time")
    for kernel in kernels[:top]:
        print(f"  {kernel['share']:>7.2%} {kernel['calls']:>6}  {kernel['name'][:100]}")


def hf_inputs(family, batch: dict) -> dict:
    """The batch as the family's transformers class takes it (token types, its pair label's name)."""
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "labels")}
    if family.token_types:
        inputs["token_type_ids"] = batch["token_type_ids"]
    if family.pair_label_argument:
        inputs[family.pair_label_argument] = batch["next_sentence_label"]
    return inputs


def systems(bert, device: torch.device, dtype, compile_: bool, bucket: int, kernels: list[str] | None = None,
            backend: str = "inductor"):
    """The :class:`System` rows, built one at a time from ``bert`` (kept on the CPU; each row gets its own
    copy on ``device``, so only one is there while it runs): transformers' family class eager, compiled
    (the baseline) and compiled on full-length rows, then each of our kernels."""
    from biomed_lm.pretrain.families import family_of

    family = family_of(bert.config)

    def hf_loss(model, batch):
        return model(**hf_inputs(family, batch)).loss

    def padded(batch) -> int:
        return batch["input_ids"].numel()

    recipe, hf = "SDPA, padded, full MLM head", f"transformers {family.model_class}"
    yield System(f"{hf} (eager, {recipe})", HF_EAGER, _copy_to(bert, device), hf_loss, padded)
    yield System(f"{hf} (torch.compile, {recipe})", HF_COMPILED,
                 torch.compile(_copy_to(bert, device), backend=backend), hf_loss, padded)
    yield System(f"{hf} (torch.compile, full-length rows: the stock dense ceiling)", HF_FULL_LENGTH,
                 torch.compile(_copy_to(bert, device), backend=backend), hf_loss, padded)
    yield from _our_systems(bert, family, device, dtype, compile_, bucket, kernels, backend)


def _copy_to(bert, device: torch.device):
    return copy.deepcopy(bert).to(device)


def _our_systems(bert, family, device: torch.device, dtype, compile_: bool, bucket: int,
                 kernels: list[str] | None, backend: str):
    """Each of our kernels that runs here (a family without the unpadded path: its padded forward with
    the MLM head on the masked positions). Models are built inside the yield, never bound to a local,
    so the previous row's model is freed before the next is built."""
    from biomed_lm.pretrain.attention import KERNELS, why_not

    def our_loss(model, batch):
        return model(**batch).loss

    if not family.unpadded:
        model = _our_model(bert, device, nsp=family.pair_head is not None, attention="hf_sdpa")
        yield System("ours [hf_sdpa, padded, MLM head on masked positions]", OURS, model, our_loss,
                     lambda batch: batch["input_ids"].numel(), _layout_of(model))
        return
    dropout = float(bert.config.attention_probs_dropout_prob)
    for kernel in KERNELS:
        reason = why_not(kernel, device, dtype, dropout)
        if kernels is not None and kernel not in kernels:
            continue
        if reason is not None or (device.type == "cpu" and kernel != "sdpa_loop"):
            print(f"ours [{kernel}]: skipped ({reason or 'slow on cpu'})")
            continue
        model = _our_model(bert, device, attention=kernel, pad_to_multiple_of=bucket if compile_ else None,
                           compile_backend=backend if compile_ else None)
        region = {None: "", True: ", whole forward compiled", False: ", dense blocks compiled"}[
            None if not compile_ else KERNELS[kernel].traceable]
        yield System(f"ours [{kernel}{region}]", OURS, model, our_loss, _unpadded_positions(bucket if compile_ else 1),
                     _layout_of(model))
        del model


def _our_model(bert, device: torch.device, compile_backend: str | None = None, **options):
    """Our model as the trainer builds it: the whole forward compiled as one region where the kernel
    traces (pretrain.trainer._compile), the dense blocks otherwise."""
    from biomed_lm.pretrain.attention import KERNELS
    from biomed_lm.pretrain.compiling import compile_dense_blocks
    from biomed_lm.pretrain.modeling import PretrainingModel

    ours = PretrainingModel(copy.deepcopy(bert), **options).to(device)
    if compile_backend is not None and KERNELS[ours.attention].traceable:
        ours.compile_losses(backend=compile_backend)
    elif compile_backend is not None:
        compile_dense_blocks(ours.bert, backend=compile_backend)
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
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default=None, help="a model preset (default: the family's base size)")
    parser.add_argument("--architecture", default="bert", help="the model family: bert, albert or roberta")
    parser.add_argument("--seq-lengths", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch", type=int, nargs="+", default=[256, 64], help="micro-batch per length")
    parser.add_argument("--steps", type=int, default=12, help="steps in the timed window (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed steps first: compilation, and recompilation for a second padded shape")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default=None, help="default: bf16 on cuda")
    parser.add_argument("--compile", choices=("on", "off"), default=None,
                        help="our compiled dense blocks (default: on for cuda); the compiled baselines always compile")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile backend for ours and the baselines (aot_eager: fast, for CPU tests)")
    parser.add_argument("--bucket-tokens", type=int, default=128)
    parser.add_argument("--attention-dropout", type=float, default=None,
                        help="override the preset's attention_probs_dropout_prob (0 lets the kernels without "
                             "dropout run, as MosaicBERT and ModernBERT train)")
    parser.add_argument("--kernels", nargs="+", default=None, help="only these of our kernels (default: each that runs)")
    parser.add_argument("--instances", default=None, help="real instances (their lengths) instead of the mix")
    parser.add_argument("--profile", action="store_true",
                        help="profile the compiled baseline and ours after their windows (files beside --out)")
    parser.add_argument("--profile-steps", type=int, default=3, help="steps profiled (from the window's batches)")
    parser.add_argument("--trace", action="store_true", help="with --profile: a chrome trace per profiled system")
    parser.add_argument("--quick", action="store_true", help="bert-tiny, 2 timed steps, batch 4: a smoke test")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "gpu.json"))
    args = parser.parse_args(argv)
    args.profile = args.profile or args.trace
    if args.quick:
        args.steps, args.batch = 2, [4] * len(args.seq_lengths)
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
    dtype = torch.bfloat16 if (args.precision or ("bf16" if device.type == "cuda" else "fp32")) == "bf16" \
        else torch.float32
    compile_ = (args.compile or ("on" if device.type == "cuda" else "off")) == "on"
    print(f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, model {args.model}, "
          f"{dtype}, compile ours {compile_}, backend {args.compile_backend}, "
          f"{args.warmup} warm-up steps then one window of {args.steps}")
    results, dropout = [], None
    for max_length, batch_size in zip(args.seq_lengths, args.batch):
        bert = build_model(args, family)
        dropout = float(bert.config.attention_probs_dropout_prob)
        results += measure_length(args, bert, device, dtype, compile_, max_length, batch_size)
    real_data = [r for r in results if r["role"] != HF_FULL_LENGTH and r["seq"] == min(args.seq_lengths)]
    best = max(real_data, key=lambda r: r["tokens_per_s"])
    hours = PAPER_TOKENS / best["tokens_per_s"] / 3600
    print(f"paper budget (65.5B tokens at seq {best['seq']}) with {best['system']}: {hours:,.0f} device-hours here")
    write_results(args.out, {"device": str(device), "architecture": family.name, "model": args.model,
                             "dtype": str(dtype), "compile": compile_ and family.unpadded,
                             "compile_backend": args.compile_backend, "attention_dropout": dropout,
                             "warmup_steps": args.warmup, "timed_steps": args.steps,
                             "timing": "one window per system, synchronized at its two ends only; "
                                       "step_seconds = window / steps",
                             "baseline": "role hf_compiled (ratio); ratio_vs_eager: role hf_eager",
                             "results": results, "paper_budget_device_hours": hours})


def build_model(args: argparse.Namespace, family):
    """The family's model from the preset, on the CPU (each system copies it to the device)."""
    from biomed_lm.pretrain.config import load_model_preset

    torch.manual_seed(0)
    preset = load_model_preset(args.model)
    if args.attention_dropout is not None:
        preset = {**preset, "attention_probs_dropout_prob": args.attention_dropout}
    return family.build(family.preset_fields(preset, args.model), VOCAB, 0)


def length_batches(args: argparse.Namespace, max_length: int, batch_size: int) -> tuple[list[dict], list[dict]]:
    """The warm-up and window batches at ``max_length``: BERT's mix (or real lengths), and full-length rows."""
    steps = args.warmup + args.steps
    count = steps * batch_size
    lengths = real_lengths(args.instances, max_length)[:count] if args.instances \
        else length_mix(count, max_length, torch.Generator().manual_seed(max_length))
    return (make_batches(lengths, batch_size, steps, seed=max_length),
            make_batches([max_length] * count, batch_size, steps, seed=max_length))


def measure_length(args: argparse.Namespace, bert, device: torch.device, dtype, compile_: bool, max_length: int,
                   batch_size: int) -> list[dict]:
    """Every system at one sequence length, one after the other, each from a fresh torch.compile state."""
    import gc

    padded_batches, full_length_batches = length_batches(args, max_length, batch_size)
    sync, rows, profiles = device_sync(device), [], {}
    for system in systems(bert, device, dtype, compile_, args.bucket_tokens, args.kernels, args.compile_backend):
        torch._dynamo.reset()  # each system compiles in its own warm-up, no cache limit shared between them
        gc.collect()
        batches = full_length_batches if system.role == HF_FULL_LENGTH else padded_batches
        row, step, window = run_system(system, batches, args.warmup, device, dtype, bert.config, sync)
        row.update(seq=max_length, batch=batch_size)
        if args.profile and system.role in (HF_COMPILED, OURS):
            profiles[row["system"]] = profile_row(args, row, step, window, device, sync)
        rows.append(row)
        del system, step, window  # the model leaves the device before the next is built
    add_ratios(rows)
    _print(rows, max_length, batch_size)
    for row in (next(r for r in rows if r["role"] == HF_COMPILED), _fastest_ours(rows)):
        if row is not None and row["system"] in profiles:
            print_profile(row, profiles[row["system"]])
    return rows


def profile_row(args: argparse.Namespace, row: dict, step: Callable, window: list[dict], device: torch.device,
                sync: Callable[[], None]) -> list[dict]:
    out_dir, name = Path(args.out).parent, slug(f"{row['system']} seq{row['seq']}")
    out_dir.mkdir(parents=True, exist_ok=True)
    trace = out_dir / f"trace_{name}.json" if args.trace else None
    kernels = profile_steps(step, window[:args.profile_steps], device, sync, trace)
    write_profile(out_dir / f"profile_{name}.txt", row, kernels, args.profile_steps)
    row["profile"] = kernels
    return kernels


def add_ratios(rows: list[dict]) -> None:
    """``ratio`` against the compiled transformers row (the baseline), ``ratio_vs_eager`` against the eager one."""
    compiled = next(r for r in rows if r["role"] == HF_COMPILED)["tokens_per_s"]
    eager = next(r for r in rows if r["role"] == HF_EAGER)["tokens_per_s"]
    for row in rows:
        row.update(ratio=row["tokens_per_s"] / compiled, ratio_vs_eager=row["tokens_per_s"] / eager,
                   baseline=row["role"] == HF_COMPILED)


def _fastest_ours(rows: list[dict]) -> dict | None:
    ours = [r for r in rows if r["role"] == OURS]
    return max(ours, key=lambda r: r["tokens_per_s"]) if ours else None


def _print(rows: list[dict], max_length: int, batch_size: int) -> None:
    print(f"\nseq {max_length}, micro-batch {batch_size}")
    print(f"{'system':<80} {'tok/s':>10} {'×HFc':>6} {'×HFe':>6} {'MFU':>6} {'pad':>6} {'GiB':>6} {'graphs':>6}")
    for r in rows:
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        print(f"{r['system']:<80} {r['tokens_per_s']:>10,.0f} {r['ratio']:>6.2f} {r['ratio_vs_eager']:>6.2f} {mfu:>6} "
              f"{r['padding_fraction']:>6.1%} {r['peak_memory_gib']:>6.2f} {r['graphs_compiled_in_window']:>6}")
    baseline = next(r for r in rows if r["baseline"])
    print(f"baseline (×HFc = 1.00): {baseline['system']}; ×HFe: against the eager row; "
          f"graphs: torch.compile graphs compiled inside the timed window (0 when the warm-up covered them)")


if __name__ == "__main__":
    main()
