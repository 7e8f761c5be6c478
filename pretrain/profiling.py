"""Where a step's device time goes: torch.profiler's kernels summarized as the benchmarks and a run
report them.

:func:`top_kernels` ranks the kernels by self device time with each one's share of the profiled
wall time; :func:`kernel_totals` gives the device's busy share (well under 1 where the host's
launches set the pace), the launches a step makes and, on a GPU, the share of each kind of work
(GEMMs, attention, inductor's fused elementwise kernels, the optimizer, copies).
``benchmarks/bench_gpu.py --profile`` writes them per system; ``launch/pretrain.py --profile-steps N``
(:class:`StepProfiler`) over N optimizer steps of a real run, so a run slower than the bench can be
read against the bench's profile.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import torch

KEEP = 30  # kernels kept per profile; the benchmarks print the top 10


def self_microseconds(event: Any, on_device: bool) -> float:
    """A kernel's (or copy's) self CUDA time on a GPU: the ops that launched it and the record_function
    ranges mirrored on the GPU count 0, they would count the same time twice; on a CPU each op's self
    CPU time (self times of nested ops do not overlap)."""
    from torch.autograd import DeviceType

    if on_device:
        kernel = event.device_type == DeviceType.CUDA and not getattr(event, "is_user_annotation", False)
        return event.self_device_time_total if kernel else 0.0
    return event.self_cpu_time_total if event.device_type == DeviceType.CPU else 0.0


# What a GPU kernel's name says it is, first match wins: cuBLAS(Lt)'s nvjet/cutlass/gemm kernels and
# their split-K reductions; the attention kernels (PyTorch's flash and memory-efficient ones, cuDNN's,
# flash-attn's, FlexAttention's triton kernels); the optimizer's and the gradient norm's multi-tensor
# kernels; copies and fills.
CATEGORIES = (
    ("attention", re.compile(r"flash|fmha|attention|sdpa|triton_tem_fused_flex|mem_eff|cudnn", re.IGNORECASE)),
    ("gemm", re.compile(r"nvjet|gemm|cutlass|cublas|splitKreduce|sm90_xmma|ampere_.*_tensorop", re.IGNORECASE)),
    ("optimizer and gradient norms", re.compile(r"multi_tensor_apply|Adam|Lamb", re.IGNORECASE)),
    ("memory", re.compile(r"Memcpy|Memset|copy_kernel|FillFunctor", re.IGNORECASE)),
    ("fused elementwise (triton)", re.compile(r"^triton_")),
)
OTHER = "other"


def category(name: str) -> str:
    """The kind of work a kernel does (:data:`CATEGORIES`), from its name; ``other`` when none says."""
    return next((kind for kind, pattern in CATEGORIES if pattern.search(name)), OTHER)


def kernel_totals(averages: Any, seconds: float, steps: int, on_device: bool) -> dict[str, Any]:
    """Every kernel together: ``busy_share``, their self time over the profiled wall time;
    ``kernels_per_step``, the launches a step makes (what CUDA graphs replay as one); and
    ``categories``, on a GPU each kind's share of the wall time (:func:`category`; a CPU's ops are not
    kernels and are not sorted)."""
    timed = [(self_microseconds(event, on_device), event) for event in averages]
    shares: dict[str, float] = {}
    for microseconds, event in timed:
        if microseconds > 0 and on_device:
            kind = category(event.key)
            shares[kind] = shares.get(kind, 0.0) + microseconds / (seconds * 1e6)
    return {"busy_share": sum(us for us, _ in timed) / (seconds * 1e6),
            "kernels_per_step": sum(event.count for us, event in timed if us > 0) / max(steps, 1),
            "categories": dict(sorted(shares.items(), key=lambda item: -item[1]))}


def top_kernels(averages: Any, seconds: float, on_device: bool, keep: int = KEEP) -> list[dict[str, Any]]:
    """The ``keep`` kernels (on a CPU, ops) with the most self time (:func:`self_microseconds`)."""
    timed = sorted(((self_microseconds(event, on_device), event) for event in averages), key=lambda pair: -pair[0])
    return [{"name": event.key, "share": microseconds / (seconds * 1e6), "calls": event.count}
            for microseconds, event in timed[:keep] if microseconds > 0]


def totals_line(totals: dict[str, Any]) -> str:
    kinds = ", ".join(f"{kind} {share:.1%}" for kind, share in totals.get("categories", {}).items())
    return (f"all kernels: {totals['busy_share']:.1%} of the wall time busy, {totals['kernels_per_step']:,.0f} "
            "launches a step" + (f" ({kinds})" if kinds else ""))


def profile_text(title: str, kernels: list[dict[str, Any]], totals: dict[str, Any], steps: int) -> str:
    """The report: a title line, :func:`totals_line`, then one line per kernel (share, calls, name)."""
    lines = [f"{title}: top {len(kernels)} kernels by self device time over {steps} profiled steps "
             f"({sum(k['share'] for k in kernels):.1%} of their wall time)",
             totals_line(totals), f"{'share':>7} {'calls':>7}  name"]
    lines += [f"{k['share']:>7.2%} {k['calls']:>7}  {k['name']}" for k in kernels]
    return "\n".join(lines) + "\n"


class StepProfiler:
    """torch.profiler over optimizer steps ``after``+1 .. ``after``+``steps`` of a run (0 steps: off).

    The loop calls :meth:`before_step` with the steps done and :meth:`after_step` with the steps done
    once the step is queued. The device is synchronized at the window's two ends only (its wall time
    is the shares' denominator), so inside it the host runs ahead as in any other step; at its end
    ``profile.txt`` (:func:`profile_text`) and ``profile_trace.json`` (Chrome's trace viewer) are
    written to ``out_dir``."""

    def __init__(self, steps: int, after: int, out_dir: Path, device: torch.device, title: str) -> None:
        self.first, self.last = after + 1, after + steps
        self.out_dir, self.device, self.title = out_dir, device, title
        self._profiler: Any = None
        self._started = 0.0

    @property
    def on(self) -> bool:
        return self.last >= self.first

    def before_step(self, done: int) -> None:
        if self.on and done + 1 == self.first:
            from torch.profiler import ProfilerActivity, profile

            on_device = self.device.type == "cuda"
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
            self._synchronize()
            self._profiler = profile(activities=activities)
            self._profiler.__enter__()
            self._started = time.perf_counter()

    def after_step(self, done: int) -> Path | None:
        """At the window's last step: stop, write the report and the trace; the report's path."""
        if self._profiler is None or done != self.last:
            return None
        self._synchronize()
        seconds = time.perf_counter() - self._started
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        on_device, steps = self.device.type == "cuda", self.last - self.first + 1
        averages = profiler.key_averages()
        report = self.out_dir / "profile.txt"
        report.write_text(profile_text(f"{self.title}, steps {self.first}-{self.last}",
                                       top_kernels(averages, seconds, on_device),
                                       kernel_totals(averages, seconds, steps, on_device), steps), encoding="utf-8")
        profiler.export_chrome_trace(str(self.out_dir / "profile_trace.json"))
        return report

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
