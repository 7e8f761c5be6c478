"""The data path gives the same output whatever the number of workers (issue 24, item 3).

Every stage runs through its command line, on the embedded PubMed sample split into several input
files: prepare_corpus with --num-proc 1 and 2 (the same rows), build_vocab with one and two
tokenizer threads (it has no --num-proc; the Rust trainer's threads are RAYON_RS_NUM_CPUS: the same
vocab.txt, byte for byte), create_pretraining_data with --num-proc 1 and 2 (the same instances, row
for row, and the same shard bytes).
"""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from tests import forked_main

REPO = Path(__file__).resolve().parents[1]
# The fixture is session-scoped: built once per worker that runs these tests (the group is meant
# to make that one worker; with pytest-xdist 3.8 here it does not always).
pytestmark = pytest.mark.xdist_group("num_proc_invariance")
SAMPLE = REPO / "data" / "sample"


def run_cli(script: str, *args: str, threads: int | None = None) -> None:
    """``script`` as its own process: forked from this one (tests/forked_main.py), or, to set the
    tokenizers' thread count (read once per process), a new interpreter."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="true")
    command = [sys.executable, f"launch/{script}", *args]
    if threads is None:
        result = forked_main.run_command(command, env=env, timeout=300)
    else:
        env["RAYON_RS_NUM_CPUS"] = str(threads)
        result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{script} {' '.join(args)}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"


def split_sample(out: Path, parts: int = 3) -> list[Path]:
    """The MEDLINE sample as ``parts`` files (so prepare_corpus has files to share among workers)."""
    text = gzip.open(SAMPLE / "medline16n0902_sample.xml.gz", "rt", encoding="utf-8").read()
    head = text[: text.index("<MedlineCitation ")]
    records = re.findall(r"<MedlineCitation .*?</MedlineCitation>", text, re.S)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(parts):
        path = out / f"part{i}.xml.gz"
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(head + "\n".join(records[i::parts]) + "\n</MedlineCitationSet>\n")
        paths.append(path)
    return paths + [SAMPLE / "sywada_PubMedAbstract_1MB.txt"]


def read_table(folder: Path) -> pa.Table:
    tables = []
    for shard in sorted(folder.glob("data-*.arrow")):
        with pa.memory_map(str(shard)) as source:
            tables.append(pa.ipc.open_stream(source).read_all())
    assert tables, f"no Arrow shard in {folder}"
    return pa.concat_tables(tables)


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> dict[int, Path]:
    """The whole data path once with one worker and once with two."""
    root = tmp_path_factory.mktemp("num_proc")
    inputs = [str(p) for p in split_sample(root / "inputs")]
    out = {}
    for workers in (1, 2):
        work = root / f"w{workers}"
        run_cli("prepare_corpus.py", "--inputs", *inputs, "--output-dir", str(work / "corpus"),
                "--num-proc", str(workers), "--min-words", "20")
        run_cli("build_vocab.py", "--inputs", str(work / "corpus"), "--output-dir", str(work / "vocab"),
                "--vocab-size", "8000", "--no-progress", threads=workers)
        for task in ("nsp", "none"):
            run_cli("create_pretraining_data.py", "--corpus", str(work / "corpus"), "--tokenizer", str(work / "vocab"),
                    "--output-dir", str(work / f"data_{task}"), "--max-seq-length", "128", "--pair-task", task,
                    "--num-proc", str(workers), "--batch-size", "16", "--dupe-factor", "2")
        out[workers] = work
    return out


def test_prepare_corpus_rows_do_not_depend_on_num_proc(runs):
    one, two = read_table(runs[1] / "corpus"), read_table(runs[2] / "corpus")
    assert one.num_rows > 100
    assert one.equals(two)


def test_build_vocab_does_not_depend_on_threads(runs):
    one = (runs[1] / "vocab" / "vocab.txt").read_bytes()
    assert len(one.splitlines()) > 1000
    assert one == (runs[2] / "vocab" / "vocab.txt").read_bytes()
    assert (runs[1] / "vocab" / "tokenizer.json").read_bytes() == (runs[2] / "vocab" / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("task", ["nsp", "none"])
def test_create_pretraining_data_instances_do_not_depend_on_num_proc(runs, task):
    one, two = read_table(runs[1] / f"data_{task}"), read_table(runs[2] / f"data_{task}")
    assert one.num_rows > 100
    assert one.schema == two.schema
    for name in one.column_names:
        assert one.column(name).to_pylist() == two.column(name).to_pylist(), name
    shards_one = sorted(p.name for p in (runs[1] / f"data_{task}").glob("data-*.arrow"))
    assert shards_one == sorted(p.name for p in (runs[2] / f"data_{task}").glob("data-*.arrow"))
    for name in shards_one:
        assert (runs[1] / f"data_{task}" / name).read_bytes() == (runs[2] / f"data_{task}" / name).read_bytes(), name
