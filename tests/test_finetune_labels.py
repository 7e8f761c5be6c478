"""The label set of a generic dataset: stated with ``--labels``, or taken from the training file with
a warning for a label that is seen too rarely to be a class (issue 22, item 6).

A typo in a training file (``perhaps`` beside ``yes``/``no``) used to become a class of its own,
exit 0, no warning. Each fault is inflicted through ``launch/finetune.py``'s ``main`` with the
user's command line, and the first as a subprocess, as a user meets it (the others in this process:
a start-up costs ~7 s of the suite); the reading rules are also checked on ``load_generic_dataset``
directly.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("offline_hub")  # as the subprocess runs: HF_HUB_OFFLINE=1

from biomed_lm.errors import InputError  # noqa: E402
from biomed_lm.finetune.datasets import DatasetFormatError, load_generic_dataset  # noqa: E402
from biomed_lm.finetune.readers import RARE_LABEL_COUNT  # noqa: E402
from biomed_lm.finetune.trainer import RUN_RECORD  # noqa: E402
from tests import forked_main
from tests.conftest import REPO  # noqa: E402


def _write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _qa(label: str, n: int) -> str:
    return json.dumps({"id": f"q{n}", "question": f"does drug {n} work ?", "context": f"drug {n} was tried .",
                       "label": label})


def qa_dir(root: Path, train: list[str], test: list[str] | None = None) -> Path:
    """A generic QA dataset: one question per label given, ids in order."""
    _write(root / "train.jsonl", [_qa(label, n) for n, label in enumerate(train)])
    _write(root / "dev.jsonl", [_qa(label, 100 + n) for n, label in enumerate(["yes", "no"])])
    _write(root / "test.jsonl", [_qa(label, 200 + n) for n, label in enumerate(test or ["yes", "no", "maybe"])])
    return root


COMMON = ["yes", "no", "maybe"] * RARE_LABEL_COUNT  # every label seen RARE_LABEL_COUNT times: no warning


def _launch(*flags: str, as_process: bool = False) -> subprocess.CompletedProcess:
    if as_process:
        return forked_main.run_command([sys.executable, str(REPO / "launch" / "finetune.py"), *flags],
                                       env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
    from biomed_lm.launch.finetune import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(list(flags))
        except SystemExit as exit_:  # argparse's own refusals
            code = exit_.code
    return subprocess.CompletedProcess(["finetune.py", *flags], code, stdout.getvalue(), stderr.getvalue())


def _finetune(model: Path, data: Path, out: Path, *flags: str, task_type: str = "qa",
              as_process: bool = False) -> subprocess.CompletedProcess:
    return _launch("--model", str(model), "--dataset", "mine", "--task_type", task_type, "--data_dir", str(data),
                   "--output_dir", str(out), "--epochs", "1", "--batch_size", "4", "--max_length", "32", *flags,
                   as_process=as_process)


# ------------------------------------------------------------------------- through the command line

def test_a_rare_training_label_is_a_warning_naming_file_and_lines(tiny_bert, tmp_path):
    # line 5 of train.jsonl holds the typo; without --labels it still trains (the file defines the set)
    data = qa_dir(tmp_path / "qa", COMMON[:4] + ["perhaps"] + COMMON[4:])
    done = _finetune(tiny_bert, data, tmp_path / "out", as_process=True)
    assert done.returncode == 0, done.stderr[-3000:]
    warning = (f"warning: {data / 'train.jsonl'}: label 'perhaps' is seen in only 1 training example (line 5); "
               f"a label seen fewer than {RARE_LABEL_COUNT} times may be a typo")
    assert warning in done.stderr, done.stderr[-3000:]
    record = json.loads((tmp_path / "out" / RUN_RECORD).read_text(encoding="utf-8"))
    assert record["labels"] == ["maybe", "no", "perhaps", "yes"]
    assert any(w.startswith(f"{data / 'train.jsonl'}: label 'perhaps'") for w in record["dataset_warnings"])
    assert "--labels" in record["dataset_warnings"][0]


def test_labels_option_refuses_an_unlisted_label_in_any_split(tmp_path):
    data = qa_dir(tmp_path / "qa", COMMON[:4] + ["perhaps"] + COMMON[4:])
    done = _finetune(tmp_path / "no-model", data, tmp_path / "out", "--labels", "yes,no,maybe")
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"finetune: error: {data / 'train.jsonl'}, line 5: field 'label': unknown label 'perhaps' " \
           "(expected one of: yes, no, maybe)" in done.stderr and "Traceback" not in done.stderr
    data = qa_dir(tmp_path / "qa2", COMMON, test=["yes", "no", "Maybe"])
    done = _finetune(tmp_path / "no-model", data, tmp_path / "out", "--labels", "yes, no, maybe")
    assert done.returncode == 2 and f"{data / 'test.jsonl'}, line 3: field 'label': unknown label 'Maybe'" \
        in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "out").exists()  # nothing written, and the folder the refused run made is gone


def test_labels_option_fixes_the_model_label_order(tiny_bert, tmp_path):
    data = qa_dir(tmp_path / "qa", COMMON[:2])  # 'maybe' is never seen in training: the option still has it
    done = _finetune(tiny_bert, data, tmp_path / "out", "--labels", "no, maybe ,yes")
    assert done.returncode == 0, done.stderr[-3000:]
    # a stated label set is not second-guessed (a tiny model's one-label predictions may still be said)
    assert [line for line in done.stderr.splitlines()
            if "warning" in line and "every test prediction is" not in line] == []
    record = json.loads((tmp_path / "out" / RUN_RECORD).read_text(encoding="utf-8"))
    assert record["labels"] == ["no", "maybe", "yes"] and record["settings"]["labels"] == "no,maybe,yes"
    assert record["dataset_warnings"] == []


@pytest.mark.parametrize("flags, message", [
    (["--task_type", "similarity"], "--labels does not apply to similarity"),
    ([], "--labels applies to generic datasets"),
    (["--task_type", "qa", "--labels", "yes,,no"], "--labels: empty label"),
    (["--task_type", "qa", "--labels", "yes,no,yes"], "--labels: 'yes' is given twice"),
])
def test_labels_option_is_refused_where_it_cannot_apply(tmp_path, flags, message):
    data = _write(tmp_path / "d" / "train.tsv", ["a\tb\t1.0"]).parent
    if "--labels" not in flags:
        flags = [*flags, "--labels", "yes,no"]
    dataset = "gad" if "--task_type" not in flags else "mine"  # a BLURB name with a task_type: another refusal
    done = _launch("--model", str(tmp_path / "m"), "--dataset", dataset, "--data_dir", str(data), "--output_dir",
                   str(tmp_path / "out"), *flags)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr


def test_a_dataset_its_task_type_or_folder_contradicts_is_refused_naming_both(tmp_path):
    """QA: each was read as the reader expected and failed on NCBI-disease's train.tsv line 1 ("@GENE$
    placeholders"), a message about the file and not about the options."""
    ncbi = REPO / "data" / "blurb" / "NCBI-disease"
    common = ("--model", str(tmp_path / "m"), "--data_dir", str(ncbi), "--output_dir", str(tmp_path / "out"))
    done = _launch(*common, "--dataset", "ncbi-disease", "--task_type", "relation")
    assert done.returncode == 2 and "dataset 'ncbi-disease' is BLURB's ner dataset NCBI-disease, and task_type " \
        "relation reads data_dir as a generic relation dataset: drop task_type" in done.stderr, done.stderr[-2000:]
    done = _launch(*common, "--dataset", "gad")  # a config's data_dir (ncbi_disease.yaml) with another --dataset
    assert done.returncode == 2 and f"dataset 'gad', but data_dir {ncbi} is the folder of 'ncbi-disease'" \
        in done.stderr, done.stderr[-2000:]
    assert "(re/gad or gad or re/GAD or GAD under the BLURB data root)" in done.stderr
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------- the reading rules

