"""Corpus mixtures (pretrain/mixture.py): the document counts honour weights and epochs, the draw is
seeded, bad mixtures are refused naming the field and the input, create_pretraining_data builds
instances from a 2-input mixture and records it, and the ablation's corpus factor takes mixtures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from biomed_lm.config import parse_config  # noqa: E402
from biomed_lm.errors import ConfigError  # noqa: E402
from biomed_lm.pretrain.data import METADATA_FILE, load_pretraining_data  # noqa: E402
from biomed_lm.pretrain.instance_builder import PretrainingDataConfig, create_pretraining_data  # noqa: E402
from biomed_lm.pretrain.mixture import (apportion, default_total, document_counts, format_mixture,  # noqa: E402
                                        mixture_rows, open_mixture, parse_mixture)
from biomed_lm.pretrain.prepared_corpus import PretrainingDataError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


# ----------------------------------------------------------------------------- fixtures

def _documents(tag: str, count: int) -> list[list[str]]:
    """``count`` documents of 2-4 sentences whose words name the input and the document (``a7w2``)."""
    rng = np.random.default_rng(len(tag) * 1000 + count)
    return [[" ".join(f"{tag}{d}w{s}{k}" for k in range(int(rng.integers(2, 6))))
             for s in range(int(rng.integers(2, 5)))] for d in range(count)]


def _save_corpus(documents: list[list[str]], path: Path) -> str:
    import datasets

    datasets.Dataset.from_dict({"id": [str(i) for i in range(len(documents))], "sentences": documents,
                                "text": [" ".join(d) for d in documents]}).save_to_disk(str(path))
    return str(path)


def _save_tokenizer(documents: list[list[str]], path: Path) -> str:
    from tokenizers import Tokenizer, models

    from biomed_lm.tokenization.tokenizer_io import bert_pipeline, save_tokenizer_dir

    words = sorted({w for d in documents for s in d for w in s.split()})
    vocab = {token: i for i, token in enumerate(SPECIALS + words)}
    tokenizer = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tokenizer.add_special_tokens(SPECIALS)
    save_tokenizer_dir(bert_pipeline(tokenizer, lowercase=True), path, lowercase=True)
    return str(path)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    """Two prepared corpora, ``a`` (60 documents) and ``b`` (20), and a tokenizer for both."""
    root = tmp_path_factory.mktemp("mixture")
    a, b = _documents("a", 60), _documents("b", 20)
    return {"a": _save_corpus(a, root / "a"), "b": _save_corpus(b, root / "b"),
            "tokenizer": _save_tokenizer(a + b, root / "tok"), "root": str(root)}


def _build(inputs, out: Path, mixture: dict, **options) -> dict:
    config = PretrainingDataConfig(mixture=mixture, tokenizer=inputs["tokenizer"], output_dir=str(out), num_proc=1,
                                   max_seq_length=32, **options)
    return create_pretraining_data(config, progress=False)


# ----------------------------------------------------------------------------- counts (pure)

@pytest.mark.parametrize("weights", [(0.7, 0.3), (0.5, 0.25, 0.25), (1, 2, 3, 4), (0.013, 0.987)])
def test_weights_are_honoured_within_two_percent_over_10000_documents(weights):
    counts = document_counts([500, 40_000, 7, 3][:len(weights)], weights=weights, total=10_000)
    assert sum(counts) == 10_000
    for count, weight in zip(counts, weights):
        assert abs(count / 10_000 - weight / sum(weights)) <= 0.02
        assert abs(count - 10_000 * weight / sum(weights)) <= 1  # largest remainder: exact to a document


def test_drawn_rows_honour_the_weights_and_cover_inputs_evenly():
    sizes, counts = [3_000, 500], document_counts([3_000, 500], weights=[0.7, 0.3], total=10_000)
    rows = mixture_rows(sizes, counts, seed=1)
    from_b = int((rows >= 3_000).sum())
    assert len(rows) == 10_000 and abs(from_b / 10_000 - 0.3) <= 0.02
    repeats = np.bincount(rows[rows >= 3_000] - 3_000, minlength=500)
    assert repeats.max() - repeats.min() <= 1  # b's 500 documents 6 times each, a random 0 of them a 7th


def test_default_total_draws_the_largest_share_input_once():
    assert default_total([1_000, 200], [0.7, 0.3]) == round(1_000 / 0.7)
    counts = document_counts([1_000, 200], weights=[0.7, 0.3])
    assert counts[0] == 1_000 and counts[1] == round(1_000 / 0.7 * 0.3)
    assert apportion(10, [1, 1, 1]) == [4, 3, 3]


def test_epochs_mode_counts_and_repeats():
    assert document_counts([100, 30], epochs=[2, 0.5]) == [200, 15]
    rows = mixture_rows([100, 30], [200, 15], seed=3)
    assert np.array_equal(np.bincount(rows[rows < 100], minlength=100), np.full(100, 2))
    b = rows[rows >= 100]
    assert len(b) == 15 and len(set(b.tolist())) == 15  # half of b, no document twice
    with pytest.raises(PretrainingDataError, match="mixture_documents applies to weights"):
        document_counts([100, 30], epochs=[1, 1], total=50)


def test_rows_are_deterministic_for_a_seed():
    first = mixture_rows([50, 20], [40, 30], seed=7)
    assert np.array_equal(first, mixture_rows([50, 20], [40, 30], seed=7))
    assert not np.array_equal(first, mixture_rows([50, 20], [40, 30], seed=8))


# ----------------------------------------------------------------------------- validation

@pytest.mark.parametrize("spec, pattern", [
    ({}, r"mixture must map input names"),
    ({"a": {"corpus": "x", "weight": 0}}, r"mixture\.a\.weight must be a positive number, not 0"),
    ({"a": {"corpus": "x", "weight": -0.5}}, r"mixture\.a\.weight must be a positive number"),
    ({"a": {"corpus": "x", "epochs": True}}, r"mixture\.a\.epochs must be a positive number"),
    ({"a": {"corpus": "x", "wieght": 1}},
     r"mixture\.a: unknown key\(s\) wieght \(did you mean weight\?\); valid: corpus, weight, epochs"),
    ({"a": {"weight": 1}}, r"mixture\.a\.corpus is required"),
    ({"a": {"corpus": "x"}}, r"mixture\.a: give exactly one of weight or epochs"),
    ({"a": {"corpus": "x", "weight": 1, "epochs": 1}}, r"mixture\.a: give exactly one of weight or epochs"),
    ({"a": {"corpus": "x", "weight": 1}, "b": {"corpus": "y", "epochs": 2}},
     r"weight and epochs are exclusive.*a weight, b epochs"),
    ({"a": "x"}, r"mixture\.a must be a mapping"),
])
def test_bad_mixtures_name_the_field_and_the_input(spec, pattern):
    with pytest.raises(PretrainingDataError, match=pattern):
        parse_mixture(spec)


def test_missing_corpus_dir_names_the_input(tmp_path, inputs):
    with pytest.raises(PretrainingDataError, match=r"mixture\.pmc\.corpus: corpus not found: .*nowhere"):
        open_mixture({"a": {"corpus": inputs["a"], "weight": 1}, "pmc": {"corpus": str(tmp_path / "nowhere"),
                                                                           "weight": 1}}, seed=1)


def test_corpus_and_mixture_are_exclusive(tmp_path, inputs):
    base = dict(tokenizer=inputs["tokenizer"], output_dir=str(tmp_path / "o"))
    with pytest.raises(PretrainingDataError, match="exactly one of corpus or mixture, not both"):
        PretrainingDataConfig(corpus=inputs["a"], mixture={"a": {"corpus": inputs["a"], "weight": 1}},
                              **base).validate()
    with pytest.raises(PretrainingDataError, match="no corpus given"):
        PretrainingDataConfig(**base).validate()
    with pytest.raises(PretrainingDataError, match="mixture_documents needs a mixture"):
        PretrainingDataConfig(corpus=inputs["a"], mixture_documents=10, **base).validate()


def test_yaml_mixture_through_the_cli_parser(tmp_path, inputs):
    path = tmp_path / "data.yaml"
    path.write_text(yaml.safe_dump({"mixture": {"a": {"corpus": inputs["a"], "weight": 0.7},
                                                "b": {"corpus": inputs["b"], "weight": 0.3}},
                                    "mixture_documents": 100, "tokenizer": "t", "output_dir": "o"}))
    (config,) = parse_config([PretrainingDataConfig], ["--config", str(path)])
    assert config.mixture["b"]["weight"] == 0.3 and config.mixture_documents == 100 and config.corpus == ""


# ----------------------------------------------------------------------------- end to end

def test_two_input_mixture_end_to_end_records_the_mixture(tmp_path, inputs):
    mixture = {"a": {"corpus": inputs["a"], "weight": 0.75}, "b": {"corpus": inputs["b"], "weight": 0.25}}
    metadata = _build(inputs, tmp_path / "out", mixture, mixture_documents=80)
    recorded = json.loads((tmp_path / "out" / METADATA_FILE).read_text())["mixture"]
    assert recorded["mode"] == "weight" and recorded["documents"] == 80 == metadata["corpus_documents"]
    assert [(i["name"], i["weight"], i["documents"], i["documents_drawn"]) for i in recorded["inputs"]] == \
        [("a", 0.75, 60, 60), ("b", 0.25, 20, 20)]
    assert recorded["inputs"][0]["corpus"] == str(Path(inputs["a"]).resolve())
    assert metadata["corpus"].startswith("mixture: a=")
    assert format_mixture(recorded) == "  mixture: a 60 of 60 (weight 0.75), b 20 of 20 (weight 0.25)"
    dataset, loaded = load_pretraining_data(tmp_path / "out", tokenizer=inputs["tokenizer"])
    assert loaded["mixture"] == recorded  # what the pretraining run records (trainer's data_meta)
    tokenizer_vocab = json.loads((Path(inputs["tokenizer"]) / "tokenizer.json").read_text())["model"]["vocab"]
    by_id = {i: t for t, i in tokenizer_vocab.items()}
    firsts = [by_id[row[1]][0] for row in dataset["input_ids"]]  # the first word's input: a... or b...
    assert {"a", "b"} <= set(firsts)


def test_mixture_instances_are_deterministic_for_a_seed(tmp_path, inputs):
    mixture = {"a": {"corpus": inputs["a"], "epochs": 0.5}, "b": {"corpus": inputs["b"], "epochs": 2}}
    runs = {name: _build(inputs, tmp_path / name, mixture, seed=seed)
            for name, seed in (("one", 1), ("again", 1), ("other", 2))}
    assert runs["one"]["mixture"]["documents"] == 30 + 40

    def ids(name):
        import datasets

        return datasets.load_from_disk(str(tmp_path / name))["input_ids"]

    assert ids("one") == ids("again")
    assert ids("one") != ids("other")


# ----------------------------------------------------------------------------- the ablation factor

def test_ablation_config_expands_the_corpus_factor_into_mixture_variants(tmp_path, monkeypatch):
    from biomed_lm.experiments import ablation
    from biomed_lm.experiments.ablation import load_ablation_config, plan_variants

    config = load_ablation_config(REPO / "configs/ablation/corpus_tiny.yaml",
                                  overrides={"output_dir": str(tmp_path / "out")})
    variants, notes = plan_variants(config.factors)
    assert [v.name for v in variants] == ["pubmed", "pubmed+pmc"] and not notes
    assert config.corpus_inputs("pubmed+pmc") == ["pubmed", "pmc"] and config.corpus_inputs("pubmed") == ["pubmed"]
    commands = []
    monkeypatch.setattr(ablation, "_run",
                        lambda title, command, log, env=None, refused_hint="": commands.append(command))
    paths = ablation._Paths(tmp_path / "out")
    ablation._prepare_corpora(config, variants, paths, print)
    assert sorted(c[c.index("--output-dir") + 1].rsplit("/", 1)[1] for c in commands) == ["pmc", "pubmed"]
    commands.clear()
    tokenizers = ablation._build_vocabularies(config, variants, paths, print)
    mixed_vocab = next(c for c in commands if c[c.index("--output-dir") + 1].endswith("in-domain-pubmed+pmc"))
    assert mixed_vocab[mixed_vocab.index("--inputs") + 1:][:2] == [str(paths.corpus("pubmed")),
                                                                   str(paths.corpus("pmc"))]
    commands.clear()
    ablation._create_instances(config, variants, tokenizers, config.pretrain.phases(), paths, print)
    plain, mixed = sorted(commands, key=lambda c: "--corpus" not in c)
    assert plain[plain.index("--corpus") + 1] == str(paths.corpus("pubmed"))
    data_config = yaml.safe_load(Path(mixed[mixed.index("--config") + 1]).read_text())
    assert "corpus" not in data_config and data_config["max_seq_length"] == 128
    assert data_config["mixture"] == {"pubmed": {"corpus": str(paths.corpus("pubmed")), "epochs": 1},
                                      "pmc": {"corpus": str(paths.corpus("pmc")), "epochs": 1}}
    (config_parsed,) = parse_config([PretrainingDataConfig], mixed[2:])  # create_pretraining_data.py's flags
    assert config_parsed.mixture == data_config["mixture"] and config_parsed.corpus == ""


def _ablation_yaml(tmp_path: Path, **changes) -> Path:
    values = yaml.safe_load((REPO / "configs/ablation/corpus_tiny.yaml").read_text())
    values.update(changes)
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.mark.parametrize("mixtures, pattern", [
    ({"pubmed": {"pmc": {"weight": 1}}}, r"mixtures\.pubmed: the name is a corpus's too"),
    ({"m": {"pmx": {"weight": 1}}}, r"mixtures\.m\.pmx: not a corpus of 'corpora'"),
    ({"m": {"pmc": {"weight": -1}}}, r"mixtures\.m\.pmc\.weight must be a positive number"),
    ({"m": {"pmc": {"corpus": "x", "weight": 1}}}, r"mixtures\.m\.pmc\.corpus is set by the ablation"),
    ({"m": {"pmc": 0.3}}, r"mixtures\.m\.pmc must be \{weight: W\}"),
])
def test_ablation_mixture_errors_name_the_file_and_key(tmp_path, mixtures, pattern):
    from biomed_lm.experiments.ablation import load_ablation_config

    with pytest.raises(ConfigError, match=r"a\.yaml: " + pattern):
        load_ablation_config(_ablation_yaml(tmp_path, mixtures=mixtures))


def test_ablation_unknown_corpus_level_lists_the_mixtures(tmp_path):
    from biomed_lm.experiments.ablation import load_ablation_config

    path = _ablation_yaml(tmp_path, factors={"corpus": ["pubmed", "pubmed+pmx"]})
    with pytest.raises(ConfigError, match=r"factors\.corpus: unknown level 'pubmed\+pmx'; valid: .*pmc.*, "
                                          r"pubmed\+pmc$"):  # the corpora, then the mixtures
        load_ablation_config(path)
