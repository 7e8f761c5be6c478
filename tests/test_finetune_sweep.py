"""The BLURB sweep: planning, dev model selection over seeds, the BLURB table, and resuming.

Selection and scoring are checked on synthetic run records (exact numbers); the sweep itself runs
end to end with a tiny random BERT on a slice of the committed NCBI-disease files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import biomed_lm.finetune.sweep as sweep  # noqa: E402
from biomed_lm.errors import ConfigError, InputError
from biomed_lm.finetune.datasets import blurb_spec  # noqa: E402
from biomed_lm.finetune.metrics import BLURB_DATASETS  # noqa: E402
from biomed_lm.finetune.sweep import (  # noqa: E402
    PROTOCOL, SweepArgs, collect_runs, format_table, plan_sweep, run_sweep, summarize)
from biomed_lm.finetune.trainer import RUN_RECORD, FinetuneArgs, run_finetune  # noqa: E402
from tests import forked_main
from tests.conftest import ncbi_slice  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _record(dataset, lr, batch, seed, dev, test, *, model="m", task_type="ner", metric="entity_f1"):
    hp = {"learning_rate": lr, "batch_size": batch, "epochs": 3}
    return {"status": "complete", "model": model, "dataset": dataset, "task_type": task_type, "metric": metric,
            "seed": seed, "hyperparameters": hp, "settings": {**hp, "seed": seed, "dataset": dataset, "model": model},
            "best_dev_score": dev, "test_score": test, "test": {"score": test}, "wall_time_s": 1.0,
            "memory": {"peak_rss_bytes": 10}}


def test_protocol_covers_blurb_with_the_papers_seed_counts():
    assert tuple(PROTOCOL) == BLURB_DATASETS
    ten = {d for d, p in PROTOCOL.items() if p.num_seeds == 10}
    assert ten == {"biosses", "bioasq", "pubmedqa"}
    assert all(p.num_seeds == 5 for d, p in PROTOCOL.items() if d not in ten)
    assert all(2 <= p.epochs <= 60 for p in PROTOCOL.values())  # the paper's search range


# Section 2.4 of the paper: "128 tokens for GAD and 256 tokens for ChemProt and DDI", QA at 512.
PAPER_LENGTHS = {"gad": 128, "chemprot": 256, "ddi": 256, "pubmedqa": 512, "bioasq": 512}


def test_sweep_and_single_run_take_each_datasets_length_from_one_place(tmp_path):
    dirs = []
    for dataset in BLURB_DATASETS:
        (tmp_path / dataset).mkdir()
        dirs.append(f"{dataset}={tmp_path / dataset}")
    args = SweepArgs(model="m", output_dir=str(tmp_path / "out"), data_dirs=dirs, learning_rates=[1e-5],
                     batch_sizes=[16], num_seeds=1)
    planned = {run.dataset: run.args.max_length for run in plan_sweep(args).runs}
    single = {d: FinetuneArgs(model="m", dataset=d, data_dir="d", output_dir="o").effective_max_length()
              for d in BLURB_DATASETS}
    assert planned == single == {d: blurb_spec(d).max_length for d in BLURB_DATASETS}
    assert {d: planned[d] for d in PAPER_LENGTHS} == PAPER_LENGTHS
    assert planned["biosses"] == 256 and planned["hoc"] == 512 and planned["ncbi-disease"] == 128
    assert FinetuneArgs(model="m", dataset="ChemProt", data_dir="d", output_dir="o").effective_max_length() == 256
    flagged = SweepArgs(model="m", output_dir="o", datasets=["chemprot"], max_length=64)
    assert flagged.max_length_for("chemprot") == 64


@pytest.mark.parametrize("dataset, used, verdict", [("ncbi-disease", 128, "skipped"), ("chemprot", 128, "refused"),
                                                    ("pubmedqa", 512, "skipped")])
def test_a_record_made_under_an_older_default_length_is_judged_by_the_length_it_used(tmp_path, dataset, used,
                                                                                     verdict):
    """Before per-dataset lengths a run left max_length None and used 128 (512 for QA): a ChemProt
    record of that kind is not today's 256-token run, an NCBI-disease one is the same run."""
    finetune_args = FinetuneArgs(model="m", dataset=dataset, data_dir=str(tmp_path), output_dir=str(tmp_path / "run"))
    settings = {k: v for k, v in dataclasses.asdict(finetune_args).items()
                if k not in ("num_workers", "output_dir", "data_dir", "local_rank")}
    record = {"status": "complete", "settings": settings, "hyperparameters": {"max_length": used},
              "test": {"score": 0.5}}
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / RUN_RECORD).write_text(json.dumps(record), encoding="utf-8")
    if verdict == "skipped":
        assert run_finetune(finetune_args, log=lambda message: None).skipped
    else:
        with pytest.raises(InputError, match=r"different settings \(max_length: 128 recorded, 256 now\)"):
            run_finetune(finetune_args, log=lambda message: None)


