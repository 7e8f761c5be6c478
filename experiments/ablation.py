"""Ablations: a declarative grid of pretraining variants, each pretrained under the same compute
budget and fine-tuned over the same BLURB protocol.

A config (``configs/ablation/*.yaml``) names the *factors* and their levels; every combination is a
variant (the first level of each factor is its reference)::

    factors:
      vocabulary: [general, in-domain]        # bert-base-uncased's WordPiece | built on the corpus
      masking: [token, whole-word]
      initialization: [scratch]               # scratch | continual | continual-new-vocab
      adversarial: ["off"]                    # off | on (ALUM)
      mask_schedule: [constant]               # constant | stepwise | linear
      link: ["off"]                           # off | on (LinkBERT's DRP pairs over citation links)
      corpus: [pubmed-sample]                 # names in `corpora` or `mixtures`

A ``corpus`` level may be a mixture of corpora (the paper's Table 5, PubMed vs PubMed + PMC),
defined under ``mixtures`` by the names in ``corpora`` and a weight or epochs each
(:mod:`pretrain.mixture`)::

    mixtures:
      pubmed+pmc: {pubmed: {weight: 0.5}, pmc: {weight: 0.5}}

A mixture level prepares each of its corpora, builds its in-domain vocabulary on all of them, and
builds its instances from a data config (``data/<vocabulary>-<level>.data.yaml``): the phase's
data config with ``mixture:`` in place of ``corpus:``.

Every variant gets the same pretraining budget (``max_steps`` × global batch, the same model
preset for scratch runs), and combinations that cannot exist are left out with a note (continual
pretraining keeps its checkpoint's vocabulary: ``continual`` goes with ``general`` only and
``continual-new-vocab`` with ``in-domain`` only).

Work is shared where the inputs are the same: one prepared corpus per corpus, one in-domain
vocabulary per corpus, one set of pretraining instances per (vocabulary, corpus, link) — masking is
dynamic, so it happens at training time. Each step is the entry script a user would run (printed
before it runs); pretraining goes through DeepSpeed (the ``deepspeed`` launcher when
``num_gpus > 1`` or a hostfile is given). A step whose outputs are complete is skipped, and
pretraining and fine-tuning resume on their own, so re-running an interrupted ablation continues
it. Fine-tuning sweeps of different variants are independent and run ``parallel_jobs`` at a time.

Layout of ``output_dir`` (read by :mod:`experiments.report`)::

    ablation.json                        the record: factors, variants and their runs, budget
                                         (experiments.ablation_record, schema_version 2)
    corpus/<corpus>/                     launch/prepare_corpus.py
    vocab/in-domain-<corpus>/            launch/build_vocab.py
    data/<vocabulary>-<corpus>/          launch/create_pretraining_data.py
    data/<vocabulary>-<mixture>.data.yaml  its data config, for a mixture level
    variants/<variant>/pretrain/         launch/pretrain.py (metrics.jsonl, model/)
    variants/<variant>/finetune/         launch/blurb.py (run.json per run, summary.json, blurb.md)
    variants/<variant>/pretrain-run<k>/  pretraining run k > 1 (``pretrain_seeds``), and its
    variants/<variant>/finetune-run<k>/  fine-tuning sweep
    report/                              launch/report.py

A pretraining run's luck (initialization, data order, masking draws) is shared by every dataset it
is fine-tuned on, so a pretraining factor is tested on *runs*: ``pretrain_seeds: k`` pretrains each
variant k times (seeds seed, seed + 1, ...) and the report's analysis
(:mod:`experiments.checkpoint_analysis`, ``analysis: {specification: checkpoints}``) gives each
run a random intercept. With one run per variant it says the factor effects are confounded with
that run's luck and gives no p-value for them; ``specification: model-dataset-groups`` is paper
000's model.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from biomed_lm.config import check_fields, load_yaml_mapping, unknown_keys_message
from biomed_lm.errors import BiomedLMError, ConfigError, InputError
from biomed_lm.experiments.ablation_record import (ABLATION_FILE, AblationRecord, CheckpointRecord, VariantRecord,
                                                  load_ablation_record, run_suffix, write_ablation_record)
from biomed_lm.experiments.choices import FACTOR_LEVELS, FACTORS, GENERAL, SPECIFICATIONS, Specification
from biomed_lm.resources import entry_script, resolve_path
from biomed_lm.step_process import run_step_process, start_step_process, wait_for_interrupted

__all__ = ["run_suffix", "AblationConfig", "PretrainBudget", "PretrainPhase", "Variant", "plan_variants",
           "load_ablation_config", "ablation_config_from", "run_ablation", "StepFailed", "FACTORS", "FACTOR_LEVELS",
           "ABLATION_FILE"]

PRETRAIN_DONE = "pretrain_done.json"
FINETUNE_DONE = "finetune_done.json"  # a sweep that exited 0: its command, so a resume need not relaunch it
_DEFAULT_LEVELS = {"vocabulary": ["in-domain"], "masking": ["whole-word"], "initialization": ["scratch"],
                   "adversarial": ["off"], "mask_schedule": ["constant"], "link": ["off"]}


@dataclass
class PretrainPhase:
    """One pretraining run of every variant. A second phase (the paper's 512-token phase)
    continues from the first phase's export with its own instances, optimizer and schedule."""

    config: str = field(default="configs/pretrain/demo.yaml", metadata={"help": "launch/pretrain.py YAML: "
                                                                                  "optimizer, lr, schedule, ..."})
    data_config: str = "configs/data/demo.yaml"   # launch/create_pretraining_data.py YAML (sequence length)
    max_steps: int = field(default=40, metadata={"min": 1})
    micro_batch_size: int = field(default=16, metadata={"min": 1})
    global_batch_size: int = field(default=0, metadata={"min": 0})  # 0: micro × gradient_accumulation_steps × ranks
    gradient_accumulation_steps: int = field(default=1, metadata={"min": 1})
    extra_args: list[str] = field(default_factory=list)  # more launch/pretrain.py flags, for every variant

    def global_batch(self, ranks: int) -> int:
        return self.global_batch_size or self.micro_batch_size * self.gradient_accumulation_steps * ranks


@dataclass
class PretrainBudget(PretrainPhase):
    """The pretraining every variant gets: the same steps, batch and (for scratch) model."""

    model: str = "bert-tiny"            # model preset for scratch variants (configs/model)
    num_gpus: int = field(default=1, metadata={"min": 1})  # ranks per node (deepspeed --num_gpus)
    hostfile: str = ""                  # a DeepSpeed hostfile for multi-node runs
    phase2: dict[str, Any] | None = None  # PretrainPhase fields of an optional second phase

    @property
    def ranks(self) -> int:
        return _hostfile_slots(self.hostfile) if self.hostfile else self.num_gpus

    def phases(self) -> list[PretrainPhase]:
        first = PretrainPhase(**{f.name: getattr(self, f.name) for f in dataclasses.fields(PretrainPhase)})
        return [first] + ([PretrainPhase(**self.phase2)] if self.phase2 else [])

    @property
    def sequences(self) -> int:
        return sum(phase.max_steps * phase.global_batch(self.ranks) for phase in self.phases())


def _hostfile_slots(path: str) -> int:
    slots = 0
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            parts = dict(p.split("=", 1) for p in line.split()[1:] if "=" in p)
            slots += int(parts.get("slots", 1))
    return slots


@dataclass
class AblationConfig:
    name: str
    output_dir: str
    corpora: dict[str, str]                     # corpus name -> launch/prepare_corpus.py YAML
    factors: dict[str, list[str]]
    pretrain: PretrainBudget
    finetune: dict[str, Any]                     # finetune.sweep.SweepArgs fields (not model/output_dir)
    vocab_config: str = "configs/vocab/demo.yaml"
    vocab_size: int | None = field(default=None, metadata={"min": 1})
    continual_from: str = GENERAL                # "general" = all-MiniLM-L6-v2, or a checkpoint directory
    pretrain_seeds: int = 1                      # pretraining runs (checkpoints) per variant, seeds seed, seed+1, ...
    analysis: Specification = SPECIFICATIONS[0]  # the report's analysis (experiments.choices)
    num_proc: int = field(default=2, metadata={"min": 0})  # 0: all CPU cores (prepare_corpus, instances)
    parallel_jobs: int = field(default=1, metadata={"min": 1})
    source: str = ""                             # the YAML file, for messages
    # mixture name -> {corpus name: {weight: W} or {epochs: E}}: more levels of the corpus factor
    mixtures: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)

    def corpus_inputs(self, level: str) -> list[str]:
        """The corpora (names in ``corpora``) that a corpus level is made of."""
        return list(self.mixtures[level]) if level in self.mixtures else [level]


