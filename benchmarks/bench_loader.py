#!/usr/bin/env python
"""The pretraining loader of many ranks: sequences/s, start-up time and memory per rank, and which
instances each rank reads, at several dataset sizes.

    python benchmarks/bench_loader.py [--instances DIR --tokenizer DIR] [--replicas 4 32]
        [--ranks 2] [--workers 4] [--micro-batch 256] [--warmup 8] [--window 32]

Input: seq-128 instances made with the toolkit's own scripts from the embedded sample
(``data/sample/sywada_PubMedAbstract_1MB.txt``: prepare_corpus, a 3,000-piece WordPiece
vocabulary, create_pretraining_data with NSP pairs), unless ``--instances``/``--tokenizer`` name
existing ones. Each dataset size is those instances replicated ``k`` times (``--replicas``), saved
as a ``datasets`` dataset with the same schema and a ``pretraining_data.json`` whose recorded count
is the new one: content repeats, the loader's work per instance does not change.

Per size, ``--ranks`` processes run at once, each with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set as
torch.distributed's launcher sets them (no process group: the loader does not use one), each going
through the trainer's own loader path: ``load_pretraining_data`` (tokenizer check included),
:class:`pretrain.sampler.BatchPlan`, and ``pretrain.trainer._batches`` (the ``MicroBatchStream``
in a DataLoader with ``--workers`` workers, prefetch 4), whole-word masking at 15%, the layout the
trainer uses on CUDA by default (unpadded, token count bucketed to 128: ``--bucket-tokens``), one
micro-batch of ``--micro-batch`` per optimizer step. The main process consumes batches as fast as
they come (no model), so the rate is what the loader can supply.

Measured per rank: start-up seconds (the parent's clock just before the process is started → the
first batch in the rank, with the import and open parts), sequences/s over ``--window``
micro-batches after ``--warmup``, the CPU seconds the rank and its workers spent per sequence in
the window (× 6,000: the cores the goal rate needs, a figure a contended machine does not skew),
peak RSS (``VmHWM``) of the rank and of each worker, their PSS (all pages, and anonymous pages only:
the private memory, which adds up over the forked processes) and file-backed RSS, and the instance
indices the rank's workers read (recorded by a thin wrapper around the dataset, with times): the
ranks' shares must be disjoint and together be the first global batches of the epoch's permutation
(all of the epoch when the run reaches its end), and before the first batch a rank must have read at
most what the workers prefetch (and the micro-batch the DataLoader requests as it hands the first
over), not the data.
Results go to ``benchmarks/results/loader.json``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _results import write_results  # benchmarks/ is on sys.path when a benchmark runs

REPO = Path(__file__).resolve().parents[1]
GOAL = 6000  # sequences/s one rank's loader must supply at seq 128 (an H100 at the goal pace)
SEED = 42


# ----------------------------------------------------------------------------- inputs

def build_instances(work: Path, max_seq_length: int = 128) -> tuple[Path, Path]:
    """Seq-``max_seq_length`` instances and their vocabulary, made from the embedded sample."""
    from biomed_lm.pretrain.instance_builder import PretrainingDataConfig, create_pretraining_data
    from biomed_lm.tokenization.corpus import CorpusConfig, prepare_corpus
    from biomed_lm.tokenization.vocab import VocabConfig, build_vocab

    prepare_corpus(CorpusConfig(inputs=[str(REPO / "data" / "sample" / "sywada_PubMedAbstract_1MB.txt")],
                                output_dir=str(work / "corpus"), min_words=0, num_proc=1))
    build_vocab([str(work / "corpus")], work / "vocab", VocabConfig(vocab_size=3000))
    create_pretraining_data(PretrainingDataConfig(corpus=str(work / "corpus"), tokenizer=str(work / "vocab"),
                                                  output_dir=str(work / "instances"),
                                                  max_seq_length=max_seq_length, num_proc=1), progress=False)
    return work / "instances", work / "vocab"


def replicate(instances: Path, replicas: int, out: Path) -> Path:
    """``instances`` repeated ``replicas`` times, saved with a metadata file recording the new count."""
    import datasets

    from biomed_lm.pretrain.data import METADATA_FILE

    base = datasets.load_from_disk(str(instances))
    data = datasets.concatenate_datasets([base] * replicas) if replicas > 1 else base
    data.save_to_disk(str(out))
    from biomed_lm.finished_output import saved_files_record

    meta = json.loads((instances / METADATA_FILE).read_text(encoding="utf-8"))
    meta.setdefault("summary", {})["instances"] = len(data)
    meta["output_files"] = saved_files_record(out)  # the replicated shards' own sizes, which loading checks
    (out / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out


# ----------------------------------------------------------------------------- one rank

class RecordingDataset:
    """The instance dataset, recording which indices each process reads (and when) to ``log_dir``:
    one file per process, rows of int64 ``[time_ns, n, index_1 .. index_n]``."""

    def __init__(self, dataset, log_dir: str, rank: int):
        self.dataset, self.log_dir, self.rank = dataset, log_dir, rank
        self._file, self._pid = None, None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key):
        if isinstance(key, list):
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self._file = open(os.path.join(self.log_dir, f"rank{self.rank}_pid{self._pid}.bin"), "ab",
                                  buffering=0)
            self._file.write(np.array([time.time_ns(), len(key), *key], dtype=np.int64).tobytes())
        return self.dataset[key]

    def __getstate__(self):
        return {**self.__dict__, "_file": None, "_pid": None}


def read_records(log_dir: Path, rank: int) -> list[tuple[float, np.ndarray]]:
    records = []
    for path in sorted(log_dir.glob(f"rank{rank}_pid*.bin")):
        flat = np.fromfile(path, dtype=np.int64)
        i = 0
        while i < len(flat):
            n = int(flat[i + 1])
            records.append((flat[i] / 1e9, flat[i + 2:i + 2 + n]))
            i += 2 + n
    return records


def memory(pid: int) -> dict:
    """Of ``pid``, in MiB (from /proc): VmHWM (peak RSS), VmRSS, RssAnon (private and copy-on-write
    pages), RssFile (mapped files: the instances' pages it touched count here), and Pss / Pss_Anon
    (pages shared with the forked workers counted once across them: these add up over processes)."""
    out = {}
    for name, keys in (("status", ("VmHWM", "VmRSS", "RssAnon", "RssFile")), ("smaps_rollup", ("Pss", "Pss_Anon"))):
        try:
            for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in keys:
                    out[key] = round(int(value.split()[0]) / 1024, 1)
        except OSError:
            pass
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes ``pids`` have used so far (from /proc/<pid>/stat)."""
    total = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat
    return total / os.sysconf("SC_CLK_TCK")


def rank_main(args) -> dict:
    """One rank's loader, as the trainer builds it; its measurements (``main`` prints them as one JSON line)."""
    t0 = args.t0
    import torch

    from biomed_lm.pretrain.data import load_pretraining_data
    from biomed_lm.tokenization.tokenizer_io import load_tokenizer

    # The trainer's modules (config, layout, sampler) load here, before the clock's ``imported``: import_s.
    importlib.import_module("biomed_lm.pretrain.trainer")

    torch.set_num_threads(1)
    imported = time.time()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    tokenizer = load_tokenizer(args.tokenizer)
    dataset, _ = load_pretraining_data(args.data, tokenizer=tokenizer, max_position_embeddings=512)
    opened = time.time()
    plan, batches = trainer_batches(args, dataset, tokenizer, rank, world)
    stream = consume(batches, args.warmup, args.steps)
    clock = {"t0": t0, "imported": imported, "opened": opened}
    return rank_result(stream, clock, rank=rank, world=world, instances=len(dataset), steps=args.steps,
                       steps_per_epoch=plan.steps_per_epoch)


def trainer_batches(args, dataset, tokenizer, rank: int, world: int):
    """The batch plan and the trainer's micro-batch stream over ``dataset`` (wrapped to record its reads):
    whole-word masking at 15%, unpadded layout bucketed to ``--bucket-tokens``, one micro-batch a step."""
    import torch

    from biomed_lm.pretrain.config import DataArguments, TrainArguments
    from biomed_lm.pretrain.layout import Layout
    from biomed_lm.pretrain.sampler import BatchPlan
    from biomed_lm.pretrain.trainer import _batches

    data_args = DataArguments(data_dir=args.data, tokenizer=args.tokenizer, num_workers=args.workers,
                              whole_word_masking=True, mlm_probability=0.15)
    train_args = TrainArguments(max_steps=args.steps, micro_batch_size=args.micro_batch,
                                gradient_accumulation_steps=1, seed=SEED)
    plan = BatchPlan(len(dataset), args.micro_batch, 1, world, rank, SEED)
    layout = Layout(unpadded=True, pad_to_multiple_of=args.bucket_tokens, pad_token_id=tokenizer.pad_token_id or 0)
    recorded = RecordingDataset(dataset, args.log_dir, rank)
    return plan, _batches(recorded, plan, data_args, train_args, tokenizer, 0, layout, torch.device("cpu"))


def consume(batches, warmup: int, steps: int) -> dict:
    """Every micro-batch of ``batches``, taken as fast as it comes: when each came and what it held, the
    memory of the DataLoader's workers and the CPU seconds of the rank and its workers at the window's
    start (``w0``), halfway and near the end, and the rank's own memory at the end."""
    first = next(batches)
    first_at = time.time()
    sequences, tokens, times = [first["prepared"].num_sequences], [first["prepared"].real_tokens], [first_at]
    pids = [worker.pid for worker in getattr(batches, "_workers", [])]  # the DataLoader's worker processes
    workers = {pid: memory(pid) for pid in pids}
    w0 = min(warmup, steps - 1)
    samples = {w0, steps // 2, steps - 2}  # VmHWM only grows: the latest reading of each worker counts
    processes = [os.getpid(), *pids]
    cpu = {w0: cpu_seconds(processes)} if w0 == 0 else {}
    for batch in batches:
        sequences.append(batch["prepared"].num_sequences)
        tokens.append(batch["prepared"].real_tokens)
        times.append(time.time())
        if len(times) - 1 in samples:
            workers.update({pid: reading for pid in pids if (reading := memory(pid))})
            cpu[len(times) - 1] = cpu_seconds(processes)  # the rank and its workers, while they all run
    return {"first_at": first_at, "sequences": sequences, "tokens": tokens, "times": times, "w0": w0,
            "cpu": cpu, "workers": workers, "main_memory": memory(os.getpid())}


def rank_result(stream: dict, clock: dict, *, rank: int, world: int, instances: int, steps: int,
                steps_per_epoch: int) -> dict:
    """The rank's JSON: start-up split into import, open and first batch; rates and CPU per sequence over
    the window after the warm-up; memory."""
    sequences, tokens, times, cpu, w0 = (stream[k] for k in ("sequences", "tokens", "times", "cpu", "w0"))
    t0, imported, opened, first_at = clock["t0"], clock["imported"], clock["opened"], stream["first_at"]
    window = times[-1] - times[w0]
    cpu_end = max(cpu)
    cpu_per_sequence = ((cpu[cpu_end] - cpu[w0]) / sum(sequences[w0 + 1:cpu_end + 1])
                        if w0 in cpu and cpu_end > w0 else None)
    return {"rank": rank, "world_size": world, "instances": instances, "steps": steps,
            "steps_per_epoch": steps_per_epoch, "t0": t0, "first_batch_at": first_at,
            "startup_s": round(first_at - t0, 3), "import_s": round(imported - t0, 3),
            "open_s": round(opened - imported, 3), "first_batch_s": round(first_at - opened, 3),
            "window_micro_batches": len(times) - 1 - w0, "window_s": round(window, 3),
            "sequences_per_s": round(sum(sequences[w0 + 1:]) / window, 1) if window > 0 else None,
            "tokens_per_s": round(sum(tokens[w0 + 1:]) / window, 1) if window > 0 else None,
            "cpu_ms_per_sequence": round(cpu_per_sequence * 1e3, 4) if cpu_per_sequence else None,
            "cores_for_goal": round(cpu_per_sequence * GOAL, 2) if cpu_per_sequence else None,
            "main_memory_mib": stream["main_memory"], "worker_memory_mib": list(stream["workers"].values())}


# ----------------------------------------------------------------------------- the sampler alone

def sampler_startup(sizes: list[int], args) -> list[dict]:
    """What a worker spends on the batch plan before its first micro-batch, at dataset sizes too large
    to build here: the plan's first step (it evaluates only the positions that step needs), and the
    seeded ``numpy`` permutation of the whole epoch the plan built before (in every worker, at every
    epoch), with the memory that permutation holds (int32 result; int64 while it is made)."""
    from biomed_lm.pretrain.sampler import BatchPlan

    rows = []
    for n in sizes:
        started = time.perf_counter()
        BatchPlan(n, args.micro_batch, 1, args.ranks, 0, SEED).micro_batches(0)
        plan_s = time.perf_counter() - started
        started = time.perf_counter()
        legacy = np.random.default_rng([SEED, 0]).permutation(n).astype(np.int32)
        legacy_s = time.perf_counter() - started
        rows.append({"instances": n, "plan_first_step_ms": round(plan_s * 1e3, 3),
                     "full_permutation_s": round(legacy_s, 3),
                     "full_permutation_mib": round(legacy.nbytes / 2 ** 20, 1)})
        del legacy
    return rows


# ----------------------------------------------------------------------------- one size, all ranks

def run_size(data: Path, tokenizer: Path, args, work: Path) -> dict:
    """All ranks at once on ``data``; their measurements and the checks on what they read."""
    from biomed_lm.pretrain.sampler import BatchPlan

    n = len(__import__("datasets").load_from_disk(str(data)))
    plan = BatchPlan(n, args.micro_batch, 1, args.ranks, 0, SEED)
    steps = min(plan.steps_per_epoch, args.warmup + args.window + 1)
    log_dir = Path(tempfile.mkdtemp(dir=work, prefix="reads_"))
    procs = []
    for rank in range(args.ranks):
        python_path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))  # the caller's kept
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(args.ranks), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(args.ranks), "OMP_NUM_THREADS": "1", "PYTHONPATH": python_path}
        command = [sys.executable, __file__, "--rank-worker", "--data", str(data), "--tokenizer", str(tokenizer),
                   "--workers", str(args.workers), "--micro-batch", str(args.micro_batch),
                   "--bucket-tokens", str(args.bucket_tokens), "--warmup", str(args.warmup),
                   "--steps", str(steps), "--log-dir", str(log_dir), "--t0", repr(time.time())]
        procs.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    ranks = []
    for proc in procs:
        out, err = proc.communicate(timeout=1800)
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"a rank failed (exit {proc.returncode}):\n{err[-3000:]}")
        ranks.append(json.loads(lines[-1][len("RESULT "):]))
    reads = {}
    for r in ranks:
        records = read_records(log_dir, r["rank"])
        read = np.concatenate([idx for _, idx in records]) if records else np.zeros(0, np.int64)
        before = sum(len(idx) for t, idx in records if t <= r["first_batch_at"])
        r["read_instances"] = int(len(read))
        r["read_before_first_batch"] = int(before)
        r["read_calls"] = len(records)
        reads[r["rank"]] = read
    shutil.rmtree(log_dir, ignore_errors=True)
    sets = [set(reads[r].tolist()) for r in sorted(reads)]
    union = set().union(*sets)
    expected = set(plan.permutation(0)[:steps * plan.global_batch_size].tolist())
    pairwise = sum(len(a & b) for i, a in enumerate(sets) for b in sets[i + 1:])
    duplicates = sum(len(reads[r]) - len(s) for r, s in zip(sorted(reads), sets))
    return {"instances": n, "dataset_bytes": sum(f.stat().st_size for f in data.glob("*.arrow")),
            "steps": steps, "steps_per_epoch": plan.steps_per_epoch, "covers_epoch": steps == plan.steps_per_epoch,
            "shares": {"disjoint": pairwise == 0, "overlapping_indices": pairwise, "repeated_within_rank": duplicates,
                       "union_is_planned_prefix": union == expected, "union": len(union),
                       "epoch_instances_used": plan.steps_per_epoch * plan.global_batch_size,
                       "read_fraction_of_dataset": round(len(union) / n, 4)},
            "ranks": ranks}


