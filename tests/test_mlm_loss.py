"""pretrain.mlm_loss: the fused MLM head + cross-entropy against the dense reference, per family.

Tiny models (hidden 32, vocab 499) in fp32 on CPU; the chunked path must give the dense path's
loss, hits, count and gradients (hidden states and every head parameter), padding rows included.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from transformers import (AlbertConfig, AlbertForPreTraining, BertConfig, BertForPreTraining, RobertaConfig,
                          RobertaForMaskedLM)

from biomed_lm.pretrain import mlm_loss
from biomed_lm.pretrain.mlm_loss import IGNORE_INDEX, masked_lm_loss, resolve_implementation, split_head

HIDDEN, VOCAB = 32, 499
SHAPE = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=64)
FAMILIES = ("bert", "albert", "roberta")


def build_model(family: str) -> torch.nn.Module:
    """A tiny model of ``family`` whose head biases and LayerNorms are not at their zero/one init, so a
    head that dropped one of them would show."""
    torch.manual_seed(0)
    if family == "bert":
        model = BertForPreTraining(BertConfig(**SHAPE))
    elif family == "albert":
        model = AlbertForPreTraining(AlbertConfig(**SHAPE, embedding_size=16))
    else:
        model = RobertaForMaskedLM(RobertaConfig(**SHAPE))
    with torch.no_grad():
        for name, parameter in head_of(model).named_parameters():
            if "decoder.weight" not in name:  # the word embeddings: already random
                parameter.add_(torch.randn_like(parameter) * 0.5)
    return model


def head_of(model: torch.nn.Module) -> torch.nn.Module:
    return {"bert": lambda: model.cls.predictions, "albert": lambda: model.predictions,
            "roberta": lambda: model.lm_head}[model.config.model_type]()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tensors this small gain nothing from a thread pool, and on a loaded box every op would wait for
    the second thread's time slice (10 ms per op was seen); restored after the module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=FAMILIES)
def family_head(request) -> torch.nn.Module:
    return head_of(build_model(request.param))


def make_rows(head: torch.nn.Module, rows: int, ignored: torch.Tensor | None = None, seed: int = 1
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states and targets; about a third of the targets are the head's own argmax (so the hit
    count is not trivially 0), and ``ignored`` rows hold IGNORE_INDEX."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, HIDDEN, generator=generator)
    targets = torch.randint(0, VOCAB, (rows,), generator=generator)
    with torch.no_grad():
        predicted = head(hidden).argmax(-1)
    hits = torch.rand(rows, generator=generator) < 0.35
    targets = torch.where(hits, predicted, targets)
    if ignored is not None:
        targets = torch.where(ignored, IGNORE_INDEX, targets)
    return hidden, targets


def loss_and_grads(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, **options):
    """The output and the gradients of loss_sum w.r.t. hidden and each head parameter (by name)."""
    head.zero_grad(set_to_none=True)
    hidden = hidden.detach().requires_grad_()
    output = masked_lm_loss(hidden, head, targets, **options)
    output.loss_sum.backward()
    grads = {name: parameter.grad.clone() for name, parameter in head.named_parameters()}
    grads["hidden"] = hidden.grad.clone()
    return output, grads


def assert_same_as_dense(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, chunk_size: int) -> None:
    dense, dense_grads = loss_and_grads(head, hidden, targets, implementation="dense")
    chunked, chunked_grads = loss_and_grads(head, hidden, targets, implementation="chunked", chunk_size=chunk_size)
    assert chunked.loss_sum.dtype == torch.float32 and chunked.correct.dtype == chunked.count.dtype == torch.long
    torch.testing.assert_close(chunked.loss_sum, dense.loss_sum, rtol=1e-5, atol=1e-5)
    assert int(chunked.correct) == int(dense.correct) and int(chunked.count) == int(dense.count)
    assert chunked_grads.keys() == dense_grads.keys()
    for name, grad in dense_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_split_head_reproduces_each_family_head(family_head):
    transform, weight, bias = split_head(family_head)
    hidden = torch.randn(7, HIDDEN)
    assert torch.equal(F.linear(transform(hidden), weight, bias), family_head(hidden))
    assert bias is family_head.bias  # transformers ties head.bias to decoder.bias: one Parameter


def test_split_head_unwraps_bert_heads_and_refuses_others():
    model = build_model("bert")
    _, weight, bias = split_head(model.cls)  # BertPreTrainingHeads around the prediction head
    assert weight is model.bert.embeddings.word_embeddings.weight and bias is model.cls.predictions.bias
    with pytest.raises(TypeError, match="split_head does not know Linear"):
        split_head(torch.nn.Linear(4, 4))


@pytest.mark.parametrize("rows, chunk_size", [(37, 8), (32, 8), (5, 64), (9, 1)])
def test_chunked_matches_dense(family_head, rows, chunk_size):
    ignored = torch.arange(rows) % 4 == 3  # padding rows, as the caller's bucketing adds
    hidden, targets = make_rows(family_head, rows, ignored)
    assert_same_as_dense(family_head, hidden, targets, chunk_size)


@pytest.mark.parametrize("implementation", ["dense", "chunked"])
@pytest.mark.parametrize("rows", [0, 6])
def test_no_counted_rows_gives_zeros_and_zero_grads(family_head, implementation, rows):
    hidden = torch.randn(rows, HIDDEN)
    targets = torch.full((rows,), IGNORE_INDEX)
    output, grads = loss_and_grads(family_head, hidden, targets, implementation=implementation, chunk_size=4)
    assert float(output.loss_sum.detach()) == 0.0 and int(output.correct) == 0 and int(output.count) == 0
    for name, grad in grads.items():  # zeros, not None: every parameter stays in the graph for DDP
        assert torch.count_nonzero(grad) == 0, name


def test_tied_word_embeddings_get_the_dense_gradient():
    """Through a whole BertForPreTraining: the decoder weight is the word embeddings' Parameter, so its
    gradient (lookup plus projection) and every other parameter's must match the dense path's."""
    model = build_model("bert").eval()  # no dropout: both passes see the same hidden states
    input_ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    labels = torch.where(torch.arange(12) % 3 == 0, input_ids, IGNORE_INDEX)
    masked = labels != IGNORE_INDEX
    grads = {}
    for implementation in ("dense", "chunked"):
        model.zero_grad(set_to_none=True)
        hidden = model.bert(input_ids=input_ids).last_hidden_state[masked]
        masked_lm_loss(hidden, model.cls.predictions, labels[masked], implementation=implementation,
                       chunk_size=3).loss_sum.backward()
        grads[implementation] = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    embedding_grad = grads["chunked"]["bert.embeddings.word_embeddings.weight"]
    assert torch.count_nonzero(embedding_grad[labels[masked]]) > 0
    assert grads["chunked"].keys() == grads["dense"].keys()
    for name, grad in grads["dense"].items():
        torch.testing.assert_close(grads["chunked"][name], grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_bf16_is_close_to_fp32(family_head):
    hidden, targets = make_rows(family_head, 40, torch.arange(40) % 5 == 0)
    reference = masked_lm_loss(hidden, family_head, targets, implementation="dense").loss_sum
    bf16_head = copy.deepcopy(family_head).to(torch.bfloat16)
    bf16 = masked_lm_loss(hidden.bfloat16(), bf16_head, targets, implementation="chunked", chunk_size=16)
    torch.testing.assert_close(bf16.loss_sum, reference, rtol=2e-2, atol=0.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # fp32 weights, bf16 projection: as dense under autocast
        autocast_dense = masked_lm_loss(hidden, family_head, targets, implementation="dense")
        autocast_chunked, grads = loss_and_grads(family_head, hidden, targets, implementation="chunked", chunk_size=16)
    torch.testing.assert_close(autocast_chunked.loss_sum, autocast_dense.loss_sum, rtol=1e-3, atol=0.0)
    torch.testing.assert_close(autocast_chunked.loss_sum, reference, rtol=2e-2, atol=0.0)
    assert all(grad.dtype == torch.float32 for grad in grads.values())


def test_without_grad_gives_the_same_sums(family_head):
    hidden, targets = make_rows(family_head, 21, torch.arange(21) % 4 == 0)
    with torch.no_grad():
        dense = masked_lm_loss(hidden, family_head, targets, implementation="dense")
        chunked = masked_lm_loss(hidden, family_head, targets, implementation="chunked", chunk_size=8)
    torch.testing.assert_close(chunked.loss_sum, dense.loss_sum, rtol=1e-5, atol=1e-5)
    assert (int(chunked.correct), int(chunked.count)) == (int(dense.correct), int(dense.count))


@pytest.mark.parametrize("implementation", ["dense", "chunked"])
def test_traces_under_compile_fullgraph(implementation):
    """No host syncs or data-dependent shapes: the loss and its backward compile as one graph, and a
    second masked-row count recompiles rather than breaking the graph."""
    head = head_of(build_model("bert"))

    def loss(hidden, targets):
        output = masked_lm_loss(hidden, head, targets, implementation=implementation, chunk_size=8)
        return output.loss_sum, output.correct, output.count

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    for rows in (19, 24):
        hidden, targets = make_rows(head, rows, torch.arange(rows) % 3 == 0)
        grads = []
        for function in (loss, compiled):
            leaf = hidden.clone().requires_grad_()
            loss_sum, correct, count = function(leaf, targets)
            loss_sum.backward()
            grads.append((loss_sum.detach(), correct, count, leaf.grad))
        for eager, traced in zip(*grads):
            torch.testing.assert_close(traced, eager, rtol=1e-6, atol=1e-6)


def test_resolve_implementation(monkeypatch):
    assert resolve_implementation("auto", "cpu") == ("dense", None)
    assert resolve_implementation("chunked", torch.device("cpu")) == ("chunked", None)
    monkeypatch.setattr(mlm_loss, "liger_available", lambda: False)
    name, reason = resolve_implementation("auto", "cuda")
    assert name == "chunked" and "liger-kernel is not installed" in reason
    with pytest.raises(ValueError, match="needs liger-kernel"):
        resolve_implementation("liger", "cuda")
    monkeypatch.setattr(mlm_loss, "liger_available", lambda: True)
    assert resolve_implementation("auto", "cuda:0") == ("liger", None)
    # Inside a compiled region inductor fuses the dense loss; liger would break the graph.
    assert resolve_implementation("auto", "cuda:0", compiled=True) == ("dense", None)
    with pytest.raises(ValueError, match="on CUDA, not on cpu"):
        resolve_implementation("liger", "cpu")
    with pytest.raises(ValueError, match="expected one of auto, dense, chunked, liger"):
        resolve_implementation("fused", "cpu")


@pytest.mark.gpu
def test_liger_matches_dense():
    pytest.importorskip("liger_kernel")
    if not torch.cuda.is_available():
        pytest.skip("liger-kernel's Triton kernels need CUDA")
    head = head_of(build_model("bert"))
    hidden, targets = make_rows(head, 37, torch.arange(37) % 4 == 3)
    head.cuda()
    dense, dense_grads = loss_and_grads(head, hidden.cuda(), targets.cuda(), implementation="dense")
    liger, liger_grads = loss_and_grads(head, hidden.cuda(), targets.cuda(), implementation="liger", chunk_size=8)
    torch.testing.assert_close(liger.loss_sum, dense.loss_sum, rtol=1e-4, atol=1e-4)
    assert (int(liger.correct), int(liger.count)) == (int(dense.correct), int(dense.count))
    for name, grad in dense_grads.items():
        torch.testing.assert_close(liger_grads[name], grad, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")


@pytest.fixture(scope="module")
def bert_head() -> torch.nn.Module:
    return head_of(build_model("bert"))


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(0, 30), chunk_size=st.integers(1, 12), seed=st.integers(0, 2**16),
       ignored_fraction=st.sampled_from([0.0, 0.3, 1.0]))
def test_chunked_matches_dense_property(bert_head, rows, chunk_size, seed, ignored_fraction):
    ignored = torch.rand(rows, generator=torch.Generator().manual_seed(seed)) < ignored_fraction
    hidden, targets = make_rows(bert_head, rows, ignored, seed=seed)
    assert_same_as_dense(bert_head, hidden, targets, chunk_size)
