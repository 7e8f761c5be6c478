"""Typed configuration of a pretraining run, and the DeepSpeed config generated from it.

One set of dataclasses describes the run (``configs/pretrain/*.yaml`` + command-line overrides);
the DeepSpeed config is *derived* from them by :func:`create_ds_config`, never written by hand,
so batch sizes, accumulation, clipping and precision cannot disagree between the two. The global
batch is ``micro_batch_size × gradient_accumulation_steps × world_size``; give
``global_batch_size`` instead of the accumulation steps and they are derived (the paper's 8,192
on 64 GPUs with micro-batches of 32 is 4 accumulation steps).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

from biomed_lm.backend import OptimizerName, ScheduleName, ZeroStage, ds_config
from biomed_lm.config import load_yaml_mapping
from biomed_lm.errors import PretrainError
from biomed_lm.resources import resolve_path, shipped_dir

Precision = Literal["fp32", "fp16", "bf16", "fp8"]  # fp8: pretrain.fp8 (torchao), DeepSpeed in bf16
WandbMode = Literal["offline", "online", "disabled"]
MaskSchedule = Literal["constant", "stepwise", "linear"]  # pretrain.masking.MASK_SCHEDULES is built from it
# pretrain.attention.KERNELS has one entry per varlen kernel here; hf_* are transformers' padded forward.
AttentionImplementation = Literal["auto", "flash_attn", "varlen", "sdpa_padded", "flex", "sdpa_nested", "sdpa_loop",
                                  "hf_sdpa", "hf_eager"]


class PretrainConfigError(PretrainError, ValueError):
    """Options that cannot work together; raised before anything heavy starts."""


InitMode = Literal["scratch", "continual", "continual-new-vocab"]
# The model families pretraining builds; pretrain.families.FAMILIES has one entry per name.
Architecture = Literal["bert", "albert", "roberta"]


@dataclass
class ModelArguments:
    architecture: Architecture = field(default="bert", metadata={
        "help": "the model family: bert (BertForPreTraining; pair tasks nsp, sop, drp), albert "
                "(AlbertForPreTraining: factorized embeddings, shared layers, SOP head; pair tasks sop, nsp) or "
                "roberta (RobertaForMaskedLM: MLM only, no pair head); every family trains on the real tokens "
                "only (unpadded), as --attention names"})
    init: InitMode = field(default="scratch", metadata={
        "help": "scratch: random weights, the in-domain vocabulary (PubMedBERT); continual: a general-domain "
                "checkpoint and its own vocabulary (BioBERT); continual-new-vocab: its weights with the "
                "in-domain vocabulary (shared tokens copied, new ones from the mean of their old pieces)"})
    init_checkpoint: str = field(default="", metadata={
        "help": "the general-domain checkpoint directory the continual modes start from (e.g. bert-base-uncased; "
                "of the --architecture family)"})
    model: str = field(default="", metadata={
        "help": "a preset in configs/model (bert-base, bert-large, bert-small, bert-tiny, bioformer-8l, "
                "bioformer-16l, minilm-l6; albert-base, albert-large, albert-tiny) or a YAML/JSON file of the "
                "family's config fields (vocab_size always comes from the tokenizer; roberta takes BERT presets); "
                "default: bert-base (albert-base for albert) from scratch, the checkpoint's own architecture in "
                "the continual modes"})
    attn_implementation: AttentionImplementation = field(default="auto", metadata={
        "help": "attention over the unpadded batch: auto (the fastest that runs here: flash_attn, varlen (without "
                "attention dropout), sdpa_padded or flex on CUDA, sdpa_loop on CPU; the run log says which), or one "
                "of them by name; "
                "hf_sdpa / hf_eager run transformers' padded forward (the reference)"})
    compile: Literal["auto", "on", "off"] = field(default="auto", metadata={
        "help": "torch.compile the model: the forward and backward by layer (or whole: --compile-scope) where "
                "the attention kernel allows (else the dense blocks); auto: on for CUDA, off on CPU"})
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = field(
        default="default", metadata={
        "help": "torch.compile's mode for the compiled regions: max-autotune-no-cudagraphs times inductor's "
                "GEMM templates (which can fuse their neighbours, the bias and GELU) against cuBLAS and keeps the "
                "faster, at a longer compilation; reduce-overhead adds CUDA graphs (either "
                "scope), one per shape: a token-count bucket (--bucket-tokens) and a masked-count bucket (256); "
                "each shape runs uncaptured once, then records, then replays. BERT-base at micro-batch 256 on an "
                "H200 keeps the GPU busy 96 per cent of the time without them; they added 0.5 per cent "
                "(benchmarks/README.md, run C); max-autotune does both"})
    compile_scope: Literal["layers", "whole"] = field(default="layers", metadata={
        "help": "what one compiled region holds: layers (the embeddings, one encoder layer whose graph every "
                "layer runs through, and the heads with their losses: three graphs, compiled in a fraction of "
                "the time) or whole (the entire forward as one region)"})
    layers_per_graph: int = field(default=1, metadata={
        "help": "with --compile-scope layers: consecutive encoder layers per compiled region (12 layers, 4: three "
                "region calls a forward instead of twelve, less host time a step, a graph four times as large "
                "to compile)", "min": 1})
    residual_stream: Literal["fp32", "half"] = field(default="fp32", metadata={
        "help": "the dtype of the hidden states between sub-layers (what each residual adds onto) on the unpadded "
                "path: fp32 (autocast's: LayerNorm returns fp32; transformers' numerics) or half (bf16 under "
                "--precision bf16 and fp8, fp16 under fp16; LayerNorm still computed in fp32 inside its kernel, "
                "Megatron-LM's default): half the bytes in the LayerNorm, dropout and residual kernels. Needs a "
                "half precision"})
    bucket_tokens: int = field(default=128, metadata={
        "help": "when compiling, round each micro-batch's token count up to a multiple of this, so the number "
                "of compiled shapes stays bounded (the rounding is padding the log reports)", "min": 1})


@dataclass
class DataArguments:
    data_dir: str = field(default="", metadata={
        "help": "pretraining instances made by launch/create_pretraining_data.py"})
    tokenizer: str = field(default="", metadata={
        "help": "tokenizer directory; must be the vocabulary the instances were made with"})
    mlm_probability: float = field(default=0.15, metadata={"help": "share of real tokens masked", "min": 0, "max": 1})
    whole_word_masking: bool = field(default=True, metadata={
        "help": "mask whole words (all their pieces); --no-whole-word-masking masks single tokens"})
    mask_schedule: MaskSchedule = field(default="constant", metadata={
        "help": "masking rate over training: constant (mlm_probability), stepwise (mlm_probability rising to "
                "mask_rate_end in mask_schedule_stages equal steps) or linear (mlm_probability to mask_rate_end)"})
    mask_rate_end: Optional[float] = field(default=None, metadata={
        "help": "the masking rate a stepwise or linear schedule ends at (e.g. 0.25 from 0.05, or 0.15 from 0.30)",
        "min": 0, "max": 1})
    mask_schedule_stages: int = field(default=5, metadata={"help": "stages of a stepwise schedule", "min": 1})
    max_ngram: int = field(default=1, metadata={
        "help": "with whole-word masking, mask spans of up to this many words, n with probability proportional "
                "to 1/n (ALBERT's n-gram masking: 3); 1 masks single words", "min": 1})
    max_predictions: Optional[int] = field(default=None, metadata={
        "help": "at most this many masked tokens per sequence (max_predictions_per_seq: ALBERT's and BioALBERT's 20 "
                "at length 512; BERT's about length x rate, 20 at 128 and 80 at 512); default: the rate alone "
                "decides", "min": 1})
    train_pair: bool = field(default=True, metadata={
        "help": "train the data's sentence-pair objective (its pair_task: nsp, sop or drp; the data must have one, "
                "and the architecture's head must take it); --no-train-pair trains MLM only. metrics.jsonl's "
                "pair_loss and pair_accuracy hold whichever pair task ran (run_config.json's pair_task says which). "
                "Its old name, nsp (--nsp, --no-nsp, YAML nsp:), is still read", "old_name": "nsp"})
    num_workers: int = field(default=1, metadata={"help": "DataLoader worker processes per rank", "min": 0})


@dataclass
class TrainArguments:
    output_dir: str = field(default="", metadata={"help": "run directory: checkpoints, metrics.jsonl, exports"})
    max_steps: int = field(default=1000, metadata={"help": "optimizer steps (the paper: 62,500 at batch 8,192)",
                                                   "min": 1})
    micro_batch_size: int = field(default=32, metadata={"help": "sequences per rank per forward pass", "min": 1})
    gradient_accumulation_steps: int = field(default=1, metadata={
        "help": "micro-batches per optimizer step (derived when global_batch_size is set)", "min": 1})
    global_batch_size: int = field(default=0, metadata={
        "help": "sequences per optimizer step over all ranks; 0 means micro × accumulation × world size", "min": 0})
    optimizer: OptimizerName = field(default="adamw", metadata={"help": "adamw or lamb"})
    learning_rate: float = field(default=6e-4, metadata={"help": "peak learning rate (the paper: 6e-4)", "gt": 0})
    adam_beta1: float = field(default=0.9, metadata={"help": "Adam/LAMB β1", "min": 0, "lt": 1})
    adam_beta2: float = field(default=0.999, metadata={"help": "Adam/LAMB β2", "min": 0, "lt": 1})
    adam_epsilon: float = field(default=1e-6, metadata={"help": "Adam/LAMB ε", "gt": 0})
    weight_decay: float = field(default=0.01, metadata={"help": "not applied to biases and LayerNorm weights",
                                                        "min": 0})
    schedule: ScheduleName = field(default="slanted_triangular", metadata={
        "help": "slanted_triangular (linear warm-up, linear decay to 0), polynomial (the decay's remaining "
                "fraction to the power polynomial_power: HF's), polynomial_from_start (the run's remaining "
                "fraction: NVIDIA's BERT recipe, a drop at the warm-up's end) or constant_with_warmup"})
    warmup_ratio: float = field(default=0.1, metadata={"help": "share of the schedule spent warming up",
                                                       "min": 0, "lt": 1})
    schedule_total_steps: int = field(default=0, metadata={
        "help": "steps the learning-rate schedule spans; 0: max_steps. One schedule over two phases: phase 1 "
                "stops at max_steps 56,250 of a 62,500-step schedule, phase 2 continues it (--continue-from)",
        "min": 0})
    continue_from: str = field(default="", metadata={
        "help": "start this run from another run's latest checkpoint (a run directory, or one checkpoint "
                "directory in it): model, optimizer, scheduler and step count carry over, the data stream is "
                "this run's. For phase 2 of a two-phase schedule; ignored once this run has checkpoints"})
    polynomial_power: float = field(default=1.0, metadata={"help": "power of the polynomial decay", "gt": 0})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping (0 disables)", "min": 0})
    precision: Precision = field(default="fp32", metadata={
        "help": "fp32 (CPU), bf16 or fp16 (GPU); fp8: torchao's float8 matmuls in the encoder's Linear layers and "
                "bf16 autocast elsewhere (compute capability 8.9+: L40S, H100, H200; pip install torchao)"})
    zero_stage: ZeroStage = field(default=0, metadata={"help": "DeepSpeed ZeRO stage 0, 1 or 2"})
    seed: int = field(default=42, metadata={"help": "seed of the weights, masks and data order", "min": 0})
    checkpoint_every: int = field(default=500, metadata={"help": "steps between checkpoints (and one at the end)",
                                                         "min": 1})
    keep_last: int = field(default=3, metadata={"help": "checkpoints kept; older ones are deleted (0: keep all)",
                                                "min": 0})
    export_hf: bool = field(default=True, metadata={
        "help": "write a transformers-format export (config, safetensors, tokenizer) with each checkpoint"})
    resume: bool = field(default=True, metadata={"help": "continue from the latest checkpoint in output_dir"})
    log_every: int = field(default=1, metadata={
        "help": "steps between metric lines (skipped steps are always logged). The host reads the device's "
                "numbers at logged steps, checkpoints and at least every 16 micro-batches, and the device runs "
                "ahead in between: on a GPU 10 or more keeps it from waiting on the host", "min": 1})
    stall_timeout: float = field(default=300.0, metadata={
        "help": "with several ranks, end this rank with an error after this many seconds (or 20 times its slowest "
                "step so far, if longer) without progress, checkpoint saves and the first step not counted: a rank "
                "that freezes without exiting (a stopped node, a network partition) otherwise leaves its peers "
                "waiting in a collective for 10 (NCCL) to 30 (gloo) minutes. 0: off", "min": 0})
    max_consecutive_skips: int = field(default=5, metadata={
        "help": "abort (keeping the last checkpoint) after this many skipped steps in a row (non-finite or "
                "spiking)", "min": 1})
    loss_spike_factor: float = field(default=2.0, metadata={
        "help": "skip a step whose loss exceeds this multiple of the median loss of recent steps (0: off)",
        "min": 0})
    grad_norm_spike_factor: float = field(default=10.0, metadata={
        "help": "skip a step whose gradient norm (unscaled under fp16) exceeds this multiple of the recent "
                "median (0: off)", "min": 0})
    spike_window: int = field(default=50, metadata={"help": "recent accepted steps the spike medians cover",
                                                    "min": 1})
    loss_ceiling_factor: float = field(default=2.0, metadata={
        "help": "skip a step whose loss exceeds this multiple of the loss of uniform predictions (ln vocabulary "
                "size + ln pair classes), from step 1, spike warm-up included (0: off)", "min": 0})
    spike_warmup_steps: int = field(default=10, metadata={
        "help": "accepted steps before spikes are judged (the first steps move too fast for a baseline)",
        "min": 0})
    resume_lr_scale: Optional[float] = field(default=None, metadata={
        "help": "on resume, run the rest of the schedule at this multiple of learning_rate, overriding the "
                "checkpoint's scheduler state (kept by later resumes unless given again)", "gt": 0})
    allow_config_change: bool = field(default=False, metadata={
        "help": "resume although settings that break exactness (batch, data, seed, optimizer, schedule, "
                "precision, world size, ...) differ from the checkpoint's; the changes are recorded"})
    stop_after_hours: float = field(default=0.0, metadata={
        "help": "stop cleanly (checkpoint, exit 0) after this much wall time in this process; 0: no budget",
        "min": 0})
    profile_steps: int = field(default=0, metadata={
        "help": "torch.profiler over this many optimizer steps after --profile-after (0: off; rank 0): "
                "profile.txt in the run directory (top kernels by device time, the device's busy share, launches a "
                "step) and profile_trace.json (Chrome's trace viewer)", "min": 0})
    profile_after: int = field(default=20, metadata={
        "help": "steps run before the profiled ones (compilation and the loader's start stay outside)", "min": 0})
    wandb_mode: WandbMode = field(default="offline", metadata={"help": "offline (default), online or disabled"})
    wandb_project: str = "biomed-lm"
    run_name: str = ""


# Preset fields checked beyond their names: (annotation, range metadata) as common.config reads them.
# (embedding_size, num_hidden_groups, inner_group_num and classifier_dropout_prob are ALBERT's.)
_PRESET_CHECKS: dict[str, tuple[Any, dict[str, float]]] = {
    **{name: (int, {"min": 1}) for name in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                             "intermediate_size", "max_position_embeddings", "type_vocab_size",
                                             "embedding_size", "num_hidden_groups", "inner_group_num")},
    **{name: (float, {"min": 0, "max": 1}) for name in ("hidden_dropout_prob", "attention_probs_dropout_prob",
                                                         "classifier_dropout_prob")},
    "classifier_dropout": (Optional[float], {"min": 0, "max": 1}),
    "layer_norm_eps": (float, {"gt": 0}),
    "initializer_range": (float, {"gt": 0}),
    "hidden_act": (str, {}),
    "model_type": (str, {}),
}


def _preset_config_class(path: Path, model_type: Any):
    """The transformers config class of a preset's declared ``model_type`` (BERT when it declares none)."""
    from transformers import CONFIG_MAPPING

    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise PretrainConfigError(f"{path}: model_type {model_type!r} is not a transformers model type "
                                  "(a preset of another family says e.g. model_type: albert)")
    return CONFIG_MAPPING[model_type]


