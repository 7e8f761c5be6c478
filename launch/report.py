#!/usr/bin/env python
"""Write the report of an ablation: BLURB results per variant, plots, and the multilevel analysis.

    python launch/report.py --ablation_dir runs/demo/ablation              # make demo's ablation
    python launch/report.py --ablation_dir runs/demo/ablation --output_dir reports/demo

Reads <ablation_dir>/ablation.json (written by launch/ablate.py), the pretraining metrics and the
complete fine-tuning run.json files below <ablation_dir>/variants/ that its fine-tuning plan asks for
(runs an earlier configuration left there are counted and left out), and writes report.md (the index
to open), results.md/.csv, runs.csv, analysis.md/.json and plots/*.png to <output_dir> (default:
<ablation_dir>/report). It can be run at any time: unfinished parts are reported as absent. Warnings
(an unreadable run.json, stale runs left out, runs read from outside <ablation_dir>) go to stderr.
Exit status: 0 written, 2 unusable options, ablation directory or run record (the message names the
file and field).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from biomed_lm.config import parse_config
from biomed_lm.errors import BiomedLMError, ConfigError, bad_input, exits_cleanly_on_interrupt
from biomed_lm.experiments.choices import Specification
from biomed_lm.experiments.report import write_report


@dataclass
class ReportArgs:
    """Options of ``launch/report.py``."""

    ablation_dir: str = field(default="", metadata={"help": "directory holding ablation.json (launch/ablate.py)"})
    output_dir: str | None = field(default=None, metadata={"help": "where to write the report "
                                                                   "(default: <ablation_dir>/report)"})
    specification: Specification | None = field(default=None, metadata={
        "help": "the analysis: a random intercept per pretraining run (checkpoints), or paper 000's "
                "(pretrained model, dataset) groups (default: the ablation config's)"})

    def __post_init__(self) -> None:
        if not self.ablation_dir:
            raise ConfigError("ablation_dir is required")


@exits_cleanly_on_interrupt("report")
def main(argv: list[str] | None = None) -> int:
    try:
        (args,) = parse_config([ReportArgs], argv, description=__doc__)
        report = write_report(args.ablation_dir, args.output_dir, args.specification)
    except (BiomedLMError, FileNotFoundError) as err:
        return bad_input("report", err)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
