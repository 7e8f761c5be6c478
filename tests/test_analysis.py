"""experiments.analysis: the multilevel model recovers planted effects from simulated run records,
and fails or notes clearly on data it cannot model."""

from __future__ import annotations

import itertools
import json
import math
import re
import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from biomed_lm.experiments.analysis import MultilevelResult, fit_multilevel, format_p

# True effects, in points (score × 100).
OFFSETS = {"BC5CDR-chem": 88.0, "ChemProt": 72.0, "NCBI-disease": 83.0, "PubMedQA": 55.0}
EPOCHS = {"BC5CDR-chem": 20, "ChemProt": 10, "NCBI-disease": 20, "PubMedQA": 10}  # fixed per dataset
VOCAB_EFFECT = 3.0        # in-domain vs general
MASKING_EFFECT = 1.0      # whole-word vs token
ADVERSARIAL_EFFECT = 0.0  # the null factor
LR_PER_DECADE = 2.0       # points per 10× learning rate
BATCH_32_EFFECT = -0.5    # batch 32 vs 16
GROUP_SD, SEED_SD, RESIDUAL_SD = 0.5, 0.7, 1.0
FACTORS = {"vocabulary": "general", "masking": "token", "adversarial": "off"}


def simulate(rng_seed: int = 0, *, adversarial=("off", "on"), datasets=tuple(OFFSETS),
             lrs=(1e-5, 3e-5, 5e-5), batches=(16, 32), seeds=(1, 2, 3)) -> pd.DataFrame:
    """Run records of 2×2×2 variants × datasets × grid × seeds with the effects above, a random
    intercept per (variant, dataset) group and a seed shift per (group, seed)."""
    rng = np.random.default_rng(rng_seed)
    rows = []
    for voc, mask, adv in itertools.product(("general", "in-domain"), ("token", "whole-word"), adversarial):
        variant = f"{voc}/{mask}/adv-{adv}"
        for ds in datasets:
            group = rng.normal(0.0, GROUP_SD)
            seed_shift = {s: rng.normal(0.0, SEED_SD) for s in seeds}
            for lr, bs, s in itertools.product(lrs, batches, seeds):
                points = (OFFSETS[ds] + VOCAB_EFFECT * (voc == "in-domain") + MASKING_EFFECT * (mask == "whole-word")
                          + ADVERSARIAL_EFFECT * (adv == "on") + LR_PER_DECADE * (math.log10(lr) - math.log10(3e-5))
                          + BATCH_32_EFFECT * (bs == 32) + group + seed_shift[s] + rng.normal(0.0, RESIDUAL_SD))
                rows.append({"variant": variant, "vocabulary": voc, "masking": mask, "adversarial": adv,
                             "dataset": ds, "task_type": "ner", "learning_rate": lr, "batch_size": bs,
                             "epochs": EPOCHS[ds], "seed": s, "dev_score": points / 100 + rng.normal(0, 0.005),
                             "test_score": points / 100, "wall_time_s": 60.0})
    return pd.DataFrame(rows)


def small() -> pd.DataFrame:
    """4 variants (adversarial fixed at off) × 3 datasets × 6 grid points × 2 seeds = 144 runs."""
    return simulate(1, adversarial=("off",), datasets=("BC5CDR-chem", "ChemProt", "PubMedQA"), seeds=(1, 2))


