"""Recipes: one complete plan per system of the papers — corpus, vocabulary, instances, pretraining
phases, BLURB — runnable with one command (``launch/recipe.py NAME``).

A recipe (``configs/recipes/<name>.yaml``) is an ablation config (:mod:`experiments.ablation`) whose
factors each have one level — the system itself — so the ablation runner's steps, sharing,
resumption and records serve it unchanged, with two more keys:

``system``
    What the recipe reproduces, for people and for the README's table: ``name``, ``paper``,
    ``reproduces`` and ``leaves_out`` (each a sentence) and ``shape`` (the model preset its cost is
    projected for: :func:`projected_cost`).
``tiny``
    Overrides for a CPU-sized run of the same plan (``--tiny``, into ``<output_dir>-tiny``), merged over
    :data:`TINY`: the embedded sample corpus, a small vocabulary, a tiny model of the same family, two steps of the
    first phase and a 32-example fine-tune. Every recipe runs this way in ``tests/test_recipes.py``.

``--scale S`` multiplies every phase's steps (the paper's settings at S = 1); the learning-rate schedule
spans the scaled phases, so its warm-up stays the same share of the run (BioALBERT's 3,125 of 200,000
steps is 312 of 20,000 at S = 0.1); the batch size and the peak learning rate do not change.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from biomed_lm.config import load_yaml_mapping
from biomed_lm.errors import ConfigError
from biomed_lm.experiments.ablation import AblationConfig, ablation_config_from
from biomed_lm.resources import resolve_path, shipped_dir

SYSTEM_KEYS = ("name", "paper", "reproduces", "leaves_out", "shape")
#: ``checkpoint_casing``: the casing of the general checkpoint a continual recipe starts from (BioBERT: cased)
OPTIONAL_SYSTEM_KEYS = ("checkpoint_casing",)
TINY_CORPUS = "configs/corpus/demo.yaml"  # the embedded sample
TINY_FINETUNE = "configs/blurb/recipe_tiny.yaml"  # 32 examples of the committed NER dataset

#: The CPU-sized run every recipe shares; a recipe's own ``tiny`` is merged over it.
TINY: dict[str, Any] = {
    "vocab": {"vocab_size": 2000},
    "pretrain_seeds": 1,
    "pretrain": {
        "max_steps": 2, "micro_batch_size": 4, "global_batch_size": 0, "gradient_accumulation_steps": 1,
        "num_gpus": 1, "hostfile": "",
        "extra_args": ["--precision", "fp32", "--global_batch_size", "0", "--checkpoint_every", "2",
                       "--num_workers", "0", "--wandb_mode", "disabled"],
    },
    "parallel_jobs": 1,
    "num_proc": 1,
}


@dataclass(frozen=True)
class Recipe:
    name: str
    system: dict[str, Any]
    ablation: AblationConfig


def recipe_names() -> list[str]:
    return sorted(p.stem for p in (shipped_dir("configs") / "recipes").glob("*.yaml"))


def recipe_path(name_or_path: str) -> Path:
    """``configs/recipes/<name>.yaml`` for a name, or the YAML file given."""
    path = resolve_path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        return path
    path = shipped_dir("configs") / "recipes" / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ConfigError(f"no recipe {name_or_path!r}; recipes: {', '.join(recipe_names())}")
    return path


def load_recipe(name_or_path: str, *, tiny: bool = False, scale: float = 1.0, output_dir: str | None = None,
                continual_from: str | None = None, data_root: str | None = None) -> Recipe:
    """The recipe's plan as an :class:`AblationConfig`: at the paper's settings times ``scale``, or
    its CPU-sized run (``tiny``); ``output_dir``, ``continual_from`` and the BLURB ``data_root`` override
    the recipe's."""
    path = recipe_path(name_or_path)
    values = load_yaml_mapping(path)
    system, own_tiny = values.pop("system", None), values.pop("tiny", None) or {}
    _check_system(system, path)
    if tiny:  # its own folder: a full run after it would be refused as another pretraining budget (QA)
        values = {**_tiny(values, own_tiny), "output_dir": f"{values['output_dir']}-tiny"}
    elif scale != 1.0:
        values = _scaled(values, scale)
    values.update({k: v for k, v in {"output_dir": output_dir, "continual_from": continual_from}.items() if v})
    if data_root:
        values["finetune"] = {**(values.get("finetune") or {}), "data_root": data_root}
    return Recipe(path.stem, system, ablation_config_from(values, str(path)))


