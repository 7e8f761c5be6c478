"""Every task type through ``run_finetune`` on tiny data with a tiny random BERT (CPU, seconds).

Complements ``test_finetune_trainer.py`` (NER with BIO + linear head, generic relation with
dummified TSV input, generic similarity): here the other tagging schemes and layers, PICO,
multi-label document classification, QA (and its 512-token default), relation extraction with
entity markers on offset-annotated input, and each BLURB loader of ../shared/data that is present
(``ebm-pico``, ``hoc``, ``pubmedqa``, ``bioasq``, ``ddi``, ``gad``, ``biosses``; skipped cleanly when
absent), each limited to a handful of examples and one epoch.

The checkpoint is random, so scores are checked for range, not quality. What a test checks is
that the run completes with the right metric, that every test example was scored, and (through a
wrapper around ``finetune.trainer._predict``) that the predictions have the task's form.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import biomed_lm.finetune.trainer as trainer  # noqa: E402
from biomed_lm.errors import InputError
from biomed_lm.finetune.datasets import load_blurb_dataset  # noqa: E402
from biomed_lm.finetune.relation_inputs import ENTITY_MARKERS  # noqa: E402
from biomed_lm.finetune.tagging import is_valid_tags, split_tag, tag_labels, validate_tags  # noqa: E402
from biomed_lm.finetune.trainer import QA_MAX_LENGTH, RUN_RECORD, FinetuneArgs, run_finetune  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BLURB = REPO.parent / "shared" / "data" / "blurb"
RECORD_FIELDS = {"status", "model", "dataset", "task_type", "metric", "hyperparameters", "settings", "seed",
                 "epochs", "examples", "features", "input_stats", "dataset_notes", "dev_per_epoch", "best_epoch",
                 "best_dev_score", "best_dev", "test", "test_score", "total_steps", "wall_time_s", "memory",
                 "versions"}


def quiet(_message: str) -> None:
    return None


# ------------------------------------------------------------------------------------ fixtures

@pytest.fixture
def predictions(monkeypatch):
    """Every ``_predict`` call of a run (dev per epoch, then test): its examples, features and
    predictions, recorded as ``{"examples", "features", "predictions"}`` dicts in call order."""
    calls: list[dict] = []
    original = trainer._predict

    def recording(model, task, examples, features, batch_size, device):
        result = original(model, task, examples, features, batch_size, device)
        calls.append({"task": task, "examples": list(examples), "features": list(features), "predictions": result})
        return result

    monkeypatch.setattr(trainer, "_predict", recording)
    return calls


@pytest.fixture
def built_models(monkeypatch):
    """The models ``run_finetune`` builds, in order (to inspect embedding sizes)."""
    models: list = []
    original = trainer._build_model

    def recording(args, task, checked):
        model = original(args, task, checked)
        models.append((model, len(checked.tokenizer)))
        return model

    monkeypatch.setattr(trainer, "_build_model", recording)
    return models


def _args(model: Path, data: Path, out: Path, **overrides) -> FinetuneArgs:
    values = dict(model=str(model), data_dir=str(data), output_dir=str(out), learning_rate=5e-4, batch_size=8,
                  epochs=1, seed=1)
    values.update(overrides)
    return FinetuneArgs(**values)


def _check_record(result, out: Path, task_type: str, metric: str, sizes: dict[str, int]) -> dict:
    """The parts every complete run record shares; returns the record as written to disk."""
    assert not result.skipped and result.path == out / RUN_RECORD
    record = json.loads((out / RUN_RECORD).read_text(encoding="utf-8"))
    assert RECORD_FIELDS <= set(record), RECORD_FIELDS - set(record)
    assert record["status"] == "complete"
    assert record["task_type"] == task_type and record["metric"] == metric
    assert record["test"]["metric"] == metric and record["test_score"] == record["test"]["score"]
    assert record["examples"] == sizes
    assert [e["epoch"] for e in record["dev_per_epoch"]] == [1] and record["best_epoch"] == 1
    assert record["best_dev_score"] == record["dev_per_epoch"][0]["dev_score"] == record["best_dev"]["score"]
    assert record["total_steps"] >= 1 and record["dev_per_epoch"][0]["train_loss"] is not None
    assert record["memory"]["peak_rss_bytes"] > 0 and "torch" in record["versions"]
    return record


def _skip_unless(path: Path) -> Path:
    if not path.is_dir():
        pytest.skip(f"{path} is absent (the shared BLURB data is not here)")
    return path


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _jsonl(path: Path, rows: list[dict]) -> None:
    _write(path, "".join(json.dumps(row) + "\n" for row in rows))


# ------------------------------------------------------------------------------------ NER

NER_SENTENCES = [
    [("Aspirin", "B-Chemical"), ("reduces", "O"), ("the", "O"), ("risk", "O"), ("of", "O"),
     ("colorectal", "B-Disease"), ("cancer", "I-Disease"), (".", "O")],
    [("Patients", "O"), ("with", "O"), ("type", "B-Disease"), ("2", "I-Disease"), ("diabetes", "I-Disease"),
     ("received", "O"), ("metformin", "B-Chemical"), (".", "O")],
    [("Cisplatin", "B-Chemical"), ("nephrotoxicity", "B-Disease"), ("was", "O"), ("observed", "O"), (".", "O")],
    [("No", "O"), ("adverse", "O"), ("events", "O"), ("were", "O"), ("reported", "O"), (".", "O")],
    [("Familial", "B-Disease"), ("adenomatous", "I-Disease"), ("polyposis", "I-Disease"), ("and", "O"),
     ("hereditary", "B-Disease"), ("nonpolyposis", "I-Disease"), ("colorectal", "I-Disease"),
     ("cancer", "I-Disease"), ("are", "O"), ("inherited", "O"), ("syndromes", "O"), ("treated", "O"),
     ("with", "O"), ("celecoxib", "B-Chemical"), ("or", "O"), ("sulindac", "B-Chemical"), (".", "O")],
    [("Lithium", "B-Chemical"), ("toxicity", "O"), ("causes", "O"), ("tremor", "B-Disease"), (".", "O")],
]


@pytest.fixture
def ner_data(tmp_path) -> Path:
    """A generic NER dataset with two entity types, multi-word and one-word entities, and one long
    sentence that max_length 16 cuts into several windows."""
    data = tmp_path / "ner"
    body = "\n\n".join("\n".join(f"{w}\t{t}" for w, t in s) for s in NER_SENTENCES) + "\n"
    for split in ("train", "dev", "test"):
        _write(data / f"{split}.tsv", body)
    return data


def test_an_option_of_another_task_family_is_warned_about(tiny_bert, ner_data, tmp_path):
    """QA: --relation_representation entity_start on an NER dataset was ignored without a word."""
    said = []
    run_finetune(_args(tiny_bert, ner_data, tmp_path / "run", dataset="ner2", task_type="ner", max_length=16,
                       relation_representation="entity_start"), log=said.append)
    assert [line for line in said if "no effect" in line] == [
        "warning: relation_representation entity_start has no effect on ner2 (ner); it applies to relation datasets"]


@pytest.mark.parametrize("scheme, layer", [("bioul", "crf"), ("io", "bilstm"), ("io", "crf")])
def test_ner_schemes_and_layers(tiny_bert, ner_data, tmp_path, predictions, scheme, layer):
    out = tmp_path / "run"
    n = len(NER_SENTENCES)
    result = run_finetune(_args(tiny_bert, ner_data, out, dataset="ner2", task_type="ner", max_length=16,
                                batch_size=4, tagging_scheme=scheme, tagging_layer=layer), log=quiet)
    record = _check_record(result, out, "ner", "entity_f1", {"train": n, "dev": n, "test": n})
    assert record["hyperparameters"]["tagging_scheme"] == scheme
    assert record["hyperparameters"]["tagging_layer"] == layer
    assert "relation_representation" not in record["hyperparameters"]
    assert record["hyperparameters"]["max_length"] == 16
    assert record["features"]["test"] > n  # the long sentence is windowed
    test = record["test"]
    assert 0.0 <= test["score"] <= 1.0 and test["n_sequences"] == n
    assert test["scheme"] == scheme and test["mode"] == "conlleval"  # the field's reading, the default

    # The model's labels are the scheme's tags, and the test predictions are well-formed.
    call = predictions[-1]
    assert call["task"].labels == tuple(tag_labels(["Chemical", "Disease"], scheme))
    alphabet = set(call["task"].labels)
    predicted = call["predictions"]
    assert len(predicted) == n
    for sentence, tags in zip(NER_SENTENCES, predicted):
        assert len(tags) == len(sentence)  # every word predicted once, across windows
        assert set(tags) <= alphabet
        for tag in tags:
            prefix, _ = split_tag(tag)
            assert prefix in ({"O", "B", "I", "L", "U"} if scheme == "bioul" else {"O", "I"})
    invalid = sum(not is_valid_tags(tags, scheme) for tags in predicted)
    assert test["n_invalid_pred_sequences"] == invalid
    if scheme == "io":  # IO has no ill-formed sequences
        assert invalid == 0
    # Gold went to the metric converted to the scheme (validate_tags would refuse BIO gold in BIOUL);
    # an IO run's gold is the file's own entities in BIO, which IO could merge.
    trainer_gold = trainer._gold(call["task"], call["examples"])
    gold_scheme = "bio" if scheme == "io" else scheme
    assert test.get("gold_scheme", scheme) == gold_scheme
    assert call["task"].metric_kwargs().get("gold_scheme", scheme) == gold_scheme
    for tags in trainer_gold:
        validate_tags(tags, gold_scheme)
    if scheme == "bioul":
        assert "U-Chemical" in trainer_gold[0] and "L-Disease" in trainer_gold[0]


@pytest.mark.parametrize("spelling", ["bioes", "bioul"])
def test_ner_file_in_bioes_or_bioul_is_read_in_its_own_scheme(tiny_bert, tmp_path, predictions, spelling):
    """A generic NER file may be written in BIOES (S-/E-) or BIOUL (U-/L-): its entities are the
    same as the BIO file's, whatever scheme the model is trained in."""
    from biomed_lm.finetune.tagging import convert_tags

    single, last = ("S", "E") if spelling == "bioes" else ("U", "L")
    data = tmp_path / spelling
    sentences = []
    for sentence in NER_SENTENCES:
        tags = convert_tags([t for _, t in sentence], "bio", "bioul")
        tags = [t.replace("U-", f"{single}-", 1).replace("L-", f"{last}-", 1) for t in tags]
        sentences.append("\n".join(f"{w}\t{t}" for (w, _), t in zip(sentence, tags)))
    for split in ("train", "dev", "test"):
        _write(data / f"{split}.tsv", "\n\n".join(sentences) + "\n")
    out = tmp_path / "run"
    result = run_finetune(_args(tiny_bert, data, out, dataset="ner-" + spelling, task_type="ner", max_length=32,
                                batch_size=4), log=quiet)
    n = len(NER_SENTENCES)
    _check_record(result, out, "ner", "entity_f1", {"train": n, "dev": n, "test": n})
    gold = trainer._gold(predictions[-1]["task"], predictions[-1]["examples"])
    assert gold == [[t for _, t in sentence] for sentence in NER_SENTENCES]  # the BIO entities exactly


