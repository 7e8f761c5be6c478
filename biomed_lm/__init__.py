"""biomed-lm: pretrain BERT-style encoders on biomedical text and compare them on BLURB.

One import name for the whole toolkit. The stages live in the repository's top-level folders and
install beneath it: ``biomed_lm.tokenization`` (corpora, vocabularies, coverage),
``biomed_lm.pretrain`` (BERT, ALBERT, RoBERTa pretraining), ``biomed_lm.finetune`` (BLURB),
``biomed_lm.experiments`` (ablations and their analysis) and the entry scripts ``biomed_lm.launch``
(with the ``biomed-lm`` command); see docs/architecture.md. This folder is the floor every stage
stands on:

* :mod:`.config`: typed configuration, from a YAML file and the command line, checked field by field;
* :mod:`.errors`: the error tree every entry script turns into exit status 2;
* :mod:`.backend`: the DeepSpeed config and the distributed start both trainers share;
* :mod:`.optim`: the optimizers (AdamW, LAMB with a logged fallback chain) and learning-rate
  schedules both trainers build;
* :mod:`.token_types`: when an encoder is given ``token_type_ids``, for both stages;
* :mod:`.resources`, :mod:`.reference_models`: the shipped configs and sample data, and the packaged
  general-domain BERT;
* :mod:`.reporting`: how reports write durations and save figures.
"""
