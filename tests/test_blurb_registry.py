"""The BLURB registry (finetune/blurb.py) is the one place a dataset is spelled, and what it holds is
consistent with the readers, metrics, sweep and adapters that read it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from biomed_lm.finetune import blurb
from biomed_lm.finetune.blurb import (BLURB, BLURB_DATASETS, TASK_TYPES, UnknownDatasetError, blurb_entry,
                                      canonical_dataset_name, name_key, spellings)

REPO = Path(__file__).resolve().parents[1]
# The folders installed as biomed_lm's packages (setup.py PACKAGE_DIRS) that hold code, and launch/.
CODE_FOLDERS = ("biomed_lm", "tokenization", "pretrain", "finetune", "experiments", "launch")
REGISTRY = REPO / "finetune" / "blurb.py"
# Literals that name a committed data file by its path, as a config or a doc would: not a fact about
# the dataset (they say where a file lies). Each with its reason.
ALLOWED = {
    ("launch/demo.py", "NCBI-disease=data/blurb/NCBI-disease/test.tsv"):
        "the demo's coverage-report command line names the committed sample file",
}


def _spelling_keys() -> dict[str, str]:
    """Every spelling the registry knows (name, title, aliases, directory names), squashed, -> dataset."""
    return {name_key(s): name for name in BLURB_DATASETS for s in spellings(name)}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def dataset_literals(path: Path, keys: dict[str, str]) -> list[str]:
    """``file:line: 'literal' (dataset)`` for each string literal of ``path`` that spells a BLURB dataset:
    the whole string, or one ``/``-separated part of a string without spaces (a path such as
    ``"ner/NCBI-disease"``), compared with case, spaces, ``-`` and ``_`` ignored. Docstrings are prose
    and are not searched; neither is the text
    around a name inside a longer message (``"... (ncbi-disease, gad, ...)"``), which documents."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skip = _docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in skip:
            continue
        if (str(path.relative_to(REPO)), node.value) in ALLOWED:
            continue
        parts = [node.value] if any(c.isspace() for c in node.value) else [node.value, *node.value.split("/")]
        for part in parts:
            if name_key(part) in keys:
                where = f"{path.relative_to(REPO)}:{node.lineno}"
                hits.append(f"{where}: {node.value!r} ({keys[name_key(part)]})")
                break
    return sorted(hits, key=lambda hit: int(hit.split(":")[1]))


def test_no_dataset_name_outside_the_registry():
    keys = _spelling_keys()
    files = [p for folder in CODE_FOLDERS for p in sorted((REPO / folder).rglob("*.py")) if p != REGISTRY]
    assert len(files) > 50
    hits = [hit for path in files for hit in dataset_literals(path, keys)]
    assert not hits, "BLURB dataset names spelled outside finetune/blurb.py:\n" + "\n".join(hits)


def test_the_name_check_finds_what_it_should(tmp_path):
    keys = _spelling_keys()
    sample = REPO / "tests" / "_sample_for_name_check.py"
    sample.write_text('"""Docstrings may name NCBI-disease."""\n'
                      'a = "ncbi-disease"\nb = {"EBM_NLP": 1}\nc = "ner/BC5CDR-chem"\n'
                      'd = f"{a}: the GAD file"\ne = "sentence"\ng = "bioasq-yesno-proxy"\n'
                      'h = "e.g. bioasq=/data/x"\n', encoding="utf-8")
    try:
        hits = dataset_literals(sample, keys)
    finally:
        sample.unlink()
    assert [h.split(": ", 1)[0].rsplit(":", 1)[1] for h in hits] == ["2", "3", "4", "7"]


def test_one_canonical_name_with_every_alias():
    assert canonical_dataset_name("BC5CDR_chemical") == "bc5-chem"
    assert canonical_dataset_name("EBM PICO") == canonical_dataset_name("EBM-NLP") == "ebm-pico"
    assert canonical_dataset_name("BIOSESSES") == "biosses"  # the paper's Table 6 spelling
    assert canonical_dataset_name("hallmarks of cancer") == "hoc"
    assert canonical_dataset_name("BioASQ-yesno-proxy") == "bioasq"
    for name in BLURB_DATASETS:
        assert all(canonical_dataset_name(s) == name for s in spellings(name))
    with pytest.raises(UnknownDatasetError, match="unknown BLURB dataset 'mednli'; valid names: bc5-chem"):
        canonical_dataset_name("mednli")
    # no spelling names two datasets
    keys = [name_key(s) for name in BLURB_DATASETS for s in set(map(name_key, spellings(name)))]
    assert len(keys) == len(set(keys))


def test_registry_entries_are_complete_and_consistent():
    from biomed_lm.finetune.adapters import ADAPTERS
    from biomed_lm.finetune.metrics import METRICS
    from biomed_lm.finetune.readers import GENERIC_FORMATS, LOADERS
    from biomed_lm.finetune.sweep import PROTOCOL

    assert len(BLURB) == 13 and tuple(blurb.BLURB_TASK_TYPES) == TASK_TYPES
    assert tuple(ADAPTERS) == TASK_TYPES == tuple(GENERIC_FORMATS)
    assert tuple(PROTOCOL) == BLURB_DATASETS
    for entry in BLURB.values():
        assert entry.loader in LOADERS and entry.metric in METRICS and entry.task_type in TASK_TYPES
        assert entry.epochs >= 1 and entry.num_seeds >= 1 and entry.directories
        assert PROTOCOL[entry.name].epochs == entry.epochs
        assert entry.negative_label is None or entry.negative_label == entry.labels[0]
        if entry.task_type == blurb.RELATION:
            assert entry.type_map is not None and entry.placeholder_pair is not None
        if entry.task_type == blurb.NER:
            assert entry.entity_type and entry.source_types
    assert blurb_entry("Hallmarks_of_Cancer").labels == blurb.HOC_HALLMARKS


def test_every_entry_names_the_layouts_of_its_files():
    """The layouts are tokenization's (shared with the coverage report); the registry says which a
    dataset's files have, and a former --dataset-format name stands for one of them."""
    from biomed_lm.tokenization.blurb_files import FILE_LAYOUTS, detect_file_layout

    for entry in BLURB.values():
        assert entry.file_layouts and set(entry.file_layouts) <= set(FILE_LAYOUTS), entry.name
    assert set(blurb.FORMER_LAYOUT_NAMES.values()) == set(FILE_LAYOUTS)
    assert {former: blurb.file_layout_name(former) for former in ("ner", "gad")} == \
        {"ner": "token_tags", "gad": "sentence_label_tsv"}
    assert blurb.file_layout_name("yesno_tsv") == "yesno_tsv"
    shipped = sorted((REPO / "data" / "blurb" / "NCBI-disease").glob("*.tsv"))
    assert shipped and {detect_file_layout(path) for path in shipped} == set(blurb_entry("ncbi-disease").file_layouts)


def test_the_registry_imports_without_torch_or_readers():
    import subprocess
    import sys

    code = ("import sys; import biomed_lm.finetune.blurb, biomed_lm.finetune.metrics; "
            "print('torch' in sys.modules, 'biomed_lm.finetune.readers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
