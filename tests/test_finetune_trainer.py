"""The fine-tuning loop end to end on tiny data with a tiny random BERT (CPU, seconds).

The checkpoint is random, so scores are not checked for quality; what is checked is that every
task type flows from examples to a complete run record, that no word is lost to windowing, that
finished runs are skipped, and that bad input is refused with exit status 2.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from biomed_lm.errors import ConfigError, InputError
from biomed_lm.finetune.datasets import TokenTaggingExample  # noqa: E402
from biomed_lm.finetune.trainer import RUN_RECORD, FinetuneArgs, run_finetune, word_windows  # noqa: E402
from tests import forked_main  # noqa: E402
from tests.conftest import ncbi_slice  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECORD_FIELDS = {"model", "dataset", "task_type", "metric", "hyperparameters", "seed", "epochs", "dev_per_epoch",
                 "best_dev_score", "best_epoch", "test", "test_score", "wall_time_s", "memory", "versions", "status"}


def _ncbi_slice(root: Path) -> Path:
    """32 train and 16 dev/test sentences of the committed NCBI-disease files."""
    return ncbi_slice(root)


def _args(model: Path, data: Path, out: Path, **overrides) -> FinetuneArgs:
    values = dict(model=str(model), dataset="ncbi-disease", data_dir=str(data), output_dir=str(out),
                  learning_rate=5e-4, batch_size=8, epochs=2, seed=1)
    values.update(overrides)
    return FinetuneArgs(**values)


def test_word_windows_keep_every_word():
    counts = [1, 3, 2, 5, 1, 1, 9, 2]
    windows = word_windows(counts, budget=6)
    assert [w for start, end in windows for w in range(start, end)] == list(range(len(counts)))
    for start, end in windows:
        assert end - start == 1 or sum(counts[start:end]) <= 6


def test_long_sentence_is_windowed_without_losing_words(tiny_bert):
    from transformers import AutoTokenizer

    from biomed_lm.finetune.adapters.tagging import tagging_features

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    words = ("Germline mutations of the adenomatous polyposis coli gene cause familial adenomatous "
             "polyposis , a hereditary colorectal cancer predisposition syndrome").split()
    example = TokenTaggingExample("s1", words, ["O"] * len(words))
    features = tagging_features([example], tokenizer, 16, lambda e: [0] * len(e.tokens))
    assert len(features) > 1
    assert all(len(f["input_ids"]) <= 16 for f in features)
    assert sum(f["num_words"] for f in features) == len(words)
    assert sum(sum(f["word_mask"]) for f in features) == len(words)
    assert [f["first_word"] for f in features] == sorted(f["first_word"] for f in features)


def test_ner_end_to_end_record_and_skip(tiny_bert, tmp_path, capsys, monkeypatch):
    data = _ncbi_slice(tmp_path)
    out = tmp_path / "run"
    started = time.time()
    result = run_finetune(_args(tiny_bert, data, out, max_length=16), log=lambda m: None)
    elapsed = time.time() - started
    print(f"NER end-to-end wall time: {elapsed:.1f}s")
    assert not result.skipped
    record = json.loads((out / RUN_RECORD).read_text())
    assert RECORD_FIELDS <= set(record)
    assert record["task_type"] == "ner" and record["metric"] == "entity_f1"
    assert [e["epoch"] for e in record["dev_per_epoch"]] == [1, 2]
    assert record["best_dev_score"] == max(e["dev_score"] for e in record["dev_per_epoch"])
    assert 0.0 <= record["test"]["score"] <= 1.0 and record["test"]["n_sequences"] == 16
    assert record["examples"] == {"train": 32, "dev": 16, "test": 16}
    assert record["features"]["train"] > 32  # max_length 16 splits sentences into windows
    assert record["memory"]["peak_rss_bytes"] > 0 and "torch" in record["versions"]

    again = run_finetune(_args(tiny_bert, data, out, max_length=16), log=lambda m: None)
    assert again.skipped and again.record["test"] == record["test"]
    with pytest.raises(InputError, match="different settings"):
        run_finetune(_args(tiny_bert, data, out, max_length=16, seed=2), log=lambda m: None)

    # QA, 2026-11-28: the same model named by a relative path (another working directory) was "different
    # settings (model)"; the same files in another folder are the same data; changed data was skipped and
    # its old score reported.
    monkeypatch.chdir(tiny_bert.parent)
    relative = Path(os.path.relpath(tiny_bert))
    moved = Path(shutil.copytree(data, tmp_path / "moved"))
    (moved / "README.md").write_text("not data\n")
    assert run_finetune(_args(relative, moved, out, max_length=16), log=lambda m: None).skipped
    # QA, 2026-11-29: a pretraining run folder is its model/ export here too (it was "different settings")
    run_folder = tmp_path / "pretrain_run"
    run_folder.mkdir()
    (run_folder / "model").symlink_to(tiny_bert.resolve(), target_is_directory=True)
    assert run_finetune(_args(run_folder, moved, out, max_length=16), log=lambda m: None).skipped
    assert sorted(record["data_files"]) == ["devel.tsv", "test.tsv", "train.tsv"]
    (moved / "train.tsv").write_text((moved / "train.tsv").read_text().replace("\tB-Disease", "\tO", 1))
    with pytest.raises(InputError, match=rf"{out / RUN_RECORD} holds a finished run over other data: train.tsv in "
                                         rf"{moved} differ"):
        run_finetune(_args(tiny_bert, moved, out, max_length=16), log=lambda m: None)


def test_relation_generic_dataset(tiny_bert, tmp_path):
    data = tmp_path / "gadlike"
    data.mkdir()
    rows = [("@GENE$ variants are associated with @DISEASE$ risk .", "1"),
            ("No link between @GENE$ and @DISEASE$ was found .", "0"),
            ("@DISEASE$ patients carry the @GENE$ allele more often .", "1"),
            ("We studied @GENE$ expression ; @DISEASE$ was not related .", "0")]
    for split, n in (("train", 4), ("dev", 4), ("test", 4)):
        (data / f"{split}.tsv").write_text("".join(f"{s}\t{l}\n" for s, l in rows[:n]), encoding="utf-8")
    for representation in ("cls", "entity_start"):
        out = tmp_path / f"re_{representation}"
        result = run_finetune(_args(tiny_bert, data, out, dataset="gadlike", task_type="relation", negative_label="0",
                                    epochs=1, relation_representation=representation), log=lambda m: None)
        assert result.record["task_type"] == "relation" and result.record["metric"] == "micro_f1_positive"
        assert result.record["test"]["n_examples"] == 4


def test_similarity_generic_dataset(tiny_bert, tmp_path):
    data = tmp_path / "simlike"
    data.mkdir()
    pairs = [("The gene is expressed in liver .", "Liver cells express the gene .", 3.5),
             ("Mice were treated with the drug .", "The weather was cold .", 0.0),
             ("Tumours grew quickly .", "Tumour growth was fast .", 4.0),
             ("The protein binds DNA .", "Patients were enrolled .", 0.5)]
    body = "text_a\ttext_b\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in pairs)
    for split in ("train", "dev", "test"):
        (data / f"{split}.tsv").write_text(body, encoding="utf-8")
    result = run_finetune(_args(tiny_bert, data, tmp_path / "sim", dataset="simlike", task_type="similarity",
                                epochs=1), log=lambda m: None)
    assert result.record["metric"] == "pearson" and -1.0 <= result.record["test"]["score"] <= 1.0


def _launch(*flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return forked_main.run_command([sys.executable, str(REPO / "launch" / "finetune.py"), *flags], env=env,
                                   timeout=120)


def test_launch_bad_dataset_name_exits_2(tiny_bert, tmp_path):
    proc = _launch("--config", str(REPO / "configs" / "finetune" / "ncbi_disease.yaml"), "--model", str(tiny_bert),
                   "--dataset", "no-such-dataset", "--output_dir", str(tmp_path / "x"))
    assert proc.returncode == 2, proc.stderr
    assert "no-such-dataset" in proc.stderr and "ncbi-disease" in proc.stderr


def test_deepspeed_run_matches_the_record_of_a_plain_run(tiny_bert, tmp_path):
    """--deepspeed (one CPU rank over gloo, fp32) trains the same model the same way: the engine
    clips at 1.0, steps AdamW and the schedule exactly like the plain loop, so dev and test scores
    and the per-epoch losses agree."""
    from tests.conftest import run_single_rank_deepspeed

    data = _ncbi_slice(tmp_path)
    plain = run_finetune(_args(tiny_bert, data, tmp_path / "plain", max_length=32), log=lambda m: None).record
    script = f"""
