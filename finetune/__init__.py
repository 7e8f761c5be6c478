"""BLURB fine-tuning (issue 5 onwards)."""
