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
