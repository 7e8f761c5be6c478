"""The ablation analysis with the right units: a pretraining *run* (checkpoint) is what a
pretraining factor is tested on.

A pretraining run's luck (its initialization, data order and masking draws) is shared by every
dataset it is fine-tuned on. Paper 000's model (:func:`experiments.analysis.fit_multilevel`,
``specification: model-dataset-groups``) gives each (pretrained model, dataset) pair its own random
intercept, so with one checkpoint per variant that shared luck looks like the factor's effect, and
the more datasets there are the surer the model is of it. Here the model is::

    y = b0 + Σ b_k·z_k (fine-tuning variables) + Σ b_f·[factor f = level] + Σ b_d·[dataset = d]
        + c_checkpoint + (cd)_(checkpoint, dataset) + s_(checkpoint, dataset, seed) + e

with ``c`` one random intercept per checkpoint (shared by every dataset), ``cd`` the checkpoint ×
dataset component, ``s`` the fine-tuning seed's shift (shared by the hyperparameter settings run
with that seed), all fitted by REML with statsmodels ``MixedLM``: the checkpoint is the group, the
other two are variance components within it. Datasets are crossed with checkpoints through the
fixed dataset effects. Fine-tuning variables enter as in paper 000 (standardized fixed effects).

Tests are Wald t statistics with *between-within* degrees of freedom (Schluchter & Elashoff,
1990; SAS ``DDFM=BETWITHIN``): a term constant within checkpoints (a pretraining factor) gets the
number of checkpoints minus the rank of the checkpoint-level design; a term constant within
(checkpoint, dataset) cells gets the cells' degrees of freedom; one constant within a fine-tuning
seed's runs of a cell, the seed units'; the rest the runs' less one per seed unit. With few
checkpoints the normal approximation would be far too optimistic; the calibration study
(:mod:`experiments.calibration`, ``docs/calibration.md``) measures how well this holds.

With one checkpoint per variant a factor's effect cannot be told from its checkpoint's luck (any
degree of freedom left would come from assuming the factors do not interact):
:class:`CheckpointsConfounded` is raised, and the report falls back to paper 000's specification
with the factor p-values withheld. The same holds when the checkpoint-level df are 0. With more
checkpoints per variant, ``specification: model-dataset-groups`` still prints its p-values, but
marked as paper 000's specification under :data:`PAPER000_CAVEAT`: its groups count each
checkpoint's luck once per dataset however many checkpoints there are.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import scipy.stats

from biomed_lm.experiments.analysis import MultilevelResult, fit_multilevel
from biomed_lm.experiments.choices import SPECIFICATIONS, Specification
from biomed_lm.experiments.design import (AnalysisError, Design, Names, between_within_df, checkpoint_column,
                                          fit_intercepts, prepare_runs)

__all__ = ["CheckpointsConfounded", "fit_checkpoint_model", "analyse_runs", "SPECIFICATIONS", "CONFOUNDED_CAVEAT",
           "PAPER000_CAVEAT", "PAPER000_P_BASIS"]

CONFOUNDED_CAVEAT = (
    "each variant was pretrained once, so each factor's estimated effect is confounded with that one "
    "pretraining run's luck (its initialization, data order and masking draws). The factor estimates describe "
    "these checkpoints, not the recipes, and no p-value is given for them; pretrain every variant at least twice "
    "(pretrain_seeds: 2 in the ablation config) to test a factor")


#: What the factor p-values of ``specification: model-dataset-groups`` are when they are printed.
PAPER000_P_BASIS = "paper 000's specification (model-dataset-groups), not the calibrated test"

PAPER000_CAVEAT = (
    "the factor p-values below are paper 000's specification (model-dataset-groups), not the calibrated test. "
    "Each pretraining run's luck (its initialization, data order and masking draws) is shared by every dataset it "
    "is fine-tuned on, and this specification counts it once per dataset, so that luck can look like a factor's "
    "effect: with no true effect its p-values fall below 0.05 more often than 5% of the time, however many times "
    "each variant was pretrained (docs/calibration.md). Use specification: checkpoints to test a factor")


class CheckpointsConfounded(AnalysisError):
    """The pretraining factors use up every checkpoint-level degree of freedom (one checkpoint per
    variant): their effects cannot be told from the checkpoints' luck."""


