#!/usr/bin/env python
"""Issue 23's goals judged from one ``gpu_check.sh`` run: what each stage measured, in tables ready for
``benchmarks/README.md``.

    python benchmarks/gpu_goals.py /tmp/gpu_check            # the results folder (gpu_check.tgz unpacked)
    python benchmarks/gpu_goals.py RESULTS --out goals.md

Prints, in markdown: the machine (``environment.txt``), each goal with what was measured, its
threshold and a verdict (met, missed, or not measured and why: the stage did not run, its system
failed, or a figure is missing), the rows of every ``bench_gpu.py`` result (tokens/s, MFU, ratios,
memory, warm-up, spread), the fine-tuning rows, and the ``gpu`` tests' outcome. It reads only what
the stages wrote; nothing is run again. ``gpu_check.sh`` runs it last, so the lease's returned
archive carries ``goals.md``.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

#: A figure and how it was read (which row, which file), or why there is none.
Reading = tuple[float | None, str]


@dataclass(frozen=True)
class Goal:
    """One of the issue's goals: its words, what it needs (``value >= threshold``), how the value
    is written (``×`` for a ratio, ``%`` for MFU, ``pass`` for a check) and how it is read."""

    text: str
    threshold: float
    unit: str
    read: Callable[[Path], Reading]


def load(results: Path, name: str) -> dict | None:
    """A stage's JSON result, None where the stage wrote none; a file cut short raises ValueError (the
    goals' table says "unreadable" for its goals, the other sections leave it out)."""
    path = results / name
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def load_or_none(results: Path, name: str) -> dict | None:
    try:
        return load(results, name)
    except ValueError:
        return None


def off_gpu(report: dict, name: str) -> str | None:
    """Why a result judges no goal: it was measured on the CPU (``SMOKE=1``, a tiny model), or None."""
    device = str(report.get("device", "cuda"))
    return None if device.startswith("cuda") else f"{name}: measured on {device}, not a GPU"


#: The log a stage writes beside each result that is not named after it (bench_gpu.py's are: NAME.log).
LOGS = {"finetune.json": "bench_finetune.log", "launch_vs_bench.json": "launch.log"}


#: The gpu_check.sh stage that writes each result.
STAGE_OF = {"bert128.json": "bert", "gpu_tests.log": "tests", "launch_vs_bench.json": "launch", "fp8.json": "fp8",
            "roberta.json": "families", "albert.json": "families", "finetune.json": "finetune",
            "bert512.json": "bert512"}


def missing(results: Path, name: str) -> str:
    """Why ``name`` is not there: the stage did not run, was skipped for the budget, or was cut before it saved."""
    log = LOGS.get(name, Path(name).stem + ".log")
    if (results / log).is_file():
        return f"{name} missing: the stage ran ({log}) but was cut before it saved a result"
    why = skipped_stages(results).get(STAGE_OF.get(name, ""))
    if why is not None:
        return f"{name} missing: stage {STAGE_OF[name]} was skipped ({why})"
    return f"{name} missing (stage not run)"


def skipped_stages(results: Path) -> dict[str, str]:
    """The stages gpu_check.sh skipped, each with its reason (``== NAME skipped: REASON`` lines): too little of
    the budget left, or no instances to launch on."""
    path = results / "skipped_stages.txt"
    text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    return dict(re.findall(r"^== (\S+) skipped: (.*)$", text, re.M))


def cut_note(report: dict) -> str:
    """The note on a result saved part-way (its stage's timeout cut it), "" for a complete one."""
    if report.get("complete") is not False:
        return ""
    where = report.get("cut_off", "part-way")
    lost = {"while measuring the systems": "later rows missing", "in the convergence runs": "no convergence result"}
    return f"; cut off {where}: {lost.get(where, 'later results missing')}"


def gpu_result(results: Path, name: str) -> tuple[dict | None, str | None]:
    """A stage's result measured on a GPU, or None and why there is none (stage not run, or run on the CPU)."""
    report = load(results, name)
    if report is None:
        return None, missing(results, name)
    why = off_gpu(report, name)
    return (None, why) if why else (report, None)