def _check_system(system: Any, path: Path) -> None:
    if not isinstance(system, dict):
        raise ConfigError(f"{path}: 'system' is required: a mapping with {', '.join(SYSTEM_KEYS)}")
    missing, extra = set(SYSTEM_KEYS) - set(system), set(system) - set(SYSTEM_KEYS) - set(OPTIONAL_SYSTEM_KEYS)
    if system.get("checkpoint_casing", "cased") not in ("cased", "uncased"):
        raise ConfigError(f"{path}: system.checkpoint_casing: {system['checkpoint_casing']!r} is not cased or uncased")
    if missing or extra:
        raise ConfigError(f"{path}: system: " + "; ".join(
            part for part in (f"missing {', '.join(sorted(missing))}" if missing else "",
                              f"unknown {', '.join(sorted(extra))}" if extra else "") if part))


def checkpoint_casing_mismatch(recipe: Recipe) -> str | None:
    """Why the general checkpoint (``continual_from``) is not the one the recipe's system started from, by
    casing: BioBERT continued BERT-base-cased, and an uncased checkpoint makes another system (its tokens
    lowercased) without a word (QA). None where the recipe declares no casing or the checkpoint's vocabulary
    does not tell (a SentencePiece one, or no checkpoint there yet: the ablation refuses that itself)."""
    from biomed_lm.tokenization.tokenizer_io import directory_casing

    declared = recipe.system.get("checkpoint_casing")
    folder = Path(recipe.ablation.continual_from)
    if declared is None or not folder.is_dir():
        return None
    try:
        lowercase = directory_casing(folder)
    except (OSError, ValueError):  # a damaged record in the folder: the run's own loading names it
        return None
    if lowercase is None or lowercase == (declared == "uncased"):
        return None
    found = "uncased" if lowercase else "cased"
    return (f"{recipe.system['name']} starts from a {declared} checkpoint, and {folder}'s vocabulary is {found}: "
            f"the run is another system than the paper's (point --continual_from at a {declared} one)")


