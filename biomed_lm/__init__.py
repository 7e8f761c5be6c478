"""biomed-lm: pretrain BERT-style encoders on biomedical text and compare them on BLURB.

One import name for the whole toolkit. This folder holds what every stage shares (typed
configuration, the error tree, shipped resources, report helpers, the ``biomed-lm`` command); the
stages live in the repository's top-level folders and install beneath it:
``biomed_lm.tokenization``, ``biomed_lm.pretrain``, ``biomed_lm.finetune``,
``biomed_lm.experiments`` and the entry scripts ``biomed_lm.launch`` (see docs/architecture.md).
"""
