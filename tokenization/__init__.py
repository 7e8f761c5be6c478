"""Text in, vocabularies out: corpus ingestion, WordPiece/SentencePiece/byte-level BPE vocabularies,
and the report of how well vocabularies cover biomedical text.

* :mod:`.corpus` (with :mod:`.sources`, :mod:`.streams`, :mod:`.pubmed_xml`, :mod:`.sentences`):
  PubMed XML, plain text and JSONL into a clean, deduplicated, sentence-split corpus
  (``launch/prepare_corpus.py``);
* :mod:`.vocab`, :mod:`.tokenizer_io`: build an in-domain vocabulary, save and load tokenizers
  (``launch/build_vocab.py``); :mod:`.words`: the words BERT's tokenizers are applied to;
* :mod:`.coverage`, :mod:`.model_inputs`: the coverage report, the paper's Tables 1 and 8
  (``launch/vocab_report.py``);
* :mod:`.blurb_files`: the layouts of BLURB's dataset files and their readers, shared with fine-tuning.
"""
