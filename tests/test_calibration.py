"""experiments.calibration and launch/calibrate.py: the report's analysis keeps its false-positive
rate near α on simulated ablations shaped like the shipped configs (a fast guard with fewer
simulations than docs/calibration.md's 500), paper 000's unguarded p-values do not, and the
balanced-design power formula agrees with simulated power."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from biomed_lm.errors import ConfigError
from biomed_lm.experiments.calibration import (PAPER000_AS_PRINTED, AblationDesign, CalibrationResult,
                                               VarianceComponents, approximate_power, calibrate, calibration_markdown,
                                               minimum_design, simulate_runs)

REPO = Path(__file__).resolve().parents[1]
PAPER = VarianceComponents.paper000()


def _shipped(name: str, pretrain_seeds: int | None = None) -> AblationDesign:
    return AblationDesign.from_ablation_config(REPO / "configs" / "ablation" / f"{name}.yaml", pretrain_seeds)


def test_components_follow_paper000():
    assert PAPER.checkpoint + PAPER.checkpoint_x_dataset == pytest.approx(9.29)
    assert PAPER.seed == pytest.approx((22.96 + 38.59) / 4)
    assert PAPER.residual == pytest.approx(2 * ((22.96 + 38.59) / 3 + PAPER.setting))
    assert VarianceComponents.paper000(0.0).checkpoint == 0.0
    with pytest.raises(ConfigError, match="checkpoint_share"):
        VarianceComponents.paper000(1.5)


def test_designs_of_the_shipped_configs():
    demo, tiny, recipe = _shipped("demo"), _shipped("tiny"), _shipped("pubmedbert")
    assert demo.pretrain_seeds == 1 and len(demo.variants) == 3 and demo.seeds == {"ncbi-disease": 3}
    assert tiny.pretrain_seeds >= 2 and recipe.pretrain_seeds >= 2
    assert len(recipe.variants) == 6 and len(recipe.seeds) == 13 and len(recipe.settings) == 6
    assert _shipped("demo", 2).pretrain_seeds == 2


def test_simulated_runs_have_the_report_columns_and_shape():
    design = _shipped("tiny")
    rows = simulate_runs(design, PAPER, 2.0, np.random.default_rng(0))
    assert len(rows) == design.n_runs
    assert {"variant", "checkpoint", "dataset", "seed", "learning_rate", "batch_size", "test_score",
            "vocabulary", "masking"} <= set(rows.columns)
    assert rows.groupby("variant")["checkpoint"].nunique().eq(design.pretrain_seeds).all()


def test_false_positive_rate_is_near_alpha_and_paper000_unguarded_is_not():
    """150 null simulations of the demo at 2 checkpoints per variant: the report's analysis rejects
    at a rate within [1%, 10%] (docs/calibration.md has the 500-simulation figures; a rate of 5% gives
    [2.7%, 9.3%] at this size); paper 000's p-values on the demo as shipped (one checkpoint per
    variant) reject more often than α (9.4% in 500 simulations; 10 of these 60) — the flaw the checkpoint
    model fixes."""
    ours = calibrate(_shipped("demo", 2), PAPER, effects=(0.0,), simulations=150, seed=1)
    row = ours.rows[0]
    assert row["tested"] == 150
    assert 0.01 <= row["rate"] <= 0.10
    # Issue 22, item 8: the fits whose checkpoint variance REML puts at zero are counted apart, and
    # they are the ones that reject (docs/calibration.md had them as the conservative case; its
    # 500-simulation rate there is 7.3%, here 48 such fits give too wide an interval to say more)
    assert 20 <= row["zero_tested"] < 150 and 1 <= row["zero_rejected"] <= row["rejected"]
    others = (row["rejected"] - row["zero_rejected"]) / (row["tested"] - row["zero_tested"])
    assert row["zero_rate"] > others and row["zero_rate_low"] <= row["zero_rate"] <= row["zero_rate_high"]
    unguarded = calibrate(_shipped("demo"), PAPER, effects=(0.0,), simulations=60, seed=1,
                          specification=PAPER000_AS_PRINTED)
    assert unguarded.rows[0]["rate_low"] > 0.07
    withheld = calibrate(_shipped("demo"), PAPER, effects=(0.0,), simulations=5)
    assert withheld.rows[0]["tested"] == 0 and math.isnan(withheld.rows[0]["rate"])


def test_power_formula_matches_simulated_power():
    design = AblationDesign("t", _shipped("tiny").variants, _shipped("tiny").factors, 4, {"a": 3}, ((1e-5, 16),))
    quiet = VarianceComponents(checkpoint=1.0, checkpoint_x_dataset=0.5, seed=0.5, setting=0.0, residual=1.0)
    formula = approximate_power(design, quiet, 2.0)
    assert 0.4 < formula < 0.95
    simulated = calibrate(design, quiet, effects=(2.0,), simulations=80, seed=2).rows[0]
    assert simulated["rate_low"] - 0.05 <= formula <= simulated["rate_high"] + 0.05
    assert approximate_power(design, quiet, 0.0) == pytest.approx(0.05)
    assert math.isnan(approximate_power(design.with_(pretrain_seeds=1, variants=design.variants[:3]), quiet, 1.0))


def test_minimum_design_reaches_the_power_it_claims():
    design = _shipped("tiny")
    quiet = VarianceComponents(checkpoint=0.2, checkpoint_x_dataset=0.2, seed=0.5, setting=0.0, residual=1.0)
    rows = minimum_design(design, quiet, effect=1.0)
    for row in rows:
        k = row["checkpoints_per_variant"]
        assert k is not None and row["power"] >= 0.8
        fewer = design.with_(seeds={d: row["seeds"] for d in design.seeds}, pretrain_seeds=k - 1)
        assert k == 2 or approximate_power(fewer, quiet, 1.0) < 0.8


def test_result_round_trip_and_markdown():
    result = calibrate(_shipped("demo", 2), PAPER, effects=(0.0, 2.0), simulations=4)
    back = CalibrationResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert back.design == result.design and back.rows[0]["rejected"] == result.rows[0]["rejected"]
    text = calibration_markdown([back], minimum_design(back.design, PAPER), "demo")
    assert "| demo (2 checkpoints/variant) | 18 | report (checkpoints) | 4 |" in text
    assert "| false positives (effect 0) | false positives, checkpoint variance estimated at zero |" in text
    zero = back.rows[0]["zero_tested"]
    assert (f" of {zero} fits |" if zero else "% | — |") in text
    assert "power at 2 points" in text and "checkpoints per variant" in text


def test_command_writes_and_resumes(tmp_path, capsys):
    from biomed_lm.launch.calibrate import main

    args = ["--designs", "configs/ablation/demo.yaml", "configs/ablation/demo.yaml:2", "--simulations", "3",
            "--effects", "0", "1", "--output_dir", str(tmp_path)]
    assert main(args) == 0
    saved = sorted(p.name for p in tmp_path.glob("*.json"))
    assert saved == ["demo-k1-checkpoints.json", "demo-k1-paper000-as-printed.json", "demo-k2-checkpoints.json"]
    table = (tmp_path / "calibration.md").read_text()
    assert "no test (withheld)" in table and "paper 000's p-values, unguarded" in table
    capsys.readouterr()
    assert main(args) == 0
    assert capsys.readouterr().out.count("already done") == 3
    assert main(["--designs", "configs/ablation/demo.yaml:two", "--output_dir", str(tmp_path)]) == 2
    # a share out of [0, 1] is refused up front, with the message, not after the simulations
    assert main(args + ["--minimum_shares", "0.5", "1.5"]) == 2
    assert "checkpoint_share must be in [0, 1], got 1.5" in capsys.readouterr().err


def test_the_docs_state_the_zero_variance_rate_and_do_not_call_it_conservative():
    """Issue 22, item 8: docs/calibration.md said a checkpoint variance estimated at zero makes the
    test conservative; measured, that case rejects too often. The page states its rate instead."""
    text = (REPO / "docs" / "calibration.md").read_text(encoding="utf-8")
    assert "errs on the safe side" not in text and "checkpoint variance estimated at zero" in text
    tiny = next(line for line in text.splitlines() if line.startswith("| tiny"))
    assert " fits " in tiny  # the zero-variance column: rate [interval] of how many fits
