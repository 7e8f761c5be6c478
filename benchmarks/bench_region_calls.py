#!/usr/bin/env python
"""The host's time per compiled region call of the pretraining step, with the compute made negligible.

    python benchmarks/bench_region_calls.py [--regions 1 4 12 whole] [--backend inductor] [--steps 50]

The trainer compiles the forward by layer (``--compile-scope layers``: the embeddings, blocks of
``--layers-per-graph`` encoder layers, the heads; each region's backward is a graph too) or as one
region (``whole``). Every region call costs the host the same fixed work whatever the tensors' sizes
(dynamo's guards, AOT autograd's runtime wrappers, inductor's wrapper), and a GPU step whose host is
slower than its device pays it in full. Here a 12-layer (``--layers``) BERT 32 wide on 32 tokens
makes the compute negligible, so a micro-batch's forward and backward time is that host work: per region size, the
milliseconds per micro-batch, the region calls it makes, and the ratio to the trainer's default (one
layer a region). The extra time per extra call, against ``whole``, estimates one call's cost.
Each configuration compiles anew (``torch._dynamo.reset()``); one torch thread.
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
VOCAB = 2000  # synthetic_pretraining_batches draws ids from 1000 up
DEFAULT = "1"  # the trainer's --compile-scope layers --layers-per-graph 1


def tiny_deep_bert(layers: int):
    from transformers import BertConfig, BertForPreTraining

    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                        intermediate_size=64, pad_token_id=0)
    return BertForPreTraining._from_config(config, attn_implementation="eager")


def region_calls(regions: str, layers: int) -> int:
    """Compiled graphs a micro-batch runs, forward and backward."""
    if regions == "whole":
        return 2
    return 2 * (2 + -(-layers // int(regions)))  # embeddings, the blocks, the heads; each with its backward


def measure(regions: str, layers: int, backend: str, steps: int, repeats: int) -> dict:
    from biomed_lm.pretrain.modeling import PretrainingModel

    torch._dynamo.reset()
    model = PretrainingModel(tiny_deep_bert(layers), attention="sdpa_padded", pad_to_multiple_of=32)
    scope, per_graph = ("whole", 1) if regions == "whole" else ("layers", int(regions))
    model.compile_losses(backend=backend, scope=scope, layers_per_graph=per_graph)
    (batch,) = synthetic_pretraining_batches(1, 2, 16, VOCAB)
    prepared = model.prepare(*(batch[key] for key in ("input_ids", "attention_mask", "token_type_ids", "labels")))

    def micro_batch() -> None:
        model(prepared=prepared, next_sentence_label=batch["next_sentence_label"]).loss.backward()

    started = time.perf_counter()
    for _ in range(3):  # compiles (the dynamic-shape recompile included)
        micro_batch()
    compile_s = time.perf_counter() - started
    windows = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(steps):
            micro_batch()
        windows.append((time.perf_counter() - started) / steps)
    return {"regions": regions, "region_calls": region_calls(regions, layers), "compile_seconds": compile_s,
            "ms_per_micro_batch": statistics.median(windows) * 1e3,
            "spread": (max(windows) - min(windows)) / min(windows)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regions", nargs="+", default=["1", "4", "12", "whole"],
                        help="layers per compiled region (1: the trainer's default), or whole")
    parser.add_argument("--layers", type=int, default=12, help="encoder layers (BERT-base's 12)")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (aot_eager: no kernels)")
    parser.add_argument("--steps", type=int, default=50, help="micro-batches per timed window")
    parser.add_argument("--repeats", type=int, default=5, help="timed windows (the median is reported)")
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "region_calls.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [measure(regions, args.layers, args.backend, args.steps, args.repeats) for regions in args.regions]
    default = next((row for row in rows if row["regions"] == DEFAULT), rows[0])
    whole = next((row for row in rows if row["regions"] == "whole"), None)
    print(f"{'layers a region':>15} {'calls':>5} {'ms/micro-batch':>14} {'x default':>9} {'us/extra call':>13} "
          f"{'compile s':>9}")
    for row in rows:
        row["ratio_to_default"] = row["ms_per_micro_batch"] / default["ms_per_micro_batch"]
        extra_calls = row["region_calls"] - whole["region_calls"] if whole else 0
        row["us_per_extra_call"] = ((row["ms_per_micro_batch"] - whole["ms_per_micro_batch"]) * 1e3 / extra_calls
                                    if extra_calls else None)
        per_call = f"{row['us_per_extra_call']:.0f}" if row["us_per_extra_call"] is not None else "-"
        print(f"{row['regions']:>15} {row['region_calls']:>5} {row['ms_per_micro_batch']:>14.2f} "
              f"{row['ratio_to_default']:>9.2f} {per_call:>13} {row['compile_seconds']:>9.0f}")
    result = {"backend": args.backend, "layers": args.layers, "steps": args.steps, "repeats": args.repeats,
              "baseline": f"{DEFAULT} layer a region (the trainer's default)", "results": rows}
    write_results(args.output, result)
    return result


if __name__ == "__main__":
    main()