def _tiny(values: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """The CPU-sized plan: :data:`TINY` and the recipe's ``tiny`` over the recipe, every corpus the
    embedded sample, the first phase only (the phase continuation has tests of its own)."""
    finetune = {k: v for k, v in load_yaml_mapping(TINY_FINETUNE).items() if k not in ("model", "output_dir")}
    merged = merge(values, {**TINY, "finetune": finetune})
    merged["corpora"] = {name: TINY_CORPUS for name in values.get("corpora", {})}
    merged["pretrain"].pop("phase2", None)
    return merge(merged, own)


def _scaled(values: Mapping[str, Any], scale: float) -> dict[str, Any]:
    if scale <= 0:
        raise ConfigError(f"--scale must be positive, not {scale}")
    scaled = copy.deepcopy(dict(values))
    for phase in (scaled["pretrain"], scaled["pretrain"].get("phase2") or {}):
        if "max_steps" in phase:
            phase["max_steps"] = max(1, round(phase["max_steps"] * scale))
    return scaled


def merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in, mappings key by key (lists and values replace)."""
    merged = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


# Model-FLOPs utilisation measured on one NVIDIA H200, bf16, by sequence length (benchmarks/README.md):
# the BERT family unpadded (sdpa_padded, BERT's attention dropout, layers compiled) as launch/pretrain.py
# ran it, 29.2% at 128 x 256 on real instances (run C, commit bf9dea3; the bench's own row 32.0%), and
# 25.7% at 512 x 64 on BERT's length mix (the bench, commit 78b1a2b). RoBERTa and ALBERT run the same
# unpadded path since a91cae4, not yet measured on a GPU; until then their figure is their transformers class
# under torch.compile on the same H200 and instances (run C: RobertaForMaskedLM 26.2% with BERT's 30,522-token
# head, AlbertForPreTraining 31.2%, at 128 x 256), the pace a user has without this toolkit. (Before, 14.8% and
# 8%: transformers' padded eager forward, which these families no longer run.) A phase's length takes the
# nearest measured length's figure.
MEASURED_MFU: dict[str, dict[int, float]] = {"bert": {128: 0.292, 512: 0.257}, "roberta": {128: 0.262},
                                             "albert": {128: 0.312}}
#: The families whose MEASURED_MFU is their transformers class's, not the toolkit's own path (the table says so).
STAND_IN_MFU = frozenset({"roberta", "albert"})
PROJECTION_DEVICE = "NVIDIA H100 80GB HBM3"  # SXM: 989.4 dense bf16 TFLOP/s, the H200's too
DEFAULT_VOCAB = 30522
# An ALUM step (K = 1) against a standard one, measured: benchmarks/README.md, "ALUM step cost" (x2.74-x2.97).
ALUM_STEP_COST = 2.85


@dataclass(frozen=True)
class Cost:
    positions: int     # sequence positions the pretraining phases process (steps x batch x length)
    flops: float       # their model FLOPs (pretrain.flops: forward + backward, full-length sequences)
    hours: float       # on one H100/H200 at the family's measured MFU (x ALUM's measured step cost)
    mfu: float         # the phases' FLOPs over their hours at the peak: each phase at its length's MFU
    caveats: tuple[str, ...] = ()  # where the hours rest on a figure measured elsewhere (another length, ALUM)


def measured_mfu(family: str, length: int) -> float:
    """The family's MFU measured at the sequence length nearest ``length``."""
    by_length = MEASURED_MFU[family]
    return by_length[min(by_length, key=lambda measured: abs(measured - length))]


def projected_cost(recipe: Recipe) -> Cost:
    """The recipe's pretraining on one H100 at its family's measured MFU: every phase's steps x global
    batch x its max_seq_length, each sequence full length with 15% of it predicted."""
    from types import SimpleNamespace

    from biomed_lm.pretrain.config import load_model_preset
    from biomed_lm.pretrain.families import get_family
    from biomed_lm.pretrain.flops import device_peak, step_flops

    budget = recipe.ablation.pretrain
    settings = load_yaml_mapping(budget.config)
    family = settings.get("architecture", "bert")
    pairs = get_family(family).pair_head is not None and settings.get("train_pair", True) is not False
    adversarial = settings.get("adversarial") or "on" in recipe.ablation.factors.get("adversarial", [])
    vocab = load_yaml_mapping(recipe.ablation.vocab_config).get("vocab_size", DEFAULT_VOCAB)
    config = SimpleNamespace(**{"vocab_size": vocab, **load_model_preset(recipe.system["shape"])})
    peak = device_peak(PROJECTION_DEVICE).bf16
    positions = flops = seconds_at_peak = 0.0
    caveats = [f"{family} MFU of its transformers class compiled (ours unmeasured)"] if family in STAND_IN_MFU else []
    for phase in budget.phases():
        length = int(load_yaml_mapping(phase.data_config)["max_seq_length"])
        if length not in MEASURED_MFU[family]:
            nearest = min(MEASURED_MFU[family], key=lambda measured: abs(measured - length))
            caveats.append(f"{family} MFU measured at length {nearest} only, used at {length}")
        batch = phase.global_batch(budget.num_gpus)  # recipes fix global_batch_size; no hostfile needed
        positions += phase.max_steps * batch * length
        phase_flops = phase.max_steps * step_flops(config, [length] * batch, round(0.15 * length) * batch,
                                                   batch if pairs else 0)
        flops += phase_flops
        seconds_at_peak += phase_flops / measured_mfu(family, length) / peak
    hours = seconds_at_peak * (ALUM_STEP_COST if adversarial else 1.0) / 3600
    if adversarial:
        caveats.append(f"x{ALUM_STEP_COST} for ALUM's extra passes (measured on BERT-small on a CPU): "
                       f"{flops / (hours * 3600 * peak):.1%} of the peak in the model's FLOPs")
    return Cost(int(positions), flops, hours, flops / (seconds_at_peak * peak), tuple(dict.fromkeys(caveats)))


def recipe_table() -> str:
    """The README's comparison table: each recipe's system, what it reproduces and leaves out, and its
    projected pretraining cost on one H100."""
    rows = ["| recipe | system | reproduces | leaves out | pretraining | on one H100 |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name in recipe_names():
        recipe = load_recipe(name)
        cost = projected_cost(recipe)
        rows.append(f"| `{name}` | {recipe.system['name']} ({recipe.system['paper']}) | "
                    f"{' '.join(recipe.system['reproduces'].split())} | "
                    f"{' '.join(recipe.system['leaves_out'].split())} | "
                    f"{cost.positions / 1e9:,.0f}B positions, {cost.flops / 1e18:,.0f} EFLOP | "
                    f"{cost.hours:,.0f} h ({cost.hours / 24:,.1f} days) at {cost.mfu:.1%} MFU"
                    + "".join(f"; {caveat}" for caveat in cost.caveats) + " |")
    return "\n".join(rows)
