"""Pretraining model families (pretrain/families.py): BERT, ALBERT and RoBERTa built from presets, a
forward and backward on a collated batch per family and pair task, the pair head's classes, the
refusals of combinations that cannot work, ALBERT's honest FLOPs, the DRP export and its head, ALBERT
continual pretraining from a saved ALBERT, and a short end-to-end run per family through the real
trainer whose export loads with the family's transformers class and AutoModel.

Data with another pair task than the pipeline's default NSP is made here by rewriting a made
dataset's pair labels and its metadata's ``pair_task`` (:func:`pair_task_data`), so these tests do
not depend on how pretrain/instance_recipe.py draws SOP or DRP pairs."""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch

from biomed_lm.pretrain.adversarial import AdversarialConfig, AdversarialPretrainingModel
from biomed_lm.pretrain.config import PretrainConfigError, load_model_preset
from biomed_lm.pretrain.families import (ALBERT, BERT, FAMILIES, PAIR_CLASSES, PAIR_HEAD_FILE, ROBERTA, family_of,
                                         get_family, pair_task_of, resolve_pair_objective)
from biomed_lm.pretrain.flops import embedding_multiply_adds_per_token, step_flops
from biomed_lm.pretrain.masking import MaskingConfig, PretrainingCollator
from biomed_lm.pretrain.modeling import PretrainingModel, count_parameters
from biomed_lm.token_types import takes_token_type_ids
from tests.pretrain_runs import losses, pretrain_args, run, with_option

pytestmark = pytest.mark.usefixtures("offline_hub")

VOCAB, PAD, CLS, SEP, MASK = 120, 0, 2, 3, 4
PRESETS = {"bert": "bert-tiny", "albert": "albert-tiny", "roberta": "bert-tiny"}
#: (architecture, pair task) pairs the families' heads take
TAKEN = [("bert", "nsp"), ("bert", "sop"), ("bert", "drp"), ("bert", "none"), ("albert", "sop"), ("albert", "nsp"),
         ("albert", "none"), ("roberta", "none")]
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def build(architecture: str, pair_task: str | None = None, seed: int = 0, vocab: int = VOCAB, **overrides):
    family = get_family(architecture)
    preset = PRESETS[architecture]
    fields = {**family.preset_fields(load_model_preset(preset), preset), **overrides}
    torch.manual_seed(seed)
    return family.build(fields, vocab, PAD, attn_implementation="eager", pair_task=pair_task)


