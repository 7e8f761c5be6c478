#!/usr/bin/env python
"""Ingest PubMed XML / plain text / JSONL into a clean, sentence-split corpus (a datasets dataset).

    python launch/prepare_corpus.py --inputs data/sample/*.xml.gz --output-dir runs/corpus
    python launch/prepare_corpus.py --config configs/corpus/pubmed_baseline.yaml

Exit status: 0 when every input was read cleanly, 1 when some input was damaged, empty, missing or
refused (every good record was still kept; summary.json lists what was skipped), 2 for unusable
options or when no document at all could be kept (no dataset is written; the message says why).

Run again on a finished output folder, the same command builds nothing: it says the corpus is already
complete and prints its summary again (exit status as the first time); a command that would build another
corpus (other input files, or files changed since, or other settings) is refused with exit status 2,
naming what differs; --overwrite rebuilds. The number of worker processes is not a difference. A corpus
whose saved files were deleted or resized since it was built (summary.json records each one's size) is not
complete: the rerun names each such file and exits with status 2; --overwrite rebuilds it.
"""

from __future__ import annotations

import json
import sys

from biomed_lm.config import parse_config
from biomed_lm.errors import BiomedLMError, bad_input, exits_cleanly_on_interrupt, io_failure
from biomed_lm.tokenization.corpus import CorpusConfig, NoUsableInput, prepare_corpus


@exits_cleanly_on_interrupt("prepare_corpus",
                            "the stages already finished are kept in the output folder's _work/: "
                            "the same command resumes from them")
def main(argv: list[str] | None = None) -> int:
    output_dir = None  # named in a filesystem error, once the options are read
    try:
        (config,) = parse_config([CorpusConfig], argv, description=__doc__)
        output_dir = config.output_dir
        summary = prepare_corpus(config, log=_say)
    except NoUsableInput as err:
        _report_problems(err.summary["problems"])
        print(f"prepare_corpus: error: {err}", file=sys.stderr)
        return 2
    except (BiomedLMError, FileNotFoundError, FileExistsError) as err:
        return bad_input("prepare_corpus", err)
    except OSError as err:  # a full disk, a read-only folder, part-way
        return io_failure("prepare_corpus", err, output_dir)
    if summary.get("already_complete"):
        _say(f"already complete: {output_dir} holds the corpus this command builds (same inputs and settings); "
             "pass --overwrite to rebuild it")
    problems = summary["problems"]
    _report_problems(problems)
    for duplicate in summary.get("duplicate_files", []):
        print(f"prepare_corpus: warning: {duplicate['path']} has the same bytes as {duplicate['same_as']}; "
              "its records were read again (the later copy wins, none is lost)", file=sys.stderr)
    print(json.dumps({k: summary[k] for k in ("output_dir", "documents_kept", "read", "funnel", "dropped",
                                              "links", "problem_counts", "duplicate_files", "seconds")
                      if k in summary}, indent=2))
    return 1 if problems else 0


def _say(line: str) -> None:
    print(f"prepare_corpus: {line}", file=sys.stderr)


def _report_problems(problems: list[dict]) -> None:
    for problem in problems[:20]:
        where = problem["path"] + (f", line {problem['line']}" if problem["line"] is not None else "")
        where += f" (byte {problem['byte_offset']})" if problem["byte_offset"] is not None else ""
        print(f"prepare_corpus: skipped: {where}: {problem['reason']}: {problem['message']}", file=sys.stderr)
    if len(problems) > 20:
        print(f"prepare_corpus: ... and {len(problems) - 20} more problems (see summary.json)", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
