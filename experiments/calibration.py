"""Calibration of the ablation analysis: simulate ablations shaped like the shipped configs, fit
exactly the report's analysis, and count how often it calls a factor significant.

An ablation's runs are simulated from the model the analysis assumes plus what it does not model
(a hyperparameter setting's shift within a checkpoint × dataset cell)::

    y = offset_dataset + effect·[first factor at its first non-reference level]
        + c_checkpoint + cd_(checkpoint, dataset) + s_(checkpoint, dataset, seed)
        + h_(checkpoint, dataset, setting) + e

The variance components come from paper 000 (Sanchez Carmona et al., "A Multilevel Analysis of
PubMed-only BERT-based Biomedical Models", Table 4 and Figure 1); :meth:`VarianceComponents.paper000`
says how each is derived. Paper 000 had one checkpoint per model, so it could not split its
(model, dataset) intercept variance into a part shared across datasets (the checkpoint's) and a
part that is not; ``checkpoint_share`` is that split, an assumption the docs page varies.

:func:`calibrate` returns, per true effect, the share of simulations with p < α for the tested
factor (the false-positive rate at effect 0; the power otherwise) with a Wilson interval.
:func:`approximate_power` is the balanced-design formula (a contrast of checkpoint means, a
noncentral t with the between-within df), checked against the simulations and used to find the
smallest design with 80% power, which would take too many simulated fits to search.
``launch/calibrate.py`` runs the study and writes the table of ``docs/calibration.md``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import scipy.stats
from statsmodels.stats.proportion import proportion_confint

from biomed_lm.errors import ConfigError
from biomed_lm.experiments.choices import Specification

__all__ = ["VarianceComponents", "AblationDesign", "simulate_runs", "calibrate", "CalibrationResult",
           "approximate_power", "minimum_design", "report_test", "paper000_test", "PAPER000_AS_PRINTED",
           "calibration_markdown"]

#: ``calibrate(specification=...)``: paper 000's p-values as printed, without the report's guard.
PAPER000_AS_PRINTED = "paper000-as-printed"

#: Dataset offsets (points) are drawn around this, with this SD: only their differences matter.
_OFFSET_MEAN, _OFFSET_SD = 75.0, 8.0


@dataclass(frozen=True)
class VarianceComponents:
    """Variances in points² of each random part of a simulated score."""

    checkpoint: float            # a pretraining run's luck, shared by every dataset
    checkpoint_x_dataset: float  # its luck on one dataset
    seed: float                  # a fine-tuning seed's shift, shared by the settings run with it
    setting: float               # a hyperparameter setting's shift in one cell (not in the analysis)
    residual: float

    @classmethod
    def paper000(cls, checkpoint_share: float = 0.5) -> "VarianceComponents":
        """From paper 000's reported variances and shares:

        * (model, dataset) random intercept: 9.29 (Table 4), split ``checkpoint_share`` to the
          checkpoint and the rest to checkpoint × dataset;
        * seed: Table 4 gives the random slopes of seed_20 and seed_47 against seed_59 (22.96 and
          38.59); a difference of two seeds' shifts has twice a shift's variance: (22.96 + 38.59) / 4;
        * setting: the learning-rate and batch slopes of Table 4 averaged over the runs they apply to
          (lr_1..lr_4 each a fifth of the runs, batch_16 half): (3.03 + 9.72 + 8.78 + 0.42) / 5 + 0.37 / 2;
        * residual: Figure 1 puts it at about 20% of the variance against about 10% for the level-1
          random slopes (seeds and settings, averaged as above), so twice their sum.
        """
        if not 0.0 <= checkpoint_share <= 1.0:
            raise ConfigError(f"checkpoint_share must be in [0, 1], got {checkpoint_share}")
        group, seed_slopes = 9.29, (22.96 + 38.59) / 3
        setting = (3.03 + 9.72 + 8.78 + 0.42) / 5 + 0.37 / 2
        return cls(checkpoint=checkpoint_share * group, checkpoint_x_dataset=(1 - checkpoint_share) * group,
                   seed=(22.96 + 38.59) / 4, setting=setting, residual=2 * (seed_slopes + setting))


@dataclass(frozen=True)
class AblationDesign:
    """The shape of an ablation: its variants (factor levels), checkpoints per variant, datasets
    with their fine-tuning seeds, and hyperparameter settings."""

    name: str
    variants: tuple[dict[str, str], ...]
    factors: dict[str, str]               # the factors that vary -> reference level
    pretrain_seeds: int
    seeds: dict[str, int]                 # dataset -> fine-tuning seeds
    settings: tuple[tuple[float, int], ...]  # (learning rate, batch size)

    @classmethod
    def from_ablation_config(cls, path: str | Path, pretrain_seeds: int | None = None) -> "AblationDesign":
        """The design of a ``configs/ablation/*.yaml``: its variants, pretraining seeds, datasets (all
        of BLURB when unset), seeds per dataset (the sweep protocol's when unset) and grid."""
        from biomed_lm.experiments.ablation import load_ablation_config, plan_variants
        from biomed_lm.finetune.sweep import PROTOCOL, SweepArgs

        config = load_ablation_config(path)
        variants, _ = plan_variants(config.factors)
        sweep = SweepArgs(model="-", output_dir="-", **config.finetune)
        varying = {f: levels[0] for f, levels in config.factors.items() if len(levels) > 1}
        seeds = {d: int(sweep.num_seeds or PROTOCOL[d].num_seeds) for d in sweep.datasets}
        return cls(name=Path(path).stem, variants=tuple(dict(v.factors) for v in variants), factors=varying,
                   pretrain_seeds=int(pretrain_seeds or config.pretrain_seeds), seeds=seeds,
                   settings=tuple(itertools.product(map(float, sweep.learning_rates), map(int, sweep.batch_sizes))))

    def with_(self, **changes: Any) -> "AblationDesign":
        return dataclasses.replace(self, **changes)

    @property
    def tested(self) -> tuple[str, str]:
        """The factor and level whose effect is planted: the first factor's first other level."""
        factor, reference = next(iter(self.factors.items()))
        return factor, next(v[factor] for v in self.variants if v[factor] != reference)

    @property
    def n_runs(self) -> int:
        return len(self.variants) * self.pretrain_seeds * sum(self.seeds.values()) * len(self.settings)

    def describe(self) -> str:
        seeds = sorted(set(self.seeds.values()))
        return (f"{len(self.variants)} variants × {self.pretrain_seeds} checkpoints × {len(self.seeds)} datasets × "
                f"{len(self.settings)} settings × {'/'.join(map(str, seeds))} seeds = {self.n_runs} runs")


def simulate_runs(design: AblationDesign, components: VarianceComponents, effect: float,
                  rng: np.random.Generator) -> pd.DataFrame:
    """One simulated ablation: a row per fine-tuning run, in the report's ``runs.csv`` columns."""
    factor, level = design.tested
    offsets = {d: rng.normal(_OFFSET_MEAN, _OFFSET_SD) for d in design.seeds}
    sd = {k: math.sqrt(v) for k, v in dataclasses.asdict(components).items()}
    blocks = []
    for index, variant in enumerate(design.variants):
        name = "_".join(variant[f] for f in design.factors) or f"v{index}"
        shift = effect if variant[factor] == level else 0.0
        for checkpoint in range(1, design.pretrain_seeds + 1):
            luck = rng.normal(0.0, sd["checkpoint"])
            for dataset, n_seeds in design.seeds.items():
                cell = offsets[dataset] + shift + luck + rng.normal(0.0, sd["checkpoint_x_dataset"])
                seed_shift = rng.normal(0.0, sd["seed"], n_seeds)
                setting_shift = rng.normal(0.0, sd["setting"], len(design.settings))
                points = (cell + seed_shift[:, None] + setting_shift[None, :]
                          + rng.normal(0.0, sd["residual"], (n_seeds, len(design.settings))))
                seed_index, setting_index = np.indices(points.shape)
                lr, batch = np.array(design.settings, dtype=float).T
                blocks.append(pd.DataFrame({
                    "variant": name, **variant, "checkpoint": checkpoint, "dataset": dataset,
                    "learning_rate": lr[setting_index.ravel()], "batch_size": batch[setting_index.ravel()],
                    "epochs": 10, "seed": seed_index.ravel(), "test_score": points.ravel() / 100.0}))
    return pd.concat(blocks, ignore_index=True)


@dataclass
class CalibrationResult:
    """Per true effect (points): simulations, rejections (p < α with the planted sign for effects
    ≠ 0), the rate and its 95% Wilson interval, and how many fits failed or withheld the test."""

    design: AblationDesign
    components: VarianceComponents
    specification: str
    alpha: float
    rows: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the design, the components, the specification, α and the rows."""
        design = dataclasses.asdict(self.design)
        design["settings"] = [list(s) for s in self.design.settings]
        return {"design": design, "components": dataclasses.asdict(self.components),
                "specification": self.specification, "alpha": self.alpha,
                "rows": [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
                         for r in self.rows]}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "CalibrationResult":
        design = dict(values["design"])
        design["variants"] = tuple(design["variants"])
        design["settings"] = tuple(tuple(s) for s in design["settings"])
        rows = [{k: (math.nan if v is None else v) for k, v in r.items()} for r in values["rows"]]
        return cls(AblationDesign(**design), VarianceComponents(**values["components"]), values["specification"],
                   float(values["alpha"]), rows)


def report_test(rows: pd.DataFrame, design: AblationDesign, specification: Specification = "checkpoints"
                ) -> tuple[float, float] | None:
    """The tested factor's (estimate, p-value) as the report gives them; None when the report
    withholds the test (one checkpoint per variant) or the fit fails."""
    outcome = _report_outcome(rows, design, specification)
    return outcome[:2] if outcome else None


def _report_outcome(rows: pd.DataFrame, design: AblationDesign, specification: str
                    ) -> tuple[float, float, bool] | None:
    """:func:`report_test`'s (estimate, p-value) and whether REML put the checkpoints' variance at
    zero (the test then pools their degrees of freedom with the level below): the two cases'
    rates are counted apart, since they err in opposite directions."""
    from biomed_lm.experiments.checkpoint_analysis import analyse_runs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = analyse_runs(rows, design.factors, specification)
        except (ValueError, np.linalg.LinAlgError):
            return None
    tested = _tested(result, design) if result.factor_tests else None
    return (*tested, "checkpoint" in result.zero_variance_levels) if tested else None


def paper000_test(rows: pd.DataFrame, design: AblationDesign) -> tuple[float, float] | None:
    """The tested factor's (estimate, p-value) as paper 000's analysis prints them, whatever the
    design (the docs' contrast: what a (model, dataset)-group analysis claims with one checkpoint
    per variant)."""
    from biomed_lm.experiments.analysis import fit_multilevel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return _tested(fit_multilevel(rows, design.factors), design)
        except (ValueError, np.linalg.LinAlgError):
            return None


def _tested(result, design: AblationDesign) -> tuple[float, float] | None:
    factor, level = design.tested
    row = result.coefficients[result.coefficients["term"] == f"{factor}[{level}]"]
    return (float(row["estimate"].iloc[0]), float(row["p"].iloc[0])) if len(row) else None


def _one_simulation(args: tuple) -> tuple[float, float, bool] | None:
    """(estimate, p-value, checkpoint variance at zero) of simulation ``index``; its random stream
    depends only on (seed, effect index, index), so chunking over processes changes nothing."""
    design, components, effect, effect_index, index, seed, specification = args
    rows = simulate_runs(design, components, effect, np.random.default_rng([seed, effect_index, index]))
    if specification == PAPER000_AS_PRINTED:
        tested = paper000_test(rows, design)
        return (*tested, False) if tested else None
    return _report_outcome(rows, design, specification)


def calibrate(design: AblationDesign, components: VarianceComponents, *, effects: Sequence[float] = (0.0, 1.0, 2.0),
              simulations: int = 500, specification: str = "checkpoints", alpha: float = 0.05, seed: int = 0,
              processes: int = 1, progress: Callable[[int], None] | None = None) -> CalibrationResult:
    """Simulate ``simulations`` ablations per true effect, fit the report's analysis (or
    ``PAPER000_AS_PRINTED``) to each, and count rejections of the tested factor: p < α, with the
    planted sign when the effect is not 0. ``progress`` is called with the number of fits just done."""
    result = CalibrationResult(design, components, specification, alpha)
    pool = None
    if processes > 1:
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(processes)
    try:
        for effect_index, effect in enumerate(effects):
            jobs = [(design, components, float(effect), effect_index, i, seed, specification)
                    for i in range(simulations)]
            outcomes = []
            for outcome in (pool.map(_one_simulation, jobs, chunksize=4) if pool else map(_one_simulation, jobs)):
                outcomes.append(outcome)
                if progress is not None:
                    progress(1)
            result.rows.append(_rejections(outcomes, effect, simulations, alpha, design, components, specification))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)  # on Ctrl-C, not every simulation still queued
    return result


def _rejections(outcomes, effect, simulations, alpha, design, components, specification) -> dict[str, Any]:
    """A rejection: p < α, and for a true effect the estimate on its side (the wrong sign is not power).
    ``zero_*``: the same over the fits whose checkpoint variance REML put at zero."""
    tested = [outcome for outcome in outcomes if outcome is not None]
    row = {"effect": float(effect), "simulations": simulations,
           **_rate([o[:2] for o in tested], effect, alpha, ""),
           **_rate([o[:2] for o in tested if o[2]], effect, alpha, "zero_")}
    row["approximate"] = (approximate_power(design, components, effect, alpha)
                          if specification == "checkpoints" else math.nan)
    return row


def _rate(tested: Sequence[tuple[float, float]], effect: float, alpha: float, prefix: str) -> dict[str, Any]:
    rejected = sum(1 for estimate, p in tested if p < alpha and (effect == 0 or estimate * effect > 0))
    low, high = proportion_confint(rejected, len(tested), method="wilson") if tested else (math.nan, math.nan)
    return {f"{prefix}tested": len(tested), f"{prefix}rejected": rejected,
            f"{prefix}rate": rejected / len(tested) if tested else math.nan,
            f"{prefix}rate_low": low, f"{prefix}rate_high": high}


def approximate_power(design: AblationDesign, components: VarianceComponents, effect: float,
                      alpha: float = 0.05) -> float:
    """Power of the checkpoint model's t test of the tested factor in a balanced design: the
    estimate is a contrast of checkpoint means whose variance is the checkpoint-level variance
    over the checkpoint-level design; its t has the between-within df."""
    columns, labels = [np.ones(len(design.variants))], ["Intercept"]
    for name, reference in design.factors.items():
        for lvl in sorted({v[name] for v in design.variants} - {reference}):
            columns.append(np.array([v[name] == lvl for v in design.variants], dtype=float))
            labels.append(f"{name}[{lvl}]")
    x = np.repeat(np.column_stack(columns), design.pretrain_seeds, axis=0)
    df = x.shape[0] - np.linalg.matrix_rank(x)
    if df < 1:
        return math.nan
    n_datasets = len(design.seeds)
    mean_seeds = n_datasets / sum(1.0 / s for s in design.seeds.values())  # harmonic mean
    n_settings = len(design.settings)
    checkpoint_mean_var = (components.checkpoint + components.checkpoint_x_dataset / n_datasets
                           + components.seed / (n_datasets * mean_seeds)
                           + components.setting / (n_datasets * n_settings)
                           + components.residual / (n_datasets * mean_seeds * n_settings))
    factor, level = design.tested
    index = labels.index(f"{factor}[{level}]")
    se = math.sqrt(checkpoint_mean_var * np.linalg.pinv(x.T @ x)[index, index])
    crit = scipy.stats.t.ppf(1 - alpha / 2, df)
    return float(scipy.stats.nct.sf(crit, df, effect / se) + scipy.stats.nct.cdf(-crit, df, effect / se))


def minimum_design(design: AblationDesign, components: VarianceComponents, *, effect: float = 1.0,
                   power: float = 0.8, max_checkpoints: int = 200, seed_options: Sequence[int] = (3, 5, 10)
                   ) -> list[dict[str, Any]]:
    """Per number of fine-tuning seeds, the fewest checkpoints per variant that reach ``power`` at
    ``effect`` points (None when even ``max_checkpoints`` does not)."""
    out = []
    for seeds in seed_options:
        candidate = design.with_(seeds={d: seeds for d in design.seeds})
        found = next((k for k in range(2, max_checkpoints + 1)
                      if approximate_power(candidate.with_(pretrain_seeds=k), components, effect) >= power), None)
        out.append({"seeds": seeds, "checkpoints_per_variant": found,
                    "power": approximate_power(candidate.with_(pretrain_seeds=found), components, effect)
                    if found else math.nan})
    return out


def _cell(row: Mapping[str, Any], prefix: str = "") -> str:
    if not row["tested"]:
        return "no test (withheld)"
    if prefix and not row.get(f"{prefix}tested"):  # no such fit, or a result saved before it was counted
        return "—"
    text = (f"{100 * row[f'{prefix}rate']:.1f}% [{100 * row[f'{prefix}rate_low']:.1f}, "
            f"{100 * row[f'{prefix}rate_high']:.1f}]")
    return text + (f" of {row[f'{prefix}tested']} fits" if prefix else "")


def calibration_markdown(results: Sequence[CalibrationResult], minimum: Sequence[dict[str, Any]] = (),
                         minimum_of: str = "") -> str:
    """The table of ``docs/calibration.md``: per design and specification, the false-positive rate
    and the power at each effect with Wilson 95% intervals (and the balanced-design approximation),
    then the minimum design for 80% power."""
    effects = sorted({r["effect"] for result in results for r in result.rows})
    head = ["design", "runs", "analysis", "simulations"] + [
        "false positives (effect 0)" if e == 0 else f"power at {e:g} point{'s' if e != 1 else ''}" for e in effects]
    if 0.0 in effects:  # the rate in the fits whose checkpoint variance REML put at zero
        head.insert(5, "false positives, checkpoint variance estimated at zero")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] if results else []
    for result in results:
        by_effect = {r["effect"]: r for r in result.rows}
        cells = []
        for e in effects:
            row = by_effect.get(e)
            text = _cell(row) if row else "—"
            if row and e != 0 and math.isfinite(row.get("approximate", math.nan)):
                text += f" (formula {100 * row['approximate']:.0f}%)"
            cells.append(text)
        if 0.0 in effects:
            cells.insert(1, _cell(by_effect[0.0], "zero_") if 0.0 in by_effect else "—")
        sims = max(r["simulations"] for r in result.rows)
        label = {"checkpoints": "report (checkpoints)", "model-dataset-groups": "report (paper 000's model)",
                 PAPER000_AS_PRINTED: "paper 000's p-values, unguarded"}.get(result.specification, result.specification)
        lines.append(f"| {result.design.name} ({result.design.pretrain_seeds} checkpoint"
                     f"{'s' if result.design.pretrain_seeds > 1 else ''}/variant) | {result.design.n_runs} | {label} | "
                     f"{sims} | " + " | ".join(cells) + " |")
    if minimum:
        lines += ([""] if lines else []) + [
            f"Smallest design with 80% power at 1 point ({minimum_of}; balanced-design formula):", "",
            "| fine-tuning seeds per dataset | checkpoints per variant | power |", "|---:|---:|---:|"]
        for m in minimum:
            k = m["checkpoints_per_variant"]
            power = f"{100 * m['power']:.0f}%" if k else "—"
            lines.append(f"| {m['seeds']} | {k if k else 'more than 200'} | {power} |")
    return "\n".join(lines) + "\n"
