"""Experiments: ablations over pretraining variants, their reports and the multilevel analysis."""
