#!/usr/bin/env python
"""Time per optimizer step on CPU: our LAMB against torch's AdamW, in one run, on BERT's parameters.

    python benchmarks/bench_optim.py [--model base|small] [--repeats 15] [--threads N]

The parameter set is a real ``transformers.BertForPreTraining`` (bert-base: 110M parameters in
206 tensors, vocabulary 30,522; ``small``: BERT-small, 4 layers of 512), split by
:func:`biomed_lm.optim.parameter_groups` into the weight-decay and no-decay groups the trainer uses,
with fixed random gradients. Every optimizer steps the same parameters; one warm-up step each
allocates the state, then the timed steps run round-robin, so drift in machine speed (this is a
shared 2-core machine) hits every method alike. Methods:

* ``adamw_foreach`` (baseline): ``torch.optim.AdamW(foreach=True)``;
* ``adamw_fused``: ``torch.optim.AdamW(fused=True)``, what ``build_optimizer("adamw")`` picks on CPU;
* ``lamb``: ours, :class:`biomed_lm.optim.Lamb` as ``build_optimizer("lamb")`` builds it on CPU
  (fused-Adam kernel, global-norm pre-normalization at 1.0, apex defaults);
* ``lamb_no_prenorm``: the same with ``max_grad_norm=None`` (the cost of the global norm);
* ``lamb_foreach``: ours with ``fused=False`` (the fallback kernel for devices without fused Adam).

Reports the median and best seconds per step, parameters per second and the ratio of each method's
median to the baseline's (below 1 is faster). Results go to ``benchmarks/results/optim.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from _results import write_results  # benchmarks/ is on sys.path when a benchmark runs

REPO = Path(__file__).resolve().parents[1]
BASELINE = "adamw_foreach"
MODELS = {
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "small": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048),
}


def bert_parameter_groups(model_name: str, seed: int) -> tuple[list[dict], int]:
    from transformers import BertConfig, BertForPreTraining

    from biomed_lm.optim import parameter_groups

    torch.manual_seed(seed)
    model = BertForPreTraining(BertConfig(vocab_size=30522, max_position_embeddings=512, **MODELS[model_name]))
    groups = parameter_groups(model, 0.01)
    generator = torch.Generator().manual_seed(seed)
    for group in groups:
        for p in group["params"]:
            p.grad = torch.randn(p.shape, generator=generator) * 1e-3
    return groups, sum(p.numel() for g in groups for p in g["params"])


def optimizers(groups: list[dict]) -> dict[str, Callable[[], torch.optim.Optimizer]]:
    from biomed_lm.optim import PAPER_BETAS, PAPER_EPS, Lamb, build_optimizer

    def fresh() -> list[dict]:
        return [{**g, "params": list(g["params"])} for g in groups]

    return {
        BASELINE: lambda: torch.optim.AdamW(fresh(), lr=6e-4, betas=PAPER_BETAS, eps=PAPER_EPS, foreach=True),
        "adamw_fused": lambda: build_optimizer("adamw", fresh(), lr=6e-4, device="cpu").optimizer,
        "lamb": lambda: build_optimizer("lamb", fresh(), lr=6e-3, device="cpu").optimizer,
        "lamb_no_prenorm": lambda: Lamb(fresh(), lr=6e-3, max_grad_norm=None),
        "lamb_foreach": lambda: Lamb(fresh(), lr=6e-3, fused=False),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=list(MODELS), default="base")
    parser.add_argument("--repeats", type=int, default=15, help="timed steps per method")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--methods", nargs="+", default=None, help="subset of the methods (the baseline is added)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "optim.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    groups, n_params = bert_parameter_groups(args.model, args.seed)
    builders = optimizers(groups)
    methods = list(builders) if args.methods is None else [BASELINE] + [m for m in args.methods if m != BASELINE]
    unknown = sorted(set(methods) - set(builders))
    if unknown:
        print(f"bench_optim: error: unknown methods {unknown}; choose from {list(builders)}", file=sys.stderr)
        return 2

    load_before = os.getloadavg()
    built = {m: builders[m]() for m in methods}
    for optimizer in built.values():  # warm-up: allocates the moments
        optimizer.step()
    times: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(args.repeats):
        for method in methods:
            start = time.perf_counter()
            built[method].step()
            times[method].append(time.perf_counter() - start)
    load_after = os.getloadavg()

    baseline_median = statistics.median(times[BASELINE])
    rows = []
    for method in methods:
        median, best = statistics.median(times[method]), min(times[method])
        rows.append({"method": method, "role": "baseline" if method == BASELINE else "ours",
                     "class": type(built[method]).__name__, "seconds_median": median, "seconds_best": best,
                     "seconds_all": times[method], "params_per_s": n_params / median,
                     "ratio_median_vs_baseline": median / baseline_median,
                     "ratio_best_vs_baseline": best / min(times[BASELINE])})

    print(f"BERT-{args.model}: {n_params:,} parameters in {sum(len(g['params']) for g in groups)} tensors; "
          f"{args.repeats} timed steps per method, round-robin; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs; load average {load_before[0]:.2f} -> "
          f"{load_after[0]:.2f}")
    print(f"{'method':<16} {'median s':>9} {'best s':>8} {'Mparam/s':>9} {'ratio (median)':>15} {'ratio (best)':>13}")
    for r in rows:
        print(f"{r['method']:<16} {r['seconds_median']:9.4f} {r['seconds_best']:8.4f} {r['params_per_s'] / 1e6:9.1f} "
              f"{r['ratio_median_vs_baseline']:15.2f} {r['ratio_best_vs_baseline']:13.2f}")
    result = {"model": f"bert-{args.model}", "parameters": n_params, "repeats": args.repeats,
              "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
              "torch": torch.__version__, "load_average_before": load_before[0], "load_average_after": load_after[0],
              "baseline": BASELINE, "results": rows}
    write_results(args.output, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
