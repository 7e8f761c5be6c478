"""Model families for pretraining: what differs between BERT, ALBERT and RoBERTa, in one table.

The trainer, the step loop, checkpoints, resumes and ALUM are written once. What a family changes
is the handful of fields of :class:`ModelFamily`, looked up by ``--architecture``
(:func:`get_family`) or by a built model's ``config.model_type`` (:func:`family_of`); nothing
else asks which family runs.

==========  =====================  ========================  ====================  ========  =====================
family      transformers class     MLM head                  pair head (pooled)    unpadded  pair tasks (classes)
==========  =====================  ========================  ====================  ========  =====================
bert        BertForPreTraining     cls.predictions (H→V)     cls.seq_relationship  yes       nsp 2, sop 2, drp 3
albert      AlbertForPreTraining   predictions (H→E→V)       sop_classifier        yes       sop 2, nsp 2
roberta     RobertaForMaskedLM     lm_head (H→V)             none                  yes       none (MLM only)
==========  =====================  ========================  ====================  ========  =====================

* **Building** (:meth:`ModelFamily.build`): the family's config class from a preset's fields and
  the tokenizer's size and [PAD] id. ALBERT presets declare ``model_type: albert`` and hold
  AlbertConfig fields; RoBERTa takes BERT-shaped presets and makes them RoBERTa's layout itself:
  one token type, and ``max_position_embeddings`` raised by ``pad_token_id + 1`` because RoBERTa's
  position ids start after the padding id (512 → 514 with RoBERTa's own pad id 1), so a preset's
  ``max_position_embeddings`` always means the longest sequence the model takes.
* **Token types** go to the encoder when :meth:`ModelFamily.takes_token_type_ids` says so:
  :mod:`biomed_lm.token_types`' one rule (fine-tuning's too) on the family's ``segment_embeddings``
  and the config's ``type_vocab_size``. RoBERTa has one row (its ``fixed_fields``), so it gets none.
* **Pair head.** The data says which pair task its labels are for (``pair_task``: nsp, sop, drp
  or none; :func:`pair_task_of`); a family trains the ones its head takes
  (:func:`resolve_pair_objective` refuses the rest before training). The head is a classifier on
  the pooled [CLS]; BERT's has 2 classes in transformers, so for DRP (3: contiguous, random,
  linked; LinkBERT's document relation prediction) it is replaced by a 3-way one
  (:meth:`ModelFamily.set_pair_task`), recorded in the config as ``pair_task``/``pair_classes``.
* **Layout.** Every family has the unpadded path (:mod:`pretrain.unpadded`): its adapter there,
  named by ``unpadded_encoder``, runs the family's own modules on real tokens only (RoBERTa's
  positions after the padding id and its one token type, ALBERT's E→H embeddings and shared layer
  groups) and lists the modules ``--compile on`` compiles. ``hf_sdpa`` / ``hf_eager`` run
  transformers' padded forward, the reference. A family without an adapter would run the padded
  forward only: ``auto`` would pick ``hf_sdpa`` and say why, and naming an unpadded kernel, or
  ``--compile on``, would be refused (:meth:`ModelFamily.resolve_attention`).
* **Exports** (:meth:`ModelFamily.export`) are ``save_pretrained`` of the family's class and load
  with it and ``AutoModel`` (BERT's also with ``BertForMaskedLM``). The one exception is a head
  the class cannot hold: BERT with DRP. ``BertPreTrainingHeads`` hard-codes a 2-way
  ``seq_relationship``, so a 3-way one in ``model.safetensors`` would make
  ``BertForPreTraining.from_pretrained`` fail on the shape. Such an export keeps everything else
  in ``model.safetensors`` (so ``BertForMaskedLM``, ``AutoModel`` with the trained pooler, and
  ``BertForPreTraining`` with a fresh 2-way head all load it), says ``architectures:
  ["BertForMaskedLM"]``, ``pair_task: "drp"``, ``pair_classes: 3`` in config.json, and saves the
  head beside it as ``pair_head.safetensors``: continual pretraining from the export restores it
  (:meth:`ModelFamily.load_pair_head`). Resuming a run restores it from the run's own checkpoint,
  which holds every parameter of the trained module.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, get_args

import torch
from torch import nn

from biomed_lm.pretrain.attention import PADDED
from biomed_lm.pretrain.config import Architecture, PretrainConfigError
from biomed_lm.positions import position_offset, usable_positions
from biomed_lm.token_types import takes_token_type_ids

#: Classes of each pair task's head (the data contract: the label column holds 0..classes-1 or -100).
PAIR_CLASSES: Mapping[str, int] = MappingProxyType({"nsp": 2, "sop": 2, "drp": 3, "none": 0})
NO_PAIR = "none"
PAIR_HEAD_FILE = "pair_head.safetensors"
#: The config fields every family's run signature records (what the saved tensors depend on).
SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size", "hidden_act", "layer_norm_eps",
                "hidden_dropout_prob", "attention_probs_dropout_prob")


@dataclass(frozen=True)
class PairObjective:
    """The sentence-pair objective of a run: the data's ``data_task``, the ``task`` trained (the
    data's, or none under ``--no-train-pair`` or for a family without a pair head) and the head's
    ``classes`` (the family's default when none is trained; 0 without a head)."""

    data_task: str
    task: str
    classes: int

    @property
    def trained(self) -> bool:
        return self.task != NO_PAIR

    def as_dict(self) -> dict[str, Any]:
        return {"data": self.data_task, "trained": self.task, "classes": self.classes,
                "metrics": "pair_loss, pair_accuracy" if self.trained else None}

    def describe(self) -> str:
        """The run log's line: what the metrics' pair_* keys measure."""
        if self.trained:
            return (f"pair objective: {self.task} ({self.classes} classes, labels from the data's pair_task "
                    f"{self.data_task}); metrics.jsonl's pair_loss and pair_accuracy hold it")
        return (f"pair objective: none (MLM only; the data's pair_task is {self.data_task}); pair_loss is 0 and "
                "pair_accuracy null")


@dataclass(frozen=True)
class ModelFamily:
    """How pretraining builds, runs and exports one model family (the module doc's table)."""

    name: str
    title: str  # for messages: "BERT"
    model_type: str  # transformers' config.model_type
    config_class: str  # transformers names, resolved lazily (importing transformers is slow)
    model_class: str  # what is built, trained and exported
    masked_lm_class: str  # what an export whose pair head model_class cannot hold says it is
    encoder: str  # the encoder's attribute (BertModel, AlbertModel, RobertaModel)
    mlm_head: str  # the MLM head's module path; it has .bias and .decoder (tied to the word embeddings)
    pair_head: str | None  # the pair head's module path (run on the pooled [CLS]); None: no head
    pair_classifier: str | None  # the Linear in it whose outputs are the classes
    pair_tasks: Mapping[str, int]  # pair tasks the head takes -> classes
    native_pair_task: str  # what model_class's head is for (not recorded in the config)
    default_pair_classes: int  # model_class's own head size (0: no head)
    unpadded_encoder: str | None  # its adapter in pretrain.unpadded.ENCODERS (None: padded forward only)
    default_preset: str
    preset_types: tuple[str, ...]  # model_types of the presets it takes
    segment_embeddings: bool = True  # the encoder has token-type embeddings (:meth:`takes_token_type_ids`)
    factorized_embeddings: bool = False  # E-wide embeddings projected to h, an MLM head back through E (ALBERT)
    pair_label_argument: str | None = "next_sentence_label"  # model_class.forward's pair label (None: no head)
    positions_after_padding: bool = False  # RoBERTa: position ids start at pad_token_id + 1
    fixed_fields: Mapping[str, Any] = field(default_factory=dict)  # config fields set whatever the preset says
    signature_fields: tuple[str, ...] = ()  # recorded beyond SHAPE_FIELDS
    initializable: tuple[str, ...] = ()  # parameter prefixes a checkpoint may lack (heads, pooler)

    @property
    def unpadded(self) -> bool:
        """Whether it runs :mod:`pretrain.unpadded`'s varlen path."""
        return self.unpadded_encoder is not None

    # ------------------------------------------------------------------ classes and modules

    def transformers_class(self, name: str) -> type:
        import transformers

        return getattr(transformers, name)

    def takes_token_type_ids(self, config) -> bool:
        """Whether a model of this family with this config is given ``token_type_ids``: the one rule
        of :mod:`biomed_lm.token_types` (RoBERTa's one token type: no; BERT's and ALBERT's two: yes)."""
        return takes_token_type_ids(self.segment_embeddings, getattr(config, "type_vocab_size", None))

    def encoder_of(self, model: nn.Module) -> nn.Module:
        return model.get_submodule(self.encoder)

    def mlm_head_of(self, model: nn.Module) -> nn.Module:
        return model.get_submodule(self.mlm_head)

    def pair_head_of(self, model: nn.Module) -> nn.Module | None:
        return None if self.pair_head is None else model.get_submodule(self.pair_head)

    def pair_classes_of(self, model: nn.Module) -> int:
        """The classes of the model's pair head (0: no head)."""
        return 0 if self.pair_classifier is None else model.get_submodule(self.pair_classifier).out_features

    @property
    def vocabulary_tensors(self) -> tuple[str, str, str, str]:
        """The state-dict entries indexed by vocabulary id: word embeddings, the MLM output bias, and
        the decoder's weight and bias (tied to the first two)."""
        return (f"{self.encoder}.embeddings.word_embeddings.weight", f"{self.mlm_head}.bias",
                f"{self.mlm_head}.decoder.weight", f"{self.mlm_head}.decoder.bias")

    # ------------------------------------------------------------------ presets and configs

    def preset_fields(self, fields: dict[str, Any], name: str) -> dict[str, Any]:
        """A preset's config fields for this family (``pretrain.config.load_model_preset``'s output,
        its declared ``model_type`` checked and dropped)."""
        declared = fields.get("model_type", "bert")
        if declared not in self.preset_types:
            family = _BY_MODEL_TYPE.get(declared)
            fix = f"pass --architecture {family.name}" if family else "use a preset of this family"
            raise PretrainConfigError(
                f"model preset {name!r} describes {_article(declared)} {declared} model (model_type: {declared}) "
                f"but --architecture is {self.name}, which takes {' or '.join(self.preset_types)} presets: {fix}, "
                f"or choose another --model (default for {self.name}: {self.default_preset})")
        return {key: value for key, value in fields.items() if key != "model_type"}

    def position_offset(self, pad_token_id: int | None) -> int:
        """Position-embedding rows before the first position (RoBERTa: ids start after the padding id)."""
        return position_offset(self.positions_after_padding, pad_token_id)

    def usable_positions(self, config) -> int:
        """The longest sequence a built or saved model takes (what the data is checked against)."""
        return usable_positions(config.max_position_embeddings, self.positions_after_padding, config.pad_token_id)

    def build_config(self, fields: dict[str, Any], vocab_size: int, pad_token_id: int):
        """The family's config from a preset's fields and the tokenizer's size and [PAD] id."""
        values = {key: value for key, value in fields.items() if key != "model_type"}
        values.update(self.fixed_fields)
        if self.positions_after_padding:
            values["max_position_embeddings"] = (int(values.get("max_position_embeddings", 512))
                                                 + self.position_offset(pad_token_id))
        config = self.transformers_class(self.config_class)(**values, vocab_size=vocab_size, pad_token_id=pad_token_id)
        config.architectures = [self.model_class]
        return config

    def build(self, fields: dict[str, Any], vocab_size: int, pad_token_id: int, attn_implementation: str = "sdpa",
              pair_task: str | None = None) -> nn.Module:
        """A freshly initialized model (torch's global generator: seed it first); ``pair_task``: see
        :meth:`set_pair_task` (None: the class's own head)."""
        config = self.build_config(fields, vocab_size, pad_token_id)
        model = self.transformers_class(self.model_class)._from_config(config, attn_implementation=attn_implementation)
        self.set_pair_task(model, pair_task)
        return model

    def set_pair_task(self, model: nn.Module, pair_task: str | None) -> bool:
        """Size the pair head for ``pair_task`` (``none``: the class's default head, untrained) and
        record a task other than the class's own in the config (``pair_task``, and ``pair_classes``
        when the head is not the class's size). True when a new, randomly initialized head replaced
        the model's (torch's global generator); None leaves the model as it is."""
        if pair_task is None or self.pair_classifier is None:
            return False
        config = model.config
        for key in ("pair_task", "pair_classes"):
            if key in config.__dict__:
                delattr(config, key)
        classes = PAIR_CLASSES[pair_task] or self.default_pair_classes
        if pair_task not in (NO_PAIR, self.native_pair_task):
            config.pair_task = pair_task
        if classes != self.default_pair_classes:
            config.pair_classes = classes
        head = model.get_submodule(self.pair_classifier)
        if head.out_features == classes:
            return False
        new = nn.Linear(head.in_features, classes, device=head.weight.device, dtype=head.weight.dtype)
        with torch.no_grad():  # BERT's and ALBERT's initialization of a Linear
            new.weight.normal_(mean=0.0, std=config.initializer_range)
            new.bias.zero_()
        parent, _, name = self.pair_classifier.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, name, new)
        return True

    def signature(self, config) -> dict[str, Any]:
        """The model's shape as its config says it (run signatures: a resume must fit the tensors)."""
        shape = {key: getattr(config, key, None) for key in SHAPE_FIELDS + self.signature_fields}
        if getattr(config, "pair_classes", None):
            shape["pair_classes"] = config.pair_classes
        return shape

    # ------------------------------------------------------------------ running

    def resolve_attention(self, requested: str, compile_setting: str) -> tuple[str, list[str]]:
        """The attention setting to run with and notes for the log's "passed over" list. A family
        without the unpadded path runs transformers' padded forward: ``auto`` becomes ``hf_sdpa``
        (the note says why); an unpadded kernel by name, or ``--compile on``, is refused."""
        if self.unpadded:
            return requested, []
        if compile_setting == "on":
            raise PretrainConfigError(
                f"--compile on compiles the unpadded path's dense blocks; the {self.name} family runs "
                "transformers' padded forward, which is not compiled: use --compile auto or off")
        if requested in PADDED:
            return requested, []
        if requested == "auto":
            return "hf_sdpa", [f"unpadded kernels: the {self.name} family runs transformers' padded forward only "
                               "(no unpadded path, no compiled dense blocks)"]
        raise PretrainConfigError(
            f"--attn-implementation {requested} is an unpadded kernel, and the {self.name} family has no unpadded "
            f"path: use --attn-implementation auto or hf_sdpa (or hf_eager)")

    def encode_padded(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      token_type_ids: torch.Tensor, inputs_embeds: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """transformers' own forward of the encoder: last hidden states and the pooled [CLS] (None
        for an encoder without a pooler)."""
        kwargs = {"input_ids": None if inputs_embeds is not None else input_ids, "inputs_embeds": inputs_embeds,
                  "attention_mask": attention_mask}
        if self.takes_token_type_ids(model.config):
            kwargs["token_type_ids"] = token_type_ids
        out = self.encoder_of(model)(**kwargs)
        return out.last_hidden_state, getattr(out, "pooler_output", None)

    # ------------------------------------------------------------------ exports

    def export(self, model: nn.Module, tokenizer, path: Path) -> None:
        """A transformers-format copy (config, safetensors, tokenizer); the module doc says what loads it."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self.pair_classes_of(model) == self.default_pair_classes:
            (path / PAIR_HEAD_FILE).unlink(missing_ok=True)
            model.save_pretrained(str(path), safe_serialization=True)
        else:
            self._export_with_pair_head_beside(model, path)
        # The tokenizer truncates to what the model takes (a vocabulary is saved with 512 whatever the model is
        # built with: a 128-position export cut at 512 and failed in transformers, QA).
        own_limit, tokenizer.model_max_length = tokenizer.model_max_length, self.usable_positions(model.config)
        try:
            tokenizer.save_pretrained(str(path))
        finally:
            tokenizer.model_max_length = own_limit
        _copy_vocabulary_files(tokenizer, path)
        _prefix_space_as_trained(path)

    def _export_with_pair_head_beside(self, model: nn.Module, path: Path) -> None:
        from safetensors.torch import save_file

        prefix = f"{self.pair_head}."
        state = model.state_dict()
        model.save_pretrained(str(path), safe_serialization=True,
                              state_dict={k: v for k, v in state.items() if not k.startswith(prefix)})
        save_file({k: v.detach().contiguous() for k, v in state.items() if k.startswith(prefix)},
                  str(path / PAIR_HEAD_FILE), metadata={"pair_task": str(getattr(model.config, "pair_task", "")),
                                                        "format": "pt"})
        config_path = path / "config.json"
        config = json.loads(config_path.read_text(encoding="utf-8"))
        config["architectures"] = [self.masked_lm_class]  # save_pretrained wrote the class it was called on
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    def load_pair_head(self, model: nn.Module, path: Path) -> list[str]:
        """Load the pair head an export saved beside its weights (:data:`PAIR_HEAD_FILE`) into
        ``model`` when it fits the model's head; the parameter names loaded (empty: none)."""
        file, head = Path(path) / PAIR_HEAD_FILE, self.pair_head_of(model)
        if head is None or not file.is_file():
            return []
        from safetensors.torch import load_file

        tensors, prefix = load_file(str(file)), f"{self.pair_head}."
        own = dict(head.named_parameters())
        if {prefix + name for name in own} != set(tensors) or any(
                tensors[prefix + name].shape != parameter.shape for name, parameter in own.items()):
            return []
        with torch.no_grad():
            for name, parameter in own.items():
                parameter.copy_(tensors[prefix + name])
        return [prefix + name for name in own]


BERT = ModelFamily(
    name="bert", title="BERT", model_type="bert", config_class="BertConfig", model_class="BertForPreTraining",
    masked_lm_class="BertForMaskedLM", encoder="bert", mlm_head="cls.predictions",
    pair_head="cls.seq_relationship", pair_classifier="cls.seq_relationship",
    pair_tasks=MappingProxyType({"nsp": 2, "sop": 2, "drp": 3}), native_pair_task="nsp", default_pair_classes=2,
    unpadded_encoder="bert", default_preset="bert-base", preset_types=("bert",), initializable=("cls.", "bert.pooler."))
ALBERT = ModelFamily(
    name="albert", title="ALBERT", model_type="albert", config_class="AlbertConfig",
    model_class="AlbertForPreTraining", masked_lm_class="AlbertForMaskedLM", encoder="albert",
    mlm_head="predictions", pair_head="sop_classifier", pair_classifier="sop_classifier.classifier",
    pair_tasks=MappingProxyType({"sop": 2, "nsp": 2}), native_pair_task="sop", default_pair_classes=2,
    unpadded_encoder="albert", default_preset="albert-base", preset_types=("albert",),
    pair_label_argument="sentence_order_label", factorized_embeddings=True,
    signature_fields=("model_type", "embedding_size", "num_hidden_groups", "inner_group_num"),
    initializable=("predictions.", "sop_classifier.", "albert.pooler."))
ROBERTA = ModelFamily(
    name="roberta", title="RoBERTa", model_type="roberta", config_class="RobertaConfig",
    model_class="RobertaForMaskedLM", masked_lm_class="RobertaForMaskedLM", encoder="roberta", mlm_head="lm_head",
    pair_head=None, pair_classifier=None, pair_tasks=MappingProxyType({}), native_pair_task=NO_PAIR,
    default_pair_classes=0, unpadded_encoder="roberta", default_preset="bert-base", preset_types=("bert", "roberta"),
    pair_label_argument=None, positions_after_padding=True,
    fixed_fields=MappingProxyType({"type_vocab_size": 1}),
    signature_fields=("model_type",), initializable=("lm_head.",))

FAMILIES: Mapping[str, ModelFamily] = MappingProxyType({family.name: family for family in (BERT, ALBERT, ROBERTA)})
assert tuple(FAMILIES) == get_args(Architecture)  # one choice set: pretrain.config's Literal
_BY_MODEL_TYPE = {family.model_type: family for family in FAMILIES.values()}


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def get_family(architecture: str) -> ModelFamily:
    """The family ``--architecture`` names."""
    try:
        return FAMILIES[architecture]
    except KeyError:
        raise PretrainConfigError(f"unknown architecture {architecture!r}; choose one of "
                                  f"{', '.join(FAMILIES)}") from None


def family_of(config) -> ModelFamily:
    """The family of a model's config (its ``model_type``)."""
    model_type = getattr(config, "model_type", None)
    if model_type not in _BY_MODEL_TYPE:
        raise PretrainConfigError(f"pretraining has no model family for model_type {model_type!r} "
                                  f"(families: {', '.join(FAMILIES)})")
    return _BY_MODEL_TYPE[model_type]


# ----------------------------------------------------------------------------- the pair task

def pair_task_of(metadata: Mapping[str, Any]) -> str:
    """The pair task of pretraining data's metadata: its ``pair_task``, or for data written before
    that key, ``nsp`` / ``none`` from its ``nsp`` flag."""
    task = metadata.get("pair_task")
    if task is None:
        return "nsp" if metadata.get("nsp") else NO_PAIR
    if task not in PAIR_CLASSES:
        raise PretrainConfigError(f"the data's pair_task {task!r} is not one of {', '.join(PAIR_CLASSES)}")
    classes = metadata.get("pair_classes")
    if classes is not None and classes != PAIR_CLASSES[task]:
        raise PretrainConfigError(f"the data says pair_task {task} with {classes} classes; {task} has "
                                  f"{PAIR_CLASSES[task]}: the metadata is inconsistent, rebuild the data")
    return task


def resolve_pair_objective(family: ModelFamily, metadata: Mapping[str, Any], train_pair: bool = True,
                           source: str = "the data") -> PairObjective:
    """The pair objective a run of ``family`` trains on data with this metadata (``train_pair``:
    ``--train-pair``, the default; ``--no-train-pair`` trains MLM only). A pair task the family's
    head cannot take is a :class:`PretrainConfigError` naming the architecture, the task and the fix."""
    data_task = pair_task_of(metadata)
    default = PairObjective(data_task, NO_PAIR, family.default_pair_classes)
    if not train_pair or (data_task == NO_PAIR and family.pair_head is None):
        return default
    if data_task == NO_PAIR:
        raise PretrainConfigError(
            f"{source} was built without sentence pairs (pair_task none) but training expects the {family.name} "
            f"pair objective ({', '.join(family.pair_tasks)}): rebuild it with a pair task, or pass --no-train-pair "
            "to train MLM only")
    if data_task not in family.pair_tasks:
        if family.pair_head is None:
            fix = (f"{family.title} has no pair head: rebuild the data with pair_task none, pass --no-train-pair to "
                   f"train MLM only on these instances, or use --architecture bert")
        else:
            takers = [name for name, other in FAMILIES.items() if data_task in other.pair_tasks]
            fix = (f"its head takes {', '.join(family.pair_tasks)}: rebuild the data with one of them, pass "
                   f"--no-train-pair to train MLM only, or use --architecture {' or '.join(takers)}")
        raise PretrainConfigError(
            f"architecture {family.name} cannot train {source}'s pair task {data_task} "
            f"({PAIR_CLASSES[data_task]} classes); {fix}")
    return PairObjective(data_task, data_task, family.pair_tasks[data_task])


def _copy_vocabulary_files(tokenizer, path: Path) -> None:
    """The vocabulary folder's own files that a fast tokenizer's ``save_pretrained`` leaves out (QA: an ALBERT
    export had no ``spiece.model``, a RoBERTa one no ``vocab.json``/``merges.txt``): slow tokenizers,
    ``sentencepiece`` and fairseq need them; the card says how the vocabulary was built. A file the save
    wrote is kept."""
    from biomed_lm.tokenization.tokenizer_io import SENTENCEPIECE_MODEL_FILE, VOCAB_CARD

    name = getattr(tokenizer, "name_or_path", "") or ""
    source = Path(name)
    if not name or not source.is_dir() or source.resolve() == path.resolve():  # "": not the working directory
        return
    for name in (SENTENCEPIECE_MODEL_FILE, "vocab.txt", "vocab.json", "merges.txt", VOCAB_CARD):
        if (source / name).is_file() and not (path / name).exists():
            shutil.copyfile(source / name, path / name)


def _prefix_space_as_trained(path: Path) -> None:
    """A byte-level BPE export tokenizes a text's first word with its ``Ġ``, as every instance gave it to the model
    (:func:`pretrain.instance_builder.pipeline_tokenizer`: each sentence is tokenized as running text). Saved as
    the vocabulary was (RoBERTa's ``add_prefix_space: false``), transformers users fed the first word of every
    input in a form pretraining never showed (QA)."""
    from tokenizers import Tokenizer

    from biomed_lm.tokenization.tokenizer_io import with_prefix_space

    tokenizer_file, config_file = path / "tokenizer.json", path / "tokenizer_config.json"
    if not tokenizer_file.is_file():
        return
    backend = Tokenizer.from_file(str(tokenizer_file))
    if not with_prefix_space(backend):
        return
    backend.save(str(tokenizer_file))
    if config_file.is_file():
        config = json.loads(config_file.read_text(encoding="utf-8"))
        config["add_prefix_space"] = True
        config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
