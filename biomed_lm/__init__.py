"""Pieces shared by the tokenization, pretraining and fine-tuning packages."""
