#!/usr/bin/env python
"""Run every benchmark in this folder (``bench_*.py``), one after another, with default settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


#: Benchmarks of a GPU (gpu_check.sh runs them there): skipped where torch sees no CUDA device.
GPU_ONLY = ("bench_gpu.py",)


def main() -> int:
    import torch

    failed = []
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"\n=== {script.name} ===", flush=True)
        if script.name in GPU_ONLY and not torch.cuda.is_available():
            print(f"skipped: {script.name} measures a GPU and there is none (benchmarks/gpu_check.sh runs it)")
            continue
        code = subprocess.run([sys.executable, str(script)], cwd=HERE.parent).returncode
        if code:  # a signal (the OOM killer's 9) is not an ordinary failure
            failed.append(f"{script.name} ({f'killed by signal {-code}' if code < 0 else f'exit {code}'})")
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