def load_ablation_config(path: str | Path, overrides: Mapping[str, Any] | None = None,
                         data_root: str | None = None) -> AblationConfig:
    """Read and check an ablation YAML; unknown keys and levels are errors naming the file and key.
    ``overrides`` replace top-level keys, ``data_root`` the fine-tuning's ``data_root``."""
    values = load_yaml_mapping(path)
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    if data_root and isinstance(values.get("finetune") or {}, dict):  # another type is refused, naming the key
        values["finetune"] = {**(values.get("finetune") or {}), "data_root": data_root}
    return ablation_config_from(values, str(path))


def ablation_config_from(values: Mapping[str, Any], where: str) -> AblationConfig:
    """An :class:`AblationConfig` from an ablation mapping (a YAML file's, or a recipe's); ``where``
    names it in errors."""
    _check_top_keys(values, where)
    corpora = values["corpora"]
    if not isinstance(corpora, dict) or not all(isinstance(v, str) for v in corpora.values()):
        raise ConfigError(f"{where}: 'corpora' must map corpus names to launch/prepare_corpus.py configs")
    vocab = _section(values, "vocab", where)
    _check_keys(vocab, {"config", "vocab_size"}, where, "vocab")
    mixtures = _mixtures(values, where)  # before the factors: a corpus level may name one
    keys = {"vocab_config": "vocab.config", "vocab_size": "vocab.vocab_size"}  # field -> its key in the YAML
    scalars = check_fields(AblationConfig, {"num_proc": values.get("num_proc", 2),
                                            "parallel_jobs": values.get("parallel_jobs", 1),
                                            "vocab_config": vocab.get("config", AblationConfig.vocab_config),
                                            "vocab_size": vocab.get("vocab_size")},
                           lambda name: f"{where}: {keys.get(name, name)}")
    config = AblationConfig(
        name=str(values["name"]), output_dir=str(values["output_dir"]), corpora=dict(corpora),
        factors=_factor_levels(values, where), pretrain=_pretrain_budget(values, where),
        finetune=_finetune(values, where), pretrain_seeds=_pretrain_seeds(values, where),
        analysis=_analysis_specification(values, where), **scalars,
        continual_from=str(values.get("continual_from", GENERAL)), source=where, mixtures=mixtures)
    _check_config_files(config)
    return config


def _check_top_keys(values: Mapping[str, Any], where: str) -> None:
    top = ({f.name for f in dataclasses.fields(AblationConfig)} - {"source", "vocab_config", "vocab_size", "analysis"}
           | {"vocab", "analysis"})
    _check_keys(values, top, where)
    for key in ("name", "output_dir", "corpora", "factors", "finetune"):
        if not values.get(key):
            raise ConfigError(f"{where}: '{key}' is required")


def _check_keys(given: Mapping[str, Any], valid: set[str], where: str, section: str = "") -> None:
    """Refuse keys of the top level (or of ``section``) that are not in ``valid``."""
    unknown = unknown_keys_message(given, sorted(valid), where, section=section)
    if unknown:
        raise ConfigError(unknown)


