#!/usr/bin/env python
"""The README's main job on the embedded sample: corpus -> vocabulary -> coverage report ->
pretraining instances -> a tiny BERT pretrained from scratch (MLM + NSP, whole-word masking).

    python launch/demo.py [--output-dir runs/demo] [--vocab-size 30522]

Each step is the same entry script a user runs by hand, printed before it runs, so the demo is
also a worked example of the command lines. Re-running reuses what earlier runs parsed.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.config import parse_config
from common.reference_models import general_bert_dir

REPO = Path(__file__).resolve().parents[1]


@dataclass
class DemoConfig:
    output_dir: str = field(default="runs/demo", metadata={"help": "where every step writes its outputs"})
    vocab_size: int = field(default=30522, metadata={
        "help": "WordPiece vocabulary size requested (BERT's; the 1.7 MB sample supports about 20k tokens)"})
    num_proc: int = field(default=2, metadata={"help": "worker processes for corpus and data preparation"})
    pretrain_steps: int = field(default=40, metadata={"help": "optimizer steps of the demo pretraining run"})


def run_step(title: str, args: list[str]) -> None:
    command = [sys.executable, *args]
    print(f"\n=== {title}\n$ {shlex.join(['python', *args])}", flush=True)
    started = time.perf_counter()
    result = subprocess.run(command, cwd=REPO)
    if result.returncode != 0:
        raise SystemExit(f"demo: step '{title}' failed with exit status {result.returncode}")
    print(f"--- {title}: {time.perf_counter() - started:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    (config,) = parse_config([DemoConfig], argv, description=__doc__)
    out = Path(config.output_dir)
    corpus, vocab, report = out / "corpus", out / "vocab", out / "report"
    data, pretrain = out / "pretraining_data", out / "pretrain"
    started = time.perf_counter()

    run_step("1/5 prepare the corpus (PubMed XML + plain-text abstracts)", [
        "launch/prepare_corpus.py", "--config", "configs/corpus/demo.yaml", "--output-dir", str(corpus),
        "--num-proc", str(config.num_proc), "--overwrite"])
    run_step("2/5 build an in-domain WordPiece vocabulary", [
        "launch/build_vocab.py", "--config", "configs/vocab/demo.yaml", "--inputs", str(corpus),
        "--vocab-size", str(config.vocab_size), "--output-dir", str(vocab), "--overwrite"])
    run_step("3/5 vocabulary coverage report (paper Tables 1 and 8)", [
        "launch/vocab_report.py", "--tokenizers", f"bert-base-uncased={general_bert_dir()}",
        f"demo-pubmed={vocab}", "--corpus", f"demo-corpus={corpus}",
        "--datasets", "NCBI-disease=data/blurb/NCBI-disease/test.tsv", "--output-dir", str(report)])
    run_step("4/5 pretraining instances (sequence length 128, NSP pairs)", [
        "launch/create_pretraining_data.py", "--config", "configs/data/demo.yaml", "--corpus", str(corpus),
        "--tokenizer", str(vocab), "--output-dir", str(data), "--num-proc", str(config.num_proc), "--overwrite"])
    shutil.rmtree(pretrain, ignore_errors=True)  # a fresh run each time (a real run would resume)
    run_step("5/5 pretrain a tiny BERT from scratch (MLM + NSP, whole-word masking, DeepSpeed)", [
        "launch/pretrain.py", "--config", "configs/pretrain/demo.yaml", "--data-dir", str(data),
        "--tokenizer", str(vocab), "--output-dir", str(pretrain), "--max-steps", str(config.pretrain_steps)])

    print(f"\ndemo finished in {time.perf_counter() - started:.0f} s")
    print(f"  corpus:  {corpus}  (summary.json)")
    print(f"  vocab:   {vocab}")
    print(f"  report:  {report / 'report.md'}")
    print(f"  data:    {data}  (pretraining_data.json)")
    print(f"  model:   {pretrain / 'model'}  (metrics: {pretrain / 'metrics.jsonl'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