def analyse_runs(rows: pd.DataFrame, factors: Mapping[str, str], specification: Specification = "checkpoints",
                 **fit_options: Any) -> MultilevelResult:
    """The report's analysis of an ablation's runs. ``checkpoints``: :func:`fit_checkpoint_model`;
    where the checkpoints leave the factors no degree of freedom, paper 000's model describes the
    runs with the factor tests withheld. ``model-dataset-groups``: paper 000's model
    (:func:`experiments.analysis.fit_multilevel`, groups = checkpoint × dataset); its factor tests
    are withheld too when there is one checkpoint per variant, and with more they are printed
    marked as that specification's, under :data:`PAPER000_CAVEAT`."""
    if specification not in SPECIFICATIONS:
        raise AnalysisError(f"specification must be one of {', '.join(SPECIFICATIONS)}, got {specification!r}")
    result = _analyse(rows, factors, specification, **fit_options)
    result.notes += _constant_score_notes(rows, fit_options.get("response", "test_score"))
    return result


def _constant_score_notes(rows: pd.DataFrame | Sequence[Mapping[str, Any]], response: str = "test_score") -> list[str]:
    """One note per (variant, dataset) whose runs (two or more) all score the same: typically a model
    that learned nothing (F1 0 on every seed). Both models assume the same run-to-run noise in every
    variant, so such a variant's SE and p-value are borrowed from the other variants' spread."""
    frame = pd.DataFrame(rows)
    if not {"variant", "dataset", response} <= set(frame.columns):
        return []
    spread = frame.groupby(["variant", "dataset"])[response].agg(["nunique", "size", "first"])
    return [f"{variant} scores {100 * float(row['first']):.2f} points on every one of its {int(row['size'])} runs of "
            f"{dataset} (did fine-tuning learn anything?): the model assumes every variant's runs spread alike, so "
            f"its comparisons with {variant} rest on the other variants' spread"
            for (variant, dataset), row in spread.iterrows() if row["size"] > 1 and row["nunique"] == 1]


def _analyse(rows: pd.DataFrame, factors: Mapping[str, str], specification: Specification,
             **fit_options: Any) -> MultilevelResult:
    """:func:`analyse_runs` without its notes on the data."""
    if specification == "checkpoints":
        try:
            return fit_checkpoint_model(rows, factors, **fit_options)
        except CheckpointsConfounded as confounded:
            try:
                result = fit_multilevel(rows, factors, **fit_options)
            except AnalysisError as err:  # the confounding is the cause to report, not the fallback's failure
                raise CheckpointsConfounded(f"{confounded}; paper 000's model (model-dataset-groups), which "
                                            f"would describe these runs instead, cannot be fitted either: {err}"
                                            ) from err
            result.factor_tests, result.caveat = False, CONFOUNDED_CAVEAT
            result.notes.append("specification 'checkpoints' needs at least two checkpoints per variant; paper "
                                "000's model (model-dataset-groups) describes these runs instead")
            return result
    result = fit_multilevel(rows, factors, **fit_options)
    frame = pd.DataFrame(rows)
    if checkpoint_column(frame).nunique() <= frame["variant"].nunique():
        result.factor_tests, result.caveat = False, CONFOUNDED_CAVEAT
    elif any(term.kind == "factor" for term in result._terms.values()):
        # Checkpoints are nested in variants whatever their number: the (checkpoint, dataset) groups
        # still count one checkpoint's luck once per dataset, so the p-values are not calibrated.
        result.caveat, result.factor_p_basis = PAPER000_CAVEAT, PAPER000_P_BASIS
    return result


