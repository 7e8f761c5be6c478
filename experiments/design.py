"""The fixed-effect design shared by the two ablation analyses (paper 000's
:func:`experiments.analysis.fit_multilevel` and :func:`experiments.checkpoint_analysis.fit_checkpoint_model`).

Both read the same run rows, keep the same columns, standardize the same fine-tuning variables,
code the pretraining factors and datasets as the same treatment dummies and fit statsmodels
``MixedLM`` by REML with the same optimizer fallbacks; they differ only in what their random part
groups. This module is that common part:

* :func:`prepare_runs`: the rows as a complete frame, the response in points, the factors that vary;
* :class:`Design`: the fixed-effect columns, added block by block (level-1 variables, factor and
  dataset dummies, anything a model adds), each with its readable :class:`Term`;
* :func:`fit_mixedlm` / :func:`usable_fit`: REML fits, one optimizer after another;
  :func:`fit_intercepts`, the random-intercept fit that must succeed, with its notes;
* :func:`checkpoint_column`: each run's pretraining run (checkpoint); :func:`between_within_df`, the tests' degrees
  of freedom.

Data a model cannot take raise :class:`AnalysisError`, naming why.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import scipy.linalg
import statsmodels.formula.api as smf

from biomed_lm.errors import ExperimentError

__all__ = ["AnalysisError", "Names", "Term", "Design", "prepare_runs", "fit_mixedlm", "fit_intercepts", "usable_fit",
           "fit_notes", "hessian_caveat", "HESSIAN_NOT_PD", "checkpoint_column", "between_within_df"]


class AnalysisError(ExperimentError, ValueError):
    """Runs the analysis cannot model (a missing column, too little data, confounded terms); the
    message says why."""


class Names:
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
class Term:
    """What a fixed-effect column means, for the coefficient table and the reading."""

    kind: str            # intercept | level1 | factor | dataset | seed | interaction
    label: str           # readable name used in the coefficient table
    variable: str = ""   # factor / level-1 variable
    level: str = ""      # factor level
    dataset: str = ""    # interaction: dataset


# --------------------------------------------------------------------------------- the runs

def _as_frame(rows: Any) -> pd.DataFrame:
    if isinstance(rows, pd.DataFrame):
        frame = rows.copy()
    else:
        rows = list(rows)
        if rows and not all(isinstance(r, Mapping) for r in rows):
            raise AnalysisError("rows must be a pandas DataFrame or a list of dicts (one per fine-tuning run)")
        frame = pd.DataFrame(rows)
    if frame.empty:
        raise AnalysisError("no runs to analyse (the input has no rows)")
    return frame.reset_index(drop=True)


def checkpoint_column(frame: pd.DataFrame) -> pd.Series:
    """Each run's pretraining run (checkpoint): ``variant / checkpoint`` where the runs name their
    checkpoint, else the variant (one pretraining run per variant, as in paper 000)."""
    if "checkpoint" in frame.columns and frame["checkpoint"].notna().all():
        return frame["variant"].astype(str) + " / " + frame["checkpoint"].astype(str)
    return frame["variant"].astype(str)


def _check_columns(frame: pd.DataFrame, factors: Mapping[str, str], needed: Sequence[str],
                   reserved: set[str]) -> None:
    for col in needed:
        if col not in frame.columns:
            raise AnalysisError(f"column {col!r} is not in the data (columns: {sorted(map(str, frame.columns))})")
    for name in factors:
        if name in reserved:
            raise AnalysisError(f"factor {name!r} is a reserved column (variant, checkpoint, dataset, seed, the "
                                f"response or a level-1 variable), not a pretraining factor")
        if name not in frame.columns:
            raise AnalysisError(f"factor column {name!r} is not in the data "
                                f"(columns: {sorted(map(str, frame.columns))})")


def _drop_incomplete(frame: pd.DataFrame, used: Sequence[str], notes: list[str]) -> pd.DataFrame:
    keep = frame[list(used)].notna().all(axis=1)
    if not keep.all():
        bad = [c for c in used if frame[c].isna().any()]
        notes.append(f"{int((~keep).sum())} of {len(frame)} runs dropped for missing values (in {', '.join(bad)})")
        frame = frame[keep].reset_index(drop=True)
    if frame.empty:
        raise AnalysisError("no runs left to analyse after dropping runs with missing values")
    return frame


def _response_points(frame: pd.DataFrame, response: str, notes: list[str]) -> pd.Series:
    y = frame[response].astype(float) * 100.0
    if float(y.max() - y.min()) == 0.0:
        raise AnalysisError(f"every run has the same {response} ({float(y.iloc[0]):.2f} points): there is no "
                            "variance to analyse (did fine-tuning learn anything?)")
    if float(y.abs().max()) > 150.0:
        notes.append(f"{response} has values outside [-1.5, 1.5]; scores are expected as fractions "
                     f"(they were multiplied by 100 to get points)")
    return y


def prepare_runs(rows: Any, factors: Mapping[str, str], response: str, level1: Sequence[str],
                 extra_columns: Sequence[str] = ()) -> tuple[pd.DataFrame, pd.Series, dict[str, str], list[str]]:
    """The runs as a frame with every needed column present and complete, the response in points,
    the factors that vary (name -> reference level) and the notes on what was dropped."""
    if not isinstance(factors, Mapping):
        raise AnalysisError("factors must map each factor column to its reference level")
    frame = _as_frame(rows)
    notes: list[str] = []
    level1 = [str(v) for v in level1]
    factors = {str(k): str(v) for k, v in factors.items()}
    needed = ["variant", "dataset", response, *level1, *extra_columns]
    _check_columns(frame, factors, needed, {"variant", "dataset", "seed", "checkpoint", response, *level1})
    frame[response] = pd.to_numeric(frame[response], errors="coerce")
    for col in level1:
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    frame = _drop_incomplete(frame, list(dict.fromkeys(needed + list(factors))), notes)
    y = _response_points(frame, response, notes)
    for col in ("variant", "dataset", *factors):
        frame[col] = frame[col].astype(str)
    return frame, y, _varying_factors(frame, factors, notes), notes


def _varying_factors(frame: pd.DataFrame, factors: Mapping[str, str], notes: list[str]) -> dict[str, str]:
    """The factors with more than one level (a constant one is dropped with a note)."""
    kept: dict[str, str] = {}
    for name, ref in factors.items():
        levels = sorted(frame[name].unique())
        if ref not in levels:
            raise AnalysisError(f"reference level {ref!r} of factor {name!r} is not in the data "
                                f"(levels present: {levels})")
        if len(levels) == 1:
            notes.append(f"factor {name!r} takes the single value {ref!r} in these runs: dropped (its effect is "
                         f"not identifiable)")
            continue
        if (frame.groupby("variant")[name].nunique() > 1).any():
            notes.append(f"factor {name!r} is not constant within variants (not a pure level-2 variable)")
        kept[name] = ref
    return kept


# ------------------------------------------------------------------------------- the design

@dataclass
class Design:
    """The fixed-effect columns of the model, added to ``data`` block by block, with their terms."""

    data: pd.DataFrame
    names: Names
    terms: dict[str, Term] = field(default_factory=lambda: {"Intercept": Term("intercept", "Intercept")})
    columns: list[str] = field(default_factory=list)

    def add(self, col: str, values: Any, term: Term) -> None:
        """Add one column (``values`` as floats) meaning ``term``."""
        self.data[col] = np.asarray(values, dtype=float)
        self.terms[col] = term
        self.columns.append(col)

    def add_level1(self, frame: pd.DataFrame, level1: Sequence[str], notes: list[str]
                   ) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        """Standardized fine-tuning variables (learning rate on log10 scale); constant ones, and ones
        constant within every dataset (confounded with the dataset effects), are dropped. Returns the
        scaling of each kept variable and its column."""
        scaling: dict[str, dict[str, Any]] = {}
        level1_cols: dict[str, str] = {}
        for var in level1:
            x, transform = _level1_values(frame, var)
            if _dropped_level1(frame, var, x, notes):
                continue
            mean, sd = float(x.mean()), float(x.std(ddof=0))
            col = self.names.make("z", "log10", var) if transform == "log10" else self.names.make("z", var)
            label = f"log10({var}) [z]" if transform == "log10" else f"{var} [z]"
            self.add(col, (x - mean) / sd, Term("level1", label, variable=var))
            scaling[var] = {"transform": transform, "mean": mean, "sd": sd, "column": col,
                            "span": float(x.max() - x.min())}
            level1_cols[var] = col
        if scaling:
            notes.append("level-1 variables standardized (centered, divided by their SD"
                         + ("; learning rate on log10 scale" if any(s["transform"] == "log10"
                                                                     for s in scaling.values()) else "")
                         + "): coefficients are points per SD")
        return scaling, level1_cols

    def add_factors(self, frame: pd.DataFrame, factors: Mapping[str, str]) -> dict[str, list[tuple[str, str]]]:
        """Treatment dummies of each factor against its reference level: factor -> [(column, level)]."""
        factor_cols: dict[str, list[tuple[str, str]]] = {}
        for name, ref in factors.items():
            factor_cols[name] = []
            for level in sorted(frame[name].unique()):
                if level != ref:
                    col = self.names.make(name, level)
                    self.add(col, frame[name] == level, Term("factor", f"{name}[{level}]", variable=name,
                                                             level=level))
                    factor_cols[name].append((col, level))
        return factor_cols

    def add_datasets(self, frame: pd.DataFrame, datasets: Sequence[str], notes: list[str]) -> None:
        """Treatment dummies of the datasets, the first sorted one as reference."""
        for d in datasets[1:]:
            self.add(self.names.make("dataset", d), frame["dataset"] == d,
                     Term("dataset", f"dataset[{d}]", level=d))
        if len(datasets) > 1:
            notes.append(f"dataset effects are relative to {datasets[0]!r}")

    def check_identifiable(self) -> np.ndarray:
        """The fixed-effect matrix (intercept first); :class:`AnalysisError` naming the aliased terms
        if it is rank-deficient."""
        n = len(self.data)
        exog = np.column_stack([np.ones(n)] + [self.data[c].to_numpy() for c in self.columns])
        _, r_fac, piv = scipy.linalg.qr(exog, mode="economic", pivoting=True)
        diag = np.abs(np.diag(r_fac))
        rank = int((diag > diag[0] * 1e-9).sum()) if diag.size else 0
        if rank < exog.shape[1]:
            all_names = ["Intercept"] + self.columns
            aliased = [self.terms[all_names[j]].label for j in sorted(piv[rank:])]
            raise AnalysisError("fixed effects not identifiable: " + ", ".join(aliased) + " is/are a linear "
                                "combination of other terms (confounded factors, or a factor level only with some "
                                "datasets); drop one of the confounded factors")
        return exog

    def formula(self) -> str:
        """The fixed-effect formula over every column added."""
        return "points ~ " + " + ".join(["1"] + self.columns)


def _level1_values(frame: pd.DataFrame, var: str) -> tuple[pd.Series, str]:
    """A level-1 variable's values and transform (``log10`` for a learning rate, else ``identity``)."""
    x = frame[var].astype(float)
    if "learning_rate" in var or var in ("lr",):
        if (x <= 0).any():
            raise AnalysisError(f"level-1 variable {var!r} must be positive (it is used on log10 scale)")
        return np.log10(x), "log10"
    return x, "identity"


