"""Corpus ingestion, WordPiece vocabularies and vocabulary coverage reports."""
