#!/usr/bin/env python
"""Pretraining step throughput on a GPU: ours (unpadded, each attention kernel, compiled, fused
AdamW) against transformers' ``BertForPreTraining`` as a user would run it (SDPA, padded, full MLM
head, fused AdamW), both under bf16 autocast on the same batches.

    python benchmarks/bench_gpu.py                      # BERT-base, seq 128 and 512, on cuda
    python benchmarks/bench_gpu.py --device cpu --quick # the same code on a tiny model (tests run this)

Batches: BERT's length mix — each sequence is full length with probability 0.5 (instances fill up
to the target), otherwise uniform between 8 and the maximum (short_seq_prob, document ends) — or
the real lengths of instances made by ``launch/create_pretraining_data.py`` (``--instances DIR``).
Reported per system: real (non-pad) tokens/s, step time, MFU (model FLOPs of the real tokens:
``pretrain.flops.step_flops`` ÷ the device's dense peak), peak memory, padding share of the
positions computed, and the ratio to transformers'. From our best tokens/s the GPU-hours of the
paper's budget (62,500 steps × 8,192 × 128 tokens ≈ 65.5B) on this device.
"""

from __future__ import annotations

import argparse
import copy
import resource
import statistics
import time
from pathlib import Path

import torch
from _results import write_results  # benchmarks/ is on sys.path when a benchmark runs

REPO = Path(__file__).resolve().parents[1]
PAPER_TOKENS = 62_500 * 8_192 * 128
VOCAB, CLS, SEP, MASK = 30522, 101, 102, 103


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


