"""experiments.checkpoint_analysis: a pretraining run (checkpoint) is the unit a pretraining factor
is tested on. Planted effects are recovered, the degrees of freedom are the checkpoints', one
checkpoint per variant withholds the factor tests in plain words, and paper 000's model stays
available by name."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from biomed_lm.experiments.calibration import AblationDesign, VarianceComponents, simulate_runs
from biomed_lm.experiments.checkpoint_analysis import (CONFOUNDED_CAVEAT, PAPER000_CAVEAT, PAPER000_P_BASIS,
                                                       CheckpointsConfounded, analyse_runs, fit_checkpoint_model)
from biomed_lm.experiments.design import AnalysisError

TINY_VARIANTS = tuple({"vocabulary": v, "masking": m} for v, m in itertools.product(("general", "in-domain"),
                                                                                  ("token", "whole-word")))
FACTORS = {"vocabulary": "general", "masking": "token"}
QUIET = VarianceComponents(checkpoint=0.25, checkpoint_x_dataset=0.25, seed=0.25, setting=0.0, residual=0.25)


def _design(checkpoints: int, datasets: int = 3, seeds: int = 3, settings=((1e-5, 16), (3e-5, 16), (3e-5, 32))):
    return AblationDesign("t", TINY_VARIANTS, dict(FACTORS), checkpoints,
                          {f"d{i}": seeds for i in range(datasets)}, tuple(settings))


def test_planted_effect_and_components_are_recovered():
    design = _design(checkpoints=4)
    rows = simulate_runs(design, QUIET, effect=3.0, rng=np.random.default_rng(0))
    result = fit_checkpoint_model(rows, FACTORS)
    coef = result.coefficients.set_index("term")
    assert coef.loc["vocabulary[in-domain]", "estimate"] == pytest.approx(3.0, abs=0.6)
    assert coef.loc["vocabulary[in-domain]", "p"] < 1e-3
    assert coef.loc["masking[whole-word]", "estimate"] == pytest.approx(0.0, abs=0.6)
    # 16 checkpoints, 3 checkpoint-level parameters (intercept, two factor dummies): 13 df
    assert coef.loc["vocabulary[in-domain]", "df"] == 13 and coef.loc["Intercept", "df"] == 13
    assert set(result.random_effects) == {"checkpoint", "checkpoint_x_dataset", "seed", "residual"}
    assert result.random_effects["residual"] == pytest.approx(0.25, rel=0.3)
    assert result.n_checkpoints == 16 and result.specification == "checkpoints" and result.factor_tests
    assert sum(result.variance_decomposition.values()) == pytest.approx(1.0)
    text = result.to_markdown()
    assert "Specification: `checkpoints`" in text and "| vocabulary[in-domain] |" in text
    assert any("pretraining runs (one random intercept per checkpoint" in s for s in result.reading())


def test_one_checkpoint_per_variant_is_confounded_and_said_so():
    rows = simulate_runs(_design(checkpoints=1), QUIET, effect=3.0, rng=np.random.default_rng(1))
    with pytest.raises(CheckpointsConfounded, match="one checkpoint per variant"):
        fit_checkpoint_model(rows, FACTORS)
    for specification in ("checkpoints", "model-dataset-groups"):
        result = analyse_runs(rows, FACTORS, specification)
        assert not result.factor_tests and result.caveat == CONFOUNDED_CAVEAT
        reading = result.reading()
        assert reading[0].startswith("Caveat: each variant was pretrained once")
        factor_sentences = [s for s in reading if s.startswith(("vocabulary =", "masking ="))]
        assert factor_sentences and all("no p-value" in s and "p =" not in s and "p <" not in s
                                        for s in factor_sentences)
        assert "— (confounded)" in result.to_markdown()
        assert result.to_dict()["factor_tests"] is False
        # QA: analysis.json still held the withheld p-values and CIs of the factors
        coefficients = {c["term"]: c for c in result.to_dict()["coefficients"]}
        for term in ("vocabulary[in-domain]", "masking[whole-word]"):
            assert coefficients[term]["p"] is None and coefficients[term]["ci_low"] is None
            assert coefficients[term]["ci_high"] is None and coefficients[term]["estimate"] is not None
            # QA (2026-11-29): SE, z and df gave the withheld p-value back; the SE omits the pretraining run's luck
            assert coefficients[term]["se"] is None and coefficients[term]["z"] is None
        row = next(line for line in result.to_markdown().splitlines() if line.startswith("| vocabulary[in-domain]"))
        assert row.split("|")[3:6] == [" — ", " — ", " — "], row  # SE, z or t, df
        assert coefficients["Intercept"]["p"] is not None
        assert not result.coefficients[["p", "ci_low"]].isna().any().any()  # the fit's own table is whole


def test_one_checkpoint_per_variant_too_few_for_the_fallback_says_the_confounding_first():
    """Two variants pretrained once, one dataset: paper 000's model, which would describe the runs, has too
    few groups too; the error names the cause the user can act on (pretrain_seeds), not only the fallback's."""
    variants = ({"vocabulary": "general"}, {"vocabulary": "in-domain"})
    design = AblationDesign("t", variants, {"vocabulary": "general"}, 1, {"d0": 3}, ((1e-5, 16), (3e-5, 16)))
    rows = simulate_runs(design, QUIET, effect=1.0, rng=np.random.default_rng(3))
    with pytest.raises(CheckpointsConfounded, match=r"one checkpoint per variant.*pretrain_seeds ≥ 2.*"
                                                    r"cannot be fitted either: too few groups"):
        analyse_runs(rows, {"vocabulary": "general"}, "checkpoints")


