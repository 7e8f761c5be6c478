"""benchmarks/gpu_goals.py: issue 23's goals judged from a gpu_check.sh results folder (result files
written here in the stages' own shapes)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_goals.py"


@pytest.fixture
def gpu_goals(monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_goals", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_goals", module)  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def row(system: str, role: str, tokens: float, **figures) -> dict:
    return {"system": system, "role": role, "precision": "bf16", "seq": 128, "batch": 256, "tokens_per_s": tokens,
            "mfu": None, "ratio": None, **figures}


def bench(architecture: str, *rows: dict, **extra) -> dict:
    return {"device": "cuda", "device_name": "NVIDIA H200", "architecture": architecture, "model": "bert-base",
            "precision": "bf16", "warmup_steps": 3, "timed_steps": 30, "results": list(rows), **extra}


def write(folder: Path, name: str, content) -> None:
    (folder / name).write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")


def verdicts(gpu_goals, folder: Path) -> dict[str, tuple[str, str, str]]:
    """Each goal's (measured, verdict, from) cells."""
    lines = gpu_goals.goals_table(folder)[2:]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    return {goal: (measured, verdict, source) for goal, measured, verdict, source in cells}


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A run in which some goals are met, some missed, one stage failed and others did not run."""
    compiled = row("transformers BertForPreTraining (torch.compile)", "hf_compiled", 476_007.0, ratio=1.0, mfu=0.262)
    write(tmp_path, "bert128.json", bench(
        "bert", compiled,
        row("ours [varlen, compiled by layer]", "ours", 598_482.0, ratio=1.257, mfu=0.329),
        row("ours [sdpa_padded, compiled by layer]", "ours", 579_222.0, ratio=1.217, mfu=0.319),
        convergence={"half_stream": {"passed": True, "relative_difference": 0.0012}}))
    write(tmp_path, "fp8.json", bench(
        "bert", row("ours [sdpa_padded]", "ours", 581_832.0, mfu=0.32),
        row("ours [sdpa_padded, fp8]", "ours", 359_836.0, precision="fp8", mfu=0.099, mfu_peak="fp8",
            ratio_vs_our_bf16=0.618),
        convergence={"passed": False, "relative_difference": 0.013}))
    write(tmp_path, "albert.json", bench(
        "albert", row("transformers AlbertForPreTraining (torch.compile)", "hf_compiled", 586_293.0, ratio=1.0),
        {"system": "ours [sdpa_padded, compiled by layer]", "role": "failed", "failed_role": "ours", "seq": 128,
         "batch": 256, "error": "RuntimeError: CUDA out of memory"}))
    write(tmp_path, "launch_vs_bench.json", {
        "run": {"steps": 7, "first_step": 40, "tokens_per_s": 560_000.0, "mfu": 0.3},
        "bench": {"system": "ours [sdpa_padded", "tokens_per_s": 579_222.0}, "ratio": 0.967, "goal": 0.95})
    write(tmp_path, "environment.txt", "NVIDIA H200, 143771 MiB\ncommit be8bb1a varlen\n")
    return tmp_path


def test_each_goal_is_met_missed_or_not_measured_with_where_its_figure_comes_from(gpu_goals, results):
    table = verdicts(gpu_goals, results)
    assert table["seq 128: ×1.5 of transformers + torch.compile"] == (
        "×1.257", "missed", "ours [varlen, compiled by layer], 598,482 tok/s (bert128.json)")  # the fastest of ours
    assert table["seq 128: MFU ≥ 40%"][:2] == ("32.9%", "missed")
    assert table["launch/pretrain.py ≥ 95% of the bench"][:2] == ("×0.967", "met")
    assert table["FP8: ×1.3 of our bf16 step"][:2] == ("×0.618", "missed")
    assert table["FP8: 300-step convergence check"][:2] == ("failed", "missed")
    assert table["bf16 residual stream: 300-step convergence check"] == (
        "passed", "met", "final losses +0.12% apart (bert128.json)")
    assert table["seq 512: ×1.8 of transformers + torch.compile"] == (
        "", "not measured", "bert512.json missing (stage not run)")
    measured, verdict, source = table["ALBERT: ×1.3 of its transformers class compiled"]
    assert (measured, verdict) == ("", "not measured") and "CUDA out of memory" in source
    assert table["fine-tuning: ×1.2 of HF Trainer's examples/s"][1] == "not measured"


def test_fine_tuning_is_judged_by_its_slower_task_with_each_tasks_f1_beside_it(gpu_goals, tmp_path):
    task = {"ratio_examples_per_s": 1.65, "f1_diff_test": -0.008,
            "results": {"hf_trainer": {"examples_per_s_steady": 34.4, "dev_f1": 0.33, "test_f1": 0.293},
                        "ours": {"examples_per_s_steady": 56.7, "dev_f1": 0.32, "test_f1": 0.285}}}
    write(tmp_path, "finetune.json", {"device_name": "NVIDIA H200", "precision": "bf16",
                                      "tasks": {"ner": task, "relation": task | {"ratio_examples_per_s": 1.1}}})
    table = verdicts(gpu_goals, tmp_path)
    measured, verdict, source = table["fine-tuning: ×1.2 of HF Trainer's examples/s"]
    assert (measured, verdict) == ("×1.100", "missed")
    assert "ner ×1.65, test F1 -0.008" in source and "relation ×1.10" in source
    assert table["fine-tuning: at equal F1 (test F1 at most 0.02 below HF's)"][:2] == ("-0.008", "met")
    assert "| ner | ours | 56.7 | 0.320 | 0.285 |" in gpu_goals.report(tmp_path)


def test_the_report_holds_the_machine_every_bench_row_and_the_gpu_tests_failures(gpu_goals, results):
    write(results, "gpu_tests.log", "tests/test_gpu.py::test_varlen_dropout PASSED [ 10%]\n"
                                    "tests/test_gpu.py::test_flex_compiled FAILED [ 20%]\n"
                                    "tests/test_gpu.py::test_two_gpus SKIPPED (one GPU) [ 30%]\n")
    text = gpu_goals.report(results)
    assert "commit be8bb1a varlen" in text
    assert "| ours [varlen, compiled by layer] | 128 × 256 | 598,482 | 32.9% | 1.26 |" in text
    assert "| ours [sdpa_padded, fp8] | 128 × 256 | 359,836 | 9.9% (fp8 peak) |" in text
    assert "ratio_vs_our_bf16 ×0.618" in text
    assert "failed: RuntimeError: CUDA out of memory" in text
    assert "`gpu` tests: 1 passed, 1 failed, 1 skipped" in text
    assert "- FAILED: `tests/test_gpu.py::test_flex_compiled`" in text
    assert "MFUs for `experiments/recipes.MEASURED_MFU`: bert 128: 0.300 (launch/pretrain.py" in text
    assert "albert" not in text.split("MFUs for")[1].splitlines()[0]  # its row of ours failed: nothing to use


def test_results_measured_on_the_cpu_judge_no_goal(gpu_goals, results):
    """gpu_check.sh's SMOKE=1 (tiny models on the CPU) writes the same files: their ratios say nothing of
    the goals."""
    for name in ("bert128.json", "fp8.json"):
        report = json.loads((results / name).read_text(encoding="utf-8"))
        write(results, name, report | {"device": "cpu"})
    table = verdicts(gpu_goals, results)
    for goal in ("seq 128: ×1.5 of transformers + torch.compile", "FP8: ×1.3 of our bf16 step",
                 "bf16 residual stream: 300-step convergence check", "launch/pretrain.py ≥ 95% of the bench"):
        assert table[goal][1:] == ("not measured", f"{'fp8' if 'FP8' in goal else 'bert128'}.json: measured on "
                                                   "cpu, not a GPU"), goal


def test_a_result_file_of_another_shape_or_cut_short_is_named_not_fatal(gpu_goals, tmp_path):
    write(tmp_path, "launch_vs_bench.json", {"ratio": 0.9})  # no "run": an older or broken file
    write(tmp_path, "bert128.json", '{"device": "cuda", "results": [')  # a stage killed while writing
    table = verdicts(gpu_goals, tmp_path)
    measured, verdict, source = table["launch/pretrain.py ≥ 95% of the bench"]
    assert verdict == "not measured" and source.startswith("unreadable: ")
    _, verdict, source = table["seq 128: MFU ≥ 40%"]
    assert verdict == "not measured" and source.startswith("unreadable: JSONDecodeError")
    assert "MFUs for `experiments/recipes.MEASURED_MFU`: none measured" in gpu_goals.report(tmp_path)


def test_the_cli_writes_the_report_and_refuses_a_missing_folder(gpu_goals, results, tmp_path, capsys):
    assert gpu_goals.main([str(results), "--out", str(tmp_path / "goals.md")]) == 0
    assert (tmp_path / "goals.md").read_text(encoding="utf-8") == capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        gpu_goals.main([str(tmp_path / "nowhere")])
    assert exit_.value.code == 2 and "nowhere: no such folder" in capsys.readouterr().err


def test_allocator_retries_show_beside_the_launch_pace_and_in_a_bench_row(gpu_goals, results):
    launch = json.loads((results / "launch_vs_bench.json").read_text(encoding="utf-8"))
    launch["run"] |= {"cuda_alloc_retries_in_window": 4, "cuda_mallocs_in_window": 9}
    write(results, "launch_vs_bench.json", launch)
    bench_report = json.loads((results / "bert128.json").read_text(encoding="utf-8"))
    bench_report["results"][1]["cuda_alloc_retries_in_windows"] = 2
    write(results, "bert128.json", bench_report)
    write(results, "launch_expandable_vs_bench.json", launch | {"ratio": 0.991})  # gpu_check.sh's rerun
    source = verdicts(gpu_goals, results)["launch/pretrain.py ≥ 95% of the bench"][2]
    assert "4 allocator retries and 9 cudaMallocs in those steps" in source
    assert source.endswith("; with expandable segments ×0.991 (launch_expandable_vs_bench.json)")
    text = gpu_goals.report(results)
    assert "| ours [varlen, compiled by layer] | 128 × 256 | 598,482 | 32.9% | 1.26 |  | allocator retries 2 |" in text


def test_a_speed_goal_is_not_met_by_a_row_whose_stream_failed_its_convergence_check(gpu_goals, tmp_path):
    """FLOP audit (2026-11-28): the fastest row was the bf16 residual stream's, whose 300-step check had
    failed (+3.10%); ×1.5 read "met" at ×1.510 where the checked fp32 stream's row gave ×1.450."""
    compiled = row("transformers BertForPreTraining (torch.compile)", "hf_compiled", 400_000.0, ratio=1.0, mfu=0.25)
    fp32 = row("ours [varlen, compiled by layer]", "ours", 580_000.0, ratio=1.450, mfu=0.36)
    half = row("ours [varlen, compiled by layer, bf16 residual stream]", "ours", 604_000.0, ratio=1.510, mfu=0.3996,
               residual_stream="half")
    for check, expected in (({"passed": False, "relative_difference": 0.031}, ("×1.450", "missed")),
                            (None, ("×1.450", "missed")),
                            ({"passed": True, "relative_difference": 0.001}, ("×1.510", "met"))):
        write(tmp_path, "bert128.json", bench("bert", compiled, fp32, half, convergence={"half_stream": check}))
        measured, verdict, source = verdicts(gpu_goals, tmp_path)["seq 128: ×1.5 of transformers + torch.compile"]
        assert (measured, verdict) == expected, check
        assert ("bf16-residual-stream rows left out" in source) == (expected[1] == "missed")


