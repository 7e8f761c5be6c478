#!/usr/bin/env python
"""BERT pretraining (MLM + NSP, whole-word masking) through DeepSpeed; ALBERT and RoBERTa with --architecture.

    deepspeed launch/pretrain.py --config configs/pretrain/pubmedbert_phase1.yaml [--flag value ...]
    deepspeed --num_gpus 2 launch/pretrain.py --config configs/pretrain/demo.yaml   # 2 ranks (gloo on CPU)
    deepspeed --hostfile hostfile launch/pretrain.py --config ...                    # multi-node
    torchrun --nproc_per_node 2 launch/pretrain.py --config ...
    python launch/pretrain.py --config configs/pretrain/demo.yaml                    # one process

A run directory (--output-dir) holds checkpoints/, metrics.jsonl and model/ (the final export);
re-running the same command resumes from the newest verified checkpoint. One run at a time owns
it (``run.lock``): a second run on the same directory is refused. Exit status: 0 finished, or
stopped cleanly by SIGTERM/SIGUSR1/SIGINT or the time budget (checkpoint written); 1 a checkpoint
could not be written (the message names the folder and why: disk full, file too large,
permission), another rank is gone (killed, out of memory: the message names the checkpoint to resume
from) or another failure during training (the previous checkpoints are kept); 2 unusable
options or inputs, a run directory in use by another run, no verified checkpoint to resume from,
or settings that differ from the checkpoint's (nothing was trained); 3 aborted after too many
skipped (non-finite or spiking) steps in a row, or on a last step whose loss shows broken weights
(checkpoints that may hold the damage are set aside; the one left to resume from is healthy).
"""

from __future__ import annotations

import logging
import signal
import sys

from biomed_lm.backend import LostRank, end_distributed
from biomed_lm.config import parse_config
from biomed_lm.errors import BiomedLMError, bad_input, exits_cleanly_on_interrupt
from biomed_lm.pretrain.adversarial import AdversarialConfig
from biomed_lm.pretrain.checkpoint import CheckpointSaveError
from biomed_lm.pretrain.config import DataArguments, ModelArguments, TrainArguments
from biomed_lm.pretrain.trainer import EXIT_DIVERGED, DivergenceAbort, train


@exits_cleanly_on_interrupt("pretrain",
                            "checkpoints already written are kept: the same command resumes from the newest")
def main(argv: list[str] | None = None) -> int:
    # The deepspeed launcher appends --local_rank=N; LOCAL_RANK in the environment says the same.
    argv = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("--local_rank")]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        model_args, data_args, train_args, adversarial = parse_config(
            [ModelArguments, DataArguments, TrainArguments, AdversarialConfig], argv, description=__doc__)
        summary = train(model_args, data_args, train_args, adversarial)
    except DivergenceAbort as err:
        print(f"pretrain: aborted: {err}", file=sys.stderr)
        return EXIT_DIVERGED
    except (CheckpointSaveError, LostRank) as err:
        print(f"pretrain: error: {err}", file=sys.stderr)
        return 1
    except (BiomedLMError, FileNotFoundError) as err:
        end_distributed()  # every rank raises these before training starts: none is left in a collective
        return bad_input("pretrain", err)
    end_distributed()
    if summary["completed"] and summary["model_dir"]:
        print(f"pretrain: finished {summary['step']} steps; model exported to {summary['model_dir']}")
    # The run is over and said so. The interpreter's exit (a second or two with torch and DeepSpeed loaded)
    # resets Python's handlers first, so a Ctrl-C then killed the process by SIGINT, status -2, without a
    # word (QA: a second Ctrl-C a second after the first); there is nothing left for it to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return 0


if __name__ == "__main__":
    sys.exit(main())
