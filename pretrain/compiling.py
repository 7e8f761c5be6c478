"""``torch.compile`` for the pretraining model, where its forward cannot be compiled by layer or as one
region: the dense blocks, compiled in place, shapes bounded.

The trainer compiles the forward by layer or whole (:meth:`pretrain.modeling.PretrainingModel.
compile_losses`) when the attention kernel traces; ALUM (several passes per micro-batch) and the
``sdpa_loop`` kernel (a loop over host-side lengths) fall back to the blocks below.

What is compiled: the modules the family's unpadded forward calls that hold the element-wise work
between the matrix multiplies (what compilation fuses), as the family's adapter in
:mod:`pretrain.unpadded` lists them — for BERT and RoBERTa each layer's attention output block
(dense, dropout, residual, LayerNorm) and feed-forward (dense, GELU, dense, dropout, residual,
LayerNorm); for ALBERT each shared layer's activation and LayerNorms (its modules hold no larger
block) — and the MLM head. The attention kernel itself is not
(it is already one fused kernel, and the varlen entry points take host-side lengths). Modules are
compiled in place (``nn.Module.compile``), so parameter names, checkpoints and exports are the
same as uncompiled; every layer's block shares one compiled graph.

Shapes: the unpadded layout's token count changes every micro-batch. Compiling with dynamic
shapes and rounding the count up to a multiple (``bucket_tokens``, see
:func:`pretrain.layout.unpad`) keeps the number of graphs small; :func:`compiled_graphs` counts
them for the run log, so a recompilation storm is visible.
"""

from __future__ import annotations

from torch import nn


def should_compile(setting: str, device_type: str) -> bool:
    """``auto`` compiles on CUDA only: on CPU inductor's compile time outweighs its gain in short runs."""
    return setting == "on" or (setting == "auto" and device_type == "cuda")


def dense_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules :func:`compile_dense_blocks` compiles, of a model of any family
    (``BertForPreTraining``, ``AlbertForPreTraining``, ``RobertaForMaskedLM``): its unpadded
    adapter's blocks (:meth:`pretrain.unpadded.BertEncoder.dense_blocks`), then the MLM head."""
    from biomed_lm.pretrain.families import family_of
    from biomed_lm.pretrain.unpadded import encoder_for

    family = family_of(model.config)
    return [*encoder_for(model.config).dense_blocks(family.encoder_of(model)), family.mlm_head_of(model)]


def compile_dense_blocks(model: nn.Module, backend: str = "inductor") -> int:
    """Compile the dense blocks of ``model`` in place; returns how many modules were compiled."""
    blocks = dense_blocks(model)
    for block in blocks:
        block.compile(backend=backend, dynamic=True)
    return len(blocks)


def compiled_graphs() -> int:
    """Graphs torch.compile has produced in this process so far (first compilations and recompilations)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def cudagraph_skips() -> int:
    """Compiled graphs inductor has run without CUDA graphs in this process though a mode asked for them
    (a CPU tensor among the inputs, an input mutated, a shape past the recording limit...); the reasons
    are inductor's ``cudagraphs`` log (``TORCH_LOGS=cudagraphs``)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])
