#!/usr/bin/env python
"""Turn a prepared corpus into pretraining instances (MLM + a pair objective), saved as a datasets dataset.

    python launch/create_pretraining_data.py --corpus runs/corpus/pubmed --tokenizer runs/vocab/pubmed
        --output-dir runs/data/pubmed_seq128 [--max-seq-length 128] [--short-seq-prob 0.1]
        [--pair-task nsp|sop|drp|none] [--packing document|cross-document]
        [--dupe-factor 1] [--seed 12345] [--num-proc N] [--max-shard-size 500MB] [--overwrite]
        [--tokenized-cache DIR]
    python launch/create_pretraining_data.py --config configs/data/phase1_seq128.yaml   # then phase2_seq512.yaml

A YAML config may give ``mixture:`` instead of ``corpus:``: several prepared corpora, each with a
sampling weight or a number of epochs (pretrain/mixture.py; e.g. PubMed 0.7 + PMC 0.3).

Instances are stored unmasked ([CLS] A [SEP] B [SEP], token_type_ids, next_sentence_label, word_starts);
the trainer masks them dynamically. pretraining_data.json beside them records the vocabulary's sha256,
the options and a summary, which is printed at the end. The logic lives in pretrain/instance_builder.py.

Exit status: 0 on success, 2 for unusable options or inputs (missing corpus or tokenizer, a folder that
is not a prepared corpus, an output folder that already holds other data without --overwrite).

Run again on a finished output folder, the same command builds nothing: it says the data is already
complete and prints its summary again (exit status 0); a command that would build other data (another
corpus or tokenizer, or their files changed since, or other options) is refused with exit status 2, naming
what differs; --overwrite rebuilds. num_proc, batch_size and tokenized_cache are not differences. Data whose
saved files were deleted or resized since it was built (pretraining_data.json records each one's size) is not
complete: the rerun names each such file and exits with status 2; --overwrite rebuilds it.
"""

from __future__ import annotations

import sys
from typing import Sequence

from biomed_lm.config import parse_config
from biomed_lm.errors import BiomedLMError, bad_input, exits_cleanly_on_interrupt, io_failure
from biomed_lm.pretrain.instance_builder import PretrainingDataConfig, create_pretraining_data, format_summary
from biomed_lm.pretrain.mixture import format_mixture


@exits_cleanly_on_interrupt("create_pretraining_data",
                            "finished worker shards stay cached in the output folder: the same command reuses them")
def main(argv: Sequence[str] | None = None) -> int:
    output_dir = None  # named in a filesystem error, once the options are read
    try:
        (config,) = parse_config([PretrainingDataConfig], argv, description=__doc__)
        output_dir = config.output_dir
        metadata = create_pretraining_data(config)
    except (BiomedLMError, FileNotFoundError) as err:
        return bad_input("create_pretraining_data", err)
    except OSError as err:  # a full disk, a read-only folder, part-way
        return io_failure("create_pretraining_data", err, output_dir)
    if metadata.get("already_complete"):
        print(f"create_pretraining_data: already complete: {output_dir} holds the pretraining data this command "
              "builds (same corpus, tokenizer and options); pass --overwrite to rebuild it", file=sys.stderr)
    print(format_summary(metadata))
    if metadata.get("mixture"):
        print(format_mixture(metadata["mixture"]))
    print(f"  metadata: {config.output_dir}/pretraining_data.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
