#!/usr/bin/env python
"""Fine-tune a checkpoint on one dataset once (one seed) and print its test score: a BLURB dataset by name,
or your own files with --task_type (their formats: docs/datasets.md, "Generic formats").

    python launch/finetune.py --config configs/finetune/ncbi_disease.yaml --model runs/my_bert/model
    python launch/finetune.py --config configs/finetune/ncbi_disease.yaml --seed 2 --output_dir runs/ft/ncbi/s2
    python launch/finetune.py --model CKPT --dataset my_re --task_type relation --negative_label none \\
        --data_dir data/my_re --output_dir runs/ft/my_re
    python launch/finetune.py --model CKPT --dataset my_qa --task_type qa --labels yes,no,maybe \\
        --data_dir data/my_qa --output_dir runs/ft/my_qa

--labels states a generic dataset's label set (NER: its entity types) and the model's label order;
without it the training file's labels are used and one seen fewer than 3 times is a warning.

The run record is output_dir/run.json; a complete one with the same settings over the same data files
(their sha256 are recorded) makes the command skip the run (and print the recorded score), so a sweep
can simply be re-run to resume; one over changed data is refused, naming the files.
Exit status: 0 done (or skipped), 2 unusable options or inputs (the message names the problem).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # checkpoints are local directories; never reach a hub

from biomed_lm.backend import LostRank, launched_rank
from biomed_lm.config import parse_config
from biomed_lm.errors import BiomedLMError, bad_input, exits_cleanly_on_interrupt, io_failure
from biomed_lm.finetune.trainer import FinetuneArgs, run_finetune


@exits_cleanly_on_interrupt("finetune",
                            "the run did not finish and is not recorded: the same command starts it again")
def main(argv: list[str] | None = None) -> int:
    try:
        (args,) = parse_config([FinetuneArgs], argv, description=__doc__)
        result = run_finetune(args, log=lambda message: print(message, file=sys.stderr))
    except (BiomedLMError, FileNotFoundError) as err:
        return bad_input("finetune", err)
    except LostRank as err:  # one of several ranks is gone: this rank's one line, not gloo's traceback
        print(f"finetune: error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # a full disk, a read-only folder, part-way
        return io_failure("finetune", err)
    record = result.record
    if launched_rank() == 0:  # every rank has the record; one prints it
        print(f"{record['dataset']} {record['metric']} test score: {record['test']['score']:.4f}"
              f"{' (skipped: already complete)' if result.skipped else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