def summarize(size: dict) -> dict:
    ranks = size["ranks"]
    rates = [r["sequences_per_s"] for r in ranks if r["sequences_per_s"]]
    peaks = [r["main_memory_mib"].get("VmHWM", 0) + sum(w.get("VmHWM", 0) for w in r["worker_memory_mib"])
             for r in ranks]
    pss = [r["main_memory_mib"].get("Pss", 0) + sum(w.get("Pss", 0) for w in r["worker_memory_mib"]) for r in ranks]
    pss_anon = [r["main_memory_mib"].get("Pss_Anon", 0) + sum(w.get("Pss_Anon", 0) for w in r["worker_memory_mib"])
                for r in ranks]
    file_rss = [r["main_memory_mib"].get("RssFile", 0) + sum(w.get("RssFile", 0) for w in r["worker_memory_mib"])
                for r in ranks]
    return {"instances": size["instances"], "seq_per_s_per_rank": round(min(rates), 1) if rates else None,
            "seq_per_s_all_ranks": round(sum(rates), 1), "goal_ratio": round(min(rates) / GOAL, 3) if rates else None,
            "cores_for_goal": max((r["cores_for_goal"] for r in ranks if r["cores_for_goal"]), default=None),
            "startup_s": round(max(r["startup_s"] for r in ranks), 2),
            "first_batch_s": round(max(r["first_batch_s"] for r in ranks), 2),
            "open_s": round(max(r["open_s"] for r in ranks), 2),
            "peak_rss_mib_per_rank": round(max(peaks), 1), "pss_mib_per_rank": round(max(pss), 1),
            "private_mib_per_rank": round(max(pss_anon), 1),
            "file_rss_mib_per_rank": round(max(file_rss), 1),
            "read_before_first_batch": max(r["read_before_first_batch"] for r in ranks),
            "disjoint": size["shares"]["disjoint"],
            "union_is_planned_prefix": size["shares"]["union_is_planned_prefix"],
            "covers_epoch": size["covers_epoch"]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=Path, help="seq-128 pretraining instances (default: built here)")
    parser.add_argument("--tokenizer", type=Path, help="their tokenizer (with --instances)")
    parser.add_argument("--replicas", type=int, nargs="+", default=[4, 32], help="dataset sizes, as copies")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=256)
    parser.add_argument("--bucket-tokens", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=8, help="micro-batches before the window")
    parser.add_argument("--window", type=int, default=32, help="micro-batches timed")
    parser.add_argument("--sampler-sizes", type=int, nargs="*", default=[10 ** 6, 10 ** 7, 10 ** 8],
                        help="dataset sizes at which to time the batch plan alone")
    parser.add_argument("--work", type=Path, help="keep the built data here (default: a temporary folder)")
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "loader.json")
    # one rank (internal)
    parser.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--log-dir", help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.rank_worker and (args.instances is None) != (args.tokenizer is None):
        parser.error("give both --instances and --tokenizer, or neither")
    return args


