#!/usr/bin/env python
"""ALUM step cost: an adversarial pretraining step against a standard one, same weights, same batches.

    python benchmarks/bench_adversarial.py [--model bert-small] [--batch 8] [--seq 128] [--steps 6] [--adv-steps 1]

Baseline: :class:`pretrain.modeling.PretrainingModel` forward + backward (MLM + NSP). Ours:
:class:`pretrain.adversarial.AdversarialPretrainingModel` wrapping the same ``BertForPreTraining``
(ALUM defaults: K ascent steps, α = 10, ε = 1e-5 L∞), forward + backward of the combined loss.
Both run in training mode (dropout on) on identical masked batches; the two are interleaved batch
by batch so that machine-load drift hits both alike, and the first two batches are warm-up.
Reports seconds per step, the time ratio (ALUM / standard) and the term's statistics. Counting a
forward pass as 1 and a backward as 2: standard = 3; each ascent step adds a forward plus a
backward that computes input gradients only (≈ 1), the final term a forward and a full backward
(3); so ALUM ≈ (6 + 2K) / 3 standard steps: ≈ 2.7 for K = 1.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from _batches import synthetic_pretraining_batches  # benchmarks/ is on sys.path when a benchmark runs
from _results import write_results

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bert-small")
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per side (after 2 warm-up steps)")
    parser.add_argument("--adv-steps", type=int, default=1, help="ALUM ascent steps K")
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "adversarial.json"))
    args = parser.parse_args()

    from biomed_lm.pretrain.adversarial import AdversarialConfig, AdversarialPretrainingModel
    from biomed_lm.pretrain.config import load_model_preset
    from biomed_lm.pretrain.modeling import PretrainingModel, build_bert

    torch.manual_seed(0)
    bert = build_bert(load_model_preset(args.model), vocab_size=args.vocab_size, pad_token_id=0)
    standard = PretrainingModel(bert).train()
    adversarial = AdversarialPretrainingModel(
        bert, adversarial=AdversarialConfig(adversarial=True, adv_steps=args.adv_steps)).train()
    batches = synthetic_pretraining_batches(args.steps + 2, args.batch, args.seq, args.vocab_size)

    def timed(model, batch) -> tuple[float, object]:
        start = time.perf_counter()
        out = model(**batch)
        out.loss.backward()
        elapsed = time.perf_counter() - start
        bert.zero_grad(set_to_none=True)
        return elapsed, out

    times: dict[str, list[float]] = {"standard": [], "alum": []}
    stats = []
    for i, batch in enumerate(batches):
        seconds, _ = timed(standard, batch)
        alum_seconds, out = timed(adversarial, batch)
        if i >= 2:  # warm-up
            times["standard"].append(seconds)
            times["alum"].append(alum_seconds)
            stats.append({"adv_kl": out.adv_kl.item(), "adv_loss": out.adv_loss.item(),
                          "mlm_loss": out.mlm_loss.item(), "nonfinite": int(out.adv_nonfinite)})
    results = {name: {"median_s": statistics.median(t), "best_s": min(t),
                      "tokens_per_s": args.batch * args.seq / statistics.median(t)} for name, t in times.items()}
    ratio = results["alum"]["median_s"] / results["standard"]["median_s"]
    for name, label in (("standard", "standard step (PretrainingModel)"),
                        ("alum", f"ALUM step (K={args.adv_steps}, AdversarialPretrainingModel)")):
        r = results[name]
        print(f"{label:<48} median {r['median_s']:.3f} s/step  best {r['best_s']:.3f}  "
              f"{r['tokens_per_s']:,.0f} tokens/s", flush=True)
    print(f"ratio (ALUM / standard forward+backward time): x{ratio:.2f} ({args.model}, batch {args.batch} x "
          f"{args.seq}, vocab {args.vocab_size}, {torch.get_num_threads()} threads, CPU); "
          f"mean adversarial KL {statistics.mean(s['adv_kl'] for s in stats):.2e}")
    write_results(args.output, {"args": vars(args), "threads": torch.get_num_threads(), "torch": torch.__version__,
                                "results": results, "ratio": ratio, "adversarial_stats": stats})


if __name__ == "__main__":
    main()
