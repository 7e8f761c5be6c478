#!/usr/bin/env python
"""The data path at scale: every stage through its real command line, at several corpus sizes.

    python benchmarks/bench_scale.py --sizes 10MB 50MB 200MB [--sources more.xml.gz DIR ...]
        [--num-proc 2] [--work-dir DIR] [--output benchmarks/results/scale.json]

For each size (uncompressed XML bytes) it writes a synthetic PubMed release of .xml.gz files:
baseline files made of the real citations of the embedded sample (``data/sample``: 604 MEDLINE
citations, and the 725 plain-text abstracts wrapped as citations) plus whatever ``--sources``
names (PubMed XML or text files, or directories of them), each copy with new PMIDs; then update
files that revise (same PMID, a later file wins) and delete (``<DeleteCitation>``) a share of the
earlier citations. Then each stage runs in a fresh subprocess, exactly as a user would run it:

    prepare_corpus -> build_vocab -> vocab_report -> create_pretraining_data (NSP at 128 and
    512, then DRP at 128 over the citation links)

Every synthetic citation after the first cites ``LINKS_PER_CITATION`` earlier ones (a reference
list of their PMIDs, drawn from the citation's own PMID as seed), so the DRP stage has a link
index of realistic density to build and draw from.

Per stage: wall seconds, CPU seconds, throughput (MB/s and docs/s, and per core), peak RSS of the
stage's own process and of its child processes (sampled with psutil every 50 ms, summed over the
live processes; plus the kernel's ``ru_maxrss`` from ``wait4``: the largest single process among
the stage and the children it waited for) and the bytes it left on disk. Across sizes: the scaling
exponent b of time and of peak memory (least-squares fit of log y = a + b log size) and a
projection to the full PubMed baseline.

Bad input: at one size (``--bad-at``, default the smallest) prepare_corpus
runs a second time on the same files plus a truncated .xml.gz (its own PMID range), a gzipped
file that is not XML and a byte-identical copy of a baseline file. The check: the corpus holds the
clean run's documents plus only the truncated file's surviving records, and the summary names all
three files.
"""

from __future__ import annotations

import argparse
import gzip
import html
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _results import write_results  # benchmarks/ is on sys.path when a benchmark runs

REPO = Path(__file__).resolve().parents[1]
SAMPLE = [REPO / "data" / "sample" / "medline16n0902_sample.xml.gz",
          REPO / "data" / "sample" / "sywada_PubMedAbstract_1MB.txt"]
FIRST_PMID = 10_000_000
TRUNCATED_PMID = 900_000_000      # the truncated file's citations: their own PMID range
REVISE_SHARE, DELETE_SHARE = 0.05, 0.02
# The full PubMed baseline (2025/2026 release): what the projection scales to.
FULL_BASELINE = {"files": 1274, "citations": 36_000_000, "abstract_text_bytes": 20e9}
LINKS_PER_CITATION = 3  # references per synthetic citation (to earlier PMIDs of the release)
STAGES = ("prepare_corpus", "build_vocab", "vocab_report", "create_pretraining_data_128",
          "create_pretraining_data_512", "create_pretraining_data_drp_128")