def test_a_missed_figure_never_prints_as_its_threshold(gpu_goals):
    """An MFU of 39.996% printed "40.0%" beside "missed"; a launch pace of 0.94986 printed "×0.950"."""
    assert gpu_goals.shown(39.996, "%", 40.0) == "39.996%"
    assert gpu_goals.shown(0.949861, "×", 0.95) == "×0.9499"
    assert gpu_goals.shown(32.94, "%", 40.0) == "32.9%" and gpu_goals.shown(1.26, "×", 1.5) == "×1.260"
    assert gpu_goals.shown(40.04, "%", 40.0) == "40.0%"  # met: the usual digits


def test_a_stage_cut_by_its_timeout_or_skipped_for_the_budget_says_so(gpu_goals, tmp_path):
    """QA: a stage cut before its JSON read "missing (stage not run)", and a pytest part cut off read like a
    complete run."""
    partial = bench("bert", row("ours [varlen, compiled by layer]", "ours", 598_482.0, mfu=0.329),
                    complete=False, cut_off="while measuring the systems")
    write(tmp_path, "bert128.json", partial)
    write(tmp_path, "fp8.log", "bench_gpu: measuring ...\n")  # the fp8 stage ran, cut before its first row
    write(tmp_path, "skipped_stages.txt", "== families skipped: 12 s of the budget left\n")
    write(tmp_path, "gpu_tests.log",
          "-- part kernels (200 s)\ncollected 30 items / 4 deselected\n"
          "tests/test_gpu.py::test_a[varlen] PASSED\ntests/test_gpu.py::test_b FAILED\n"
          "-- part numerics: no time left\n")
    table = verdicts(gpu_goals, tmp_path)
    assert table["seq 128: MFU ≥ 40%"][2].endswith("cut off while measuring the systems: later rows missing")
    assert table["FP8: ×1.3 of our bf16 step"][2] == ("fp8.json missing: the stage ran (fp8.log) but was cut before "
                                                      "it saved a result")
    assert table["ALBERT: ×1.3 of its transformers class compiled"][2] == (
        "albert.json missing: stage families was skipped (12 s of the budget left)")
    assert table["seq 512: MFU ≥ 40%"][2] == "bert512.json missing (stage not run)"
    text = gpu_goals.report(tmp_path)
    assert "Skipped: stage families (12 s of the budget left)" in text
    assert "- part kernels: cut off before pytest's summary, 2 of 26 selected tests ran" in text
    assert "- part numerics: not run (no time left in the stage)" in text
    assert "- FAILED: `tests/test_gpu.py::test_b`" in text