def test_seeds_run_before_and_after_the_length_default_changed_are_one_grid_point():
    """A sweep resumed across the change: seeds 1-2 left max_length None (128 used), seed 3 names
    128. They ran alike, so they are one grid point of three seeds."""
    records = [_record("ncbi-disease", 3e-5, 16, seed, 0.8, 0.8) for seed in (1, 2, 3)]
    for record, setting in zip(records, (None, None, 128)):
        record["settings"]["max_length"] = setting
        record["hyperparameters"]["max_length"] = 128
    grid = summarize(records)["datasets"]["ncbi-disease"]["grid"]
    assert len(grid) == 1 and grid[0]["seeds"] == [1, 2, 3]


def test_selection_uses_mean_dev_over_seeds_and_reports_test_mean_std():
    records = [
        # lr 1e-5: one lucky seed (dev 0.95) but a lower mean dev (0.70)
        _record("ncbi-disease", 1e-5, 16, 1, 0.95, 0.50), _record("ncbi-disease", 1e-5, 16, 2, 0.45, 0.90),
        # lr 3e-5: mean dev 0.80 -> selected; test 0.80 and 0.84
        _record("ncbi-disease", 3e-5, 16, 1, 0.80, 0.80), _record("ncbi-disease", 3e-5, 16, 2, 0.80, 0.84),
        _record("gad", 5e-5, 32, 1, 0.7, 0.6, task_type="relation", metric="f1_positive"),
    ]
    summary = summarize(records)
    ncbi = summary["datasets"]["ncbi-disease"]
    assert ncbi["selected"]["learning_rate"] == 3e-5 and ncbi["selected"]["seeds"] == [1, 2]
    assert ncbi["test"]["mean"] == pytest.approx(0.82) and ncbi["test"]["n"] == 2
    assert ncbi["test"]["std"] == pytest.approx(0.0282842712)  # sample std of (0.80, 0.84)
    assert len(ncbi["grid"]) == 2
    assert summary["datasets"]["gad"]["test"]["std"] is None  # one seed: no spread
    blurb = summary["blurb"]
    # ner 0.82, relation 0.6 -> macro over the two present task types
    assert blurb["score"] == pytest.approx((0.82 + 0.6) / 2) and blurb["partial"]
    assert set(blurb["missing_datasets"]) == set(BLURB_DATASETS) - {"ncbi-disease", "gad"}
    table = format_table(summary)
    assert "82.00 ± 2.83" in table and "partial BLURB score" in table and "60.00 (1 run)" in table


def test_summary_refuses_mixed_models_and_flags_unfinished_datasets():
    with pytest.raises(ValueError, match="several models"):
        summarize([_record("gad", 1e-5, 16, 1, .5, .5, model="a"), _record("gad", 1e-5, 16, 1, .5, .5, model="b")])
    summary = summarize([_record("ncbi-disease", 1e-5, 16, 1, .5, .5)], expected={"ncbi-disease": 4},
                        absent={"hoc": "not found at x"}, failed={"gad": "DatasetFormatError: bad line"})
    assert summary["datasets"]["ncbi-disease"]["incomplete"] == "1 of 4 runs complete"
    table = format_table(summary)
    assert "hoc: absent (not found at x)" in table and "gad: failed (DatasetFormatError: bad line)" in table