def test_paper000_model_by_name_groups_checkpoint_by_dataset():
    design = _design(checkpoints=2)
    rows = simulate_runs(design, QUIET, effect=0.0, rng=np.random.default_rng(2))
    result = analyse_runs(rows, FACTORS, "model-dataset-groups")
    assert result.specification == "model-dataset-groups" and result.factor_tests
    assert result.n_groups == 8 * 3 and result.n_checkpoints == 8
    assert "paper 000" in result.to_markdown()
    with pytest.raises(ValueError, match="specification must be one of"):
        analyse_runs(rows, FACTORS, "groups")


def test_more_datasets_do_not_make_checkpoint_luck_look_like_an_effect():
    """The flaw the model fixes: with checkpoint luck and no true effect, paper 000's groups find
    'effects' more often as datasets are added; the checkpoint model's df stay the checkpoints'."""
    loud = VarianceComponents(checkpoint=4.0, checkpoint_x_dataset=0.5, seed=0.5, setting=0.0, residual=1.0)
    design = _design(checkpoints=2, datasets=6, seeds=2, settings=((3e-5, 16),))
    rows = simulate_runs(design, loud, effect=0.0, rng=np.random.default_rng(3))
    ours = fit_checkpoint_model(rows, FACTORS).coefficients.set_index("term")
    assert ours.loc["vocabulary[in-domain]", "df"] == 5
    # the SE of a factor is at least the checkpoint-level SE: sqrt(4.0 * 2 / 4) = 1.41 for a balanced contrast
    assert ours.loc["vocabulary[in-domain]", "se"] > 0.8



@pytest.mark.parametrize("checkpoints", [2, 3])
def test_paper000_p_values_are_marked_whatever_the_checkpoints_per_variant(checkpoints):
    """Issue 22, item 8: with two or more checkpoints per variant, model-dataset-groups printed its
    Wald p-values with no caveat, although its groups count each checkpoint's luck once per dataset
    (docs/calibration.md: too many false positives). Now the caveat is printed and every factor
    p-value is marked as paper 000's specification, in the reading, the markdown and the JSON."""
    rows = simulate_runs(_design(checkpoints=checkpoints), QUIET, effect=0.0, rng=np.random.default_rng(4))
    result = analyse_runs(rows, FACTORS, "model-dataset-groups")
    assert result.factor_tests and result.caveat == PAPER000_CAVEAT
    reading = result.reading()
    assert reading[0] == f"Caveat: {PAPER000_CAVEAT}" and "not the calibrated test" in reading[0]
    factor_sentences = [s for s in reading if s.startswith(("vocabulary =", "masking ="))]
    assert len(factor_sentences) == 2 and all(f"under {PAPER000_P_BASIS})" in s for s in factor_sentences)
    text = result.to_markdown()
    assert f"**Caveat: {PAPER000_CAVEAT}**" in text and f"† {PAPER000_P_BASIS}" in text
    factor_rows = [line for line in text.splitlines() if line.startswith(("| vocabulary[", "| masking["))]
    assert len(factor_rows) == 2 and all(line.count(" †") == 2 for line in factor_rows)  # p and CI
    assert "†" not in next(line for line in text.splitlines() if line.startswith("| Intercept"))
    assert result.to_dict()["factor_p_basis"] == PAPER000_P_BASIS
    # the calibrated test carries neither
    ours = analyse_runs(rows, FACTORS, "checkpoints")
    assert not ours.caveat and not ours.factor_p_basis and "†" not in ours.to_markdown()


