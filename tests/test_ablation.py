"""The ablation runner: config checking, the variant grid, the commands it builds, and a whole
vocabulary ablation on BERT-tiny (each variant pretrained twice) end to end on CPU (report and
multilevel analysis included), resumed without redoing anything."""

from __future__ import annotations

import json
import re
import sys
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from biomed_lm.errors import ConfigError
from biomed_lm.experiments.ablation import (ABLATION_FILE, StepFailed, Variant, _pretrain_command,  # noqa: E402
                                            load_ablation_config, plan_variants, run_ablation)
from biomed_lm.experiments.ablation_record import load_ablation_record  # noqa: E402
from tests import forked_main  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _config(tmp_path: Path, **changes) -> Path:
    values = {
        "name": "t", "output_dir": str(tmp_path / "out"),
        "corpora": {"sample": "configs/corpus/demo.yaml"},
        "factors": {"vocabulary": ["general", "in-domain"], "masking": ["token", "whole-word"]},
        "pretrain": {"config": "configs/pretrain/demo.yaml", "max_steps": 2, "micro_batch_size": 8},
        "finetune": {"datasets": ["ncbi-disease"], "learning_rates": [1e-3], "batch_sizes": [8]},
    }
    values.update(changes)
    path = tmp_path / "ablation.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


def test_variants_cover_the_grid_and_leave_out_impossible_combinations():
    factors = {"vocabulary": ["general", "in-domain"], "masking": ["whole-word"],
               "initialization": ["scratch", "continual", "continual-new-vocab"], "adversarial": ["off"],
               "mask_schedule": ["constant"], "link": ["off"], "corpus": ["c"]}
    variants, notes = plan_variants(factors)
    names = {v.name for v in variants}
    assert names == {"general_scratch", "in-domain_scratch", "general_continual", "in-domain_continual-new-vocab"}
    assert len(notes) == 2 and any("in-domain_continual:" in n for n in notes)
    assert all(set(v.factors) == set(factors) for v in variants)


def test_config_errors_name_the_file_and_key(tmp_path):
    for changes, message in ((dict(factors={"vocabulary": ["general", "medical"]}), "factors.vocabulary"),
                             (dict(factors={"color": ["red"]}), "unknown factor"),
                             (dict(bogus=1), "unknown key"),
                             (dict(pretrain={"max_step": 3}), "under pretrain"),
                             (dict(finetune={"datasets": ["nope"]}), "finetune"),
                             (dict(finetune={"learning_rate": 1e-3}), "finetune"),
                             (dict(finetune={"model": "x"}), "finetune.model"),
                             (dict(pretrain_seeds=0), "pretrain_seeds"),
                             (dict(pretrain_seeds="two"), "pretrain_seeds"),
                             (dict(analysis={"specification": "groups"}), "analysis.specification"),
                             (dict(analysis={"spec": "checkpoints"}), "analysis")):
        with pytest.raises(ConfigError, match=message) as err:
            load_ablation_config(_config(tmp_path, **changes))
        assert "ablation.yaml" in str(err.value)