def test_a_runs_warnings_reach_the_sweeps_output_and_its_table_once():
    """QA: a BLURB sweep on GAD's first 64 test rows, all positive, printed F1 99.21 without a word:
    the sweep dropped each run's log, and the one-label warning with it. Each warning is now said once
    per dataset as the sweep runs, and listed under the table's notes."""
    said_lines: list[str] = []
    said: set[tuple[str, str]] = set()
    slice_line = "--max_eval_examples 64 keeps the first 64 test examples, all labelled '1' (...)"
    for dataset in ("gad", "gad", "ddi"):
        log = sweep._warnings_once(dataset, said, said_lines.append)
        for message in ("gad: 3 runs over 1 datasets", f"warning: {slice_line}", "epoch 1: dev 0.5"):
            log(message)
    assert said_lines == [f"gad: warning: {slice_line}", f"ddi: warning: {slice_line}"]
    one_label = "every test prediction is '1' (the test set has 2 labels): ..."
    records = [{**_record("gad", 1e-5, 16, seed, .5, .9, task_type="relation", metric="f1_positive"),
                "dataset_warnings": ["2 rows mark one entity"], "slice_warnings": [slice_line],
                "prediction_warnings": [one_label] if seed == 2 else []} for seed in (1, 2)]
    # another grid point's one-label predictions do not bear on the reported score: not listed
    records.append({**_record("gad", 5e-5, 16, 1, .1, .1, task_type="relation", metric="f1_positive"),
                    "prediction_warnings": ["every test prediction is '0' (...)"]})
    summary = summarize(records)
    assert summary["datasets"]["gad"]["warnings"] == ["2 rows mark one entity", slice_line, f"{one_label} (seed 2)"]
    table = format_table(summary)
    assert table.count(f"- gad: warning: {slice_line}") == 1 and "- gad: warning: 2 rows mark one entity" in table


def test_a_blurb_score_over_other_data_says_so_beside_the_score():
    """QA: a complete sweep over this data (the BioASQ stand-in, BLUE's BIOSSES split) would print a plain
    "BLURB score"; only the per-dataset notes said those scores are not the paper's."""
    records = [{**_record("biosses", 3e-5, 16, 1, .8, .7, task_type="similarity", metric="pearson"),
                "dataset_differs_from_blurb": "BLUE's 70/16/14 split, not BLURB's 64/16/20"},
               _record("ncbi-disease", 3e-5, 16, 1, .8, .8)]
    summary = summarize(records)
    assert summary["blurb"]["other_data"] == {"biosses": "BLUE's 70/16/14 split, not BLURB's 64/16/20"}
    assert "(On data other than BLURB's for 1 dataset(s), so not directly comparable with the paper's scores: " \
           "biosses: BLUE's 70/16/14 split, not BLURB's 64/16/20.)" in format_table(summary)
    assert summarize([_record("ncbi-disease", 3e-5, 16, 1, .8, .8)])["blurb"]["other_data"] == {}


def test_plan_reports_absent_datasets_and_uses_overrides(tmp_path):
    data = ncbi_slice(tmp_path / "data")
    args = SweepArgs(model="m", output_dir=str(tmp_path / "out"), data_root=str(tmp_path / "nowhere"),
                     datasets=["NCBI_disease", "BIOSSES"], data_dirs=[f"ncbi-disease={data}"],
                     learning_rates=[1e-5, 3e-5], batch_sizes=[16])
    plan = plan_sweep(args)
    assert set(plan.absent) == {"biosses"} and "similarity/biosses" in plan.absent["biosses"]
    assert len(plan.runs) == 2 * 1 * PROTOCOL["ncbi-disease"].num_seeds
    assert {r.args.data_dir for r in plan.runs} == {str(data)}
    assert len({r.args.output_dir for r in plan.runs}) == len(plan.runs)
    for bad in (dict(datasets=["nope"]), dict(data_dirs=["ncbi-disease"]), dict(learning_rates=[]),
                dict(num_seeds=0)):
        with pytest.raises(ConfigError):
            SweepArgs(model="m", output_dir="o", **bad)