# ------------------------------------------------------------------------------------ PICO

PICO_DOCS = {
    "1001": [
        [("Forty", "I-PAR"), ("adults", "I-PAR"), ("with", "I-PAR"), ("asthma", "I-PAR"), ("received", "O"),
         ("inhaled", "I-INT"), ("budesonide", "I-INT"), (".", "O")],
        [("Lung", "I-OUT"), ("function", "I-OUT"), ("improved", "O"), (".", "O")],
    ],
    "1002": [
        [("Children", "I-PAR"), ("were", "O"), ("given", "O"), ("zinc", "I-INT|I-PAR"),
         ("supplements", "I-INT"), (".", "O")],
        [("Diarrhoea", "I-OUT"), ("duration", "I-OUT"), ("and", "O"), ("mortality", "I-OUT"), ("fell", "O"),
         (".", "O")],
    ],
    "1003": [
        [("Placebo", "I-INT"), ("was", "O"), ("compared", "O"), ("with", "O"), ("exercise", "I-INT"), ("in", "O"),
         ("elderly", "I-PAR"), ("women", "I-PAR"), (";", "O"), ("falls", "I-OUT"), ("were", "O"),
         ("counted", "O"), (".", "O")],
    ],
}


@pytest.fixture
def pico_data(tmp_path) -> Path:
    data = tmp_path / "pico"
    parts = []
    for pmid, segments in PICO_DOCS.items():
        parts.append(f"-DOCSTART- ({pmid})\n\n" + "\n\n".join("\n".join(f"{w}\t{t}" for w, t in seg)
                                                              for seg in segments) + "\n")
    body = "\n".join(parts)
    for split in ("train", "dev", "test"):
        _write(data / f"{split}.tsv", body)
    return data