def test_paper000_model_says_its_groups_are_pretrained_models_by_dataset():
    """QA: with two pretraining runs per variant, analysis.md said "24 runs in 8 groups (4 variants × 1
    datasets)" and its reading "(variant, dataset) groups"; the groups fitted are (checkpoint, dataset)."""
    rows = simulate_runs(_design(checkpoints=2, datasets=1), QUIET, effect=0.0, rng=np.random.default_rng(5))
    result = analyse_runs(rows, FACTORS, "model-dataset-groups")
    assert result.n_groups == 8 and result.n_checkpoints == 8
    text = result.to_markdown()
    assert f"{result.n_runs} runs in 8 groups (8 pretrained models of 4 variants × 1 dataset), 3 fine-tuning seeds" \
        in text
    variance = next(s for s in result.reading() if s.startswith("Of the variance"))
    assert "differences between (pretrained model, dataset) groups" in variance
    assert "(variant, dataset)" not in text + " ".join(result.notes)
    ours = analyse_runs(rows, FACTORS, "checkpoints").to_markdown()
    assert f"{result.n_runs} runs of 8 checkpoints (4 variants) × 1 dataset, 3 fine-tuning seeds" in ours


def test_one_fine_tuning_run_per_checkpoint_is_refused_in_words():
    """QA: two pretraining runs per variant, each fine-tuned once (num_seeds: 1, one dataset): the report
    said only 'the checkpoint model could not be fitted (LinAlgError: Singular matrix)'."""
    rows = simulate_runs(_design(checkpoints=2, datasets=1, seeds=1, settings=((3e-5, 16),)), QUIET, effect=1.0,
                         rng=np.random.default_rng(6))
    assert len(rows) == 8
    with pytest.raises(AnalysisError, match=r"too few runs: 8 fine-tuning runs of 8 checkpoints; .* one run per "
                                            r"checkpoint: fine-tune each checkpoint with several seeds"):
        analyse_runs(rows, FACTORS, "checkpoints")


def test_a_variant_scoring_the_same_on_every_run_is_named_in_the_notes():
    """QA: two scratch variants scored 0 on every run (fine-tuning learned nothing) and the fit read
    'vocabulary = in-domain: +0.00 points (SE 2.00, p = 1.00)', an SE borrowed from the one variant that
    varied, without a word about it."""
    rng = np.random.default_rng(3)
    variants = {"general_continual": ("general", "continual"), "general_scratch": ("general", "scratch"),
                "in-domain_scratch": ("in-domain", "scratch")}
    rows = [{"variant": v, "vocabulary": voc, "initialization": init, "checkpoint": run, "dataset": "ncbi-disease",
             "seed": seed, "learning_rate": 2e-4, "batch_size": 16, "epochs": 4,
             "test_score": 0.0 if init == "scratch" else 0.5 + 0.01 * run + rng.normal(0, 0.01)}
            for v, (voc, init) in variants.items() for run in (1, 2) for seed in (1, 2, 3)]
    result = analyse_runs(rows, {"vocabulary": "general", "initialization": "continual"}, "checkpoints")
    notes = [n for n in result.notes if "on every one of its" in n]
    assert notes == [f"{v} scores 0.00 points on every one of its 6 runs of ncbi-disease (did fine-tuning learn "
                     f"anything?): the model assumes every variant's runs spread alike, so its comparisons with {v} "
                     f"rest on the other variants' spread" for v in ("general_scratch", "in-domain_scratch")]
    assert notes[0] in result.to_markdown()