def test_sweep_runs_resumes_and_skips_finished_runs(tiny_bert, tmp_path, monkeypatch):
    ncbi_slice(tmp_path / "data")
    out = tmp_path / "sweep"
    args = dict(model=str(tiny_bert), output_dir=str(out), data_root=str(tmp_path / "data"),
                datasets=["ncbi-disease", "gad"], learning_rates=[5e-4, 1e-3], batch_sizes=[8], epochs=1,
                num_seeds=2, max_length=32)
    calls, hashed = [], []
    real_run, real_fingerprint = sweep.run_finetune, sweep.data_fingerprint

    def counting_run(finetune_args, log, data_files):
        result = real_run(finetune_args, log=log, data_files=data_files)
        calls.append((finetune_args.output_dir, result.skipped))
        return result

    def counting_fingerprint(data_dir):
        hashed.append(data_dir)
        return real_fingerprint(data_dir)

    monkeypatch.setattr(sweep, "run_finetune", counting_run)
    monkeypatch.setattr(sweep, "data_fingerprint", counting_fingerprint)
    summary = run_sweep(SweepArgs(**args), log=lambda m: None, progress=False)
    assert len(calls) == 4 and not any(skipped for _, skipped in calls)
    assert len(hashed) == 1  # the dataset's files hashed once for its four runs
    assert "gad" in summary["absent"] and summary["datasets"]["ncbi-disease"]["runs"] == 4
    assert summary["blurb"]["partial"] and summary["blurb"]["dataset_scores"].keys() == {"ncbi-disease"}
    assert (out / "blurb.md").read_text() == format_table(summary)
    assert json.loads((out / "summary.json").read_text())["datasets"]["ncbi-disease"]["test"] == \
        summary["datasets"]["ncbi-disease"]["test"]
    assert len(collect_runs(out)) == 4
    plan = json.loads((out / sweep.PLAN_FILE).read_text())  # written before the first run: a report of a
    assert len(plan["runs"]) == 4 and plan["model"] == str(tiny_bert)  # sweep cut short names what is missing

    # As if the sweep had been killed during its last run: that run left no record, and an earlier attempt of
    # it failed (its error.txt).
    last = Path(calls[-1][0]) / RUN_RECORD
    kept = {p: p.read_text() for p in out.rglob(RUN_RECORD) if p != last}
    last.unlink()
    (last.parent / sweep.ERROR_FILE).write_text("Traceback ...\nRuntimeError: an earlier attempt\n")
    calls.clear()
    again = run_sweep(SweepArgs(**args), log=lambda m: None, progress=False)
    assert [skipped for _, skipped in calls].count(False) == 1
    assert all(p.read_text() == text for p, text in kept.items())  # finished runs untouched
    assert again["datasets"]["ncbi-disease"]["runs"] == 4
    # QA (2026-11-29): the stale error.txt stayed beside the complete run.json
    assert not list(out.rglob(sweep.ERROR_FILE))

    # Resumed with a changed flag (QA: every run failed, then the old scores were summarized under the new
    # settings): refused before any run, the summary as it was.
    summary_text, calls[:] = (out / "summary.json").read_text(), []
    with pytest.raises(InputError, match=r"holds finished runs this sweep would not make: .*run\.json holds a "
                                         r"finished run with different settings \(max_length: 32 recorded, 48 now\).*"
                                         r"\(and 3 more run\(s\) like it\); nothing was run or rewritten"):
        run_sweep(SweepArgs(**{**args, "max_length": 48}), log=lambda m: None, progress=False)
    assert calls == [] and (out / "summary.json").read_text() == summary_text


def test_failed_dataset_is_recorded_and_others_go_on(tiny_bert, tmp_path):
    bad = tmp_path / "data" / "ner" / "BC2GM"
    bad.mkdir(parents=True)
    for name in ("train.tsv", "devel.tsv", "test.tsv"):
        (bad / name).write_text("Aspirin\tB-GENE\nworks\n", encoding="utf-8")  # line 2: no tag
    ncbi_slice(tmp_path / "data")
    summary = run_sweep(SweepArgs(model=str(tiny_bert), output_dir=str(tmp_path / "out"),
                                  data_root=str(tmp_path / "data"), datasets=["bc2gm", "ncbi-disease"],
                                  learning_rates=[1e-3], batch_sizes=[8], epochs=1, num_seeds=1, max_length=32),
                        log=lambda m: None, progress=False)
    assert "bc2gm" in summary["failed"] and "BC2GM" in summary["failed"]["bc2gm"]
    assert "line 2" in summary["failed"]["bc2gm"]
    assert "ncbi-disease" in summary["datasets"]