def fit_checkpoint_model(rows: pd.DataFrame | Sequence[Mapping[str, Any]], factors: Mapping[str, str], *,
                         response: str = "test_score",
                         level1: Sequence[str] = ("learning_rate", "batch_size", "epochs")) -> MultilevelResult:
    """Fit the checkpoint model (module docstring) of ``response`` (fractions; reported in points).

    ``rows``: one per fine-tuning run with ``variant``, ``checkpoint`` (the pretraining run within
    the variant; absent = one per variant), ``dataset``, ``seed``, the factor columns, ``level1``
    and ``response``. Raises :class:`CheckpointsConfounded` when no checkpoint-level degree of
    freedom is left for the factors, :class:`AnalysisError` for data the model cannot take (naming why)."""
    frame, y, kept_factors, notes = prepare_runs(rows, factors, response, level1, extra_columns=["seed"])
    frame["checkpoint_id"] = checkpoint_column(frame)
    datasets = sorted(frame["dataset"].unique())
    data = pd.DataFrame({"points": y.to_numpy(), "dataset": frame["dataset"].to_numpy(),
                         "grp": frame["checkpoint_id"].to_numpy()})
    data["cell"] = data["grp"] + " | " + data["dataset"]
    data["seed_unit"] = data["cell"] + " | " + frame["seed"].astype(str).to_numpy()
    data["seed_in_checkpoint"] = data["dataset"] + " | " + frame["seed"].astype(str).to_numpy()
    design = Design(data, Names({"points", "grp", "cell", "seed_unit", "dataset", "Intercept"}))
    scaling, level1_cols = design.add_level1(frame, [str(v) for v in level1], notes)
    design.add_factors(frame, kept_factors)
    design.add_datasets(frame, datasets, notes)
    design.check_identifiable()

    n_checkpoints = int(data["grp"].nunique())
    vc_formula, units = _variance_components(data, datasets, notes)
    df = between_within_df(data, design.columns, units)
    factor_cols = [c for c in design.columns if design.terms[c].kind == "factor"]
    if factor_cols and n_checkpoints <= int(frame["variant"].nunique()):
        # Any df left come from assuming the factors do not interact: the checkpoints' luck is then
        # read off the interaction contrasts, which is an assumption, not a measurement.
        raise CheckpointsConfounded(
            f"one checkpoint per variant ({n_checkpoints} checkpoints): each factor's effect is confounded with "
            f"the luck of its pretraining runs (set pretrain_seeds ≥ 2 in the ablation config)")
    if factor_cols and min(df[c] for c in factor_cols) < 1:
        raise CheckpointsConfounded(
            f"{n_checkpoints} checkpoints leave no checkpoint-level degree of freedom for the factors' "
            f"{len(factor_cols)} effects: each factor's effect is confounded with the luck of the pretraining "
            f"runs (set pretrain_seeds ≥ 2 in the ablation config)")
    if n_checkpoints < 3:
        raise AnalysisError(f"too few checkpoints for a multilevel model: {n_checkpoints}; need at least 3")
    _check_runs(len(data), n_checkpoints, len(design.columns) + 1, 2 + len(vc_formula or {}))

    formula = design.formula()
    fit, fit_notes = fit_intercepts(formula, data, vc_formula, "the checkpoint model",
                                    f"with {len(data)} runs of {n_checkpoints} checkpoints",
                                    "the fit did not converge cleanly: estimates are tentative")
    notes += fit_notes
    notes.append("random intercept per checkpoint (shared by every dataset); variance components: "
                 + (", ".join(vc_formula) if vc_formula else "none") + "; tests: t with between-within df")
    pooled = _boundary_units(fit, vc_formula)
    if pooled:
        df = between_within_df(data, design.columns, [u for u in units if u not in pooled])
        notes.append(_pooled_note(pooled))
    result = _result(fit, design=design, df=df, scaling=scaling, factors=kept_factors, notes=notes,
                     formula=formula, vc_formula=vc_formula, response=response, frame=frame,
                     n_checkpoints=n_checkpoints)
    result.zero_variance_levels = tuple(_LEVEL_NAMES[u] for u in pooled)
    return result


def _check_runs(n_runs: int, n_checkpoints: int, n_fixed: int, n_variances: int) -> None:
    """Enough runs to tell a checkpoint's luck from run noise, and for the parameters. With one
    fine-tuning run per checkpoint statsmodels either fails with a bare 'Singular matrix' or splits the
    variance between checkpoint and residual arbitrarily (equal halves), with SEs and p-values to match."""
    if n_runs <= n_checkpoints:
        raise AnalysisError(f"too few runs: {n_runs} fine-tuning runs of {n_checkpoints} checkpoints; a checkpoint's "
                            f"luck cannot be told from run noise with one run per checkpoint: fine-tune each "
                            f"checkpoint with several seeds (num_seeds) or on several datasets")
    if n_fixed + n_variances >= n_runs:
        raise AnalysisError(f"too few runs: {n_runs} fine-tuning runs for {n_fixed} fixed effects and {n_variances} "
                            f"variance parameters")


_LEVEL_NAMES = {"grp": "checkpoint", "cell": "checkpoint × dataset", "seed_unit": "fine-tuning seed"}


def _pooled_note(pooled: Sequence[str]) -> str:
    # A zero checkpoint variance is read off checkpoints that spread less than usual, so the test
    # then under-states the checkpoints' luck: it rejects more often than α there (less elsewhere).
    return ("estimated at zero, so pooled with the level below for the degrees of freedom: "
            + ", ".join(_LEVEL_NAMES[u] for u in pooled)
            + ("; in this case the factor tests reject a true null more often than α, not less "
               "(docs/calibration.md measures it)" if "grp" in pooled else ""))


