"""benchmarks/bench_gpu.py keeps working and keeps its baselines honest: its whole path (batches,
transformers' class eager, compiled and on full-length rows, each of our kernels that runs here,
FLOPs accounting, the profile, the report) on CPU with a tiny model, and its timing window, which
synchronizes the device at its two ends only and reads nothing back from the device in between."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from tests import forked_main
from tests.conftest import REPO

BENCHMARKS = REPO / "benchmarks"
ROLES = ["hf_eager", "hf_compiled", "hf_full_length", "ours"]
# The subprocesses run beside another pytest worker on two cores: one thread each keeps OpenMP from
# spinning against the other worker (timings are not asserted, only the results' shape).
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
# aot_eager traces forward and backward as inductor does, without inductor's minutes of codegen on CPU.
QUICK = ["--device", "cpu", "--quick", "--seq-lengths", "128", "--warmup", "2"]


@pytest.fixture
def bench_gpu(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # its `from _results import ...`
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCHMARKS / "bench_gpu.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_gpu", module)
    spec.loader.exec_module(module)
    return module


def test_the_window_synchronizes_at_its_two_ends_only(bench_gpu):
    events, ticks = [], iter([10.0, 12.5])
    seconds = bench_gpu.time_window(lambda batch: events.append(f"step {batch}"), [0, 1, 2],
                                    sync=lambda: events.append("sync"), clock=lambda: next(ticks))
    assert events == ["sync", "step 0", "step 1", "step 2", "sync"] and seconds == 2.5


def test_a_system_is_counted_on_the_host_before_its_window(bench_gpu, monkeypatch):
    """run_system: warm-up steps, then three windows (the median's pace), each with two syncs and no
    .tolist()/.item() inside it."""
    in_window, read_backs, syncs = [False], [], []

    def sync() -> None:
        syncs.append(1)
        in_window[0] = not in_window[0]

    for method in ("tolist", "item"):
        original = getattr(torch.Tensor, method)

        def counting(tensor, *args, _original=original, _method=method):
            if in_window[0]:
                read_backs.append(_method)
            return _original(tensor, *args)
        monkeypatch.setattr(torch.Tensor, method, counting)
    model = torch.nn.Embedding(50, 4)
    batches = [{"input_ids": torch.randint(50, (2, 8)), "attention_mask": torch.tensor([[1] * 8, [1] * 5 + [0] * 3]),
                "labels": torch.tensor([[-100] * 7 + [3], [-100] * 8])} for _ in range(5)]
    system = bench_gpu.System("toy", "ours", model, lambda model, batch: model(batch["input_ids"]).square().mean(),
                              lambda batch: batch["input_ids"].numel())
    config = SimpleNamespace(model_type="bert", hidden_size=4, num_hidden_layers=1, intermediate_size=8, vocab_size=50,
                             num_attention_heads=2, embedding_size=4)
    row, _, window = bench_gpu.run_system(system, batches, 2, torch.device("cpu"), torch.float32, config, sync)
    assert len(syncs) == 2 * 3 and read_backs == [] and len(window) == row["steps"] == 3 and row["warmup_steps"] == 2
    assert row["windows"] == 3 and sorted(row["window_tokens_per_s"])[1] == pytest.approx(row["tokens_per_s"])
    assert row["window_spread"] >= 0
    assert row["tokens_per_s"] == pytest.approx(3 * 13 / row["window_seconds"])
    assert row["step_seconds"] == pytest.approx(row["window_seconds"] / 3)
    assert row["padding_fraction"] == pytest.approx(3 / 16) and row["mfu"] is None


def test_bench_gpu_runs_end_to_end_on_cpu(tmp_path):
    """BERT: the three transformers rows, ratios against the compiled one, and --profile's files."""
    out = tmp_path / "gpu.json"
    done = forked_main.run_command([sys.executable, str(BENCHMARKS / "bench_gpu.py"), *QUICK, "--compile-backend",
                                    "aot_eager", "--profile", "--out", str(out)], env=ONE_THREAD, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {row["role"]: row for row in result["results"]}
    assert [row["role"] for row in result["results"]] == ROLES and result["compile_backend"] == "aot_eager"
    assert rows["ours"]["system"] == "ours [sdpa_loop]"
    assert_baselines(rows, "BertForPreTraining")
    assert rows["ours"]["padding_fraction"] == 0.0 and rows["ours"]["mfu"] is None  # no peak is known for a CPU
    assert "baseline (×HFc = 1.00): transformers BertForPreTraining (torch.compile" in done.stdout
    assert "device-hours" in done.stdout and result["paper_budget_device_hours"] > 0 and result["complete"] is True
    for role in ("hf_compiled", "ours"):  # profiled: the baseline and ours, nothing else
        kernels = rows[role]["profile"]
        assert kernels and all(0 < kernel["share"] <= 1 and kernel["calls"] > 0 for kernel in kernels)
        assert sum(kernel["share"] for kernel in kernels) <= 1
        totals = rows[role]["profile_totals"]  # every op: at least the top ones' share, launches a step
        assert sum(kernel["share"] for kernel in kernels) <= totals["busy_share"] + 1e-9
        assert totals["kernels_per_step"] >= max(kernel["calls"] for kernel in kernels) / 2  # 2 profiled steps
    assert "profile" not in rows["hf_eager"] and "profile" not in rows["hf_full_length"]
    profiles = sorted(path.name for path in tmp_path.glob("profile_*.txt"))
    # the result's name first: stages share a folder
    assert profiles == ["profile_gpu-ours-sdpa-loop-seq128.txt",
                        "profile_gpu-transformers-bertforpretraining-torch-compile-sdpa-padded-full-mlm-head-"
                        "seq128.txt"]
    assert all("aten::" in (tmp_path / name).read_text() and "launches a step" in (tmp_path / name).read_text()
               for name in profiles)
    assert not list(tmp_path.glob("trace_*"))  # a chrome trace only with --trace


def assert_baselines(rows: dict, baseline_class: str) -> None:
    """Eager, compiled (the baseline) and full-length rows of the family's class, with their ratios."""
    eager, compiled, full = rows["hf_eager"], rows["hf_compiled"], rows["hf_full_length"]
    assert eager["system"] == f"transformers {baseline_class} (eager, SDPA, padded, full MLM head)"
    assert compiled["system"] == f"transformers {baseline_class} (torch.compile, SDPA, padded, full MLM head)"
    assert full["system"].startswith(f"transformers {baseline_class} (torch.compile, full-length rows")
    assert compiled["ratio"] == 1.0 and eager["ratio_vs_eager"] == 1.0
    assert [row["role"] for row in rows.values() if row["baseline"]] == ["hf_compiled"]
    for row in rows.values():
        assert row["ratio"] == pytest.approx(row["tokens_per_s"] / compiled["tokens_per_s"])
        assert row["ratio_vs_eager"] == pytest.approx(row["tokens_per_s"] / eager["tokens_per_s"])
        assert row["tokens_per_s"] > 0 and row["step_seconds"] == pytest.approx(row["window_seconds"] / row["steps"])
        assert row["seq"] == 128 and row["batch"] == 4 and row["graphs_compiled_in_window"] >= 0
    assert eager["padding_fraction"] == compiled["padding_fraction"] > 0 and full["padding_fraction"] == 0.0


def _bench_gpu_mains(runs: list[list[str]]) -> int:
    sys.path.insert(0, str(BENCHMARKS))  # as ``python -c`` in benchmarks/ finds it
    import bench_gpu

    for arguments in runs:
        bench_gpu.main(arguments)
    return 0


def test_bench_gpu_takes_the_other_model_families(tmp_path):
    """ALBERT and the RoBERTa layout: their own class eager, compiled and on full-length rows, then ours.
    One process runs both (the imports once); the eager backend (dynamo's graphs, run as they are)
    keeps it short."""
    runs = [[*QUICK, "--compile-backend", "eager", "--architecture", "albert", "--trace",
             "--out", str(tmp_path / "albert.json")],
            [*QUICK, "--compile-backend", "eager", "--architecture", "roberta",
             "--out", str(tmp_path / "roberta.json")]]
    calls = "; ".join(f"bench_gpu.main({arguments!r})" for arguments in runs)
    command = [sys.executable, "-c", f"import bench_gpu; {calls}"]
    if forked_main.can_fork():  # the same calls in a child forked from this process (tests/forked_main.py)
        done = forked_main.run(_bench_gpu_mains, (runs,), command, ONE_THREAD, 600, cwd=BENCHMARKS)
    else:
        done = subprocess.run(command, cwd=BENCHMARKS, capture_output=True, text=True, timeout=600, env=ONE_THREAD)
    assert done.returncode == 0, done.stderr[-3000:]
    for architecture, baseline_class in (("albert", "AlbertForPreTraining"), ("roberta", "RobertaForMaskedLM")):
        result = json.loads((tmp_path / f"{architecture}.json").read_text())
        rows = {row["role"]: row for row in result["results"]}
        assert result["architecture"] == architecture and [row["role"] for row in result["results"]] == ROLES
        assert result["vocab_size"] == {"albert": 30522, "roberta": 50265}[architecture]  # RoBERTa's recipe's
        assert_baselines(rows, baseline_class)
        assert rows["ours"]["system"].startswith("ours [") and rows["ours"]["tokens_per_s"] > 0
    traces = sorted(path.name for path in tmp_path.glob("trace_*.json"))  # albert's run only: --trace
    assert len(traces) == 2 and traces[0].startswith("trace_albert-ours-")
    assert traces[1].startswith("trace_albert-transformers-albertforpretraining-torch-compile-")


def test_under_cuda_graphs_the_warm_up_sees_each_window_batch_twice(bench_gpu, tmp_path):
    """--compile-mode reduce-overhead default: a row each, same batches, same run. Under graphs a shape runs
    uncaptured first and is recorded second, so the warm-up covers the window's batches twice and the window
    only replays; the row says CUDA graphs. (On CPU the mode records nothing: this is the wiring;
    tests/test_gpu.py replays graphs.)"""
    assert bench_gpu.warmup_batches([0, 1, 2, 3], 1, cuda_graphs=False) == [0]
    assert bench_gpu.warmup_batches([0, 1, 2, 3], 1, cuda_graphs=True) == [0, 1, 2, 3, 1, 2, 3]
    out = tmp_path / "gpu.json"
    bench_gpu.main([*QUICK, "--compile", "on", "--compile-backend", "eager", "--kernels", "sdpa_padded", "sdpa_loop",
                    "--compile-mode", "reduce-overhead", "default", "--no-baselines", "--out", str(out)])
    rows = json.loads(out.read_text())["results"]
    # sdpa_loop does not trace: its dense blocks compile (in the default mode, whichever mode comes first),
    # and a mode has no forward to record (one row)
    assert [(row["system"], row["compile_mode"]) for row in rows] == [
        ("ours [sdpa_padded, compiled by layer, CUDA graphs]", "reduce-overhead"),
        ("ours [sdpa_padded, compiled by layer]", None),
        ("ours [sdpa_loop, dense blocks compiled]", None)]
    assert rows[0]["cudagraph_skips"] >= 0 and "cudagraph_skips" not in rows[1]  # aot_eager: none said


def test_a_system_that_raises_is_recorded_and_the_others_still_run(bench_gpu, tmp_path, monkeypatch, capsys):
    """A one-shot GPU run keeps its other rows when one system fails (a kernel new to the machine, say):
    the failure is printed as it happens and kept as a row of role "failed" with the error, out of
    every ratio and pick."""
    run_system = bench_gpu.run_system

    def failing_for_sdpa_padded(system, *args, **kwargs):
        if system.kernel == "sdpa_padded":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return run_system(system, *args, **kwargs)

    monkeypatch.setattr(bench_gpu, "run_system", failing_for_sdpa_padded)
    out = tmp_path / "gpu.json"
    bench_gpu.main([*QUICK, "--compile-backend", "eager", "--kernels", "sdpa_padded", "sdpa_loop",
                    "--out", str(out)])
    rows = json.loads(out.read_text())["results"]
    assert [row["role"] for row in rows] == [*ROLES, "failed"]
    failed = rows[-1]
    assert failed["system"] == "ours [sdpa_padded]" and failed["failed_role"] == "ours"
    assert failed["error"] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert rows[3]["system"] == "ours [sdpa_loop]" and rows[3]["ratio"] is not None
    assert "FAILED ours [sdpa_padded]: RuntimeError: CUDA error" in capsys.readouterr().out


def test_each_system_and_the_rows_before_the_convergence_runs_are_saved_as_they_end(bench_gpu, tmp_path,
                                                                                     monkeypatch):
    """QA: the JSON was written once, after the 300-step convergence runs, so a stage cut by its timeout lost every
    row it had measured (run C's families stage lost its transformers rows so)."""
    out = tmp_path / "gpu.json"
    saved: list[tuple[int, bool, str | None]] = []
    run_system = bench_gpu.run_system

    def noting_what_is_on_disk(*args, **kwargs):
        if out.exists():
            report = json.loads(out.read_text())
            saved.append((len(report["results"]), report["complete"], report.get("cut_off")))
        return run_system(*args, **kwargs)

    def cut_by_the_timeout(*args, **kwargs):
        report = json.loads(out.read_text())
        saved.append((len(report["results"]), report["complete"], report.get("cut_off")))
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_gpu, "run_system", noting_what_is_on_disk)
    monkeypatch.setattr(bench_gpu, "convergence", cut_by_the_timeout)
    with pytest.raises(KeyboardInterrupt):
        bench_gpu.main([*QUICK, "--compile-backend", "eager", "--convergence-steps", "3", "--out", str(out)])
    cut = "while measuring the systems"
    assert saved == [(1, False, cut), (2, False, cut), (3, False, cut), (4, False, "in the convergence runs")]
    rows = json.loads(out.read_text())["results"]
    assert [row["role"] for row in rows] == ROLES and rows[3]["ratio"] is not None
    assert not list(tmp_path.glob("*.partial"))


def test_fp8_is_refused_where_it_cannot_run(tmp_path):
    """--precision fp8 on the CPU: exit 2 with check_fp8's reason, before any model is built or file written."""
    out = tmp_path / "gpu.json"
    done = forked_main.run_command([sys.executable, str(BENCHMARKS / "bench_gpu.py"), "--device", "cpu", "--quick",
                                    "--precision", "fp8", "--out", str(out)], env=ONE_THREAD, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "fp8" in done.stderr and "cannot run here" in done.stderr and not out.exists()


def test_convergence_runs_bf16_and_the_half_stream_and_says_why_not_fp8_on_cpu(tmp_path):
    """--convergence-only: no throughput rows, the bf16 run's loss at every step, the half residual stream's
    run against it, fp8 not run and why (not asked for; asked for, the CPU refuses it before anything runs)."""
    out = tmp_path / "gpu.json"
    done = forked_main.run_command([sys.executable, str(BENCHMARKS / "bench_gpu.py"), *QUICK, "--convergence-steps",
                                    "5", "--convergence-only", "--precision", "bf16", "--residual-stream", "fp32",
                                    "half", "--out", str(out)], env=ONE_THREAD, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["results"] == [] and result["paper_budget_device_hours"] is None
    convergence = result["convergence"]
    assert convergence["steps"] == 5 and convergence["kernel"] == "sdpa_loop" and convergence["batch"] == 4
    losses = convergence["losses_bf16"]
    assert len(losses) == 5 and all(0 < loss < 20 for loss in losses)
    assert convergence["bf16_final"] == pytest.approx(sum(losses) / 5)
    assert convergence["fp8_final"] is None and convergence["losses_fp8"] is None and convergence["passed"] is None
    assert convergence["relative_difference"] is None and "--precision fp8" in convergence["fp8_not_run"]
    half = convergence["half_stream"]
    assert len(half["losses"]) == 5 and half["final"] == pytest.approx(sum(half["losses"]) / 5)
    assert half["relative_difference"] == pytest.approx((half["final"] - convergence["bf16_final"])
                                                        / convergence["bf16_final"])
    assert abs(half["relative_difference"]) < 0.05 and half["passed"] == (abs(half["relative_difference"]) <= 0.01)
    assert "convergence, 5 steps of ours [sdpa_loop]" in done.stdout and "fp8 not run" in done.stdout
    assert "half residual stream final" in done.stdout


def test_a_half_residual_stream_needs_a_half_precision(bench_gpu):
    with pytest.raises(SystemExit):
        bench_gpu.parse_args(["--device", "cpu", "--residual-stream", "half"])
    assert bench_gpu.parse_args(["--device", "cpu", "--precision", "bf16", "--residual-stream", "fp32", "half"]
                                ).residual_stream == ["fp32", "half"]


def test_fp8_rows_are_compared_with_our_bf16_rows(bench_gpu):
    """ratio_vs_our_bf16 on an fp8 row: against our bf16 row of the same kernel; none on the others."""
    rows = [{"role": "hf_eager", "kernel": None, "precision": "bf16", "tokens_per_s": 50.0},
            {"role": "hf_compiled", "kernel": None, "precision": "bf16", "tokens_per_s": 100.0},
            {"role": "ours", "kernel": "varlen", "precision": "bf16", "tokens_per_s": 200.0},
            {"role": "ours", "kernel": "varlen", "precision": "fp8", "tokens_per_s": 250.0},
            {"role": "ours", "kernel": "flex", "precision": "bf16", "tokens_per_s": 150.0},
            {"role": "ours", "kernel": "varlen", "precision": "bf16", "tokens_per_s": 300.0,
             "compile_mode": "reduce-overhead"},
            {"role": "ours", "kernel": "varlen", "precision": "fp8", "tokens_per_s": 330.0,
             "compile_mode": "reduce-overhead"}]
    bench_gpu.add_ratios(rows)
    assert rows[3]["ratio_vs_our_bf16"] == pytest.approx(1.25) and rows[3]["ratio"] == pytest.approx(2.5)
    assert rows[6]["ratio_vs_our_bf16"] == pytest.approx(1.1)  # against the bf16 row of its own compile mode
    assert all("ratio_vs_our_bf16" not in row for index, row in enumerate(rows) if index not in (3, 6))
    assert bench_gpu._fastest_ours(rows, precision="bf16")["kernel"] == "varlen"
    assert bench_gpu.final_loss(list(range(30))) == pytest.approx(sum(range(10, 30)) / 20)


def test_half_stream_rows_are_compared_with_the_fp32_stream_of_their_kernel(bench_gpu):
    rows = [{"role": "ours", "kernel": "varlen", "precision": "bf16", "tokens_per_s": 200.0, "residual_stream": "fp32"},
            {"role": "ours", "kernel": "varlen", "precision": "bf16", "tokens_per_s": 220.0, "residual_stream": "half"},
            {"role": "ours", "kernel": "sdpa_padded", "precision": "bf16", "tokens_per_s": 100.0,
             "residual_stream": "fp32"},
            {"role": "ours", "kernel": "sdpa_padded", "precision": "bf16", "tokens_per_s": 125.0,
             "residual_stream": "half"},
            {"role": "ours", "kernel": "varlen", "precision": "fp8", "tokens_per_s": 330.0, "residual_stream": "half"}]
    bench_gpu.add_ratios(rows)
    assert rows[1]["ratio_vs_fp32_stream"] == pytest.approx(1.1)
    assert rows[3]["ratio_vs_fp32_stream"] == pytest.approx(1.25)
    assert "ratio_vs_fp32_stream" not in rows[4]  # no fp8 row with the fp32 stream
    assert rows[4]["ratio_vs_our_bf16"] == pytest.approx(1.5)  # against the bf16 row of its own stream
    assert all("ratio_vs_fp32_stream" not in rows[index] for index in (0, 2))


def test_structured_text_is_reproducible_and_learnable(bench_gpu):
    """The convergence batches: the same for the same seed; odd positions follow their neighbour half the time."""
    first, second = (bench_gpu.StructuredText(torch.Generator().manual_seed(3)).sample(4000) for _ in range(2))
    assert first == second and all(1000 <= token < bench_gpu.VOCAB for token in first)
    text = bench_gpu.StructuredText(torch.Generator().manual_seed(3))
    follows = sum(text.successor[a - 1000] == b for a, b in zip(first[0::2], first[1::2])) / 2000
    assert 0.4 < follows < 0.6


def test_with_fp8_each_of_our_kernels_runs_in_bf16_then_fp8(bench_gpu, monkeypatch):
    """_our_systems(fp8=True): our bf16 row, then the same kernel with the encoder converted (torchao faked:
    a converter that records the call); run_system measures an fp8 row's MFU against the FP8 peak."""
    from biomed_lm.pretrain import flops, fp8
    from biomed_lm.pretrain.families import get_family

    converted = []
    monkeypatch.setattr(fp8, "convert_encoder_to_fp8", lambda model, family=None, **_: converted.append(family.name))
    args = bench_gpu.parse_args(["--device", "cpu", "--quick"])
    args.model = "bert-tiny"
    family = get_family("bert")
    bert = bench_gpu.build_model(args, family)
    rows = list(bench_gpu._our_systems(bert, family, torch.device("cpu"), torch.bfloat16, False, 128, None, "eager",
                                       fp8=True))
    assert [(system.name, system.kernel, system.fp8) for system in rows] == [
        ("ours [sdpa_loop]", "sdpa_loop", False), ("ours [sdpa_loop, fp8 encoder Linear layers]", "sdpa_loop", True)]
    assert converted == ["bert"]
    monkeypatch.setattr(flops, "peak_flops", lambda precision, device=None: {"fp8": 4e12, "bf16": 2e12}[precision])
    model = torch.nn.Embedding(50, 4)
    batches = [{"input_ids": torch.randint(50, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long),
                "labels": torch.tensor([[-100] * 7 + [3]] * 2)} for _ in range(3)]
    config = SimpleNamespace(model_type="bert", hidden_size=4, num_hidden_layers=1, intermediate_size=8, vocab_size=50,
                             num_attention_heads=2, embedding_size=4)
    measured = {}
    for in_fp8 in (False, True):
        system = bench_gpu.System("toy", "ours", model, lambda model, batch: model(batch["input_ids"]).square().mean(),
                                  lambda batch: batch["input_ids"].numel(), kernel="toy", fp8=in_fp8)
        row, _, _ = bench_gpu.run_system(system, batches, 1, torch.device("cpu"), torch.bfloat16, config,
                                         lambda: None)
        measured[row["precision"]] = row
    assert measured["fp8"]["mfu_peak"] == "fp8" and measured["bf16"]["mfu_peak"] == "bf16"
    # the same batches, so the same model FLOPs: each MFU × its peak × its window gives them back
    done = [measured[precision]["mfu"] * peak * measured[precision]["window_seconds"]
            for precision, peak in (("fp8", 4e12), ("bf16", 2e12))]
    assert done[0] == pytest.approx(done[1]) and done[0] > 0


def test_without_baselines_only_our_rows_run_and_their_ratios_are_null(bench_gpu):
    """--no-baselines (gpu_check's fp8 stage, after the bert stage measured transformers)."""
    from transformers import BertConfig, BertForPreTraining

    bert = BertForPreTraining(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=32))
    rows = list(bench_gpu.systems(bert, torch.device("cpu"), torch.float32, False, 128, baselines="none"))
    assert [system.role for system in rows] == ["ours"]
    table = [{"role": "ours", "kernel": "varlen", "precision": "bf16", "tokens_per_s": 200.0},
             {"role": "ours", "kernel": "varlen", "precision": "fp8", "tokens_per_s": 300.0}]
    bench_gpu.add_ratios(table)
    assert [row["ratio"] for row in table] == [None, None] and table[1]["ratio_vs_our_bf16"] == pytest.approx(1.5)


def test_real_instances_start_again_where_a_run_needs_more(bench_gpu, tmp_path, capsys):
    """The convergence runs take steps × batch instances: a folder holding fewer is passed over again in
    order (as a run's epochs are), each instance cut to the length with [SEP] last."""
    from datasets import Dataset

    rows = [{"input_ids": [101, 7 + n, 8, 9, 102], "token_type_ids": [0] * 5, "word_starts": [1] * 5,
             "next_sentence_label": n % 2} for n in range(3)]
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "instances"))
    got = bench_gpu.real_rows(str(tmp_path / "instances"), 4, 7)
    assert [row["input_ids"] for row in got] == [[101, 7 + n % 3, 8, bench_gpu.SEP] for n in range(7)]
    assert [row["next_sentence_label"] for row in got] == [0, 1, 0, 0, 1, 0, 0]
    assert "holds 3 instances; the convergence runs take 7: 2.3 passes" in capsys.readouterr().out


