#!/usr/bin/env python
"""prepare_corpus's resolve stage at PubMed scale: peak memory per citation.

    python benchmarks/bench_resolve_memory.py [--citations 1000000 4000000] [--languages eng]
        [--work-dir DIR] [--output benchmarks/results/resolve_memory.json]

The resolve stage (``tokenization.corpus._resolve_shards``: the update/delete resolution over all
PMIDs) reads five key columns of every parsed row and sorts them together, so it is the one stage
of prepare_corpus whose memory grows with the corpus. For each size it writes a synthetic parsed
shard in the stage's real schema (``PARSED_SCHEMA``; text columns null, so a 4M-citation shard is
~100 MB): N baseline citations (PMIDs in random order, versions 1, n_words 0-400, 90% "eng"), then
update rows revising 5% of them and deleting 2%, as a PubMed release does. Then, in a fresh
process, it calls ``_resolve_shards`` on it and records the peak resident memory above the
start (``VmHWM``, reset through ``/proc/self/clear_refs``: it counts the pages of the memory-mapped
shard the columns are read from too) and the peak of numpy's allocations (``tracemalloc``) plus
Arrow's (its memory pool's ``max_memory``): the heap the stage itself allocates.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
import tracemalloc
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from _results import write_results  # benchmarks/ is on sys.path when a benchmark runs
from bench_vocab_words import _peak_reset, _status_bytes

REPO = Path(__file__).resolve().parents[1]
REVISE_SHARE, DELETE_SHARE = 0.05, 0.02
FULL_BASELINE_CITATIONS = 36_000_000
BATCH = 1_000_000


def write_shard(path: Path, citations: int, seed: int = 0) -> int:
    """A parsed shard of ``citations`` baseline rows plus revisions and deletes; its row count."""
    import pyarrow as pa

    from biomed_lm.tokenization.corpus import PARSED_SCHEMA

    rng = np.random.default_rng(seed)
    pmids = rng.permutation(citations).astype(np.int64) + 1
    revised = rng.choice(pmids, int(citations * REVISE_SHARE), replace=False)
    deleted = rng.choice(pmids, int(citations * DELETE_SHARE), replace=False)
    parts = [(pmids, False, 1), (revised, False, 2), (deleted, True, 0)]
    rows = 0
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, PARSED_SCHEMA) as writer:
        for keys, is_delete, version in parts:
            for start in range(0, len(keys), BATCH):
                batch = keys[start:start + BATCH]
                writer.write_batch(_batch(batch, is_delete, version, rng, PARSED_SCHEMA))
                rows += len(batch)
    return rows


def _batch(keys: np.ndarray, is_delete: bool, version: int, rng: np.random.Generator, schema):
    import pyarrow as pa

    n = len(keys)
    language = np.where(rng.random(n) < 0.9, "eng", "fre").astype(object)
    columns = {"key": pa.array(keys), "is_delete": pa.array(np.full(n, is_delete)),
               "n_words": pa.array(rng.integers(0, 400, n, dtype=np.int32), mask=np.full(n, is_delete)),
               "language": pa.array(language, pa.string(), mask=np.full(n, is_delete)),
               "version": pa.array(np.full(n, version, dtype=np.int32), mask=np.full(n, version == 0))}
    return pa.record_batch([columns.get(f.name, pa.nulls(n, f.type)) for f in schema], schema=schema)


def resolve_peak(shard: str, warm_up: str, languages: list[str]) -> dict:
    """``_resolve_shards`` on one shard (child process): peaks and time. A first call on a small
    shard loads what the first call loads (Arrow's compute kernels), so the peak is the stage's."""
    import pyarrow as pa

    from biomed_lm.tokenization.corpus import CorpusConfig, _resolve_shards

    config = CorpusConfig(inputs=[shard], output_dir="unused", languages=languages)
    _resolve_shards([Path(warm_up)], config)
    pa.default_memory_pool().release_unused()
    start = _peak_reset()
    tracemalloc.start()
    started = time.perf_counter()
    keep, dropped, funnel = _resolve_shards([Path(shard)], config)
    seconds = time.perf_counter() - started
    numpy_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"rss_peak_above_start": _status_bytes("VmHWM") - start, "numpy_peak": numpy_peak,
            "arrow_peak": pa.default_memory_pool().max_memory(), "seconds": seconds,
            "dropped": dropped, "funnel": funnel}


def in_child(fn, *args):
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--citations", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--languages", nargs="*", default=["eng"], help="the language filter (none: off)")
    parser.add_argument("--work-dir", default=None, help="where the shards are written (default: a temporary one)")
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "resolve_memory.json"))
    args = parser.parse_args(argv)
    results = []
    print("citations | rows | shard MB | peak RSS MiB | numpy + Arrow heap MiB | B/citation (RSS, heap) | s")
    with tempfile.TemporaryDirectory(dir=args.work_dir) as work:
        warm_up = Path(work) / "warm_up.arrow"
        write_shard(warm_up, 1000, seed=1)
        for citations in args.citations:
            shard = Path(work) / f"shard_{citations}.arrow"
            rows = write_shard(shard, citations)
            run = in_child(resolve_peak, str(shard), str(warm_up), args.languages)
            heap = run["numpy_peak"] + run["arrow_peak"]
            run.update(citations=citations, rows=rows, shard_bytes=shard.stat().st_size,
                       rss_per_citation=run["rss_peak_above_start"] / citations, heap_per_citation=heap / citations)
            print(f"{citations:>10,} | {rows:,} | {run['shard_bytes'] / 1e6:.0f} | "
                  f"{run['rss_peak_above_start'] / 2 ** 20:.0f} | {heap / 2 ** 20:.0f} | "
                  f"{run['rss_per_citation']:.0f}, {run['heap_per_citation']:.0f} | {run['seconds']:.1f}")
            shard.unlink()
            results.append(run)
    last = results[-1]
    print(f"at {FULL_BASELINE_CITATIONS:,} citations: peak RSS ~"
          f"{last['rss_per_citation'] * FULL_BASELINE_CITATIONS / 2 ** 30:.1f} GiB, heap ~"
          f"{last['heap_per_citation'] * FULL_BASELINE_CITATIONS / 2 ** 30:.1f} GiB")
    write_results(args.output, {"languages": args.languages, "runs": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
