"""Checkpoint families: everything fine-tuning does differently per encoder architecture, in one table.

The task adapters, heads and the loop are written once for every encoder. What differs between the
architectures a checkpoint may come from is how its tokenizer is prepared and its encoder fed: the
handful of fields of :class:`CheckpointFamily`, looked up by the checkpoint's ``config.model_type``
(:func:`checkpoint_family`). (Pretraining's family table, :mod:`pretrain.families`, is another: how
a model of one ``--architecture`` is built, trained and exported.) Two places read this one:
:mod:`finetune.model_check` prepares the tokenizer (prefix space, pad token, EOS framing) and checks
the special tokens; :mod:`finetune.modeling` calls the encoder (token types or not) and reads the
sequence representation. Nothing else branches on the architecture.

==========  ===============  ==================  =============  ============  ===========================
family      tokenizer        token_type_ids      pad token      prefix space  sequence representation
==========  ===============  ==================  =============  ============  ===========================
bert        WordPiece        passed              [PAD]          no            first token ([CLS])
roberta     byte-level BPE   not (one type)      <pad>          yes           first token (<s>)
albert      SentencePiece    passed              <pad>          no            first token ([CLS])
electra     WordPiece        passed              [PAD]          no            first token ([CLS])
deberta-v2  SentencePiece    only if 2+ types    [PAD]          no            first token ([CLS])
gpt2        byte-level BPE   never               EOS (none)     yes           last real token (an EOS)
==========  ===============  ==================  =============  ============  ===========================

* **token_type_ids** are passed only to a family with segment embeddings *and* a checkpoint whose
  ``type_vocab_size`` is at least 2 (:func:`biomed_lm.token_types.takes_token_type_ids`, the rule
  pretraining follows too): RoBERTa has one type, DeBERTa-v3 none, and GPT-2 no segment embeddings
  (its forward would embed 0/1 types with the *word* embeddings).
* **prefix space**: byte-level BPE marks a word start by the space before it ("Ġword"). NER and
  PICO tokenize pre-split words one by one, so the tokenizer is loaded with
  ``add_prefix_space=True`` and each word is tokenized as it is inside running text. The setting is
  the tokenizer's, so it holds for every task: a sentence's or a question's first word gets its ``Ġ``
  too. That is how this toolkit's pretraining gave every sentence to the model (its exports say
  ``add_prefix_space: true``); a checkpoint pretrained without it (roberta-base: no ``Ġ`` at a text's
  start) sees one first word per input in a form it met only mid-text.
* **GPT-2** is a left-to-right decoder used as an encoder. Its tokenizer has no pad token, no
  [CLS] and no [SEP]: the pad token is set to EOS (padding is then told apart by the attention
  mask, never by the id) and the tokenizer appends EOS to every segment (``text <eos>``, a pair as
  ``a <eos> b <eos>``: a separator for pairs). The sequence representation is the state of the
  last real (non-pad) token, that closing EOS: the only position that has attended over the whole
  input (the first token, BERT's [CLS] position, sees only itself). Token tagging reads each
  word's first sub-word, as for every family (it sees the words before it, not those after).

* **a prepared padding mask**: BERT, RoBERTa, ALBERT and ELECTRA are handed the padding mask as the
  additive ``(batch, 1, 1, tokens)`` mask transformers itself builds for its SDPA and eager
  attention, which it uses as it is; given the 2D mask, transformers first reads it back to see
  whether every token is real (to leave the mask out), and on a GPU that read waits for the device
  in every forward. DeBERTa-v2 (its own relative-position masking) and GPT-2 (causal) take the 2D
  mask, and so does an encoder loaded with another attention implementation.

A ``model_type`` not in the table (DistilBERT, XLM-RoBERTa, ...) gets :data:`GENERIC`: BERT's
handling, with token types still subject to ``type_vocab_size``. Adding an architecture is one entry
here and a tiny checkpoint in ``tests/test_finetune_architectures.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Mapping

from biomed_lm.errors import InputError
from biomed_lm.token_types import takes_token_type_ids

__all__ = ["CheckpointFamily", "CHECKPOINT_FAMILIES", "GENERIC", "checkpoint_family", "prepare_tokenizer"]

SequenceToken = Literal["first", "last"]


@dataclass(frozen=True)
class CheckpointFamily:
    """How fine-tuning tokenizes for and feeds the encoder of a checkpoint of one architecture (the
    module doc's table)."""

    name: str
    model_types: tuple[str, ...] = ()
    #: the encoder has segment embeddings fed by token_type_ids (see :meth:`takes_token_type_ids`)
    segment_embeddings: bool = True
    #: byte-level BPE: load the tokenizer with add_prefix_space=True (pre-split words of NER/PICO; every task)
    prefix_space: bool = False
    #: the tokenizer ships no pad token: pad with EOS (the attention mask marks padding)
    pad_from_eos: bool = False
    #: the tokenizer frames nothing (no [CLS]/[SEP]): make it close every segment with EOS
    eos_after_segments: bool = False
    #: where the sequence representation is read: the first token ([CLS]) or the last real one
    sequence_token: SequenceToken = "first"
    #: position ids count from the padding id + 1 (RoBERTa's): max_position_embeddings - pad - 1 are usable
    positions_after_padding: bool = False
    #: special tokens the inputs need, after :func:`prepare_tokenizer`
    special_tokens: tuple[str, ...] = ("cls", "sep", "pad", "unk")
    #: checkpoint classes (config.architectures) that are not this family's encoder, with what to use
    not_encoders: Mapping[str, str] = field(default_factory=dict)
    #: the encoder takes a prepared additive padding mask under SDPA and eager attention (module doc)
    prepared_mask: bool = False

    def tokenizer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``AutoTokenizer.from_pretrained`` for this family."""
        return {"add_prefix_space": True} if self.prefix_space else {}

    def takes_token_type_ids(self, config: Any) -> bool:
        """Whether the encoder of a checkpoint with this ``config`` is given ``token_type_ids``."""
        return takes_token_type_ids(self.segment_embeddings, getattr(config, "type_vocab_size", None))


GENERIC = CheckpointFamily("generic")

CHECKPOINT_FAMILIES: Mapping[str, CheckpointFamily] = MappingProxyType({family.name: family for family in (
    CheckpointFamily("bert", ("bert",), prepared_mask=True),
    CheckpointFamily("roberta", ("roberta",), prefix_space=True, prepared_mask=True, positions_after_padding=True),
    CheckpointFamily("albert", ("albert",), prepared_mask=True),
    CheckpointFamily("electra", ("electra",), prepared_mask=True, not_encoders=MappingProxyType({
        "ElectraForMaskedLM": "an ELECTRA generator; fine-tune the discriminator (ElectraForPreTraining) instead"})),
    CheckpointFamily("deberta-v2", ("deberta-v2",)),
    CheckpointFamily("gpt2", ("gpt2",), segment_embeddings=False, prefix_space=True, pad_from_eos=True,
                     eos_after_segments=True, sequence_token="last", special_tokens=("eos", "pad", "unk")),
)})
_BY_MODEL_TYPE = {model_type: family for family in CHECKPOINT_FAMILIES.values() for model_type in family.model_types}


def checkpoint_family(model_type: str | None) -> CheckpointFamily:
    """The family of a checkpoint's ``config.model_type``; :data:`GENERIC` for any other type."""
    return _BY_MODEL_TYPE.get(str(model_type), GENERIC)


def prepare_tokenizer(tokenizer, family: CheckpointFamily) -> list[str]:
    """Set what ``family`` needs on a loaded tokenizer (pad token, EOS framing, a byte-level BPE's prefix
    space); returns notes for the run record. The prefix space is a loading option
    (:meth:`CheckpointFamily.tokenizer_kwargs`) that transformers' generic fast tokenizer (an uncased
    byte-level BPE export) ignores (QA: NER words tokenized as text starts, ``['p','ati','ent']``), so it
    is also set on the backend here."""
    from biomed_lm.tokenization.tokenizer_io import with_prefix_space

    notes = []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if family.prefix_space and backend is not None and with_prefix_space(backend):
        notes.append(f"{family.name}: the tokenizer's byte-level pre-tokenizer set to add a prefix space "
                     "(add_prefix_space was not applied on loading)")
    if family.pad_from_eos and tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise InputError(f"{family.name}: the tokenizer has neither a pad nor an EOS token to pad with")
        tokenizer.pad_token = tokenizer.eos_token
        notes.append(f"{family.name}: no pad token; padding with EOS {tokenizer.eos_token!r} (masked out)")
    if family.eos_after_segments:
        tokenizer.add_eos_token = True  # transformers' template: "$A <eos>", pairs "$A <eos> $B <eos>"
        ids = tokenizer("a")["input_ids"]
        if not ids or ids[-1] != tokenizer.eos_token_id:
            raise InputError(f"{family.name}: the tokenizer ({type(tokenizer).__name__}) cannot be made to append "
                             "EOS, the token the sequence representation is read at")
        notes.append(f"{family.name}: every segment ends with EOS; the sequence representation is its state")
    return notes
