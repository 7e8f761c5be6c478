"""``torch.compile`` for the pretraining model: the dense blocks, compiled in place, shapes bounded.

What is compiled: each layer's attention output block (dense, dropout, residual, LayerNorm), its
feed-forward (dense, GELU, dense, dropout, residual, LayerNorm) and the MLM head — the element-wise
work between the matrix multiplies is what compilation fuses. The attention kernel itself is not
(it is already one fused kernel, and the varlen entry points take host-side lengths). Modules are
compiled in place (``nn.Module.compile``), so parameter names, checkpoints and exports are the
same as uncompiled; every layer's block shares one compiled graph.

Shapes: the unpadded layout's token count changes every micro-batch. Compiling with dynamic
shapes and rounding the count up to a multiple (``bucket_tokens``, see
:func:`pretrain.unpadded.unpad`) keeps the number of graphs small; :func:`compiled_graphs` counts
them for the run log, so a recompilation storm is visible.
"""

from __future__ import annotations

from torch import nn


def should_compile(setting: str, device_type: str) -> bool:
    """``auto`` compiles on CUDA only: on CPU inductor's compile time outweighs its gain in short runs."""
    return setting == "on" or (setting == "auto" and device_type == "cuda")


def dense_blocks(bert: nn.Module) -> list[nn.Module]:
    """The modules :func:`compile_dense_blocks` compiles, of a ``BertForPreTraining``."""
    blocks: list[nn.Module] = []
    for layer in bert.bert.encoder.layer:
        blocks += [layer.attention.output, layer.intermediate, layer.output]
    return [*blocks, bert.cls.predictions]


def compile_dense_blocks(bert: nn.Module, backend: str = "inductor") -> int:
    """Compile the dense blocks of ``bert`` in place; returns how many modules were compiled."""
    blocks = dense_blocks(bert)
    for block in blocks:
        block.compile(backend=backend, dynamic=True)
    return len(blocks)


def compiled_graphs() -> int:
    """Graphs torch.compile has produced in this process so far (first compilations and recompilations)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