def collated_batch(pair_task: str, seed: int = 0, lengths=(40, 17, 33, 9), pad: int = PAD,
                   word_start_rate: float = 1.0) -> dict[str, torch.Tensor]:
    """A masked, padded micro-batch of [CLS] A [SEP] B [SEP] pairs with labels of ``pair_task``
    (``word_start_rate``: the share of pieces that start a word; below 1, whole-word masking spans pieces)."""
    g = torch.Generator().manual_seed(seed)
    classes = PAIR_CLASSES[pair_task]
    rows = []
    for i, n in enumerate(lengths):
        body = torch.randint(10, VOCAB, (n - 3,), generator=g).tolist()
        cut = max(1, (n - 3) // 2)
        starts = [1] * n if word_start_rate >= 1 else (torch.rand(n, generator=g) < word_start_rate).long().tolist()
        rows.append({"input_ids": [CLS, *body[:cut], SEP, *body[cut:], SEP],
                     "token_type_ids": [0] * (cut + 2) + [1] * (n - cut - 2),
                     "word_starts": starts, "next_sentence_label": i % classes if classes else -100})
    collator = PretrainingCollator(pad_token_id=pad, cls_token_id=CLS, sep_token_id=SEP, mask_token_id=MASK,
                                   vocab_size=VOCAB, config=MaskingConfig(mlm_probability=0.3))
    return dict(collator(rows, generator=torch.Generator().manual_seed(seed + 1)))


# --- building from presets ------------------------------------------------------------------------

@pytest.mark.parametrize("architecture", list(FAMILIES))
def test_each_family_builds_from_a_preset(architecture):
    model = build(architecture)
    family = family_of(model.config)
    assert family is get_family(architecture)
    assert type(model).__name__ == family.model_class and model.config.architectures == [family.model_class]
    assert model.config.vocab_size == VOCAB and model.config.pad_token_id == PAD
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied decoder
    if architecture == "albert":
        assert model.config.embedding_size == 32 and model.get_input_embeddings().weight.shape == (VOCAB, 32)
        assert len(model.albert.encoder.albert_layer_groups) == 1  # both layers share one group
    if architecture == "roberta":  # positions start after the padding id: 512 usable + pad id + 1
        assert model.config.max_position_embeddings == 512 + PAD + 1 and model.config.type_vocab_size == 1
        assert family.usable_positions(model.config) == 512


@pytest.mark.parametrize("preset, shape, published", [
    ("albert-base", (12, 768, 12, 128, 3072), 12_000_000),   # ALBERT paper, Table 1 (BioALBERT's Table 3 too)
    ("albert-large", (24, 1024, 16, 128, 4096), 18_000_000),
])
def test_albert_presets_are_the_papers_shapes(preset, shape, published):
    fields = ALBERT.preset_fields(load_model_preset(preset), preset)
    assert (fields["num_hidden_layers"], fields["hidden_size"], fields["num_attention_heads"],
            fields["embedding_size"], fields["intermediate_size"]) == shape
    model = ALBERT.build(fields, 30_000, 0)  # the paper's 30k SentencePiece vocabulary
    assert abs(count_parameters(model.albert) - published) <= 0.03 * published


def test_presets_are_validated_against_the_family_config_class(tmp_path):
    path = tmp_path / "albert.yaml"
    path.write_text("model_type: albert\nembeding_size: 64\n", encoding="utf-8")
    with pytest.raises(PretrainConfigError, match=r"'embeding_size' is not a AlbertConfig field; did you mean "
                                                  r"embedding_size"):
        load_model_preset(str(path))
    path.write_text("embedding_size: 64\nhidden_size: 128\n", encoding="utf-8")  # no model_type: BERT's fields
    with pytest.raises(PretrainConfigError, match="'embedding_size' is not a BertConfig field"):
        load_model_preset(str(path))
    path.write_text("model_type: albert\nnum_hidden_layers: 2\nnum_hidden_groups: 3\n", encoding="utf-8")
    with pytest.raises(PretrainConfigError, match="num_hidden_groups 3 is more than num_hidden_layers 2"):
        load_model_preset(str(path))
    path.write_text("model_type: albert\nembedding_size: 0\n", encoding="utf-8")
    with pytest.raises(PretrainConfigError, match="embedding_size: 0 is out of range"):
        load_model_preset(str(path))
    path.write_text("model_type: albart\n", encoding="utf-8")
    with pytest.raises(PretrainConfigError, match="model_type 'albart' is not a transformers model type"):
        load_model_preset(str(path))
    with pytest.raises(PretrainConfigError, match="describes an albert model .* pass --architecture albert"):
        BERT.preset_fields(load_model_preset("albert-tiny"), "albert-tiny")
    with pytest.raises(PretrainConfigError, match="pass --architecture bert"):
        ALBERT.preset_fields(load_model_preset("bert-tiny"), "bert-tiny")
    assert ROBERTA.preset_fields(load_model_preset("bert-base"), "bert-base") == load_model_preset("bert-base")


# --- forward and backward, the pair head ----------------------------------------------------------

@pytest.mark.parametrize("architecture, token_types, factorized", [
    ("bert", True, False), ("albert", True, True), ("roberta", False, False)])
def test_token_types_follow_the_shared_rule_and_only_albert_factorizes(architecture, token_types, factorized):
    family, config = get_family(architecture), build(architecture).config
    assert family.takes_token_type_ids(config) is token_types  # RoBERTa: one token type (its fixed_fields)
    assert token_types == takes_token_type_ids(family.segment_embeddings, config.type_vocab_size)
    assert family.factorized_embeddings is factorized  # what pretrain.flops counts the E→H projection of
    assert (embedding_multiply_adds_per_token(config) > 0) is factorized


@pytest.mark.parametrize("architecture, pair_task", TAKEN)
def test_forward_backward_on_a_collated_batch(architecture, pair_task):
    family = get_family(architecture)
    model = PretrainingModel(build(architecture, pair_task), train_pair=pair_task != "none", attention="hf_sdpa")
    batch = collated_batch(pair_task)
    out = model(**batch)
    out.loss.backward()
    assert torch.isfinite(out.loss) and out.mlm_count > 0
    labelled = int((batch["next_sentence_label"] != -100).sum())
    assert int(out.pair_count) == (labelled if family.pair_head is not None else 0)
    assert (out.pair_loss > 0) == (pair_task != "none" and family.pair_head is not None)
    encoder = family.encoder_of(model.hf_model)
    assert encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    if pair_task != "none":
        assert model.hf_model.get_submodule(family.pair_classifier).weight.grad.abs().sum() > 0


@pytest.mark.parametrize("architecture, pair_task, classes, recorded", [
    ("bert", "nsp", 2, None), ("bert", "sop", 2, "sop"), ("bert", "drp", 3, "drp"), ("bert", "none", 2, None),
    ("albert", "sop", 2, None), ("albert", "nsp", 2, "nsp"), ("albert", "none", 2, None), ("roberta", "none", 0, None)])
def test_the_pair_head_has_the_tasks_classes(architecture, pair_task, classes, recorded):
    family = get_family(architecture)
    model = build(architecture, pair_task)
    assert family.pair_classes_of(model) == classes
    objective = resolve_pair_objective(family, {"pair_task": pair_task, "pair_classes": PAIR_CLASSES[pair_task]},
                                       train_pair=pair_task != "none" or family.pair_head is None)
    assert objective.classes == classes and objective.trained == (pair_task != "none")
    if family.pair_head is not None:
        pooled = torch.randn(5, model.config.hidden_size)
        assert family.pair_head_of(model)(pooled).shape == (5, classes)
    # recorded in the config only when it is not the class's own task (BERT+NSP exports stay as they were)
    assert getattr(model.config, "pair_task", None) == recorded
    assert getattr(model.config, "pair_classes", None) == (3 if pair_task == "drp" else None)


def test_drp_runs_unpadded_as_it_runs_padded():
    """BERT's unpadded path takes the 3-way head as it is: the same losses and gradients as transformers'
    padded forward (dropout off)."""
    bert = build("bert", "drp", **NO_DROPOUT)
    batch = collated_batch("drp", seed=3)
    results = []
    for attention in ("hf_eager", "sdpa_loop"):
        model = PretrainingModel(copy.deepcopy(bert), attention=attention)
        out = model(**batch)
        out.loss.backward()
        results.append((out, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (padded, grads_p), (unpadded, grads_u) = results
    assert torch.allclose(padded.pair_loss, unpadded.pair_loss, atol=1e-5) and int(unpadded.pair_count) == 4
    assert torch.allclose(padded.loss, unpadded.loss, atol=1e-5)
    for name, grad in grads_p.items():
        assert torch.allclose(grad, grads_u[name], atol=1e-5), name


@pytest.mark.parametrize("architecture", ["albert", "roberta"])
def test_alum_runs_on_the_padded_forward_of_each_family(architecture):
    pair_task = "sop" if architecture == "albert" else "none"
    model = AdversarialPretrainingModel(build(architecture, pair_task), train_pair=pair_task != "none",
                                        adversarial=AdversarialConfig(adversarial=True), attention="hf_sdpa")
    out = model(**collated_batch(pair_task))
    out.loss.backward()
    assert torch.isfinite(out.loss) and out.adv_kl > 0 and int(out.adv_nonfinite) == 0


# --- refusals -------------------------------------------------------------------------------------

@pytest.mark.parametrize("architecture, pair_task, fragments", [
    ("albert", "drp", ["architecture albert", "pair task drp (3 classes)", "sop, nsp", "--architecture bert"]),
    ("roberta", "nsp", ["architecture roberta", "pair task nsp", "no pair head", "--no-train-pair"]),
    ("roberta", "sop", ["architecture roberta", "pair task sop", "pair_task none"]),
    ("roberta", "drp", ["architecture roberta", "pair task drp", "--architecture bert"]),
    ("bert", "none", ["without sentence pairs", "--no-train-pair"]),
    ("albert", "none", ["without sentence pairs", "--no-train-pair"]),
])
def test_impossible_pair_tasks_are_refused(architecture, pair_task, fragments):
    with pytest.raises(PretrainConfigError) as err:
        resolve_pair_objective(get_family(architecture), {"pair_task": pair_task}, train_pair=True, source="data/x")
    for fragment in fragments:
        assert fragment in str(err.value), (fragment, str(err.value))
    objective = resolve_pair_objective(get_family(architecture), {"pair_task": pair_task}, train_pair=False)
    assert objective.task == "none" and objective.data_task == pair_task  # --no-train-pair: MLM only, always possible


def test_the_pair_task_of_data_written_before_pair_task():
    assert pair_task_of({"nsp": True}) == "nsp" and pair_task_of({"nsp": False}) == "none"
    assert pair_task_of({"nsp": False, "pair_task": "sop", "pair_classes": 2}) == "sop"
    with pytest.raises(PretrainConfigError, match="'xyz' is not one of nsp, sop, drp, none"):
        pair_task_of({"pair_task": "xyz"})
    with pytest.raises(PretrainConfigError, match="pair_task drp with 2 classes"):
        pair_task_of({"pair_task": "drp", "pair_classes": 2})
    # RoBERTa on MLM-only data, --train-pair default
    assert resolve_pair_objective(ROBERTA, {"nsp": False}).task == "none"


@pytest.mark.parametrize("architecture", ["bert", "albert", "roberta"])
def test_every_family_takes_the_unpadded_kernels_and_compile(architecture):
    """Every family has the unpadded path (tests/test_unpadded_families.py checks its numbers): auto
    passes through to the kernel choice, unpadded kernels and --compile on are taken."""
    family = get_family(architecture)
    assert family.unpadded
    assert family.resolve_attention("auto", "auto") == ("auto", [])
    assert family.resolve_attention("hf_eager", "off") == ("hf_eager", [])
    assert family.resolve_attention("varlen", "on") == ("varlen", [])
    assert PretrainingModel(build(architecture), attention="sdpa_loop").unpadded


# --- FLOPs ----------------------------------------------------------------------------------------

def test_albert_flops_count_what_runs():
    """step_flops for ALBERT equals torch's FlopCounterMode on AlbertForPreTraining's forward + backward
    (eager attention; MLM head on the masked positions, SOP head on the pooled [CLS]): every layer of
    the shared group, the E→H embedding projection, and the H→E→V head."""
    from torch.utils.flop_counter import FlopCounterMode

    model = build("albert", "sop", **NO_DROPOUT)
    lengths, masked = [7, 19, 32], [1, 3, 5]
    with FlopCounterMode(display=False) as counter:
        for n, m in zip(lengths, masked):
            ids = torch.randint(5, VOCAB, (1, n))
            out = model.albert(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))
            logits = model.predictions(out.last_hidden_state[0, :m])
            sop = model.sop_classifier(out.pooler_output)
            loss = torch.nn.functional.cross_entropy(logits, torch.randint(0, VOCAB, (m,))) \
                + torch.nn.functional.cross_entropy(sop, torch.zeros(1, dtype=torch.long))
            loss.backward()
    assert {str(op) for op in counter.get_flop_counts()["Global"]} <= {"aten.addmm", "aten.mm", "aten.bmm"}
    assert step_flops(model.config, lengths, sum(masked), len(lengths)) == counter.get_total_flops()
    bert_shaped = copy.copy(model.config)
    bert_shaped.model_type = "bert"  # what a BERT-shaped count would say: less than what runs here
    assert step_flops(bert_shaped, lengths, sum(masked), len(lengths)) != counter.get_total_flops()


def test_drp_head_flops_count_three_classes():
    bert = build("bert", "drp")
    nsp = build("bert", "nsp")
    difference = step_flops(bert.config, [10, 20], 3, 2) - step_flops(nsp.config, [10, 20], 3, 2)
    assert difference == 3 * 2 * 2 * bert.config.hidden_size  # 3 passes × 2 FLOPs × 2 sequences × one more row


# --- exports and continual pretraining ------------------------------------------------------------

@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    """A small WordPiece tokenizer (the toolkit's own builder) and its directory."""
    from biomed_lm.tokenization.tokenizer_io import load_tokenizer
    from biomed_lm.tokenization.vocab import VocabConfig, build_vocab
    from tests.conftest import SAMPLE_DIR

    out = tmp_path_factory.mktemp("vocab") / "wp"
    build_vocab([str(SAMPLE_DIR / "sywada_PubMedAbstract_1MB.txt")], out, VocabConfig(vocab_size=1000))
    return load_tokenizer(out), out


def test_drp_export_loads_and_continual_init_restores_its_head(tmp_path, wordpiece):
    from transformers import AutoModel, BertForMaskedLM, BertForPreTraining

    from biomed_lm.pretrain.initialization import initialize_model

    tokenizer, _ = wordpiece
    model = build("bert", "drp", vocab=len(tokenizer))
    export = tmp_path / "drp"
    BERT.export(model, tokenizer, export)
    config = json.loads((export / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"] and config["pair_task"] == "drp" \
        and config["pair_classes"] == 3
    assert (export / PAIR_HEAD_FILE).is_file()
    masked_lm = BertForMaskedLM.from_pretrained(export)
    assert torch.equal(masked_lm.bert.embeddings.word_embeddings.weight, model.bert.embeddings.word_embeddings.weight)
    encoder = AutoModel.from_pretrained(export)
    assert torch.equal(encoder.pooler.dense.weight, model.bert.pooler.dense.weight)  # the pooler DRP trained
    assert BertForPreTraining.from_pretrained(export).cls.seq_relationship.out_features == 2  # a fresh NSP head

    torch.manual_seed(1)
    restored, report = initialize_model("continual", tokenizer=tokenizer, init_checkpoint=str(export),
                                        pair_task="drp")
    assert torch.equal(restored.cls.seq_relationship.weight, model.cls.seq_relationship.weight)
    assert report.newly_initialized == [] and restored.config.pair_classes == 3
    torch.manual_seed(1)
    as_nsp, report = initialize_model("continual", tokenizer=tokenizer, init_checkpoint=str(export), pair_task="nsp")
    assert as_nsp.cls.seq_relationship.out_features == 2 and not hasattr(as_nsp.config, "pair_classes")
    assert report.newly_initialized == ["cls.seq_relationship.weight", "cls.seq_relationship.bias"]
    # a 2-class checkpoint continued with DRP: a new 3-way head, the old one reported unused
    nsp_export = tmp_path / "nsp"
    BERT.export(as_nsp, tokenizer, nsp_export)
    assert not (nsp_export / PAIR_HEAD_FILE).exists()
    as_drp, report = initialize_model("continual", tokenizer=tokenizer, init_checkpoint=str(nsp_export),
                                      pair_task="drp")
    assert as_drp.cls.seq_relationship.out_features == 3
    assert report.newly_initialized == ["cls.seq_relationship.weight", "cls.seq_relationship.bias"]
    assert report.unused_checkpoint_keys == ["cls.seq_relationship.weight", "cls.seq_relationship.bias"]


@pytest.fixture(scope="module")
def tiny_albert(tmp_path_factory, wordpiece) -> Path:
    """A tiny general-domain ALBERT (random weights, a non-zero MLM bias) saved with save_pretrained."""
    from transformers import AlbertConfig, AlbertForPreTraining

    tokenizer, _ = wordpiece
    torch.manual_seed(5)
    config = AlbertConfig(vocab_size=len(tokenizer), embedding_size=16, hidden_size=32, num_hidden_layers=3,
                          num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
                          pad_token_id=tokenizer.pad_token_id)
    model = AlbertForPreTraining(config)
    with torch.no_grad():
        model.predictions.bias.normal_()
    path = tmp_path_factory.mktemp("albert") / "albert-general"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_an_albert_export_carries_the_sentencepiece_model_and_the_card(tmp_path):
    """QA: a BioALBERT export held tokenizer.json alone: no spiece.model (the slow AlbertTokenizer and
    sentencepiece need it) and no vocab_card.json (how the vocabulary was built)."""
    from transformers import AlbertConfig, AlbertForPreTraining, AutoTokenizer

    from biomed_lm.tokenization.tokenizer_io import albert_preprocessor
    from biomed_lm.tokenization.vocab import VocabConfig, build_vocab

    sample = Path(__file__).resolve().parents[1] / "data" / "sample" / "sywada_PubMedAbstract_1MB.txt"
    vocab = build_vocab([sample], tmp_path / "vocab", VocabConfig(vocab_size=1000, format="sentencepiece")).output_dir
    tokenizer = AutoTokenizer.from_pretrained(vocab)
    model = AlbertForPreTraining(AlbertConfig(vocab_size=len(tokenizer), embedding_size=8, hidden_size=16,
                                              num_hidden_layers=1, num_attention_heads=2, intermediate_size=32))
    family_of(model.config).export(model, tokenizer, tmp_path / "export")
    for name in ("spiece.model", "vocab_card.json"):
        assert (tmp_path / "export" / name).read_bytes() == (vocab / name).read_bytes()
    import sentencepiece

    text = "Naloxone reverses opioid overdose."
    model_file = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "export" / "spiece.model"))
    prepared = albert_preprocessor(lowercase=True).normalize_str(text)
    assert model_file.encode(prepared) == tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_roberta_export_tokenizes_the_first_word_as_pretraining_did_and_carries_its_bpe_files(tmp_path):
    """QA: instances give every sentence's first word its Ġ (each sentence is tokenized as running text), but the
    export said add_prefix_space false, so transformers users fed first words in a form the model never saw; and
    vocab.json/merges.txt (fairseq, slow tokenizers) were left out."""
    from transformers import AutoTokenizer, RobertaConfig, RobertaForMaskedLM

    from biomed_lm.pretrain.instance_builder import pipeline_tokenizer
    from biomed_lm.tokenization.vocab import VocabConfig, build_vocab

    sample = Path(__file__).resolve().parents[1] / "data" / "sample" / "sywada_PubMedAbstract_1MB.txt"
    vocab = build_vocab([sample], tmp_path / "vocab", VocabConfig(vocab_size=600, format="bytelevel-bpe",
                                                                   cased=True)).output_dir
    tokenizer = AutoTokenizer.from_pretrained(vocab)
    model = RobertaForMaskedLM(RobertaConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1,
                                             num_attention_heads=2, intermediate_size=32, pad_token_id=1))
    family_of(model.config).export(model, tokenizer, tmp_path / "export")
    text = "Naloxone reverses opioid overdose."
    trained = pipeline_tokenizer(tokenizer).encode(text, add_special_tokens=False).tokens
    exported = AutoTokenizer.from_pretrained(tmp_path / "export")
    assert exported.convert_ids_to_tokens(exported(text, add_special_tokens=False)["input_ids"]) == trained
    assert trained[0].startswith("\u0120")
    config = json.loads((tmp_path / "export" / "tokenizer_config.json").read_text())
    assert config["add_prefix_space"] is True
    for name in ("vocab.json", "merges.txt", "vocab_card.json"):
        assert (tmp_path / "export" / name).read_bytes() == (vocab / name).read_bytes()
    # It truncates to what the model takes: 512 positions after the padding id's 1 + 1 (QA 2026-11-29: the
    # vocabulary's 512 was exported whatever the model's positions).
    assert exported.model_max_length == 510 and tokenizer.model_max_length == 512


def test_an_export_truncates_to_the_models_positions(tmp_path):
    from transformers import AutoTokenizer, BertConfig, BertForPreTraining

    from biomed_lm.reference_models import general_bert_dir

    tokenizer = AutoTokenizer.from_pretrained(general_bert_dir())
    model = BertForPreTraining(BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=32, max_position_embeddings=128))
    family_of(model.config).export(model, tokenizer, tmp_path / "export")
    exported = AutoTokenizer.from_pretrained(tmp_path / "export")
    assert exported.model_max_length == 128
    assert len(exported("word " * 400, truncation=True)["input_ids"]) == 128