def _variance_components(data: pd.DataFrame, datasets: Sequence[str], notes: list[str]
                         ) -> tuple[dict[str, str] | None, list[str]]:
    """The components the data can tell apart, and the nested units (top first) for the df."""
    vc: dict[str, str] = {}
    units = ["grp"]
    if len(datasets) > 1 and (data.groupby("cell").size() > 1).any():
        vc["checkpoint_x_dataset"] = "0 + C(dataset)"
        units.append("cell")
    elif len(datasets) == 1:
        notes.append("a single dataset: the checkpoint × dataset component is the checkpoint's own")
    else:
        notes.append("one run per (checkpoint, dataset): the checkpoint × dataset component is in the residual")
    if (data.groupby("seed_unit").size() > 1).any():
        vc["seed"] = "0 + C(seed_in_checkpoint)"
        # A seed's runs share its shift: a term varying within seed units (a learning rate the seeds
        # cross) is tested against the runs' df less one per seed unit, not per cell.
        units.append("seed_unit")
    else:
        notes.append("one run per (checkpoint, dataset, seed): a seed's shift cannot be told from run noise, so it "
                     "is part of the residual")
    return (vc or None), units


def _boundary_units(fit, vc_formula: Mapping[str, str] | None, tolerance: float = 1e-6) -> list[str]:
    """The units whose variance REML put on the boundary (zero): the model then has no such level,
    and its degrees of freedom pool with those of the level below."""
    scale = float(fit.scale)
    out = []
    if float(np.atleast_2d(np.asarray(fit.cov_re, dtype=float))[0, 0]) <= tolerance * scale:
        out.append("grp")
    names = list(fit.model.exog_vc.names) if vc_formula else []
    variances = np.asarray(fit.vcomp, dtype=float)
    for component, unit in (("checkpoint_x_dataset", "cell"), ("seed", "seed_unit")):
        if component in names and float(variances[names.index(component)]) <= tolerance * scale:
            out.append(unit)
    return out


def _result(fit, *, design: Design, df: Mapping[str, float], scaling, factors, notes, formula, vc_formula,
            response, frame: pd.DataFrame, n_checkpoints: int) -> MultilevelResult:
    names = list(fit.model.exog_names)
    k_fe = len(names)
    estimate = np.asarray(fit.fe_params, dtype=float)
    cov_fe = np.asarray(fit.cov_params(), dtype=float)[:k_fe, :k_fe]
    se = np.sqrt(np.clip(np.diag(cov_fe), 0.0, None))
    dfs = np.array([max(df.get(n, np.nan), 1.0) for n in names])
    with np.errstate(divide="ignore", invalid="ignore"):
        t = estimate / se
    crit = scipy.stats.t.ppf(0.975, dfs)
    coefficients = pd.DataFrame({
        "term": [design.terms[n].label if n in design.terms else n for n in names], "estimate": estimate,
        "se": se, "z": t, "df": dfs, "p": 2.0 * scipy.stats.t.sf(np.abs(t), dfs),
        "ci_low": estimate - crit * se, "ci_high": estimate + crit * se})

    random_effects = {"checkpoint": float(np.atleast_2d(np.asarray(fit.cov_re, dtype=float))[0, 0])}
    for name, value in zip(fit.model.exog_vc.names if vc_formula else [], np.asarray(fit.vcomp, dtype=float)):
        random_effects["seed" if name == "seed" else name] = float(value)
    random_effects["residual"] = float(fit.scale)
    total = sum(max(v, 0.0) for v in random_effects.values())
    shares = {"checkpoint": "checkpoints", "checkpoint_x_dataset": "checkpoint_x_dataset", "seed": "seeds",
              "residual": "residual"}
    decomposition = {shares[k]: max(v, 0.0) / total for k, v in random_effects.items()}
    var_fixed = float(np.var(np.asarray(fit.model.exog, dtype=float) @ estimate))
    grand = var_fixed + total
    r_squared = {"marginal": var_fixed / grand, "conditional": (grand - random_effects["residual"]) / grand}
    return MultilevelResult(
        coefficients=coefficients, random_effects=random_effects, variance_decomposition=decomposition,
        n_runs=int(len(design.data)), n_groups=n_checkpoints, formula=formula, notes=list(notes),
        converged=bool(fit.converged), response=response, re_formula="1", vc_formula=vc_formula,
        seed_effect="variance_component" if vc_formula and "seed" in vc_formula else "none",
        factors=dict(factors), level1_scaling={k: dict(v) for k, v in scaling.items()}, r_squared=r_squared,
        n_variants=int(frame["variant"].nunique()), n_datasets=int(frame["dataset"].nunique()),
        n_seeds=int(frame["seed"].nunique()), specification="checkpoints", n_checkpoints=n_checkpoints,
        _terms={design.terms[n].label: design.terms[n] for n in names if n in design.terms})
