"""The choice sets of ablations and their analysis, each a ``Literal`` defined once.

Config checks, ``--help`` (``biomed_lm.config.parse_config`` lists a Literal's choices) and the
code that branches on a choice all read these; the tuples are ``typing.get_args`` of their
Literal. The pretraining factors whose levels are pretraining options (``initialization``,
``mask_schedule``) take them from ``pretrain.config``, where those options are defined.
"""

from __future__ import annotations

from typing import Literal, Mapping, get_args

from biomed_lm.pretrain.config import InitMode, MaskSchedule

__all__ = ["Vocabulary", "Masking", "Adversarial", "Link", "InitMode", "MaskSchedule", "Factor", "FACTORS",
           "FACTOR_LEVELS", "GENERAL", "Specification", "SPECIFICATIONS", "SeedEffect", "SEED_EFFECTS"]

#: ``general``: bert-base-uncased's WordPiece; ``in-domain``: built on the ablation's corpus.
Vocabulary = Literal["general", "in-domain"]
Masking = Literal["token", "whole-word"]
#: ``on``: ALUM's adversarial term during pretraining.
Adversarial = Literal["off", "on"]
#: ``on``: LinkBERT's document relation prediction over the corpus's citation links replaces the data
#: config's pair objective (paper 000's "Link function"; pretrain.instance_recipe pair_task drp).
Link = Literal["off", "on"]
#: The factors of an ablation grid, in the order variant names are built.
Factor = Literal["vocabulary", "masking", "initialization", "adversarial", "mask_schedule", "link", "corpus"]

GENERAL: Vocabulary = "general"
FACTORS: tuple[str, ...] = get_args(Factor)
#: Each factor's levels; ``corpus`` has none of its own (the names of the config's corpora).
FACTOR_LEVELS: Mapping[str, tuple[str, ...] | None] = {
    "vocabulary": get_args(Vocabulary),
    "masking": get_args(Masking),
    "initialization": get_args(InitMode),
    "adversarial": get_args(Adversarial),
    "mask_schedule": get_args(MaskSchedule),
    "link": get_args(Link),
    "corpus": None,
}

#: The report's analysis: ``checkpoints`` (experiments.checkpoint_analysis, a random intercept per
#: pretraining run; the default) or paper 000's ``model-dataset-groups`` (experiments.analysis).
Specification = Literal["checkpoints", "model-dataset-groups"]
SPECIFICATIONS: tuple[str, ...] = get_args(Specification)

#: How paper 000's model takes the fine-tuning seeds (experiments.analysis.fit_multilevel).
SeedEffect = Literal["variance_component", "fixed", "none"]
SEED_EFFECTS: tuple[str, ...] = get_args(SeedEffect)
