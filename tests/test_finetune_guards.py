"""Fine-tuning refuses a checkpoint it cannot fine-tune correctly, before it trains or scores anything
(issue 11 item 6), and generic datasets take their label set from the training file.

Each refusal here used to be a silent run: a directory without tokenizer files got a 5-token
tokenizer and a BLURB table; a vocabulary of another size trained (or was silently resized to).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from biomed_lm.errors import ConfigError, InputError
from biomed_lm.finetune.datasets import DatasetFormatError, load_generic_dataset  # noqa: E402
from biomed_lm.finetune.model_check import check_model, resolve_model_dir  # noqa: E402
from biomed_lm.finetune.trainer import FinetuneArgs, run_finetune  # noqa: E402
from tests import forked_main  # noqa: E402
from tests.conftest import REPO, ncbi_slice  # noqa: E402


@pytest.fixture
def model_copy(tiny_bert, tmp_path) -> Path:
    """A private copy of the tiny checkpoint, to damage."""
    return Path(shutil.copytree(tiny_bert, tmp_path / "model"))


def _replace_tokenizer(model_dir: Path, vocabulary: list[str]) -> None:
    from transformers import BertTokenizer

    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        (model_dir / name).unlink(missing_ok=True)
    vocab_file = model_dir.parent / "vocab.txt"
    vocab_file.write_text("\n".join(vocabulary) + "\n", encoding="utf-8")
    BertTokenizer(str(vocab_file)).save_pretrained(model_dir)


def _vocabulary(tiny_bert: Path) -> list[str]:
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(tiny_bert).get_vocab()
    return sorted(vocab, key=vocab.get)


# ----------------------------------------------------------------------------- check_model

def test_the_tiny_checkpoint_passes(tiny_bert):
    checked = check_model(tiny_bert)
    assert checked.directory == tiny_bert
    assert checked.tokenizer_size == checked.embedding_rows == 30522
    assert checked.resize_to is None and checked.notes == []


def test_missing_tokenizer_files_are_refused(model_copy):
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        (model_copy / name).unlink(missing_ok=True)
    with pytest.raises(InputError, match=r"model: no tokenizer files .*vocab\.txt"):
        check_model(model_copy)


@pytest.mark.parametrize("size", [1000, 30600])
def test_a_vocabulary_of_another_size_is_refused(model_copy, tiny_bert, size):
    vocabulary = _vocabulary(tiny_bert)
    vocabulary = vocabulary[:size] if size < len(vocabulary) else \
        vocabulary + [f"extra{i}" for i in range(size - len(vocabulary))]
    _replace_tokenizer(model_copy, vocabulary)
    with pytest.raises(InputError, match=rf"tokenizer has {size} tokens but the model's embeddings have 30522 rows"):
        check_model(model_copy)
    checked = check_model(model_copy, resize_embeddings=True)
    assert checked.resize_to == size
    assert "resized from 30522" in checked.notes[0]


def test_padded_rows_are_accepted_when_the_config_is_a_rounded_size(tmp_path, tiny_bert):
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    padded = -(-len(tokenizer) // 64) * 64  # 30,528, MosaicBERT's padded BERT vocabulary
    torch.manual_seed(0)
    config = BertConfig(vocab_size=padded, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64)
    BertModel(config).save_pretrained(tmp_path / "padded")
    tokenizer.save_pretrained(tmp_path / "padded")
    checked = check_model(tmp_path / "padded")
    assert checked.resize_to is None
    assert checked.notes == [f"embeddings padded: {padded} rows for 30522 tokens (the extra rows are never used)"]
    _replace_tokenizer(tmp_path / "padded", _vocabulary(tiny_bert)[:30400])  # 30,528 is not 30,400 rounded up
    with pytest.raises(InputError, match="30400 tokens"):
        check_model(tmp_path / "padded")


def test_a_special_token_missing_from_the_tokenizer_is_refused(model_copy):
    config_path = model_copy / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["sep_token"] = None
    config_path.write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(InputError, match="defines no sep token"):
        check_model(model_copy)


def test_truncated_weights_are_named(model_copy):
    weights = model_copy / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:len(data) // 2])
    with pytest.raises(InputError, match=r"model\.safetensors: truncated \(\d+ bytes, its header needs \d+\)"):
        check_model(model_copy)
    weights.write_bytes(b"\x00\x01garbage")
    with pytest.raises(InputError, match=r"model\.safetensors: not a readable safetensors file"):
        check_model(model_copy)


def test_damaged_torch_weights_and_missing_weights_are_named(model_copy):
    (model_copy / "model.safetensors").unlink()
    with pytest.raises(InputError, match=r"no weights file \(expected one of model\.safetensors"):
        check_model(model_copy)
    (model_copy / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(InputError, match=r"pytorch_model\.bin: cannot be loaded"):
        check_model(model_copy)


def test_config_that_disagrees_with_the_weights_is_refused(model_copy):
    config_path = model_copy / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["vocab_size"] = 28996
    config_path.write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(InputError, match="word_embeddings.weight has 30522 rows but .*config.json says vocab_size "
                                         "28996"):
        check_model(model_copy)
    config_path.write_text("{not json", encoding="utf-8")
    with pytest.raises(InputError, match=r"config\.json: not a readable model configuration"):
        check_model(model_copy)


def test_a_run_directory_resolves_to_its_export_or_names_the_newest_checkpoint(tiny_bert, tmp_path):
    run = tmp_path / "run"
    for step in (5, 40, 200):  # numeric, not lexical, order: step-200 is the newest
        (run / "checkpoints" / f"step-{step}" / "hf").mkdir(parents=True)
    with pytest.raises(InputError, match=r"has not finished .*newest checkpoint export is .*step-200/hf"):
        resolve_model_dir(run)
    shutil.copytree(tiny_bert, run / "model")
    directory, notes = resolve_model_dir(run)
    assert directory == run / "model" and "pretraining run directory" in notes[0]
    with pytest.raises(InputError, match="model checkpoint directory not found"):
        resolve_model_dir(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="is a file"):
        resolve_model_dir(tmp_path / "file")
    with pytest.raises(InputError, match="not a checkpoint directory"):
        resolve_model_dir(run / "checkpoints")
    # QA: a checkpoint's step folder got the bare "not a checkpoint directory", not its hf/ export
    (run / "checkpoints" / "step-200" / "hf" / "config.json").write_text("{}")
    with pytest.raises(InputError, match=r"a pretraining checkpoint; its transformers export is .*step-200/hf: pass"):
        resolve_model_dir(run / "checkpoints" / "step-200")


# ---------------------------------------------------------------------- through fine-tuning

def _args(model: Path, data: Path, out: Path, **overrides) -> FinetuneArgs:
    values = dict(model=str(model), dataset="ncbi-disease", data_dir=str(data), output_dir=str(out),
                  learning_rate=5e-4, batch_size=8, epochs=1, seed=1)
    return FinetuneArgs(**(values | overrides))


def test_resize_embeddings_trains_and_is_recorded(model_copy, tiny_bert, tmp_path):
    _replace_tokenizer(model_copy, _vocabulary(tiny_bert)[:20000])
    data = ncbi_slice(tmp_path, train=16, eval_=8)
    with pytest.raises(InputError, match="20000 tokens"):
        run_finetune(_args(model_copy, data, tmp_path / "refused"), log=lambda m: None)
    assert not (tmp_path / "refused").exists()  # nothing written, and the folder the refused run made is gone
    result = run_finetune(_args(model_copy, data, tmp_path / "ft", resize_embeddings=True), log=lambda m: None)
    check = result.record["model_check"]
    assert check["embedding_rows"] == 30522 and check["tokenizer_size"] == 20000 and check["resized_to"] == 20000
    assert result.record["labels"] == ["O", "B-Disease", "I-Disease"]


def test_a_run_directory_is_fine_tuned_through_its_export(tiny_bert, tmp_path):
    run = tmp_path / "pretrain_run"
    shutil.copytree(tiny_bert, run / "model")
    data = ncbi_slice(tmp_path, train=16, eval_=8)
    result = run_finetune(_args(run, data, tmp_path / "ft"), log=lambda m: None)
    assert result.record["model_check"]["directory"] == str(run / "model")
    # A record written before resize_embeddings existed is still a record of the same settings.
    record = json.loads(result.path.read_text(encoding="utf-8"))
    del record["settings"]["resize_embeddings"]
    result.path.write_text(json.dumps(record), encoding="utf-8")
    assert run_finetune(_args(run, data, tmp_path / "ft"), log=lambda m: None).skipped
    with pytest.raises(InputError, match=r"different settings \(resize_embeddings: False recorded, True now\)"):
        run_finetune(_args(run, data, tmp_path / "ft", resize_embeddings=True), log=lambda m: None)


def test_ner_is_scored_the_conlleval_way_and_older_records_count_as_strict(tiny_bert, tmp_path):
    data = ncbi_slice(tmp_path, train=16, eval_=8)
    result = run_finetune(_args(tiny_bert, data, tmp_path / "ft"), log=lambda m: None)
    assert result.record["test"]["mode"] == "conlleval" and result.record["settings"]["ner_f1_mode"] == "conlleval"
    assert result.record["best_dev"]["mode"] == "conlleval"
    # Records written before the setting existed were scored in strict mode: not today's default.
    record = json.loads(result.path.read_text(encoding="utf-8"))
    del record["settings"]["ner_f1_mode"]
    result.path.write_text(json.dumps(record), encoding="utf-8")
    with pytest.raises(InputError, match=r"different settings \(ner_f1_mode: 'strict' recorded, 'conlleval' now\)"):
        run_finetune(_args(tiny_bert, data, tmp_path / "ft"), log=lambda m: None)
    assert run_finetune(_args(tiny_bert, data, tmp_path / "ft", ner_f1_mode="strict"), log=lambda m: None).skipped
    with pytest.raises(ConfigError, match="^ner_f1_mode: 'lenient' is not one of conlleval, strict$"):
        _args(tiny_bert, data, tmp_path / "bad", ner_f1_mode="lenient")


def test_training_in_batches_of_similar_lengths_is_recorded_and_older_records_count_as_shuffled(tiny_bert, tmp_path):
    data = ncbi_slice(tmp_path, train=16, eval_=8)
    result = run_finetune(_args(tiny_bert, data, tmp_path / "ft"), log=lambda m: None)
    assert result.record["settings"]["group_by_length"] is True
    # Records written before the setting existed were trained in uniformly shuffled batches.
    record = json.loads(result.path.read_text(encoding="utf-8"))
    del record["settings"]["group_by_length"]
    result.path.write_text(json.dumps(record), encoding="utf-8")
    with pytest.raises(InputError, match=r"different settings \(group_by_length: False recorded, True now\)"):
        run_finetune(_args(tiny_bert, data, tmp_path / "ft"), log=lambda m: None)
    assert run_finetune(_args(tiny_bert, data, tmp_path / "ft", group_by_length=False), log=lambda m: None).skipped


def _launch(script: str, *flags: str) -> subprocess.CompletedProcess:
    return forked_main.run_command([sys.executable, str(REPO / "launch" / script), *flags], timeout=600)


def test_blurb_checks_the_model_once_and_exits_2(model_copy, tmp_path):
    data_root = tmp_path / "blurb"
    ncbi_slice(data_root, train=8, eval_=4)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        (model_copy / name).unlink(missing_ok=True)
    done = _launch("blurb.py", "--model", str(model_copy), "--data_root", str(data_root), "--output_dir",
                   str(tmp_path / "out"), "--datasets", "ncbi-disease", "bc5cdr-disease", "--num_seeds", "2",
                   "--learning_rates", "1e-4", "--batch_sizes", "8", "--epochs", "1")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("no tokenizer files") == 1, done.stderr
    assert not list((tmp_path / "out").rglob("run.json")) and not list((tmp_path / "out").rglob("error.txt"))
    done = _launch("blurb.py", "--model", str(tmp_path / "missing"), "--data_root", str(data_root), "--output_dir",
                   str(tmp_path / "out"))
    assert done.returncode == 2 and "model checkpoint directory not found" in done.stderr


# -------------------------------------------------------------------------- generic labels

def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_an_unseen_relation_label_in_dev_names_its_line(tmp_path):
    _write(tmp_path / "re" / "train.tsv", ["a @X$ b @Y$\tcause", "c @X$ d @Y$\tnone"])
    _write(tmp_path / "re" / "dev.tsv", ["e @X$ f @Y$\tnone", "g @X$ h @Y$\tcasue"])
    with pytest.raises(DatasetFormatError, match=r"dev\.tsv.*line 2.*'casue'.*expected one of: cause, none"):
        load_generic_dataset("relation", tmp_path / "re")
    _write(tmp_path / "re" / "dev.tsv", ["e @X$ f @Y$\tnone"])
    assert load_generic_dataset("relation", tmp_path / "re").labels == ("cause", "none")


def test_ner_labels_come_from_the_training_files_entity_types(tmp_path):
    _write(tmp_path / "ner" / "train.tsv", ["aspirin\tB-Chem", "works\tO"])
    _write(tmp_path / "ner" / "test.tsv", ["acetyl\tB-Chem", "salicylic\tI-Chem", "acid\tI-Chem"])
    dataset = load_generic_dataset("ner", tmp_path / "ner")
    assert dataset.labels == ("O", "B-Chem", "I-Chem")  # I-Chem is a spelling of a known type
    _write(tmp_path / "ner" / "test.tsv", ["acetyl\tB-Chem", "fever\tB-Disease"])
    with pytest.raises(DatasetFormatError, match=r"test\.tsv.*line 2.*entity type 'Disease' does not occur in the "
                                                 r"training file"):
        load_generic_dataset("ner", tmp_path / "ner")


def test_fine_tuning_without_a_dev_file_names_the_file_it_looked_for(tmp_path):
    """QA, 2026-11-28: "has no dev examples (in DIR)", while a missing train file named what to create."""
    _write(tmp_path / "re" / "train.tsv", ["a @X$ b @Y$\tcause", "c @X$ d @Y$\tnone"])
    _write(tmp_path / "re" / "test.tsv", ["e @X$ f @Y$\tnone"])
    args = FinetuneArgs(model="unused", dataset="mine", task_type="relation", data_dir=str(tmp_path / "re"),
                        output_dir=str(tmp_path / "out"))
    with pytest.raises(InputError, match=rf"dataset 'mine' has no dev examples: expected {tmp_path / 're'}/dev.jsonl "
                                         r"or .*; fine-tuning keeps the epoch best on dev and reports its test score"):
        run_finetune(args, log=lambda _message: None)


def test_an_unseen_classification_label_is_refused(tmp_path):
    _write(tmp_path / "doc" / "train.jsonl", [json.dumps({"text": "a", "labels": ["x"]}),
                                              json.dumps({"text": "b", "labels": ["y"]})])
    _write(tmp_path / "doc" / "test.jsonl", [json.dumps({"text": "c", "labels": ["x", "z"]})])
    with pytest.raises(DatasetFormatError, match=r"test\.jsonl.*line 1.*'z'"):
        load_generic_dataset("classification", tmp_path / "doc")
