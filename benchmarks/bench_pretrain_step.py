#!/usr/bin/env python
"""Pretraining step benchmark: the masked-positions-only MLM head against the full head.

    python benchmarks/bench_pretrain_step.py [--model bert-small] [--batch 16] [--seq 128] [--steps 10]

Both sides are the same ``BertForPreTraining`` weights and the same masked batches (15% of the
tokens, whole-word masking). Baseline: ``BertForPreTraining(**batch).loss``, which projects every
position onto the vocabulary. Ours: :class:`pretrain.modeling.PretrainingModel`, which gathers
the masked positions first. Reports forward+backward seconds per step, tokens/s and the ratio,
and checks that the two losses agree.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from _batches import synthetic_pretraining_batches  # benchmarks/ is on sys.path
from _results import write_results  # benchmarks/ is on sys.path when a benchmark runs

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bert-small")
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "pretrain_step.json"))
    args = parser.parse_args()

    from biomed_lm.pretrain.config import load_model_preset
    from biomed_lm.pretrain.modeling import PretrainingModel, build_bert

    torch.manual_seed(0)
    bert = build_bert(load_model_preset(args.model), vocab_size=args.vocab_size, pad_token_id=0)
    ours = PretrainingModel(bert)
    batches = synthetic_pretraining_batches(args.steps + 2, args.batch, args.seq, args.vocab_size)

    def full_head(batch):
        return bert(**batch).loss

    def sparse_head(batch):
        return ours(**batch).loss

    bert.eval()  # dropout off, so the two losses can be compared exactly
    with torch.no_grad():
        diff = max(abs(full_head(b).item() - sparse_head(b).item()) for b in batches[:2])
    bert.train()
    methods = {"full MLM head (HF BertForPreTraining)": full_head, "masked positions only (ours)": sparse_head}
    times: dict[str, list[float]] = {name: [] for name in methods}
    for i, batch in enumerate(batches):  # the two alternate step by step: a change of load hits both alike (QA)
        for name, step in methods.items():
            start = time.perf_counter()
            loss = step(batch)
            loss.backward()
            bert.zero_grad(set_to_none=True)
            if i >= 2:  # warm-up
                times[name].append(time.perf_counter() - start)
    results = {}
    for name in methods:
        results[name] = {"median_s": statistics.median(times[name]), "best_s": min(times[name]),
                         "tokens_per_s": args.batch * args.seq / statistics.median(times[name])}
        print(f"{name:<40} median {results[name]['median_s']:.3f} s/step  best {results[name]['best_s']:.3f}  "
              f"{results[name]['tokens_per_s']:,.0f} tokens/s", flush=True)
    base, mine = results.values()
    print(f"ratio (ours / baseline time): x{mine['median_s'] / base['median_s']:.2f}; "
          f"loss difference {diff:.2e} ({args.model}, batch {args.batch} x {args.seq}, vocab {args.vocab_size}, "
          f"{torch.get_num_threads()} threads)")
    write_results(args.output, {"args": vars(args), "results": results, "loss_difference": diff})


if __name__ == "__main__":
    main()
