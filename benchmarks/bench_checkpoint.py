#!/usr/bin/env python
"""What verified checkpoints cost: saving BERT-base with and without the checksummed manifest.

    python benchmarks/bench_checkpoint.py [--model bert-base] [--rounds 3] [--warmup 1] [--workdir /tmp]

A BERT-base ``PretrainingModel`` in a one-rank DeepSpeed engine on the CPU (gloo), AdamW with its
moments allocated by one optimizer step, so a checkpoint holds the weights, both moments, the RNG
state and the transformers export. The two saves alternate, which goes first alternating from round
to round, so drift in machine speed hits both alike; each starts alone on disk after an untimed
``os.sync()`` (no dirty pages left from the other):

* ``baseline``: the save as it was before manifests: DeepSpeed's files + the RNG file + the export
  (``pretrain.trainer._export_hf``: weights as safetensors + the bert-base-uncased tokenizer),
  renamed into place;
* ``verified``: :func:`pretrain.checkpoint.save_checkpoint` (the same, plus the xxh3-128 checksum
  of every file and the manifest, written before the rename).

Also timed: :func:`pretrain.checkpoint.verify_checkpoint` (what a resume adds) and the checksum
alone. The files are fresh in the page cache, as they are right after a save (dropping the cache
needs root). They are written under the system temp dir (``--workdir``; on the development machine
the same disk as the repo), and deleted between rounds. Results go to
``benchmarks/results/checkpoint.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from _results import write_results  # (benchmarks/ is on sys.path when a benchmark runs)


def _single_rank_env() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="")


def build_engine(model_name: str):
    import deepspeed
    import torch
    from transformers import BertConfig, BertForPreTraining

    from biomed_lm.pretrain.config import TrainArguments, create_ds_config, load_model_preset
    from biomed_lm.pretrain.modeling import PretrainingModel
    from biomed_lm.optim import build_optimizer, parameter_groups

    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    bert = BertForPreTraining(BertConfig(vocab_size=30522, **load_model_preset(model_name)))
    model = PretrainingModel(bert)
    built = build_optimizer("adamw", parameter_groups(model, 0.01), lr=1e-4, betas=(0.9, 0.999), eps=1e-6,
                            weight_decay=0.01, device=torch.device("cpu"), max_grad_norm=None)
    train = TrainArguments(micro_batch_size=1, max_steps=10, precision="fp32")
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=built.optimizer,
                                           config=create_ds_config(train, 1))
    ids = torch.randint(1000, 2000, (1, 32))
    out = engine(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids),
                 labels=ids, next_sentence_label=torch.zeros(1, dtype=torch.long))
    engine.backward(out.loss)
    engine.step()  # the Adam moments now exist
    return engine, bert


def save_baseline(engine, export, root: Path, step: int) -> Path:
    import torch

    from biomed_lm.pretrain.checkpoint import rng_state, tag_for

    staging = root / f".partial-{tag_for(step)}"
    engine.save_checkpoint(str(root), tag=staging.name, client_state={"trainer_state": {"step": step}},
                           save_latest=False)
    torch.save(rng_state(), staging / "rng_state_rank0.pt")
    export(staging / "hf")
    final = root / tag_for(step)
    os.replace(staging, final)
    return final


def save_verified(engine, export, run_dir: Path, step: int) -> Path:
    from biomed_lm.pretrain.checkpoint import save_checkpoint

    return save_checkpoint(engine, run_dir, step, {"trainer_state": {"step": step}}, rank=0, world_size=1,
                           barrier=lambda: None, keep_last=2, signature={"bench": True}, export=export)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bert-base")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first (the first save allocates)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", default=tempfile.gettempdir(),
                        help="where the checkpoints are written (default: the system temp dir)")
    return parser.parse_args()


def build_saving(args):
    """The one-rank engine and the export the trainer passes to a save (bert-base-uncased's tokenizer, as a run's
    export carries). The rank's environment is set before torch and the toolkit are imported."""
    _single_rank_env()
    import torch

    from biomed_lm.pretrain.trainer import _export_hf
    from biomed_lm.reference_models import general_bert_dir
    from biomed_lm.tokenization.tokenizer_io import load_tokenizer

    torch.set_num_threads(args.threads)
    engine, bert = build_engine(args.model)
    tokenizer = load_tokenizer(general_bert_dir())
    export = lambda path: _export_hf(bert, tokenizer, path)  # noqa: E731  (what the trainer passes)
    return engine, export


