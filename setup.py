"""biomed-lm: pretrain BERT-style encoders from scratch on biomedical text (PubMedBERT style)
and compare them with continual pretraining of general-domain models on BLURB."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent

#: import name → folder of this repository
PACKAGE_DIRS = {
    "biomed_lm": "biomed_lm",  # configuration, errors, resources, the console command
    "biomed_lm.tokenization": "tokenization",
    "biomed_lm.pretrain": "pretrain",
    "biomed_lm.finetune": "finetune",
    "biomed_lm.experiments": "experiments",
    "biomed_lm.launch": "launch",
    "biomed_lm.configs": "configs",
    "biomed_lm.data": "data",
}


def with_subpackages(top: dict[str, str]) -> dict[str, str]:
    """``top`` plus every folder with an ``__init__.py`` below its folders (finetune/readers →
    biomed_lm.finetune.readers), so a new subpackage ships without an edit here."""
    found = dict(top)
    for name, folder in top.items():
        for init in sorted((HERE / folder).glob("*/**/__init__.py")):
            sub = init.parent.relative_to(HERE / folder)
            found[".".join((name, *sub.parts))] = (Path(folder) / sub).as_posix()
    return found


PACKAGE_DIRS = with_subpackages(PACKAGE_DIRS)


class FreshBuildPy(build_py):
    """Copy the packages into an emptied build folder: setuptools keeps what an earlier build put there,
    so a file deleted from the checkout would still ship in the next wheel (QA: ``git pull && pip install .``
    installed a removed config)."""

    def run(self) -> None:
        shutil.rmtree(self.build_lib, ignore_errors=True)
        super().run()


setup(
    name="biomed-lm",
    version="0.1.0",
    description="Domain-specific BERT pretraining toolkit: PubMed ingestion, WordPiece vocabularies, "
    "MLM+NSP pretraining with DeepSpeed, BLURB fine-tuning and ablation analysis.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # One import name, biomed_lm, for the design card's top-level folders: nothing generic
    # (pretrain, finetune, common, ...) lands in site-packages, and launch/pretrain.py, run as a
    # file, cannot shadow a package. Configs and the embedded sample ship as package data.
    packages=list(PACKAGE_DIRS),
    package_dir=PACKAGE_DIRS,
    package_data={"biomed_lm.configs": ["*/*.yaml", "*/*.txt"],
                  "biomed_lm.data": ["README.md", "sample/*", "blurb/*/*"]},
    entry_points={"console_scripts": ["biomed-lm=biomed_lm.launch.cli:main"]},
    cmdclass={"build_py": FreshBuildPy},
    # Floors: the lowest versions this code is known to work with, each with its reason. The versions
    # of a green run are requirements/cpu.lock (and gpu.lock for the image); tests/test_packaging.py
    # checks that the lock satisfies every specifier here. requirements/check_floors.sh installs
    # exactly these floors (uv's lowest-direct resolution; torch and deepspeed held at the lock's
    # 2.13.0 and 0.19.8, not varied) and runs the corpus, vocabulary, instance, masking, pretraining,
    # initialization, fine-tuning, metric, sweep-report, analysis, calibration and report tests.
    # Last run (2026-11-26, 2 CPU cores): every file of its list (the pipeline's tests above and the
    # pair-task, n-gram, citation-link, preset, vocabulary-format, model-family, fine-tuning-architecture,
    # recipe and ablation tests) passed at these floors: 561 passed, 10 skipped in 16 min, with
    # transformers 5.14.0, tokenizers 0.22.1, numpy 2.0.0, datasets 4.0.0, pyarrow 16.0.0, pandas 2.2.2,
    # sentencepiece 0.2.0 (torch 2.13.0 and deepspeed 0.19.8 held).
    install_requires=[
        # transformers 5 switches its PyTorch support off below torch 2.6. torch is pinned by the
        # installer (Makefile: requirements/cpu.lock; docker: the base image's build), so no later
        # requirement can pull a CUDA build onto a CPU machine.
        "torch>=2.6",
        # 5.x behaviour the code relies on: BertTokenizer's positional vocab file (tokenizer_io),
        # BertEmbeddings' LayerNorm(inputs_embeds + ...) (the ALUM perturbation), the HF collator that
        # replaced DataCollatorForWholeWordMask (the masking benchmark's baseline). 5.14: below it,
        # AlbertTokenizer's preparation does not lowercase ASCII (the SentencePiece vocabulary format
        # and its word counter disagree), and 5.0-5.9 also fail to save a SentencePiece-built
        # AlbertTokenizer (bytes in its config) and give DeBERTa-v2 no [CLS]/[SEP] framing
        # (tests/test_vocab_formats.py, tests/test_finetune_architectures.py; bisected 2026-11-26).
        "transformers>=5.14",
        "tokenizers>=0.22",  # what transformers 5.14 needs; the WordPiece trainer API used is older
        "datasets>=4.0",  # datasets.List, the feature type of the instance columns, is new in 4.0
        "sentencepiece>=0.2",  # the unigram vocabulary; 0.2.0 is the first release with Python 3.12 wheels
        "blingfire>=0.1.8",  # sentence splitting; its latest release, the only one tested
        # NumPy 2's promotion rules (NEP 50): np.uint64 >> 1 (the micro-batch seeds) is a TypeError in
        # 1.x. Every compiled dependency below is floored at its first release built for NumPy 2.
        "numpy>=2.0",
        "pyarrow>=16",  # the first built for NumPy 2 (datasets 4.0 asks for 15)
        "pyyaml>=6.0",
        "tqdm>=4.66.3",  # datasets 4.0's own floor
        "matplotlib>=3.8.4",  # the first built for NumPy 2
        "psutil>=5.9",
        "xxhash>=3.0",  # checkpoint manifests: xxh3_128 (datasets needs xxhash too, unversioned)
        # fine-tuning metrics
        "seqeval>=1.2.2",  # seqeval.scheme (strict IOB2/BILOU entities); 1.2.2 is its latest release
        "scipy>=1.13",  # the first built for NumPy 2
        # experiments: run tables and the multilevel (mixed-effects) analysis
        "pandas>=2.2.2",  # the first built for NumPy 2
        "statsmodels>=0.14.2",  # the first built for NumPy 2; MixedLM and proportion_confint as used
    ],
    extras_require={
        # scikit-learn: the metric tests' reference (seqeval needs it at run time anyway);
        # accelerate: the HF Trainer baseline of bench_finetune. Once installed, transformers imports it
        # in from_pretrained, and transformers 5 needs accelerate.utils.modeling.get_module_size_with_ties,
        # new in accelerate 1.2 (with 1.1, which transformers 5.0 declares, every model load fails).
        # pytest < 9: pytest 9 derives a test's nodeid from its structured id, so pytest-xdist 3.8's
        # --dist loadgroup can no longer tag it with its xdist_group and splits a group across workers
        # (two of them then built test_bench_pretrain_e2e's shared inputs at once, and collided).
        "dev": ["pytest>=8,<9", "hypothesis>=6.100", "pytest-timeout>=2.2", "pytest-xdist>=3.5", "scikit-learn>=1.4.2",
                "accelerate>=1.2"],
        # Install DeepSpeed with --no-build-isolation after torch (see the Makefile and docker/).
        # 0.14: kept from the first setup; only the locked 0.19.8 is tested (the calls used, initialize,
        # init_distributed, the engine's backward/step/checkpoints and FusedAdam, are older than 0.14).
        "pretrain": ["deepspeed>=0.14", "wandb>=0.17"],
        "tracking": ["wandb>=0.17"],
    },
)