def test_runs_side_by_side_make_the_same_records_and_stop_a_failed_datasets_later_runs(tiny_bert, tmp_path):
    """parallel_runs 2: each run in a worker process of its own (on a CPU they share the cores); the same
    runs, each complete in its folder, as one at a time; a failing dataset's unstarted runs are dropped."""
    bad = tmp_path / "data" / "ner" / "BC2GM"
    bad.mkdir(parents=True)
    for name in ("train.tsv", "devel.tsv", "test.tsv"):
        (bad / name).write_text("Aspirin\tB-GENE\nworks\n", encoding="utf-8")  # line 2: no tag
    ncbi_slice(tmp_path / "data")
    args = dict(model=str(tiny_bert), data_root=str(tmp_path / "data"), datasets=["bc2gm", "ncbi-disease"],
                learning_rates=[1e-3], batch_sizes=[8], epochs=1, num_seeds=3, max_length=32)
    lines: list[str] = []
    side = run_sweep(SweepArgs(**args, output_dir=str(tmp_path / "side"), parallel_runs=2), log=lines.append,
                     progress=False)
    alone = run_sweep(SweepArgs(**args, output_dir=str(tmp_path / "alone")), log=lambda m: None, progress=False)
    assert side["failed"].keys() == alone["failed"].keys() == {"bc2gm"} and "line 2" in side["failed"]["bc2gm"]
    assert side["datasets"]["ncbi-disease"]["runs"] == alone["datasets"]["ncbi-disease"]["runs"] == 3
    assert sorted(p.parent.name for p in (tmp_path / "side").rglob(RUN_RECORD)) == \
        sorted(p.parent.name for p in (tmp_path / "alone").rglob(RUN_RECORD))
    # bc2gm's first two seeds ran side by side and failed; its third never started (one at a time: one failed)
    errors = sorted(p.parent.name for p in (tmp_path / "side").rglob(sweep.ERROR_FILE))
    assert errors == ["seed1", "seed2"] and len(list((tmp_path / "alone").rglob(sweep.ERROR_FILE))) == 1
    assert sum("ncbi-disease" in line and "dev" in line for line in lines) == 3
    # stop_on_error: the worker's error as a user error naming the run and its traceback file (QA: a
    # RuntimeError holding a nested traceback, exit 1), the other workers stopped
    from biomed_lm.finetune.sweep_pool import SweepRunFailed

    with pytest.raises(SweepRunFailed, match=r"bc2gm run lr0.001_bs8_ep1/seed\d failed: DatasetFormatError: .*line 2.*"
                                             r"\(its traceback: .*error.txt\)"):
        run_sweep(SweepArgs(**args, output_dir=str(tmp_path / "stop"), parallel_runs=2, stop_on_error=True),
                  log=lambda m: None, progress=False)


