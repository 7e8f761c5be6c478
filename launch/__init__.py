"""The entry scripts: ``python launch/<name>.py`` (or ``deepspeed launch/pretrain.py``) in a checkout,
``biomed-lm <command>`` once installed (the dispatcher is :mod:`biomed_lm.launch.cli`). Each script's
``main(argv)`` returns its exit status.

* corpus and vocabulary: ``prepare_corpus``, ``build_vocab``, ``vocab_report``;
* pretraining: ``create_pretraining_data``, ``pretrain``;
* fine-tuning: ``finetune`` (one run), ``blurb`` (the BLURB protocol), ``sweep_report``;
* experiments: ``ablate``, ``report``, ``calibrate``;
* end to end: ``recipe`` (one system of the papers), ``demo`` (the README's walk-through on the sample).
"""