def run_system(name: str, model, loss_fn, batches: list[dict], device: torch.device, dtype, config,
               computed_positions) -> dict:
    """Time ``steps`` optimizer steps after two warm-up steps; counts only real tokens."""
    from biomed_lm.pretrain.flops import peak_flops, step_flops
    from biomed_lm.pretrain.optim import build_optimizer

    optimizer = build_optimizer("adamw", model.parameters(), lr=1e-4, device=device)
    times, flops, tokens, positions = [], 0.0, 0, 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for index, batch in enumerate(batches):
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        _sync(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = loss_fn(model, batch)
        loss.backward()
        optimizer.optimizer.step()
        optimizer.optimizer.zero_grad(set_to_none=True)
        _sync(device)
        if index >= 2:  # warm-up: compilation, allocator, kernel selection
            times.append(time.perf_counter() - start)
            lengths = batch["attention_mask"].sum(1).tolist()
            tokens += sum(lengths)
            positions += computed_positions(batch)
            flops += step_flops(config, lengths, int((batch["labels"] != -100).sum()), len(lengths))
    seconds = sum(times)
    peak = peak_flops("bf16" if dtype == torch.bfloat16 else "fp32", device)
    return {"system": name, "optimizer": optimizer.implementation, "tokens_per_s": tokens / seconds,
            "step_seconds": statistics.median(times), "mfu": flops / seconds / peak if peak else None,
            "padding_fraction": 1 - tokens / positions, "peak_memory_gib": _peak_memory(device)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_memory(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # process peak RSS (KiB -> GiB)


def hf_inputs(family, batch: dict) -> dict:
    """The batch as the family's transformers class takes it (token types, its pair label's name)."""
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "labels")}
    if family.token_types:
        inputs["token_type_ids"] = batch["token_type_ids"]
    if family.pair_label_argument:
        inputs[family.pair_label_argument] = batch["next_sentence_label"]
    return inputs


def systems(bert, device: torch.device, dtype, compile_: bool, bucket: int, kernels: list[str] | None = None):
    """(name, model, loss function, computed positions) for transformers' recipe and each of our kernels
    (a family without the unpadded path: ours is its padded forward with the MLM head on masked positions)."""
    from biomed_lm.pretrain.attention import KERNELS, why_not
    from biomed_lm.pretrain.compiling import compile_dense_blocks
    from biomed_lm.pretrain.families import family_of
    from biomed_lm.pretrain.modeling import PretrainingModel

    family = family_of(bert.config)
    hf = copy.deepcopy(bert)
    yield (f"transformers {family.model_class} (SDPA, padded, full MLM head)", hf,
           lambda model, batch: model(**hf_inputs(family, batch)).loss, lambda batch: batch["input_ids"].numel())
    if not family.unpadded:
        yield ("ours [hf_sdpa, padded, MLM head on masked positions]", PretrainingModel(
            copy.deepcopy(bert), nsp=family.pair_head is not None, attention="hf_sdpa"),
            lambda model, batch: model(**batch).loss, lambda batch: batch["input_ids"].numel())
        return
    dropout = float(bert.config.attention_probs_dropout_prob)
    for kernel in KERNELS:
        reason = why_not(kernel, device, dtype, dropout)
        if kernels is not None and kernel not in kernels:
            continue
        if reason is not None or (device.type == "cpu" and kernel != "sdpa_loop"):
            print(f"ours [{kernel}]: skipped ({reason or 'slow on cpu'})")
            continue
        ours = PretrainingModel(copy.deepcopy(bert), attention=kernel, pad_to_multiple_of=bucket if compile_ else None)
        if compile_:
            compile_dense_blocks(ours.bert)
        yield (f"ours [{kernel}{', compiled' if compile_ else ''}]", ours,
               lambda model, batch: model(**batch).loss, _unpadded_positions(bucket if compile_ else 1))


def _unpadded_positions(bucket: int):
    def positions(batch) -> int:
        real = int(batch["attention_mask"].sum())
        return -(-real // bucket) * bucket
    return positions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default=None, help="a model preset (default: the family's base size)")
    parser.add_argument("--architecture", default="bert", help="the model family: bert, albert or roberta")
    parser.add_argument("--seq-lengths", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch", type=int, nargs="+", default=[256, 64], help="micro-batch per length")
    parser.add_argument("--steps", type=int, default=12, help="timed steps (after 2 warm-up steps)")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default=None, help="default: bf16 on cuda")
    parser.add_argument("--compile", choices=("on", "off"), default=None, help="default: on for cuda")
    parser.add_argument("--bucket-tokens", type=int, default=128)
    parser.add_argument("--attention-dropout", type=float, default=None,
                        help="override the preset's attention_probs_dropout_prob (0 lets the kernels without "
                             "dropout run, as MosaicBERT and ModernBERT train)")
    parser.add_argument("--kernels", nargs="+", default=None, help="only these of our kernels (default: each that runs)")
    parser.add_argument("--instances", default=None, help="real instances (their lengths) instead of the mix")
    parser.add_argument("--quick", action="store_true", help="bert-tiny, 2 timed steps, batch 4: a smoke test")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "gpu.json"))
    args = parser.parse_args()
    from biomed_lm.pretrain.families import get_family

    family = get_family(args.architecture)
    args.model = args.model or family.default_preset
    if args.quick:  # the family's tiny preset where there is one (RoBERTa's layout takes BERT's presets)
        tiny = f"{family.name}-tiny"
        args.model = tiny if (REPO / "configs" / "model" / f"{tiny}.yaml").is_file() else "bert-tiny"
        args.steps, args.batch = 2, [4] * len(args.seq_lengths)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if (args.precision or ("bf16" if device.type == "cuda" else "fp32")) == "bf16" \
        else torch.float32
    compile_ = (args.compile or ("on" if device.type == "cuda" else "off")) == "on"

    from biomed_lm.pretrain.config import load_model_preset

    print(f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, model {args.model}, "
          f"{dtype}, compile {compile_}")
    results = []
    for max_length, batch_size in zip(args.seq_lengths, args.batch):
        torch.manual_seed(0)
        preset = load_model_preset(args.model)
        if args.attention_dropout is not None:
            preset = {**preset, "attention_probs_dropout_prob": args.attention_dropout}
        bert = family.build(family.preset_fields(preset, args.model), VOCAB, 0).to(device)
        count = (args.steps + 2) * batch_size
        generator = torch.Generator().manual_seed(max_length)
        lengths = real_lengths(args.instances, max_length)[:count] if args.instances \
            else length_mix(count, max_length, generator)
        batches = make_batches(lengths, batch_size, args.steps + 2, seed=max_length)
        rows = [run_system(name, model, loss_fn, batches, device, dtype, bert.config, positions)
                for name, model, loss_fn, positions in systems(bert, device, dtype, compile_, args.bucket_tokens,
                                                               args.kernels)]
        baseline = rows[0]["tokens_per_s"]
        for row in rows:
            row.update(seq=max_length, batch=batch_size, ratio=row["tokens_per_s"] / baseline)
        results += rows
        _print(rows, max_length, batch_size)
    best = max(results, key=lambda r: r["tokens_per_s"] if r["seq"] == min(args.seq_lengths) else 0)
    hours = PAPER_TOKENS / best["tokens_per_s"] / 3600
    print(f"paper budget (65.5B tokens at seq {best['seq']}) with {best['system']}: {hours:,.0f} device-hours here")
    write_results(args.out, {"device": str(device), "architecture": family.name, "model": args.model,
                             "dtype": str(dtype), "compile": compile_ and family.unpadded,
                             "attention_dropout": float(bert.config.attention_probs_dropout_prob),
                             "results": results, "paper_budget_device_hours": hours})


def _print(rows: list[dict], max_length: int, batch_size: int) -> None:
    print(f"\nseq {max_length}, micro-batch {batch_size}")
    print(f"{'system':<66} {'tok/s':>10} {'×HF':>6} {'MFU':>6} {'pad':>6} {'GiB':>6}")
    for r in rows:
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        print(f"{r['system']:<66} {r['tokens_per_s']:>10,.0f} {r['ratio']:>6.2f} {mfu:>6} "
              f"{r['padding_fraction']:>6.1%} {r['peak_memory_gib']:>6.2f}")


if __name__ == "__main__":
    main()
