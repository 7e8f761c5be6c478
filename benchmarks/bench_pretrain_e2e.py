#!/usr/bin/env python
"""End-to-end pretraining benchmark: our whole loop (``launch/pretrain.py``) against the recipe a
user would otherwise pick (``transformers.Trainer`` + ``BertForPreTraining`` + HF's MLM collator).

    python benchmarks/bench_pretrain_e2e.py [--seq-lengths 128 512] [--steps 20 10] [--quick]
                                            [--work-dir runs/bench/pretrain_e2e]

Inputs are the demo's (``configs/ablation/demo.yaml``): the embedded ``data/sample`` corpus, its
16,000-token in-domain vocabulary and BERT-recipe NSP instances at each length (real length
distribution, ``short_seq_prob`` 0.1), made once with the toolkit's own scripts and cached under
``--work-dir``. Model: all-MiniLM-L6-v2's shape (``configs/model/minilm-l6.yaml``) from scratch;
``--quick`` uses 2 layers × 64 hidden, 4 timed steps, 128 only (for the test).

Every system runs in its own fresh process on the CPU, fp32, ``--threads`` threads, one DataLoader
worker, the same optimizer steps (``--warmup-steps`` untimed, then ``--steps`` timed), batch 16 at
128 and 8 at 512, torch's fused AdamW (lr 6e-4, 10% linear warm-up, linear decay, weight decay 0.01,
eps 1e-6, clipping 1.0), and the *same instances in the same order* (our sampler's batch plan; HF
reads them with ``train_sampling_strategy="sequential"``), so both see exactly the same real tokens:

- ``ours``: ``launch/pretrain.py`` as a one-rank subprocess (RANK/WORLD_SIZE/MASTER_* set), with a
  generated YAML config; whole-word masking; one checkpoint at the last step and the final export.
- ``hf_whole_word``: ``DataCollatorForLanguageModeling(tokenizer, mlm_probability=MASK_RATE,
  whole_word_mask=True)`` (transformers 5 removed ``DataCollatorForWholeWordMask``). It finds words
  from ``offset_mapping``, which ``tokenizer.pad`` does not pad, so variable-length instances fail
  to collate; the one piece of glue here derives offsets from the instances' word starts and pads
  them with (0, 0). HF pads to the longest sequence of each batch.
- ``hf_token``: the same collator, token-level.

Reported per system: real (non-pad) tokens/s over the timed steps; wall time from the process start:
start-up (to the first step), warm-up steps, timed steps, checkpoint and export (ours: the step's
checkpoint and ``model/``; HF: its checkpoint save at the last step and ``trainer.save_model``), the
whole process; peak RSS; the final loss (MLM + NSP of the last step); the share of computed positions
that were padding. Ours is timed from outside: ``metrics.jsonl`` has no timestamps, so this script
notes when each line appears (polled every 10 ms) and reads checkpoint/export end times from file
mtimes; HF is timed by a ``TrainerCallback``. JSON goes to ``benchmarks/results/pretrain_e2e.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from _results import write_results  # benchmarks/ is on sys.path when a benchmark runs

REPO = Path(__file__).resolve().parents[1]
SAMPLE_DIR = REPO / "data" / "sample"
DEMO_ABLATION = REPO / "configs" / "ablation" / "demo.yaml"
SYSTEMS = ("ours", "hf_whole_word", "hf_token")
BASELINES = ("hf_whole_word", "hf_token")
DEFAULT_STEPS = {128: 20, 512: 10}
DEFAULT_BATCH = {128: 16, 512: 8}
MASK_RATE = 0.15  # both systems
QUICK_MODEL = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 256}
LEARNING_RATE, WEIGHT_DECAY, ADAM_EPSILON, MAX_GRAD_NORM, WARMUP_RATIO = 6e-4, 0.01, 1e-6, 1.0, 0.1
POLL_S = 0.01
DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


# ----------------------------------------------------------------------------- command line

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lengths", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--steps", type=int, nargs="+", default=None,
                        help="timed optimizer steps, one value or one per length (default 20 at 128, 10 at 512)")
    parser.add_argument("--warmup-steps", type=int, default=2, help="untimed steps before the timed ones")
    parser.add_argument("--batch-size", type=int, default=None, help="default 16 at ≤128 tokens, else 8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-workers", type=int, default=1, help="DataLoader workers, the same for every system")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--quick", action="store_true", help="2 layers × 64 hidden, 4 timed steps, 128 only")
    parser.add_argument("--work-dir", default=str(REPO / "runs" / "bench" / "pretrain_e2e"),
                        help="cached corpus, vocabulary and instances, and the run directories")
    parser.add_argument("--output", default=None, help="default benchmarks/results/pretrain_e2e[_quick].json")
    parser.add_argument("--hf-worker", default=None, help=argparse.SUPPRESS)  # internal: one HF run
    args = parser.parse_args(argv)
    return _resolve_args(parser, args)


def _resolve_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Fill the per-length defaults, so the rest of the script sees one steps value per length."""
    if args.quick:
        args.seq_lengths, args.steps = [128], args.steps or [4]
    steps = args.steps or [DEFAULT_STEPS.get(n, 10) for n in args.seq_lengths]
    if len(steps) == 1:
        steps = steps * len(args.seq_lengths)
    if len(steps) != len(args.seq_lengths) or min(steps) < 1 or args.warmup_steps < 1:
        parser.error("--steps takes one positive value or one per --seq-lengths entry; --warmup-steps ≥ 1")
    args.steps_by_length = dict(zip(args.seq_lengths, steps))
    name = "pretrain_e2e_quick.json" if args.quick else "pretrain_e2e.json"
    args.output = args.output or str(REPO / "benchmarks" / "results" / name)
    return args