@pytest.mark.parametrize("changes, message", [
    (dict(parallel_jobs="two"), r"ablation\.yaml: parallel_jobs: 'two' is not an integer"),
    (dict(parallel_jobs=1.7), r"ablation\.yaml: parallel_jobs: 1\.7 is not an integer"),  # was truncated to 1
    (dict(parallel_jobs=0), r"ablation\.yaml: parallel_jobs: 0 is out of range"),
    (dict(num_proc="lots"), r"ablation\.yaml: num_proc: 'lots' is not an integer"),
    (dict(vocab={"vocab_size": "big"}), r"ablation\.yaml: vocab\.vocab_size: 'big' is not an integer"),
    (dict(corpora={"sample": "configs/corpus/nope.yaml"}),
     r"ablation\.yaml: corpora\.sample: no such file: configs/corpus/nope\.yaml"),
    (dict(vocab={"config": "configs/vocab/nope.yaml"}), r"ablation\.yaml: vocab\.config: no such file"),
    (dict(pretrain={"data_config": "nope.yaml"}), r"ablation\.yaml: pretrain\.data_config: no such file"),
    (dict(finetune=["ncbi-disease"]), r"ablation\.yaml: 'finetune' must be a mapping"),
])
def test_config_values_and_files_are_checked_before_any_step(tmp_path, capsys, changes, message):
    """Each of these once passed the config checks (or raised a traceback) and failed in a step."""
    from biomed_lm.launch import ablate

    path = _config(tmp_path, **changes)
    with pytest.raises(ConfigError, match=message):
        load_ablation_config(path)
    assert ablate.main(["--config", str(path)]) == 2  # before any step: nothing written
    assert "Traceback" not in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("step_yaml, changes, message", [
    (None, dict(pretrain={"config": "configs/pretrain/demo.yaml", "max_steps": 2, "micro_batch_size": 8,
                          "model": "bert-teeny"}), r"pretrain\.model: model 'bert-teeny': no such preset"),
    ({"learning_rate": "fast"}, {}, r"pretrain phase 1 of .*: config .*pretrain\.yaml: .*learning_rate"),
    ({"max_seq_lenght": 64}, {}, r"pretrain phase 1: data_config .*data\.yaml: .*max_seq_lenght"),
])
def test_the_steps_options_are_checked_before_any_step(tmp_path, capsys, step_yaml, changes, message):
    """QA: a misspelled key or a bad value in the pretraining or data YAML, or an unknown model preset,
    stopped the ablation at its step, after the corpus, vocabularies and instances were built."""
    from biomed_lm.launch import ablate

    pretrain = {"config": "configs/pretrain/demo.yaml", "max_steps": 2, "micro_batch_size": 8}
    if step_yaml is not None:
        kind = "data" if "max_seq_lenght" in step_yaml else "pretrain"
        base = yaml.safe_load((REPO / "configs" / kind / "demo.yaml").read_text(encoding="utf-8"))
        (tmp_path / f"{kind}.yaml").write_text(yaml.safe_dump({**base, **step_yaml}), encoding="utf-8")
        pretrain["data_config" if kind == "data" else "config"] = str(tmp_path / f"{kind}.yaml")
    path = _config(tmp_path, **{"pretrain": pretrain, **changes})
    assert ablate.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_an_unknown_finetune_key_is_named_with_the_valid_keys(tmp_path):
    finetune = {"datasets": ["ncbi-disease"], "learning_rates": [1e-3], "batch_sizes": [8], "num_seed": 3}
    with pytest.raises(ConfigError, match=r"ablation\.yaml: unknown key\(s\) under finetune: num_seed "
                                          r"\(did you mean num_seeds\?\); valid: .*\bnum_seeds\b") as err:
        load_ablation_config(_config(tmp_path, finetune=finetune))
    assert "learning_rates" in str(err.value) and "output_dir" not in str(err.value)  # the ablation's own


def test_the_blurb_data_root_can_be_given_on_the_command_line():
    """QA (2026-11-29): an ablation fine-tuned on data/blurb (NCBI-disease alone) unless its YAML was edited."""
    from tests.conftest import REPO

    config = load_ablation_config(REPO / "configs" / "ablation" / "pubmedbert.yaml", data_root="/data/blurb")
    assert config.finetune["data_root"] == "/data/blurb"
    assert load_ablation_config(REPO / "configs" / "ablation" / "pubmedbert.yaml").finetune["data_root"] == \
        "data/blurb"


def test_ablate_help_needs_no_config_and_a_bare_config_flag_is_a_usage_error(capsys):
    from biomed_lm.launch import ablate

    with pytest.raises(SystemExit) as exit_:
        ablate.main(["--help"])
    assert exit_.value.code == 0 and "--output_dir" in capsys.readouterr().out
    assert ablate.main([]) == 2 and "--config configs/ablation/<name>.yaml is required" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # argparse's usage error, not an IndexError
        ablate.main(["--config"])
    assert exit_.value.code == 2 and "expected one argument" in capsys.readouterr().err


def test_yaml_off_on_levels_and_budget(tmp_path):
    config = load_ablation_config(_config(tmp_path, factors={"adversarial": [False, True]},
                                          pretrain={"max_steps": 10, "micro_batch_size": 4, "num_gpus": 2,
                                                    "gradient_accumulation_steps": 3,
                                                    "phase2": {"max_steps": 5, "global_batch_size": 48}}))
    assert config.factors["adversarial"] == ["off", "on"]
    assert config.pretrain.sequences == 10 * 4 * 3 * 2 + 5 * 48


