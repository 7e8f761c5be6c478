"""Experiments: ablations over pretraining variants, their reports and the multilevel analysis.

* :mod:`.choices`: the choice sets (factor levels, analysis specifications), each a Literal defined once;
* :mod:`.ablation`: the ablation config, the variant grid and the runner (``launch/ablate.py``);
* :mod:`.ablation_record`: ``ablation.json``, the versioned record the runner writes and the report reads;
* :mod:`.report`: tables, plots and the analysis of an ablation directory (``launch/report.py``);
* :mod:`.design`: the fixed-effect design and REML fitting both analyses share;
* :mod:`.analysis`: paper 000's multilevel model (groups = pretrained model × dataset);
* :mod:`.checkpoint_analysis`: the report's default model (a random intercept per pretraining run);
* :mod:`.calibration`: how often the analysis calls a factor significant (``launch/calibrate.py``).
"""
