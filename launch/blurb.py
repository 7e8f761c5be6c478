#!/usr/bin/env python
"""Fine-tune one checkpoint over the BLURB datasets (grid × seeds), select on dev, print the BLURB score.

    python launch/blurb.py --model runs/my_bert/model --data_root /data/blurb --output_dir runs/blurb/my_bert
    python launch/blurb.py --config configs/blurb/smoke.yaml --model CKPT --output_dir runs/blurb/smoke \\
        --datasets ncbi-disease gad
    python launch/blurb.py --config configs/blurb/paper.yaml --model CKPT --output_dir runs/blurb/ckpt \\
        --data_root /data/blurb --parallel_runs 8        # 8 runs at a time, one GPU each

Every run writes <output_dir>/<dataset>/<grid point>/seed<N>/run.json; re-running the same command
after an interruption skips the finished runs. The table goes to <output_dir>/blurb.md (and stdout),
everything else to <output_dir>/summary.json. Datasets that are not found under data_root are
listed as absent and the score is marked partial.
Exit status: 0 all present datasets finished, 1 some runs failed, 2 unusable options.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # checkpoints are local directories; never reach a hub

from biomed_lm.backend import LostRank, end_distributed, launched_rank
from biomed_lm.config import parse_config
from biomed_lm.errors import BiomedLMError, bad_input, exits_cleanly_on_interrupt
from biomed_lm.finetune.sweep import SweepArgs, format_table, run_sweep
from biomed_lm.finetune.sweep_pool import WorkerLost

EXIT_FAILED_RUNS = 1


@exits_cleanly_on_interrupt("blurb",
                            "finished runs are kept: the same command skips them and goes on")
def main(argv: list[str] | None = None) -> int:
    # The deepspeed launcher appends --local_rank=N; LOCAL_RANK in the environment says the same.
    argv = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("--local_rank")]
    try:
        (args,) = parse_config([SweepArgs], argv, description=__doc__)
        summary = run_sweep(args, log=lambda message: print(message, file=sys.stderr))
    except (BiomedLMError, FileNotFoundError) as err:
        end_distributed()  # every rank raises these together (a lock refusal too): none is left in a collective
        return bad_input("blurb", err)
    except (LostRank, WorkerLost) as err:  # the sweep cannot go on without its peers; its finished runs are kept
        print(f"blurb: error: {err}", file=sys.stderr)
        return 1
    if launched_rank() == 0:  # every rank has the summary; one prints it
        print(format_table(summary))
    return EXIT_FAILED_RUNS if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
