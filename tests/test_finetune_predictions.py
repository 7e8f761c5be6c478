"""Each run writes its per-example predictions next to ``run.json`` (``predictions_test.jsonl``, and the
kept dev epoch's ``predictions_dev.jsonl``), named in the record's ``predictions`` field.

The checks: one line per example in the split's order, and the metric recomputed from the file alone
(with :mod:`finetune.metrics` and the record's ``metric_kwargs``) gives exactly the recorded score; the
option off writes no file; a finished run recorded without predictions is still skipped as finished.
Tiny random BERT (the ``tiny_bert`` fixture), a slice of the committed NCBI-disease files, a few
seconds per run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from biomed_lm.finetune.metrics import compute_metric  # noqa: E402
from biomed_lm.finetune.trainer import RUN_RECORD, FinetuneArgs, run_finetune  # noqa: E402
from tests import forked_main  # noqa: E402
from tests.conftest import ncbi_slice  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TEST_FILE, DEV_FILE = "predictions_test.jsonl", "predictions_dev.jsonl"


def _args(model: Path, data: Path, out: Path, **overrides) -> FinetuneArgs:
    values = dict(model=str(model), dataset="ncbi-disease", data_dir=str(data), output_dir=str(out),
                  learning_rate=5e-4, batch_size=8, epochs=2, seed=1, max_length=32)
    values.update(overrides)
    return FinetuneArgs(**values)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _recomputed(record: dict, rows: list[dict]) -> dict:
    """The metric from a predictions file and the record's description of it, nothing else."""
    described = record["predictions"]
    return compute_metric(described["metric"], [r["gold"] for r in rows], [r["predicted"] for r in rows],
                          **described["metric_kwargs"])


def _check_files(out: Path, record: dict, sizes: dict[str, int]) -> dict[str, list[dict]]:
    """Both files as run.json names them, one line per example in order, each rescoring to the record."""
    assert record["predictions"]["test"] == {"file": TEST_FILE, "lines": sizes["test"]}
    assert record["predictions"]["dev"] == {"file": DEV_FILE, "lines": sizes["dev"], "epoch": record["best_epoch"]}
    files = {split: _rows(out / record["predictions"][split]["file"]) for split in ("test", "dev")}
    for split, rows in files.items():
        assert [r["index"] for r in rows] == list(range(sizes[split]))
    assert _recomputed(record, files["test"])["score"] == record["test"]["score"] == record["test_score"]
    assert _recomputed(record, files["dev"])["score"] == record["best_dev_score"]
    assert not list(out.glob("*.partial"))  # written through temporary files, none left over
    return files


def test_ner_predictions_rescore_to_the_recorded_f1(tiny_bert, tmp_path):
    data = ncbi_slice(tmp_path)
    out = tmp_path / "run"
    result = run_finetune(_args(tiny_bert, data, out), log=lambda m: None)
    record = json.loads((out / RUN_RECORD).read_text(encoding="utf-8"))
    assert record["predictions"] == result.record["predictions"]
    assert record["test"]["n_pred"] > 0  # a score of something: 0 == 0 would rescore from any file
    files = _check_files(out, record, {"test": 16, "dev": 16})
    assert record["predictions"]["metric_kwargs"] == {"scheme": "bio", "mode": record["test"]["mode"]}

    # The words and gold tags of each line are the test file's sentence, in its order.
    sentences = (data / "test.tsv").read_text(encoding="utf-8").strip().split("\n\n")
    for row, sentence in zip(files["test"], sentences, strict=True):
        words, tags = zip(*(line.split("\t") for line in sentence.splitlines()))
        assert row["words"] == list(words) and row["gold"] == list(tags)
        assert len(row["predicted"]) == len(words) and row["id"] == f"test-{row['index']}"
    # Entity counts too, not only the score: a file that dropped a sentence's entities would show here.
    recomputed = _recomputed(record, files["test"])
    assert {k: recomputed[k] for k in ("n_gold", "n_pred", "n_correct")} == \
        {k: record["test"][k] for k in ("n_gold", "n_pred", "n_correct")}

    # Resumed: the finished run is skipped, its files left as they were.
    before = (out / TEST_FILE).read_bytes()
    assert run_finetune(_args(tiny_bert, data, out), log=lambda m: None).skipped
    assert (out / TEST_FILE).read_bytes() == before