def half_stream_unchecked(report: dict) -> str | None:
    """Why the rows with the bf16 residual stream cannot judge a speed goal: their 300-step convergence check
    against the fp32 stream failed or did not run in this report (a faster row that trains differently
    proves nothing), or None when it passed."""
    check = (report.get("convergence") or {}).get("half_stream") or {}
    if check.get("passed") is True:
        return None
    return "its convergence check failed" if check.get("passed") is False else "no convergence check in the run"


def fastest_ours(report: dict, precision: str = "bf16") -> dict | None:
    """The fastest of our rows in ``precision`` that ran (a failed system has role ``failed``), leaving out
    the bf16 residual stream's rows unless its convergence check passed."""
    unchecked = half_stream_unchecked(report)
    rows = [r for r in report["results"] if r.get("role") == "ours" and r.get("precision") == precision
            and not (unchecked and r.get("residual_stream") == "half")]
    return max(rows, key=lambda r: r["tokens_per_s"]) if rows else None


def left_out(report: dict, precision: str = "bf16") -> str:
    """The note on half-stream rows :func:`fastest_ours` left out, "" when none was."""
    why = half_stream_unchecked(report)
    left = [r for r in report["results"] if r.get("role") == "ours" and r.get("precision") == precision
            and r.get("residual_stream") == "half"]
    return f"; bf16-residual-stream rows left out ({why})" if why and left else ""


def failures(report: dict) -> str:
    failed = [f"{r['system']}: {r.get('error', '?')[:120]}" for r in report["results"] if r.get("role") == "failed"]
    return f"; failed: {' | '.join(failed)}" if failed else ""


def ours_figure(name: str, figure: str, precision: str = "bf16") -> Callable[[Path], Reading]:
    """A figure of the fastest of our rows in ``name``: ``ratio`` (to transformers compiled) or ``mfu``."""
    def read(results: Path) -> Reading:
        report, why = gpu_result(results, name)
        if report is None:
            return None, why
        row = fastest_ours(report, precision)
        if row is None:
            return None, f"{name}: no row of ours ran{failures(report)}{cut_note(report)}"
        value = row.get(figure)
        if value is None:
            why = "no known peak for the device" if figure == "mfu" else "no transformers compiled row in the run"
            return None, f"{name}: {row['system']} has no {figure} ({why}){failures(report)}"
        scale = 100.0 if figure == "mfu" else 1.0
        source = f"{row['system']}, {row['tokens_per_s']:,.0f} tok/s ({name})"
        return value * scale, f"{source}{left_out(report, precision)}{cut_note(report)}"
    return read


def fp8_speedup(results: Path) -> Reading:
    report, why = gpu_result(results, "fp8.json")
    if report is None:
        return None, why
    row = fastest_ours(report, "fp8")
    if row is None or row.get("ratio_vs_our_bf16") is None:
        return None, f"fp8.json: no fp8 row beside a bf16 one{failures(report)}{cut_note(report)}"
    return row["ratio_vs_our_bf16"], f"{row['system']}, {row['tokens_per_s']:,.0f} tok/s (fp8.json){cut_note(report)}"


def convergence_check(name: str, part: str | None = None) -> Callable[[Path], Reading]:
    """``convergence.passed`` of ``name`` (or of its sub-check ``part``): 1 passed, 0 failed."""
    def read(results: Path) -> Reading:
        report = load(results, name)
        if report and (why := off_gpu(report, name)):
            return None, why
        check = (report or {}).get("convergence") or {}
        check = (check.get(part) or {}) if part else check
        if check.get("passed") is None:
            why = missing(results, name) if report is None else cut_note(report).lstrip("; ")
            return None, f"{name}: no convergence result{' (' + part + ')' if part else ''}{': ' + why if why else ''}"
        difference = check.get("relative_difference")
        detail = f"final losses {difference:+.2%} apart" if difference is not None else "no loss difference recorded"
        return float(bool(check["passed"])), f"{detail} ({name})"
    return read