def loader_inputs(args, work: Path) -> tuple[Path, Path]:
    """The instances and their tokenizer: ``--instances``/``--tokenizer``, else those an earlier run left in
    ``work``, else built there from the embedded sample."""
    if args.instances:
        return args.instances, args.tokenizer
    if (work / "instances").is_dir() and (work / "vocab").is_dir():
        return work / "instances", work / "vocab"
    return build_instances(work)


def measure_size(args, replicas: int, instances: Path, tokenizer: Path, work: Path) -> dict:
    """The instances ``replicas`` times over (replicated in ``work`` unless already there), all ranks at once;
    prints the summary line."""
    data = work / f"x{replicas}"
    if not data.is_dir():
        replicate(instances, replicas, data)
    size = run_size(data, tokenizer, args, work)
    size["replicas"] = replicas
    size["summary"] = summarize(size)
    print(json.dumps({"replicas": replicas, **size["summary"]}), flush=True)
    return size


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rank_worker:
        print("RESULT " + json.dumps(rank_main(args)), flush=True)
        return 0

    import datasets

    work = args.work or Path(tempfile.mkdtemp(prefix="bench_loader_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        instances, tokenizer = loader_inputs(args, work)
        base = len(datasets.load_from_disk(str(instances)))
        sizes = [measure_size(args, k, instances, tokenizer, work) for k in args.replicas]
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    sampler = sampler_startup(args.sampler_sizes, args)
    print_table(sizes, args)
    for row in sampler:
        print(f"batch plan, {row['instances']:,} instances: first step {row['plan_first_step_ms']} ms; a full "
              f"permutation (the plan before) {row['full_permutation_s']} s, "
              f"{row['full_permutation_mib']} MiB per worker")
    write_results(args.output, result_json(args, base, sizes, sampler))
    return 0


def result_json(args, base: int, sizes: list[dict], sampler: list[dict]) -> dict:
    import datasets
    import torch

    return {
        "benchmark": "loader", "goal_sequences_per_s": GOAL, "base_instances": base,
        "config": {"ranks": args.ranks, "workers": args.workers, "micro_batch": args.micro_batch, "max_seq_length": 128,
                   "whole_word_masking": True, "layout": f"unpadded, tokens bucketed to {args.bucket_tokens}",
                   "warmup": args.warmup, "window": args.window},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "oversubscribed": args.ranks * (args.workers + 1) > (os.cpu_count() or 1)},
        "versions": {"torch": torch.__version__, "datasets": datasets.__version__, "numpy": np.__version__},
        "sizes": sizes, "sampler_startup": sampler}


COLUMNS = (("instances", "instances"), ("seq/s/rank", "seq_per_s_per_rank"), ("x goal", "goal_ratio"),
           ("cores for goal", "cores_for_goal"), ("start-up s", "startup_s"), ("open s", "open_s"),
           ("1st batch s", "first_batch_s"), ("peak RSS MiB/rank", "peak_rss_mib_per_rank"),
           ("PSS MiB/rank", "pss_mib_per_rank"), ("private MiB/rank", "private_mib_per_rank"),
           ("file RSS MiB/rank", "file_rss_mib_per_rank"), ("read @1st", "read_before_first_batch"),
           ("disjoint", "disjoint"), ("= plan", "union_is_planned_prefix"))


def print_table(sizes: list[dict], args) -> None:
    print(f"\n{args.ranks} ranks x {args.workers} workers, micro-batch {args.micro_batch}, seq 128, whole-word "
          f"masking, unpadded (bucket {args.bucket_tokens}); {os.cpu_count()} CPUs")
    print(" | ".join(title for title, _ in COLUMNS))
    for size in sizes:
        print(" | ".join(f"{size['summary'][key]:,}" if key == "instances" else str(size["summary"][key])
                         for _, key in COLUMNS))


if __name__ == "__main__":
    sys.exit(main())
