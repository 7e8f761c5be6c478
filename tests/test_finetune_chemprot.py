"""ChemProt as it is distributed, read and fine-tuned as a new user would (issue 13, item 4).

BLURB's ChemProt is a ``sentence<TAB>label`` TSV with a header; the pair's chemical and gene are
written as the words BC6ENTC and BC6ENTG (other mentions: BC6OTHER) in some copies and as
``@CHEMICAL$``/``@GENE$`` in others (BLUE's adds an ``index`` column). Both must reach the model as
the same placeholders, and a line that fine-tuning cannot use must stop ``launch/finetune.py`` with
exit status 2 and the file and line, before any training.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import biomed_lm.finetune.trainer as trainer  # noqa: E402
from biomed_lm.finetune.datasets import DatasetFormatError, load_blurb_dataset  # noqa: E402
from biomed_lm.finetune.relation_inputs import PLACEHOLDER_PAIRS, pair_from_placeholders  # noqa: E402
from biomed_lm.finetune.trainer import RUN_RECORD, FinetuneArgs, run_finetune  # noqa: E402
from tests import forked_main  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

BC6_ROWS = [  # the first sentence names the gene before the chemical: E1 must still be the chemical
    ("BC6ENTG is inhibited by BC6ENTC in BC6OTHER - treated cells .", "CPR:4"),
    ("BC6ENTC is an agonist of BC6ENTG .", "CPR:5"),
    ("BC6ENTC and BC6OTHER were given ; BC6ENTG levels did not change .", "false"),
    ("BC6ENTC is metabolized by BC6ENTG .", "CPR:9"),
    ("BC6ENTC up-regulates BC6ENTG expression .", "CPR:3"),
    ("BC6ENTC blocks the BC6ENTG receptor .", "CPR:6"),
]


def _write_splits(root: Path, header: str, lines: list[str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for split in ("train", "dev", "test"):
        (root / f"{split}.tsv").write_text(header + "".join(line + "\n" for line in lines), encoding="utf-8")
    return root


def bc6_dir(root: Path) -> Path:
    return _write_splits(root, "sentence\tlabel\n", [f"{s}\t{label}" for s, label in BC6_ROWS])


def _launch_main():
    """``main`` of launch/finetune.py, loaded from its file as the script runs it."""
    spec = importlib.util.spec_from_file_location("launch_finetune_script", REPO / "launch" / "finetune.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


# ---------------------------------------------------------------------------------- reading

def test_bc6_markers_are_read_as_the_placeholders(tmp_path):
    dataset = load_blurb_dataset("ChemProt", bc6_dir(tmp_path))
    first = dataset.splits["train"][0]
    assert first.text == first.masked_text == "@GENE$ is inhibited by @CHEMICAL$ in BC6OTHER - treated cells ."
    assert first.id == "train-2" and first.entities == () and first.label == "CPR:4"
    assert [e.label for e in dataset.splits["test"]] == ["CPR:4", "CPR:5", "False", "CPR:9", "CPR:3", "CPR:6"]
    assert any("18 sentence(s) wrote the pair as BC6ENTC/BC6ENTG" in note and "BC6OTHER" in note
               for note in dataset.notes), dataset.notes


def test_lower_cased_bc6_markers_and_placeholder_files_read_alike(tmp_path):
    lower = _write_splits(tmp_path / "lower", "sentence\tlabel\n", ["bc6entc inhibits bc6entg .\tCPR:4"])
    blue = _write_splits(tmp_path / "blue", "index\tsentence\tlabel\n",
                         ["10047461.T1.T2\t@CHEMICAL$ inhibits @GENE$ .\tCPR:4"])
    headerless = _write_splits(tmp_path / "plain", "", ["@CHEMICAL$ inhibits @GENE$ .\tCPR:4"])
    texts = {load_blurb_dataset("chemprot", d).splits["dev"][0].text for d in (lower, blue, headerless)}
    assert texts == {"@CHEMICAL$ inhibits @GENE$ ."}
    assert load_blurb_dataset("chemprot", blue).splits["dev"][0].id == "10047461.T1.T2"
    assert not any("BC6ENTC" in note for note in load_blurb_dataset("chemprot", blue).notes)


def test_overlapping_mentions_and_the_pair_order():
    pair = PLACEHOLDER_PAIRS["chemprot"]
    first, second = pair_from_placeholders("@GENE$ is inhibited by @CHEMICAL$", pair)
    assert (first.type, second.type) == ("CHEMICAL", "GENE") and first.start > second.start
    both = pair_from_placeholders("binding of @CHEM-GENE$ to membranes", pair)
    assert both[0].start == both[1].start == 11
    with pytest.raises(ValueError, match=r"found @CHEMICAL\$, @CHEMICAL\$"):
        pair_from_placeholders("@CHEMICAL$ and @CHEMICAL$", pair)


BAD_LINES = {
    "wrong number of fields": ("BC6ENTC inhibits BC6ENTG .\tCPR:4\textra", None, "expected 2 tab-separated fields"),
    "no entity markers": ("Aspirin inhibits COX-1 .\tCPR:4", "sentence", "found no placeholder"),
    "a placeholder of another dataset alone": ("@DISEASE$ is named .\tCPR:4", "sentence", r"found @DISEASE\$"),
    "a third placeholder": ("@CHEMICAL$ and @GENE$ bind @GENE$ .\tCPR:4", "sentence", r"@GENE\$, @GENE\$"),
    "unknown label": ("BC6ENTC inhibits BC6ENTG .\t4", "label", "unknown label '4'.*CPR:3"),
}


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_a_line_fine_tuning_cannot_use_names_its_file_and_line(tmp_path, capsys, case):
    line, field, message = BAD_LINES[case]
    data = bc6_dir(tmp_path / "chemprot")
    dev = data / "dev.tsv"
    dev.write_text(dev.read_text(encoding="utf-8") + line + "\n", encoding="utf-8")
    where = f"{dev}, line {len(BC6_ROWS) + 2}: " + (f"field '{field}': " if field else "")
    with pytest.raises(DatasetFormatError) as caught:
        load_blurb_dataset("chemprot", data)
    assert str(caught.value).startswith(where) and caught.value.line == len(BC6_ROWS) + 2
    # The launch script maps it to exit status 2 before a model is needed (the path does not exist).
    status = _launch_main()(["--model", str(tmp_path / "no-model"), "--dataset", "chemprot", "--data_dir", str(data),
                             "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 2 and f"finetune: error: {where}" in err, err
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()  # nothing written, and the folder the refused run made is gone


def test_launch_script_exits_2_as_a_process(tmp_path):
    data = bc6_dir(tmp_path / "chemprot")
    (data / "test.tsv").write_text("sentence\tlabel\nAspirin inhibits COX-1 .\tCPR:4\n", encoding="utf-8")
    done = forked_main.run_command([sys.executable, str(REPO / "launch" / "finetune.py"), "--model",
                                    str(tmp_path / "m"), "--dataset", "chemprot", "--data_dir", str(data),
                                    "--output_dir", str(tmp_path / "out")],
                                   env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{data / 'test.tsv'}, line 2: field 'sentence'" in done.stderr and "Traceback" not in done.stderr


# ------------------------------------------------------------------------------ fine-tuning

@pytest.fixture
def featurized(monkeypatch):
    """The features of every ``_predict`` call of a run (dev per epoch, then test)."""
    calls: list[list[dict]] = []
    original = trainer._predict

    def recording(model, task, examples, features, batch_size, device):
        calls.append(list(features))
        return original(model, task, examples, features, batch_size, device)

    monkeypatch.setattr(trainer, "_predict", recording)
    return calls


@pytest.mark.parametrize("transformation, representation", [("dummify", "cls"), ("markers", "entity_start")])
def test_bc6_chemprot_fine_tunes_end_to_end(tiny_bert, tmp_path, featurized, transformation, representation):
    from transformers import AutoTokenizer

    data, out = bc6_dir(tmp_path / "chemprot"), tmp_path / "run"
    args = FinetuneArgs(model=str(tiny_bert), dataset="chemprot", data_dir=str(data), output_dir=str(out),
                        learning_rate=5e-4, batch_size=4, epochs=1, seed=1,
                        relation_transformation=transformation, relation_representation=representation)
    record = run_finetune(args, log=lambda message: None).record
    assert json.loads((out / RUN_RECORD).read_text(encoding="utf-8"))["status"] == "complete"
    assert record["metric"] == "micro_f1_positive" and record["test"]["negative_labels"] == ["False"]
    assert record["test"]["n_examples"] == len(BC6_ROWS) and 0.0 <= record["test"]["score"] <= 1.0
    assert record["hyperparameters"]["max_length"] == 256  # the paper's length for ChemProt, by default
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    first = featurized[-1][0]
    tokens = tokenizer.convert_ids_to_tokens(first["input_ids"])
    assert "##ent" not in tokens and tokens.count("chemical") == tokens.count("gene") == 1
    assert "##oth" in tokens  # BC6OTHER is left as the word it is
    chemical_at, gene_at = tokens.index("chemical"), tokens.index("gene")
    (e1_start, e1_end), (e2_start, e2_end) = first["entity_spans"]
    assert e1_start <= chemical_at < e1_end and e2_start <= gene_at < e2_end  # E1 is the chemical
    if transformation == "markers":  # [E1] is the first token added to the checkpoint's vocabulary
        e1_marker, e2_marker = first["entity_starts"]
        assert first["input_ids"][e1_marker] == len(tokenizer) and e1_marker > e2_marker


# --------------------------------------------- rows that mark one entity of the pair (issue 22, item 7)
# BLURB's ChemProt TSV has rows where only one of the pair is marked (the chemical left as its own
# words while BC6ENTG marks the gene, or the other way round): 24 of 16,521 train, 6 dev, 15 test rows.
# The reader stopped the run at the first. Here each kind of row is written by hand.

ONE_ENTITY_ROWS = [  # appended after the header and BC6_ROWS: lines 8 and 9 of each file
    ("Aspirin inhibits BC6ENTG in BC6OTHER - treated cells .", "CPR:4"),  # the chemical as plain text
    ("BC6ENTC binds the receptor of the cell .", "false"),                 # the gene as plain text
]
ONE_ENTITY_LINES = [len(BC6_ROWS) + 2 + i for i in range(len(ONE_ENTITY_ROWS))]


def one_entity_dir(root: Path) -> Path:
    rows = BC6_ROWS + ONE_ENTITY_ROWS
    return _write_splits(root, "sentence\tlabel\n", [f"{s}\t{label}" for s, label in rows])


def test_one_entity_rows_are_read_counted_and_located(tmp_path):
    dataset = load_blurb_dataset("chemprot", one_entity_dir(tmp_path))
    assert [len(dataset.splits[s]) for s in ("train", "dev", "test")] == [8, 8, 8]
    chemical_missing = dataset.splits["train"][6]
    assert chemical_missing.text == "Aspirin inhibits @GENE$ in BC6OTHER - treated cells ." \
        and chemical_missing.entities == () and chemical_missing.label == "CPR:4"
    flagged = dataset.one_entity_rows["dev"]
    assert flagged.file == "dev.tsv" and dict(flagged.lines) == {"dev-8": 8, "dev-9": 9}
    (note,) = [n for n in dataset.notes if "one entity" in n]
    assert note.startswith("rows that mark only one entity of the pair (kept; fine-tuning decides, see "
                           "docs/datasets.md): train.tsv 2 (lines 8, 9), dev.tsv 2 (lines 8, 9), test.tsv 2"), note
    assert not load_blurb_dataset("chemprot", bc6_dir(tmp_path / "whole")).one_entity_rows


@pytest.mark.parametrize("name, row", [
    ("gad", "variants of @GENE$ were studied in 200 patients .\t1"),
    ("ddi", "@DRUG$ should not be given with grapefruit juice .\tDDI-advise"),
])
def test_gad_and_ddi_in_the_same_format_keep_one_entity_rows(tmp_path, name, row):
    pair = {"gad": "a @GENE$ allele and @DISEASE$ .\t0", "ddi": "@DRUG$ raises @DRUG$ levels .\tDDI-effect"}[name]
    data = _write_splits(tmp_path / name, "sentence\tlabel\n", [pair, row])
    dataset = load_blurb_dataset(name, data)
    assert dict(dataset.one_entity_rows["test"].lines) == {"test-3": 3}
    too_many = {"gad": "@GENE$ , @GENE$ and @DISEASE$ .\t0", "ddi": "@DRUG$ , @DRUG$ and @DRUG$ .\tDDI-int"}[name]
    _write_splits(data, "sentence\tlabel\n", [pair, too_many])
    with pytest.raises(DatasetFormatError, match=r"line 3: field 'sentence'"):
        load_blurb_dataset(name, data)


def _finetune_process(model: Path, data: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    return forked_main.run_command([sys.executable, str(REPO / "launch" / "finetune.py"), "--model", str(model),
                                    "--dataset", "chemprot", "--data_dir", str(data), "--output_dir", str(out),
                                    "--epochs", "1", "--batch_size", "4", "--max_length", "64", *flags],
                                   env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)


def test_one_entity_rows_are_classified_as_given_with_the_cls_default(tiny_bert, tmp_path):
    done = _finetune_process(tiny_bert, one_entity_dir(tmp_path / "chemprot"), tmp_path / "out")
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("rows marking one entity of the pair: train 2 (train.tsv lines 8, 9), dev 2 (dev.tsv lines 8, 9), "
            "test 2 (test.tsv lines 8, 9): classified as given (representation cls)") in done.stderr, done.stderr
    record = json.loads((tmp_path / "out" / RUN_RECORD).read_text(encoding="utf-8"))
    assert record["examples"] == {"train": 8, "dev": 8, "test": 8} and record["test"]["n_examples"] == 8
    rows = record["input_details"]["one_entity_rows"]
    assert rows["train"] == {"file": "train.tsv", "rows": 2, "first_lines": [8, 9], "handled": "classified as given"}
    assert rows["test"]["handled"] == "classified as given"
    lines = (tmp_path / "out" / record["predictions"]["test"]["file"]).read_text(encoding="utf-8").splitlines()
    assert len(lines) == 8 and not any("scored_as_negative" in json.loads(line) for line in lines)


def test_one_entity_rows_where_the_representation_needs_both_entities(tiny_bert, tmp_path):
    done = _finetune_process(tiny_bert, one_entity_dir(tmp_path / "chemprot"), tmp_path / "out",
                             "--relation_representation", "entity_start")
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("rows marking one entity of the pair: train 2 (train.tsv lines 8, 9): skipped; dev 2 (dev.tsv lines "
            "8, 9), test 2 (test.tsv lines 8, 9): predicted as False; representation entity_start needs both "
            "entities") in done.stderr, done.stderr
    record = json.loads((tmp_path / "out" / RUN_RECORD).read_text(encoding="utf-8"))
    assert record["examples"] == {"train": 6, "dev": 8, "test": 8} and record["test"]["n_examples"] == 8
    rows = record["input_details"]["one_entity_rows"]
    assert rows["train"] == {"file": "train.tsv", "rows": 2, "first_lines": [8, 9], "handled": "skipped"}
    assert rows["dev"]["handled"] == rows["test"]["handled"] == "predicted as False"


@pytest.fixture
def predicted(monkeypatch):
    """(examples, predictions) of every ``_predict`` call of a run (dev per epoch, then test)."""
    calls: list[tuple[list, list]] = []
    original = trainer._predict

    def recording(model, task, examples, features, batch_size, device):
        predictions = original(model, task, examples, features, batch_size, device)
        calls.append((list(examples), list(predictions)))
        return predictions

    monkeypatch.setattr(trainer, "_predict", recording)
    return calls


@pytest.mark.parametrize("transformation, representation", [("markers", "cls"), ("dummify", "mention_max_pool")])
def test_unrepresentable_test_rows_are_scored_as_the_negative_class(tiny_bert, tmp_path, predicted, transformation,
                                                                    representation):
    args = FinetuneArgs(model=str(tiny_bert), dataset="chemprot", data_dir=str(one_entity_dir(tmp_path / "c")),
                        output_dir=str(tmp_path / "run"), batch_size=4, epochs=1, max_length=64,
                        relation_transformation=transformation, relation_representation=representation)
    record = run_finetune(args, log=lambda message: None).record
    examples, predictions = predicted[-1]
    by_id = {e.id: p for e, p in zip(examples, predictions)}
    assert [by_id["test-8"], by_id["test-9"]] == ["False", "False"] and len(by_id) == 8
    assert record["examples"]["train"] == 6 and record["test"]["n_examples"] == 8
    # QA: the predictions file showed "False" for these rows as if the model had said so
    lines = (tmp_path / "run" / record["predictions"]["test"]["file"]).read_text(encoding="utf-8").splitlines()
    flagged = {row["id"]: row.get("scored_as_negative") for row in map(json.loads, lines)}
    why = "transformation markers" if transformation == "markers" else f"representation {representation}"
    assert flagged.pop("test-8") == flagged.pop("test-9") == \
        f"the sentence marks one entity of the pair; {why} needs both entities"
    assert set(flagged.values()) == {None}  # the rows the model classified carry no flag


def test_real_chemprot_files_load_with_their_one_entity_rows(shared_data):
    directory = next((shared_data / "blurb" / "re" / d for d in ("chemprot", "ChemProt")
                      if (shared_data / "blurb" / "re" / d).is_dir()), None)
    if directory is None:
        pytest.skip(f"no ChemProt files under {shared_data / 'blurb' / 're'}")
    dataset = load_blurb_dataset("chemprot", directory)
    counts = {split: len(rows.lines) for split, rows in dataset.one_entity_rows.items()}
    assert sum(counts.values()) > 0 and all(n < 0.01 * len(dataset.splits[s]) for s, n in counts.items()), counts


def test_real_gad_files_have_no_one_entity_rows():
    from tests.conftest import shared_file

    directory = shared_file("blurb/re/gad/gad_blurb_train.tsv").parent
    dataset = load_blurb_dataset("gad", directory)
    assert dataset.sizes() == {"train": 4261, "dev": 535, "test": 534} and not dataset.one_entity_rows