def measure_save(method: str, engine, export, work: Path, step: int, times: dict[str, list[float]]) -> int:
    """One save by ``method`` (``baseline`` or ``verified``), timed into ``times``; after the verified one, also
    what a resume adds and the checksum alone, on the same bytes. Returns the checkpoint's bytes."""
    from biomed_lm.pretrain.checkpoint import file_checksum, verify_checkpoint

    # Start every save from a clean page cache: delete the other folders and flush (untimed).
    # Otherwise the first save's 1.8 GB of dirty pages push the second past the kernel's
    # background-writeback threshold (10% of RAM by default), and that one pays for flushing both.
    # In training, the previous checkpoint was written back long before the next save.
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    target = work / method
    (target / "checkpoints").mkdir(parents=True)
    os.sync()
    started = time.perf_counter()
    if method == "baseline":
        folder = save_baseline(engine, export, target / "checkpoints", step)
    else:
        folder = save_verified(engine, export, target, step)
    times[method].append(time.perf_counter() - started)
    size = folder_bytes(folder)
    if method == "verified":
        started = time.perf_counter()
        verify_checkpoint(folder)
        times["verify"].append(time.perf_counter() - started)
        started = time.perf_counter()
        for path in (p for p in folder.rglob("*") if p.is_file()):
            file_checksum(path)
        times["checksum_only"].append(time.perf_counter() - started)
    return size


def measure_rounds(args, engine, export, work: Path) -> tuple[dict[str, list[float]], int]:
    """``--warmup`` rounds (printed, then forgotten) and ``--rounds`` counted ones: the seconds of every
    measurement of the counted rounds, and the bytes of the last checkpoint saved."""
    times = {"baseline": [], "verified": [], "verify": [], "checksum_only": []}
    size = 0
    for round_ in range(-args.warmup, args.rounds):
        # Alternate which goes first, so drift in machine speed hits both alike.
        order = ("baseline", "verified") if round_ % 2 == 0 else ("verified", "baseline")
        for method in order:
            size = measure_save(method, engine, export, work, round_ + 1 + args.warmup, times)
        figures = ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items())
        print(f"round {round_ + 1} ({order[0]} first): {figures}", flush=True)
        if round_ < 0:  # warm-up: forget it
            print("  (warm-up, not counted)", flush=True)
            times = {k: [] for k in times}
    return times, size


def summarize(args, times: dict[str, list[float]], size: int, load_before: tuple[float, ...]) -> dict:
    """The JSON result: medians and bests of the counted rounds, their ratios and the checksum's rate."""
    median = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    return {
        "model": args.model, "rounds": args.rounds, "warmup_rounds": args.warmup, "threads": args.threads,
        "checkpoint_mb": size / 1e6,
        "seconds_median": median, "seconds_best": best, "seconds_all": times,
        "ratio_verified_to_baseline": median["verified"] / median["baseline"],
        "ratio_verified_to_baseline_best": best["verified"] / best["baseline"],
        "checksum_gb_per_s": size / median["checksum_only"] / 1e9,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
    }


def print_summary(args, result: dict, size: int, load_before: tuple[float, ...], files_in: Path) -> None:
    median, best = result["seconds_median"], result["seconds_best"]
    print(f"\n{args.model}: checkpoint {size / 1e6:,.0f} MB (weights, Adam moments, RNG, export)")
    print(f"save baseline {median['baseline']:.2f} s | verified {median['verified']:.2f} s | "
          f"ratio ×{result['ratio_verified_to_baseline']:.3f} (medians)")
    print(f"save baseline {best['baseline']:.2f} s | verified {best['verified']:.2f} s | "
          f"ratio ×{result['ratio_verified_to_baseline_best']:.3f} (best)")
    print(f"verify on resume {median['verify']:.2f} s | checksum alone {median['checksum_only']:.2f} s "
          f"({result['checksum_gb_per_s']:.1f} GB/s)")
    print(f"load average (1 min) before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; {args.rounds} rounds, "
          f"{args.threads} threads, files in {files_in}")


def main() -> int:
    args = parse_args()
    load_before = os.getloadavg()
    engine, export = build_saving(args)
    work = Path(tempfile.mkdtemp(prefix="bench_checkpoint_", dir=args.workdir))
    try:
        times, size = measure_rounds(args, engine, export, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = summarize(args, times, size, load_before)
    print_summary(args, result, size, load_before, work.parent)
    write_results(REPO / "benchmarks" / "results" / "checkpoint.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
