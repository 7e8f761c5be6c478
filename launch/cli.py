"""``biomed-lm <command> [options]``: every entry script of launch/ as one console command.

``biomed-lm pretrain --config configs/pretrain/demo.yaml`` is ``python launch/pretrain.py --config
...`` in a checkout; shipped configs and sample data are found from any directory (see
biomed_lm.resources). Several ranks: ``deepspeed --module biomed_lm.launch.pretrain ...``.

The dispatcher lives here, in the top layer, because it loads the entry scripts: the shared floor
(``biomed_lm/``) imports nothing above it (``tests/test_architecture.py``). setup.py's console
script is ``biomed_lm.launch.cli:main``.
"""

from __future__ import annotations

import difflib
import importlib
import re
import sys
from typing import Sequence

#: command → (module of launch/, what it does)
COMMANDS: dict[str, tuple[str, str]] = {
    "corpus": ("prepare_corpus", "ingest PubMed XML / text / JSONL into a sentence-split corpus"),
    "vocab": ("build_vocab", "build an in-domain WordPiece vocabulary from a corpus"),
    "vocab-report": ("vocab_report", "vocabulary coverage: shattered terms, input lengths"),
    "data": ("create_pretraining_data", "turn a corpus into MLM + pair-objective (NSP, SOP, DRP) instances"),
    "pretrain": ("pretrain", "BERT pretraining (MLM + NSP) through DeepSpeed"),
    "finetune": ("finetune", "fine-tune a checkpoint on one dataset (BLURB's, or your own) with one seed"),
    "blurb": ("blurb", "fine-tune over the BLURB datasets (grid × seeds) and score"),
    "sweep-report": ("sweep_report", "compare several models' BLURB sweeps"),
    "ablate": ("ablate", "run an ablation grid: pretrain, fine-tune and report every variant"),
    "report": ("report", "tables, plots and the multilevel analysis of an ablation"),
    "recipe": ("recipe", "one system of the papers end to end (pubmedbert, bioalbert, ...; --list)"),
    "calibrate": ("calibrate", "the calibration study of the ablation analysis"),
    "demo": ("demo", "the whole pipeline on the embedded PubMed sample"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    return ("usage: biomed-lm <command> [options]   (biomed-lm <command> --help for its options)\n\ncommands:\n"
            + "\n".join(lines))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)  # no command is an error: its usage goes to stderr
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        near = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        print(f"biomed-lm: unknown command {command!r}{hint}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"biomed_lm.launch.{COMMANDS[command][0]}")
    sys.argv = [f"biomed-lm {command}", *rest]  # so argparse's usage line names the command
    module.__doc__ = as_console_commands(module.__doc__)  # its --help text: the examples an installed user can run
    return module.main(rest)


_SCRIPT = re.compile(r"(?:\S*python3?\s+)?launch/(\w+)\.py")


def as_console_commands(text: str | None) -> str | None:
    """An entry script's text with its checkout commands as the console command runs them: ``python
    launch/pretrain.py`` → ``biomed-lm pretrain``, ``deepspeed ... launch/pretrain.py`` → ``deepspeed ...
    --module biomed_lm.launch.pretrain``, ``torchrun ... launch/pretrain.py`` → ``torchrun ... -m ...`` (QA: an
    installed user's --help showed commands naming a launch/ folder they do not have)."""
    if not text:
        return text
    command_of = {module: name for name, (module, _) in COMMANDS.items()}
    return "\n".join(_SCRIPT.sub(lambda found: _console_form(found, line, command_of), line)
                     for line in text.split("\n"))


def _console_form(found: re.Match, line: str, command_of: dict[str, str]) -> str:
    module = found.group(1)
    before = line[:found.start()].split()
    if "deepspeed" in before:
        return f"--module biomed_lm.launch.{module}"
    if "torchrun" in before:
        return f"-m biomed_lm.launch.{module}"
    return f"biomed-lm {command_of[module]}" if module in command_of else found.group(0)


if __name__ == "__main__":
    sys.exit(main())
