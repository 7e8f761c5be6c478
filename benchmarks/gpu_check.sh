#!/usr/bin/env bash
# The GPU checks in one prepared run, for a machine that has CUDA, PyTorch and transformers but not
# this toolkit (a lent GPU box, or a cluster node before `make env`): the `gpu` tests, then
# benchmarks/bench_gpu.py at BERT-base size. Output goes to stdout and, when $OUT is set, to files in it.
#
#     bash benchmarks/gpu_check.sh                 # tests, then the full benchmark
#     BENCH_ARGS="--steps 6" bash benchmarks/gpu_check.sh
#     BENCH2_ARGS="--seq-lengths 128 --batch 256 --attention-dropout 0" bash benchmarks/gpu_check.sh  # and a 2nd run
#
# Packages the machine lacks (datasets, deepspeed, ...) may sit as wheels in .whl/ (see
# benchmarks/README.md, "GPU pretraining step"); they are installed into /tmp/site, not the system.
# Where the toolkit is not installed it is made importable as biomed_lm for the run: links in
# biomed_lm/ to tokenization/, pretrain/, ... mirror setup.py's package_dir, removed on exit.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/gpu_check}"; mkdir -p "$OUT"
PY="${PYTHON:-python3}"
cd "$REPO"

if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
LINKS=()
if ! "$PY" -c "import biomed_lm.pretrain" 2> /dev/null; then  # not installed: link the subpackages in
  for d in tokenization pretrain finetune experiments launch configs data; do
    [ -e "biomed_lm/$d" ] || { ln -s "../$d" "biomed_lm/$d" && LINKS+=("biomed_lm/$d"); }
  done
  trap 'rm -f "${LINKS[@]}"' EXIT
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WANDB_MODE=offline

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__, torch.cuda.get_device_name())"

echo "== gpu tests"
timeout "${TEST_TIMEOUT:-240}" "$PY" -m pytest -q -p no:cacheprovider -m gpu -rs \
  tests/test_gpu.py tests/test_optim.py tests/test_pretrain_numerics.py 2>&1 | tee "$OUT/gpu_tests.log"

echo "== bench_gpu"
# shellcheck disable=SC2086  # BENCH_ARGS is a list of words
timeout "${BENCH_TIMEOUT:-420}" "$PY" benchmarks/bench_gpu.py --out "$OUT/gpu.json" ${BENCH_ARGS:-} 2>&1 \
  | tee "$OUT/bench_gpu.log"

if [ -n "${BENCH2_ARGS:-}" ]; then  # a second configuration, e.g. "--seq-lengths 128 --batch 256 --attention-dropout 0"
  echo "== bench_gpu $BENCH2_ARGS"
  # shellcheck disable=SC2086
  timeout "${BENCH2_TIMEOUT:-300}" "$PY" benchmarks/bench_gpu.py --out "$OUT/gpu2.json" $BENCH2_ARGS 2>&1 \
    | tee "$OUT/bench_gpu2.log"
fi