def test_a_learning_rate_the_seeds_cross_is_tested_on_the_runs_less_one_df_per_seed_unit():
    """QA: the between-within df ignored the seed component. Each (checkpoint, dataset, seed) shares one
    shift over the settings it is run with, so a term varying within those units (the learning rate and
    batch size of the grid) has the runs' df less one per seed unit, not per (checkpoint, dataset) cell."""
    design = _design(checkpoints=2, datasets=2, seeds=3, settings=((1e-5, 16), (3e-5, 16), (3e-5, 32)))
    rows = simulate_runs(design, QUIET, effect=0.0, rng=np.random.default_rng(7))
    coef = fit_checkpoint_model(rows, FACTORS).coefficients.set_index("term")
    n_runs, seed_units, cells = 8 * 2 * 3 * 3, 8 * 2 * 3, 8 * 2
    assert len(rows) == n_runs
    assert coef.loc["log10(learning_rate) [z]", "df"] == n_runs - seed_units - 2  # two level-1 columns
    assert coef.loc["dataset[d1]", "df"] == cells - 8 - 1
    assert coef.loc["vocabulary[in-domain]", "df"] == 8 - 3
    # one run per seed unit: no seed component, so the level-1 terms have the runs' df less the cells'
    single = simulate_runs(_design(checkpoints=2, datasets=2, seeds=3, settings=((3e-5, 16),)), QUIET, effect=0.0,
                           rng=np.random.default_rng(8))
    result = fit_checkpoint_model(single, FACTORS, level1=())
    assert "seed" not in result.random_effects
    assert result.coefficients.set_index("term").loc["dataset[d1]", "df"] == cells - 8 - 1


def test_a_hessian_that_is_not_positive_definite_is_a_caveat_in_the_reading():
    """QA: statsmodels' "Hessian ... not positive definite" (a variance at zero) was only in the notes; the
    reading gave p-values without a word about the boundary fit."""
    quiet = VarianceComponents(checkpoint=0.0, checkpoint_x_dataset=0.0, seed=0.0, setting=0.0, residual=0.25)
    design = AblationDesign("t", TINY_VARIANTS, dict(FACTORS), 2, {"d0": 3, "d1": 3}, ((1e-5, 16), (3e-5, 16)))
    for seed in (1, 2):
        result = fit_checkpoint_model(simulate_runs(design, quiet, effect=0.0, rng=np.random.default_rng(seed)),
                                      FACTORS)
        assert any("Hessian matrix at the estimated parameter values is not positive definite" in n
                   for n in result.notes)
        caveat = result.reading()[-1]
        assert caveat.startswith("Caveat: statsmodels found the fit's Hessian not positive definite")
        assert "standard errors, p-values and CIs rest on a boundary fit" in caveat
    assert "checkpoint × dataset, fine-tuning seed" in caveat  # seed 2 puts every level at zero: named
    clean = fit_checkpoint_model(simulate_runs(_design(checkpoints=4), QUIET, effect=0.0,
                                               rng=np.random.default_rng(0)), FACTORS)
    assert not any("Hessian" in s for s in clean.reading())


def test_a_zero_checkpoint_variance_is_said_beside_the_factors_p_values():
    """QA (2026-11-29): when REML puts the pretraining runs' variance at zero the factor tests reject a true null
    about 10% of the time (docs/calibration.md); the reading's factor sentences carried only a Hessian caveat."""
    no_checkpoint_luck = VarianceComponents(checkpoint=0.0, checkpoint_x_dataset=0.0, seed=0.25, setting=0.0,
                                            residual=0.25)
    for seed in range(10):  # the first draw whose REML fit is on the boundary
        rows = simulate_runs(_design(checkpoints=2), no_checkpoint_luck, effect=0.0, rng=np.random.default_rng(seed))
        result = fit_checkpoint_model(rows, FACTORS)
        if "checkpoint" in result.zero_variance_levels:
            break
    else:
        pytest.fail("no draw put the checkpoint variance at zero")
    factor_sentences = [s for s in result.reading() if s.startswith(("vocabulary =", "masking ="))]
    assert factor_sentences and all("estimated at zero, and such fits reject a true null about 10%" in s
                                    for s in factor_sentences)