def batch_size_for(args: argparse.Namespace, seq_length: int) -> int:
    """16 at 128 and 8 at 512 unless --batch-size says otherwise (CPU-sized batches for both phases)."""
    return args.batch_size or DEFAULT_BATCH.get(seq_length, 16 if seq_length <= 128 else 8)


# ----------------------------------------------------------------------------- inputs (cached)

def run_script(script: str, *flags: str) -> None:
    """One of the toolkit's entry scripts, as a user (and launch/demo.py) runs it."""
    command = [sys.executable, str(REPO / "launch" / script), *flags]
    print(f"$ {' '.join(command[1:])}", flush=True)
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{script} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def prepare_inputs(work: Path, seq_lengths: list[int]) -> dict[str, Path]:
    """The demo's corpus → vocabulary → instances (per length), built with the demo's own configs the
    first time and reused afterwards (the check is the file each step writes last)."""
    from biomed_lm.experiments.ablation import load_ablation_config

    demo = load_ablation_config(DEMO_ABLATION, {"output_dir": str(work)})
    corpus_name, corpus_config = next(iter(demo.corpora.items()))
    paths = {"corpus": work / "corpus" / corpus_name, "vocab": work / "vocab"}
    nproc = str(demo.num_proc)
    if not (paths["corpus"] / "state.json").is_file():
        run_script("prepare_corpus.py", "--config", corpus_config, "--output-dir", str(paths["corpus"]),
                   "--num-proc", nproc, "--overwrite")
    if not (paths["vocab"] / "vocab.txt").is_file():
        size = ["--vocab-size", str(demo.vocab_size)] if demo.vocab_size else []
        run_script("build_vocab.py", "--config", demo.vocab_config, "--inputs", str(paths["corpus"]), *size,
                   "--output-dir", str(paths["vocab"]), "--overwrite")
    for length in seq_lengths:
        paths[f"data-{length}"] = out = work / "data" / f"seq{length}"
        if not (out / "pretraining_data.json").is_file():
            run_script("create_pretraining_data.py", "--config", demo.pretrain.data_config, "--corpus",
                       str(paths["corpus"]), "--tokenizer", str(paths["vocab"]), "--output-dir", str(out),
                       "--max-seq-length", str(length), "--num-proc", nproc,
                       "--tokenized-cache", str(work / "data" / "tokenized"), "--overwrite")
    return paths


def model_preset(work: Path, quick: bool) -> str:
    """The preset name launch/pretrain.py takes; for --quick a YAML file of the shrunken MiniLM shape."""
    if not quick:
        return "minilm-l6"
    import yaml

    from biomed_lm.pretrain.config import load_model_preset

    path = work / "quick-model.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({**load_model_preset("minilm-l6"), **QUICK_MODEL}), encoding="utf-8")
    return str(path)


# ----------------------------------------------------------------------------- the batch plan

