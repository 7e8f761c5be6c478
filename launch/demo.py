#!/usr/bin/env python
"""The README's main job, the whole story on the embedded sample, in about 15 minutes on 2 CPU cores:

corpus (PubMed XML + plain-text abstracts) -> in-domain WordPiece vocabulary -> coverage report
against bert-base-uncased's -> pretraining instances -> pretraining from scratch (in-domain and
general vocabulary) and continual pretraining of all-MiniLM-L6-v2, the same budget each, through
DeepSpeed -> fine-tuning each on NCBI-disease with 3 seeds -> comparison table, plots and the
multilevel analysis.

    python launch/demo.py [--output_dir runs/demo] [--scale 1]

``--scale`` is the knob for real hardware: it multiplies the pretraining steps and the fine-tuning
examples (from 20 on, fine-tuning uses all of NCBI-disease). Each step is the entry script a user
runs by hand, printed before it runs; re-running resumes (finished steps are skipped).
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from biomed_lm.config import parse_config
from biomed_lm.errors import BiomedLMError, bad_input, exits_cleanly_on_interrupt
from biomed_lm.reference_models import general_bert_dir
from biomed_lm.step_process import run_step_process

LAUNCH_DIR = Path(__file__).resolve().parent
DEMO_CONFIG = "configs/ablation/demo.yaml"  # shipped: found from any directory
FULL_DATA_SCALE = 20


@dataclass
class DemoConfig:
    output_dir: str = field(default="runs/demo", metadata={"help": "where every step writes its outputs"})
    scale: float = field(default=1.0, metadata={
        "help": "multiplies pretraining steps and fine-tuning examples (from 20: all of NCBI-disease)", "gt": 0})
    num_proc: int = field(default=2, metadata={"help": "worker processes for corpus and data preparation",
                                               "min": 0})


def run_step(title: str, script: str, args: list[str]) -> None:
    """Run launch/<script> with ``args`` (the launch/ folder of this checkout or installed package)."""
    print(f"\n=== {title}\n$ {shlex.join(['python', f'launch/{script}', *args])}", flush=True)
    started = time.perf_counter()
    returncode = run_step_process([sys.executable, str(LAUNCH_DIR / script), *args])  # Ctrl-C: the step stops first
    if returncode != 0:
        raise SystemExit(f"demo: step '{title}' failed with exit status {returncode}")
    print(f"--- {title}: {time.perf_counter() - started:.1f} s", flush=True)


def scaled(config, scale: float):
    """The demo ablation at ``scale``: more pretraining steps and fine-tuning examples."""
    if scale <= 0:
        raise SystemExit("demo: --scale must be positive")
    config.pretrain.max_steps = max(1, round(config.pretrain.max_steps * scale))
    finetune = dict(config.finetune)
    for key in ("max_train_examples", "max_eval_examples"):
        finetune[key] = None if scale >= FULL_DATA_SCALE else max(1, round(finetune[key] * scale))
    return dataclasses.replace(config, finetune=finetune)


@exits_cleanly_on_interrupt("demo",
                            "finished steps are kept: the same command skips them and goes on")
def main(argv: list[str] | None = None) -> int:
    from biomed_lm.experiments.ablation import load_ablation_config, run_ablation

    try:
        (args,) = parse_config([DemoConfig], argv, description=__doc__)
    except (BiomedLMError, FileNotFoundError) as err:
        return bad_input("demo", err)
    out = Path(args.output_dir)
    config = scaled(load_ablation_config(DEMO_CONFIG, {"output_dir": str(out / "ablation"),
                                                       "num_proc": args.num_proc}), args.scale)
    print(f"demo: the whole pipeline at scale {args.scale:g} "
          f"({'about 15 minutes on 2 CPU cores' if args.scale == 1 else 'scaled up'}); outputs in {out}", flush=True)
    started = time.perf_counter()

    record = run_ablation(config, report=False)
    ablation = Path(config.output_dir)
    run_step("coverage report: the in-domain vocabulary vs bert-base-uncased's (paper Tables 1 and 8)",
             "vocab_report.py", [
        "--tokenizers", f"bert-base-uncased={general_bert_dir()}",
        f"demo-pubmed={ablation / 'vocab' / 'in-domain-pubmed-sample'}",
        "--corpus", f"demo-corpus={ablation / 'corpus' / 'pubmed-sample'}",
        "--datasets", "NCBI-disease=data/blurb/NCBI-disease/test.tsv", "--output-dir", str(out / "vocab_report")])
    run_step("comparison: tables, plots and the multilevel analysis", "report.py", [
        "--ablation_dir", str(ablation), "--output_dir", str(out / "report")])

    print(f"\ndemo finished in {(time.perf_counter() - started) / 60:.1f} minutes")
    print(f"  coverage report: {out / 'vocab_report' / 'report.md'}")
    print(f"  comparison:      {out / 'report' / 'report.md'}  (tables, plots/, analysis.md)")
    print(f"  models:          {', '.join(v.model for v in record.variants.values())}")
    return 1 if record.failed else 0


if __name__ == "__main__":
    sys.exit(main())