def _check_preset(path: Path, values: dict[str, Any]) -> None:
    """Refuse keys that are not fields of the preset's config class (BertConfig, or the class of the
    ``model_type`` it declares; a typo would reach the exported config.json) and values of the wrong
    type or out of range."""
    import difflib
    import inspect

    from biomed_lm.config import check_value
    from biomed_lm.errors import ConfigError

    config_class = _preset_config_class(path, values.get("model_type", "bert"))
    defaults = config_class().to_dict()
    known = set(defaults) | {"model_type"} | {
        name for name, p in inspect.signature(config_class.__init__).parameters.items()
        if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=3)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise PretrainConfigError(f"{path}: {key!r} is not a {config_class.__name__} field{hint}")
    try:
        for key, (annotation, bounds) in _PRESET_CHECKS.items():
            if key in values:
                values[key] = check_value(values[key], annotation, bounds, source=f"{path}: {key}")
    except ConfigError as err:
        raise PretrainConfigError(str(err)) from None
    hidden = values.get("hidden_size", defaults["hidden_size"])
    heads = values.get("num_attention_heads", defaults["num_attention_heads"])
    if hidden % heads:
        raise PretrainConfigError(f"{path}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    layers, groups = values.get("num_hidden_layers", defaults["num_hidden_layers"]), values.get("num_hidden_groups")
    if groups is not None and groups > layers:
        raise PretrainConfigError(f"{path}: num_hidden_groups {groups} is more than num_hidden_layers {layers}")


def load_model_preset(name_or_path: str) -> dict[str, Any]:
    """Config fields from a preset name (``configs/model/<name>.yaml``) or a YAML/JSON file.

    A preset holds BertConfig fields unless it declares another ``model_type`` (``model_type:
    albert``: AlbertConfig fields), which stays in the returned mapping so that the model family
    can check it (:meth:`pretrain.families.ModelFamily.preset_fields`). Keys that are not fields of
    that config class are refused (with the close matches), and so are sizes that are not positive
    integers and dropouts outside [0, 1]."""
    preset_dir = shipped_dir("configs") / "model"
    path = resolve_path(name_or_path)
    if not path.suffix:
        path = preset_dir / f"{name_or_path}.yaml"
    if not path.is_file():
        presets = sorted(p.stem for p in preset_dir.glob("*.yaml"))
        raise PretrainConfigError(f"model {name_or_path!r}: no such preset or file (presets: {', '.join(presets)})")
    values = load_yaml_mapping(path)  # the shared loader: a key given twice is refused there
    _check_preset(path, values)
    values.pop("vocab_size", None)  # always the tokenizer's
    return values


def resolve_batch(train: TrainArguments, world_size: int) -> TrainArguments:
    """Check the batch arithmetic and derive the accumulation steps from a global batch size."""
    if train.micro_batch_size < 1:
        raise PretrainConfigError("micro_batch_size must be at least 1")
    if train.global_batch_size:
        per_step = train.micro_batch_size * world_size
        if train.global_batch_size % per_step:
            raise PretrainConfigError(
                f"global_batch_size {train.global_batch_size} is not a multiple of micro_batch_size "
                f"{train.micro_batch_size} × world size {world_size} = {per_step}")
        derived = train.global_batch_size // per_step
        if train.gradient_accumulation_steps not in (1, derived):  # 1: the default, no choice of the user's
            logging.getLogger(__name__).warning(
                "gradient_accumulation_steps %d is replaced by %d: global_batch_size %d = micro_batch_size %d × "
                "world size %d × %d (a global batch size decides the accumulation; give one of the two)",
                train.gradient_accumulation_steps, derived, train.global_batch_size, train.micro_batch_size,
                world_size, derived)
        train.gradient_accumulation_steps = derived
    elif train.gradient_accumulation_steps < 1:
        raise PretrainConfigError("gradient_accumulation_steps must be at least 1")
    train.global_batch_size = train.micro_batch_size * train.gradient_accumulation_steps * world_size
    if train.max_steps < 1:
        raise PretrainConfigError("max_steps must be at least 1")
    if train.zero_stage not in (0, 1, 2):
        raise PretrainConfigError("zero_stage must be 0, 1 or 2 (stage 3 is not needed for BERT-sized models)")
    if train.optimizer == "lamb" and train.zero_stage > 0:
        raise PretrainConfigError("LAMB needs zero_stage 0: ZeRO hands the optimizer flattened partitions, "
                                  "which breaks LAMB's per-tensor trust ratio")
    if train.profile_steps and train.profile_after + train.profile_steps > train.max_steps:
        raise PretrainConfigError(f"profile_after {train.profile_after} + profile_steps {train.profile_steps} go past "
                                  f"max_steps {train.max_steps}: the profiled steps would never all run")
    if train.schedule_total_steps and train.schedule_total_steps < train.max_steps:
        raise PretrainConfigError(f"schedule_total_steps {train.schedule_total_steps} is shorter than max_steps "
                                  f"{train.max_steps}: the schedule would end before the run")
    if not 0.0 <= train.warmup_ratio < 1.0:
        raise PretrainConfigError("warmup_ratio must be in [0, 1)")
    return train


def create_ds_config(train: TrainArguments, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config, generated from the typed arguments (never edited by hand) by the backend
    fine-tuning shares (:func:`biomed_lm.backend.ds_config`); bf16 runs as autocast with fp32
    weights, gradients and optimizer. fp8 is that bf16 config: the FP8 matmuls are torchao's,
    inside the converted Linear layers (:mod:`pretrain.fp8`), not DeepSpeed's."""
    resolve_batch(train, world_size)
    max_grad_norm = 0.0 if trainer_clips_gradients(train) else train.max_grad_norm
    return ds_config(global_batch_size=train.global_batch_size, micro_batch_size=train.micro_batch_size,
                     gradient_accumulation_steps=train.gradient_accumulation_steps, max_grad_norm=max_grad_norm,
                     precision=deepspeed_precision(train.precision), zero_stage=train.zero_stage)


def trainer_clips_gradients(train: TrainArguments) -> bool:
    """Whether the trainer clips the gradients itself (DeepSpeed's ``gradient_clipping`` then 0): where
    they live in ``param.grad`` unscaled (ZeRO stage 0, not fp16), it scales them all with one
    ``_foreach_mul_`` by the global norm it computes anyway for the divergence guard. DeepSpeed's own
    clipping loops over the parameters in Python — a norm and a multiply per tensor, 400 launches a
    step for BERT-base — where the step is already bound by the host's launches on an H200."""
    return train.max_grad_norm > 0 and train.zero_stage == 0 and train.precision != "fp16"


def deepspeed_precision(precision: str) -> str:
    """The precision DeepSpeed runs for a pretraining precision: fp8 runs DeepSpeed in bf16 (autocast)."""
    return "bf16" if precision == "fp8" else precision


def schedule_steps(train: TrainArguments) -> int:
    """The steps the learning-rate schedule spans (beyond max_steps when a later phase continues it)."""
    return train.schedule_total_steps or train.max_steps
