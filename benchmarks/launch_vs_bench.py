#!/usr/bin/env python
"""launch/pretrain.py's logged throughput against bench_gpu.py's for the same model, shapes and data.

    python benchmarks/launch_vs_bench.py RUN/metrics.jsonl bench.json [--skip 10] [--system "ours [sdpa_padded"]

The run's figure is its real tokens over its step seconds for the steps after ``--skip`` (compilation,
the allocator and the loader's start-up come first); the bench's is the first "ours" row whose
name starts with ``--system`` (default: the fastest ours row). The goal: the run keeps
at least 95% of the bench's pace. Prints one line and writes ``--out`` as JSON. Where the bench's result is
missing (a call on a fresh machine, whose bert stage ran in an earlier call), the run's pace is still written,
with ``ratio`` null and why.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GOAL = 0.95


def run_pace(metrics: Path, skip: int) -> dict:
    """Real tokens per second of the steps after ``skip``, from a run's metrics.jsonl."""
    records = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
    steps = [r for r in records if r.get("step", 0) > skip and r.get("step_seconds")]
    if not steps:
        raise SystemExit(f"{metrics}: no logged step after step {skip} (log more often: --log-every)")
    seconds = sum(r["step_seconds"] for r in steps)
    tokens = sum(r["tokens_per_s"] * r["step_seconds"] for r in steps)
    mfus = [r["mfu"] for r in steps if r.get("mfu") is not None]
    pace = {"steps": len(steps), "first_step": steps[0]["step"], "tokens_per_s": tokens / seconds,
            "mfu": sum(mfus) / len(mfus) if mfus else None}
    counted = [r for r in records if r.get("step", 0) <= skip and "cuda_alloc_retries" in r][-1:] + \
        [r for r in steps if "cuda_alloc_retries" in r]
    if len(counted) > 1:  # the CUDA allocator's counters (cumulative) grew by this over the timed steps
        for key in ("cuda_alloc_retries", "cuda_mallocs"):
            pace[f"{key}_in_window"] = counted[-1][key] - counted[0][key]
    return pace


def bench_pace(bench: Path, system: str | None) -> dict | str:
    """The bench's "ours" row: the one whose name starts with ``system``, else the fastest; or why there is none
    (a bench cut before that row, or the row failed)."""
    rows = [r for r in json.loads(bench.read_text(encoding="utf-8"))["results"] if r.get("role") == "ours"]
    if system:
        rows = [r for r in rows if r["system"].startswith(system)]
    if not rows:
        return f"{bench}: no 'ours' row{f' named {system!r}…' if system else ''} to compare with"
    best = max(rows, key=lambda r: r["tokens_per_s"])
    return {"system": best["system"], "tokens_per_s": best["tokens_per_s"], "mfu": best.get("mfu"),
            "seq": best.get("seq"), "batch": best.get("batch")}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", type=Path)
    parser.add_argument("bench", type=Path)
    parser.add_argument("--skip", type=int, default=10, help="steps left out at the start of the run")
    parser.add_argument("--system", default=None, help="the bench row's name prefix (default: fastest ours)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    run = run_pace(args.metrics, args.skip)
    bench = bench_pace(args.bench, args.system) if args.bench.is_file() else (
        f"{args.bench} missing: no bench row to compare with (carry bert128.json and pass BENCH_JSON)")
    if isinstance(bench, str):  # the run's own pace still counts (and its MFU, for the recipes' costs)
        print(f"launch/pretrain.py {run['tokens_per_s']:,.0f} real tokens/s (steps {run['first_step']}+); {bench}")
        return _written(args.out, {"run": run, "bench": None, "ratio": None, "goal": GOAL, "met": None, "why": bench,
                                   "bench_file": str(args.bench)})
    ratio = run["tokens_per_s"] / bench["tokens_per_s"]
    result = {"run": run, "bench": bench, "ratio": ratio, "goal": GOAL, "met": ratio >= GOAL,
              "bench_file": str(args.bench)}
    print(f"launch/pretrain.py {run['tokens_per_s']:,.0f} real tokens/s (steps {run['first_step']}+) vs "
          f"{bench['system']} {bench['tokens_per_s']:,.0f}: ×{ratio:.3f} (goal ≥ {GOAL})")
    return _written(args.out, result)


def _written(out: Path | None, result: dict) -> dict:
    if out:
        out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