def test_rare_label_threshold_and_lines(tmp_path):
    rows = ["a @X$ b @Y$\tcause"] * 5 + ["c @X$ d @Y$\tnone"] * RARE_LABEL_COUNT + ["e @X$ f @Y$\tcasue"] * 2
    train = _write(tmp_path / "re" / "train.tsv", rows)
    dataset = load_generic_dataset("relation", train.parent)
    assert dataset.warnings == [f"{train}: label 'casue' is seen in only 2 training examples (lines "
                                f"{len(rows) - 1}, {len(rows)}); a label seen fewer than {RARE_LABEL_COUNT} times "
                                "may be a typo: state the label set with --labels"]
    assert dataset.labels == ("casue", "cause", "none")
    assert load_generic_dataset("relation", train.parent, labels=["cause", "none", "casue"]).warnings == []


def test_rare_entity_types_and_multi_labels_are_warned_by_mention_and_document(tmp_path):
    mentions = ["aspirin\tB-Chem", "acid\tI-Chem", "", "x\tB-Chem", "", "y\tB-Chem", "z\tB-Chme", ""]
    _write(tmp_path / "ner" / "train.tsv", mentions)
    (warning,) = load_generic_dataset("ner", tmp_path / "ner").warnings
    assert "entity type 'Chme' is seen in only 1 training mention (line 7)" in warning
    docs = [json.dumps({"text": str(n), "labels": ["x", "y"] if n < 3 else ["y", "z"]}) for n in range(4)]
    _write(tmp_path / "doc" / "train.jsonl", docs)
    (warning,) = load_generic_dataset("classification", tmp_path / "doc").warnings
    assert "label 'z' is seen in only 1 training example (line 4)" in warning


def test_ner_labels_are_entity_types_in_the_order_given(tmp_path):
    _write(tmp_path / "ner" / "train.tsv", ["a\tB-Gene", "b\tI-Gene", "c\tB-Chem", "", "d\tO"])
    _write(tmp_path / "ner" / "test.tsv", ["e\tS-Chem", "f\tE-Chem"])
    dataset = load_generic_dataset("ner", tmp_path / "ner", labels=["Gene", "Chem", "Disease"])
    assert dataset.labels == ("O", "B-Gene", "I-Gene", "B-Chem", "I-Chem", "E-Chem", "S-Chem",
                              "B-Disease", "I-Disease")
    with pytest.raises(DatasetFormatError, match=r"train\.tsv, line 3: field 'tag': 'B-Chem': entity type 'Chem' "
                                                 r"is not one of the labels given \(Gene\)"):
        load_generic_dataset("ner", tmp_path / "ner", labels=["Gene"])
    _write(tmp_path / "ner" / "test.tsv", ["e\tB"])
    with pytest.raises(DatasetFormatError, match=r"test\.tsv, line 1: .*'B' names no entity type"):
        load_generic_dataset("ner", tmp_path / "ner", labels=["Gene", "Chem"])
    with pytest.raises(InputError, match="NER labels are entity types .* or every tag"):
        load_generic_dataset("ner", tmp_path / "ner", labels=["B-Gene", "I-Gene"])
