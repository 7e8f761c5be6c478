"""The pretraining model: a ``transformers`` model of one family, run on real tokens only.

The weights are a plain ``transformers`` model of the run's family (:mod:`pretrain.families`:
``BertForPreTraining``, ``AlbertForPreTraining`` or ``RobertaForMaskedLM``; MLM head tied to the
input embeddings, the pair head on the pooled [CLS]), so exports load with ``from_pretrained``.
Where the family keeps its encoder, MLM head and pair head is the family's business; this module
asks it. Only the forward pass differs from transformers', in two ways:

* **Unpadded** (every family's default on every device): the micro-batch's real tokens run
  through the encoder concatenated, with attention kept within each sequence (:mod:`pretrain.unpadded`,
  kernels in :mod:`pretrain.attention`). ``attention="hf_sdpa"`` / ``"hf_eager"`` run transformers'
  own padded forward instead: the reference the equivalence tests compare against.
* **Masked positions only**: BERT masks 15% of the tokens, and projecting every position onto a
  30k vocabulary is the single largest matrix multiply of the step, so the MLM head runs on the
  masked positions' hidden states alone (the same loss, about a seventh of the head's work), fused
  with its cross-entropy on a GPU (:mod:`pretrain.mlm_loss`).

The micro-batch arrives in the model's :attr:`~PretrainingModel.layout`, built on the host
(:mod:`pretrain.layout`), so a step has no shape to ask the device for; :meth:`~PretrainingModel.
compile_losses` compiles the whole forward as one region.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from biomed_lm.pretrain import unpadded
from biomed_lm.pretrain.attention import PADDED
from biomed_lm.pretrain.config import PretrainConfigError
from biomed_lm.pretrain.families import BERT, family_of
from biomed_lm.pretrain.layout import Layout, PaddedBatch, VarlenBatch
from biomed_lm.pretrain.mlm_loss import masked_lm_loss
from biomed_lm.pretrain.trainer_state import VariantState

IGNORE_INDEX = -100
#: Under CUDA graphs the masked-token count is rounded up to a multiple of this (padding rows ignored): at
#: BERT-base's 256 x 128 (about 4,500 masked tokens, varying by about 90) two or three graphs a token
#: bucket, for an MLM head about 0.1% of the step larger on average.
MASKED_BUCKET = 256
#: What :meth:`PretrainingModel.compile_losses` compiles: three regions (one graph per layer's code, shared
#: by every layer), or the whole forward as one.
COMPILE_SCOPES = ("layers", "whole")
#: torch.compile's modes that replay the compiled regions as CUDA graphs (max-autotune autotunes the
#: kernels as well; max-autotune-no-cudagraphs only autotunes).
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def build_bert(model_fields: dict, vocab_size: int, pad_token_id: int, attn_implementation: str = "sdpa"):
    """A freshly initialized ``BertForPreTraining`` from BertConfig fields and the tokenizer's size
    (``attn_implementation`` is transformers' own: see :func:`hf_attention`); the bert family's
    :meth:`~pretrain.families.ModelFamily.build`."""
    return BERT.build(model_fields, vocab_size, pad_token_id, attn_implementation)


def hf_attention(attention: str) -> str:
    """transformers' ``attn_implementation`` for a model run with ``attention`` (what its padded
    forward and its export use; the unpadded kernels do not go through it)."""
    return "eager" if attention == "hf_eager" else "sdpa"


@dataclass(frozen=True)
class CompiledRegions:
    """The forward's compiled regions (compile scope ``layers``): the family's unpadded embeddings,
    a block of ``layers_per_graph`` consecutive encoder layers (called with each block's modules: one
    graph every block runs through, the weights its inputs; a shorter last block, a second), and
    :meth:`PretrainingModel.head_losses`."""

    embed: Callable
    layers: Callable  # (layer modules, hidden, sequences, kernel, residual dtype) -> hidden
    heads: Callable
    layers_per_graph: int = 1


@dataclass
class PretrainingOutput:
    """Losses and the counts the trainer turns into accuracies (summed over ranks before dividing)."""

    loss: torch.Tensor
    mlm_loss: torch.Tensor
    pair_loss: torch.Tensor  # the pair objective's (NSP, SOP or DRP; 0 when none is trained)
    mlm_correct: torch.Tensor
    mlm_count: torch.Tensor
    pair_correct: torch.Tensor
    pair_count: torch.Tensor

    # A variant of the objective (ALUM's adversarial term) reports what it adds through its output
    # class: the trainer's loop sums, accounts and logs these without knowing which variant runs.

    #: Names of the variant's per-step sums (over micro-batches, then ranks) beyond the standard ones.
    EXTRA_TOTALS: ClassVar[tuple[str, ...]] = ()
    #: The variant's own counters, checkpointed in the trainer state (:mod:`pretrain.trainer_state`).
    state_type: ClassVar[type[VariantState]] = VariantState

    def extra_totals(self) -> dict[str, torch.Tensor]:
        """This micro-batch's amounts of :attr:`EXTRA_TOTALS`, as device scalars (summed on the device;
        the trainer reads them once per step)."""
        return {}

    @classmethod
    def account_step(cls, totals: Mapping[str, float], state: VariantState) -> None:
        """Fold one step's reduced totals into the variant's counters (a :attr:`state_type`)."""

    @classmethod
    def step_metrics(cls, totals: Mapping[str, float], micro_batches: int, nonfinite: bool,
                     state: VariantState) -> dict[str, Any]:
        """The variant's entries of the step's metrics.jsonl record: ``micro_batches`` is the number of
        finite micro-batches the totals cover; ``nonfinite``: some micro-batch's loss was not finite."""
        return {}