def test_pretrain_commands(tmp_path):
    config = load_ablation_config(_config(tmp_path, pretrain={"max_steps": 10, "num_gpus": 2,
                                                              "phase2": {"max_steps": 5}}))
    factors = {"vocabulary": "general", "masking": "whole-word", "initialization": "continual", "adversarial": "on",
               "mask_schedule": "stepwise", "link": "off", "corpus": "sample"}
    phase1, phase2 = config.pretrain.phases()
    command = _pretrain_command(config, Variant("v", factors), phase1, "tok", Path("d"), Path("o"), None)
    assert command[:3] == ["deepspeed", "--num_gpus", "2"] and command[3].endswith("launch/pretrain.py")
    flags = dict(zip(command[4::2], command[5::2]))
    assert flags["--init"] == "continual" and flags["--init_checkpoint"]
    assert flags["--whole_word_masking"] == "True" and flags["--adversarial"] == "True"
    assert flags["--mask_schedule"] == "stepwise" and flags["--max_steps"] == "10" and "--model" not in flags
    assert flags["--schedule_total_steps"] == "15"  # one schedule across both phases (the paper's recipe)
    command = _pretrain_command(config, Variant("v", factors), phase2, "tok", Path("d2"), Path("o2"), Path("p1"))
    flags = dict(zip(command[4::2], command[5::2]))
    # phase 2 continues phase 1's run (weights, optimizer, step, schedule) up to step 10 + 5
    assert flags["--continue_from"] == "p1" and flags["--max_steps"] == "15"
    assert flags["--schedule_total_steps"] == "15" and flags["--init"] == "continual"
    assert "--seed" not in command  # run 1 keeps the phase's own seed (and its resumable command)
    command = _pretrain_command(config, Variant("v", factors), phase1, "tok", Path("d"), Path("o"), None, run=3)
    assert command[-2:] == ["--seed", "44"]  # configs/pretrain/demo.yaml's seed (42 by default) + 2


def test_link_factor_builds_drp_instances_for_its_variants(tmp_path, monkeypatch):
    """Paper 000's Link function as a factor: link-on variants train on DRP instances of their own."""
    from biomed_lm.experiments import ablation

    config = load_ablation_config(_config(tmp_path, factors={"vocabulary": ["in-domain"], "link": ["off", "on"]}))
    variants, _ = plan_variants(config.factors)
    assert [v.name for v in variants] == ["link-off", "link-on"]
    commands = []
    monkeypatch.setattr(ablation, "_run",
                        lambda title, command, log, env=None, refused_hint="": commands.append(command))
    paths = ablation._Paths(tmp_path / "out")
    ablation._create_instances(config, variants, {("in-domain", "sample"): "tok"}, config.pretrain.phases(), paths,
                               print)
    assert len(commands) == 2
    plain, linked = sorted(commands, key=lambda c: "--pair_task" in c)
    assert "--pair_task" not in plain and linked[linked.index("--pair_task") + 1] == "drp"
    assert linked[linked.index("--output-dir") + 1].endswith("data/in-domain-sample-links")
    pretrain = ablation._pretrain_command(config, variants[1], config.pretrain.phases()[0], "tok",
                                          paths.data(*variants[1].data_key[:2], 1, variants[1].data_key[2]),
                                          Path("o"), None)
    assert pretrain[pretrain.index("--data_dir") + 1].endswith("in-domain-sample-links")


def _learnable_ncbi(root: Path) -> None:
    """NCBI-disease's layout with sentences a 2-step BERT-tiny can learn to tag in two epochs, so
    that the scores vary and the multilevel analysis has something to fit."""
    import random

    rng = random.Random(0)
    diseases = [["cancer"], ["asthma"], ["diabetes"], ["breast", "cancer"], ["colorectal", "cancer"], ["ataxia"]]
    frames = [("Patients", "with"), ("Risk", "of"), ("Treatment", "for"), ("Genes", "in")]
    # Half the test sentences name diseases and contexts training never showed: how a model tags
    # them depends on its pretraining and seed, so the scores are not all 100.
    unseen = [["lupus"], ["glioma"], ["sepsis"], ["psoriasis"], ["renal", "failure"]]
    unseen_frames = [("Mutations", "near"), ("Deaths", "from"), ("Cases", "like")]
    out = root / "NCBI-disease"
    out.mkdir(parents=True)
    for name, count in (("train.tsv", 64), ("devel.tsv", 16), ("test.tsv", 16)):
        sentences = []
        for index in range(count):
            held_out = name == "test.tsv" and index % 2 == 1
            first, second = rng.choice(unseen_frames if held_out else frames)
            disease = rng.choice(unseen if held_out else diseases)
            tags = ["B-Disease"] + ["I-Disease"] * (len(disease) - 1)
            rows = [(first, "O"), (second, "O"), *zip(disease, tags), ("was", "O"), ("studied", "O"), (".", "O")]
            sentences.append("\n".join(f"{w}\t{t}" for w, t in rows))
        (out / name).write_text("\n\n".join(sentences) + "\n", encoding="utf-8")


