#!/usr/bin/env python
"""Compare several models' BLURB sweeps (paper 001's study): dev-score heatmaps over learning rate ×
batch size per model and dataset, and a table of time, throughput and peak memory per model.

    python launch/sweep_report.py --sweeps bert=runs/blurb/bert biobert=runs/blurb/biobert \\
        --output_dir runs/study/ner

Each sweep is NAME=DIR (or DIR, labelled by its directory name), a directory written by
launch/blurb.py for one model. Writes <output_dir>/sweep_report.md (the page to open),
sweep_report.json (the same numbers) and figures/*.png.
Exit status: 0 written, 2 unusable options, sweep directory or run record (the message names it).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from biomed_lm.config import parse_config
from biomed_lm.errors import BiomedLMError, ConfigError, bad_input, exits_cleanly_on_interrupt
from biomed_lm.finetune.sweep_report import parse_sweep_specs, write_sweep_report


@dataclass
class SweepReportArgs:
    """Options of ``launch/sweep_report.py``."""

    sweeps: list[str] = field(default_factory=list, metadata={
        "help": "NAME=DIR per model (or DIR, labelled by its name): sweep directories of launch/blurb.py"})
    output_dir: str = field(default="", metadata={"help": "where to write sweep_report.md and figures/"})

    def __post_init__(self) -> None:
        if not self.sweeps:
            raise ConfigError("sweeps is required: NAME=DIR for each model's sweep directory")
        if not self.output_dir:
            raise ConfigError("output_dir is required")


@exits_cleanly_on_interrupt("sweep_report")
def main(argv: list[str] | None = None) -> int:
    try:
        (args,) = parse_config([SweepReportArgs], argv, description=__doc__)
        report = write_sweep_report(parse_sweep_specs(args.sweeps), args.output_dir)
    except (BiomedLMError, FileNotFoundError) as err:
        return bad_input("sweep_report", err)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
