"""The entry scripts: ``python launch/<name>.py`` (or ``deepspeed launch/pretrain.py``) in a checkout,
``biomed-lm <command>`` once installed (see biomed_lm.cli). Each script's ``main(argv)`` returns its
exit status."""