@dataclass
class Plan:
    """Which instances every step reads (our sampler's order, which HF is fed sequentially) and
    what HF's pad-to-longest makes of them, over the timed steps."""

    order: list[int]
    batch_size: int
    lengths: list[int]

    def batches(self, first: int, last: int) -> list[list[int]]:
        return [self.order[s * self.batch_size:(s + 1) * self.batch_size] for s in range(first, last)]

    def real_tokens(self, first: int, last: int) -> int:
        return sum(self.lengths[i] for batch in self.batches(first, last) for i in batch)

    def padded_positions(self, first: int, last: int) -> int:
        return sum(len(batch) * max(self.lengths[i] for i in batch) for batch in self.batches(first, last))

    def work_ratio(self, config: Any, first: int, last: int, mask_rate: float) -> float:
        """Model FLOPs HF's recipe computes over ours on the same steps (``pretrain.flops``): HF runs
        every padded position through the encoder, attention over each batch's longest length and
        the MLM head on every position; ours runs real tokens, each sequence's own length and the
        head on the masked tokens (``mask_rate`` of the real ones). The speed-up that doing less
        work alone allows, so the measured ratio has something to be read against."""
        from biomed_lm.pretrain.flops import step_flops_from_counts

        batches = self.batches(first, last)
        real = [self.lengths[i] for batch in batches for i in batch]
        longest = [max(self.lengths[i] for i in batch) for batch in batches]
        padded = sum(len(batch) * n for batch, n in zip(batches, longest))
        hf = step_flops_from_counts(config, padded, sum(len(b) * n * n for b, n in zip(batches, longest)),
                                    padded, len(real))
        ours = step_flops_from_counts(config, sum(real), sum(n * n for n in real), mask_rate * sum(real),
                                      len(real))
        return hf / ours


def make_plan(data_dir: Path, batch_size: int, total_steps: int, seed: int) -> Plan:
    """The order pretrain.sampler.BatchPlan gives one rank with no accumulation: what ours reads."""
    import datasets
    import pyarrow.compute as pc

    from biomed_lm.pretrain.sampler import BatchPlan

    dataset = datasets.load_from_disk(str(data_dir))
    lengths = pc.list_value_length(dataset.data.table.column("input_ids")).to_pylist()
    plan = BatchPlan(len(dataset), batch_size, 1, 1, 0, seed)
    order = [i for step in range(total_steps) for i in plan.micro_batches(step)[0]]
    return Plan(order=order, batch_size=batch_size, lengths=lengths)


# ----------------------------------------------------------------------------- processes