class PretrainingModel(nn.Module):
    """Wraps a model of one family (``BertForPreTraining``, ``AlbertForPreTraining``,
    ``RobertaForMaskedLM``; the family is read off its config) as :attr:`hf_model`, what gets exported.
    Checkpoints written when it was ``self.bert`` name its parameters ``bert.…``; they load as they
    are (:func:`_read_parameters_under_their_old_names`).

    ``train_pair``: train the pair objective (the data's pair task, whose labels arrive as
    ``next_sentence_label``; see :func:`pretrain.families.resolve_pair_objective`).
    ``attention`` is a resolved kernel name (:func:`pretrain.attention.choose_kernel`) or one of
    transformers' padded ones;
    ``pad_to_multiple_of`` rounds the unpadded token count up (bounded shapes for ``torch.compile``);
    ``mlm_loss`` is how the MLM head and its cross-entropy run (:mod:`pretrain.mlm_loss`: ``chunked``
    and ``liger`` never hold the fp32 [masked × vocabulary] logits whole);
    ``residual_dtype``: the unpadded encoder's residual stream in this dtype (the autocast one, for
    ``--residual-stream half``: :mod:`pretrain.unpadded`'s top), None as autocast leaves it."""

    #: What :meth:`forward` returns; the trainer asks it for the variant's extra totals and metrics.
    output_type: ClassVar[type[PretrainingOutput]] = PretrainingOutput

    def __init__(self, hf_model: nn.Module, train_pair: bool = True, attention: str = "sdpa_loop",
                 pad_to_multiple_of: int | None = None, mlm_loss: str = "dense",
                 residual_dtype: torch.dtype | None = None):
        super().__init__()
        self.hf_model = hf_model  # the family's transformers model (BertForPreTraining, ...)
        self.family = family_of(hf_model.config)
        self.register_load_state_dict_pre_hook(_read_parameters_under_their_old_names)
        if attention not in PADDED and not self.family.unpadded:
            raise PretrainConfigError(f"attention {attention!r} runs unpadded, and the {self.family.name} family has "
                                      f"no unpadded path: use one of {', '.join(PADDED)}")
        self.train_pair = train_pair
        self.attention = attention
        self.pad_to_multiple_of = pad_to_multiple_of
        self.mlm_loss = mlm_loss  # a resolved pretrain.mlm_loss implementation: dense, chunked or liger
        self.residual_dtype = residual_dtype
        self.masked_multiple_of: int | None = None  # the masked count's bucket (set for CUDA graphs only)

    @property
    def cuda_graphs(self) -> bool:
        """Compiled with a mode that replays CUDA graphs (:data:`CUDA_GRAPH_MODES`, see
        :meth:`begin_micro_batch`): the only case that buckets the masked count."""
        return self.masked_multiple_of is not None

    @property
    def unpadded(self) -> bool:
        return self.attention not in PADDED

    @property
    def encoder(self) -> nn.Module:
        """The family's encoder (``BertModel``, ``AlbertModel``, ``RobertaModel``)."""
        return self.family.encoder_of(self.hf_model)

    @property
    def mlm_head(self) -> nn.Module:
        """The MLM head: hidden states in, vocabulary logits out."""
        return self.family.mlm_head_of(self.hf_model)

    @property
    def pair_head(self) -> nn.Module | None:
        """The pair classifier on the pooled [CLS] (None for a family without one)."""
        return self.family.pair_head_of(self.hf_model)

    @property
    def layout(self) -> Layout:
        """How this model wants its micro-batches (the trainer's loader workers build them)."""
        return Layout(self.unpadded, self.pad_to_multiple_of, self.hf_model.config.pad_token_id or 0,
                      masked_multiple_of=self.masked_multiple_of)

    def prepare(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
                labels: torch.Tensor | None = None) -> PaddedBatch | VarlenBatch:
        """The micro-batch in the layout the encoder runs on (on the host, before the transfer, when
        the step must not synchronize: see :mod:`pretrain.layout`)."""
        return self.layout(input_ids, attention_mask, token_type_ids, labels)

    def word_embeddings(self, batch: PaddedBatch | VarlenBatch) -> torch.Tensor:
        return self.hf_model.get_input_embeddings()(batch.input_ids)

    def encode(self, batch: PaddedBatch | VarlenBatch, inputs_embeds: torch.Tensor | None = None,
               regions: CompiledRegions | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Last hidden states (one row per token of ``batch``'s layout) and the pooled [CLS] states
        (None for a family without a pooler); through the compiled ``regions`` when given."""
        if isinstance(batch, PaddedBatch):
            return self.family.encode_padded(self.hf_model, batch.input_ids, batch.attention_mask, batch.token_type_ids,
                                             inputs_embeds)
        encoder = self.encoder
        hidden = unpadded.encode(encoder, batch, self.attention, inputs_embeds, regions, self.residual_dtype)
        return hidden, unpadded.pool(encoder, hidden, batch)

    def masked_logits(self, batch: PaddedBatch | VarlenBatch, inputs_embeds: torch.Tensor | None = None
                      ) -> torch.Tensor:
        """MLM logits at the masked positions, in the padded batch's row-major order (ALUM's forward)."""
        hidden, _ = self.encode(batch, inputs_embeds)
        return self.mlm_head(hidden.flatten(0, -2).index_select(0, batch.masked_positions))

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None, *,
                prepared: PaddedBatch | VarlenBatch | None = None) -> PretrainingOutput:
        """The losses of a micro-batch given padded (the collator's tensors) or ``prepared`` in this
        model's :attr:`layout` (what the trainer's loader hands over: nothing left to synchronize on)."""
        if prepared is None:
            prepared = self.prepare(input_ids, attention_mask, token_type_ids, labels)
        return self.compute_losses(prepared, next_sentence_label)

    def compute_losses(self, batch: PaddedBatch | VarlenBatch, next_sentence_label: torch.Tensor | None
                       ) -> PretrainingOutput:
        """:meth:`losses`, compiled as one region when :meth:`compile_losses` was called with ``scope="whole"``
        (``"layers"``: :meth:`losses` runs its compiled regions)."""
        compiled = self.__dict__.get("_compiled_losses")
        return (compiled or self.losses)(batch, next_sentence_label)

    def compile_losses(self, backend: str = "inductor", mode: str | None = None, scope: str = "layers",
                       layers_per_graph: int = 1) -> None:
        """Compile the forward (autograd compiles each region's backward as one graph too) with dynamic
        shapes: the token and masked counts vary per micro-batch, so a handful of graphs serve a run.

        ``scope="layers"`` (regional compilation): three regions, the embeddings, one encoder layer
        (a single graph every layer runs through, its weights as inputs) and the heads with their
        losses; ``layers_per_graph`` k > 1 makes the middle region k consecutive layers (12 layers,
        k = 4: 3 calls a forward instead of 12, each region call costing the host a guard check and
        autograd's wrappers, for a graph k times as large to compile). ``scope="whole"``: encoder,
        both heads and both losses as one region. Both fuse the same element-wise work (a layer's
        region holds everything between its matrix multiplies); the whole region compiles each of the
        12 layers anew (``torch.compiler.nested_compile_region`` around the layer did not change that
        on CPU with torch 2.13, a tiny BERT: 6 layers 51 s against 42 s, 12 layers 100 s against 89 s).
        BERT-base's 3 warm-up steps with a cold compile cache on a 2-core CPU (inductor, micro-batch
        8 × 128): 103 s whole, 40 s by layers, the same tokens/s after (331 and 334); on an H200 the
        whole region's warm-up had not finished after 100 s, by layer it takes 15-20 s.
        ``mode="reduce-overhead"`` (and ``"max-autotune"``) adds CUDA graphs (inductor's CUDA graph trees)
        in either scope: each region call of a step is a node of a recorded path (by layer, each layer's
        node keeps its own weights' addresses), replayed with one launch, so the host's per-kernel launch
        cost leaves the step. One graph per shape: the token count is bucketed (``pad_to_multiple_of``), and the masked
        count here to :data:`MASKED_BUCKET`; a shape's first occurrence runs uncaptured, its second records.
        The trainer marks each micro-batch's start (:meth:`begin_micro_batch`).
        Only the unpadded layout: transformers' padded forward breaks graphs."""
        import torch._dynamo

        if not self.unpadded:
            raise PretrainConfigError("compiling the forward needs the unpadded layout")
        if scope not in COMPILE_SCOPES:
            raise PretrainConfigError(f"compile scope {scope!r}: expected one of {', '.join(COMPILE_SCOPES)}")
        if self.mlm_loss == "liger":
            raise PretrainConfigError("the liger MLM loss breaks the compiled graph (it reads its row count back to "
                                      "the host); compile with the dense or chunked loss")
        if mode in CUDA_GRAPH_MODES:  # a CUDA graph per shape: the masked count is bucketed as the tokens are
            self.masked_multiple_of = MASKED_BUCKET
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        # One graph per region is required: a break is a bug (a host sync, a data-dependent shape).
        compile = functools.partial(torch.compile, fullgraph=True, dynamic=True, backend=backend, mode=mode)
        # Not nn.Module attributes: compiled functions must not become submodules (state dict).
        if scope == "whole":
            self.__dict__["_compiled_losses"] = compile(self.losses)
            return
        if layers_per_graph < 1:
            raise PretrainConfigError(f"layers_per_graph must be at least 1, got {layers_per_graph}")
        adapter = unpadded.encoder_for(self.hf_model.config)
        self.__dict__["_compiled_regions"] = CompiledRegions(
            embed=compile(adapter.embed), layers=compile(functools.partial(unpadded.run_layers, adapter)),
            heads=compile(self.head_losses), layers_per_graph=layers_per_graph)

    def begin_micro_batch(self, accumulating: bool = False) -> None:
        """Called before each micro-batch's forward; ``accumulating``: the step has more than one. Under
        CUDA graphs each micro-batch is a generation of inductor's graph trees
        (``torch.compiler.cudagraph_mark_step_begin``): its replays may overwrite what the last
        micro-batch's returned, which the trainer has summed into its own tensors by then. Without
        graphs: nothing.

        Accumulated gradients must outlive that. Left to itself autograd adopts a step's first
        gradients as ``.grad``, memory of the graphs' pool, so an accumulating step first gives every
        parameter a zeroed ``.grad`` outside it (:meth:`_hold_gradients`), into which autograd adds each
        micro-batch's. (Marking a generation per optimizer step instead kept that memory safe, but made
        a step's micro-batches one path of the trees, recorded anew for each sequence of shapes in a
        step: with 4 micro-batches and tens of shapes, a recording almost every step.) A step of one
        micro-batch keeps the adopted gradients: the optimizer has used and dropped them before the
        next replay, and the step saves a zeroing and an addition per parameter."""
        if self.cuda_graphs:
            if accumulating:
                self._hold_gradients()
            torch.compiler.cudagraph_mark_step_begin()

    def _hold_gradients(self) -> None:
        """At a step's start (no parameter has a gradient: the optimizer dropped them), give every
        trainable parameter a zeroed ``.grad`` in the model's gradient buffers, one a dtype, allocated once
        and zeroed with one kernel each. Within the step the gradients are there already; a parameter
        the step's micro-batches have left without one gets its own zeroed tensor."""
        trainable = [parameter for parameter in self.parameters() if parameter.requires_grad]
        if any(parameter.grad is not None for parameter in trainable):
            for parameter in trainable:
                if parameter.grad is None:
                    parameter.grad = torch.zeros_like(parameter)
            return
        buffers = self.__dict__.setdefault("_gradient_buffers", {})  # not a buffer of the state dict
        for dtype in {parameter.dtype for parameter in trainable}:
            members = [parameter for parameter in trainable if parameter.dtype == dtype]
            size = sum(parameter.numel() for parameter in members)
            buffer = buffers.get(dtype)
            if buffer is None or buffer.numel() != size or buffer.device != members[0].device:
                buffer = buffers[dtype] = torch.empty(size, dtype=dtype, device=members[0].device)
            buffer.zero_()
            for parameter, view in zip(members, buffer.split([parameter.numel() for parameter in members])):
                parameter.grad = view.view_as(parameter)

    def losses(self, batch: PaddedBatch | VarlenBatch, next_sentence_label: torch.Tensor | None
               ) -> PretrainingOutput:
        """Losses and counts, with no host synchronization: every shape comes from the layout, built
        on the host, and the counts stay device tensors until the trainer reads a step's totals."""
        regions = self.__dict__.get("_compiled_regions")
        sequence_output, pooled_output = self.encode(batch, regions=regions)
        heads = regions.heads if regions is not None else self.head_losses
        return heads(sequence_output, pooled_output, batch, next_sentence_label)

    def head_losses(self, sequence_output: torch.Tensor, pooled_output: torch.Tensor | None,
                    batch: PaddedBatch | VarlenBatch, next_sentence_label: torch.Tensor | None) -> PretrainingOutput:
        """The MLM head on the masked positions and the pair head, with their losses and counts."""
        hidden = sequence_output.flatten(0, -2).index_select(0, batch.masked_positions)
        # An empty selection keeps the head in the graph, with zero gradients.
        mlm = masked_lm_loss(hidden, self.mlm_head, batch.masked_labels, implementation=self.mlm_loss)
        denominator = mlm.count.clamp(min=1) if batch.mlm_denominator is None else batch.mlm_denominator
        mlm_loss, mlm_count, mlm_correct = mlm.loss_sum / denominator, mlm.count, mlm.correct
        pair_loss, pair_correct, pair_count = self._pair_loss(pooled_output, next_sentence_label, hidden.device)
        return PretrainingOutput(
            loss=mlm_loss + pair_loss, mlm_loss=mlm_loss.detach(), pair_loss=pair_loss.detach(),
            mlm_correct=mlm_correct, mlm_count=mlm_count, pair_correct=pair_correct, pair_count=pair_count)

    def _pair_loss(self, pooled_output: torch.Tensor | None, label: torch.Tensor | None, device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The pair objective's loss, correct predictions and labelled sequences (0 without labels,
        when not trained, or for a family without a pair head)."""
        head = self.pair_head
        zero = torch.zeros((), dtype=torch.long, device=device)
        if head is None:
            return torch.zeros((), device=device), zero, zero
        logits = head(pooled_output)
        if not (self.train_pair and label is not None):
            return logits.sum() * 0.0, zero, zero  # the head stays in the graph
        valid = label != IGNORE_INDEX
        count = valid.sum()
        # A sum over the labelled rows (none: 0, with the head's zero gradients) over their count.
        loss = F.cross_entropy(logits.float(), label, ignore_index=IGNORE_INDEX, reduction="sum") / count.clamp(min=1)
        return loss, ((logits.argmax(-1) == label) & valid).sum(), count


#: The attribute :class:`PretrainingModel` held its transformers model under before ``hf_model``.
OLD_MODEL_ATTRIBUTE = "bert"


def _read_parameters_under_their_old_names(module: PretrainingModel, state_dict: dict, prefix: str, *_) -> None:
    """A state dict saved when the transformers model was ``PretrainingModel.bert`` (a DeepSpeed
    checkpoint's module, keys ``bert.bert.embeddings.…``, ``bert.cls.…``) read under ``hf_model.…``:
    older checkpoints resume. A load-state-dict pre-hook: it renames the keys in place."""
    old = f"{prefix}{OLD_MODEL_ATTRIBUTE}."
    for key in [key for key in state_dict if key.startswith(old)]:
        state_dict[f"{prefix}hf_model.{key[len(old):]}"] = state_dict.pop(key)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