import json
from biomed_lm.finetune.trainer import FinetuneArgs, run_finetune
args = FinetuneArgs(model={str(tiny_bert)!r}, dataset="ncbi-disease", data_dir={str(data)!r},
                    output_dir={str(tmp_path / "ds")!r}, learning_rate=5e-4, batch_size=8, epochs=2, seed=1,
                    max_length=32, deepspeed=True)
record = run_finetune(args, log=lambda m: None).record
print("RESULT " + json.dumps({{k: record[k] for k in ("dev_per_epoch", "test_score", "deepspeed", "world_size")}}))
"""
    ds = run_single_rank_deepspeed(script)
    assert ds["deepspeed"] is True and ds["world_size"] == 1
    assert [e["train_loss"] for e in ds["dev_per_epoch"]] == pytest.approx(
        [e["train_loss"] for e in plain["dev_per_epoch"]], rel=1e-4)
    assert ds["test_score"] == pytest.approx(plain["test_score"], abs=1e-6)
    assert json.loads((tmp_path / "ds" / RUN_RECORD).read_text())["status"] == "complete"


def test_mixed_precision_needs_deepspeed(tiny_bert, tmp_path):
    with pytest.raises(ConfigError, match="precision bf16 needs --deepspeed"):
        _args(tiny_bert, tmp_path, tmp_path / "o", precision="bf16")