def test_pico_generic_dataset(tiny_bert, pico_data, tmp_path, predictions):
    out = tmp_path / "run"
    segments = [seg for segs in PICO_DOCS.values() for seg in segs]
    n = len(segments)
    result = run_finetune(_args(tiny_bert, pico_data, out, dataset="pico-mini", task_type="pico", batch_size=4,
                                max_length=10, tagging_layer="bilstm"), log=quiet)
    record = _check_record(result, out, "pico", "pico_token_macro_f1", {"train": n, "dev": n, "test": n})
    assert record["features"]["test"] > n  # max_length 10 windows the longer segments
    test = record["test"]
    assert 0.0 <= test["score"] <= 1.0
    assert test["n_tokens"] == sum(len(seg) for seg in segments)
    assert sorted(test["elements"]) == ["INT", "OUT", "PAR"] and set(test["per_element"]) == {"INT", "OUT", "PAR"}
    assert sum(test["per_element"][e]["n_gold"] for e in test["elements"]) == \
        sum(len(t.split("|")) for seg in segments for _, t in seg if t != "O")
    call = predictions[-1]
    assert [e.id for e in call["examples"]] == ["1001-0", "1001-1", "1002-0", "1002-1", "1003-0"]
    assert [len(p) for p in call["predictions"]] == [len(seg) for seg in segments]
    assert all(isinstance(word, set) and word <= {"PAR", "INT", "OUT"} for p in call["predictions"] for word in p)