RELATION_ROWS = [
    ("@CHEMICAL$ inhibits @GENE$ activity in liver cells .", "CPR:4"),
    ("@GENE$ is activated by @CHEMICAL$ at low doses .", "CPR:3"),
    ("@CHEMICAL$ and @GENE$ were measured in the same samples .", "false"),
    ("Treatment with @CHEMICAL$ reduced @GENE$ expression .", "CPR:4"),
    ("@CHEMICAL$ up-regulates @GENE$ in mice .", "CPR:3"),
    ("No effect of @CHEMICAL$ on @GENE$ was seen .", "false"),
]


def _relation_data(root: Path) -> Path:
    """A ChemProt-like generic relation dataset (dummified sentences, ids, two positive classes)."""
    data = root / "chemlike"
    data.mkdir()
    body = "index\tsentence\tlabel\n" + "".join(f"r{i}\t{s}\t{label}\n" for i, (s, label) in enumerate(RELATION_ROWS))
    for split in ("train", "dev", "test"):
        (data / f"{split}.tsv").write_text(body, encoding="utf-8")
    return data


def test_relation_predictions_rescore_to_the_recorded_micro_f1(tiny_bert, tmp_path):
    out = tmp_path / "run"
    run_finetune(_args(tiny_bert, _relation_data(tmp_path), out, dataset="chemlike", task_type="relation",
                       negative_label="false", batch_size=4), log=lambda m: None)
    record = json.loads((out / RUN_RECORD).read_text(encoding="utf-8"))
    assert record["metric"] == "micro_f1_positive" and record["test"]["n_pred"] > 0
    n = len(RELATION_ROWS)
    files = _check_files(out, record, {"test": n, "dev": n})
    assert record["predictions"]["metric_kwargs"]["negative_labels"] == "false"
    for row, (sentence, label) in zip(files["test"], RELATION_ROWS, strict=True):
        assert row["id"] == f"r{row['index']}" and row["sentence"] == sentence and row["gold"] == label
        assert row["predicted"] in {"CPR:3", "CPR:4", "false"}