def launch_pace(results: Path) -> Reading:
    report = load(results, "launch_vs_bench.json")
    if report is None:
        return None, missing(results, "launch_vs_bench.json") + " (or the run wrote no metrics)"
    bench_report = load(results, "bert128.json")  # the row it is measured against, and where that ran
    if bench_report and (why := off_gpu(bench_report, "bert128.json")):
        return None, why
    run, bench = report["run"], report["bench"]
    if bench is None:
        return None, f"launch ran at {run['tokens_per_s']:,.0f} tok/s; {report.get('why')} (launch_vs_bench.json)"
    retries = ("" if run.get("cuda_alloc_retries_in_window") is None else
               f", {run['cuda_alloc_retries_in_window']} allocator retries and {run['cuda_mallocs_in_window']} "
               "cudaMallocs in those steps")
    expandable = load(results, "launch_expandable_vs_bench.json")  # the rerun where the allocator retried
    rerun = ("" if expandable is None else
             f"; with expandable segments ×{expandable['ratio']:.3f} (launch_expandable_vs_bench.json)")
    source = report.get("bench_file", "")
    against = "" if not source or Path(source).parent == results or Path(source).name != "bert128.json" else (
        f", a bench row of an earlier call ({source})")
    return report["ratio"], (f"{run['tokens_per_s']:,.0f} tok/s over {run['steps']} logged steps from step "
                             f"{run['first_step']} vs {bench['tokens_per_s']:,.0f}{against}{retries} "
                             f"(launch_vs_bench.json){rerun}")


def finetune_figure(key: str) -> Callable[[Path], Reading]:
    """The lowest over the fine-tuning tasks of ``key``: ``ratio_examples_per_s`` (ours / HF Trainer's
    default) or ``f1_diff_test`` (ours - HF's test F1), every task's two figures beside it."""
    def read(results: Path) -> Reading:
        report, why = gpu_result(results, "finetune.json")
        if report is None or not report.get("tasks"):
            return None, why or "finetune.json: no task ran"
        tasks = report["tasks"]
        parts = [f"{name} ×{task['ratio_examples_per_s']:.2f}, test F1 {task['f1_diff_test']:+.3f}"
                 for name, task in tasks.items()]
        cut = "; cut off after these tasks: the others missing" if report.get("complete") is False else ""
        return min(task[key] for task in tasks.values()), "; ".join(parts) + f" (finetune.json){cut}"
    return read


GOALS = (
    Goal("seq 128: ×1.5 of transformers + torch.compile", 1.5, "×", ours_figure("bert128.json", "ratio")),
    Goal("seq 128: MFU ≥ 40%", 40.0, "%", ours_figure("bert128.json", "mfu")),
    Goal("seq 512: ×1.8 of transformers + torch.compile", 1.8, "×", ours_figure("bert512.json", "ratio")),
    Goal("seq 512: MFU ≥ 40%", 40.0, "%", ours_figure("bert512.json", "mfu")),
    Goal("FP8: ×1.3 of our bf16 step", 1.3, "×", fp8_speedup),
    Goal("FP8: 300-step convergence check", 1.0, "pass", convergence_check("fp8.json")),
    Goal("bf16 residual stream: 300-step convergence check", 1.0, "pass",
         convergence_check("bert128.json", "half_stream")),
    Goal("launch/pretrain.py ≥ 95% of the bench", 0.95, "×", launch_pace),
    Goal("RoBERTa: ×1.3 of its transformers class compiled", 1.3, "×", ours_figure("roberta.json", "ratio")),
    Goal("ALBERT: ×1.3 of its transformers class compiled", 1.3, "×", ours_figure("albert.json", "ratio")),
    Goal("fine-tuning: ×1.2 of HF Trainer's examples/s", 1.2, "×", finetune_figure("ratio_examples_per_s")),
    # "at equal F1": one seed's test F1 of a short run moves by points between seeds (benchmarks/README.md)
    Goal("fine-tuning: at equal F1 (test F1 at most 0.02 below HF's)", -0.02, "F1", finetune_figure("f1_diff_test")),
)


def shown(value: float, unit: str, threshold: float | None = None) -> str:
    """The figure as goals.md prints it, with as many more digits as it takes for a missed goal not to read
    as the threshold (an MFU of 39.996% is not "40.0%")."""
    if unit == "pass":
        return "passed" if value else "failed"
    digits = {"×": 3, "%": 1, "F1": 3}[unit]
    while threshold is not None and value < threshold <= round(value, digits) and digits < 9:
        digits += 1
    return {"×": f"×{value:.{digits}f}", "%": f"{value:.{digits}f}%", "F1": f"{value:+.{digits}f}"}[unit]