def test_a_killed_parallel_sweeps_workers_die_with_it_and_the_same_command_resumes(tiny_bert, tmp_path):
    """QA (2026-11-29): after a kill -9 of a --parallel_runs sweep its spawned workers trained on and then waited
    forever, holding their runs' folders (and GPUs): the re-run failed the dataset on their locks."""
    import signal
    import time

    import psutil

    ncbi_slice(tmp_path / "data")
    command = [sys.executable, str(REPO / "launch" / "blurb.py"), "--model", str(tiny_bert), "--output_dir",
               str(tmp_path / "out"), "--data_root", str(tmp_path / "data"), "--datasets", "ncbi-disease",
               "--learning_rates", "1e-3", "--batch_sizes", "8", "--epochs", "3", "--num_seeds", "3",
               "--max_length", "32", "--parallel_runs", "2"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    sweep_process = forked_main.start_command(command, env)
    deadline, workers = time.time() + 300, []
    while time.time() < deadline and sweep_process.poll() is None:  # until both workers are in a run
        workers = [c for c in psutil.Process(sweep_process.pid).children() if "resource_tracker" not in
                   " ".join(c.cmdline())]
        if len(workers) == 2 and len(list((tmp_path / "out").rglob(".run.lock"))) >= 3:  # the sweep's and 2 runs'
            break
        time.sleep(0.2)
    assert len(workers) == 2, "the workers did not start"
    sweep_process.send_signal(signal.SIGKILL)
    sweep_process.wait()
    gone, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, f"workers outlived the sweep: {alive}"
    again = forked_main.run_command(command, env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["datasets"]["ncbi-disease"]["runs"] == 3


def test_a_run_another_process_holds_is_not_attempted_and_the_sweep_says_its_dataset_is_unfinished(
        tiny_bert, tmp_path):
    """QA (2026-11-29): with every run held by another live process, the sweep exited 0 and its summary named
    no dataset at all; an ablation then took the sweep as finished."""
    import subprocess

    from biomed_lm.run_lock import ARTIFACT_LOCK_FILE

    ncbi_slice(tmp_path / "data")
    args = SweepArgs(model=str(tiny_bert), output_dir=str(tmp_path / "out"), data_root=str(tmp_path / "data"),
                     datasets=["ncbi-disease"], learning_rates=[1e-3], batch_sizes=[8], epochs=1, num_seeds=1,
                     max_length=32)
    (run,) = plan_sweep(dataclasses.replace(args, model=str(tiny_bert))).runs
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from biomed_lm.run_lock import "
                               "acquire_run_lock; lock = acquire_run_lock(sys.argv[1], sys.argv[2]); print('held', "
                               "flush=True); time.sleep(300)", run.args.output_dir, ARTIFACT_LOCK_FILE],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        lines: list[str] = []
        summary = run_sweep(args, log=lines.append, progress=False)
    finally:
        holder.kill()
        holder.wait()
    assert summary["failed"]["ncbi-disease"].startswith("run(s) not attempted: ")
    assert "is in use by another run" in summary["failed"]["ncbi-disease"]
    assert any("not attempted" in line for line in lines) and not list((tmp_path / "out").rglob(sweep.ERROR_FILE))


def test_a_worker_killed_mid_run_ends_the_sweep_with_one_line_naming_the_run(tiny_bert, tmp_path):
    """A worker killed in a run (the kernel's OOM killer, a user) broke the pool: the sweep ended in a
    BrokenProcessPool traceback. It now says which run's worker died and what a re-run does, exit 1."""
    import signal
    import time

    import psutil

    ncbi_slice(tmp_path / "data")
    command = [sys.executable, str(REPO / "launch" / "blurb.py"), "--model", str(tiny_bert), "--output_dir",
               str(tmp_path / "out"), "--data_root", str(tmp_path / "data"), "--datasets", "ncbi-disease",
               "--learning_rates", "1e-3", "--batch_sizes", "8", "--epochs", "50", "--num_seeds", "2",
               "--max_length", "32", "--parallel_runs", "2"]
    sweep_process = forked_main.start_command(command, {**os.environ, "HF_HUB_OFFLINE": "1"})
    deadline, workers = time.time() + 300, []
    while time.time() < deadline and sweep_process.poll() is None:
        workers = [c for c in psutil.Process(sweep_process.pid).children()
                   if "resource_tracker" not in " ".join(c.cmdline())]
        if len(workers) == 2 and len(list((tmp_path / "out").rglob(".run.lock"))) >= 3:  # both in a run
            break
        time.sleep(0.2)
    assert len(workers) == 2, "the workers did not start"
    workers[0].send_signal(signal.SIGKILL)
    _, stderr = sweep_process.communicate(timeout=300)
    assert sweep_process.returncode == 1, stderr[-3000:]
    assert "blurb: error: the worker running ncbi-disease lr0.001_bs8_ep50 seed" in stderr
    assert "died (killed, or out of memory?)" in stderr and "Traceback" not in stderr
    assert not [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]


def test_parallel_runs_are_refused_under_deepspeed_and_beyond_the_gpus(monkeypatch):
    from biomed_lm.finetune import sweep_pool

    with pytest.raises(ConfigError, match="parallel_runs 2 runs each fine-tuning in a process of its own"):
        SweepArgs(model="m", output_dir="o", parallel_runs=2, deepspeed=True)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert sweep_pool.device_slots(2) == ["3", "5"]
    with pytest.raises(ConfigError, match=r"parallel_runs 4 needs a GPU per run, and 2 are visible "
                                          r"\(CUDA_VISIBLE_DEVICES=3,5\)"):
        sweep_pool.device_slots(4)


def test_a_sweep_of_absent_datasets_only_is_refused(tiny_bert, tmp_path):
    """QA: --data_root pointing nowhere ran "0 runs over 0 datasets", printed a table titled None and exited 0."""
    with pytest.raises(InputError, match=r"none of the datasets asked for is under data_root .*nowhere.*ncbi-disease"):
        run_sweep(SweepArgs(model=str(tiny_bert), output_dir=str(tmp_path / "out"),
                            data_root=str(tmp_path / "nowhere"), datasets=["ncbi-disease"], learning_rates=[1e-3],
                            batch_sizes=[8], epochs=1, num_seeds=1), log=lambda m: None, progress=False)


def test_launch_blurb_bad_option_exits_2(tmp_path):
    proc = forked_main.run_command([sys.executable, str(REPO / "launch" / "blurb.py"), "--model", "m", "--output_dir",
                                    str(tmp_path), "--datasets", "ncbi-disease", "not-a-dataset"],
                                   env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert proc.returncode == 2 and "not-a-dataset" in proc.stderr
