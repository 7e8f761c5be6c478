"""The entry scripts: ``python launch/<name>.py`` (or ``deepspeed launch/pretrain.py``) in a checkout,
``biomed-lm <command>`` once installed (the dispatcher is :mod:`biomed_lm.launch.cli`). Each script's
``main(argv)`` returns its exit status."""
