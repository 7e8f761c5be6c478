"""Fine-tuning on BLURB: an encoder checkpoint (BERT, RoBERTa, ALBERT, ELECTRA, DeBERTa-v2, GPT-2,
...) on the 13 datasets of six task families (NER, PICO, relation extraction, sentence similarity,
document classification, question answering), one run or a sweep over a grid × seeds with dev-set
model selection, and the BLURB score.

* :mod:`.blurb`: the registry of the datasets; :mod:`.readers` (:mod:`.datasets`): their files as
  typed examples in splits;
* :mod:`.model_check`, :mod:`.model_families`: is the checkpoint fine-tunable, and how its
  architecture's tokenizer is prepared and its encoder fed;
* :mod:`.adapters`: one per task family (featurization, head, decoding); :mod:`.modeling`: the
  heads on the encoder; :mod:`.relation_inputs`, :mod:`.tagging`: relation inputs and tagging schemes;
* :mod:`.trainer`: one run (``launch/finetune.py``); :mod:`.metrics`: BLURB's metrics and score;
* :mod:`.sweep`, :mod:`.sweep_report`: the BLURB protocol over many runs (``launch/blurb.py``) and
  a multi-model sweep study (``launch/sweep_report.py``).
"""