@pytest.fixture(scope="module")
def planted() -> tuple[pd.DataFrame, MultilevelResult]:
    rows = simulate(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fit_multilevel(rows, FACTORS)  # the defaults: seed variance component, automatic slopes
    assert not caught, [str(w.message) for w in caught]  # statsmodels warnings go to notes, not to the caller
    return rows, result


def coef(result: MultilevelResult, term: str) -> pd.Series:
    table = result.coefficients.set_index("term")
    assert term in table.index, list(table.index)
    return table.loc[term]


# --------------------------------------------------------------------------------- planted effects

def test_planted_factor_effects_recovered(planted):
    rows, result = planted
    assert result.converged
    assert result.n_runs == len(rows) == 8 * 4 * 18 and result.n_groups == 32
    assert list(result.coefficients.columns) == ["term", "estimate", "se", "z", "df", "p", "ci_low", "ci_high"]
    for term, truth in [("vocabulary[in-domain]", VOCAB_EFFECT), ("masking[whole-word]", MASKING_EFFECT),
                        ("adversarial[on]", ADVERSARIAL_EFFECT)]:
        row = coef(result, term)
        assert 0 < row["se"] < 0.5, (term, row["se"])
        assert abs(row["estimate"] - truth) < 3 * row["se"], (term, row["estimate"], row["se"], truth)
    assert coef(result, "vocabulary[in-domain]")["p"] < 0.001
    null = coef(result, "adversarial[on]")
    assert null["ci_low"] < 0 < null["ci_high"]
    for ds in ("ChemProt", "NCBI-disease", "PubMedQA"):
        row = coef(result, f"dataset[{ds}]")
        assert abs(row["estimate"] - (OFFSETS[ds] - OFFSETS["BC5CDR-chem"])) < 3 * row["se"]


def test_planted_level1_effects_recovered(planted):
    _, result = planted
    lr_scale, bs_scale = result.level1_scaling["learning_rate"], result.level1_scaling["batch_size"]
    assert lr_scale["transform"] == "log10"
    lr = coef(result, "log10(learning_rate) [z]")
    per_decade, per_decade_se = lr["estimate"] / lr_scale["sd"], lr["se"] / lr_scale["sd"]
    assert per_decade_se < 0.5 and abs(per_decade - LR_PER_DECADE) < 3 * per_decade_se, (per_decade, per_decade_se)
    bs = coef(result, "batch_size [z]")
    step = 16 / bs_scale["sd"]  # 16 → 32 in SD units
    assert bs["se"] * step < 0.5 and abs(bs["estimate"] * step - BATCH_32_EFFECT) < 3 * bs["se"] * step
    # epochs is fixed per dataset: confounded with the dataset effects, so dropped with a note
    assert "epochs" not in result.level1_scaling
    assert any("epochs" in n and "confounded" in n for n in result.notes)


def test_planted_variance_components(planted):
    _, result = planted
    re_ = result.random_effects
    assert {"group_intercept", "seed", "residual"} <= set(re_)
    assert 0.7 < re_["residual"] < 1.4            # truth 1.0
    assert 0.2 < re_["seed"] < 1.0                # truth 0.49
    assert 0.0 < re_["group_intercept"] < 1.0     # truth 0.25 (32 groups: a rough estimate)
    vd = result.variance_decomposition
    assert set(vd) == {"between_groups", "seeds", "residual"}
    assert math.isclose(sum(vd.values()), 1.0, abs_tol=1e-9) and all(0 <= v <= 1 for v in vd.values())
    assert vd["residual"] > vd["seeds"] > 0
    assert 0 < result.r_squared["marginal"] <= result.r_squared["conditional"] <= 1
    # automatic random slopes: used when that fit converged, otherwise an explicit fallback note
    if result.random_slopes:
        assert any(k.startswith("slope[") for k in re_)
    else:
        assert any("fell back" in n for n in result.notes)


def test_reading(planted):
    _, result = planted
    sentences = result.reading()
    vocab = [s for s in sentences if s.startswith("vocabulary = in-domain (vs general): ")]
    assert len(vocab) == 1 and "p < 0.001" in vocab[0]
    m = re.search(r": \+(\d+\.\d\d) points \(SE (\d\.\d\d), p < 0\.001\)", vocab[0])
    assert m and round(float(m.group(1))) == 3, vocab[0]  # "+3" points, as planted
    assert any(s.startswith("masking = whole-word (vs token): +") for s in sentences)
    assert any(s.startswith("adversarial = on (vs off): ") for s in sentences)
    assert any("learning_rate" in s and "per SD" in s for s in sentences)
    # the grid (1e-5 to 5e-5) is 0.70 decades wide: "per 10×" is a linear extrapolation, and says so
    assert any("points per 10× learning_rate, a linear trend over a grid 0.70 decades wide" in s for s in sentences)
    assert any("seeds explain" in s and "%" in s for s in sentences)


def test_to_dict_and_markdown(planted):
    _, result = planted
    payload = result.to_dict()
    text = json.dumps(payload, allow_nan=False)
    back = json.loads(text)
    assert back["n_runs"] == result.n_runs and back["converged"] is True
    assert {c["term"] for c in back["coefficients"]} >= {"vocabulary[in-domain]", "masking[whole-word]"}
    assert back["reading"] == result.reading()
    md = result.to_markdown()
    assert "| term | estimate | SE | z or t | df | p | 95% CI |" in md
    assert "| vocabulary[in-domain] | +" in md and "### Reading" in md
    assert back["factors"] == FACTORS


# ------------------------------------------------------------------------------------ model options

def test_interactions_give_per_dataset_effects():
    result = fit_multilevel(simulate(0), FACTORS, random_slopes=(), interactions=True)
    effects = result.dataset_effects
    assert effects is not None and len(effects) == 3 * 4
    vocab = effects[effects["factor"] == "vocabulary"]
    main = coef(result, "vocabulary[in-domain]")
    assert math.isclose(vocab["estimate"].mean(), main["estimate"], abs_tol=1e-6)  # balanced: average of datasets
    assert (abs(vocab["estimate"] - VOCAB_EFFECT) < 3 * vocab["se"]).all()
    assert any("by dataset" in s for s in result.reading())


def test_seed_effect_options():
    rows = small()
    fixed = fit_multilevel(rows, {"vocabulary": "general", "masking": "token"}, seed_effect="fixed",
                           random_slopes=())
    assert "seed[2]" in set(fixed.coefficients["term"]) and "seed" not in fixed.random_effects
    assert fixed.variance_decomposition["seeds"] == 0.0
    none = fit_multilevel(rows.drop(columns="seed"), {"vocabulary": "general", "masking": "token"},
                          seed_effect="none", random_slopes=())
    assert "seed" not in none.random_effects and any("seeds not modelled" in n for n in none.notes)
    with pytest.raises(ValueError, match="seed_effect"):
        fit_multilevel(rows, {"vocabulary": "general"}, seed_effect="random")


def test_list_of_dicts_with_missing_values():
    rows = small()
    records = rows.to_dict(orient="records")
    records[0]["test_score"] = float("nan")
    result = fit_multilevel(records, {"vocabulary": "general", "masking": "token"}, random_slopes=())
    assert result.n_runs == len(rows) - 1
    assert any("1 of 144 runs dropped" in n for n in result.notes)


# ------------------------------------------------------------------------------------- bad inputs

def test_constant_factor_dropped_with_note():
    rows = small().assign(corpus="pubmed")
    result = fit_multilevel(rows, {"vocabulary": "general", "masking": "token", "adversarial": "off",
                                   "corpus": "pubmed"}, random_slopes=())
    notes = " ".join(result.notes)
    assert "'adversarial'" in notes and "'corpus'" in notes and "not identifiable" in notes
    terms = set(result.coefficients["term"])
    assert not any(t.startswith(("adversarial", "corpus")) for t in terms)
    assert "vocabulary[in-domain]" in terms


def test_wrong_reference_or_column_raises():
    rows = small()
    with pytest.raises(ValueError, match="'masking'"):
        fit_multilevel(rows, {"vocabulary": "general", "masking": "span"})
    with pytest.raises(ValueError, match="'tokenizer'"):
        fit_multilevel(rows, {"tokenizer": "wordpiece"})
    with pytest.raises(ValueError, match="'test_score'"):
        fit_multilevel(rows.drop(columns="test_score"), {"vocabulary": "general"})


def test_too_little_data_raises():
    rows = small()
    with pytest.raises(ValueError, match="too few"):
        fit_multilevel(rows.head(5), {"vocabulary": "general"})
    one_run_per_group = rows.drop_duplicates(["variant", "dataset"])
    with pytest.raises(ValueError, match="too few runs"):
        fit_multilevel(one_run_per_group, {"vocabulary": "general", "masking": "token"})
    with pytest.raises(ValueError, match="no runs"):
        fit_multilevel([], {"vocabulary": "general"})


def test_confounded_factors_raise():
    rows = small()
    rows["initialization"] = rows["vocabulary"].map({"general": "continual", "in-domain": "scratch"})
    with pytest.raises(ValueError, match="not identifiable"):
        fit_multilevel(rows, {"vocabulary": "general", "initialization": "continual"}, random_slopes=())


def test_format_p():
    assert format_p(0.0001) == "p < 0.001"
    assert format_p(0.0123) == "p = 0.012"
    assert format_p(0.4321) == "p = 0.43"
    assert format_p(float("nan")) == "p = n/a"


def test_constant_scores_are_refused_with_a_reason():
    rows = [{"variant": v, "vocabulary": v, "dataset": d, "learning_rate": 1e-3, "batch_size": 16, "epochs": 1,
             "seed": s, "test_score": 0.0} for v in ("general", "in-domain") for d in ("a", "b") for s in (1, 2)]
    with pytest.raises(ValueError, match="no variance"):
        fit_multilevel(rows, {"vocabulary": "general"})


def test_saturated_design_groups_by_seed_and_recovers_the_effect():
    """Three variants on one dataset (scratch/continual × vocabulary without continual + in-domain):
    every (variant, dataset) group is its own factor cell, so the random intercept goes to the seeds,
    whose shift every variant shares."""
    import numpy as np

    rng = np.random.default_rng(7)
    seed_shift = {s: rng.normal(0, 2.0) for s in range(1, 7)}
    variants = {"general_continual": ("general", "continual", 50.0), "general_scratch": ("general", "scratch", 8.0),
                "in-domain_scratch": ("in-domain", "scratch", 10.0)}
    rows = [{"variant": v, "vocabulary": voc, "initialization": init, "dataset": "ncbi-disease",
             "learning_rate": 2e-4, "batch_size": 16, "epochs": 4, "seed": s,
             "test_score": (mean + seed_shift[s] + rng.normal(0, 0.5)) / 100}
            for v, (voc, init, mean) in variants.items() for s in seed_shift]
    result = fit_multilevel(rows, {"vocabulary": "general", "initialization": "continual"})
    effects = result.coefficients.set_index("term")
    assert abs(effects.loc["initialization[scratch]", "estimate"] - (-42.0)) < 3 * effects.loc[
        "initialization[scratch]", "se"]
    assert any("random intercept is per seed" in n for n in result.notes)
    assert result.n_groups == 3 and result.variance_decomposition["seeds"] > 0.5
    # QA: no group variance is fitted here, yet the decomposition gave groups 0.0% ("groups do not differ")
    assert set(result.variance_decomposition) == {"seeds", "residual"}
    assert sum(result.variance_decomposition.values()) == pytest.approx(1.0)
    variance = next(s for s in result.reading() if s.startswith("Of the variance"))
    assert "groups are not estimated" in variance and "groups 0.0%" not in variance
    assert "| between_groups |" not in result.to_markdown()
    assert "so the random intercept below is per fine-tuning seed, not per group" in result.to_markdown()
    assert "- Random effects per seed: `~1`" in result.to_markdown()


def test_single_run_per_seed_cell_folds_the_seed_into_the_residual():
    rows = [{"variant": f"{voc}_{mask}", "vocabulary": voc, "masking": mask, "dataset": d, "learning_rate": 1e-3,
             "batch_size": 16, "epochs": 1, "seed": s, "test_score": 0.5 + 0.03 * (voc == "in") + 0.01 * s
             + 0.02 * (d == "b") + 0.001 * ((s * 7 + len(d)) % 5)}
            for voc in ("gen", "in") for mask in ("tok", "wwm") for d in ("a", "b") for s in (1, 2, 3)]
    result = fit_multilevel(rows, {"vocabulary": "gen", "masking": "tok"})
    assert "seed" not in result.random_effects
    assert any("single run" in n for n in result.notes)


def _fake_fit(llf: float, converged: bool = True):
    from types import SimpleNamespace

    return SimpleNamespace(converged=converged, llf=llf, bse_fe=np.array([1.0, 0.5]), fe_params=np.array([80.0, 2.0]))


def test_a_boundary_fit_is_compared_with_the_other_optimizers_and_the_best_kept(monkeypatch):
    """Audit (2026-11-28): lbfgs "converged" at a seed variance of 0.00 (REML log-likelihood -2063.69) where
    powell found 15.64 (-2043.13), and a powell fit at a log-likelihood of +inf was used. A fit on the
    boundary is compared with the other optimizers' and the highest finite log-likelihood kept; a fit
    without a finite log-likelihood is not usable."""
    from biomed_lm.experiments import design

    boundary = ["The MLE may be on the boundary of the parameter space."]
    attempts = {"lbfgs": (_fake_fit(-2063.69), boundary, None), "powell": (_fake_fit(-2043.13), boundary, None),
                "bfgs": (_fake_fit(float("inf")), [], None), "cg": (None, [], "LinAlgError: singular")}
    monkeypatch.setattr(design, "_fit_once", lambda formula, data, re, vc, method: attempts[method])
    result, messages, error = design.fit_mixedlm("y ~ 1", None, "1", None)
    assert result is attempts["powell"][0] and error is None
    assert messages[1].startswith("optimizer powell kept: the highest REML log-likelihood of the boundary fits "
                                  "(lbfgs -2063.69, powell -2043.13)")
    assert not design.usable_fit(_fake_fit(float("inf"))) and design.usable_fit(_fake_fit(-10.0))

    clean = {**attempts, "lbfgs": (_fake_fit(-2063.69), [], None)}  # an interior optimum: no other optimizer tried
    monkeypatch.setattr(design, "_fit_once", lambda formula, data, re, vc, method: clean[method])
    assert design.fit_mixedlm("y ~ 1", None, "1", None) == (clean["lbfgs"][0], [], None)


# ------------------------------------------------------------------------- degrees of freedom

def _slope_varying(rng_seed: int, n_datasets: int = 2) -> pd.DataFrame:
    """2 variants × ``n_datasets`` datasets (so 2·n groups), 3 learning rates × 2 batch sizes × 3 seeds,
    a learning-rate slope that varies between groups around 0 and no batch-size effect."""
    rng = np.random.default_rng(rng_seed)
    rows = []
    for voc, ds in itertools.product(("general", "in-domain"), range(n_datasets)):
        group, slope = rng.normal(0, 3), rng.normal(0, 4)  # points per decade
        for s in range(3):
            shift = rng.normal(0, 2)
            for lr, bs in itertools.product((1e-5, 3e-5, 5e-5), (16, 32)):
                points = 70 + group + slope * math.log10(lr / 3e-5) + shift + rng.normal(0, 3)
                rows.append({"variant": voc, "vocabulary": voc, "dataset": f"d{ds}", "seed": s, "learning_rate": lr,
                             "batch_size": bs, "epochs": 3, "test_score": points / 100})
    return pd.DataFrame(rows)


def test_tests_use_between_within_df_and_the_groups_df_for_a_slope_variable():
    """Paper 000 tested with lmerTest's t; a normal approximation with few groups is optimistic. A factor
    gets the groups' between-within df (groups less the rank of the group-level columns); a level-1 variable a
    random slope was tried for gets the groups' number less one; one without a slope, the runs' df."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = fit_multilevel(_slope_varying(3, n_datasets=4), {"vocabulary": "general"},
                                random_slopes=["learning_rate"])
    df = result.coefficients.set_index("term")["df"]
    assert df["vocabulary[in-domain]"] == 8 - 5  # 8 groups; intercept, the factor and 3 dataset dummies
    assert df["log10(learning_rate) [z]"] == 8 - 1
    # batch size varies within seed units: 144 runs less 24 (group, seed) units less the 2 run-level columns
    assert df["batch_size [z]"] == 144 - 24 - 2
    row = result.coefficients.set_index("term").loc["vocabulary[in-domain]"]
    assert math.isclose(row["p"], 2 * scipy.stats.t.sf(abs(row["z"]), 3), rel_tol=1e-9)
    assert "tests: t with between-within df" in " ".join(result.notes)
    assert "| df |" in result.to_markdown() and "Wald z" not in result.to_markdown()


def test_a_failed_joint_slope_fit_keeps_the_best_single_slope(monkeypatch):
    """A slope that does not vary (batch size here) puts the joint fit on its boundary; the learning rate's
    slope alone is then still fitted, not dropped with it."""
    from biomed_lm.experiments import analysis

    real = analysis.fit_mixedlm

    def joint_fails(formula, data, re_formula, vc_formula):
        if re_formula.count("+") > 1:
            return None, [], "LinAlgError: singular"
        return real(formula, data, re_formula, vc_formula)

    monkeypatch.setattr(analysis, "fit_mixedlm", joint_fails)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = fit_multilevel(_slope_varying(3, n_datasets=4), {"vocabulary": "general"})
    assert len(result.random_slopes) == 1
    assert any("failed (LinAlgError: singular): kept the random slope for" in n for n in result.notes)
    # both slopes were tried, so both variables are tested on the groups' df, and the one not fitted is named
    df = result.coefficients.set_index("term")["df"]
    assert df["log10(learning_rate) [z]"] == df["batch_size [z]"] == 7
    assert result.slopes_not_fitted == tuple(v for v in ("learning_rate", "batch_size")
                                             if v not in result.random_slopes)
    level1 = next(s for s in result.reading() if s.startswith("Fine-tuning (level-1) variables"))
    assert level1.count("assumed the same in every group") == 1


def test_when_no_slope_fits_the_level1_tests_say_they_assume_one_effect(monkeypatch):
    from biomed_lm.experiments import analysis

    real = analysis.fit_mixedlm
    monkeypatch.setattr(analysis, "fit_mixedlm", lambda f, d, re_formula, vc: (
        (None, [], "did not converge") if re_formula != "1" else real(f, d, re_formula, vc)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = fit_multilevel(_slope_varying(3), {"vocabulary": "general"})
    assert result.random_slopes == () and set(result.slopes_not_fitted) == {"learning_rate", "batch_size"}
    assert any("each slope alone failed too): fell back to random intercepts only" in n for n in result.notes)
    assert result.coefficients.set_index("term").loc["log10(learning_rate) [z]", "df"] == 4 - 1
    level1 = next(s for s in result.reading() if s.startswith("Fine-tuning (level-1) variables"))
    assert level1.count("assumed the same in every group") == 2
    assert result.to_dict()["slopes_not_fitted"] == list(result.slopes_not_fitted)