def test_pico_refuses_crf(tiny_bert, pico_data, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(InputError, match="crf"):
        run_finetune(_args(tiny_bert, pico_data, out, dataset="pico-mini", task_type="pico", max_length=32,
                           tagging_layer="crf"), log=quiet)
    assert not (out / RUN_RECORD).exists()


def test_pico_blurb_ebm(tiny_bert, tmp_path, predictions):
    data = _skip_unless(BLURB / "pico" / "ebmnlp")
    out = tmp_path / "run"
    result = run_finetune(_args(tiny_bert, data, out, dataset="ebm-pico", max_length=48, max_train_examples=8,
                                max_eval_examples=6), log=quiet)
    record = _check_record(result, out, "pico", "pico_token_macro_f1", {"train": 8, "dev": 6, "test": 6})
    assert record["dataset"] == "ebm-pico" and record["test"]["elements"] == ["PAR", "INT", "OUT"]
    assert 0.0 <= record["test"]["score"] <= 1.0
    assert any("train on dev" in note or "dev.txt" in note for note in record["dataset_notes"])
    test_examples = predictions[-1]["examples"]
    assert len(test_examples) == 6
    assert record["test"]["n_tokens"] == sum(len(e.tokens) for e in test_examples)


# ------------------------------------------------------------------------------ classification

DOCS = [
    ("Tumour cells evaded apoptosis and proliferated .",
     ["Resisting cell death", "Sustaining proliferative signaling"]),
    ("Angiogenesis was induced by VEGF secretion .", ["Inducing angiogenesis"]),
    ("The study enrolled healthy volunteers .", []),
    ("Telomerase activity enabled replicative immortality and genomic instability .",
     ["Enabling replicative immortality", "Genomic instability and mutation"]),
    ("Metastasis to the liver followed invasion of the stroma .", ["Activating invasion and metastasis"]),
    ("Inflammation promoted tumour growth and cells resisted death .",
     ["Tumor promoting inflammation", "Resisting cell death"]),
]


def test_classification_generic_multilabel(tiny_bert, tmp_path, predictions):
    data = tmp_path / "hoclike"
    rows = [{"id": f"d{i}", "text": text, "labels": labels} for i, (text, labels) in enumerate(DOCS)]
    for split in ("train", "dev", "test"):
        _jsonl(data / f"{split}.jsonl", rows)
    out = tmp_path / "run"
    result = run_finetune(_args(tiny_bert, data, out, dataset="hoclike", task_type="classification",
                                batch_size=4, max_length=32), log=quiet)
    n = len(DOCS)
    record = _check_record(result, out, "classification", "micro_f1_multilabel", {"train": n, "dev": n, "test": n})
    test = record["test"]
    labels = sorted({label for _, ls in DOCS for label in ls})
    assert 0.0 <= test["score"] <= 1.0 and test["n_documents"] == n
    assert sorted(test["per_label"]) == labels
    assert test["n_gold"] == sum(len(ls) for _, ls in DOCS)
    call = predictions[-1]
    assert len(call["predictions"]) == n
    assert all(isinstance(p, set) and p <= set(labels) for p in call["predictions"])
    assert test["n_pred"] == sum(len(p) for p in call["predictions"])
    assert all(len(f["input_ids"]) <= 32 for f in call["features"])


def test_classification_blurb_hoc(tiny_bert, tmp_path, predictions):
    data = _skip_unless(BLURB / "classification" / "hoc")
    out = tmp_path / "run"
    result = run_finetune(_args(tiny_bert, data, out, dataset="hoc", max_length=64, max_train_examples=8,
                                max_eval_examples=8), log=quiet)
    record = _check_record(result, out, "classification", "micro_f1_multilabel", {"train": 8, "dev": 8, "test": 8})
    test = record["test"]
    assert 0.0 <= test["score"] <= 1.0 and test["n_documents"] == 8
    assert len(test["per_label"]) == 10  # the ten top-level hallmarks
    assert test["n_gold"] == sum(len(e.labels) for e in predictions[-1]["examples"])
    assert all(len(f["input_ids"]) <= 64 for f in predictions[-1]["features"])


# ------------------------------------------------------------------------------------ QA

QA_ROWS = [
    ("Does aspirin reduce colorectal cancer risk?", "Regular aspirin use lowered the incidence of colorectal cancer.",
     "yes"),
    ("Is vitamin C effective against the common cold?", "Supplementation did not change the duration of colds.", "no"),
    ("Does exercise improve insulin sensitivity?", "Training increased glucose uptake in skeletal muscle.", "yes"),
    ("Does smoking protect against lung cancer?", "Smokers had a higher incidence of lung tumours.", "no"),
    ("Is metformin safe in pregnancy?", "Evidence is limited and results are conflicting.", "maybe"),
]


def test_qa_generic_default_max_length(tiny_bert, tmp_path, predictions):
    data = tmp_path / "qalike"
    long_context = " ".join(["The randomized trial measured many secondary outcomes in several cohorts ."] * 60)
    rows = [{"id": f"q{i}", "question": q, "context": c, "label": label} for i, (q, c, label) in enumerate(QA_ROWS)]
    rows.append({"id": "q-long", "question": "Was the trial long?", "context": long_context, "label": "maybe"})
    for split in ("train", "dev", "test"):
        _jsonl(data / f"{split}.jsonl", rows)
    out = tmp_path / "run"
    result = run_finetune(_args(tiny_bert, data, out, dataset="qalike", task_type="qa", batch_size=4), log=quiet)
    n = len(rows)
    record = _check_record(result, out, "qa", "accuracy", {"train": n, "dev": n, "test": n})
    assert record["hyperparameters"]["max_length"] == QA_MAX_LENGTH == 512
    assert not {"tagging_scheme", "tagging_layer", "relation_representation"} & set(record["hyperparameters"])
    assert record["settings"]["max_length"] is None
    test = record["test"]
    assert 0.0 <= test["score"] <= 1.0 and test["n_examples"] == n
    assert test["n_correct"] == round(test["score"] * n)
    call = predictions[-1]
    assert set(call["predictions"]) <= {"maybe", "no", "yes"} and len(call["predictions"]) == n
    # The long context is cut at 512 sub-words, well beyond the 128 of the other task types.
    lengths = [len(f["input_ids"]) for f in call["features"]]
    assert max(lengths) == QA_MAX_LENGTH
    assert record["input_stats"] == {"truncated": 3}  # the long context, once per split


def test_qa_question_longer_than_max_length_is_cut_not_fatal(tiny_bert, tmp_path):
    data = tmp_path / "qalong"
    question = "Does " + " ".join(["the long-acting inhaled corticosteroid"] * 40) + " help?"
    rows = [{"id": f"q{i}", "question": question if i == 0 else q, "context": c, "label": label}
            for i, (q, c, label) in enumerate(QA_ROWS)]
    for split in ("train", "dev", "test"):
        _jsonl(data / f"{split}.jsonl", rows)
    out = tmp_path / "run"
    result = run_finetune(_args(tiny_bert, data, out, dataset="qalong", task_type="qa", batch_size=4, max_length=32),
                          log=quiet)
    assert result.record["test"]["n_examples"] == len(rows)


@pytest.mark.parametrize("name, folder, labels", [("pubmedqa", "pubmedqa", {"yes", "no", "maybe"}),
                                                  ("bioasq", "bioasq-yesno-proxy", {"yes", "no"})])
def test_qa_blurb(tiny_bert, tmp_path, predictions, name, folder, labels):
    data = _skip_unless(BLURB / "qa" / folder)
    out = tmp_path / "run"
    result = run_finetune(_args(tiny_bert, data, out, dataset=name, max_length=64, max_train_examples=8,
                                max_eval_examples=8), log=quiet)
    record = _check_record(result, out, "qa", "accuracy", {"train": 8, "dev": 8, "test": 8})
    assert record["dataset"] == name and record["hyperparameters"]["max_length"] == 64
    test = record["test"]
    assert 0.0 <= test["score"] <= 1.0 and test["n_examples"] == 8
    call = predictions[-1]
    assert set(call["predictions"]) <= labels
    assert test["n_correct"] == sum(e.label == p for e, p in zip(call["examples"], call["predictions"]))
    assert all(len(f["input_ids"]) <= 64 for f in call["features"])


# ------------------------------------------------------------------------------- relations

RELATION_ROWS = [
    ("BRCA1 mutations cause breast cancer in carriers .", "BRCA1", "breast cancer", "causes"),
    ("Tamoxifen treats breast cancer effectively .", "Tamoxifen", "breast cancer", "treats"),
    ("TP53 was sequenced but lung cancer was not linked to it .", "TP53", "lung cancer", "none"),
    ("Imatinib is used to treat chronic myeloid leukemia .", "Imatinib", "chronic myeloid leukemia", "treats"),
    ("APOE variants cause Alzheimer disease in families .", "APOE", "Alzheimer disease", "causes"),
    ("Metformin was given ; asthma was recorded at baseline .", "Metformin", "asthma", "none"),
]


def _relation_rows() -> list[dict]:
    rows = []
    for i, (text, first, second, label) in enumerate(RELATION_ROWS):
        a, b = text.index(first), text.index(second)
        rows.append({"id": f"r{i}", "text": text, "label": label,
                     "entities": [{"start": a, "end": a + len(first), "type": "agent", "text": first},
                                  {"start": b, "end": b + len(second), "type": "disease", "text": second}]})
    return rows


@pytest.mark.parametrize("representation", ["cls", "mention_max_pool", "entity_start"])
def test_relation_markers_generic(tiny_bert, tmp_path, predictions, built_models, representation):
    from transformers import AutoTokenizer

    data = tmp_path / "relmini"
    for split in ("train", "dev", "test"):
        _jsonl(data / f"{split}.jsonl", _relation_rows())
    out = tmp_path / "run"
    result = run_finetune(_args(tiny_bert, data, out, dataset="relmini", task_type="relation", negative_label="none",
                                batch_size=4, max_length=32, relation_transformation="markers",
                                relation_representation=representation), log=quiet)
    n = len(RELATION_ROWS)
    record = _check_record(result, out, "relation", "micro_f1_positive", {"train": n, "dev": n, "test": n})
    assert record["hyperparameters"]["relation_transformation"] == "markers"
    assert record["hyperparameters"]["relation_representation"] == representation
    test = record["test"]
    assert 0.0 <= test["score"] <= 1.0 and test["n_examples"] == n and test["negative_labels"] == ["none"]
    assert record["input_stats"] == {"entities_clipped": 0, "truncated": 0}

    # The tokenizer gained the four markers as single tokens and the embeddings grew to match.
    base = AutoTokenizer.from_pretrained(tiny_bert)
    assert not any(marker in base.get_vocab() for marker in ENTITY_MARKERS)  # the checkpoint is left as it was
    (model, tokenizer_size), = built_models
    assert tokenizer_size == len(base) + len(ENTITY_MARKERS)
    assert model.encoder.get_input_embeddings().num_embeddings == tokenizer_size
    marker_ids = list(range(len(base), len(base) + len(ENTITY_MARKERS)))
    call = predictions[-1]
    for feature in call["features"]:
        ids = feature["input_ids"]
        assert [ids.count(m) for m in marker_ids] == [1, 1, 1, 1]
        e1_start, e2_start = feature["entity_starts"]
        assert ids[e1_start] == marker_ids[0] and ids[e2_start] == marker_ids[2]  # [E1], [E2]
        for (start, end), close in zip(feature["entity_spans"], (marker_ids[1], marker_ids[3])):
            assert ids[end] == close  # each mention span ends right before its end marker
    assert set(call["predictions"]) <= {"causes", "none", "treats"} and len(call["predictions"]) == n


def test_relation_blurb_ddi_markers(tiny_bert, tmp_path, predictions):
    data = _skip_unless(BLURB / "re" / "ddi")
    out = tmp_path / "run"
    result = run_finetune(_args(tiny_bert, data, out, dataset="ddi", max_length=64, max_train_examples=8,
                                max_eval_examples=8, relation_transformation="markers",
                                relation_representation="entity_start"), log=quiet)
    record = _check_record(result, out, "relation", "micro_f1_positive", {"train": 8, "dev": 8, "test": 8})
    test = record["test"]
    assert 0.0 <= test["score"] <= 1.0 and test["n_examples"] == 8 and test["negative_labels"] == ["DDI-false"]
    assert set(record["input_stats"]) == {"entities_clipped", "truncated"}
    call = predictions[-1]
    assert all(e.entities for e in call["examples"])  # DDI rows carry offsets: markers go around the mentions
    assert all(len(f["input_ids"]) <= 64 for f in call["features"])


@pytest.mark.parametrize("transformation", ["dummify", "markers"])
def test_relation_blurb_gad(tiny_bert, tmp_path, predictions, transformation):
    data = _skip_unless(BLURB / "re" / "gad")
    out = tmp_path / "run"
    result = run_finetune(_args(tiny_bert, data, out, dataset="gad", max_length=64, max_train_examples=8,
                                max_eval_examples=8, relation_transformation=transformation,
                                relation_representation="mention_max_pool"), log=quiet)
    record = _check_record(result, out, "relation", "f1_positive", {"train": 8, "dev": 8, "test": 8})
    test = record["test"]
    assert 0.0 <= test["score"] <= 1.0 and test["n_examples"] == 8 and test["positive"] == "1"
    call = predictions[-1]
    assert set(call["predictions"]) <= {"0", "1"}
    if transformation == "markers":  # the placeholders are wrapped: [E1] @GENE$ [/E1] ... [E2] @DISEASE$ [/E2]
        from transformers import AutoTokenizer

        first_marker = len(AutoTokenizer.from_pretrained(tiny_bert))
        assert all(f["input_ids"][f["entity_starts"][0]] == first_marker for f in call["features"])


# ------------------------------------------------------------------------------ similarity

def test_similarity_blurb_biosses(tiny_bert, tmp_path, predictions):
    data = _skip_unless(BLURB / "similarity" / "biosses")
    out = tmp_path / "run"
    result = run_finetune(_args(tiny_bert, data, out, dataset="biosses", max_length=64, max_train_examples=8,
                                max_eval_examples=8), log=quiet)
    record = _check_record(result, out, "similarity", "pearson", {"train": 8, "dev": 8, "test": 8})
    test = record["test"]
    assert -1.0 <= test["score"] <= 1.0 and test["n_examples"] == 8
    call = predictions[-1]
    assert len(call["predictions"]) == 8 and all(isinstance(p, float) for p in call["predictions"])
    gold = [e.score for e in load_blurb_dataset("biosses", data).splits["test"][:8]]
    assert [e.score for e in call["examples"]] == gold