@pytest.fixture
def forked_steps(monkeypatch):
    """The ablation's steps (entry scripts) forked from this process, not started afresh: the same
    scripts and exit statuses without an interpreter's start-up each (tests/forked_main.py)."""
    forked_main.fork_ablation_steps(monkeypatch.setattr)


def test_vocabulary_ablation_end_to_end_and_resumed(tmp_path, capfd, forked_steps):
    """Two vocabularies (whole-word masking), each pretrained twice: 2 variants × 2 pretraining runs."""
    data_root = tmp_path / "blurb"
    _learnable_ncbi(data_root)
    path = _config(tmp_path, vocab={"vocab_size": 2000}, pretrain_seeds=2,
                   factors={"vocabulary": ["general", "in-domain"], "masking": ["whole-word"]},
                   finetune={"data_root": str(data_root), "datasets": ["ncbi-disease"], "learning_rates": [3e-3],
                             "batch_sizes": [8], "epochs": 2, "num_seeds": 2, "max_length": 32})
    config = load_ablation_config(path)
    log: list[str] = []
    record = run_ablation(config, log=log.append)
    out = Path(config.output_dir)
    assert set(record.variants) == {"general", "in-domain"} and record.failed == []
    assert record.budget["sequences"] == 2 * 8
    assert load_ablation_record(out / ABLATION_FILE) == record  # the one schema, written and read back
    for variant in record.variants.values():
        assert [c.run for c in variant.checkpoints] == [1, 2]
        losses = []
        for checkpoint in variant.checkpoints:
            assert (Path(checkpoint.model) / "config.json").is_file()
            lines = (Path(checkpoint.pretrain_dir) / "metrics.jsonl").read_text().splitlines()
            assert [json.loads(line)["step"] for line in lines] == [1, 2]
            losses.append(json.loads(lines[0])["loss"])
            assert len(sorted(Path(checkpoint.finetune_dir).rglob("run.json"))) == 2
        assert losses[0] != losses[1]  # two pretraining runs with different seeds
    # the in-domain vocabulary is built once and shared by both runs; each vocabulary has one set of instances
    assert [p.name for p in (out / "vocab").iterdir()] == ["in-domain-sample"]
    assert sum(line.startswith("\n=== build the in-domain vocabulary") for line in log) == 1
    assert sorted(p.name for p in (out / "data").iterdir()) == ["general-sample", "in-domain-sample"]
    report = out / "report"
    text = (report / "report.md").read_text()
    assert "in-domain" in text and (report / "results.csv").is_file()
    assert (report / "plots" / "pretraining_loss.png").is_file()
    analysis = json.loads((report / "analysis.json").read_text())
    # 2 variants × 2 pretraining runs × 2 seeds; the checkpoint model: one group per pretraining run
    assert analysis["n_runs"] == 8 and analysis["specification"] == "checkpoints"
    assert analysis["n_checkpoints"] == 4 and analysis["factor_tests"] is True
    factor_rows = [c for c in analysis["coefficients"] if c["term"].startswith("vocabulary[")]
    # t tests on 4 pretraining runs less 2 checkpoint-level parameters; 8 runs less 2 when REML puts
    # the checkpoints' variance at zero (the level then pools with the runs)
    pooled = any("estimated at zero" in note for note in analysis["notes"])
    assert [c["df"] for c in factor_rows] == [6.0 if pooled else 2.0]
    runs = pd.read_csv(report / "runs.csv")
    assert sorted(runs["checkpoint"].unique()) == [1, 2] and len(runs) == 8

    log.clear()
    capfd.readouterr()
    again = run_ablation(config, log=log.append, report=False)
    assert again.variants == record.variants
    started = [line.split("\n")[1] for line in log if line.startswith("\n=== ")]
    # the shared steps run and find their outputs complete (their own check: a changed config is refused
    # there); pretraining and the sweeps are skipped by their done-files
    assert started == ["=== prepare corpus sample", "=== build the in-domain vocabulary of sample",
                       "=== pretraining instances (general vocabulary, sample, phase 1)",
                       "=== pretraining instances (in-domain vocabulary, sample, phase 1)"]
    assert capfd.readouterr().err.count(": already complete: ") == 4
    assert sum("pretraining phase 1 already complete" in line for line in log) == 4
    assert sum("sweep already complete" in line for line in log) == 4
    assert load_ablation_record(out / ABLATION_FILE).name == "t"

    # Another vocabulary size: the shared vocabulary step refuses it, naming the change (it was skipped for
    # existing, and the variants pretrained on the old vocabulary)
    resized = yaml.safe_load(path.read_text())
    resized["vocab"]["vocab_size"] = 2100
    path.write_text(yaml.safe_dump(resized), encoding="utf-8")
    capfd.readouterr()
    with pytest.raises(StepFailed, match=r"build the in-domain vocabulary of sample' failed with exit status 2.*\n.*"
                                         r"differences from what .*in-domain-sample holds, an earlier config of "
                                         r"this ablation built it"):
        run_ablation(load_ablation_config(path), log=log.append, report=False)
    assert "vocab_size: 2000 in the finished vocabulary, 2100 now" in capfd.readouterr().err
    resized["vocab"]["vocab_size"] = 2000
    path.write_text(yaml.safe_dump(resized), encoding="utf-8")

    # The same ablation with a longer pretraining budget: refused before anything is written (QA: ablation.json
    # took the new budget, then the first resumed run refused it, and the report showed both).
    recorded = (out / ABLATION_FILE).read_text()
    longer = yaml.safe_load(path.read_text())
    longer["pretrain"]["max_steps"] = 3
    path.write_text(yaml.safe_dump(longer), encoding="utf-8")
    log.clear()
    with pytest.raises(ConfigError, match=r"ablation\.json: this ablation's pretraining began with another budget "
                                          r"\(budget\.phases\[0\]\.max_steps: 2 then, 3 now; budget\.sequences: 16 "
                                          r"then, 24 now; budget\.steps: 2 then, 3 now\).*use another output_dir"):
        run_ablation(load_ablation_config(path), log=log.append, report=False)
    assert (out / ABLATION_FILE).read_text() == recorded and log == []


