#!/usr/bin/env python
"""Ingestion benchmark: throughput (docs/s, MB/s) and peak memory with the input replicated 1x, 10x, 30x.

    python benchmarks/bench_ingest.py [--input data/sample/medline16n0902_sample.xml.gz] [--replicas 1 10 30]

Every measurement runs in a fresh child process and reports its own peak RSS, so the numbers are
comparable. Baselines measured in the same run on the same files:

* ``dom``: ``xml.etree.ElementTree.parse`` of the whole file, then the abstracts (the naive way);
* ``iterparse``: stdlib ``iterparse`` with elements cleared (the textbook streaming way).

Ours: ``parse`` = ``iter_pubmed_records`` alone; ``pipeline`` = the whole of ``prepare_corpus``
(parse, resolve, sentence splitting, saving) with one worker. Peak memory must stay flat from 1x to
10x for the streaming readers; the dom baseline shows what growth looks like.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _results import write_results  # benchmarks/ is on sys.path when a benchmark runs

REPO = Path(__file__).resolve().parents[1]


def replicate(source: Path, times: int, out: Path) -> tuple[int, int]:
    """Write ``times`` copies of the records of ``source`` into one gzipped XML file, renumbering
    PMIDs so every copy is a distinct citation. Returns (citations, uncompressed bytes)."""
    text = gzip.open(source, "rt", encoding="utf-8").read() if source.suffix == ".gz" else source.read_text()
    head_end = text.index(">", text.index("<MedlineCitationSet") if "<MedlineCitationSet" in text
                          else text.index("<PubmedArticleSet")) + 1
    tail_start = text.rindex("</")
    head, body, tail = text[:head_end], text[head_end:tail_start], text[tail_start:]
    total = 0
    with gzip.open(out, "wt", encoding="utf-8", compresslevel=6) as handle:
        handle.write(head)
        for copy in range(times):
            offset = copy * 100_000_000
            renumbered = re.sub(r"(<PMID Version=\"\d+\">)(\d+)(</PMID>)",
                                lambda m: f"{m.group(1)}{int(m.group(2)) + offset}{m.group(3)}", body)
            handle.write(renumbered)
            total += len(renumbered.encode())
        handle.write(tail)
    citations = body.count("<MedlineCitation ") * times + body.count("<PubmedArticle>") * times
    return citations, total + len(head) + len(tail)


# ------------------------------------------------------------------------------ child measurements

def child_dom(path: str) -> int:
    import xml.etree.ElementTree as ET

    root = ET.parse(gzip.open(path)).getroot()
    return sum(1 for c in root.iter("MedlineCitation")
               if " ".join("".join(a.itertext()) for a in c.iter("AbstractText")))


def child_iterparse(path: str) -> int:
    import xml.etree.ElementTree as ET

    docs = 0
    for _, element in ET.iterparse(gzip.open(path), events=("end",)):
        if element.tag == "MedlineCitation":
            if " ".join("".join(a.itertext()) for a in element.iter("AbstractText")):
                docs += 1
            element.clear()
    return docs


def child_parse(path: str) -> int:
    from biomed_lm.tokenization.pubmed_xml import Citation, iter_pubmed_records

    return sum(1 for r in iter_pubmed_records(path) if isinstance(r, Citation) and r.abstract)


def child_pipeline(path: str) -> int:
    from biomed_lm.tokenization.corpus import CorpusConfig, prepare_corpus

    with tempfile.TemporaryDirectory() as out:
        summary = prepare_corpus(CorpusConfig(inputs=[path], output_dir=out, num_proc=1, min_words=0))
    return summary["funnel"]["with_abstract"]


CHILDREN = {"dom": child_dom, "iterparse": child_iterparse, "parse": child_parse, "pipeline": child_pipeline}


def proc_status_mib(key: str) -> float | None:
    """A memory figure of this process from /proc/self/status (Linux), in MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def peak_rss_mib() -> float:
    """This process's peak resident memory. VmHWM belongs to the address space, which exec
    replaces; ru_maxrss survives exec on Linux and would include the parent's size at fork."""
    peak = proc_status_mib("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class AnonymousMemorySampler(threading.Thread):
    """Samples RssAnon (heap and other private memory) every 10 ms. Peak RSS also counts the pages
    of memory-mapped Arrow files that were read, which the kernel can drop at any time; the
    anonymous part is what must not grow with the input."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_mib = 0.0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.peak_mib = max(self.peak_mib, self.read())
            self._halt.wait(0.01)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.peak_mib = max(self.peak_mib, self.read())

    @staticmethod
    def read() -> float:
        return proc_status_mib("RssAnon") or 0.0


def measure(mode: str, path: Path) -> dict:
    result = subprocess.run([sys.executable, __file__, "--child", mode, str(path)], capture_output=True,
                            text=True, check=True, cwd=REPO)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", default=str(REPO / "data" / "sample" / "medline16n0902_sample.xml.gz"))
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 10, 30])
    parser.add_argument("--modes", nargs="+", default=list(CHILDREN))
    parser.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "ingest.json"))
    args = parser.parse_args()

    if args.child:
        mode, path = args.child
        sampler = AnonymousMemorySampler()
        sampler.start()
        start = time.perf_counter()
        docs = CHILDREN[mode](path)
        seconds = time.perf_counter() - start
        sampler.stop()
        print(json.dumps({"docs": docs, "seconds": seconds, "peak_mib": peak_rss_mib(),
                          "peak_anon_mib": sampler.peak_mib}))
        return

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for times in args.replicas:
            path = Path(tmp) / f"replica{times}.xml.gz"
            citations, xml_bytes = replicate(Path(args.input), times, path)
            for mode in args.modes:
                m = measure(mode, path)
                rows.append({"replicas": times, "mode": mode, "citations": citations, "xml_mb": xml_bytes / 1e6,
                             "docs_with_abstract": m["docs"], "seconds": m["seconds"],
                             "docs_per_s": citations / m["seconds"], "mb_per_s": xml_bytes / 1e6 / m["seconds"],
                             "peak_mib": m["peak_mib"], "peak_anon_mib": m["peak_anon_mib"]})
                r = rows[-1]
                print(f"{times:>3}x {mode:<10} {r['citations']:>7} citations {r['xml_mb']:8.1f} MB  "
                      f"{r['docs_per_s']:9.0f} docs/s {r['mb_per_s']:7.1f} MB/s  peak RSS {r['peak_mib']:7.1f} MiB"
                      f"  peak anon {r['peak_anon_mib']:7.1f} MiB", flush=True)

    by = {(r["replicas"], r["mode"]): r for r in rows}
    print("\nratios (same run):")
    for times in args.replicas:
        for ours in ("parse", "pipeline"):
            for base in ("dom", "iterparse"):
                if (times, ours) in by and (times, base) in by:
                    o, b = by[(times, ours)], by[(times, base)]
                    print(f"  {times:>3}x {ours}/{base}: throughput x{o['docs_per_s'] / b['docs_per_s']:.2f}, "
                          f"peak memory x{o['peak_mib'] / b['peak_mib']:.2f}")
    lo, hi = min(args.replicas), max(args.replicas)
    for mode in args.modes:
        if (lo, mode) in by and (hi, mode) in by:
            h, l = by[(hi, mode)], by[(lo, mode)]
            print(f"  {mode}: peak RSS {hi}x / {lo}x = {h['peak_mib'] / l['peak_mib']:.2f}, "
                  f"peak anonymous memory {hi}x / {lo}x = {h['peak_anon_mib'] / l['peak_anon_mib']:.2f}")
    write_results(args.output, rows)


if __name__ == "__main__":
    main()