def _dropped_level1(frame: pd.DataFrame, var: str, x: pd.Series, notes: list[str]) -> bool:
    """Whether a level-1 variable is left out (constant, or constant within every dataset), noted."""
    if x.nunique() < 2:
        value = frame[var].iloc[0]
        value = value.item() if isinstance(value, np.generic) else value  # 32, not np.int64(32)
        notes.append(f"level-1 variable {var!r} is constant ({value!r}) in these runs: dropped")
        return True
    if (pd.Series(x.to_numpy()).groupby(frame["dataset"].to_numpy()).nunique() <= 1).all():
        notes.append(f"level-1 variable {var!r} is constant within each dataset, so it is confounded with "
                     f"the dataset effects: dropped")
        return True
    return False


# ------------------------------------------------------------------------------ degrees of freedom

def between_within_df(data: pd.DataFrame, columns: Sequence[str], units: Sequence[str]) -> dict[str, float]:
    """Between-within degrees of freedom (Schluchter & Elashoff, 1990; SAS ``DDFM=BETWITHIN``) per
    fixed-effect column (and ``Intercept``). ``units`` are the nested units of ``data``, top first. A
    column belongs to the highest unit within which it is constant; that unit's df is its number of
    units less those of the unit above, less the rank the unit's columns add."""
    levels = list(units) + [None]  # None: the runs
    counts = [int(data[u].nunique()) for u in units] + [len(data)]
    level_of = {"Intercept": 0}
    for col in columns:
        level_of[col] = next(i for i, u in enumerate(levels)
                             if u is None or bool((data.groupby(u)[col].nunique() <= 1).all()))
    df: dict[str, float] = {}
    previous_rank, previous_count = 0, 0
    for i in range(len(levels)):
        cols = [c for c, lv in level_of.items() if lv <= i]
        matrix = np.column_stack([np.ones(len(data)) if c == "Intercept" else data[c].to_numpy() for c in cols])
        rank = int(np.linalg.matrix_rank(matrix))
        level_df = float(counts[i] - previous_count - (rank - previous_rank))
        for c, lv in level_of.items():
            if lv == i:
                df[c] = level_df
        previous_rank, previous_count = rank, counts[i]
    return df