def test_the_earlier_config_hint_follows_a_refusal_only_where_the_output_held_something(tmp_path):
    """QA: a shared step that failed on a missing input in a fresh folder was told its output came from an
    earlier config of the ablation."""
    import sys

    from biomed_lm.experiments.ablation import _run_shared

    refuses = [sys.executable, "-c", "import sys; sys.exit(2)"]
    with pytest.raises(StepFailed) as fresh:
        _run_shared("prepare corpus pubmed", refuses, tmp_path / "corpus", log=lambda line: None)
    assert "earlier config" not in str(fresh.value)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "summary.json").write_text("{}")
    with pytest.raises(StepFailed, match=r"an earlier config of this ablation built it"):
        _run_shared("prepare corpus pubmed", refuses, tmp_path / "corpus", log=lambda line: None)


def test_two_phases_continue_one_schedule(tmp_path, forked_steps):
    """Phase 2 continues phase 1's run: its step count goes on from phase 1's last step, and its
    learning rate follows the one schedule across both phases (no second warm-up)."""
    data_root = tmp_path / "blurb"
    _learnable_ncbi(data_root)
    path = _config(tmp_path, factors={"vocabulary": ["general"], "masking": ["whole-word"]},
                   pretrain={"config": "configs/pretrain/demo.yaml", "max_steps": 3, "micro_batch_size": 8,
                             "phase2": {"config": "configs/pretrain/demo.yaml", "max_steps": 2,
                                        "micro_batch_size": 4}},
                   finetune={"data_root": str(data_root), "datasets": ["ncbi-disease"], "learning_rates": [3e-3],
                             "batch_sizes": [8], "epochs": 1, "num_seeds": 1, "max_length": 32})
    config = load_ablation_config(path)
    record = run_ablation(config, log=lambda line: None, report=False)
    variant = record.variants["baseline"]
    out = Path(config.output_dir) / "variants" / "baseline"
    phase1 = [json.loads(line) for line in (out / "pretrain" / "metrics.jsonl").read_text().splitlines()]
    phase2 = [json.loads(line) for line in (out / "pretrain_phase2" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in phase1] == [1, 2, 3] and [r["step"] for r in phase2] == [4, 5]
    lrs = [r["lr"] for r in phase1 + phase2]
    peak = max(lrs)
    assert lrs.index(peak) < 3 and all(a >= b for a, b in zip(lrs[lrs.index(peak):], lrs[lrs.index(peak) + 1:]))
    assert (Path(variant.model) / "config.json").is_file() and not record.failed


def test_a_sweep_counts_as_finished_only_with_every_dataset_present_and_complete(tmp_path):
    """Its done-file lets a resumed ablation skip a sweep; a dataset absent today (or a sweep cut
    short) must run when the ablation is resumed, so those never count as finished."""
    from biomed_lm.experiments.ablation import _sweep_finished

    def summary(**values) -> Path:
        out = tmp_path / str(len(list(tmp_path.iterdir())))
        out.mkdir()
        (out / "summary.json").write_text(json.dumps({"datasets": {"ncbi-disease": {}}, "absent": {}, **values}))
        return out

    assert not _sweep_finished(tmp_path / "never-run")
    assert _sweep_finished(summary())
    assert not _sweep_finished(summary(absent={"bc5cdr-chem": "no such directory"}))
    assert not _sweep_finished(summary(datasets={"ncbi-disease": {"incomplete": "1 of 2 runs complete"}}))


def test_a_sweep_that_finished_keeps_its_done_file_when_a_later_one_is_interrupted(monkeypatch):
    """QA: Ctrl-C during the second variant's sweep left the first's finished sweep without
    finetune_done.json (done-files were written after every sweep had returned), so a resume relaunched
    it. ``succeeded`` is now called as each job exits 0."""
    from biomed_lm.experiments import ablation

    finished: list[int] = []

    def run_step(title, command, log, env=None, refused_hint=""):
        if title == "second":
            raise KeyboardInterrupt
    monkeypatch.setattr(ablation, "_run", run_step)
    with pytest.raises(KeyboardInterrupt):
        ablation._run_parallel([("first", ["a"]), ("second", ["b"])], 1, lambda m: None, succeeded=finished.append)
    assert finished == [0]

    # In parallel: each job's exit is seen as it happens; a failure is reported and not marked.
    jobs = [("ok", [sys.executable, "-c", "pass"]), ("bad", [sys.executable, "-c", "raise SystemExit(3)"]),
            ("ok too", [sys.executable, "-c", "pass"])]
    finished.clear()
    messages: list[str] = []
    failed = ablation._run_parallel(jobs, 2, messages.append, succeeded=finished.append)
    assert failed == ["bad"] and sorted(finished) == [0, 2]
    assert "bad failed with exit status 3" in messages


def test_sweeps_in_parallel_get_gpus_of_their_own(monkeypatch):
    """QA (2026-11-29): parallel_jobs 8 started every variant's sweep on cuda:0 of an 8-GPU node."""
    from biomed_lm.experiments import ablation
    from biomed_lm.finetune import sweep_pool

    messages: list[str] = []
    monkeypatch.setattr(sweep_pool, "visible_gpus", lambda: None)  # a CPU machine: no GPU to divide
    assert ablation._gpu_slots(3, 1, messages.append) == [None, None, None]
    monkeypatch.setattr(sweep_pool, "visible_gpus", lambda: [str(i) for i in range(8)])
    assert ablation._gpu_slots(8, 1, messages.append) == [str(i) for i in range(8)]
    assert ablation._gpu_slots(3, 2, messages.append) == ["0,1", "2,3", "4,5"] and not messages
    assert ablation._gpu_slots(8, 4, messages.append) == ["0,1,2,3", "4,5,6,7"]
    assert messages == ["parallel_jobs 8 x parallel_runs 4 needs 32 GPUs and 8 are visible: 2 sweep(s) at a time"]
    seen = []

    def start(command, env):  # a job that ends at once, seeing the GPUs it was given
        import subprocess

        seen.append(env.get("CUDA_VISIBLE_DEVICES"))
        return subprocess.Popen([sys.executable, "-c", "pass"])
    monkeypatch.setattr(ablation, "start_step_process", start)
    jobs = [(f"sweep {i}", ["x"]) for i in range(3)]
    assert ablation._run_parallel(jobs, 8, messages.append, gpus_per_job=4) == []
    assert seen[:2] == ["0,1,2,3", "4,5,6,7"] and seen[2] in seen[:2]  # the third on the half that was freed