def test_a_log_cut_inside_a_character_still_reads(gpu_goals, tmp_path):
    (tmp_path / "gpu_tests.log").write_bytes("tests/test_gpu.py::test_a PASSED\nend \u00d7".encode()[:-1])
    assert "`gpu` tests: 1 passed" in gpu_goals.report(tmp_path)


def test_a_launch_without_its_bench_row_keeps_its_pace(gpu_goals, tmp_path):
    write(tmp_path, "launch_vs_bench.json", {"run": {"steps": 7, "first_step": 31, "tokens_per_s": 530_000.0},
                                             "bench": None, "ratio": None, "why": "bert128.json missing: ..."})
    measured, verdict, source = verdicts(gpu_goals, tmp_path)["launch/pretrain.py ≥ 95% of the bench"]
    assert verdict == "not measured" and source.startswith("launch ran at 530,000 tok/s; bert128.json missing")


def test_cut_results_say_what_they_lack_and_a_section_that_cannot_read_costs_itself(gpu_goals, tmp_path):
    """QA (second pass): a finetune.json cut after one task was judged without a word, a cut in the convergence runs
    said "later rows missing", and a malformed tests log lost goals.md whole."""
    write(tmp_path, "finetune.json", {"device": "cuda", "complete": False, "tasks": {"ner": {
        "ratio_examples_per_s": 1.3, "f1_diff_test": 0.01, "results": {}}}})
    write(tmp_path, "bert128.json", bench("bert", row("ours [varlen, compiled by layer]", "ours", 598_482.0, mfu=0.329),
                                          complete=False, cut_off="in the convergence runs"))
    write(tmp_path, "launch_vs_bench.json", {
        "run": {"steps": 7, "first_step": 31, "tokens_per_s": 560_000.0},
        "bench": {"system": "ours [sdpa_padded", "tokens_per_s": 579_222.0}, "ratio": 0.967, "goal": 0.95,
        "bench_file": "/repo/.gpu_inputs/bert128.json"})
    write(tmp_path, "gpu_tests.log", "-- part \n")
    table = verdicts(gpu_goals, tmp_path)
    assert table["fine-tuning: ×1.2 of HF Trainer's examples/s"][2].endswith(
        "(finetune.json); cut off after these tasks: the others missing")
    assert table["seq 128: MFU ≥ 40%"][2].endswith("; cut off in the convergence runs: no convergence result")
    assert ", a bench row of an earlier call (/repo/.gpu_inputs/bert128.json)" in \
        table["launch/pretrain.py ≥ 95% of the bench"][2]
    assert "goals" in gpu_goals.report(tmp_path)  # the odd tests log did not stop the report