def goals_table(results: Path) -> list[str]:
    lines = ["| goal | measured | verdict | from |", "| --- | ---: | --- | --- |"]
    for goal in GOALS:
        try:
            value, detail = goal.read(results)
        except (KeyError, TypeError, ValueError) as error:  # a result file of another shape: say so, go on
            value, detail = None, f"unreadable: {type(error).__name__}: {error}"
        verdict = "not measured" if value is None else "met" if value >= goal.threshold else "missed"
        figure = "" if value is None else shown(value, goal.unit, goal.threshold)
        lines.append(f"| {goal.text} | {figure} | {verdict} | {detail} |")
    return lines


def bench_tables(results: Path) -> list[str]:
    """Every bench_gpu.py result's rows, as the README's run tables have them."""
    lines = []
    for path in sorted(results.glob("*.json")):
        report = load_or_none(results, path.name)
        if not isinstance(report, dict) or "results" not in report or "architecture" not in report:
            continue
        lines += ["", f"**{path.name}** ({report.get('device_name', report.get('device'))}, "
                      f"{report['architecture']}, {report.get('model')}, {report.get('precision')}; "
                      f"{report.get('warmup_steps')} warm-up steps, windows of {report.get('timed_steps')})", "",
                  "| system | seq × batch | tokens/s | MFU | ×HFc | ×HFe | other | peak GiB | warm-up | spread |",
                  "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
        for row in report["results"]:
            lines.append(bench_row(row))
    return lines


def bench_row(row: dict) -> str:
    if row.get("role") == "failed":
        return f"| {row['system']} | {row.get('seq')} × {row.get('batch')} | failed: {row.get('error', '')[:160]} " \
               "| | | | | | | |"

    def number(key: str, form: str, scale: float = 1.0) -> str:
        return "" if row.get(key) is None else format(row[key] * scale, form)

    other = [f"{key} ×{row[key]:.3f}" for key in ("ratio_vs_our_bf16", "ratio_vs_fp32_stream") if key in row]
    if row.get("cuda_alloc_retries_in_windows"):  # each a synchronize and cudaFree inside the timed windows
        other.append(f"allocator retries {row['cuda_alloc_retries_in_windows']}")
    mfu = "" if row.get("mfu") is None else f"{row['mfu']:.1%}"
    mfu += " (fp8 peak)" if mfu and row.get("mfu_peak") == "fp8" else ""
    return (f"| {row['system']} | {row['seq']} × {row['batch']} | {number('tokens_per_s', ',.0f')} | {mfu} "
            f"| {number('ratio', '.2f')} | {number('ratio_vs_eager', '.2f')} | {'; '.join(other)} "
            f"| {number('peak_memory_gib', '.1f')} | {number('warmup_seconds', '.0f')} s "
            f"| {number('window_spread', '.1%')} |")


def finetune_table(results: Path) -> list[str]:
    report = load_or_none(results, "finetune.json")
    if not report or not report.get("tasks"):
        return []
    lines = ["", f"**finetune.json** ({report.get('device_name')}, {report.get('precision')})", "",
             "| task | method | examples/s (steady) | dev F1 | test F1 |", "| --- | --- | ---: | ---: | ---: |"]
    for name, task in report["tasks"].items():
        for method, row in task["results"].items():
            lines.append(f"| {name} | {method} | {row['examples_per_s_steady']:.1f} | {row['dev_f1']:.3f} "
                         f"| {row['test_f1']:.3f} |")
    return lines


def recipe_mfus(results: Path) -> list[str]:
    """The measured MFUs ``experiments/recipes.MEASURED_MFU`` projects the recipes' costs from: BERT at 128
    as ``launch/pretrain.py`` ran (the launch stage), the other lengths and families from the bench's
    fastest row of ours in bf16."""
    found = []
    launch = load_or_none(results, "launch_vs_bench.json")
    if launch and launch.get("run", {}).get("mfu") is not None:
        found.append(f"bert 128: {launch['run']['mfu']:.3f} (launch/pretrain.py, launch_vs_bench.json)")
    for family, name in (("bert", "bert512.json"), ("roberta", "roberta.json"), ("albert", "albert.json")):
        report = load_or_none(results, name)
        row = fastest_ours(report) if report else None
        if row is not None and row.get("mfu") is not None:
            found.append(f"{family} {row['seq']}: {row['mfu']:.3f} ({row['system']}, {name})")
    return ["", "MFUs for `experiments/recipes.MEASURED_MFU`: " + ("; ".join(found) if found else "none measured")]


_OUTCOME = re.compile(r"^(tests/.+?) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b", re.M)


def tests_outcome(results: Path) -> list[str]:
    """The ``gpu`` tests' outcome from pytest's verbose log: counts, each failure's name, and each part (a
    ``-- part`` line of gpu_check.sh) that ended before pytest's summary: how many of its tests ran."""
    path = results / "gpu_tests.log"
    if not path.is_file():
        return ["", "`gpu` tests: " + missing(results, "gpu_tests.log").replace("gpu_tests.log missing: the stage "
                                                                                  "ran (gpu_tests.log)", "the log")]
    text = path.read_text(encoding="utf-8", errors="replace")  # a log cut inside a character still reads
    outcomes = _OUTCOME.findall(text)
    counts = {kind: sum(1 for _, outcome in outcomes if outcome == kind) for kind in ("PASSED", "FAILED", "SKIPPED",
                                                                                     "ERROR")}
    lines = ["", "`gpu` tests: " + ", ".join(f"{n} {kind.lower()}" for kind, n in counts.items() if n)
             + ("" if outcomes else "no test outcome in gpu_tests.log (cut off before the first?)")]
    lines += [f"- {outcome}: `{name}`" for name, outcome in outcomes if outcome in ("FAILED", "ERROR")]
    return lines + [f"- {line}" for line in unfinished_parts(text)]


def unfinished_parts(text: str) -> list[str]:
    """A line per pytest run in the log that has no final summary (``== ... in 12.3s ==``): cut off."""
    parts = re.split(r"^-- part ", text, flags=re.M)
    named = [("", parts[0])] if parts[0].strip() else []
    named += [((part.split(None, 1) or ["?"])[0].rstrip(":"), part) for part in parts[1:]]
    found = []
    for name, part in named:
        if "no time left" in (part.splitlines() or [""])[0]:
            found.append(f"part {name}: not run (no time left in the stage)")
            continue
        if re.search(r"^=+ .* in [\d.]+s(?: \(.*\))? =+$", part, re.M):
            continue
        collected = re.search(r"collected (\d+) items?(?: / (\d+) deselected)?", part)
        selected = int(collected.group(1)) - int(collected.group(2) or 0) if collected else None
        ran = len(_OUTCOME.findall(part))
        found.append(f"part {name or 'tests'}: cut off before pytest's summary, {ran} of "
                     f"{selected if selected is not None else '?'} selected tests ran")
    return found


def report(results: Path) -> str:
    environment = results / "environment.txt"
    lines = [f"# issue 23's goals from {results}", ""]
    if environment.is_file():
        lines += ["```", environment.read_text(encoding="utf-8", errors="replace").strip(), "```", ""]
    skipped = skipped_stages(results)
    if skipped:
        lines += [f"Skipped: stage {stage} ({why})" for stage, why in skipped.items()] + [""]
    lines += goals_table(results)
    for section in (recipe_mfus, bench_tables, finetune_table, tests_outcome):  # one that cannot read its files
        try:                                                                  # costs itself, not goals.md
            lines += section(results)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
            lines += ["", f"{section.__name__}: unreadable: {type(error).__name__}: {error}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, nargs="?", default=Path("/tmp/gpu_check"),
                        help="gpu_check.sh's results folder (default /tmp/gpu_check)")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown here")
    args = parser.parse_args(argv)
    if not args.results.is_dir():
        parser.error(f"{args.results}: no such folder (gpu_check.sh's RESULTS, or its gpu_check.tgz unpacked)")
    text = report(args.results)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
