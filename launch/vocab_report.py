"""Compare vocabularies (WordPiece, SentencePiece, byte-level BPE) on biomedical terms, corpora and BLURB
datasets (the paper's Tables 1 and 8): how often each vocabulary shatters words, how long it makes inputs, how
the vocabularies overlap. Writes report.md, report.json and PNG plots into --output-dir.

Example (the shipped data/ and configs/ paths work from any directory):

    python launch/vocab_report.py \\
        --tokenizers bert=/path/to/bert-base-uncased pubmed=runs/demo/vocab \\
        --corpus data/sample/sywada_PubMedAbstract_1MB.txt \\
        --datasets NCBI-disease=data/blurb/NCBI-disease/test.tsv \\
        --output-dir runs/vocab_report

A tokenizer is NAME=PATH, PATH a tokenizer directory (WordPiece, SentencePiece or byte-level BPE),
a bare vocab.txt (WordPiece) or a bare SentencePiece .model file; each segments words with its own
algorithm. Its casing is what the directory records or, for a bare file, inferred (uppercase
tokens mean cased), unless --casing NAME=cased|uncased sets it. Corpora and datasets are [NAME=]PATH
(the name defaults to the file or directory name). A corpus file is read by its suffix, as
launch/prepare_corpus.py reads it (.txt/.text, .jsonl/.json/.ndjson, .xml, each optionally .gz; a file
of another suffix in a folder is skipped and listed, one named alone is refused). A dataset directory
means all its data files, each file's format detected from its content unless --dataset-format
[NAME=]FORMAT names it; a file that looks like data (a split's name such as train.tsv, or the start of the
other files' layout) but has a bad line is refused naming the line, and only what is clearly not data
(documentation, an empty file, a ground-truth map) is skipped. Every skipped file is named on stderr.

Progress bars (one per source, while its model inputs are read and while its words are segmented)
go to stderr; --no-progress turns them off. A report written into a folder that holds an earlier
one replaces it: the earlier report's plots that the new one does not draw (sources left out this
time) are removed, any other file is left alone.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from biomed_lm.config import parse_config
from biomed_lm.errors import BiomedLMError, InputError, bad_input, exits_cleanly_on_interrupt
from biomed_lm.finetune.blurb import FORMER_LAYOUT_NAMES, file_layout_name
from biomed_lm.resources import resolve_path
from biomed_lm.tokenization.coverage import ReportSettings, build_report, load_vocabulary, read_terms, write_report
from biomed_lm.tokenization.blurb_files import FILE_LAYOUTS
from biomed_lm.tokenization.model_inputs import Source, corpus_source, dataset_source
from biomed_lm.tokenization.sources import SET_ASIDE, Problem, corpus_files, is_pattern, is_prepared_corpus

DEFAULT_TERMS = "configs/terms/pubmedbert_table1.txt"  # shipped: found from any directory
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*\Z")
CASINGS = {"cased": False, "uncased": True}


@dataclass
class VocabReportArguments:
    tokenizers: list[str] = field(metadata={
        "help": "NAME=PATH for each tokenizer to compare (a WordPiece, SentencePiece or byte-level BPE tokenizer "
                "directory, a vocab.txt or a SentencePiece .model file); "
                "the first is the baseline that relative changes are measured against"})
    output_dir: str = field(metadata={"help": "where report.md, report.json and the plots are written"})
    terms: str = field(default=DEFAULT_TERMS, metadata={
        "help": "term list (term<TAB>category per line, '#' comments); an empty string skips the term table"})
    corpus: list[str] = field(default_factory=list, metadata={
        "help": "[NAME=]PATH of a corpus: a prepared corpus directory, text (.txt, .text: one document per line), "
                "JSONL (.jsonl, .json, .ndjson) or PubMed XML (.xml) files (each optionally .gz), a directory or "
                "a glob; a model input is a document"})
    datasets: list[str] = field(default_factory=list, metadata={
        "help": "[NAME=]PATH of a BLURB-format dataset file or directory; a model input is what the task "
                "feeds the model (a sentence, an example, a pair, question + context)"})
    dataset_format: list[str] = field(default_factory=list, metadata={
        "help": f"[NAME=]FORMAT to name a dataset's format instead of detecting it; a bare FORMAT applies "
                f"to every dataset. Formats (file layouts): {', '.join(FILE_LAYOUTS)}; the former names "
                f"{', '.join(FORMER_LAYOUT_NAMES)} still work"})
    casing: list[str] = field(default_factory=list, metadata={
        "help": "NAME=cased|uncased to set a tokenizer's casing instead of the recorded or inferred one"})
    text_field: str = field(default="text", metadata={"help": "the text field of JSONL corpora and prepared corpora"})
    max_inputs: int | None = field(default=None, metadata={
        "help": "read at most this many model inputs per source (documents of a corpus, task inputs of a "
                "dataset)", "min": 1, "aliases": ["--max_instances", "--max-instances"]})
    top_words: int = field(default=20, metadata={"help": "rows in each most-shattered-words table", "min": 0})
    min_pieces: int = field(default=2, metadata={
        "help": "a word is shattered when split into at least this many pieces", "min": 2})
    progress: bool = field(default=True, metadata={
        "help": "show progress bars on stderr while each source is read and segmented"})


def split_named(spec: str, what: str, name_required: bool) -> tuple[str, str]:
    """``NAME=VALUE`` -> (NAME, VALUE); without a name (where allowed) the name is the path's
    last component (a file keeps its directory: ``NCBI-disease/test.tsv``)."""
    name, sep, value = spec.partition("=")
    if sep and NAME.match(name) and value:
        return name, value
    if name_required:
        raise InputError(f"{what} {spec!r}: expected NAME=VALUE, NAME made of letters, digits and _.+- "
                         "(e.g. bert=/models/bert-base-uncased)")
    path = resolve_path(spec)  # named alike from any directory, the shipped data/ included
    return (f"{path.parent.name}/{path.name}" if path.is_file() and path.parent.name else path.name or spec), spec


def named_options(specs: list[str], what: str, known: list[str]) -> dict[str, str]:
    """Per-name options (``NAME=VALUE``) whose names must be among ``known``."""
    options: dict[str, str] = {}
    for spec in specs:
        # the name as it is known, not held to NAME: a dataset's default name has a '/' (NCBI-disease/test.tsv)
        name, _, value = spec.rpartition("=")
        if not name or not value:
            split_named(spec, what, name_required=True)  # says what the option expects
        if name not in known:
            raise InputError(f"{what} {spec!r}: {name!r} is not one of {', '.join(known) or 'none'}")
        options[name] = value
    return options


def _layout(name: str | None) -> str | None:
    """A --dataset-format value as a file layout's name: a former name (a dataset or task family whose
    files have the layout, finetune.blurb.FORMER_LAYOUT_NAMES) is the layout it stood for."""
    return None if name is None else file_layout_name(name)


def corpus(spec: str, text_field: str) -> Source:
    """A --corpus source: the path resolved as prepare_corpus resolves its inputs (the shipped
    data/sample/... from any directory), its files held to prepare_corpus's suffixes by the same rule
    (:func:`tokenization.sources.corpus_files`): a file of another suffix beside readable ones is
    skipped and listed in the report, and an input with nothing readable is refused."""
    name, path = split_named(spec, "--corpus", name_required=False)
    path = path if is_pattern(path) else str(resolve_path(path))
    skipped: list[Problem] = []
    if (os.path.exists(path) or is_pattern(path)) and not is_prepared_corpus(path):
        files, problems = corpus_files([path], how_to_read="or a corpus prepared by launch/prepare_corpus.py "
                                       "(its --format text, jsonl or xml reads other suffixes)")
        skipped = [problem for problem in problems if problem.reason in SET_ASIDE]
        if skipped and not files:
            more = f" (and {len(skipped) - 1} more file(s))" if len(skipped) > 1 else ""
            where = "" if skipped[0].path == path else f"{skipped[0].path}{more}: "
            raise InputError(f"--corpus {spec}: {where}{skipped[0].message}")
    source = corpus_source(name, path, text_field=text_field)
    return replace(source, skipped=tuple(f"{problem.path}: {problem.message}" for problem in skipped))


def dataset(name: str, path: str, fmt: str | None) -> Source:
    """A --datasets source; a file, or a directory of files, with nothing in it is refused as empty
    (format detection would only say it fits no format, and naming a format cannot help)."""
    resolved = resolve_path(path)
    if resolved.is_dir():
        files = sorted(f for f in resolved.rglob("*") if f.is_file() and not f.name.startswith("."))
    else:
        files = [resolved] if resolved.is_file() else []
    if files and all(_is_blank(f) for f in files):
        what = f"{resolved} is empty" if resolved.is_file() else \
            f"every file in {resolved} is empty ({', '.join(f.name for f in files[:5])})"
        raise InputError(f"dataset {name!r}: {what}: no example to read")
    return dataset_source(name, str(resolved), _layout(fmt))


def _is_blank(path: Path) -> bool:
    """True for a file with nothing but whitespace (only small files are read to tell)."""
    size = path.stat().st_size
    return size == 0 or (size <= 4096 and not path.read_bytes().strip())


def say_skipped(sources: list[Source]) -> None:
    """Name on stderr each file of a source's folder that is not read (documentation, an empty file, a file of
    another suffix or that fits no dataset format): report.json alone listed them, so a data file skipped for a
    bad line went unnoticed (QA). A licence or README is not named: every BLURB folder ships one."""
    for source in sources:
        for entry in source.skipped:
            if not entry.endswith("documentation, not data") and ": not_corpus: " not in entry:
                print(f"vocab_report: {source.name}: skipped {entry}", file=sys.stderr)


def check_output_folder(path: str) -> None:
    """Refuse an --output-dir that cannot become the report's folder (a file, or a folder under one, or one
    that may not be written) before any work, rather than after every source was read; it is created when
    the report is written, so that a run refused for its inputs leaves nothing behind."""
    target = Path(path).absolute()
    existing = next(p for p in (target, *target.parents) if p.exists())
    if not existing.is_dir():
        raise InputError(f"--output-dir {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"--output-dir {path}: {existing} may not be written")


def run(args: VocabReportArguments) -> int:
    check_output_folder(args.output_dir)
    tokenizers = [split_named(spec, "--tokenizers", name_required=True) for spec in args.tokenizers]
    names = [name for name, _ in tokenizers]
    casings = named_options(args.casing, "--casing", names)
    unknown = sorted(v for v in casings.values() if v not in CASINGS)
    if unknown:
        raise InputError(f"--casing: {', '.join(unknown)} is not one of {', '.join(CASINGS)}")

    datasets = [split_named(spec, "--datasets", name_required=False) for spec in args.datasets]
    shared_format = [spec for spec in args.dataset_format if "=" not in spec]
    formats = named_options([s for s in args.dataset_format if "=" in s], "--dataset-format",
                            [name for name, _ in datasets])
    if len(shared_format) > 1:
        raise InputError(f"--dataset-format: several formats for every dataset: {', '.join(shared_format)}")
    sources = [corpus(spec, args.text_field) for spec in args.corpus]
    default_format = shared_format[0] if shared_format else None
    sources += [dataset(name, path, formats.get(name, default_format)) for name, path in datasets]
    say_skipped(sources)

    settings = ReportSettings(min_pieces=args.min_pieces, top_words=args.top_words,
                              max_instances=args.max_inputs)
    terms = read_terms(resolve_path(args.terms)) if args.terms else []
    vocabularies = [load_vocabulary(name, path, CASINGS[casings[name]] if name in casings else None)
                    for name, path in tokenizers]
    report = build_report(vocabularies, sources, terms, args.terms, settings, progress=args.progress)
    files = write_report(report, args.output_dir)

    for v in report.vocabularies:
        print(f"{v.name}: {v.size:,}-token {v.format}, {'uncased' if v.lowercase else 'cased'} ({v.casing_source}), "
              f"{v.path}")
        for note in v.notes:
            print(f"  note: {note}")
    if report.terms is not None:
        kept = ", ".join(f"{n} {c}/{len(report.terms.rows)}" for n, c in report.terms.whole_counts.items())
        print(f"terms kept whole: {kept}")
    for s in report.sources:
        per_word = ", ".join(f"{st.vocabulary} {st.pieces_per_word:.3f}" for st in s.stats)
        per_input = ", ".join(f"{st.vocabulary} {st.pieces_per_instance:.1f}" for st in s.stats)
        print(f"{s.name} ({s.instances:,} model inputs, {s.words:,} words): pieces/word {per_word}; "
              f"pieces/input {per_input}")
    print(f"wrote {files.markdown}, {files.json} and {len(files.plots)} plot(s)")
    if files.removed:
        print(f"removed {len(files.removed)} plot(s) of an earlier report in {args.output_dir}, for what this "
              f"report no longer covers: {', '.join(path.name for path in files.removed)}")
    return 0


@exits_cleanly_on_interrupt("vocab_report")
def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        (args,) = parse_config([VocabReportArguments], argv, description=__doc__.split("\n\n")[0])
        return run(args)
    except (BiomedLMError, FileNotFoundError) as err:
        return bad_input("vocab_report", err)


if __name__ == "__main__":
    sys.exit(main())
