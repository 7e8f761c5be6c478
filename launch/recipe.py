#!/usr/bin/env python
"""Run one system of the papers end to end — corpus, vocabulary, instances, pretraining phases, BLURB —
as its recipe in configs/recipes/ says (experiments/recipes.py).

    python launch/recipe.py --list
    python launch/recipe.py --table                                              # the README's comparison
    python launch/recipe.py pubmedbert --output_dir /scratch/pubmedbert          # the paper's setting
    python launch/recipe.py bioalbert --scale 0.01                               # 1% of the steps
    python launch/recipe.py bioformer-8l --tiny --output_dir runs/recipes/tiny   # minutes on a CPU
    python launch/recipe.py biobert --continual_from /models/bert-base-cased --data_root /data/blurb

Each step is the entry script a user would run, printed before it runs; re-running the same command
continues an interrupted recipe. Exit status: 0 done, 1 a step or some fine-tuning runs failed,
2 unusable arguments or config.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from biomed_lm.config import parse_config
from biomed_lm.errors import BiomedLMError, bad_input, exits_cleanly_on_interrupt
from biomed_lm.experiments.ablation import StepFailed, run_ablation
from biomed_lm.experiments.recipes import checkpoint_casing_mismatch, load_recipe, recipe_names, recipe_table


@dataclass
class RecipeArgs:
    recipe: str = field(default="", metadata={"help": "a recipe name (--list shows them) or a recipe YAML file"})
    output_dir: str | None = field(default=None, metadata={"help": "override the recipe's output_dir"})
    scale: float = field(default=1.0, metadata={"help": "multiplies every phase's steps (1: the paper's)", "gt": 0})
    tiny: bool = field(default=False, metadata={
        "help": "the CPU-sized run: embedded sample, tiny model of the same family, 2 steps, a 32-example fine-tune"})
    continual_from: str | None = field(default=None, metadata={
        "help": "the general-domain checkpoint directory continual recipes start from"})
    data_root: str | None = field(default=None, metadata={
        "help": "the folder holding the BLURB datasets to fine-tune on (default: the recipe's, data/blurb, where "
                "only NCBI-disease ships)"})
    list: bool = field(default=False, metadata={"help": "print the recipes and exit"})
    table: bool = field(default=False, metadata={
        "help": "print the README's comparison table (each recipe's system and projected cost) and exit"})


@exits_cleanly_on_interrupt("recipe",
                            "finished steps and runs are kept: the same command continues")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-"):  # `recipe.py NAME ...`
        argv = ["--recipe", argv[0], *argv[1:]]
    try:
        (args,) = parse_config([RecipeArgs], argv, description=__doc__)
        if args.list or args.table:
            print(recipe_table() if args.table else "\n".join(recipe_names()))
            return 0
        if not args.recipe:
            raise BiomedLMError(f"name a recipe: {', '.join(recipe_names())}")
        recipe = load_recipe(args.recipe, tiny=args.tiny, scale=args.scale, output_dir=args.output_dir,
                             continual_from=args.continual_from, data_root=args.data_root)
        print(f"recipe {recipe.name}: {recipe.system['name']} ({recipe.system['paper']})"
              + (" -- tiny run" if args.tiny else f" at scale {args.scale:g}"), flush=True)
        mismatch = None if args.tiny else checkpoint_casing_mismatch(recipe)  # tiny: the packaged MiniLM
        if mismatch:
            print(f"recipe: warning: {mismatch}", file=sys.stderr, flush=True)
        record = run_ablation(recipe.ablation, report=False)
    except (BiomedLMError, FileNotFoundError) as err:
        return bad_input("recipe", err)
    except StepFailed as err:
        print(f"recipe: {err}", file=sys.stderr)
        return 1
    for variant in record.variants.values():
        checkpoint = variant.checkpoints[0]
        print(f"  model: {checkpoint.model}\n  BLURB: {Path(checkpoint.finetune_dir) / 'blurb.md'}")
    return 1 if record.failed else 0


if __name__ == "__main__":
    sys.exit(main())
