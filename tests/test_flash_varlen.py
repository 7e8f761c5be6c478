"""The varlen kernel's attention dropout (pretrain/flash_varlen.py), checked where no GPU is: on meta
tensors, whose shapes the aten flash operators' own meta functions give. What the kernels compute,
dropout included, tests/test_gpu.py checks on CUDA."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from biomed_lm.pretrain import flash_varlen

TOKENS, HEADS, HEAD_DIM = 10, 4, 16


def meta(*shape: int, dtype: torch.dtype = torch.bfloat16, grad: bool = False) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta", requires_grad=grad)


def attention_grads(q, k, v, cu_seqlens, grad_out, dropout_p: float):
    out = flash_varlen.attention(q, k, v, cu_seqlens, 6, dropout_p, 0.25)
    return torch.autograd.grad(out, (q, k, v), grad_out)


def traced(dropout_p: float) -> torch.fx.GraphModule:
    q, k, v = (meta(TOKENS, HEADS, HEAD_DIM, grad=True) for _ in range(3))
    cu_seqlens = meta(3, dtype=torch.int32)
    return make_fx(lambda *args: attention_grads(*args, dropout_p))(q, k, v, cu_seqlens, meta(TOKENS, HEADS, HEAD_DIM))


def calls(graph: torch.fx.GraphModule, name: str) -> list[torch.fx.Node]:
    return [node for node in graph.graph.nodes if node.op == "call_function" and name in str(node.target)]


def test_with_dropout_the_backward_replays_the_forwards_random_numbers():
    """The backward operator gets the forward's own philox state (rng_state and the offset output, as
    SDPA's flash path passes them), output and log-sum-exp, and the same dropout probability and
    scale; the gradients have the inputs' shapes."""
    graph = traced(0.1)
    (forward,) = calls(graph, "biomed_lm.flash_varlen_dropout.default")
    (backward,) = calls(graph, "biomed_lm.flash_varlen_dropout_backward.default")
    outputs = {node.args[1]: node for node in forward.users if node.target.__name__ == "getitem"}
    grad_out, q, k, v, out, logsumexp, cu_seqlens, max_length, dropout_p, scale, rng_state, offset = backward.args
    assert rng_state is outputs[2] and offset is outputs[3]  # not fresh random numbers, nor a stand-in
    assert _source(out) is outputs[0] and _source(logsumexp) is outputs[1]
    assert (q, k, v, cu_seqlens) == forward.args[:4]
    assert (max_length, dropout_p, scale) == (6, 0.1, 0.25) == forward.args[4:]
    grads = attention_grads(*(meta(TOKENS, HEADS, HEAD_DIM, grad=True) for _ in range(3)), meta(3, dtype=torch.int32),
                            meta(TOKENS, HEADS, HEAD_DIM), 0.1)
    assert [tuple(grad.shape) for grad in grads] == [(TOKENS, HEADS, HEAD_DIM)] * 3


def _source(node: torch.fx.Node) -> torch.fx.Node:
    """The node a chain of detaches starts from."""
    while node.target is torch.ops.aten.detach.default:
        node = node.args[0]
    return node


def test_without_dropout_it_is_pytorchs_public_varlen_attention():
    graph = traced(0.0)
    assert calls(graph, "torch_attn._varlen_attn") and not calls(graph, "biomed_lm")


def test_a_compiled_region_holds_it_whole_over_changing_lengths():
    """fullgraph with dynamic shapes: one graph for two token counts and longest lengths, the kernel
    one node in it."""
    from torch._dynamo.testing import CompileCounterWithBackend

    def region(q, k, v, cu_seqlens, longest):
        return flash_varlen.attention(q, k, v, cu_seqlens, longest, 0.1, 0.25).float().square().sum()

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(region, backend=counter, fullgraph=True, dynamic=True)
    for tokens, longest in ((10, 6), (17, 9)):
        q, k, v = (meta(tokens, HEADS, HEAD_DIM, grad=True) for _ in range(3))
        compiled(q, k, v, meta(3, dtype=torch.int32), longest).backward()
        assert q.grad.shape == (tokens, HEADS, HEAD_DIM)
    assert counter.frame_count == 1
    (graph,) = counter.graphs
    assert len(calls(graph, "biomed_lm.flash_varlen_dropout")) == 1


@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_on_cpu_it_refuses_rather_than_computing_something_else(dropout_p):
    q, k, v = (torch.zeros(TOKENS, HEADS, HEAD_DIM, dtype=torch.bfloat16) for _ in range(3))
    with pytest.raises((RuntimeError, NotImplementedError)):
        flash_varlen.attention(q, k, v, torch.tensor([0, 4, TOKENS], dtype=torch.int32), 6, dropout_p, 0.25)


@pytest.mark.parametrize("dropout_p", [0.1, 0.0])
def test_the_varlen_kernel_takes_the_packed_projections_views_without_copying_them(dropout_p):
    """``attention.varlen`` hands the kernel q, k and v as ``unpadded.project_qkv`` makes them: strided
    views of one matrix multiply's output (the flash kernels need only the head dimension contiguous),
    not copies, which cost a read and a write of that output in every layer; the gradients flow back
    into the one projection."""
    from torch import nn

    from biomed_lm.pretrain.attention import Sequences, attend
    from biomed_lm.pretrain.unpadded import project_qkv

    projections = tuple(nn.Linear(HEADS * HEAD_DIM, HEADS * HEAD_DIM, device="meta", dtype=torch.bfloat16)
                        for _ in range(3))
    sequences = dataclasses.replace(Sequences.from_offsets([0, 4, TOKENS]), cu_seqlens=meta(3, dtype=torch.int32))

    def layer(hidden):
        q, k, v = project_qkv(projections, hidden, (TOKENS, HEADS, HEAD_DIM))
        out = attend("varlen", q, k, v, sequences, dropout_p, 0.25)
        return torch.autograd.grad(out.float().sum(), (hidden, *(p.weight for p in projections)))

    graph = make_fx(layer)(meta(TOKENS, HEADS * HEAD_DIM, grad=True))
    (kernel,) = calls(graph, "flash_varlen_dropout.default" if dropout_p else "torch_attn._varlen_attn.default")
    q, k, v = kernel.args[:3]
    (split,) = {node.args[0] for node in (q, k, v)}  # the three views of the one product
    assert split.target is torch.ops.aten.unbind.int
    assert not calls(graph, "aten.clone") and not calls(graph, "aten.contiguous")
