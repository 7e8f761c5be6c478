"""ALUM's term under mixed precision: how much of it is δ and how much the matrix multiplies' rounding.

    python benchmarks/bench_adversarial_precision.py [--model bert-small] [--epsilons 1e-5 1e-4 1e-3]

The same weights (dropout off), batches and δ draws (seeded) in fp32 and under CPU autocast to bf16 and
fp16; per ε, the mean symmetric KL between the clean and the perturbed MLM logits and its ratio to the
fp32 one (the baseline, measured in the same run). Autocast keeps fp32 weights, so δ reaches the
embeddings whole (``delta_retained`` 1); what a low precision adds is rounding: each matrix multiply
rounds its input, and a δ smaller than that rounding moves a few inputs across a rounding step instead
of moving every input a little, so the term grows with the rounding, not with δ. A ratio near 1 means
the term is δ's; far above 1, mostly rounding noise. CPU autocast stands in for CUDA's: both round the
matrix multiplies' inputs to the same formats.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from _batches import synthetic_pretraining_batches  # benchmarks/ is on sys.path when a benchmark runs
from _results import write_results

REPO = Path(__file__).resolve().parents[1]
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def mean_kl(model, batches, dtype) -> tuple[float, float]:
    """The mean symmetric KL over the batches and the smallest share of δ retained, δ seeded per batch."""
    kls, retained = [], []
    for batch in batches:
        torch.manual_seed(1)  # the same δ draw in every precision
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = model(**batch)
        kls.append(float(out.adv_kl))
        retained.append(float(out.adv_delta_retained))
    return statistics.mean(kls), min(retained)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bert-small")
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1e-5, 1e-4, 1e-3])
    parser.add_argument("--precisions", nargs="+", choices=[p for p in DTYPES if p != "fp32"], default=["bf16", "fp16"])
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "adversarial_precision.json"))
    args = parser.parse_args(argv)

    from biomed_lm.pretrain.adversarial import AdversarialConfig, AdversarialPretrainingModel
    from biomed_lm.pretrain.config import load_model_preset
    from biomed_lm.pretrain.modeling import build_bert

    torch.manual_seed(0)
    bert = build_bert(load_model_preset(args.model), vocab_size=args.vocab_size, pad_token_id=0)
    for module in bert.modules():  # dropout would make the clean and perturbed passes differ by itself
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    batches = synthetic_pretraining_batches(args.batches, args.batch, args.seq, args.vocab_size)
    rows = []
    for epsilon in args.epsilons:
        model = AdversarialPretrainingModel(
            bert, adversarial=AdversarialConfig(adversarial=True, adv_epsilon=epsilon)).train()
        baseline, _ = mean_kl(model, batches, None)
        row = {"epsilon": epsilon, "fp32": {"kl": baseline}}
        for precision in args.precisions:
            kl, retained = mean_kl(model, batches, DTYPES[precision])
            row[precision] = {"kl": kl, "ratio_vs_fp32": kl / baseline, "delta_retained": retained}
        rows.append(row)
        print(f"epsilon {epsilon:g}: fp32 KL {baseline:.3e}; " + "; ".join(
            f"{p} KL {row[p]['kl']:.3e} (x{row[p]['ratio_vs_fp32']:.2f} of fp32, delta retained "
            f"{row[p]['delta_retained']:.2f})" for p in args.precisions), flush=True)
    result = {"model": args.model, "batch": args.batch, "seq": args.seq, "threads": torch.get_num_threads(),
              "rows": rows}
    write_results(args.output, result)
    return result


if __name__ == "__main__":
    main()
