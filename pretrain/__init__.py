"""BERT MLM + NSP pretraining (issue 3 onwards)."""
