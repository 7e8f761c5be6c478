#!/usr/bin/env python
"""The calibration study of the ablation analysis (experiments/calibration.py, docs/calibration.md):
simulate ablations shaped like the shipped configs, fit the report's analysis to each, and report
the false-positive rate at α = 0.05 and the power at true effects of 1 and 2 points.

    python launch/calibrate.py                                   # the shipped designs, 500 simulations each
    python launch/calibrate.py --designs configs/ablation/demo.yaml:2 --simulations 200 --processes 2
    python launch/calibrate.py --checkpoint_share 0.25 --output_dir runs/calibration-share25

A design is an ablation config, optionally with ``:K`` for K pretraining runs per variant instead
of its ``pretrain_seeds``. Each (design, analysis) result is saved as JSON in ``output_dir`` as soon
as it is done and skipped when it is already there with the same settings, so an interrupted study
resumes; ``calibration.md`` there gathers every result. Designs with one checkpoint per variant
also get paper 000's p-values as printed (the report withholds them) at effect 0, for contrast.
Exit status: 0 written, 2 unusable options or config.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from biomed_lm.config import parse_config
from biomed_lm.errors import BiomedLMError, ConfigError, bad_input, exits_cleanly_on_interrupt
from biomed_lm.experiments.choices import Specification

SHIPPED = ["configs/ablation/demo.yaml", "configs/ablation/demo.yaml:2", "configs/ablation/tiny.yaml",
           "configs/ablation/pubmedbert.yaml"]


@dataclass
class CalibrateArgs:
    """Options of ``launch/calibrate.py``."""

    designs: list[str] = field(default_factory=lambda: list(SHIPPED), metadata={
        "help": "ablation configs, each optionally PATH:K for K checkpoints per variant"})
    simulations: int = field(default=500, metadata={"help": "simulated ablations per true effect", "min": 1})
    effects: list[float] = field(default_factory=lambda: [0.0, 1.0, 2.0], metadata={
        "help": "true effects of the tested factor, in points (0: false-positive rate)"})
    checkpoint_share: float = field(default=0.5, metadata={
        "help": "share of paper 000's (model, dataset) variance that a checkpoint carries to every dataset",
        "min": 0.0, "max": 1.0})
    specification: Specification = field(default="checkpoints", metadata={
        "help": "the report's analysis to calibrate"})
    alpha: float = field(default=0.05, metadata={"min": 0.0, "max": 1.0})
    minimum_shares: list[float] = field(default_factory=lambda: [0.1, 0.25, 0.5], metadata={
        "help": "checkpoint shares for the minimum-design tables (balanced-design formula, no simulation)"})
    processes: int = field(default=1, metadata={"help": "worker processes for the fits", "min": 1})
    seed: int = field(default=0, metadata={"min": 0})
    output_dir: str = field(default="runs/calibration", metadata={"help": "one JSON per result + calibration.md"})


def _design(spec: str):
    from biomed_lm.experiments.calibration import AblationDesign

    path, _, runs = spec.partition(":")
    if runs and not runs.isdigit():
        raise ConfigError(f"--designs {spec}: expected PATH or PATH:K with K a whole number of checkpoints")
    design = AblationDesign.from_ablation_config(path, int(runs) if runs else None)
    return design.with_(name=Path(path).stem)


def _run_one(design, components, args: CalibrateArgs, specification: str, effects, out: Path):
    """One (design, analysis) result: read back when the same settings were saved, else simulated."""
    from tqdm import tqdm

    from biomed_lm.experiments.calibration import CalibrationResult, calibrate

    path = out / f"{design.name}-k{design.pretrain_seeds}-{specification}.json"
    settings = {"simulations": args.simulations, "effects": list(effects), "seed": args.seed, "alpha": args.alpha,
                "components": vars(components)}
    if path.is_file():
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved.get("settings") == settings:
            print(f"{path.name}: already done")
            return CalibrationResult.from_dict(saved["result"])
    with tqdm(total=args.simulations * len(effects), desc=f"{design.name} ×{design.pretrain_seeds} {specification}",
              unit="fit") as bar:
        result = calibrate(design, components, effects=effects, simulations=args.simulations,
                           specification=specification, alpha=args.alpha, seed=args.seed,
                           processes=args.processes, progress=bar.update)
    path.write_text(json.dumps({"settings": settings, "result": result.to_dict()}, indent=2) + "\n", encoding="utf-8")
    return result


@exits_cleanly_on_interrupt("calibrate")
def main(argv: list[str] | None = None) -> int:
    try:
        (args,) = parse_config([CalibrateArgs], argv, description=__doc__)
        designs = [_design(spec) for spec in args.designs]
        from biomed_lm.experiments.calibration import (PAPER000_AS_PRINTED, VarianceComponents, calibration_markdown,
                                                       minimum_design)

        components = VarianceComponents.paper000(args.checkpoint_share)
        for share in args.minimum_shares:  # checked before hours of simulation
            VarianceComponents.paper000(share)
    except (BiomedLMError, FileNotFoundError, KeyError) as err:
        return bad_input("calibrate", err)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for design in designs:
        results.append(_run_one(design, components, args, args.specification, args.effects, out))
        if design.pretrain_seeds == 1 and 0.0 in args.effects:
            results.append(_run_one(design, components, args, PAPER000_AS_PRINTED, [0.0], out))
    largest = max(designs, key=lambda d: d.n_runs)
    text = (f"# Calibration of the ablation analysis\n\nVariance components (points²), paper 000 with checkpoint "
            f"share {args.checkpoint_share:g}: " + ", ".join(f"{k} {v:.2f}" for k, v in vars(components).items())
            + f".\nα = {args.alpha:g}; rates with Wilson 95% intervals.\n\n" + calibration_markdown(results))
    for share in args.minimum_shares:
        minimum = minimum_design(largest, VarianceComponents.paper000(share))
        text += "\n" + calibration_markdown([], minimum, f"checkpoint share {share:g}; the design of {largest.name}: "
                                                          f"{largest.describe()}")
    (out / "calibration.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