def test_every_rows_step_clips_the_gradients_before_the_optimizer(bench_gpu):
    """The bench's step clips as the trainer does (--max-grad-norm, default 1.0): with SGD at lr 1 the update
    is the clipped gradient, so its norm is the clipping norm; 0 leaves the gradient as it is."""
    def update_norm(max_grad_norm: float) -> float:
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4)
        before = [p.detach().clone() for p in model.parameters()]
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        step = bench_gpu.make_step(model, lambda m, batch: (m(batch["x"]) * 100).pow(2).sum(), optimizer,
                                   torch.device("cpu"), torch.float32, max_grad_norm)
        step({"x": torch.randn(16, 8)})
        return torch.sqrt(sum(((p - b) ** 2).sum() for p, b in zip(model.parameters(), before))).item()

    assert update_norm(0.5) == pytest.approx(0.5, rel=1e-4)
    assert update_norm(0.0) > 100
    assert bench_gpu.parse_args(["--device", "cpu"]).max_grad_norm == 1.0


def test_window_flops_count_a_pair_head_only_where_the_family_has_one(bench_gpu):
    """FLOP audit (2026-11-28): RoBERTa's rows were charged an NSP head it does not have (the trainer was right)."""
    from transformers import BertConfig, RobertaConfig

    from biomed_lm.pretrain.flops import pair_head_multiply_adds

    sizes = dict(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    batch = {"attention_mask": torch.tensor([[1] * 8, [1] * 5 + [0] * 3]),
             "labels": torch.tensor([[-100] * 7 + [3], [-100] * 8])}
    bert, roberta = BertConfig(**sizes), RobertaConfig(**sizes)
    counted = {name: bench_gpu.window_counts([batch], config, lambda b: 16) for name, config in
               (("bert", bert), ("roberta", roberta))}
    assert counted["bert"].flops - counted["roberta"].flops == pytest.approx(6 * 2 * pair_head_multiply_adds(bert))
    assert counted["bert"].sequences == 2 and counted["bert"].tokens == 13