def test_albert_continual_from_a_saved_albert(tiny_albert, wordpiece, tmp_path):
    from transformers import AlbertForPreTraining

    from biomed_lm.pretrain.initialization import (InitializationError, initialize_model,
                                                   load_checkpoint_config)
    from biomed_lm.tokenization.tokenizer_io import load_tokenizer
    from biomed_lm.tokenization.vocab import VocabConfig, build_vocab
    from tests.conftest import SAMPLE_DIR

    tokenizer, _ = wordpiece
    saved = AlbertForPreTraining.from_pretrained(tiny_albert)
    model, report = initialize_model("continual", tokenizer=tokenizer, init_checkpoint=str(tiny_albert),
                                     architecture="albert", pair_task="sop",
                                     model_fields={"embedding_size": 64})  # a preset field: ignored, reported
    assert type(model).__name__ == "AlbertForPreTraining" and report.newly_initialized == []
    for (name, tensor), (_, reference) in zip(model.state_dict().items(), saved.state_dict().items()):
        assert torch.equal(tensor, reference), name
    assert report.ignored_model_fields == {"embedding_size": {"requested": 64, "checkpoint": 16}}
    assert ALBERT.usable_positions(load_checkpoint_config(tiny_albert, "albert")) == 128
    with pytest.raises(InitializationError, match="model_type 'albert', expected 'bert'"):
        load_checkpoint_config(tiny_albert)

    other = tmp_path / "other"
    # more tokens than the old
    build_vocab([str(SAMPLE_DIR / "sywada_PubMedAbstract_1MB.txt")], other, VocabConfig(vocab_size=1500))
    new_tokenizer = load_tokenizer(other)
    torch.manual_seed(0)
    moved, report = initialize_model("continual-new-vocab", tokenizer=new_tokenizer, init_checkpoint=str(tiny_albert),
                                     architecture="albert", pair_task="sop")
    assert moved.get_input_embeddings().weight.shape == (len(new_tokenizer), 16)
    assert moved.predictions.decoder.weight is moved.get_input_embeddings().weight
    assert report.copied_rows + report.built_rows + report.fallback_rows == len(new_tokenizer)
    assert report.copied_rows > 0 and report.built_rows > 0
    old_ids, new_ids = tokenizer.get_vocab(), new_tokenizer.get_vocab()
    shared = next(token for token in new_ids if token in old_ids and not token.startswith("["))
    assert torch.equal(moved.get_input_embeddings().weight[new_ids[shared]],
                       saved.get_input_embeddings().weight[old_ids[shared]])
    assert torch.equal(moved.predictions.bias[new_ids[shared]], saved.predictions.bias[old_ids[shared]])
    assert torch.equal(moved.albert.encoder.embedding_hidden_mapping_in.weight,
                       saved.albert.encoder.embedding_hidden_mapping_in.weight)