def test_save_predictions_false_writes_no_file(tiny_bert, tmp_path):
    """``--save_predictions false`` from the command line: no file, ``predictions`` null. Run again with the
    option on, the finished run is still finished (skipped; the weights to predict with are gone)."""
    data = ncbi_slice(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    (out / TEST_FILE).write_text("{}\n", encoding="utf-8")  # an earlier run's file, not this run's predictions
    proc = forked_main.run_command([sys.executable, str(REPO / "launch" / "finetune.py"), "--model", str(tiny_bert),
                                    "--dataset", "ncbi-disease", "--data_dir", str(data), "--output_dir", str(out),
                                    "--epochs", "1", "--batch_size", "8", "--max_length", "32", "--seed", "1",
                                    "--learning_rate", "5e-4", "--save_predictions", "false"],
                                   env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((out / RUN_RECORD).read_text(encoding="utf-8"))
    assert record["status"] == "complete" and record["predictions"] is None
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("predictions")) == []

    logged: list[str] = []
    again = run_finetune(_args(tiny_bert, data, out, epochs=1), log=logged.append)
    assert again.skipped and not (out / TEST_FILE).exists()
    assert any("no predictions_test.jsonl" in line for line in logged), logged


def _degenerate(adapter_class, gold, predicted) -> list[str]:
    """An adapter's check of collapsed predictions (it reads nothing of the run: built without one)."""
    return adapter_class.degenerate(object.__new__(adapter_class), gold, predicted)


def test_test_predictions_of_one_label_are_a_warning():
    """QA: DDI at 64 examples predicted DDI-false throughout and scored 0.00 without a word."""
    from biomed_lm.finetune.adapters.relation import RelationAdapter
    from biomed_lm.finetune.adapters.sequence import QAAdapter

    gold = ["false", "mechanism", "false"]
    (line,) = _degenerate(RelationAdapter, gold, ["false"] * 3)
    assert line.startswith("every test prediction is 'false' (the test set has 2 labels)")
    assert _degenerate(RelationAdapter, gold, ["false", "mechanism", "false"]) == []
    assert _degenerate(QAAdapter, ["yes", "yes"], ["yes", "yes"]) == []


def test_a_tagging_run_that_tags_no_word_is_a_warning():
    """QA: short NER runs of a collapsed model predicted O for all 1,684 test words and scored 0.00 without
    a word; PICO's outside is the empty element set."""
    from biomed_lm.finetune.adapters.tagging import PicoAdapter, TokenTaggingAdapter as NerAdapter

    ner = [["B-Disease", "I-Disease", "O"], ["O", "O"]]
    (line,) = _degenerate(NerAdapter, ner, [["O", "O", "O"], ["O", "O"]])
    assert line.startswith("no test word is tagged (the gold tags 2 words)")
    assert _degenerate(NerAdapter, ner, [["O", "B-Disease", "O"], ["O", "O"]]) == []
    assert _degenerate(NerAdapter, [["O"], ["O"]], [["O"], ["O"]]) == []  # nothing to tag
    pico = [[{"participants"}, set()], [set()]]
    assert _degenerate(PicoAdapter, pico, [[set(), set()], [set()]])[0].startswith("no test word is tagged (the gold")
    assert _degenerate(PicoAdapter, pico, [[{"outcomes"}, set()], [set()]]) == []


def test_a_similarity_run_predicting_one_score_is_a_warning():
    """QA: a collapsed BIOSSES regressor scored Pearson 0.0 (constant input) with no warning, and a nearly
    constant one (bf16 noise) gets an r computed from that noise."""
    from biomed_lm.finetune.adapters.sequence import SimilarityAdapter

    gold = [0.0, 1.5, 3.0, 4.0]
    (line,) = _degenerate(SimilarityAdapter, gold, [1.7] * 4)
    assert line.startswith("the test predictions span 0 (from 1.7) where the gold spans 4")
    assert _degenerate(SimilarityAdapter, gold, [1.7, 1.7001, 1.7002, 1.7])  # within 1e-3 of the gold's span
    assert _degenerate(SimilarityAdapter, gold, [1.0, 1.5, 2.0, 2.5]) == []
    assert _degenerate(SimilarityAdapter, [2.0, 2.0], [2.0, 2.0]) == []  # the gold itself is one score


def test_a_document_classification_run_giving_one_label_set_is_a_warning():
    """QA: HoC predicting no hallmark for any abstract scored 0.0 with no warning."""
    from biomed_lm.finetune.adapters.sequence import DocumentClassificationAdapter

    gold = [{"activating invasion and metastasis"}, set(), {"sustaining proliferative signaling", "avoiding immune"}]
    (line,) = _degenerate(DocumentClassificationAdapter, gold, [set()] * 3)
    assert line.startswith("no test document is given a label (the gold labels 2)")
    (line,) = _degenerate(DocumentClassificationAdapter, gold, [{"avoiding immune"}] * 3)
    assert line.startswith("every test document is given the labels ['avoiding immune'] (the test set has 3 label")
    assert _degenerate(DocumentClassificationAdapter, gold, [set(), set(), {"avoiding immune"}]) == []
    assert _degenerate(DocumentClassificationAdapter, [set(), set()], [set(), set()]) == []


def test_an_eval_slice_of_one_label_is_a_warning(tiny_bert, tmp_path):
    """QA: --max_eval_examples 200 kept GAD test rows that were all positive; the run scored F1 1.0 without
    a word. A slice of one label, where the whole split has several, is named in a warning."""
    lines: list[str] = []
    run_finetune(_args(tiny_bert, _relation_data(tmp_path), tmp_path / "run", dataset="chemlike",
                       task_type="relation", negative_label="false", batch_size=4, epochs=1, max_eval_examples=1),
                 log=lines.append)
    warnings = [line for line in lines if "--max_eval_examples 1 keeps the first 1" in line]
    assert [w.split(" examples,")[0].split()[-1] for w in warnings] == ["dev", "test"]
    assert all(w.startswith("warning: ") and "all labelled 'CPR:4' (the whole split has 3 labels)" in w
               for w in warnings)
    record = json.loads((tmp_path / "run" / RUN_RECORD).read_text(encoding="utf-8"))
    assert record["slice_warnings"] == [w.removeprefix("warning: ") for w in warnings]  # for the sweep's table