# ---------------------------------------------------------------------------------- fitting

_OPTIMIZERS = ("lbfgs", "powell", "bfgs", "cg")


def _fit_once(formula: str, data: pd.DataFrame, re_formula: str, vc_formula: dict | None, method: str):
    """One REML fit with one optimizer: (result or None, its warning messages, error or None)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model = smf.mixedlm(formula, data, groups=data["grp"], re_formula=re_formula, vc_formula=vc_formula)
            attempt, attempt_error = model.fit(reml=True, method=[method]), None
        except (ValueError, np.linalg.LinAlgError, FloatingPointError, ZeroDivisionError, IndexError,
                KeyError) as err:
            attempt, attempt_error = None, f"{type(err).__name__}: {err}"
    messages: list[str] = []
    for w in caught:
        msg = str(w.message).strip().replace("\n", " ")
        if msg and msg not in messages:
            messages.append(msg)
    return attempt, messages, attempt_error


def _on_boundary(messages: Sequence[str]) -> bool:
    """Whether statsmodels warned that a fit's estimate is on the boundary (a variance at zero) or its
    Hessian is not positive definite: where optimizers can stop at different optima."""
    return any("boundary" in m or HESSIAN_NOT_PD in m for m in messages)


def fit_mixedlm(formula: str, data: pd.DataFrame, re_formula: str, vc_formula: dict | None):
    """REML fits (groups: ``data["grp"]``) with one optimizer after the other until one converges
    cleanly (an optimizer can also raise, e.g. a singular matrix after a wild line search). A usable fit
    on the boundary (statsmodels' warning) is compared with the other optimizers' and the highest REML
    log-likelihood kept: lbfgs can stop at a variance of zero where another optimizer finds a better
    optimum (audit, 2026-11-28: 2 of 300 simulated fits, one with a seed variance of 0.00 against the
    truth's 15.4). Returns (result or None, warning messages of the returned fit plus the optimizers that
    failed or were compared, error message or None)."""
    fallback, best, error, failed, compared = None, None, None, [], []
    for method in _OPTIMIZERS:
        attempt, attempt_messages, attempt_error = _fit_once(formula, data, re_formula, vc_formula, method)
        if usable_fit(attempt):
            compared.append(f"{method} {float(attempt.llf):.2f}")
            if best is None or attempt.llf > best[0].llf:
                best = (attempt, attempt_messages, method)
            if not _on_boundary(attempt_messages):
                break
            continue
        if attempt is not None and fallback is None:
            fallback = (attempt, attempt_messages)
        error = error or attempt_error
        failed.append(f"{method} ({attempt_error or 'not converged'})")
    if best is None:
        return (fallback[0], fallback[1], None) if fallback else (None, [], error)
    result, messages, method = best
    if len(compared) > 1:
        messages = [f"optimizer {method} kept: the highest REML log-likelihood of the boundary fits "
                    f"({', '.join(compared)})"] + messages
    if failed:
        messages = [f"optimizer {method} converged after {', '.join(failed)} failed"] + messages
    return result, messages, None


def fit_intercepts(formula: str, data: pd.DataFrame, vc_formula: dict | None, what: str, size: str,
                   unclean: str):
    """The random-intercept fit an analysis cannot do without: (result, notes). AnalysisError when no
    optimizer fits it ("{what} could not be fitted (why) {size}"); the ``unclean`` note when the
    fit did not converge cleanly."""
    result, messages, error = fit_mixedlm(formula, data, "1", vc_formula)
    if result is None:
        raise AnalysisError(f"{what} could not be fitted ({error}) {size}")
    notes = fit_notes(messages)
    if not usable_fit(result):
        notes.append(unclean)
    return result, notes


#: The prefix of a note that carries statsmodels' own warning for the fit in use; hessian_caveat reads them.
FIT_NOTE_PREFIX = "statsmodels"


def fit_notes(messages: Sequence[str], fit: str = "") -> list[str]:
    """statsmodels' warnings as the analysis notes them: ``statsmodels: m``, or ``statsmodels (fit): m``."""
    return [f"{FIT_NOTE_PREFIX}{f' ({fit})' if fit else ''}: {m}" for m in messages]


#: statsmodels' warning when the REML surface is not curved like a maximum at the estimate (a variance
#: at or near zero): the standard errors come from an inverse that is not a covariance.
HESSIAN_NOT_PD = "Hessian matrix at the estimated parameter values is not positive definite"


def hessian_caveat(notes: Sequence[str], zero_levels: Sequence[str] = ()) -> str:
    """The reading's caveat when the fit in use (its ``statsmodels:`` notes) had a Hessian that is not
    positive definite, or "" when it had not."""
    used = [n for n in notes if n.startswith((FIT_NOTE_PREFIX + ":", FIT_NOTE_PREFIX + " ("))]
    if not any(HESSIAN_NOT_PD in n for n in used):
        return ""
    why = (f"a variance at or near zero: {', '.join(zero_levels)}" if zero_levels else
           "with no variance near zero, often a random slope fitted on few groups")
    return (f"Caveat: statsmodels found the fit's Hessian not positive definite ({why}), so the standard "
            "errors, p-values and CIs rest on a boundary fit and may be off; more runs at that level, or a "
            "model without it, give firmer ones")


def usable_fit(result) -> bool:
    """A fit that converged with a finite log-likelihood, finite, positive standard errors and finite
    estimates (audit, 2026-11-28: powell "converged" to a log-likelihood of +inf, a singular covariance
    and a batch-size SE of 1e7)."""
    if result is None or not bool(getattr(result, "converged", False)):
        return False
    if not np.isfinite(float(getattr(result, "llf", np.nan))):
        return False
    with np.errstate(invalid="ignore"):  # statsmodels takes the root of a negative variance: NaN, refused below
        bse = np.asarray(result.bse_fe, dtype=float)
    return bool(np.all(np.isfinite(bse)) and np.all(bse > 0)
                and np.all(np.isfinite(np.asarray(result.fe_params, dtype=float))))