# --- end to end through the trainer ---------------------------------------------------------------

def pair_task_data(source: Path, target: Path, task: str) -> Path:
    """A copy of made pretraining data relabelled for ``task``: its metadata's pair_task and
    pair_classes, and its next_sentence_label column (SOP keeps the 0/1 labels, DRP cycles 0, 1, 2,
    none is -100 throughout). What the pair labels mean does not matter here, only their shape."""
    from datasets import load_from_disk

    dataset = load_from_disk(str(source))
    classes = PAIR_CLASSES[task]

    def relabel(row, index):
        label = row["next_sentence_label"] if task in ("nsp", "sop") else (index % 3 if task == "drp" else -100)
        return {"next_sentence_label": label}

    dataset.map(relabel, with_indices=True, features=dataset.features).save_to_disk(str(target))
    metadata = json.loads((source / "pretraining_data.json").read_text(encoding="utf-8"))
    metadata.update(pair_task=task, pair_classes=classes, nsp=task != "none")  # nsp: readers of the old format
    (target / "pretraining_data.json").write_text(json.dumps(metadata), encoding="utf-8")
    return target


@pytest.fixture(scope="module")
def task_data(pretraining_inputs, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("task_data")
    return {task: pair_task_data(pretraining_inputs["data"], root / task, task) for task in ("sop", "drp", "none")}


def short_args(inputs: dict, out: Path, architecture: str, preset: str, data: Path, steps: int = 4) -> list[str]:
    args = pretrain_args({**inputs, "data": data}, out, "--architecture", architecture)
    args = with_option(args, "--model", preset)
    args = with_option(args, "--max-steps", str(steps))
    return with_option(args, "--checkpoint-every", "2")


def run_ok(args: list[str], hooks: dict | None = None):
    result = run(args, hooks=hooks)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.parametrize("architecture, preset, task, classes", [
    ("albert", "albert-tiny", "sop", ["AlbertForPreTraining", "AlbertModel"]),
    ("roberta", "bert-tiny", "none", ["RobertaForMaskedLM", "RobertaModel"]),
])
def test_a_short_run_per_family_exports_a_loadable_model(architecture, preset, task, classes, pretraining_inputs,
                                                         task_data, tmp_path):
    import transformers
    from transformers import AutoModel, AutoTokenizer

    out = tmp_path / architecture
    result = run_ok(short_args(pretraining_inputs, out, architecture, preset, task_data[task])
                    + ["--attn-implementation", "auto"])
    log = result.stderr + result.stdout
    record = losses(out)
    assert sorted(record) == [1, 2, 3, 4] and all(map(math.isfinite, record.values()))
    run_config = json.loads((out / "run_config.json").read_text())
    assert run_config["model"]["architecture"] == architecture and run_config["model_class"] == classes[0]
    # --attn-implementation auto (the default) on CPU: the unpadded layout with the CPU's kernel
    assert run_config["pair_task"]["trained"] == task
    assert run_config["execution"]["attention"] == "sdpa_loop" and run_config["execution"]["unpadded"] is True
    assert f"model family {architecture} ({classes[0]}); pair objective: {task}" in log
    assert "execution: unpadded (real tokens only), attention sdpa_loop" in log
    assert "padded forward only" not in log
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert (last["pair_accuracy"] is None) == (task == "none")
    model_dir = out / "model"
    assert json.loads((model_dir / "config.json").read_text())["architectures"] == classes[:1]
    loaded = getattr(transformers, classes[0]).from_pretrained(model_dir)
    assert type(AutoModel.from_pretrained(model_dir)).__name__ == classes[1]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    out = loaded(**tokenizer(["Naloxone reverses opioid overdose ."], return_tensors="pt"))
    assert torch.isfinite(out[0]).all() and out[0].shape[-1] == len(tokenizer)  # MLM logits over the vocabulary
    if architecture == "roberta":  # one token type; positions after the padding id ([PAD] is 0 here)
        assert loaded.config.type_vocab_size == 1 and loaded.config.max_position_embeddings == 512 + 0 + 1


def test_drp_run_resumes_with_its_head_and_exports_it_beside(pretraining_inputs, task_data, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModel, BertForMaskedLM, BertForPreTraining

    args = lambda out: short_args(pretraining_inputs, out, "bert", "bert-tiny", task_data["drp"])  # noqa: E731
    straight = tmp_path / "straight"
    log = (lambda r: r.stderr + r.stdout)(run_ok(args(straight)))
    assert "pair objective: drp (3 classes" in log
    run_config = json.loads((straight / "run_config.json").read_text())
    assert run_config["pair_task"] == {"data": "drp", "trained": "drp", "classes": 3,
                                       "metrics": "pair_loss, pair_accuracy"}
    model_dir = straight / "model"
    head = load_file(str(model_dir / PAIR_HEAD_FILE))
    assert head["cls.seq_relationship.weight"].shape == (3, 128)
    assert json.loads((model_dir / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    for cls in (BertForMaskedLM, AutoModel, BertForPreTraining):
        cls.from_pretrained(model_dir)
    # killed after step 3 (its last checkpoint: step 2), then resumed: the same losses, so the 3-way
    # head came back from the checkpoint with everything else
    resumed = tmp_path / "resumed"
    killed = run(args(resumed), hooks={"kill_at_step": 3})
    assert killed.returncode != 0 and (resumed / "checkpoints" / "latest").read_text().strip() == "step-00000002"
    result = run_ok(args(resumed))
    assert "resumed from" in result.stderr + result.stdout
    assert losses(resumed) == losses(straight)
    assert torch.equal(load_file(str(resumed / "model" / PAIR_HEAD_FILE))["cls.seq_relationship.weight"],
                       head["cls.seq_relationship.weight"])
    # continual DRP pretraining from that export (its 3-way head beside it) resumes without the export's folder
    general = tmp_path / "general"
    shutil.copytree(model_dir, general)
    continual = lambda out: args(out) + ["--init", "continual", "--init-checkpoint", str(general)]  # noqa: E731
    log = (lambda r: r.stderr + r.stdout)(run_ok(continual(tmp_path / "continual")))
    assert "Every parameter came from" in log and "pair objective: drp (3 classes" in log
    assert_continual_resume_needs_no_general_checkpoint(continual, tmp_path / "continual", general)


def test_albert_continual_run_from_a_saved_albert(pretraining_inputs, task_data, tiny_albert_for_inputs, tmp_path):
    from transformers import AlbertForPreTraining, AutoModel

    out = tmp_path / "continual"
    args = short_args(pretraining_inputs, out, "albert", "", task_data["sop"], steps=2)
    result = run_ok(args + ["--init", "continual", "--init-checkpoint", str(tiny_albert_for_inputs)])
    log = result.stderr + result.stdout
    assert f"Initialization: continual from {tiny_albert_for_inputs}" in log and "Every parameter came from" in log
    model = AlbertForPreTraining.from_pretrained(out / "model")
    assert model.config.embedding_size == 16 and model.config.num_hidden_layers == 3
    assert type(AutoModel.from_pretrained(out / "model")).__name__ == "AlbertModel"
    general = tmp_path / "general"
    shutil.copytree(tiny_albert_for_inputs, general)
    continual = lambda out: (short_args(pretraining_inputs, out, "albert", "", task_data["sop"])  # noqa: E731
                             + ["--init", "continual", "--init-checkpoint", str(general)])
    run_ok(continual(tmp_path / "continual-4-steps"))
    assert_continual_resume_needs_no_general_checkpoint(continual, tmp_path / "continual-4-steps", general)


def assert_continual_resume_needs_no_general_checkpoint(args, straight: Path, general: Path) -> None:
    """``args(out)``'s run, killed after its first checkpoint, resumes with ``general`` deleted and
    gives the losses of the uninterrupted run in ``straight``: the model is built from the run's own
    export (ALBERT's factorized embeddings, a DRP head beside the weights)."""
    resumed = straight.with_name(straight.name + "-resumed")
    killed = run(args(resumed), hooks={"kill_at_step": 3})
    assert killed.returncode != 0 and (resumed / "checkpoints" / "latest").read_text().strip() == "step-00000002"
    shutil.rmtree(general)
    result = run_ok(args(resumed))
    assert "cannot be read: the model is built from this run's checkpoint step-00000002" in result.stderr
    assert losses(resumed) == losses(straight)


@pytest.fixture(scope="module")
def tiny_albert_for_inputs(pretraining_inputs, tmp_path_factory) -> Path:
    """A tiny saved ALBERT in the end-to-end inputs' vocabulary (continual keeps the checkpoint's)."""
    from transformers import AlbertConfig, AlbertForPreTraining

    from biomed_lm.tokenization.tokenizer_io import load_tokenizer

    tokenizer = load_tokenizer(pretraining_inputs["vocab"])
    torch.manual_seed(6)
    config = AlbertConfig(vocab_size=len(tokenizer), embedding_size=16, hidden_size=32, num_hidden_layers=3,
                          num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
                          pad_token_id=tokenizer.pad_token_id)
    path = tmp_path_factory.mktemp("albert_inputs") / "albert"
    AlbertForPreTraining(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_refusals_come_before_training(pretraining_inputs, task_data, tmp_path):
    cases = [
        (("albert", "albert-tiny", task_data["drp"]), [], "architecture albert cannot train"),
        (("roberta", "bert-tiny", pretraining_inputs["data"]), [], "architecture roberta cannot train"),
        (("bert", "albert-tiny", pretraining_inputs["data"]), [], "pass --architecture albert"),
    ]
    for i, ((architecture, preset, data), extra, message) in enumerate(cases):
        out = tmp_path / str(i)
        result = run(short_args(pretraining_inputs, out, architecture, preset, data) + extra)
        assert result.returncode == 2 and re.search(re.escape(message), result.stderr), (message, result.stderr[-2000:])
        assert not (out / "checkpoints").exists()
