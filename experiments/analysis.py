"""Multilevel (mixed-effects) analysis of pretraining ablations on BLURB.

One row of input is one fine-tuning run: a pretraining *variant* (a combination of factor levels,
e.g. ``vocabulary=in-domain, masking=whole-word``) fine-tuned on one dataset with one
hyperparameter setting and one seed. Runs are not independent: runs of the same variant on the
same dataset share that checkpoint's luck, and runs with the same seed share the seed's. A
multilevel model (as in "A Multilevel Analysis of PubMed-only BERT-based Biomedical Models")
separates those layers instead of averaging them away.

The levels
    * **Level 1, the run**: fine-tuning variables (learning rate, batch size, epochs). They enter
      as fixed effects, *standardized* (centered on their mean and divided by their standard
      deviation; the learning rate on the log10 scale first), so their coefficients are points
      per one standard deviation; ``level1_scaling`` gives the means and SDs to convert back.
    * **Level 2, the group** = one (variant, dataset) pair. Each group gets a random intercept
      (and, where identifiable, random slopes for the level-1 variables): what this checkpoint on
      this dataset does beyond what its factors and the dataset predict. The pretraining factors
      enter as fixed treatment dummies against the given reference levels; datasets as fixed
      effects (``C(dataset)``: datasets differ in difficulty and metric, which is not of interest).
    * **Seeds**: a variance component within groups (``vc_formula={"seed": "0 + C(seed)"}``): a
      shift shared by all runs with the same seed in the same group, i.e. how much the choice of
      fine-tuning seed moves a score. Optionally seeds as fixed effects, or not modelled.

The model, with y the score in points (×100)::

    y = b0 + Σ b_k·z_k (level 1) + Σ b_f·[factor f = level] + Σ b_d·[dataset = d]
        + u_group + Σ u_group,k·z_k (random slopes) + s_(group, seed) + e

fitted by REML with statsmodels ``MixedLM`` (``smf.mixedlm``). Treatment dummies (and the
optional factor × dataset interactions) are built explicitly, so term names do not depend on
the formula engine. With ``interactions=True`` the interaction columns are deviation-coded over
datasets, so a factor's main effect stays its *average* effect over datasets and per-dataset
effects are reported in ``dataset_effects``.

How to read the output
    * ``coefficients``: fixed effects in points with SE, Wald z, two-sided p and 95% CI (normal
      approximation; statsmodels has no Satterthwaite degrees of freedom like R's lmerTest, so
      with few groups the p-values are somewhat optimistic). A factor row ``vocabulary[in-domain]``
      is the average gain of ``in-domain`` over the reference level, all else equal.
    * ``random_effects``: variances in points² — ``group_intercept``, ``slope[...]`` (one per
      random slope), ``seed``, ``residual``.
    * ``variance_decomposition``: shares of the variance *left after the fixed effects*
      (between groups + seeds + residual = 1). "between_groups" is the random-effect variance of
      a group averaged over the observed runs (intercept, slopes and their covariances:
      mean over runs of z'Σz); "seeds" the seed component; "residual" the run-to-run noise.
      ``r_squared`` gives the share of the *total* variance explained by the fixed effects
      ("marginal") and by fixed plus random effects ("conditional"), as in Nakagawa & Schielzeth.
    * ``reading()``: one plain sentence per factor level, one on the level-1 variables, one on
      the variance decomposition. ``notes``: everything dropped, adjusted or warned about.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import scipy.linalg
import scipy.stats
import statsmodels.formula.api as smf

__all__ = ["MultilevelResult", "fit_multilevel", "format_p", "checkpoint_column"]

SEED_EFFECTS = ("variance_component", "fixed", "none")
_Z95 = float(scipy.stats.norm.ppf(0.975))


# ------------------------------------------------------------------------------------ helpers

def format_p(p: float) -> str:
    """``p < 0.001``, ``p = 0.012``, ``p = 0.43``; ``p = n/a`` for a missing value."""
    if p is None or not math.isfinite(p):
        return "p = n/a"
    if p < 0.001:
        return "p < 0.001"
    if p < 0.1:
        return f"p = {p:.3f}"
    return f"p = {p:.2f}"


def _fmt(x: float, signed: bool = True, digits: int = 2) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def _p_cell(p: float) -> str:
    """A p-value for a table cell: ``< 0.001``, ``0.012``, ``0.43``."""
    text = format_p(p)
    return text[len("p = "):] if text.startswith("p = ") else text[len("p "):]


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:.1f}%"


def _json_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, pd.DataFrame):
        return [_json_value(r) for r in value.to_dict(orient="records")]
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    return value


class _Names:
    """Unique, formula-safe column names."""

    def __init__(self, reserved: Iterable[str]):
        self.used = set(reserved)

    def make(self, *parts: str) -> str:
        base = "_".join(re.sub(r"\W+", "_", str(p)).strip("_") or "x" for p in parts)
        if not re.match(r"[A-Za-z]", base):
            base = "v_" + base
        name, i = base, 2
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name


@dataclass(frozen=True)
class _Term:
    kind: str            # intercept | level1 | factor | dataset | seed | interaction
    label: str           # readable name used in the coefficient table
    variable: str = ""   # factor / level-1 variable
    level: str = ""      # factor level
    dataset: str = ""    # interaction: dataset


# ------------------------------------------------------------------------------------- result

@dataclass(eq=False)
class MultilevelResult:
    """A fitted multilevel model; all effects and standard errors in points (score × 100)."""

    coefficients: pd.DataFrame
    random_effects: dict[str, float]
    variance_decomposition: dict[str, float]
    n_runs: int
    n_groups: int
    formula: str
    notes: list[str]
    converged: bool
    response: str = "test_score"
    re_formula: str = "1"
    vc_formula: dict[str, str] | None = None
    seed_effect: str = "variance_component"
    random_slopes: tuple[str, ...] = ()
    factors: dict[str, str] = field(default_factory=dict)
    level1_scaling: dict[str, dict[str, Any]] = field(default_factory=dict)
    r_squared: dict[str, float] = field(default_factory=dict)
    random_covariances: dict[str, float] = field(default_factory=dict)
    dataset_effects: pd.DataFrame | None = None
    n_variants: int = 0
    n_datasets: int = 0
    n_seeds: int = 0
    specification: str = "model-dataset-groups"  # or "checkpoints" (experiments.checkpoint_analysis)
    n_checkpoints: int = 0
    factor_tests: bool = True  # False: factor effects are confounded with checkpoint luck, not tested
    caveat: str = ""           # why factor_tests is False, in plain words
    _terms: dict[str, _Term] = field(default_factory=dict, repr=False)

    # ---------------------------------------------------------------- tables
    def factor_effects(self) -> pd.DataFrame:
        """The factor rows of ``coefficients`` with ``factor``, ``level`` and ``reference`` columns."""
        rows = []
        for _, row in self.coefficients.iterrows():
            term = self._terms.get(row["term"])
            if term is not None and term.kind == "factor":
                rows.append({"factor": term.variable, "level": term.level,
                             "reference": self.factors.get(term.variable, ""), **row.to_dict()})
        return pd.DataFrame(rows, columns=["factor", "level", "reference", *self.coefficients.columns])

    # ---------------------------------------------------------------- reading
    def reading(self) -> list[str]:
        """Plain sentences: one per factor level effect, one on the level-1 variables, one on the
        variance decomposition (plus a caveat when the fit did not converge)."""
        out: list[str] = []
        by_term = {row["term"]: row for _, row in self.coefficients.iterrows()}
        for label, term in self._terms.items():
            if term.kind != "factor" or label not in by_term:
                continue
            row = by_term[label]
            ref = self.factors.get(term.variable, "?")
            avg = " on average over datasets" if self.dataset_effects is not None else ""
            if not self.factor_tests:
                out.append(f"{term.variable} = {term.level} (vs {ref}): {_fmt(row['estimate'])} points{avg} "
                           f"(no p-value: this difference is confounded with the luck of the pretraining runs)")
                continue
            out.append(f"{term.variable} = {term.level} (vs {ref}): {_fmt(row['estimate'])} points{avg} "
                       f"(SE {_fmt(row['se'], signed=False)}, {format_p(row['p'])})")
            if self.dataset_effects is not None and len(self.dataset_effects):
                sub = self.dataset_effects[(self.dataset_effects["factor"] == term.variable)
                                           & (self.dataset_effects["level"] == term.level)]
                parts = [f"{r.dataset} {_fmt(r.estimate)} (SE {_fmt(r.se, signed=False)}, {format_p(r.p)})"
                         for r in sub.itertuples()]
                if parts:
                    out.append(f"{term.variable} = {term.level} (vs {ref}) by dataset: " + "; ".join(parts))
        level1 = []
        for label, term in self._terms.items():
            if term.kind != "level1" or label not in by_term:
                continue
            row = by_term[label]
            scale = self.level1_scaling.get(term.variable, {})
            sd = scale.get("sd", float("nan"))
            if scale.get("transform") == "log10":
                unit = (f"1 SD = {sd:.2f} log10 units, i.e. {_fmt(row['estimate'] / sd)} points per "
                        f"10× {term.variable}")
            else:
                unit = f"1 SD = {sd:.3g}, i.e. {_fmt(row['estimate'] / sd, digits=3)} points per unit"
            level1.append(f"{label} {_fmt(row['estimate'])} points per SD (SE {_fmt(row['se'], signed=False)}, "
                          f"{format_p(row['p'])}; {unit})")
        if level1:
            out.append("Fine-tuning (level-1) variables, standardized: " + "; ".join(level1))
        vd = self.variance_decomposition
        if vd and self.specification == "checkpoints":
            out.append(self._checkpoint_variance_reading())
        elif vd:
            seeds = ("seeds explain " + _pct(vd.get("seeds", float("nan")))
                     if self.seed_effect == "variance_component" and "seed" in self.random_effects
                     else "seeds are not a variance component here (" +
                     ("fixed effects" if self.seed_effect == "fixed" else "their variation is in the residual")
                     + ")")
            sds = ", ".join(f"{k} SD {math.sqrt(max(v, 0.0)):.2f}" for k, v in self.random_effects.items()
                            if k in ("group_intercept", "seed", "residual"))
            out.append(f"Of the variance left after the fixed effects, {seeds}, differences between "
                       f"(variant, dataset) groups {_pct(vd.get('between_groups', float('nan')))} and "
                       f"run-to-run residual noise {_pct(vd.get('residual', float('nan')))} "
                       f"({sds} points); the fixed effects explain "
                       f"{_pct(self.r_squared.get('marginal', float('nan')))} of the total variance")
        if not self.converged:
            out.append("Caveat: the optimizer did not report convergence; treat the estimates as tentative")
        if self.caveat:
            out.insert(0, f"Caveat: {self.caveat}")
        return out

    def _checkpoint_variance_reading(self) -> str:
        vd, re_ = self.variance_decomposition, self.random_effects
        parts = [f"pretraining runs (one random intercept per checkpoint, shared by every dataset) "
                 f"{_pct(vd.get('checkpoints', float('nan')))}"]
        if "checkpoint_x_dataset" in vd:
            parts.append(f"checkpoint × dataset {_pct(vd['checkpoint_x_dataset'])}")
        if "seeds" in vd:
            parts.append(f"fine-tuning seeds {_pct(vd['seeds'])}")
        parts.append(f"run-to-run residual noise {_pct(vd.get('residual', float('nan')))}")
        sds = ", ".join(f"{k} SD {math.sqrt(max(v, 0.0)):.2f}" for k, v in re_.items())
        return (f"Of the variance left after the fixed effects, " + ", ".join(parts) + f" ({sds} points); the "
                f"fixed effects explain {_pct(self.r_squared.get('marginal', float('nan')))} of the total variance")

    # ---------------------------------------------------------------- export
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN → None)."""
        return _json_value({
            "response": self.response, "units": "points (score × 100)",
            "formula": self.formula, "re_formula": self.re_formula, "vc_formula": self.vc_formula,
            "seed_effect": self.seed_effect, "random_slopes": list(self.random_slopes),
            "factors": dict(self.factors), "n_runs": self.n_runs, "n_groups": self.n_groups,
            "n_variants": self.n_variants, "n_datasets": self.n_datasets, "n_seeds": self.n_seeds,
            "converged": self.converged, "coefficients": self.coefficients,
            "random_effects": dict(self.random_effects), "random_covariances": dict(self.random_covariances),
            "variance_decomposition": dict(self.variance_decomposition), "r_squared": dict(self.r_squared),
            "level1_scaling": self.level1_scaling,
            "dataset_effects": self.dataset_effects if self.dataset_effects is not None else None,
            "specification": self.specification, "n_checkpoints": self.n_checkpoints,
            "factor_tests": self.factor_tests, "caveat": self.caveat,
            "reading": self.reading(), "notes": list(self.notes),
        })

    def _units_line(self) -> str:
        if self.specification == "checkpoints":
            return (f"random intercept per pretraining run (checkpoint), shared by every dataset; {self.n_runs} runs "
                    f"of {self.n_checkpoints} checkpoints ({self.n_variants} variants) × {self.n_datasets} "
                    f"datasets, {self.n_seeds} fine-tuning seeds")
        return (f"groups = (pretrained model, dataset) pairs (paper 000); {self.n_runs} runs in {self.n_groups} "
                f"groups ({self.n_variants} variants × {self.n_datasets} datasets), {self.n_seeds} seeds")

    def to_markdown(self) -> str:
        """Markdown: model, fixed effects table, random effects, variance decomposition, reading, notes."""
        lines = [f"## Multilevel analysis of `{self.response}` (points = score × 100)", ""]
        if self.caveat:
            lines += [f"**Caveat: {self.caveat}**", ""]
        lines += [f"- Specification: `{self.specification}`; model: statsmodels MixedLM, REML; {self._units_line()}; "
                  f"converged: {'yes' if self.converged else 'no'}",
                  f"- Fixed effects: `{self.formula}`",
                  f"- Random effects per group: `~{self.re_formula}`"
                  + (f"; variance components: `{self.vc_formula}`" if self.vc_formula else ""),
                  "- Level-1 variables are standardized (centered, divided by their SD; learning rate on "
                  "log10 scale): their coefficients are points per SD.",
                  "- Tests: Wald z where df is '—'; t with between-within degrees of freedom otherwise.", "",
                  "### Fixed effects (points)", "",
                  "| term | estimate | SE | z or t | df | p | 95% CI |", "|---|---:|---:|---:|---:|---:|---|"]
        for r in self.coefficients.itertuples():
            untested = not self.factor_tests and self._terms.get(r.term, _Term("", "")).kind == "factor"
            p_cell = "— (confounded)" if untested else _p_cell(r.p)
            ci = "—" if untested else f"[{_fmt(r.ci_low)}, {_fmt(r.ci_high)}]"
            df = "—" if not math.isfinite(r.df) else f"{r.df:.0f}"
            lines.append(f"| {r.term} | {_fmt(r.estimate)} | {_fmt(r.se, signed=False)} | "
                         f"{_fmt(r.z, signed=False)} | {df} | {p_cell} | {ci} |")
        if self.dataset_effects is not None and len(self.dataset_effects):
            lines += ["", "### Factor effects per dataset (points)", "",
                      "| factor | level | dataset | estimate | SE | p |", "|---|---|---|---:|---:|---:|"]
            for r in self.dataset_effects.itertuples():
                lines.append(f"| {r.factor} | {r.level} | {r.dataset} | {_fmt(r.estimate)} | "
                             f"{_fmt(r.se, signed=False)} | {_p_cell(r.p)} |")
        lines += ["", "### Random effects (variances, points²)", "", "| component | variance | SD |",
                  "|---|---:|---:|"]
        for k, v in self.random_effects.items():
            lines.append(f"| {k} | {_fmt(v, signed=False, digits=3)} | "
                         f"{_fmt(math.sqrt(max(v, 0.0)), signed=False, digits=3)} |")
        lines += ["", "### Variance decomposition (shares of the variance left after the fixed effects)", "",
                  "| source | share |", "|---|---:|"]
        for k, v in self.variance_decomposition.items():
            lines.append(f"| {k} | {_pct(v)} |")
        if self.r_squared:
            lines += ["", f"R² (share of total variance): fixed effects {_pct(self.r_squared['marginal'])}, "
                          f"fixed + random {_pct(self.r_squared['conditional'])}."]
        lines += ["", "### Reading", ""] + [f"- {s}." for s in self.reading()]
        if self.notes:
            lines += ["", "### Notes", ""] + [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------- fit

def _as_frame(rows: Any) -> pd.DataFrame:
    if isinstance(rows, pd.DataFrame):
        frame = rows.copy()
    else:
        rows = list(rows)
        if rows and not all(isinstance(r, Mapping) for r in rows):
            raise ValueError("rows must be a pandas DataFrame or a list of dicts (one per fine-tuning run)")
        frame = pd.DataFrame(rows)
    if frame.empty:
        raise ValueError("no runs to analyse (the input has no rows)")
    return frame.reset_index(drop=True)


_OPTIMIZERS = ("lbfgs", "powell", "bfgs", "cg")


def _fit_mixedlm(formula: str, data: pd.DataFrame, re_formula: str, vc_formula: dict | None):
    """REML fits with one optimizer after the other until one converges cleanly (an optimizer can
    also raise, e.g. a singular matrix after a wild line search). Returns (result or None, warning
    messages of the returned fit plus the optimizers that failed, error message or None)."""
    result, messages, error, failed = None, [], None, []
    for method in _OPTIMIZERS:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                model = smf.mixedlm(formula, data, groups=data["grp"], re_formula=re_formula,
                                    vc_formula=vc_formula)
                attempt, attempt_error = model.fit(reml=True, method=[method]), None
            except (ValueError, np.linalg.LinAlgError, FloatingPointError, ZeroDivisionError, IndexError,
                    KeyError) as err:
                attempt, attempt_error = None, f"{type(err).__name__}: {err}"
        attempt_messages = []
        for w in caught:
            msg = str(w.message).strip().replace("\n", " ")
            if msg and msg not in attempt_messages:
                attempt_messages.append(msg)
        if attempt is not None and (result is None or _usable(attempt)):
            result, messages, error = attempt, attempt_messages, None
        elif result is None:
            error = attempt_error
        if _usable(attempt):
            if failed:
                messages = [f"optimizer {method} converged after {', '.join(failed)} failed"] + messages
            break
        failed.append(f"{method} ({attempt_error or 'not converged'})")
    return result, messages, error


def _usable(result) -> bool:
    if result is None or not bool(getattr(result, "converged", False)):
        return False
    bse = np.asarray(result.bse_fe, dtype=float)
    return bool(np.all(np.isfinite(bse)) and np.all(bse > 0)
                and np.all(np.isfinite(np.asarray(result.fe_params, dtype=float))))


def checkpoint_column(frame: pd.DataFrame) -> pd.Series:
    """Each run's pretraining run (checkpoint): ``variant / checkpoint`` where the runs name their
    checkpoint, else the variant (one pretraining run per variant, as in paper 000)."""
    if "checkpoint" in frame.columns and frame["checkpoint"].notna().all():
        return frame["variant"].astype(str) + " / " + frame["checkpoint"].astype(str)
    return frame["variant"].astype(str)


def _prepare(rows: Any, factors: Mapping[str, str], response: str, level1: Sequence[str],
             extra_columns: Sequence[str] = ()) -> tuple[pd.DataFrame, pd.Series, dict[str, str], list[str]]:
    """The runs as a frame with every needed column present and complete, the response in points,
    the factors that vary (name -> reference level) and the notes on what was dropped."""
    if not isinstance(factors, Mapping):
        raise ValueError("factors must map each factor column to its reference level")
    frame = _as_frame(rows)
    notes: list[str] = []
    level1 = [str(v) for v in level1]
    factors = {str(k): str(v) for k, v in factors.items()}
    needed = ["variant", "dataset", response, *level1, *extra_columns]
    for col in needed:
        if col not in frame.columns:
            raise ValueError(f"column {col!r} is not in the data (columns: {sorted(map(str, frame.columns))})")
    reserved = {"variant", "dataset", "seed", "checkpoint", response, *level1}
    for name in factors:
        if name in reserved:
            raise ValueError(f"factor {name!r} is a reserved column (variant, checkpoint, dataset, seed, the "
                             f"response or a level-1 variable), not a pretraining factor")
        if name not in frame.columns:
            raise ValueError(f"factor column {name!r} is not in the data (columns: {sorted(map(str, frame.columns))})")

    frame[response] = pd.to_numeric(frame[response], errors="coerce")
    for col in level1:
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    used = list(dict.fromkeys(needed + list(factors)))
    keep = frame[used].notna().all(axis=1)
    if not keep.all():
        bad = [c for c in used if frame[c].isna().any()]
        notes.append(f"{int((~keep).sum())} of {len(frame)} runs dropped for missing values (in {', '.join(bad)})")
        frame = frame[keep].reset_index(drop=True)
    if frame.empty:
        raise ValueError("no runs left to analyse after dropping runs with missing values")
    y = frame[response].astype(float) * 100.0
    if float(y.max() - y.min()) == 0.0:
        raise ValueError(f"every run has the same {response} ({float(y.iloc[0]):.2f} points): there is no variance "
                         "to analyse (did fine-tuning learn anything?)")
    if float(y.abs().max()) > 150.0:
        notes.append(f"{response} has values outside [-1.5, 1.5]; scores are expected as fractions "
                     f"(they were multiplied by 100 to get points)")
    for col in ("variant", "dataset", *factors):
        frame[col] = frame[col].astype(str)
    return frame, y, _varying_factors(frame, factors, notes), notes


def _varying_factors(frame: pd.DataFrame, factors: Mapping[str, str], notes: list[str]) -> dict[str, str]:
    """The factors with more than one level (a constant one is dropped with a note)."""
    kept: dict[str, str] = {}
    for name, ref in factors.items():
        levels = sorted(frame[name].unique())
        if ref not in levels:
            raise ValueError(f"reference level {ref!r} of factor {name!r} is not in the data "
                             f"(levels present: {levels})")
        if len(levels) == 1:
            notes.append(f"factor {name!r} takes the single value {ref!r} in these runs: dropped (its effect is "
                         f"not identifiable)")
            continue
        if (frame.groupby("variant")[name].nunique() > 1).any():
            notes.append(f"factor {name!r} is not constant within variants (not a pure level-2 variable)")
        kept[name] = ref
    return kept


@dataclass
class _Design:
    """The fixed-effect columns of the model, added to ``data`` block by block, with their terms."""

    data: pd.DataFrame
    names: _Names
    terms: dict[str, _Term] = field(default_factory=lambda: {"Intercept": _Term("intercept", "Intercept")})
    columns: list[str] = field(default_factory=list)

    def _add(self, col: str, values: Any, term: _Term) -> None:
        self.data[col] = np.asarray(values, dtype=float)
        self.terms[col] = term
        self.columns.append(col)

    def add_level1(self, frame: pd.DataFrame, level1: Sequence[str], notes: list[str]
                   ) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        """Standardized fine-tuning variables (learning rate on log10 scale); constant ones, and ones
        constant within every dataset (confounded with the dataset effects), are dropped."""
        scaling: dict[str, dict[str, Any]] = {}
        level1_cols: dict[str, str] = {}
        for var in level1:
            x = frame[var].astype(float)
            transform = "identity"
            if "learning_rate" in var or var in ("lr",):
                if (x <= 0).any():
                    raise ValueError(f"level-1 variable {var!r} must be positive (it is used on log10 scale)")
                x, transform = np.log10(x), "log10"
            if x.nunique() < 2:
                value = frame[var].iloc[0]
                value = value.item() if isinstance(value, np.generic) else value  # 32, not np.int64(32)
                notes.append(f"level-1 variable {var!r} is constant ({value!r}) in these runs: dropped")
                continue
            if (pd.Series(x.to_numpy()).groupby(frame["dataset"].to_numpy()).nunique() <= 1).all():
                notes.append(f"level-1 variable {var!r} is constant within each dataset, so it is confounded with "
                             f"the dataset effects: dropped")
                continue
            mean, sd = float(x.mean()), float(x.std(ddof=0))
            col = self.names.make("z", "log10", var) if transform == "log10" else self.names.make("z", var)
            label = f"log10({var}) [z]" if transform == "log10" else f"{var} [z]"
            self._add(col, (x - mean) / sd, _Term("level1", label, variable=var))
            scaling[var] = {"transform": transform, "mean": mean, "sd": sd, "column": col}
            level1_cols[var] = col
        if scaling:
            notes.append("level-1 variables standardized (centered, divided by their SD"
                         + ("; learning rate on log10 scale" if any(s["transform"] == "log10"
                                                                     for s in scaling.values()) else "")
                         + "): coefficients are points per SD")
        return scaling, level1_cols

    def add_factors(self, frame: pd.DataFrame, factors: Mapping[str, str]) -> dict[str, list[tuple[str, str]]]:
        """Treatment dummies of each factor against its reference level."""
        factor_cols: dict[str, list[tuple[str, str]]] = {}
        for name, ref in factors.items():
            factor_cols[name] = []
            for level in sorted(frame[name].unique()):
                if level != ref:
                    col = self.names.make(name, level)
                    self._add(col, frame[name] == level, _Term("factor", f"{name}[{level}]", variable=name,
                                                               level=level))
                    factor_cols[name].append((col, level))
        return factor_cols

    def add_datasets(self, frame: pd.DataFrame, datasets: Sequence[str], notes: list[str]) -> None:
        """Treatment dummies of the datasets, the first sorted one as reference."""
        for d in datasets[1:]:
            self._add(self.names.make("dataset", d), frame["dataset"] == d,
                      _Term("dataset", f"dataset[{d}]", level=d))
        if len(datasets) > 1:
            notes.append(f"dataset effects are relative to {datasets[0]!r}")

    def check_identifiable(self) -> np.ndarray:
        """The fixed-effect matrix (intercept first); ValueError naming the aliased terms if it is
        rank-deficient."""
        n = len(self.data)
        exog = np.column_stack([np.ones(n)] + [self.data[c].to_numpy() for c in self.columns])
        _, r_fac, piv = scipy.linalg.qr(exog, mode="economic", pivoting=True)
        diag = np.abs(np.diag(r_fac))
        rank = int((diag > diag[0] * 1e-9).sum()) if diag.size else 0
        if rank < exog.shape[1]:
            all_names = ["Intercept"] + self.columns
            aliased = [self.terms[all_names[j]].label for j in sorted(piv[rank:])]
            raise ValueError("fixed effects not identifiable: " + ", ".join(aliased) + " is/are a linear "
                             "combination of other terms (confounded factors, or a factor level only with some "
                             "datasets); drop one of the confounded factors")
        return exog


def fit_multilevel(rows: pd.DataFrame | Sequence[Mapping[str, Any]], factors: Mapping[str, str], *,
                   response: str = "test_score",
                   level1: Sequence[str] = ("learning_rate", "batch_size", "epochs"),
                   seed_effect: str = "variance_component",
                   random_slopes: Sequence[str] | None = None,
                   interactions: bool = False) -> MultilevelResult:
    """Fit the two-level model of ``response`` (in points) on runs grouped by (variant, dataset).

    ``factors`` maps each factor column to its reference level. ``level1``: fine-tuning variables
    (standardized; ``learning_rate`` on log10 scale). ``seed_effect``: ``"variance_component"``
    (seed shift within each group, needs ≥ 2 seeds), ``"fixed"`` (seed dummies) or ``"none"``.
    ``random_slopes``: level-1 variables with a random slope per group; ``None`` = those that vary
    within groups, falling back to intercept-only if that fit fails or does not converge.
    ``interactions``: add factor × dataset interactions (deviation-coded over datasets).

    Raises ValueError for a missing column, a reference level absent from the data, confounded
    (non-identifiable) terms or too little data for the model."""
    if seed_effect not in SEED_EFFECTS:
        raise ValueError(f"seed_effect must be one of {SEED_EFFECTS}, got {seed_effect!r}")
    if not isinstance(factors, Mapping):
        raise ValueError("factors must map each factor column to its reference level")
    frame, y, kept_factors, notes = _prepare(rows, factors, response, level1,
                                             extra_columns=["seed"] if seed_effect != "none" else [])
    level1 = [str(v) for v in level1]
    datasets = sorted(frame["dataset"].unique())
    names = _Names({"points", "grp", "seed", "dataset", "variant", "Intercept"})
    data = pd.DataFrame({"points": y.to_numpy(), "dataset": frame["dataset"].to_numpy()})
    data["grp"] = checkpoint_column(frame) + " | " + frame["dataset"]
    design = _Design(data, names)
    scaling, level1_cols = design.add_level1(frame, level1, notes)
    factor_cols = design.add_factors(frame, kept_factors)
    design.add_datasets(frame, datasets, notes)
    terms, columns = design.terms, design.columns

    # ---- seeds
    seeds = sorted(frame["seed"].unique()) if seed_effect != "none" else []
    n_seeds = int(frame["seed"].nunique()) if "seed" in frame.columns else 0
    vc_formula = None
    if seed_effect != "none":
        data["seed"] = frame["seed"].astype(str).to_numpy()
        if len(seeds) < 2:
            notes.append("only one seed in these runs: no seed effect estimated")
        elif seed_effect == "variance_component":
            vc_formula = {"seed": "0 + C(seed)"}
        else:
            for s in seeds[1:]:
                col = names.make("seed", s)
                data[col] = (frame["seed"] == s).astype(float).to_numpy()
                terms[col] = _Term("seed", f"seed[{s}]", level=str(s))
                columns.append(col)
            notes.append(f"seeds as fixed effects (reference seed {str(seeds[0])!r}); their variance is not in the "
                         f"variance decomposition")
    else:
        notes.append("seeds not modelled: seed-to-seed variation is part of the residual")

    # ---- factor × dataset interactions (deviation coding over datasets)
    interaction_cols: dict[tuple[str, str], list[tuple[str, str]]] = {}
    if interactions:
        if len(datasets) < 2:
            notes.append("interactions requested but there is a single dataset: none added")
        else:
            last = datasets[-1]
            for name, cols in factor_cols.items():
                for col, level in cols:
                    interaction_cols[(name, level)] = []
                    for d in datasets[:-1]:
                        icol = names.make(name, level, "x", d)
                        dev = (frame["dataset"] == d).astype(float) - (frame["dataset"] == last).astype(float)
                        data[icol] = data[col] * dev.to_numpy()
                        terms[icol] = _Term("interaction", f"{name}[{level}]:dataset[{d}]", variable=name,
                                            level=level, dataset=d)
                        interaction_cols[(name, level)].append((icol, d))
                        columns.append(icol)
            notes.append("factor × dataset interactions are deviation-coded over datasets: a factor's main effect "
                         "is its average effect over datasets; per-dataset effects are in dataset_effects")

    # ---- identifiability and size checks
    n_runs = len(data)
    n_groups = int(data["grp"].nunique())
    if n_groups < 3:
        raise ValueError(f"too few groups for a multilevel model: {n_groups} (variant, dataset) group(s); "
                         f"need at least 3")
    if n_runs <= n_groups:
        raise ValueError(f"too few runs: {n_runs} runs in {n_groups} groups; the model needs several runs per "
                         f"(variant, dataset) group (hyperparameters or seeds)")
    n_var_params = 2 + (1 if vc_formula else 0)
    if len(columns) + 1 + n_var_params >= n_runs:
        raise ValueError(f"too few runs: {n_runs} runs for {len(columns) + 1} fixed effects and {n_var_params} "
                         f"variance parameters")
    design.check_identifiable()

    # ---- what the random part can separate
    grouping = "group"
    if vc_formula and not (data.groupby(["grp", "seed"]).size() > 1).any():
        vc_formula = None
        notes.append("each (variant, dataset, seed) has a single run: a seed's shift cannot be told from run "
                     "noise, so it is part of the residual")
    group_cols = [c for c in columns if bool((data.groupby("grp")[c].nunique() <= 1).all())]
    group_design = data.groupby("grp")[group_cols].first().to_numpy(dtype=float) if group_cols \
        else np.zeros((n_groups, 0))
    group_rank = int(np.linalg.matrix_rank(np.column_stack([np.ones(n_groups), group_design])))
    if group_rank >= n_groups:  # every group is its own cell of the fixed effects: no between-group variance left
        if seed_effect == "none" or n_seeds < 3:
            raise ValueError(f"each of the {n_groups} (variant, dataset) groups is its own combination of factor "
                             "levels and datasets, so between-group variance cannot be told from the factor "
                             "effects; add variants or datasets, or run at least 3 seeds")
        grouping, vc_formula = "seed", None
        data["variant_dataset"] = data["grp"]
        data["grp"] = data["seed"]
        level1_cols_for_slopes: dict[str, str] = {}
        notes.append(f"each (variant, dataset) group is its own combination of factor levels, so a group's own "
                     f"variance cannot be told from the factor effects: the random intercept is per seed "
                     f"instead ({n_seeds} seeds, each shared by every variant and dataset)")
    else:
        level1_cols_for_slopes = dict(level1_cols)

    # ---- random slopes
    within = {var: float((data.groupby("grp")[col].nunique() > 1).mean())
              for var, col in level1_cols_for_slopes.items()}
    if random_slopes is None:
        auto = True
        slopes = [v for v in level1_cols_for_slopes if within[v] >= 0.5]
    else:
        auto = False
        slopes = []
        for v in random_slopes:
            v = str(v)
            if v not in level1:
                raise ValueError(f"random slope {v!r} is not a level-1 variable {list(level1)}")
            if v not in level1_cols_for_slopes:
                notes.append(f"random slope for {v!r} dropped: the variable was dropped from the model, or the "
                             "groups are seeds")
            elif within[v] < 0.5:
                notes.append(f"random slope for {v!r} dropped: it varies within only {100 * within[v]:.0f}% "
                             f"of the groups")
            else:
                slopes.append(v)

    formula = "points ~ " + " + ".join(["1"] + columns)
    fit, used_slopes, re_formula = None, [], "1"
    if slopes:
        re_try = "1 + " + " + ".join(level1_cols[v] for v in slopes)
        result, messages, error = _fit_mixedlm(formula, data, re_try, vc_formula)
        if _usable(result):
            fit, used_slopes, re_formula = result, slopes, re_try
            notes += [f"statsmodels (random slopes): {m}" for m in messages]
        else:
            why = error or ("did not converge" if result is not None and not result.converged
                            else "gave non-finite standard errors")
            notes.append(f"the fit with random slopes for {', '.join(slopes)} failed ({why}"
                         + (f"; {'; '.join(messages[:3])}" if messages else "")
                         + "): fell back to random intercepts only"
                         + (" (slopes chosen automatically)" if auto else ""))
    if fit is None:
        result, messages, error = _fit_mixedlm(formula, data, "1", vc_formula)
        if result is None:
            raise ValueError(f"the multilevel model could not be fitted ({error}) with {n_runs} runs in "
                             f"{n_groups} groups")
        fit = result
        notes += [f"statsmodels: {m}" for m in messages]
        if not _usable(fit):
            notes.append("the intercept-only fit did not converge cleanly: estimates are tentative")

    result = _collect(fit, data=data, terms=terms, columns=columns, formula=formula, re_formula=re_formula,
                    vc_formula=vc_formula, slopes=used_slopes, level1_cols=level1_cols, scaling=scaling,
                    factors=kept_factors, interaction_cols=interaction_cols, notes=notes, response=response,
                    seed_effect=seed_effect, n_variants=int(frame["variant"].nunique()),
                    n_datasets=len(datasets), n_seeds=n_seeds, grouping=grouping)
    result.n_checkpoints = int(checkpoint_column(frame).nunique())
    return result


def _collect(fit, *, data, terms, columns, formula, re_formula, vc_formula, slopes, level1_cols, scaling,
             factors, interaction_cols, notes, response, seed_effect, n_variants, n_datasets,
             n_seeds, grouping="group") -> MultilevelResult:
    fe = pd.Series(np.asarray(fit.fe_params, dtype=float), index=list(fit.model.exog_names))
    k_fe = len(fe)
    cov_fe = np.asarray(fit.cov_params(), dtype=float)[:k_fe, :k_fe]
    se = np.sqrt(np.clip(np.diag(cov_fe), 0.0, None))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = fe.to_numpy() / se
    p = 2.0 * scipy.stats.norm.sf(np.abs(z))
    labels = [terms[n].label if n in terms else n for n in fe.index]
    coefficients = pd.DataFrame({"term": labels, "estimate": fe.to_numpy(), "se": se, "z": z,
                                 "df": np.full(k_fe, np.nan), "p": p,
                                 "ci_low": fe.to_numpy() - _Z95 * se, "ci_high": fe.to_numpy() + _Z95 * se})
    label_terms = {terms[n].label: terms[n] for n in fe.index if n in terms}

    # random effects (points²)
    cov_re = np.atleast_2d(np.asarray(fit.cov_re, dtype=float))
    re_names = ["seed" if grouping == "seed" else "group_intercept"] + [
        f"slope[{terms[level1_cols[v]].label}]" for v in slopes]
    random_effects: dict[str, float] = {re_names[i]: float(cov_re[i, i]) for i in range(len(re_names))}
    random_cov: dict[str, float] = {}
    for i in range(len(re_names)):
        for j in range(i + 1, len(re_names)):
            random_cov[f"{re_names[i]} ~ {re_names[j]}"] = float(cov_re[i, j])
    seed_var = 0.0
    if grouping == "seed":  # the random intercept is the seed's; nothing is between groups
        seed_var = random_effects["seed"]
        cov_re = np.zeros_like(cov_re)
    if vc_formula:
        seed_var = float(np.asarray(fit.vcomp, dtype=float)[0])
        random_effects["seed"] = seed_var
    residual = float(fit.scale)
    random_effects["residual"] = residual

    # variance decomposition: mean over runs of z'Σz (group), seed component, residual
    zmat = np.column_stack([np.ones(len(data))] + [data[level1_cols[v]].to_numpy() for v in slopes])
    between = float(np.mean(np.einsum("ij,jk,ik->i", zmat, cov_re, zmat)))
    between = max(between, 0.0)
    total = between + seed_var + residual
    decomposition = {"between_groups": between / total, "seeds": seed_var / total, "residual": residual / total}
    var_fixed = float(np.var(np.asarray(fit.model.exog, dtype=float) @ fe.to_numpy()))
    grand = var_fixed + total
    r_squared = {"marginal": var_fixed / grand, "conditional": (var_fixed + between + seed_var) / grand}

    # per-dataset factor effects (interactions)
    dataset_effects = None
    if interaction_cols:
        index = {n: i for i, n in enumerate(fe.index)}
        rows = []
        for (name, level), icols in interaction_cols.items():
            main = index[next(c for c, t in terms.items() if t.kind == "factor" and t.variable == name
                              and t.level == level)]
            ds = [d for _, d in icols]
            for d in sorted(data["dataset"].unique()):
                w = np.zeros(k_fe)
                w[main] = 1.0
                if d in ds:
                    w[index[icols[ds.index(d)][0]]] = 1.0
                else:
                    for c, _ in icols:
                        w[index[c]] = -1.0
                est = float(w @ fe.to_numpy())
                s = float(math.sqrt(max(w @ cov_fe @ w, 0.0)))
                zz = est / s if s > 0 else float("nan")
                rows.append({"factor": name, "level": level, "dataset": d, "estimate": est, "se": s, "z": zz,
                             "p": float(2 * scipy.stats.norm.sf(abs(zz))) if s > 0 else float("nan"),
                             "ci_low": est - _Z95 * s, "ci_high": est + _Z95 * s})
        dataset_effects = pd.DataFrame(rows)

    desc_slopes = ", ".join(slopes) if slopes else "none"
    notes = list(notes)
    if grouping == "seed":
        notes.append("random intercept per seed (shared by all variants and datasets); no random slopes")
    else:
        notes.append(f"random intercept per (variant, dataset) group; random slopes: {desc_slopes}"
                     + ("; seed variance component within groups" if vc_formula else ""))
    notes.append("p-values and 95% CIs use the normal approximation (Wald z), no small-sample correction")
    return MultilevelResult(
        coefficients=coefficients, random_effects=random_effects, variance_decomposition=decomposition,
        n_runs=int(len(data)), n_groups=int(data["variant_dataset" if grouping == "seed" else "grp"].nunique()), formula=formula, notes=notes,
        converged=bool(fit.converged), response=response, re_formula=re_formula, vc_formula=vc_formula,
        seed_effect=seed_effect, random_slopes=tuple(slopes), factors=dict(factors),
        level1_scaling={k: dict(v) for k, v in scaling.items()}, r_squared=r_squared,
        random_covariances=random_cov, dataset_effects=dataset_effects, n_variants=n_variants,
        n_datasets=n_datasets, n_seeds=n_seeds, _terms=label_terms)

