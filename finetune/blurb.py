"""The BLURB registry: what each of the 13 datasets *is*, in one table, as pure data.

Every part of the toolkit that needs a fact about a BLURB dataset asks this module: the readers
(:mod:`finetune.readers`) for its file layout, label set and relation type map; the metrics
(:mod:`finetune.metrics`) for its metric and task family (the BLURB score's grouping); the sweep
(:mod:`finetune.sweep`) for its epochs, seeds and where its directory lies; a run for its input
length. Nothing else spells a dataset's name (``tests/test_blurb_registry.py`` greps for it).

The layouts of the files (``token_tags``, ``sentence_label_tsv``, ...) and their readers are
tokenization's (:mod:`tokenization.blurb_files`), shared with the coverage report, which must not
import fine-tuning; an entry names the layouts its files use (:attr:`BlurbEntry.file_layouts`).

The module imports nothing heavier than the standard library, :mod:`biomed_lm.errors` and the layout
names (whose module is standard library too), so a scorer or a report can read it without loading
torch or a dataset reader.

Adding a dataset of a known task family is one :class:`BlurbEntry` in :data:`BLURB` (plus, when its
files follow a new layout, the layout and its reader in :mod:`tokenization.blurb_files` and a loader
under ``finetune/readers/`` named by ``loader``); adding a task family is one adapter in
:mod:`finetune.adapters`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, Mapping, NamedTuple, get_args

from biomed_lm.errors import FinetuneError, InputError
from biomed_lm.tokenization.blurb_files import (PQAL_JSON, RELATION_JSONL, SENTENCE_LABEL_TSV, SENTENCE_PAIR_TSV,
                                                SENTENCES_JSONL, TOKEN_POS_CHUNK_TAG, TOKEN_TAGS, YESNO_TSV)

__all__ = [
    "NER", "PICO", "RELATION", "SIMILARITY", "CLASSIFICATION", "QA", "TASK_TYPES", "TaskType",
    "ENTITY_F1", "PICO_TOKEN_MACRO_F1", "MICRO_F1_POSITIVE", "F1_POSITIVE", "PEARSON", "MICRO_F1_MULTILABEL",
    "ACCURACY", "METRIC_IDS", "TRAIN", "DEV", "TEST", "SPLITS", "DEFAULT_MAX_LENGTH", "QA_MAX_LENGTH",
    "PICO_ELEMENTS", "HOC_HALLMARKS", "HOC_BLURB_SIZES", "PUBMEDQA_BLURB_SIZES",
    "FORMER_LAYOUT_NAMES", "file_layout_name",
    "PlaceholderPair", "CHEMPROT_TYPE_MAP", "DDI_TYPE_MAP", "GAD_TYPE_MAP", "BlurbEntry", "BLURB", "BLURB_DATASETS",
    "BLURB_TASK_TYPES", "BLURB_TASK_OF", "BLURB_METRIC_OF", "UnknownDatasetError", "UnknownTaskFamilyError",
    "name_key", "canonical_dataset_name", "blurb_entry", "blurb_dataset_names", "spellings", "default_max_length",
]

# ------------------------------------------------------------------------------ task families

NER = "ner"
PICO = "pico"
RELATION = "relation"
SIMILARITY = "similarity"
CLASSIFICATION = "classification"
QA = "qa"
#: The task families as a choice set (``--task-type``), in the paper's section 2.3 order.
TaskType = Literal["ner", "pico", "relation", "similarity", "classification", "qa"]
TASK_TYPES: tuple[str, ...] = get_args(TaskType)
assert TASK_TYPES == (NER, PICO, RELATION, SIMILARITY, CLASSIFICATION, QA)

# ------------------------------------------------------------------------------------- metrics

ENTITY_F1 = "entity_f1"                        # seqeval-style exact-span mention F1
PICO_TOKEN_MACRO_F1 = "pico_token_macro_f1"    # word-level F1 per PIO element, averaged over elements
MICRO_F1_POSITIVE = "micro_f1_positive"        # micro F1 over every label but the negative one
F1_POSITIVE = "f1_positive"                    # binary F1 of the positive label
PEARSON = "pearson"
MICRO_F1_MULTILABEL = "micro_f1_multilabel"    # micro F1 over (document, label) decisions
ACCURACY = "accuracy"
METRIC_IDS = (ENTITY_F1, PICO_TOKEN_MACRO_F1, MICRO_F1_POSITIVE, F1_POSITIVE, PEARSON, MICRO_F1_MULTILABEL,
              ACCURACY)

TRAIN, DEV, TEST = "train", "dev", "test"
SPLITS = (TRAIN, DEV, TEST)

# Sub-words per input when a run sets none (BlurbEntry.max_length holds each dataset's value). The
# paper (section 2.4) pads or truncates GAD to 128, ChemProt and DDI to 256 and QA to 512; it states
# no length for the other datasets, which get 128 (NER and PICO sentences are cut into windows,
# never dropped) except BIOSSES, 256, so that no pair is cut (4 of the 100 exceed 128 sub-words with
# bert-base-uncased's vocabulary), and HoC, 512, as its inputs are whole abstracts.
DEFAULT_MAX_LENGTH = 128
QA_MAX_LENGTH = 512

# --------------------------------------------------------------------------------- label sets

PICO_ELEMENTS = ("PAR", "INT", "OUT")  # participants, interventions, outcomes (EBM-NLP's names)
HOC_HALLMARKS = (  # the 10 top-level hallmarks of cancer, alphabetical (the order of the label ids)
    "Activating invasion and metastasis",
    "Avoiding immune destruction",
    "Cellular energetics",
    "Enabling replicative immortality",
    "Evading growth suppressors",
    "Genomic instability and mutation",
    "Inducing angiogenesis",
    "Resisting cell death",
    "Sustaining proliferative signaling",
    "Tumor promoting inflammation",
)
# BLURB's HoC split (paper, Table 3) in abstracts; applied as proportions to the abstracts present.
HOC_BLURB_SIZES = MappingProxyType({TRAIN: 1295, DEV: 186, TEST: 371})
# BLURB's PubMedQA split of the 500 non-test questions.
PUBMEDQA_BLURB_SIZES = MappingProxyType({TRAIN: 450, DEV: 50})


def _bio(entity_type: str) -> tuple[str, ...]:
    return "O", f"B-{entity_type}", f"I-{entity_type}"


# ------------------------------------------------------------------------------- file layouts

#: What the coverage report's ``--dataset-format`` took before the layouts were named by their shape: a
#: task family or dataset whose files have the layout. Still accepted (:func:`file_layout_name`).
FORMER_LAYOUT_NAMES: Mapping[str, str] = MappingProxyType({
    NER: TOKEN_TAGS, PICO: TOKEN_POS_CHUNK_TAG, "gad": SENTENCE_LABEL_TSV, "ddi": RELATION_JSONL,
    "biosses": SENTENCE_PAIR_TSV, "hoc": SENTENCES_JSONL, "pubmedqa": PQAL_JSON, "bioasq": YESNO_TSV,
})


def file_layout_name(name: str) -> str:
    """The layout a user names (:data:`tokenization.blurb_files.FILE_LAYOUTS`): the name itself, or the
    layout a former name (:data:`FORMER_LAYOUT_NAMES`) stood for."""
    return FORMER_LAYOUT_NAMES.get(name, name)


# ---------------------------------------------------------------------------- relation inputs

class PlaceholderPair(NamedTuple):
    """The placeholders a BLURB dataset's pre-dummified sentences hold: E1's type, E2's type, and the
    one combined placeholder that stands for both when the mentions overlap."""

    first: str
    second: str
    overlap: str


# Per-dataset maps from the corpus's entity types to placeholder types. A pair of normalized types
# joined by "-" may map to BLURB's name for overlapping mentions.
CHEMPROT_TYPE_MAP = MappingProxyType({"CHEMICAL": "CHEMICAL", "GENE": "GENE", "GENE-Y": "GENE", "GENE-N": "GENE",
                                    "CHEMICAL-GENE": "CHEM-GENE", "GENE-CHEMICAL": "CHEM-GENE"})
DDI_TYPE_MAP = MappingProxyType({"drug": "DRUG", "drug_n": "DRUG", "brand": "DRUG", "group": "DRUG",
                               "DRUG-DRUG": "DRUG-DRUG"})
GAD_TYPE_MAP = MappingProxyType({"GENE": "GENE", "DISEASE": "DISEASE"})

# ChemProt as BLURB distributes it writes the pair's mentions as the words BC6ENTC (the chemical) and
# BC6ENTG (the gene) where other distributions write @CHEMICAL$ and @GENE$; reading them as those
# placeholders gives the model the same input from either file. Any other mention is BC6OTHER there:
# it stays the word it is (not part of the pair, and its own words are not in the file).
_BC6_PAIR_MARKERS = MappingProxyType({"BC6ENTC": "@CHEMICAL$", "BC6ENTG": "@GENE$"})


# ------------------------------------------------------------------------------------ entries

@dataclass(frozen=True)
class BlurbEntry:
    """One BLURB dataset: its name and spellings, task family, metric, labels, files, and the paper's
    fine-tuning settings.

    ``blurb_sizes`` are the paper's Table 3 counts (train, dev, test) in the paper's units: entity
    mentions for NER, PIO element tokens for PICO, examples otherwise. ``loader`` names the reader of
    its directory (:data:`finetune.readers.LOADERS`); ``file_layouts`` names the layouts its files may
    have (:data:`tokenization.blurb_files.FILE_LAYOUTS`, the distributed one first), and
    ``file_description`` describes the files for people.
    ``directories`` are where it may lie under a data root (the sweep takes the first that exists).
    ``epochs`` and ``num_seeds`` are the sweep's defaults: the paper searched epochs in 2-60 without
    publishing a value per dataset (ours are chosen in that range by dataset size); its seeds
    (section 2.5) are 10 for BIOSSES, BioASQ and PubMedQA and 5 for the rest. ``max_length`` is the
    sub-words per input a run uses unless told otherwise (see :data:`DEFAULT_MAX_LENGTH`).
    """

    name: str
    title: str
    task_type: str
    metric: str
    labels: tuple[str, ...]
    loader: str
    file_layouts: tuple[str, ...]
    file_description: str
    blurb_sizes: tuple[int, int, int]
    directories: tuple[str, ...]
    epochs: int
    num_seeds: int
    max_length: int = DEFAULT_MAX_LENGTH
    aliases: tuple[str, ...] = ()
    negative_label: str | None = None
    entity_type: str | None = None                   # NER: the one entity type tags are mapped onto
    source_types: tuple[str, ...] = ()               # NER: the entity types its files may spell
    type_map: Mapping[str, str] | None = field(default=None, compare=False)   # relation: types -> placeholders
    placeholder_pair: PlaceholderPair | None = None  # relation: the pair its dummified sentences hold
    # relation: words a distribution writes for the pair's mentions, read as these placeholders
    pair_markers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), compare=False)
    other_mention_marker: str | None = None          # the word standing for a mention outside the pair (kept)


def _ner(name: str, title: str, entity_type: str, sizes: tuple[int, int, int], directories: tuple[str, ...], *,
         source_types: tuple[str, ...] | None = None, aliases: tuple[str, ...] = (),
         file_description: str = "") -> BlurbEntry:
    file_description = file_description or (f"{{train,devel,test}}.tsv: token<TAB>tag (B-{entity_type}/"
                                            f"I-{entity_type}/O, or bare B/I/O)")
    return BlurbEntry(name, title, NER, ENTITY_F1, _bio(entity_type), "token_tags", (TOKEN_TAGS,), file_description,
                      sizes, directories, epochs=20, num_seeds=5, aliases=aliases, entity_type=entity_type,
                      source_types=source_types or (entity_type.lower(),))


_ENTRIES = (
    _ner("bc5-chem", "BC5-chem", "Chemical", (5203, 5347, 5385),
         ("ner/BC5CDR-chem", "BC5CDR-chem", "ner/BC5-chem", "BC5-chem"),
         aliases=("BC5CDR-chem", "BC5-chemical", "BC5CDR-chemical")),
    _ner("bc5-disease", "BC5-disease", "Disease", (4182, 4244, 4424),
         ("ner/BC5CDR-disease", "BC5CDR-disease", "ner/BC5-disease", "BC5-disease"), aliases=("BC5CDR-disease",)),
    _ner("ncbi-disease", "NCBI-disease", "Disease", (5134, 787, 960), ("ner/NCBI-disease", "NCBI-disease")),
    _ner("bc2gm", "BC2GM", "GENE", (15197, 3061, 6325), ("ner/BC2GM", "BC2GM")),
    _ner("jnlpba", "JNLPBA", "Entity", (46750, 4551, 8662), ("ner/JNLPBA", "JNLPBA"),
         source_types=("DNA", "RNA", "cell_line", "cell_type", "protein"),
         file_description="{train,devel,test}.tsv: token<TAB>tag with types DNA, RNA, cell_line, cell_type, "
                          "protein (merged into one type); -DOCSTART- lines between abstracts"),
    BlurbEntry("ebm-pico", "EBM PICO", PICO, PICO_TOKEN_MACRO_F1, PICO_ELEMENTS, "pio_tags", (TOKEN_POS_CHUNK_TAG,),
               "{dev,test}.txt (train.txt if present): 'token POS O tag' lines, tags I-PAR/I-INT/I-OUT/O, "
               "'-DOCSTART- (PMID)' before each abstract",
               (339167, 85321, 16364), ("pico/ebmnlp", "ebmnlp", "pico/EBM-NLP", "EBM-NLP"),
               epochs=10, num_seeds=5, aliases=("EBM-NLP",)),
    BlurbEntry("chemprot", "ChemProt", RELATION, MICRO_F1_POSITIVE,
               ("False", "CPR:3", "CPR:4", "CPR:5", "CPR:6", "CPR:9"), "relation",
               (SENTENCE_LABEL_TSV, RELATION_JSONL),
               "{train,dev,test}.tsv (sentence<TAB>label, the pair as @CHEMICAL$/@GENE$ or BC6ENTC/BC6ENTG, "
               "optional header/id column) or {train,dev,test}.jsonl (DDI-style records)",
               (18035, 11268, 15745), ("re/chemprot", "chemprot", "re/ChemProt", "ChemProt"),
               epochs=10, num_seeds=5, max_length=256, negative_label="False", type_map=CHEMPROT_TYPE_MAP,
               placeholder_pair=PlaceholderPair("CHEMICAL", "GENE", "CHEM-GENE"), pair_markers=_BC6_PAIR_MARKERS,
               other_mention_marker="BC6OTHER"),
    BlurbEntry("ddi", "DDI", RELATION, MICRO_F1_POSITIVE,
               ("DDI-false", "DDI-mechanism", "DDI-effect", "DDI-advise", "DDI-int"), "relation",
               (RELATION_JSONL, SENTENCE_LABEL_TSV),
               "{train,dev,test}.jsonl or ddi_blurb_{train,dev,test}.jsonl: {id, sentence, masked, e1, e2, label}, "
               "entity offsets 'start-end' with inclusive end (or .tsv like GAD)",
               (25296, 2496, 5716), ("re/ddi", "ddi", "re/DDI", "DDI"),
               epochs=10, num_seeds=5, max_length=256, negative_label="DDI-false", type_map=DDI_TYPE_MAP,
               placeholder_pair=PlaceholderPair("DRUG", "DRUG", "DRUG-DRUG")),
    BlurbEntry("gad", "GAD", RELATION, F1_POSITIVE, ("0", "1"), "relation", (SENTENCE_LABEL_TSV,),
               "{train,dev,test}.tsv or gad_blurb_{train,dev,test}.tsv: sentence<TAB>label (1/0), "
               "@GENE$/@DISEASE$ dummified, optional header",
               (4261, 535, 534), ("re/gad", "gad", "re/GAD", "GAD"),
               epochs=10, num_seeds=5, max_length=128, negative_label="0", type_map=GAD_TYPE_MAP,
               placeholder_pair=PlaceholderPair("GENE", "DISEASE", "GENE-DISEASE")),
    BlurbEntry("biosses", "BIOSSES", SIMILARITY, PEARSON, (), "blue_similarity", (SENTENCE_PAIR_TSV,),
               "{train,dev,test}.tsv: BLUE's TSV with a header naming sentence1, sentence2, score (fields may be "
               "quoted)",
               (64, 16, 20), ("similarity/biosses", "biosses", "similarity/BIOSSES", "BIOSSES"),
               epochs=30, num_seeds=10, max_length=256, aliases=("BIOSESSES",)),  # the paper's Table 6 spelling
    BlurbEntry("hoc", "HoC", CLASSIFICATION, MICRO_F1_MULTILABEL, HOC_HALLMARKS, "hallmarks", (SENTENCES_JSONL,),
               "hoc_combined.jsonl: {pmid, sentences, sentence_labels[, doc_hallmarks]} per abstract (split "
               "derived), or {train,dev,test}.jsonl in the same format",
               (1295, 186, 371), ("classification/hoc", "hoc", "classification/HoC", "HoC"),
               epochs=20, num_seeds=5, max_length=512, aliases=("Hallmarks of Cancer",)),
    BlurbEntry("pubmedqa", "PubMedQA", QA, ACCURACY, ("yes", "no", "maybe"), "pqal", (PQAL_JSON,),
               "ori_pqal.json (PMID -> {QUESTION, CONTEXTS, final_decision, ...}) and test_ground_truth.json "
               "(PMID -> answer)",
               (450, 50, 500), ("qa/pubmedqa", "pubmedqa", "qa/PubMedQA", "PubMedQA"),
               epochs=20, num_seeds=10, max_length=QA_MAX_LENGTH),
    BlurbEntry("bioasq", "BioASQ", QA, ACCURACY, ("yes", "no"), "yesno_tsv", (YESNO_TSV,),
               "{train,test}.tsv (dev.tsv optional) or *_train.tsv/*_test.tsv: label<TAB>question<TAB>context, "
               "labels 1/0 or yes/no, optional header",
               (670, 75, 140), ("qa/bioasq", "bioasq", "qa/BioASQ", "BioASQ", "qa/bioasq-yesno-proxy",
                                "bioasq-yesno-proxy"),
               epochs=20, num_seeds=10, max_length=QA_MAX_LENGTH, aliases=("BioASQ-yesno", "BioASQ-yesno-proxy")),
)

#: The 13 datasets: canonical name -> its entry, in the paper's Table 3 order.
BLURB: Mapping[str, BlurbEntry] = MappingProxyType({entry.name: entry for entry in _ENTRIES})
#: The 13 canonical names, in that order (a tuple everywhere; :data:`BLURB` is the mapping).
BLURB_DATASETS: tuple[str, ...] = tuple(BLURB)
#: Task family -> its datasets (the BLURB score averages within a family, then over families).
BLURB_TASK_TYPES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {task: tuple(e.name for e in _ENTRIES if e.task_type == task) for task in TASK_TYPES})
BLURB_TASK_OF: Mapping[str, str] = MappingProxyType({e.name: e.task_type for e in _ENTRIES})
BLURB_METRIC_OF: Mapping[str, str] = MappingProxyType({e.name: e.metric for e in _ENTRIES})


# ---------------------------------------------------------------------------------- names

class UnknownDatasetError(FinetuneError, InputError):
    """A dataset name that is not one of the 13 BLURB datasets; the message lists the valid names."""


class UnknownTaskFamilyError(FinetuneError, InputError):
    """A task family that has no adapter; the message lists the valid ones."""


def name_key(name: str) -> str:
    """A spelling with case, spaces, ``-`` and ``_`` removed: what two spellings of a name share."""
    return re.sub(r"[\s_\-]", "", str(name).strip().lower())


def _spellings(entry: BlurbEntry) -> tuple[str, ...]:
    directories = tuple(d.rsplit("/", 1)[-1] for d in entry.directories)
    return (entry.name, entry.title, *entry.aliases, *directories)


_KEYS: Mapping[str, str] = MappingProxyType({name_key(s): e.name for e in _ENTRIES for s in _spellings(e)})


def canonical_dataset_name(name: str) -> str:
    """The canonical name of a BLURB dataset as papers, loaders and directories write it: case,
    spaces, ``-`` and ``_`` do not matter (``NCBI_Disease``, ``EBM PICO``), and the aliases
    (``BC5CDR-chem``, ``EBM-NLP``, ``BIOSESSES``, ...) and directory names are accepted.
    Raises :class:`UnknownDatasetError` (an InputError, so a ValueError) listing the valid names."""
    key = name_key(name)
    if key not in _KEYS:
        raise UnknownDatasetError(f"unknown BLURB dataset {name!r}; valid names: {', '.join(BLURB_DATASETS)}")
    return _KEYS[key]


def blurb_entry(name: str) -> BlurbEntry:
    """The :class:`BlurbEntry` of a dataset name in any spelling :func:`canonical_dataset_name` takes."""
    return BLURB[canonical_dataset_name(name)]


def blurb_dataset_names() -> tuple[str, ...]:
    """The 13 BLURB dataset names, in the paper's Table 3 order."""
    return BLURB_DATASETS


def spellings(name: str) -> tuple[str, ...]:
    """Every spelling of a dataset this registry holds (name, title, aliases, directory names)."""
    return _spellings(blurb_entry(name))


def default_max_length(dataset: str, task_type: str | None = None) -> int:
    """Sub-words per input for a run that sets none: the BLURB dataset's own (:class:`BlurbEntry`),
    or for a generic dataset (``task_type`` given) its task family's: 512 for QA, else 128."""
    if task_type is not None:
        return QA_MAX_LENGTH if task_type == QA else DEFAULT_MAX_LENGTH
    return blurb_entry(dataset).max_length
