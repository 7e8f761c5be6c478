"""benchmarks/bench_scale.py end to end at a tiny size, its arithmetic, and prepare_corpus naming
duplicated input files (issue 24, items 1, 2 and 5)."""

from __future__ import annotations

import gzip
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
pytestmark = pytest.mark.xdist_group("bench_scale")  # meant: one worker; the run is once per worker

import bench_scale  # noqa: E402

from biomed_lm.tokenization.corpus import CorpusConfig, find_duplicate_files, prepare_corpus  # noqa: E402

ROW_FIELDS = {"stage", "size", "exit_status", "seconds", "cpu_seconds", "mb_per_s", "docs_per_s", "mb_per_s_per_core",
              "docs_per_s_per_core", "peak_rss_main_mib", "peak_rss_children_mib", "peak_rss_tree_mib",
              "maxrss_kernel_mib", "bytes_written", "input_mb", "input_docs", "cpu_seconds_main",
              "peak_anon_main_mib", "peak_anon_children_mib", "peak_anon_tree_mib"}


@pytest.fixture(scope="session")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("scale") / "scale.json"
    run = subprocess.run([sys.executable, "benchmarks/bench_scale.py", "--sizes", "1MB", "2MB", "--output", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "scaling exponents" in run.stdout
    return json.loads(out.read_text())


def test_every_stage_is_measured_at_every_size(result):
    rows = result["rows"]
    assert [(r["size"], r["stage"]) for r in rows] == [(s, st) for s in ("1MB", "2MB") for st in bench_scale.STAGES]
    for row in rows:
        assert ROW_FIELDS <= row.keys(), ROW_FIELDS - row.keys()
        assert row["exit_status"] == 0
        assert row["seconds"] > 0 and row["mb_per_s"] > 0 and row["docs_per_s"] > 0
        assert row["peak_rss_main_mib"] > 20 and row["maxrss_kernel_mib"] > 20
        assert row["peak_rss_tree_mib"] >= row["peak_rss_main_mib"]
        assert 0 < row["peak_anon_main_mib"] <= row["peak_rss_main_mib"]
        assert row["bytes_written"] > 0
        assert 0 < row["cpu_seconds_main"] <= row["cpu_seconds"]
    assert any(r["peak_rss_children_mib"] > 0 for r in rows if r["stage"] == "prepare_corpus")
    for row in (r for r in rows if r["stage"] == "create_pretraining_data_drp_128"):
        # every synthetic citation after the first cites earlier ones of the release: DRP draws linked pairs
        assert row["links"]["links_in_corpus"] >= row["links"]["documents_with_links_in_corpus"] > 0
        assert row["pair_labels"]["linked"] > 0
    for stage in bench_scale.STAGES:
        assert set(result["exponents"][stage]) == {"time", "cpu_time", "peak_rss_tree", "peak_rss_main",
                                                   "maxrss_kernel", "peak_anon_main", "peak_anon_tree",
                                                   "cpu_time_largest_two", "peak_rss_tree_largest_two",
                                                   "peak_anon_tree_largest_two"}
        assert isinstance(result["exponents"][stage]["time"], float)
        projection = result["projection"][stage]
        assert projection["hours_on_target_cores"] <= projection["hours_on_measured_cores"]
        assert projection["peak_gib_on_measured_cores"] > 0


def test_summarize_recomputes_an_earlier_result(result, tmp_path):
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps(result))
    assert bench_scale.main(["--summarize", str(earlier), "--output", str(tmp_path / "again.json")]) == 0
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["exponents"] == result["exponents"]
    assert again["projection"] == result["projection"]


def test_release_accounting_matches_the_corpus(result):
    for release in result["releases"]:
        assert release["xml_bytes"] == pytest.approx(release["target_bytes"], rel=0.15)
        assert release["files"] == release["baseline_files"] + 2
        assert release["funnel"]["unique_documents"] == release["expected_unique_documents"]
        assert release["dropped"]["deleted"] == release["deleted"] > 0
        assert release["dropped"]["superseded"] == release["revised"] > 0
        assert release["problems"] == 0
        assert 0 < release["documents"] <= release["expected_unique_documents"]


def test_bad_files_lose_only_their_own_records_and_are_named(result):
    bad = result["bad_inputs"]
    assert bad["size"] == "1MB"
    assert bad["exit_status"] == 1          # some input was damaged
    assert bad["truncated_named"] and bad["not_xml_named"] and bad["duplicate_named"]
    assert bad["clean_documents_lost"] == 0
    assert bad["documents_from_elsewhere"] == 0
    assert 0 < bad["truncated_documents_kept"] < bad["truncated_citations_written"]
    assert bad["problem_reasons"] == {"pubmed_b0000_not_xml.xml.gz": "no_records",
                                      "pubmed_b0000_truncated.xml.gz": "truncated_record"}


def test_fit_exponent():
    sizes = [1e6, 1e7, 1e8]
    assert bench_scale.fit_exponent(sizes, [2.0, 20.0, 200.0]) == pytest.approx(1.0)
    assert bench_scale.fit_exponent(sizes, [s ** 2 for s in sizes]) == pytest.approx(2.0)
    assert bench_scale.fit_exponent(sizes, [5.0, 5.0, 5.0]) == pytest.approx(0.0)
    assert bench_scale.fit_exponent(sizes, [1.0, 3.0, 9.0]) == pytest.approx(math.log(3) / math.log(10))
    assert bench_scale.fit_exponent([1e6], [3.0]) is None
    assert bench_scale.fit_exponent([1e6, 1e6], [3.0, 4.0]) is None
    assert bench_scale.fit_exponent(sizes, [0.0, 0.0, 0.0]) is None


def test_projection_from_cpu_time_main_serial_workers_parallel():
    full = bench_scale.FULL_BASELINE["abstract_text_bytes"]
    # Measured on the full size itself (factor 1): 100 CPU s, 20 in the stage's process, 80 in workers.
    row = {"seconds": 60.0, "cpu_seconds": 100.0, "cpu_seconds_main": 20.0, "peak_rss_main_mib": 1024.0,
           "peak_rss_children_mib": 2048.0, "max_child_processes": 2}
    p = bench_scale.project(row, full, 1.0, 0.0, cores=2, target_cores=64)
    assert p["cpu_hours"] == pytest.approx(100 / 3600)
    assert p["hours_on_measured_cores"] == pytest.approx((20 + 80 / 2) / 3600)
    assert p["hours_on_target_cores"] == pytest.approx((20 + 80 / 64) / 3600)
    assert p["wall_hours_scaled_as_measured"] == pytest.approx(60 / 3600)
    assert p["peak_gib_on_measured_cores"] == pytest.approx(3.0)
    assert p["peak_gib_on_target_cores"] == pytest.approx(1 + 2 * 32)
    # Ten times less text measured, time exponent 1, memory exponent 1: both scale by 10.
    p = bench_scale.project(row, full / 10, 1.0, 1.0, cores=2, target_cores=2)
    assert p["cpu_hours"] == pytest.approx(1000 / 3600)
    assert p["peak_gib_on_measured_cores"] == pytest.approx(30.0)
    anon = row | {"peak_anon_main_mib": 512.0, "peak_anon_children_mib": 1024.0}
    p = bench_scale.project(anon, full / 4, 1.0, 0.0, 2, 64, anon_exp=0.5)
    assert p["peak_anon_gib_on_measured_cores"] == pytest.approx(1.5 * 2)
    assert p["peak_anon_gib_on_target_cores"] == pytest.approx((0.5 + 1.0 * 32) * 2)
    # A stage without workers keeps its memory on 64 cores.
    p = bench_scale.project(row | {"max_child_processes": 0, "peak_rss_children_mib": 0.0}, full, 1.0, 0.0, 2, 64)
    assert p["peak_gib_on_target_cores"] == pytest.approx(1.0)


def test_parse_size():
    assert bench_scale.parse_size("20MB") == 20_000_000
    assert bench_scale.parse_size("1.5GB") == 1_500_000_000
    assert bench_scale.size_label(bench_scale.parse_size("200MB")) == "200MB"
    with pytest.raises(Exception):
        bench_scale.parse_size("lots")


def _ids(corpus: Path) -> list[str]:
    tables = []
    for shard in sorted(corpus.glob("data-*.arrow")):
        with pa.memory_map(str(shard)) as source:
            tables.append(pa.ipc.open_stream(source).read_all())
    return pa.concat_tables(tables).column("id").to_pylist()


def test_prepare_corpus_names_a_duplicated_input_file_and_loses_nothing(tmp_path):
    sample = REPO / "data" / "sample" / "medline16n0902_sample.xml.gz"
    first, copy = tmp_path / "in" / "a.xml.gz", tmp_path / "in" / "a_copy.xml.gz"
    first.parent.mkdir()
    shutil.copyfile(sample, first)
    shutil.copyfile(sample, copy)
    other = tmp_path / "in" / "b.xml.gz"
    with gzip.open(other, "wt", encoding="utf-8") as handle:
        handle.write(gzip.open(sample, "rt", encoding="utf-8").read().replace("<MedlineCitationSet>",
                                                                             "<MedlineCitationSet>\n", 1))
    assert find_duplicate_files([first, other, copy]) == [{"path": str(copy), "same_as": str(first)}]
    assert find_duplicate_files([first, other]) == []

    alone = prepare_corpus(CorpusConfig(inputs=[str(first)], output_dir=str(tmp_path / "alone"), num_proc=1,
                                        min_words=0))
    doubled = prepare_corpus(CorpusConfig(inputs=[str(first), str(copy)], output_dir=str(tmp_path / "doubled"),
                                          num_proc=1, min_words=0))
    assert alone["duplicate_files"] == []
    assert doubled["duplicate_files"] == [{"path": str(copy), "same_as": str(first)}]
    assert doubled["problems"] == []
    assert doubled["documents_kept"] == alone["documents_kept"]
    assert sorted(_ids(tmp_path / "doubled")) == sorted(_ids(tmp_path / "alone"))
    saved = json.loads((tmp_path / "doubled" / "summary.json").read_text())
    assert saved["duplicate_files"] == doubled["duplicate_files"]


def test_prepare_corpus_cli_warns_about_a_duplicated_file(tmp_path):
    sample = REPO / "data" / "sample" / "medline16n0902_sample.xml.gz"
    copy = tmp_path / "copy.xml.gz"
    shutil.copyfile(sample, copy)
    run = subprocess.run([sys.executable, "launch/prepare_corpus.py", "--inputs", str(sample), str(copy),
                          "--output-dir", str(tmp_path / "out"), "--num-proc", "1", "--min-words", "0"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"prepare_corpus: warning: {copy} has the same bytes as" in run.stderr
