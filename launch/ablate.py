#!/usr/bin/env python
"""Run an ablation: pretrain every variant of a declarative grid under the same budget, fine-tune
each over the BLURB protocol, and write the report (tables, plots, multilevel analysis).

    python launch/ablate.py --config configs/ablation/tiny.yaml
    python launch/ablate.py --config configs/ablation/pubmedbert.yaml --output_dir /scratch/ablation
    python launch/ablate.py --config configs/ablation/tiny.yaml --no_report

--config (required) names the ablation YAML; experiments/ablation.py documents its keys. Re-running
the same command after an interruption continues it: finished steps and runs are skipped,
pretraining resumes from its last checkpoint.
Exit status: 0 done, 1 a step or some fine-tuning runs failed, 2 unusable config.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from biomed_lm.config import parse_config
from biomed_lm.errors import BiomedLMError, bad_input, exits_cleanly_on_interrupt
from biomed_lm.experiments.ablation import StepFailed, load_ablation_config, run_ablation


@dataclass
class AblateArgs:
    output_dir: str | None = field(default=None, metadata={"help": "override the config's output_dir"})
    data_root: str | None = field(default=None, metadata={
        "help": "the folder holding the BLURB datasets to fine-tune on (overrides the config's finetune.data_root)"})
    no_report: bool = field(default=False, metadata={"help": "skip launch/report.py's report at the end"})


@exits_cleanly_on_interrupt("ablate",
                            "finished steps and runs are kept: the same command continues")
def main(argv: list[str] | None = None) -> int:
    # --config names the ablation config, not a file of AblateArgs values as parse_config reads it: taken out first
    # (argparse: --config=PATH works too, a --config without its PATH is its usual error, exit 2)
    config_flag = argparse.ArgumentParser(prog="ablate", add_help=False)
    config_flag.add_argument("--config")
    known, rest = config_flag.parse_known_args(sys.argv[1:] if argv is None else argv)
    if known.config is None and not {"-h", "--help"} & set(rest):
        print("ablate: error: --config configs/ablation/<name>.yaml is required", file=sys.stderr)
        return 2
    try:
        (args,) = parse_config([AblateArgs], rest, description=__doc__)  # --help: prints the help, exits 0
        config = load_ablation_config(known.config, {"output_dir": args.output_dir}, data_root=args.data_root)
        record = run_ablation(config, report=not args.no_report)
    except (BiomedLMError, FileNotFoundError) as err:
        return bad_input("ablate", err)
    except StepFailed as err:
        print(f"ablate: {err}", file=sys.stderr)
        return 1
    return 1 if record.failed else 0


if __name__ == "__main__":
    sys.exit(main())