def _section(values: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    """The mapping under ``key`` (empty when absent), refused when it is not a mapping."""
    section = values.get(key) or {}
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: '{key}' must be a mapping of keys to values, not {section!r}")
    return dict(section)


def _check_config_files(config: AblationConfig) -> None:
    """The YAML files the steps read must exist now: found later, a missing one stops the run at its
    step, after the steps before it have run (resolved as the steps resolve them: the shipped
    configs/ from any directory)."""
    files = {f"corpora.{name}": path for name, path in config.corpora.items()}
    files["vocab.config"] = config.vocab_config
    for key, phase in zip(("pretrain", "pretrain.phase2"), config.pretrain.phases()):
        files.update({f"{key}.config": phase.config, f"{key}.data_config": phase.data_config})
    for key, path in files.items():
        if not resolve_path(path).is_file():
            raise ConfigError(f"{config.source}: {key}: no such file: {path}")


def _pretrain_budget(values: Mapping[str, Any], where: str) -> PretrainBudget:
    """``pretrain``: PretrainBudget fields (and ``phase2``: PretrainPhase fields), checked for their
    types and ranges as launch scripts check theirs (biomed_lm.config.check_fields)."""
    pretrain_values = _section(values, "pretrain", where)
    for key, fields, known in (("pretrain", pretrain_values, PretrainBudget),
                               ("pretrain.phase2", _section(pretrain_values, "phase2", f"{where}: pretrain"),
                                PretrainPhase)):
        _check_keys(fields, {f.name for f in dataclasses.fields(known)}, where, key)
    pretrain_values = check_fields(PretrainBudget, pretrain_values, f"{where}: pretrain")
    if pretrain_values.get("phase2"):
        pretrain_values["phase2"] = check_fields(PretrainPhase, pretrain_values["phase2"], f"{where}: pretrain.phase2")
    return PretrainBudget(**pretrain_values)


def _factor_levels(values: Mapping[str, Any], where: str) -> dict[str, list[str]]:
    """``factors``: each factor's levels (experiments.choices; default: its one level in
    ``_DEFAULT_LEVELS``, the first corpus), distinct and each a valid choice."""
    factors = values["factors"]
    if not isinstance(factors, dict):
        raise ConfigError(f"{where}: 'factors' must map factor names to lists of levels")
    checked: dict[str, list[str]] = {}
    for name in FACTORS:
        levels = factors.get(name, _DEFAULT_LEVELS.get(name, [next(iter(values["corpora"]))]))
        # YAML 1.1 reads unquoted off/on as booleans
        levels = [("on" if level else "off") if isinstance(level, bool) else str(level)
                  for level in (levels if isinstance(levels, list) else [levels])]
        valid = FACTOR_LEVELS[name] or tuple(values["corpora"]) + tuple(values.get("mixtures") or {})
        for level in levels:
            if level not in valid:
                raise ConfigError(f"{where}: factors.{name}: unknown level {level!r}; valid: {', '.join(valid)}")
        if not levels or len(set(levels)) != len(levels):
            raise ConfigError(f"{where}: factors.{name} must list distinct levels")
        checked[name] = levels
    extra = sorted(set(factors) - set(FACTORS))
    if extra:
        raise ConfigError(f"{where}: unknown factor(s) {', '.join(extra)}; valid: {', '.join(FACTORS)}")
    return checked


def _mixtures(values: Mapping[str, Any], where: str) -> dict[str, dict[str, dict[str, float]]]:
    """``mixtures``: name -> {corpus name: {weight: W} | {epochs: E}}, checked as
    launch/create_pretraining_data.py checks a ``mixture:`` (pretrain.mixture.parse_mixture)."""
    from biomed_lm.pretrain.prepared_corpus import PretrainingDataError
    from biomed_lm.pretrain.mixture import parse_mixture

    mixtures = values.get("mixtures") or {}
    if not isinstance(mixtures, dict):
        raise ConfigError(f"{where}: 'mixtures' must map mixture names to {{corpus name: {{weight: W}}}}")
    for name, spec in mixtures.items():
        key = f"{where}: mixtures.{name}"
        if name in values["corpora"]:
            raise ConfigError(f"{key}: the name is a corpus's too; give the mixture another name")
        if not isinstance(spec, dict) or not spec:
            raise ConfigError(f"{key} must map corpus names to {{weight: W}} or {{epochs: E}}")
        for corpus, share in spec.items():
            if corpus not in values["corpora"]:
                raise ConfigError(f"{key}.{corpus}: not a corpus of 'corpora' ({', '.join(values['corpora'])})")
            if not isinstance(share, dict):
                raise ConfigError(f"{key}.{corpus} must be {{weight: W}} or {{epochs: E}}, not {share!r}")
            if "corpus" in share:
                raise ConfigError(f"{key}.{corpus}.corpus is set by the ablation (the prepared corpus {corpus})")
        try:
            parse_mixture({corpus: {"corpus": corpus, **share} for corpus, share in spec.items()}, key)
        except PretrainingDataError as err:
            raise ConfigError(str(err)) from None
    return {str(name): {str(c): dict(share) for c, share in spec.items()} for name, spec in mixtures.items()}


def _finetune(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``finetune``: finetune.sweep.SweepArgs fields, checked as launch/blurb.py checks them, before
    hours of pretraining (``model`` and ``output_dir`` are the ablation's, one per variant)."""
    from biomed_lm.finetune.sweep import SweepArgs

    finetune = _section(values, "finetune", where)
    for key in ("model", "output_dir"):
        if key in finetune:
            raise ConfigError(f"{where}: finetune.{key} is set by the ablation (one per variant)")
    # named here: SweepArgs would say only "unexpected keyword argument", without the file or the valid keys
    _check_keys(finetune, {f.name for f in dataclasses.fields(SweepArgs) if f.init} - {"model", "output_dir"},
                where, "finetune")
    try:
        SweepArgs(model="-", output_dir="-", **finetune)
    except (TypeError, ConfigError, InputError) as err:  # SweepArgs: ConfigError names the field
        raise ConfigError(f"{where}: finetune: {err}") from None
    return finetune


def _pretrain_seeds(values: Mapping[str, Any], where: str) -> int:
    seeds = values.get("pretrain_seeds", 1)
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ConfigError(f"{where}: pretrain_seeds must be a whole number ≥ 1 (pretraining runs per variant), "
                          f"got {seeds!r}")
    return seeds


def _analysis_specification(values: Mapping[str, Any], where: str) -> str:
    """``analysis: {specification: checkpoints | model-dataset-groups}`` (default checkpoints)."""
    analysis = values.get("analysis") or {}
    if not isinstance(analysis, dict) or set(analysis) - {"specification"}:
        raise ConfigError(f"{where}: 'analysis' must be a mapping with the one key 'specification'")
    specification = str(analysis.get("specification", SPECIFICATIONS[0]))
    if specification not in SPECIFICATIONS:
        raise ConfigError(f"{where}: analysis.specification: unknown {specification!r}; valid: "
                          f"{', '.join(SPECIFICATIONS)}")
    return specification


# ---------------------------------------------------------------------------------- variants

@dataclass(frozen=True)
class Variant:
    name: str
    factors: dict[str, str]

    @property
    def vocabulary(self) -> str:
        return self.factors["vocabulary"]

    @property
    def corpus(self) -> str:
        return self.factors["corpus"]

    @property
    def data_key(self) -> tuple[str, str, str]:
        """What its pretraining instances depend on: vocabulary, corpus, and whether pairs are links."""
        return self.vocabulary, self.corpus, self.factors.get("link", "off")


def _excluded(levels: Mapping[str, str]) -> str | None:
    if levels["initialization"] == "continual" and levels["vocabulary"] != GENERAL:
        return "continual pretraining keeps the checkpoint's (general) vocabulary"
    if levels["initialization"] == "continual-new-vocab" and levels["vocabulary"] == GENERAL:
        return "continual-new-vocab swaps in the in-domain vocabulary"
    return None


_LEVEL_PREFIX = {"adversarial": "adv-", "link": "link-"}  # off/on alone would not say which factor


def plan_variants(factors: Mapping[str, Sequence[str]]) -> tuple[list[Variant], list[str]]:
    """Every valid combination of the factors' levels, named by the levels of the factors that vary
    (``in-domain_whole-word``; ``baseline`` when none varies), and the notes on excluded ones."""
    varying = [f for f in FACTORS if len(factors[f]) > 1]
    variants, notes = [], []
    for combination in itertools.product(*(factors[f] for f in FACTORS)):
        levels = dict(zip(FACTORS, combination))
        name = "_".join(f"{_LEVEL_PREFIX.get(f, '')}{levels[f]}" for f in varying) or "baseline"
        why = _excluded(levels)
        if why:
            notes.append(f"{name}: left out ({why})")
            continue
        variants.append(Variant(name, levels))
    if not variants:
        raise ConfigError("no valid variant: every combination of the factors was excluded (" + "; ".join(notes) + ")")
    return variants, notes


# ---------------------------------------------------------------------------------- running

@dataclass
class _Paths:
    root: Path

    def corpus(self, name: str) -> Path:
        return self.root / "corpus" / name

    def vocab(self, corpus: str) -> Path:
        return self.root / "vocab" / f"in-domain-{corpus}"

    def data(self, vocabulary: str, corpus: str, phase: int = 1, link: str = "off") -> Path:
        return self.root / "data" / (f"{vocabulary}-{corpus}" + ("-links" if link == "on" else "")
                                     + (f"-phase{phase}" if phase > 1 else ""))

    def pretrain(self, variant: str, phase: int = 1, run: int = 1) -> Path:
        return self.variant(variant) / (("pretrain" if phase == 1 else f"pretrain_phase{phase}") + run_suffix(run))

    def finetune(self, variant: str, run: int = 1) -> Path:
        return self.variant(variant) / ("finetune" + run_suffix(run))

    def variant(self, name: str) -> Path:
        return self.root / "variants" / name


def _phase_yaml(phase: PretrainPhase) -> Mapping[str, Any]:
    """The phase's pretraining YAML config (empty where the file is not there: the step names it)."""
    config = resolve_path(phase.config)
    return load_yaml_mapping(config) if config.is_file() else {}


def _yaml_schedule_total(phase: PretrainPhase) -> int:
    """The ``schedule_total_steps`` of the phase's YAML config (0: the run's own max_steps)."""
    return int(_phase_yaml(phase).get("schedule_total_steps") or 0)


def _pretrain_seed(phase: PretrainPhase, run: int) -> int:
    """Pretraining run k's seed: the phase's own seed (its YAML's, or ``--seed`` in extra_args,
    default 42) plus k − 1."""
    base = 42
    config = resolve_path(phase.config)
    if config.is_file():
        base = int(load_yaml_mapping(config).get("seed", base))
    if "--seed" in phase.extra_args[:-1]:
        base = int(phase.extra_args[phase.extra_args.index("--seed") + 1])
    return base + run - 1


def _yaml_init_checkpoint(phase: PretrainPhase) -> str:
    """The init_checkpoint the phase's pretraining YAML names ("" where it names none)."""
    return str(_phase_yaml(phase).get("init_checkpoint") or "")


def _general_dir(config: AblationConfig) -> str:
    if config.continual_from != GENERAL:
        return config.continual_from
    from biomed_lm.reference_models import general_bert_dir

    return str(general_bert_dir())


def _check_general_checkpoint(config: AblationConfig, variants: Sequence[Variant]) -> None:
    """Where a variant takes the general-domain checkpoint's vocabulary or weights, the checkpoint is there
    (QA: a BioALBERT recipe prepared its corpus, then stopped at "tokenizer not found: runs/albert-base-v2")."""
    uses_vocabulary = any(v.vocabulary == GENERAL for v in variants)
    uses_weights = any(v.factors["initialization"] != "scratch" for v in variants)
    if not (uses_vocabulary or uses_weights):
        return
    from biomed_lm.finetune.model_check import TOKENIZER_FILES  # a checkpoint folder's tokenizer, in any form

    path = Path(_general_dir(config))
    needed = (["config.json"] if uses_weights and not (path / "config.json").is_file() else []) + (
        [] if any((path / name).is_file() for name in TOKENIZER_FILES) else [" or ".join(TOKENIZER_FILES)])
    missing = ("does not exist" if not path.exists() else "is not a folder" if not path.is_dir()
               else f"has no {', '.join(needed)}" if needed else "")
    if missing:
        raise ConfigError(f"continual_from: {path} {missing}: the general-domain checkpoint these variants start from "
                          f"(its {'weights' if uses_weights else 'vocabulary'}); set continual_from (--continual_from "
                          "for a recipe) to a transformers checkpoint folder")


def _check_batches(budget: PretrainBudget, source: str) -> None:
    """Each phase's global batch divides into its micro-batches on the ranks the hostfile (or num_gpus) gives: the
    pretraining step refuses it otherwise, after the corpus, vocabulary and instances (QA: 8,192 sequences over a
    hostfile of 64 GPUs at 256 a micro-batch)."""
    ranks = budget.ranks
    for number, phase in enumerate(budget.phases(), start=1):
        total = phase.global_batch_size
        if total and total % (phase.micro_batch_size * ranks):
            fits = [m for m in range(phase.micro_batch_size, 0, -1) if total % (m * ranks) == 0][:1]
            hint = f"micro_batch_size {fits[0]} would" if fits else f"no micro-batch divides it on {ranks} ranks"
            raise ConfigError(f"{source or 'the ablation config'}: pretrain phase {number}: global_batch_size {total} "
                              f"does not divide into micro-batches of {phase.micro_batch_size} on {ranks} rank(s) "
                              f"({budget.hostfile or f'num_gpus {budget.num_gpus}'}); {hint}")


def _check_step_options(config: AblationConfig, variants: Sequence[Variant], phases: Sequence[PretrainPhase],
                        paths: _Paths) -> None:
    """The options the instance and pretraining steps will be given (their YAML files, the flags this ablation
    adds) parse as those steps parse them, and the model preset exists: a misspelled key, a value of the wrong
    type or an unknown preset stopped the ablation only at its step, after the corpus, the vocabularies and
    the instances were built (QA: hours at PubMed scale)."""
    from biomed_lm.pretrain.adversarial import AdversarialConfig
    from biomed_lm.pretrain.config import (DataArguments, ModelArguments, PretrainConfigError, TrainArguments,
                                           load_model_preset)
    from biomed_lm.pretrain.instance_builder import PretrainingDataConfig

    where = config.source or "the ablation config"
    if any(v.factors["initialization"] == "scratch" for v in variants):
        try:
            load_model_preset(config.pretrain.model)
        except PretrainConfigError as err:
            raise ConfigError(f"{where}: pretrain.model: {err}") from None
    placeholder = str(paths.root / "data" / "(checked before it is built)")
    for number, phase in enumerate(phases, start=1):
        _parse_step_options([PretrainingDataConfig], [
            "--config", phase.data_config, "--corpus", placeholder, "--tokenizer", placeholder,
            "--output-dir", placeholder], f"{where}: pretrain phase {number}: data_config {phase.data_config}")
        for variant in variants:
            flags = _pretrain_flags(config, variant, phase, placeholder, Path(placeholder), Path(placeholder),
                                    Path(placeholder) if number > 1 else None, number=number)
            _parse_step_options([ModelArguments, DataArguments, TrainArguments, AdversarialConfig], flags,
                                f"{where}: pretrain phase {number} of {variant.name}: config {phase.config}")


def _parse_step_options(classes: list[type], flags: list[str], what: str) -> None:
    """``flags`` parsed as the step's entry script parses them; a ConfigError naming ``what`` and the option
    when they do not (argparse's own refusals, which exit, are caught and said the same way)."""
    import contextlib
    import io

    from biomed_lm.config import parse_config

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            parse_config(classes, flags)
    except BiomedLMError as err:  # a ConfigError, or a stage's own (PretrainingDataError: max_shard_size)
        raise ConfigError(f"{what}: {err}") from None
    except SystemExit:
        errors = [line.split("error: ", 1)[1] for line in said.getvalue().splitlines() if "error: " in line]
        raise ConfigError(f"{what}: {errors[-1] if errors else 'its options are refused'}") from None


class StepFailed(RuntimeError):
    """A step of the ablation (an entry script it runs) exited with an error: not an input the user
    can fix from here, so outside biomed_lm.errors (launch/ablate.py exits 1, not 2); the step's own
    output above says why."""


def _run(title: str, command: list[str], log: Callable[[str], None], env: Mapping[str, str] | None = None,
         refused_hint: str = "") -> None:
    """One step; StepFailed when it fails, with ``refused_hint`` added when it refused its options (exit 2)."""
    log(f"\n=== {title}\n$ {shlex.join(command)}")
    started = time.perf_counter()
    returncode = _execute(command, {**os.environ, **(env or {})})
    if returncode != 0:
        hint = f"\n{refused_hint}" if refused_hint and returncode == 2 else ""
        raise StepFailed(f"step '{title}' failed with exit status {returncode}: {shlex.join(command)}{hint}")
    log(f"--- {title}: {time.perf_counter() - started:.1f} s")


def _run_shared(title: str, command: list[str], out: Path, log: Callable[[str], None]) -> None:
    """A step whose output variants share (a corpus, a vocabulary, instances): always run, as the stage
    itself tells a finished output of the same command ("already complete", exit 0) from one of another
    command, which it refuses naming the difference. Skipping it when its output existed reused a
    vocabulary of the old vocab_size after the config changed it. The hint about an earlier config is added
    only where ``out`` held something before the step (QA: it followed a missing input in a fresh folder)."""
    held_output = out.is_dir() and any(out.iterdir())
    _run(title, command, log, refused_hint=(
        f"if the step names differences from what {out} holds, an earlier config of this ablation built it: use "
        f"another output_dir, or delete {out} and what was built from it (instances, pretraining runs) to build it "
        "again with this config") if held_output else "")


def _execute(command: list[str], env: Mapping[str, str]) -> int:
    """One step's process, its output on this one's; its exit status. On Ctrl-C the step, which had it too,
    stops on its own before this one does (:mod:`biomed_lm.step_process`)."""
    return run_step_process(command, env)


def _python(script: str, *args: str) -> list[str]:
    return [sys.executable, str(entry_script(script)), *args]


def _pretrain_command(config: AblationConfig, variant: Variant, phase: PretrainPhase, tokenizer: str,
                      data_dir: Path, out: Path, previous: Path | None, run: int = 1,
                      number: int | None = None) -> list[str]:
    """launch/pretrain.py for one variant, pretraining run and phase (:func:`_pretrain_flags`), under the
    deepspeed launcher when the budget has several GPUs or hosts."""
    flags = _pretrain_flags(config, variant, phase, tokenizer, data_dir, out, previous, run, number)
    budget = config.pretrain
    if budget.num_gpus > 1 or budget.hostfile:
        launcher = ["deepspeed", "--num_gpus", str(budget.num_gpus)]
        if budget.hostfile:
            launcher += ["--hostfile", budget.hostfile]
        return [*launcher, str(entry_script("pretrain.py")), *flags]
    return _python("pretrain.py", *flags)


def _pretrain_flags(config: AblationConfig, variant: Variant, phase: PretrainPhase, tokenizer: str,
                    data_dir: Path, out: Path, previous: Path | None, run: int = 1,
                    number: int | None = None) -> list[str]:
    """launch/pretrain.py's flags for one variant, pretraining run and phase.

    The phases are the paper's recipe (section 2.5): one learning-rate schedule across all of
    them. Phase 1 runs its steps of a schedule that spans every phase's; a later phase continues
    ``previous`` (the phase before's run directory: weights, optimizer state, step count and
    schedule) up to the step where it ends. Run 1 uses the phase's seed as it is (its command, and
    so its resumption, is the same as without ``pretrain_seeds``); run k > 1 adds ``--seed`` last."""
    budget = config.pretrain
    phases = budget.phases()
    number = number or phases.index(phase) + 1  # the phase's place (1, 2)
    end_step = sum(p.max_steps for p in phases[:number])
    flags = ["--config", phase.config, "--data_dir", str(data_dir), "--tokenizer", tokenizer,
             "--output_dir", str(out), "--max_steps", str(end_step),
             "--micro_batch_size", str(phase.micro_batch_size),
             "--whole_word_masking", str(variant.factors["masking"] == "whole-word"),
             "--mask_schedule", variant.factors["mask_schedule"],
             "--adversarial", str(variant.factors["adversarial"] == "on")]
    if phase.global_batch_size:
        flags += ["--global_batch_size", str(phase.global_batch_size)]
    else:
        flags += ["--gradient_accumulation_steps", str(phase.gradient_accumulation_steps)]
    total = sum(p.max_steps for p in phases)
    if len(phases) > 1 or _yaml_schedule_total(phase) not in (0, total):
        # One schedule spans every phase's steps. One phase names it only where its YAML spans more (a recipe's
        # phase 1 without its phase 2, as --tiny runs it): its steps would all fall in the warm-up (lr ~ 0).
        flags += ["--schedule_total_steps", str(total)]
    if variant.factors["initialization"] == "scratch":  # every phase: the architecture must match
        flags += ["--init", "scratch", "--model", budget.model]
        if _yaml_init_checkpoint(phase):  # named for the YAML's own continual runs (configs/pretrain/bioalbert.yaml)
            flags += ["--init_checkpoint", ""]
    else:
        flags += ["--init", variant.factors["initialization"], "--init_checkpoint", _general_dir(config)]
    if previous is not None:
        flags += ["--continue_from", str(previous)]
    flags += list(phase.extra_args)
    if run > 1:
        flags += ["--seed", str(_pretrain_seed(phase, run))]
    return flags


def _sweep_command(config: AblationConfig, model: Path, out: Path) -> list[str]:
    flags = ["--model", str(model), "--output_dir", str(out)]
    for key, value in config.finetune.items():
        if isinstance(value, list):
            flags += [f"--{key}", *map(str, value)] if value else []
        elif isinstance(value, bool):
            flags += [f"--{key}", str(value)]
        elif value is not None:
            flags += [f"--{key}", str(value)]
    return _python("blurb.py", *flags)


def _run_parallel(jobs: list[tuple[str, list[str]]], parallel: int, log: Callable[[str], None],
                  succeeded: Callable[[int], None] = lambda index: None, gpus_per_job: int = 1) -> list[str]:
    """Run independent commands, ``parallel`` at a time, splitting the CPU threads between them and, on a GPU
    machine, the GPUs: ``gpus_per_job`` each (a sweep's ``parallel_runs``), fewer jobs at a time where there are
    not enough. ``succeeded(i)`` is called as soon as job ``i`` exits 0, so what a finished job earns (its
    done-file) is kept when a later one is interrupted. Returns the titles of the jobs that failed (the others
    are not stopped)."""
    if parallel <= 1:
        failed = []
        for index, (title, command) in enumerate(jobs):
            try:
                _run(title, command, log)
            except StepFailed as err:
                log(str(err))
                failed.append(title)
            else:
                succeeded(index)
        return failed
    free = _gpu_slots(parallel, gpus_per_job, log)  # QA: every sweep ran on cuda:0 while 7 GPUs sat idle
    threads = str(max(1, (os.cpu_count() or 1) // len(free)))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    running: list[tuple[int, subprocess.Popen, str | None]] = []
    failed, queue = [], list(enumerate(jobs))
    try:
        while queue or running:
            while queue and free:
                (index, (title, command)), slot = queue.pop(0), free.pop(0)
                on = f" on GPU(s) {slot}" if slot is not None else ""
                log(f"\n=== {title} (in parallel{on})\n$ {shlex.join(command)}")
                job_env = env if slot is None else {**env, "CUDA_VISIBLE_DEVICES": slot}
                running.append((index, start_step_process(command, job_env), slot))
            time.sleep(1.0)
            for item in list(running):
                index, process, slot = item
                if process.poll() is None:
                    continue
                running.remove(item)
                free.append(slot)
                if process.returncode == 0:
                    succeeded(index)
                else:
                    log(f"{jobs[index][0]} failed with exit status {process.returncode}")
                    failed.append(jobs[index][0])
    except KeyboardInterrupt:
        wait_for_interrupted([process for _, process, _ in running])  # each stops on its own, as one step does
        raise
    return failed


def _gpu_slots(parallel: int, gpus_per_job: int, log: Callable[[str], None]) -> list[str | None]:
    """What each of the jobs running at once sees (a ``CUDA_VISIBLE_DEVICES`` value of ``gpus_per_job`` GPUs),
    as many as the GPUs allow up to ``parallel``; ``parallel`` of None on a machine without CUDA."""
    from biomed_lm.finetune.sweep_pool import visible_gpus

    gpus = visible_gpus()
    if gpus is None:
        return [None] * parallel
    fit = max(1, min(parallel, len(gpus) // max(1, gpus_per_job)))
    if fit < parallel:
        log(f"parallel_jobs {parallel} x parallel_runs {gpus_per_job} needs {parallel * gpus_per_job} GPUs and "
            f"{len(gpus)} are visible: {fit} sweep(s) at a time")
    return [",".join(gpus[i * gpus_per_job:(i + 1) * gpus_per_job]) or None for i in range(fit)]


def _pretrain_variant(config: AblationConfig, variant: Variant, run: int, phases: list[PretrainPhase],
                      paths: _Paths, tokenizers: Mapping[tuple[str, str], str], log: Callable[[str], None]) -> None:
    """Every phase of one pretraining run of a variant; a phase whose done-file records the same
    command is skipped."""
    for number, phase in enumerate(phases, start=1):
        out = paths.pretrain(variant.name, number, run)
        done = out / PRETRAIN_DONE
        previous = paths.pretrain(variant.name, number - 1, run) if number > 1 else None
        command = _pretrain_command(config, variant, phase, tokenizers[variant.vocabulary, variant.corpus],
                                    paths.data(*variant.data_key[:2], number, variant.data_key[2]), out, previous,
                                    run, number)
        title = f"{variant.name}" + (f" run {run}" if config.pretrain_seeds > 1 else "")
        if _done_with(done, command):
            log(f"{title}: pretraining phase {number} already complete")
            continue
        started = time.time()
        _run(f"pretrain {title} (phase {number} of {len(phases)})", command, log)
        _mark_done(done, command, seconds=round(time.time() - started, 1), factors=variant.factors, run=run)


def _done_with(done: Path, command: Sequence[str]) -> bool:
    """Whether the done-file records this command (the interpreter aside: a new venv changes nothing)."""
    return done.is_file() and json.loads(done.read_text(encoding="utf-8")).get("command") == list(command[1:])


def _sweep_finished(out: Path) -> bool:
    """A sweep's summary with every dataset present and complete: a dataset absent today (its files
    not yet downloaded) must run when the sweep is resumed."""
    summary = out / "summary.json"
    if not summary.is_file():
        return False
    values = json.loads(summary.read_text(encoding="utf-8"))
    return not values.get("absent") and not any(d.get("incomplete") for d in values.get("datasets", {}).values())


def _mark_done(done: Path, command: Sequence[str], **details: Any) -> None:
    done.parent.mkdir(parents=True, exist_ok=True)
    done.write_text(json.dumps({"command": list(command[1:]), **details}, indent=2) + "\n", encoding="utf-8")


def run_ablation(config: AblationConfig, log: Callable[[str], None] = print, report: bool = True) -> AblationRecord:
    """Run (or resume) the whole ablation; returns the record written to ``ablation.json``
    (:mod:`experiments.ablation_record`), whose ``failed`` lists the fine-tuning sweeps that failed."""
    variants, notes = plan_variants(config.factors)
    phases = config.pretrain.phases()
    paths = _Paths(Path(config.output_dir))
    _check_step_options(config, variants, phases, paths)  # before anything is written
    paths.root.mkdir(parents=True, exist_ok=True)
    record = _record(config, variants, notes, paths)
    _check_budget_unchanged(record, paths.root)
    write_ablation_record(record, paths.root)
    for note in notes:
        log(note)
    log(f"{config.name}: {len(variants)} variants ({', '.join(v.name for v in variants)}) × {config.pretrain_seeds} "
        f"pretraining run(s), {config.pretrain.sequences:,} pretraining sequences each "
        f"({' then '.join(f'{p.max_steps} steps' for p in phases)})")

    # Shared inputs: corpora, in-domain vocabularies, pretraining instances.
    _check_batches(config.pretrain, config.source)  # both before hours of corpus preparation
    _check_general_checkpoint(config, variants)
    _prepare_corpora(config, variants, paths, log)
    tokenizers = _build_vocabularies(config, variants, paths, log)
    _create_instances(config, variants, tokenizers, phases, paths, log)

    # Pretraining, one variant, run and phase at a time: each uses every device it is given.
    runs = range(1, config.pretrain_seeds + 1)
    for variant, run in itertools.product(variants, runs):
        _pretrain_variant(config, variant, run, phases, paths, tokenizers, log)

    # Fine-tuning sweeps: independent per variant and pretraining run. A sweep that finished with the
    # same command is not relaunched (it would only find every run complete, at a start-up's cost).
    pending: list[tuple[str, list[str], Path]] = []
    for variant, run in itertools.product(variants, runs):
        title = f"fine-tune {variant.name}" + (f" (pretraining run {run})" if config.pretrain_seeds > 1 else "")
        out = paths.finetune(variant.name, run)
        command = _sweep_command(config, paths.pretrain(variant.name, len(phases), run) / "model", out)
        if _done_with(out / FINETUNE_DONE, command):
            log(f"{title}: sweep already complete")
        else:
            pending.append((title, command, out))

    def sweep_exited_0(index: int) -> None:
        _, command, out = pending[index]
        if _sweep_finished(out):
            _mark_done(out / FINETUNE_DONE, command)

    record.failed = _run_parallel([(title, command) for title, command, _ in pending], config.parallel_jobs, log,
                                  succeeded=sweep_exited_0, gpus_per_job=int(config.finetune.get("parallel_runs") or 1))
    write_ablation_record(record, paths.root)
    if report:
        from biomed_lm.experiments.report import write_report

        log(f"\nreport: {write_report(paths.root)}")
    return record


def _check_budget_unchanged(record: AblationRecord, root: Path) -> None:
    """Refuse a config whose pretraining budget differs from the one the ablation's pretraining runs began
    with, before anything is written: every variant must get the same budget, so the runs cannot change it
    midway (QA: ablation.json was rewritten with the new budget, then the first resumed run refused it, and
    the report put the new budget above models of the old one)."""
    path = root / ABLATION_FILE
    if not path.is_file():
        return
    before = load_ablation_record(path)
    started = [c.pretrain_dir for v in before.variants.values() for c in v.checkpoints
               if Path(c.pretrain_dir).is_dir() and any(Path(c.pretrain_dir).iterdir())]
    changes = _changed_values(before.budget, json.loads(json.dumps(record.budget)))
    if started and changes:
        raise ConfigError(f"{path}: this ablation's pretraining began with another budget ({'; '.join(changes)}), "
                          f"and every variant must get the same one: use another output_dir, or delete its "
                          f"variants/ folder to pretrain every run again with this budget")


def _changed_values(before: Any, now: Any, where: str = "budget") -> list[str]:
    """``where.key: old -> new`` for each value that differs between two JSON-like trees."""
    if isinstance(before, dict) and isinstance(now, dict):
        return [change for key in sorted(set(before) | set(now), key=str)
                for change in _changed_values(before.get(key), now.get(key), f"{where}.{key}")]
    if isinstance(before, list) and isinstance(now, list) and len(before) == len(now):
        return [change for i, (a, b) in enumerate(zip(before, now))
                for change in _changed_values(a, b, f"{where}[{i}]")]
    return [] if before == now else [f"{where}: {before!r} then, {now!r} now"]


def _record(config: AblationConfig, variants: Sequence[Variant], notes: list[str], paths: _Paths) -> AblationRecord:
    """The ablation's record: its factors, every variant's pretraining runs and where they go, the budget."""
    phases = config.pretrain.phases()
    ranks = config.pretrain.ranks

    def checkpoint(variant: Variant, run: int) -> CheckpointRecord:
        return CheckpointRecord(run=run, seed=_pretrain_seed(phases[0], run),
                                model=str(paths.pretrain(variant.name, len(phases), run) / "model"),
                                pretrain_dir=str(paths.pretrain(variant.name, 1, run)),
                                finetune_dir=str(paths.finetune(variant.name, run)))

    return AblationRecord(
        name=config.name, source=config.source, factors={f: list(config.factors[f]) for f in FACTORS},
        variants={v.name: VariantRecord(dict(v.factors), tuple(checkpoint(v, run)
                                                               for run in range(1, config.pretrain_seeds + 1)))
                  for v in variants},
        pretrain_seeds=config.pretrain_seeds, specification=config.analysis, excluded=list(notes),
        datasets=list(config.finetune.get("datasets") or []),
        budget={"steps": sum(phase.max_steps for phase in phases),
                "global_batch_size": phases[0].global_batch(ranks),
                "sequences": config.pretrain.sequences, "model": config.pretrain.model,
                "phases": [dataclasses.asdict(phase) | {"global_batch_size": phase.global_batch(ranks)}
                           for phase in phases]},
        finetune=dict(config.finetune))


def _prepare_corpora(config: AblationConfig, variants: Sequence[Variant], paths: _Paths,
                     log: Callable[[str], None]) -> None:
    """launch/prepare_corpus.py once per corpus the variants use (each of a mixture's)."""
    for corpus in sorted({name for v in variants for name in config.corpus_inputs(v.corpus)}):
        _run_shared(f"prepare corpus {corpus}", _python(
            "prepare_corpus.py", "--config", config.corpora[corpus], "--output-dir", str(paths.corpus(corpus)),
            "--num-proc", str(config.num_proc)), paths.corpus(corpus), log)


def _build_vocabularies(config: AblationConfig, variants: Sequence[Variant], paths: _Paths,
                        log: Callable[[str], None]) -> dict[tuple[str, str], str]:
    """The tokenizer of each (vocabulary, corpus): the general checkpoint's, or one in-domain
    vocabulary built per corpus (launch/build_vocab.py) and shared by every variant that uses it."""
    tokenizers: dict[tuple[str, str], str] = {}
    for vocabulary, corpus in sorted({(v.vocabulary, v.corpus) for v in variants}):
        if vocabulary == GENERAL:
            tokenizers[vocabulary, corpus] = _general_dir(config)
            continue
        out = paths.vocab(corpus)
        size = ["--vocab-size", str(config.vocab_size)] if config.vocab_size else []
        _run_shared(f"build the in-domain vocabulary of {corpus}", _python(
            "build_vocab.py", "--config", config.vocab_config, "--inputs",
            *[str(paths.corpus(name)) for name in config.corpus_inputs(corpus)], *size,
            "--output-dir", str(out)), out, log)
        tokenizers[vocabulary, corpus] = str(out)
    return tokenizers


def _create_instances(config: AblationConfig, variants: Sequence[Variant], tokenizers: Mapping[tuple[str, str], str],
                      phases: Sequence[PretrainPhase], paths: _Paths, log: Callable[[str], None]) -> None:
    """launch/create_pretraining_data.py once per (vocabulary, corpus, link) and phase (masking is
    dynamic); ``link: on`` builds LinkBERT's DRP pairs instead of the data config's pair task."""
    for vocabulary, corpus, link in sorted({v.data_key for v in variants}):
        for number, phase in enumerate(phases, start=1):
            out = paths.data(vocabulary, corpus, number, link)
            # With two phases the tokenized corpus is kept (fingerprinted by corpus and tokenizer)
            # so that phase 2 reuses phase 1's tokenization; with one, none is kept (a data config's own
            # cache folder is relative to where the command runs, outside output_dir: QA).
            cache = ["--tokenized_cache", str(paths.root / "data" / "tokenized") if len(phases) > 1 else ""]
            pairs = ["--pair_task", "drp"] if link == "on" else []
            source = (["--config", str(_mixture_data_config(config, corpus, phase, paths, out))]
                      if corpus in config.mixtures else
                      ["--config", phase.data_config, "--corpus", str(paths.corpus(corpus))])
            _run_shared(f"pretraining instances ({vocabulary} vocabulary, {corpus}{', links' if pairs else ''}, "
                        f"phase {number})", _python(
                            "create_pretraining_data.py", *source,
                            "--tokenizer", tokenizers[vocabulary, corpus], "--output-dir", str(out),
                            "--num-proc", str(config.num_proc), *cache, *pairs), out, log)


def mixture_data_config(config: AblationConfig, mixture: str, data_config: str, paths_root: Path) -> dict[str, Any]:
    """The data config of a mixture level: ``data_config``'s options with ``mixture:`` (its corpora
    prepared under ``paths_root``) in place of ``corpus:``."""
    values = {k: v for k, v in load_yaml_mapping(data_config).items() if k != "corpus"}
    values["mixture"] = {name: {"corpus": str(_Paths(paths_root).corpus(name)), **share}
                         for name, share in config.mixtures[mixture].items()}
    return values


def _mixture_data_config(config: AblationConfig, mixture: str, phase: PretrainPhase, paths: _Paths, out: Path) -> Path:
    """:func:`mixture_data_config` written beside the instances' folder (``<out>.data.yaml``)."""
    import yaml

    path = out.with_name(out.name + ".data.yaml")
    path.parent.mkdir(parents=True, exist_ok=True)
    values = mixture_data_config(config, mixture, phase.data_config, paths.root)
    path.write_text(yaml.safe_dump(values, sort_keys=False), encoding="utf-8")
    return path
