"""biomed-lm: pretrain BERT-style encoders from scratch on biomedical text (PubMedBERT style)
and compare them with continual pretraining of general-domain models on BLURB."""

from setuptools import setup

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
    entry_points={"console_scripts": ["biomed-lm=biomed_lm.cli:main"]},
    install_requires=[
        # torch is deliberately pinned by the installer (Makefile / docker), not here: an unpinned
        # torch requirement would pull a CUDA build on a CPU machine.
        "torch>=2.1",
        "transformers>=4.40",
        "tokenizers>=0.19",
        "datasets>=2.19",
        "sentencepiece>=0.2",
        "blingfire>=0.1.8",
        "numpy",
        "pyarrow",
        "pyyaml",
        "tqdm",
        "matplotlib",
        "psutil",
        # fine-tuning metrics
        "seqeval",
        "scikit-learn",
        "scipy",
        # experiments: run tables and the multilevel (mixed-effects) analysis
        "pandas",
        "statsmodels>=0.14",
    ],
    extras_require={
        "dev": ["pytest>=8", "hypothesis>=6", "pytest-timeout", "pytest-xdist>=3.5", "accelerate>=1.1"],  # accelerate: the HF Trainer baseline of bench_finetune
        # Install DeepSpeed with --no-build-isolation after torch (see the Makefile and docker/).
        "pretrain": ["deepspeed>=0.14", "wandb"],
        "tracking": ["wandb"],
    },
)
