"""Build an in-domain vocabulary from a prepared corpus or raw text (PubMedBERT step 1).

    python launch/build_vocab.py --inputs PATH [PATH ...] --output-dir DIR
        [--config configs/vocab/demo.yaml] [--vocab-size N] [--cased] [--min-frequency N]
        [--max-distinct-words N]                                                 (bound the word table)
        [--format wordpiece|sentencepiece|bytelevel-bpe]
        [--algorithm wordpiece|unigram] [--special-token-layout bert|compact]   (format wordpiece)
        [--add-prefix-space]                                                     (format bytelevel-bpe)
        [--overwrite] [--word-counts-from DIR_OR_FILE]                          (reuse another build's counts)

Formats: ``wordpiece`` (BERT, default), ``sentencepiece`` (ALBERT: a SentencePiece unigram model
used with its own segmentation, saved as spiece.model too) and ``bytelevel-bpe`` (RoBERTa). The
output directory loads with ``transformers.AutoTokenizer.from_pretrained`` and records its format,
casing and how it was built (``vocab_card.json``, with what ``--max-distinct-words`` dropped
while counting, if it was given). The logic lives in :mod:`tokenization.vocab`;
this script only turns command-line options (and an optional YAML file) into a call to it.

Exit status: 0 when every input was read whole; 1 when records or files were skipped (unreadable lines,
JSON records without the text field, empty files, files of an unknown suffix beside readable ones): the
vocabulary is still written from everything else, and the summary says how many were skipped and the
likely cause (vocab_card.json names the first 20 of each reason and counts them all); 2 for unusable
options or inputs, or when nothing could be learnt (the message says why).

Run again on a finished output directory, the same command learns nothing: it says the vocabulary is
already complete and prints its summary again (exit status as the first time); a command that would learn another one
(other input files, or files changed since, or other options) is refused with exit status 2, naming what
differs; --overwrite rebuilds.

The reading pass (hours on the full PubMed baseline) ends by saving the word counts in the output directory
(``word_counts.tsv.gz``): the same command run again after a failure in the trainer reuses them, and
``--word-counts-from`` hands them to a build of the same inputs with another vocabulary size.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import Sequence

from biomed_lm.config import parse_config
from biomed_lm.errors import BiomedLMError, bad_input, exits_cleanly_on_interrupt, io_failure
from biomed_lm.tokenization.vocab import VocabBuildResult, VocabConfig, build_vocab


@dataclass
class BuildVocabArgs:
    """Where to read from and write to (how to learn is :class:`tokenization.vocab.VocabConfig`)."""

    inputs: list[str] = field(metadata={
        "nargs": "+", "help": "prepared corpus directories, or text (one document per line), "
                              "JSONL or PubMed XML files, directories or glob patterns"})
    output_dir: str = field(metadata={"help": "directory to write the tokenizer into"})
    text_field: str = field(default="text", metadata={
        "help": "field (JSONL) or column (prepared corpus) holding the document text"})
    overwrite: bool = field(default=False, metadata={
        "help": "replace the tokenizer files in an output directory that is not empty"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar while reading"})
    word_counts_from: str | None = field(default=None, metadata={
        "help": "a finished or unfinished build's output directory (or its word_counts.tsv.gz) of the same inputs, "
                "text field, casing, format and max_distinct_words: its word counts are used and the inputs are not "
                "read (refused, naming what differs, otherwise)"})


@exits_cleanly_on_interrupt("build_vocab",
                            "no vocabulary was written: the same command starts it again, from the saved word "
                            "counts if the reading had ended")
def main(argv: Sequence[str] | None = None) -> int:
    output_dir = None  # named in a filesystem error, once the options are read
    try:
        args, config = parse_config([BuildVocabArgs, VocabConfig], argv, description=__doc__.split("\n")[0])
        output_dir = args.output_dir
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        result = build_vocab(args.inputs, args.output_dir, config, text_field=args.text_field,
                             overwrite=args.overwrite, progress=args.progress,
                             word_counts_from=args.word_counts_from)
    except (BiomedLMError, FileNotFoundError) as err:
        return bad_input("build_vocab", err)
    except OSError as err:  # a full disk, a read-only folder, part-way
        return io_failure("build_vocab", err, output_dir)
    if result.already_complete:
        print(f"build_vocab: already complete: {output_dir} holds the vocabulary this command builds (same inputs "
              "and options); pass --overwrite to rebuild it", file=sys.stderr)
    print(result.summary())
    if result.has_problems:  # prepare_corpus's rule: the vocabulary is written, but not all the input is in it
        print(f"build_vocab: warning: {problems_line(result)} (see {output_dir}/vocab_card.json)", file=sys.stderr)
        return 1
    return 0


def problems_line(result: VocabBuildResult) -> str:
    """What was left out of the vocabulary's input, and the likely cause, in one line."""
    parts = []
    if result.skipped.total:
        parts.append(f"{result.skipped.total:,} record(s) or file(s) skipped")
    if result.skipped_inputs:
        parts.append(f"{len(result.skipped_inputs)} input file(s) of an unknown suffix not read")
    cause = result.skipped.cause(result.text_field)
    return " and ".join(parts) + (f"; likely cause: {cause}" if cause else "")


if __name__ == "__main__":
    sys.exit(main())