_RECORD = re.compile(r"<(PubmedArticle|MedlineCitation)[\s>].*?</\1>", re.S)
_OWN_PMID = re.compile(r"<PMID Version=\"(\d+)\">\d+</PMID>")


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*([\d.]+)\s*([KMG]?)B?\s*", text.upper())
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 20MB, 1GB)")
    return int(float(match.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[match.group(2)])


def size_label(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}"
    return f"{nbytes}B"


# ------------------------------------------------------------------------------ synthetic release

def load_templates(sources: list[Path]) -> list[str]:
    """Citation records with ``{pmid}`` in place of their own PMID, as ``<PubmedArticle>`` blocks."""
    files: list[Path] = []
    for source in sources:
        files += sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
    templates = []
    for path in files:
        name = path.name.lower()
        opener = gzip.open if name.endswith(".gz") else open
        if name.endswith((".xml", ".xml.gz")):
            with opener(path, "rt", encoding="utf-8") as handle:
                text = handle.read()
            for match in _RECORD.finditer(text):
                record = _OWN_PMID.sub(lambda m: f'<PMID Version="{m.group(1)}">{{pmid}}</PMID>',
                                       match.group(0).replace("{", "{{").replace("}", "}}"), count=1)
                if "{pmid}" not in record:
                    continue
                templates.append(record if match.group(1) == "PubmedArticle"
                                 else f"<PubmedArticle>\n{record}\n</PubmedArticle>")
        elif name.endswith((".txt", ".txt.gz", ".text")):
            with opener(path, "rt", encoding="utf-8") as handle:
                for line in handle:
                    line = line.strip()
                    if len(line.split()) < 5:
                        continue
                    title, _, rest = line.partition(". ")
                    body = html.escape(rest or line, quote=False).replace("{", "{{").replace("}", "}}")
                    head = html.escape(title + ".", quote=False).replace("{", "{{").replace("}", "}}")
                    templates.append(
                        '<PubmedArticle>\n<MedlineCitation Status="MEDLINE" Owner="NLM">\n'
                        '<PMID Version="1">{pmid}</PMID>\n<Article PubModel="Print">\n'
                        f"<ArticleTitle>{head}</ArticleTitle>\n<Abstract>\n<AbstractText>{body}</AbstractText>\n"
                        "</Abstract>\n<Language>eng</Language>\n</Article>\n</MedlineCitation>\n</PubmedArticle>")
    if not templates:
        raise SystemExit(f"bench_scale: no citation found in {', '.join(map(str, sources))}")
    return templates


HEAD = '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE PubmedArticleSet>\n<PubmedArticleSet>\n'
TAIL = "</PubmedArticleSet>\n"


def write_xml(path: Path, records: list[str]) -> int:
    """One gzipped PubMed file; returns its uncompressed bytes."""
    data = (HEAD + "\n".join(records) + "\n" + TAIL).encode()
    with gzip.open(path, "wb", compresslevel=1) as handle:
        handle.write(data)
    return len(data)


def with_references(record: str, pmid: int) -> str:
    """``record`` with a reference list of up to LINKS_PER_CITATION earlier PMIDs of the release
    (a function of ``pmid`` alone, so a revised version cites the same ones)."""
    earlier = pmid - FIRST_PMID
    if earlier <= 0:
        return record
    rng = random.Random(pmid)
    cited = sorted({FIRST_PMID + rng.randrange(earlier) for _ in range(LINKS_PER_CITATION)})
    references = "".join(f'<Reference><ArticleIdList><ArticleId IdType="pubmed">{p}</ArticleId></ArticleIdList>'
                         "</Reference>" for p in cited)
    head, _, tail = record.rpartition("</PubmedArticle>")
    return f"{head}<PubmedData><ReferenceList>{references}</ReferenceList></PubmedData>\n</PubmedArticle>{tail}"


def revise(record: str) -> str:
    """A later version of a citation (same PMID and Version; the later file wins)."""
    return record.replace("</AbstractText>", " Revised in an update file.</AbstractText>", 1)


def build_release(templates: list[str], target: int, out: Path, file_bytes: int, seed: int = 0) -> dict:
    """Baseline files (new PMIDs per copy of the templates) then two update files that revise and
    delete a share of the baseline's citations, ~``target`` uncompressed bytes in all."""
    out.mkdir(parents=True, exist_ok=True)
    baseline_target = int(target * (1 - REVISE_SHARE))
    rng = random.Random(seed)
    written = {"xml_bytes": 0, "gz_bytes": 0, "files": 0, "citations": 0, "revised": 0, "deleted": 0}
    pmids: list[int] = []
    by_pmid: dict[int, int] = {}
    batch: list[str] = []
    batch_bytes = 0
    index = 0

    def flush(name: str, records: list[str]) -> None:
        path = out / name
        written["xml_bytes"] += write_xml(path, records)
        written["gz_bytes"] += path.stat().st_size
        written["files"] += 1

    baseline_files = 0
    while written["xml_bytes"] + batch_bytes < baseline_target or not pmids:
        pmid = FIRST_PMID + index
        template_index = index % len(templates)
        record = with_references(templates[template_index].format(pmid=pmid), pmid)
        batch.append(record)
        batch_bytes += len(record) + 1
        pmids.append(pmid)
        by_pmid[pmid] = template_index
        index += 1
        if batch_bytes >= file_bytes:
            baseline_files += 1
            flush(f"pubmed_b{baseline_files:04d}.xml.gz", batch)
            batch, batch_bytes = [], 0
    if batch:
        baseline_files += 1
        flush(f"pubmed_b{baseline_files:04d}.xml.gz", batch)
    written["citations"] = len(pmids)
    written["baseline_files"] = baseline_files

    chosen = rng.sample(pmids, max(2, int(len(pmids) * (REVISE_SHARE + DELETE_SHARE))))
    n_revise = max(1, int(len(pmids) * REVISE_SHARE))
    revised, deleted = sorted(chosen[:n_revise]), sorted(chosen[n_revise:])
    half = len(revised) // 2
    for number, (rev, dele) in enumerate([(revised[:half], deleted[: len(deleted) // 2]),
                                          (revised[half:], deleted[len(deleted) // 2:])], start=1):
        records = [revise(with_references(templates[by_pmid[p]].format(pmid=p), p)) for p in rev]
        if dele:
            records.append("<DeleteCitation>\n" + "\n".join(f'<PMID Version="1">{p}</PMID>' for p in dele)
                           + "\n</DeleteCitation>")
        flush(f"pubmed_u{number:04d}.xml.gz", records)
    written["revised"], written["deleted"] = len(revised), len(deleted)
    written["expected_unique_documents"] = len(pmids) - len(deleted)
    return written


def plant_bad_files(clean: Path, bad: Path, templates: list[str], file_bytes: int) -> dict:
    """``bad``: hard links to the clean release plus a truncated .xml.gz (PMIDs from
    TRUNCATED_PMID), a gzipped text file named .xml.gz and a copy of the first baseline file that
    sorts right after it. Returns their paths and what the truncated file held."""
    bad.mkdir(parents=True, exist_ok=True)
    for path in sorted(clean.iterdir()):
        os.link(path, bad / path.name)
    records, size, pmid = [], 0, TRUNCATED_PMID
    while size < file_bytes:
        records.append(templates[(pmid - TRUNCATED_PMID) % len(templates)].format(pmid=pmid))
        size += len(records[-1])
        pmid += 1
    full = bad / "whole.tmp"
    write_xml(full, records)
    data = full.read_bytes()
    full.unlink()
    truncated = bad / "pubmed_b0000_truncated.xml.gz"
    truncated.write_bytes(data[: int(len(data) * 0.6)])
    not_xml = bad / "pubmed_b0000_not_xml.xml.gz"
    with gzip.open(not_xml, "wt", encoding="utf-8") as handle:
        handle.write("This is a plain-text note that was saved with the wrong name.\n" * 200)
    duplicate = bad / "pubmed_b0001_copy.xml.gz"
    shutil.copyfile(clean / "pubmed_b0001.xml.gz", duplicate)
    return {"truncated": str(truncated), "not_xml": str(not_xml), "duplicate": str(duplicate),
            "duplicate_of": str(bad / "pubmed_b0001.xml.gz"), "truncated_citations_written": len(records)}


# ------------------------------------------------------------------------------ measuring a stage

def rss_anon(pid: int) -> int:
    """Anonymous resident bytes of a process (heap, not the pages of memory-mapped files, which the
    kernel may drop at will); 0 where /proc is not readable."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class TreeSampler(threading.Thread):
    """Peak RSS of a process, of its descendants (summed over those alive at once) and of both;
    the same for anonymous memory (RssAnon)."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        import psutil

        self.process = psutil.Process(pid)
        self.interval = interval
        self.peak_main = self.peak_children = self.peak_tree = 0
        self.max_workers = 0
        self.anon_main = self.anon_children = self.anon_tree = 0
        self.main_cpu = 0.0  # the stage's own process, its threads included (last sample)
        self._halt = threading.Event()

    def run(self) -> None:
        import psutil

        while not self._halt.is_set():
            try:
                main = self.process.memory_info().rss
                times = self.process.cpu_times()
                children = self.process.children(recursive=True)
            except psutil.Error:
                break
            child_rss = child_anon = 0
            for child in children:
                try:
                    child_rss += child.memory_info().rss
                    child_anon += rss_anon(child.pid)
                except psutil.Error:
                    pass
            main_anon = rss_anon(self.process.pid)
            self.anon_main = max(self.anon_main, main_anon)
            self.anon_children = max(self.anon_children, child_anon)
            self.anon_tree = max(self.anon_tree, main_anon + child_anon)
            self.main_cpu = times.user + times.system
            self.peak_main = max(self.peak_main, main)
            self.peak_children = max(self.peak_children, child_rss)
            self.peak_tree = max(self.peak_tree, main + child_rss)
            self.max_workers = max(self.max_workers, len(children))
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def run_stage(name: str, argv: list[str], out_dir: Path, log_dir: Path) -> dict:
    """Run one CLI in a fresh Python process; its wall and CPU time, memory and bytes written."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="true", HF_DATASETS_DISABLE_PROGRESS_BARS="1")
    log = (log_dir / f"{name}.log").open("wb")
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, *argv], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    sampler = TreeSampler(process.pid)
    sampler.start()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    sampler.stop()
    process.returncode = os.waitstatus_to_exitcode(status)
    log.close()
    mib = 1024 * 1024
    return {"stage": name, "exit_status": process.returncode, "seconds": seconds,
            "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "cpu_seconds_main": min(sampler.main_cpu, usage.ru_utime + usage.ru_stime),
            "peak_rss_main_mib": sampler.peak_main / mib, "peak_rss_children_mib": sampler.peak_children / mib,
            "peak_rss_tree_mib": sampler.peak_tree / mib, "maxrss_kernel_mib": usage.ru_maxrss / 1024,
            "peak_anon_main_mib": sampler.anon_main / mib, "peak_anon_children_mib": sampler.anon_children / mib,
            "peak_anon_tree_mib": sampler.anon_tree / mib,
            "max_child_processes": sampler.max_workers, "bytes_written": dir_bytes(out_dir),
            "load_average_1min_after": os.getloadavg()[0],
            "log": str(log_dir / f"{name}.log")}


def corpus_stats(corpus: Path) -> dict:
    import pyarrow as pa

    docs = text_bytes = 0
    for shard in sorted(corpus.glob("data-*.arrow")):
        with pa.memory_map(str(shard)) as source:
            table = pa.ipc.open_stream(source).read_all()
        docs += table.num_rows
        text_bytes += sum(len(t.encode()) for t in table.column("text").to_pylist())
    return {"documents": docs, "text_bytes": text_bytes}


def corpus_ids(corpus: Path) -> set[int]:
    import pyarrow as pa

    ids: set[int] = set()
    for shard in sorted(corpus.glob("data-*.arrow")):
        with pa.memory_map(str(shard)) as source:
            ids.update(int(i) for i in pa.ipc.open_stream(source).read_all().column("id").to_pylist())
    return ids


def stage_argv(stage: str, release: Path, work: Path, num_proc: int, min_words: int) -> tuple[list[str], Path]:
    corpus, vocab = work / "corpus", work / "vocab"
    if stage == "prepare_corpus":
        return ["launch/prepare_corpus.py", "--inputs", str(release), "--output-dir", str(corpus),
                "--num-proc", str(num_proc), "--min-words", str(min_words), "--overwrite"], corpus
    if stage == "build_vocab":
        return ["launch/build_vocab.py", "--inputs", str(corpus), "--output-dir", str(vocab),
                "--no-progress", "--overwrite"], vocab
    if stage == "vocab_report":
        return ["launch/vocab_report.py", "--tokenizers", f"pubmed={vocab}", "--corpus", f"corpus={corpus}",
                "--output-dir", str(work / "vocab_report")], work / "vocab_report"
    length = stage.rsplit("_", 1)[1]
    pair_task = "drp" if "_drp_" in stage else "nsp"
    out = work / f"data{length}" if pair_task == "nsp" else work / f"data_{pair_task}{length}"
    return ["launch/create_pretraining_data.py", "--corpus", str(corpus), "--tokenizer", str(vocab),
            "--output-dir", str(out), "--max-seq-length", length, "--pair-task", pair_task,
            "--num-proc", str(num_proc), "--overwrite"], out


# ------------------------------------------------------------------------------ fits and projection

def fit_exponent(sizes: list[float], values: list[float]) -> float | None:
    """Least-squares slope b of log(value) = a + b log(size); None for fewer than two usable points."""
    points = [(math.log(s), math.log(v)) for s, v in zip(sizes, values) if s > 0 and v and v > 0]
    if len(points) < 2 or len({x for x, _ in points}) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def project(row: dict, text_bytes: float, time_exp: float | None, mem_exp: float | None, cores: int,
            target_cores: int, anon_exp: float | None = None) -> dict:
    """The largest measured size scaled to the full baseline's abstract text.

    Time, from CPU seconds (wall time on a shared machine measures the neighbours too): CPU time
    scaled by (full / measured) ** the CPU-time exponent; the stage's own process counts as serial
    (its threads included), its worker processes' CPU as perfectly parallel, so the wall on n
    cores is main + workers / n (I/O, memory bandwidth and start-up ignored: a lower bound).
    Memory: the stage's process peak scaled by the memory exponent, the workers' peak by it too and
    by target_cores / cores (one worker per core); the same for anonymous memory (RssAnon: what
    cannot be dropped; RSS also counts pages of memory-mapped Arrow files) with its own exponent."""
    factor = FULL_BASELINE["abstract_text_bytes"] / text_bytes
    scale_t = factor ** (time_exp if time_exp is not None else 1.0)
    scale_m = factor ** (mem_exp if mem_exp is not None else 0.0)
    serial = row["cpu_seconds_main"] * scale_t
    parallel = max(0.0, row["cpu_seconds"] - row["cpu_seconds_main"]) * scale_t
    worker_share = target_cores / cores if row["max_child_processes"] else 1.0
    scale_a = factor ** (anon_exp if anon_exp is not None else 0.0)
    anon = {}
    if "peak_anon_main_mib" in row:
        anon = {"peak_anon_gib_on_measured_cores": (row["peak_anon_main_mib"] + row["peak_anon_children_mib"])
                * scale_a / 1024,
                "peak_anon_gib_on_target_cores": (row["peak_anon_main_mib"]
                                                  + row["peak_anon_children_mib"] * worker_share) * scale_a / 1024}
    return anon | {"cpu_hours": (serial + parallel) / 3600,
            "hours_on_measured_cores": (serial + parallel / cores) / 3600,
            "hours_on_target_cores": (serial + parallel / target_cores) / 3600,
            "wall_hours_scaled_as_measured": row["seconds"] * scale_t / 3600,
            "peak_gib_on_measured_cores": (row["peak_rss_main_mib"] + row["peak_rss_children_mib"]) * scale_m / 1024,
            "peak_gib_on_target_cores": (row["peak_rss_main_mib"]
                                         + row["peak_rss_children_mib"] * worker_share) * scale_m / 1024}


# ------------------------------------------------------------------------------ main

def summarize(args, cores: int, templates: list[str], rows: list[dict], releases: list[dict],
              bad_check: dict | None, quiet: bool = False) -> dict:
    """Exponents and projection from the rows so far; the JSON result (written after every size)."""
    text_by_size = {r["size"]: r.get("text_bytes", 0) for r in releases}
    exponents, projections = {}, {}
    for stage in args.stages:
        stage_rows = [r for r in rows if r["stage"] == stage and r["exit_status"] == 0]
        xs = [text_by_size[r["size"]] for r in stage_rows]
        exponents[stage] = {
            "time": fit_exponent(xs, [r["seconds"] for r in stage_rows]),
            "cpu_time": fit_exponent(xs, [r["cpu_seconds"] for r in stage_rows]),
            "peak_rss_tree": fit_exponent(xs, [r["peak_rss_tree_mib"] for r in stage_rows]),
            "peak_rss_main": fit_exponent(xs, [r["peak_rss_main_mib"] for r in stage_rows]),
            "maxrss_kernel": fit_exponent(xs, [r["maxrss_kernel_mib"] for r in stage_rows]),
            "peak_anon_main": fit_exponent(xs, [r.get("peak_anon_main_mib") for r in stage_rows]),
            "peak_anon_tree": fit_exponent(xs, [r.get("peak_anon_tree_mib") for r in stage_rows]),
            # The two largest sizes only: the fixed start-up of a CLI (imports, ~3 s) weighs on the
            # small sizes and pulls the all-sizes slope below the marginal one.
            "cpu_time_largest_two": fit_exponent(xs[-2:], [r["cpu_seconds"] for r in stage_rows][-2:]),
            "peak_rss_tree_largest_two": fit_exponent(xs[-2:], [r["peak_rss_tree_mib"] for r in stage_rows][-2:]),
            "peak_anon_tree_largest_two": fit_exponent(xs[-2:], [r.get("peak_anon_tree_mib")
                                                                 for r in stage_rows][-2:]),
        }
        if stage_rows and xs[-1]:
            projections[stage] = {
                "cores_measured": cores,
                "exponents_used": "cpu_time_largest_two, peak_rss_tree_largest_two, peak_anon_tree_largest_two",
                **project(stage_rows[-1], xs[-1], exponents[stage]["cpu_time_largest_two"],
                          exponents[stage]["peak_rss_tree_largest_two"], cores, 64,
                          exponents[stage]["peak_anon_tree_largest_two"])}

    if not quiet:
        print("\nscaling exponents (log-log fit over corpus text bytes) and projection to the full baseline "
              f"({FULL_BASELINE['abstract_text_bytes'] / 1e9:g} GB of text, {FULL_BASELINE['citations'] / 1e6:g}M "
              f"citations, {FULL_BASELINE['files']} files):")
        print(f"  {'stage':<28} {'b(wall)':>8} {'b(cpu)':>8} {'b(mem)':>8} {'b2(cpu)':>8} {'b2(mem)':>8} {'cpu h':>8} "
              f"{'h@' + str(cores) + 'cores':>10} {'h@64':>8} {'GiB@' + str(cores):>8} {'GiB@64':>8}")
        for stage in args.stages:
            e, p = exponents[stage], projections.get(stage)
            if p:
                print(f"  {stage:<28} {_num(e['time'])} {_num(e['cpu_time'])} {_num(e['peak_rss_tree'])} "
                      f"{_num(e['cpu_time_largest_two'])} {_num(e['peak_rss_tree_largest_two'])} "
                      f"{p['cpu_hours']:8.2f} {p['hours_on_measured_cores']:10.2f} {p['hours_on_target_cores']:8.2f} "
                      f"{p['peak_gib_on_measured_cores']:8.1f} {p['peak_gib_on_target_cores']:8.1f}")
    result = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "num_proc": args.num_proc,
                          "load_average_at_end": os.getloadavg()},
              "templates": len(templates), "releases": releases, "rows": rows, "exponents": exponents,
              "full_baseline": FULL_BASELINE, "projection": projections, "bad_inputs": bad_check}
    write_results(args.output, result)
    return result


def _num(value: float | None) -> str:
    return f"{value:8.2f}" if value is not None else "       -"


def check_bad_inputs(summary: dict, planted: dict, clean_ids: set[int], bad_ids: set[int]) -> dict:
    problem_paths = {p["path"] for p in summary.get("problems", [])}
    duplicates = {d["path"]: d["same_as"] for d in summary.get("duplicate_files", [])}
    extra = bad_ids - clean_ids
    from_truncated = {i for i in extra if i >= TRUNCATED_PMID}
    return {
        "truncated_named": planted["truncated"] in problem_paths,
        "not_xml_named": planted["not_xml"] in problem_paths,
        "duplicate_named": duplicates.get(planted["duplicate"]) == planted["duplicate_of"],
        "clean_documents_lost": len(clean_ids - bad_ids),
        "documents_from_elsewhere": len(extra - from_truncated),
        "truncated_documents_kept": len(from_truncated),
        "truncated_citations_written": planted["truncated_citations_written"],
        "problem_reasons": {p["path"].rsplit("/", 1)[-1]: p["reason"] for p in summary.get("problems", [])},
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=parse_size, default=[parse_size(s) for s in ("10MB", "50MB")],
                        help="uncompressed XML bytes of each synthetic release (e.g. 100MB 1GB 5GB)")
    parser.add_argument("--sources", nargs="*", default=[],
                        help="more real PubMed XML or text files (or directories) to draw citations from")
    parser.add_argument("--file-mb", type=float, default=16.0, help="uncompressed MB per baseline file (at "
                        "most a quarter of the size, so each size has at least 4 files to parse in parallel)")
    parser.add_argument("--num-proc", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--min-words", type=int, default=128)
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    parser.add_argument("--bad-at", type=parse_size, default=None,
                        help="the size whose input gets the bad files (default: the smallest; 0: none)")
    parser.add_argument("--work-dir", default=None, help="keep releases and outputs here (default: a temp dir)")
    parser.add_argument("--output", "--out", default=str(REPO / "benchmarks" / "results" / "scale.json"))
    parser.add_argument("--summarize", metavar="JSON", default=None,
                        help="only recompute the exponents and the projection of an earlier result file")
    return parser.parse_args(argv)


def measure_stage(args, stage: str, release: Path, work: Path, info: dict, cores: int) -> dict:
    """One stage on one size's release: its row (time, CPU, memory, throughput per core), printed as it lands;
    ``prepare_corpus`` also adds the corpus' counts to the release's ``info``."""
    argv_, out_dir = stage_argv(stage, release, work, args.num_proc, args.min_words)
    row = run_stage(stage, argv_, out_dir, work / "logs") | {"size": info["size"], "target_bytes": info["target_bytes"]}
    if stage == "prepare_corpus":
        summary = json.loads((work / "corpus" / "summary.json").read_text())
        info |= corpus_stats(work / "corpus")
        info |= {"funnel": summary["funnel"], "dropped": summary["dropped"], "problems": len(summary["problems"])}
        row |= {"input_mb": info["xml_bytes"] / 1e6, "input_docs": info["citations"]}
    else:
        row |= {"input_mb": info["text_bytes"] / 1e6, "input_docs": info["documents"]}
    if "_drp_" in stage and row["exit_status"] == 0:  # the link index it built and drew from
        made = json.loads((out_dir / "pretraining_data.json").read_text())["summary"]
        row |= {"links": made["links"], "pair_labels": made["pair_labels"]}
    row["mb_per_s"] = row["input_mb"] / row["seconds"]
    row["docs_per_s"] = row["input_docs"] / row["seconds"]
    row["mb_per_s_per_core"] = row["mb_per_s"] / cores
    row["docs_per_s_per_core"] = row["docs_per_s"] / cores
    print(f"{info['size']:>7} {stage:<28} {row['seconds']:8.1f} s  cpu {row['cpu_seconds']:8.1f} s  "
          f"{row['mb_per_s']:7.2f} MB/s {row['docs_per_s']:8.0f} docs/s  "
          f"peak main {row['peak_rss_main_mib']:7.0f} MiB children {row['peak_rss_children_mib']:7.0f} "
          f"MiB  disk {row['bytes_written'] / 1e6:8.1f} MB  exit {row['exit_status']}", flush=True)
    if row["exit_status"] != 0:
        print(f"  stage failed; see {row['log']}", flush=True)
    return row


def measure_bad_inputs(args, work: Path, templates, file_bytes: int, label: str) -> dict:
    """The release again with bad files planted: prepare_corpus must name each and keep every good citation."""
    planted = plant_bad_files(work / "release", work / "release_bad", templates, file_bytes)
    argv_, _ = stage_argv("prepare_corpus", work / "release_bad", work / "bad", args.num_proc, args.min_words)
    row = run_stage("prepare_corpus_bad_inputs", argv_, work / "bad" / "corpus", work / "logs")
    summary = json.loads((work / "bad" / "corpus" / "summary.json").read_text())
    bad_check = check_bad_inputs(summary, planted, corpus_ids(work / "corpus"), corpus_ids(work / "bad" / "corpus"))
    bad_check |= {"size": label, "exit_status": row["exit_status"], "seconds": row["seconds"]}
    print(f"{label:>7} bad inputs: {json.dumps(bad_check)}", flush=True)
    return bad_check


def measure_size(args, size: int, root: Path, templates, cores: int, with_bad_inputs: bool
                 ) -> tuple[list[dict], dict, dict | None]:
    """One synthetic release of ``size`` bytes through every stage: the rows, the release's counts, and the
    bad-input check where this size carries it."""
    label = size_label(size)
    work = root / label
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    file_bytes = int(max(1e5, min(args.file_mb * 1e6, size / 4)))
    started = time.perf_counter()
    info = build_release(templates, size, work / "release", file_bytes)
    info |= {"size": label, "target_bytes": size, "generate_seconds": time.perf_counter() - started}
    rows = [measure_stage(args, stage, work / "release", work, info, cores) for stage in args.stages]
    bad_check = None
    if with_bad_inputs and "prepare_corpus" in args.stages:
        bad_check = measure_bad_inputs(args, work, templates, file_bytes, label)
    if not args.work_dir:
        for stale in ("release", "release_bad", "bad"):
            shutil.rmtree(work / stale, ignore_errors=True)
    return rows, info, bad_check


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summarize:
        earlier = json.loads(Path(args.summarize).read_text())
        args.num_proc, args.stages = earlier["machine"]["num_proc"], list(earlier["exponents"])
        cores = min(args.num_proc, earlier["machine"]["cpus"])
        summarize(args, cores, [""] * earlier["templates"], earlier["rows"], earlier["releases"],
                  earlier["bad_inputs"])
        return 0

    sizes = sorted(args.sizes)
    bad_at = sizes[0] if args.bad_at is None else args.bad_at
    cores = min(args.num_proc, os.cpu_count() or 1)
    templates = load_templates(SAMPLE + [Path(s) for s in args.sources])
    print(f"{len(templates)} citation templates; sizes {' '.join(map(size_label, sizes))}; "
          f"num_proc {args.num_proc} on {os.cpu_count()} CPUs", flush=True)
    tmp = None if args.work_dir else tempfile.TemporaryDirectory(prefix="bench_scale-")
    root = Path(args.work_dir or tmp.name)
    root.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    releases: list[dict] = []
    bad_check = None
    try:
        for size in sizes:
            size_rows, info, size_bad_check = measure_size(args, size, root, templates, cores, size == bad_at)
            rows += size_rows
            releases.append(info)
            bad_check = size_bad_check or bad_check
            summarize(args, cores, templates, rows, releases, bad_check, quiet=size != sizes[-1])
    finally:
        if tmp is not None:
            tmp.cleanup()
    failed = [r for r in rows if r["exit_status"] != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