def base_env(threads: int) -> dict[str, str]:
    """CPU only, ``threads`` threads, no inherited rank variables. DeepSpeed JIT-builds its shared-memory
    op on the CPU; a benchmark-owned build folder keeps other virtualenvs' rebuilds out of start-up."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / "runs" / "bench" / "torch_extensions"))
    python_path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))  # the caller's kept
    return {**env, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
            "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": python_path}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def prime_deepspeed(env: dict[str, str], only_if_missing: bool) -> float:
    """Build (or load) DeepSpeed's CPU op once, untimed, so no run's start-up includes a compile
    (``only_if_missing``: skip when a build exists, to keep --quick short)."""
    built = Path(env["TORCH_EXTENSIONS_DIR"], "deepspeed_shm_comm")
    if only_if_missing and any(built.glob("*.so")):
        return 0.0
    started = time.perf_counter()
    code = ("from deepspeed.accelerator import get_accelerator\n"
            "b = get_accelerator().create_op_builder('ShareMemCommBuilder')\n"
            "b is None or b.load(verbose=False)\n")
    subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, check=True)
    return time.perf_counter() - started


@dataclass
class Finished:
    """A monitored process: when it started and ended (``time.time()``) and what it used."""

    returncode: int
    started: float
    ended: float
    max_rss_kib: int      # ru_maxrss from wait4: the process and the children it reaped (DataLoader workers)
    hwm_kib: int          # VmHWM of the process itself, last sample
    cpu_s: float          # its user + system CPU time, reaped children included
    machine_busy_s: float  # CPU time every process on the machine used meanwhile (/proc/stat)

    @property
    def others_cpu_share(self) -> float:
        """Share of the machine's CPU that other processes took during the run: a shared machine
        slows every system, and the table says how much of that there was."""
        wall = (self.ended - self.started) * (os.cpu_count() or 1)
        return max(0.0, self.machine_busy_s - self.cpu_s) / wall if wall > 0 else 0.0


def machine_busy_seconds() -> float:
    """CPU seconds all processes have used since boot (everything but idle and iowait in /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def read_hwm(pid: int) -> int:
    """VmHWM (KiB) of a running process; 0 once it has exited."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_monitored(command: list[str], env: dict[str, str], log: Path, on_poll: Callable[[], None]) -> Finished:
    """Run ``command``, calling ``on_poll`` every 10 ms while it runs; reaped with ``wait4`` so its own
    peak RSS is known exactly (``RUSAGE_CHILDREN`` would mix all runs of this script)."""
    with open(log, "w", encoding="utf-8") as out:
        busy, started = machine_busy_seconds(), time.time()
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        hwm = 0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                ended = time.time()
                break
            hwm = max(hwm, read_hwm(proc.pid))
            on_poll()
            time.sleep(POLL_S)
    proc.returncode = os.waitstatus_to_exitcode(status)
    on_poll()
    return Finished(proc.returncode, started, ended, usage.ru_maxrss, hwm, usage.ru_utime + usage.ru_stime,
                    machine_busy_seconds() - busy)


class MetricsTail:
    """Notes when each line of a growing ``metrics.jsonl`` appears (the trainer logs no wall clock)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, ""
        self.records: list[tuple[float, dict[str, Any]]] = []

    def poll(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
                self.offset = handle.tell()
        except FileNotFoundError:
            return
        now = time.time()
        lines = (self.partial + chunk).split("\n")
        self.partial = lines.pop()
        self.records += [(now, json.loads(line)) for line in lines if line.strip()]


def check_finished(name: str, finished: Finished, log: Path) -> None:
    if finished.returncode:
        tail = log.read_text(encoding="utf-8", errors="replace")[-4000:]
        raise SystemExit(f"{name} failed with exit status {finished.returncode}; log {log}:\n{tail}")


def newest_mtime(folder: Path) -> float:
    return max((p.stat().st_mtime for p in folder.rglob("*") if p.is_file()), default=math.nan)


# ----------------------------------------------------------------------------- ours

@dataclass
class Setting:
    """One sequence length's shared settings."""

    seq_length: int
    batch_size: int
    warmup: int
    steps: int
    model: str
    paths: dict[str, Path]
    plan: Plan
    run_root: Path
    threads: int
    num_workers: int
    seed: int

    @property
    def total(self) -> int:
        return self.warmup + self.steps

    @property
    def data_dir(self) -> Path:
        return self.paths[f"data-{self.seq_length}"]


def ours_config(s: Setting, out: Path) -> dict[str, Any]:
    """launch/pretrain.py's options: the toolkit's defaults plus the benchmark's shared settings."""
    return {"model": s.model, "data_dir": str(s.data_dir), "tokenizer": str(s.paths["vocab"]),
            "output_dir": str(out), "max_steps": s.total, "micro_batch_size": s.batch_size,
            "gradient_accumulation_steps": 1, "optimizer": "adamw", "learning_rate": LEARNING_RATE,
            "weight_decay": WEIGHT_DECAY, "adam_epsilon": ADAM_EPSILON, "max_grad_norm": MAX_GRAD_NORM,
            "warmup_ratio": WARMUP_RATIO, "schedule": "slanted_triangular", "precision": "fp32",
            "whole_word_masking": True, "mlm_probability": MASK_RATE, "checkpoint_every": s.total, "keep_last": 1,
            "log_every": 1, "num_workers": s.num_workers, "seed": s.seed, "wandb_mode": "disabled"}


def run_ours(s: Setting) -> dict[str, Any]:
    """launch/pretrain.py in a fresh one-rank process, its steps seen through metrics.jsonl."""
    import yaml

    out = s.run_root / "ours"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    config = out.parent / "ours.yaml"
    config.write_text(yaml.safe_dump(ours_config(s, out)), encoding="utf-8")
    env = {**base_env(s.threads), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    tail = MetricsTail(out / "metrics.jsonl")
    log = out.parent / "ours.log"
    finished = run_monitored([sys.executable, str(REPO / "launch" / "pretrain.py"), "--config", str(config)],
                             env, log, tail.poll)
    check_finished("ours (launch/pretrain.py)", finished, log)
    return summarize_ours(s, out, tail.records, finished)


def summarize_ours(s: Setting, out: Path, records: list[tuple[float, dict]], finished: Finished) -> dict[str, Any]:
    """Times from when each metrics line appeared; checkpoint and export ends from file mtimes."""
    seen = {r["step"]: (t, r) for t, r in records}
    if sorted(seen) != list(range(1, s.total + 1)):
        raise SystemExit(f"ours: expected a metrics line per step 1..{s.total}, got steps {sorted(seen)}")
    first_t, first = seen[1]
    warm_t, warm = seen[s.warmup]
    last_t, last = seen[s.total]
    timed = [seen[k][1] for k in range(s.warmup + 1, s.total + 1)]
    checkpoint_end = newest_mtime(out / "checkpoints")
    export_end = newest_mtime(out / "model")
    tokens = last["tokens_seen"] - warm["tokens_seen"]
    step_tokens = [seen[k][1]["tokens_seen"] - seen[k - 1][1]["tokens_seen"]
                   for k in range(s.warmup + 1, s.total + 1)]
    padding, source = ours_padding(s, step_tokens, timed)
    return timing_summary(
        finished, start_first_step=first_t - first["step_seconds"], warmup_end=warm_t, last_step_end=last_t,
        checkpoint_s=checkpoint_end - last_t, export_s=export_end - checkpoint_end, tokens=tokens,
        final_loss=last["loss"], losses=[r["loss"] for r in timed], padding_fraction=padding,
        padding_source=source, extra={"in_loop_steps_s": sum(r["step_seconds"] for r in timed),
               "in_loop_tokens_per_s": tokens / sum(r["step_seconds"] for r in timed)})


def ours_padding(s: Setting, step_tokens: list[int], timed: list[dict[str, Any]]) -> tuple[float, str]:
    """The share of computed positions that were padding, over the timed steps: what the trainer
    logged, or (if a build logs no ``padding_fraction``) HF's pad-to-longest rule on the same batches."""
    if all("padding_fraction" in r for r in timed):
        positions = sum(n / (1 - r["padding_fraction"]) for n, r in zip(step_tokens, timed))
        return 1 - sum(step_tokens) / positions, "metrics.jsonl padding_fraction (positions the model computed)"
    padded = s.plan.padded_positions(s.warmup, s.total)
    source = "computed from the batch plan, padded to each batch's longest (metrics.jsonl has no padding_fraction)"
    return 1 - s.plan.real_tokens(s.warmup, s.total) / padded, source


def timing_summary(finished: Finished, *, start_first_step: float, warmup_end: float, last_step_end: float,
                   checkpoint_s: float, export_s: float, tokens: int, final_loss: float | None,
                   losses: list[float | None], padding_fraction: float, padding_source: str,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one result shape every system reports (seconds; tokens are real, non-pad tokens)."""
    steps_s = last_step_end - warmup_end
    finite = [x for x in losses if x is not None]
    return {"tokens_per_s": tokens / steps_s, "timed_tokens": tokens,
            "startup_s": start_first_step - finished.started, "warmup_steps_s": warmup_end - start_first_step,
            "steps_s": steps_s, "checkpoint_s": checkpoint_s,
            "export_s": export_s, "checkpoint_export_s": checkpoint_s + export_s,
            "after_export_s": finished.ended - (last_step_end + checkpoint_s + export_s),
            "total_s": finished.ended - finished.started, "peak_rss_mib": finished.hwm_kib / 1024,
            "peak_rss_with_workers_mib": finished.max_rss_kib / 1024, "cpu_s": finished.cpu_s,
            "others_cpu_share": finished.others_cpu_share,
            "final_loss": final_loss, "mean_timed_loss": sum(finite) / len(finite) if finite else None,
            "padding_fraction": padding_fraction, "padding_source": padding_source, **(extra or {})}


# ----------------------------------------------------------------------------- HF

def hf_spec(s: Setting, system: str, out: Path) -> dict[str, Any]:
    """Everything the HF worker process needs, as JSON."""
    from biomed_lm.pretrain.config import load_model_preset

    return {"system": system, "whole_word": system == "hf_whole_word", "data_dir": str(s.data_dir),
            "tokenizer": str(s.paths["vocab"]), "model_fields": load_model_preset(s.model), "order": s.plan.order,
            "batch_size": s.batch_size, "max_steps": s.total, "num_workers": s.num_workers, "seed": s.seed,
            "threads": s.threads, "output_dir": str(out), "result": str(out / "timeline.json")}


def run_hf(s: Setting, system: str) -> dict[str, Any]:
    """transformers.Trainer in a fresh process (this script with --hf-worker), timed by a callback."""
    out = s.run_root / system
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    spec_path = out.parent / f"{system}.json"
    spec_path.write_text(json.dumps(hf_spec(s, system, out)), encoding="utf-8")
    log = out.parent / f"{system}.log"
    finished = run_monitored([sys.executable, str(Path(__file__).resolve()), "--hf-worker", str(spec_path)],
                             base_env(s.threads), log, lambda: None)
    check_finished(system, finished, log)
    timeline = json.loads((out / "timeline.json").read_text(encoding="utf-8"))
    return summarize_hf(s, timeline, finished)


def summarize_hf(s: Setting, tl: dict[str, Any], finished: Finished) -> dict[str, Any]:
    """The callback's timestamps in the shared result shape; padding from HF's pad-to-longest rule
    applied to the batches it was fed (the same instances, in order)."""
    ends, losses = tl["step_end"], tl["losses"]
    if len(ends) != s.total or len(losses) != s.total:
        raise SystemExit(f"HF: expected {s.total} steps and losses, got {len(ends)} and {len(losses)}")
    real = s.plan.real_tokens(s.warmup, s.total)
    padded = s.plan.padded_positions(s.warmup, s.total)
    return timing_summary(
        finished, start_first_step=tl["step_begin"][0], warmup_end=ends[s.warmup - 1], last_step_end=ends[-1],
        checkpoint_s=tl["saved"] - ends[-1], export_s=tl["export_end"] - tl["export_begin"], tokens=real,
        final_loss=losses[-1], losses=losses[s.warmup:], padding_fraction=1 - real / padded,
        padding_source="computed: the batches fed, padded to each batch's longest (HF's collator default)",
        extra={"between_checkpoint_and_export_s": tl["export_begin"] - tl["saved"]})


# --- the worker: runs inside its own process; imports only transformers, datasets and torch

def word_offsets(word_starts: list[int]) -> list[list[int]]:
    """Character offsets that tell HF's whole-word masking what the instances' word starts say: a
    word's first piece starts one past the previous piece's end, a ``##`` piece right at it (special
    tokens are found by HF from their ids)."""
    offsets, end = [], 0
    for start_flag in word_starts:
        start = end + 1 if start_flag else end
        end = start + 1
        offsets.append([start, end])
    return offsets


class HFCollatorInput:
    """Feeds HF's collator the instances' input_ids, token_type_ids and next_sentence_label (it pads
    and masks); for whole-word masking also offsets, padded with (0, 0) because ``tokenizer.pad``
    does not pad ``offset_mapping``."""

    def __init__(self, collator: Callable, whole_word: bool):
        self.collator, self.whole_word = collator, whole_word

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        rows = [{k: f[k] for k in ("input_ids", "token_type_ids", "next_sentence_label")} for f in features]
        if self.whole_word:
            longest = max(len(f["input_ids"]) for f in features)
            for row, f in zip(rows, features):
                offsets = word_offsets(f["word_starts"])
                row["offset_mapping"] = offsets + [[0, 0]] * (longest - len(offsets))
        return self.collator(rows)


def hf_training_args(spec: dict[str, Any]):
    """The user's Trainer settings, matched to ours where the comparison needs it."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=spec["output_dir"], max_steps=spec["max_steps"], per_device_train_batch_size=spec["batch_size"],
        learning_rate=LEARNING_RATE, weight_decay=WEIGHT_DECAY, adam_epsilon=ADAM_EPSILON,
        max_grad_norm=MAX_GRAD_NORM, lr_scheduler_type="linear", warmup_steps=WARMUP_RATIO,
        optim="adamw_torch_fused", seed=spec["seed"], dataloader_num_workers=spec["num_workers"],
        train_sampling_strategy="sequential", remove_unused_columns=False, eval_strategy="no",
        logging_strategy="steps", logging_steps=1, save_strategy="steps", save_steps=spec["max_steps"],
        report_to="none", use_cpu=True, disable_tqdm=False)


def clock_callback(timeline: dict[str, Any]):
    """A TrainerCallback noting the wall clock at each step's begin and end and at the checkpoint save,
    and each logged loss (logging_steps=1: the loss of that step)."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            timeline["step_begin"].append(time.time())

        def on_step_end(self, args, state, control, **kwargs):
            timeline["step_end"].append(time.time())

        def on_save(self, args, state, control, **kwargs):
            timeline["saved"] = time.time()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                timeline["losses"].append(float(logs["loss"]))

    return Clock()


def build_hf_trainer(spec: dict[str, Any], timeline: dict[str, Any]):
    """What a user writes: tokenizer, dataset, a fresh ``BertForPreTraining`` (SDPA), HF's collator, Trainer."""
    import datasets
    import torch
    from transformers import (AutoModelForPreTraining, AutoTokenizer, BertConfig, DataCollatorForLanguageModeling,
                              Trainer)

    tokenizer = AutoTokenizer.from_pretrained(spec["tokenizer"])
    dataset = datasets.load_from_disk(spec["data_dir"]).select(spec["order"]).flatten_indices()
    dataset = dataset.select_columns(["input_ids", "token_type_ids", "next_sentence_label", "word_starts"])
    config = BertConfig(**spec["model_fields"], vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(spec["seed"])
    model = AutoModelForPreTraining.from_config(config, attn_implementation="sdpa")
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=MASK_RATE, whole_word_mask=spec["whole_word"])
    return Trainer(model=model, args=hf_training_args(spec), train_dataset=dataset, processing_class=tokenizer,
                   data_collator=HFCollatorInput(collator, spec["whole_word"]), callbacks=[clock_callback(timeline)])


def hf_worker(spec_path: str) -> None:
    """One HF run in this process: train (its checkpoint at the last step included), then the export."""
    import torch

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    torch.set_num_threads(spec["threads"])
    timeline: dict[str, Any] = {"step_begin": [], "step_end": [], "losses": []}
    trainer = build_hf_trainer(spec, timeline)
    trainer.train()
    timeline["export_begin"] = time.time()
    trainer.save_model(str(Path(spec["output_dir"]) / "model"))
    timeline["export_end"] = time.time()
    Path(spec["result"]).write_text(json.dumps(timeline), encoding="utf-8")


# ----------------------------------------------------------------------------- report

RATIO_KEYS = ("tokens_per_s", "startup_s", "steps_s", "checkpoint_export_s", "total_s", "peak_rss_mib")


def ratios(systems: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each system against each HF baseline measured in the same invocation (value / baseline's)."""
    out: dict[str, dict[str, float]] = {}
    for base in BASELINES:
        if base not in systems:
            continue
        for name, result in systems.items():
            if name != base:
                out[f"{name}_vs_{base}"] = {k: result[k] / systems[base][k] for k in RATIO_KEYS
                                           if systems[base][k]}
    return out


def print_table(length: int, entry: dict[str, Any]) -> None:
    """One length's systems side by side, then the ratios (what the lead copies into the README)."""
    columns = ("system", "tok/s", "start-up s", "warm-up s", "steps s", "ckpt+export s", "total s",
               "peak RSS MiB", "final loss", "padding", "others' CPU")
    rows = [columns]
    for name, r in entry["systems"].items():
        loss = f"{r['final_loss']:.3f}" if r["final_loss"] is not None else "–"
        rows.append((name, f"{r['tokens_per_s']:,.0f}", f"{r['startup_s']:.1f}", f"{r['warmup_steps_s']:.2f}",
                     f"{r['steps_s']:.2f}", f"{r['checkpoint_export_s']:.2f}", f"{r['total_s']:.1f}",
                     f"{r['peak_rss_mib']:,.0f}", loss, f"{100 * r['padding_fraction']:.1f}%",
                     f"{100 * r['others_cpu_share']:.0f}%"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    print(f"\nseq {length}, batch {entry['batch_size']}, {entry['steps']} timed steps after {entry['warmup_steps']} "
          f"warm-up, {entry['timed_real_tokens']:,} real tokens timed; HF's recipe computes "
          f"×{entry['work_ratio_hf_vs_ours']:.2f} ours' model FLOPs on them")
    for row in rows:
        print("  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    for pair, values in entry["ratios"].items():
        print(f"  {pair}: " + ", ".join(f"{k} ×{v:.2f}" for k, v in values.items()))


def model_config(model: str, paths: dict[str, Path]) -> Any:
    """The benchmarked model's ``BertConfig`` (its preset and the vocabulary's size)."""
    from transformers import BertConfig

    from biomed_lm.pretrain.config import load_model_preset

    vocab_size = sum(1 for _ in open(paths["vocab"] / "vocab.txt", encoding="utf-8"))
    return BertConfig(**load_model_preset(model), vocab_size=vocab_size)


def machine_info(threads: int) -> dict[str, Any]:
    import torch
    import transformers

    return {"cpu_count": os.cpu_count(), "threads": threads, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": sys.version.split()[0],
            "load_average": os.getloadavg()}


NOTES = [
    "ours: launch/pretrain.py in a one-rank process; steps timed by when metrics.jsonl lines appear (polled every "
    "10 ms: the trainer logs no wall-clock time); start of step 1 = its line's time - its step_seconds; checkpoint "
    "and export ends are the newest file mtimes under checkpoints/ and model/",
    "hf: transformers.Trainer in its own process, timed by a TrainerCallback (on_step_begin/on_step_end/on_save); "
    "checkpoint = the Trainer's save at the last step, export = trainer.save_model",
    "both read the same instances in the same order (pretrain.sampler.BatchPlan's); HF with "
    "train_sampling_strategy='sequential'",
    "HF whole-word masking (DataCollatorForLanguageModeling(whole_word_mask=True), transformers 5) needs "
    "offset_mapping, "
    "which tokenizer.pad does not pad: offsets are derived from the instances' word_starts and padded with (0, 0); "
    "it also forces mask_replace_prob=1 (every selected token becomes [MASK], no 10% random / 10% kept)",
    "peak_rss_mib: VmHWM of the training process (sampled every 10 ms); peak_rss_with_workers_mib: ru_maxrss of "
    "wait4 (the process or any child it reaped, e.g. its DataLoader worker)",
    "others_cpu_share: CPU time used by other processes during the run (/proc/stat busy time minus the run's own "
    "CPU time, this script's polling and kernel threads included: about 3% on an idle 2-core machine) over wall "
    "time × cores; well above that, the run shared the machine and its ratios are not reliable",
]


# ----------------------------------------------------------------------------- main

def measure_length(args: argparse.Namespace, work: Path, paths: dict[str, Path], model: str,
                   length: int) -> dict[str, Any]:
    """All systems at one sequence length, one after another in fresh processes."""
    batch, steps = batch_size_for(args, length), args.steps_by_length[length]
    plan = make_plan(paths[f"data-{length}"], batch, args.warmup_steps + steps, args.seed)
    runs = work / ("runs-quick" if args.quick else "runs") / f"seq{length}"
    s = Setting(length, batch, args.warmup_steps, steps, model, paths, plan, runs, args.threads, args.num_workers,
                args.seed)
    systems: dict[str, dict[str, Any]] = {}
    for system in args.systems:
        print(f"seq {length}: {system} ...", flush=True)
        systems[system] = run_ours(s) if system == "ours" else run_hf(s, system)
    timed = (args.warmup_steps, args.warmup_steps + steps)
    entry = {"batch_size": batch, "steps": steps, "warmup_steps": args.warmup_steps,
             "timed_real_tokens": plan.real_tokens(*timed),
             "work_ratio_hf_vs_ours": plan.work_ratio(model_config(model, paths), *timed, MASK_RATE),
             "systems": systems, "ratios": ratios(systems)}
    if "ours" in systems:
        entry["same_tokens_as_plan"] = systems["ours"]["timed_tokens"] == entry["timed_real_tokens"]
    return entry


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.hf_worker:
        hf_worker(args.hf_worker)
        return 0
    if not SAMPLE_DIR.is_dir():
        print(f"bench_pretrain_e2e: {SAMPLE_DIR} is absent; nothing to measure", file=sys.stderr)
        return 2
    work = Path(args.work_dir).resolve()
    paths = prepare_inputs(work, args.seq_lengths)
    model = model_preset(work, args.quick)
    load_before = os.getloadavg()
    prime_s = prime_deepspeed(base_env(args.threads), args.quick) if "ours" in args.systems else 0.0
    results = {str(n): measure_length(args, work, paths, model, n) for n in args.seq_lengths}
    for length, entry in results.items():
        print_table(int(length), entry)
    write_results(args.output, {
        "args": {k: v for k, v in vars(args).items() if k != "hf_worker"}, "model": model,
        "machine": machine_info(args.threads) | {"load_average_before": load_before},
        "deepspeed_op_prime_s": prime_s, "results": results, "notes": NOTES})
    return 0


if __name__ == "__main__":
    sys.exit(main())
