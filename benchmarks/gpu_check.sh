#!/usr/bin/env bash
# Every GPU measurement of the benchmarks in one prepared run, for a machine that has CUDA, PyTorch and
# transformers but not this toolkit (a lent GPU box, or a cluster node before `make env`).
#
#     bash benchmarks/gpu_prepare.sh                  # here, once: .whl/ and .gpu_inputs/ to carry
#     bash benchmarks/gpu_check.sh                    # there: every stage, in this order
#     STAGES="bert tests" bash benchmarks/gpu_check.sh   # some stages only
#
# Stages (each bounded by its own timeout), in order of value. Measured on an H200 (2026-11-27): bert
# 193 s with four rows of ours (as now, plus about 60 s of convergence runs), tests over 180 s, launch
# 43 s, graphs 55 s, fp8 64 s without its convergence runs, finetune 72 s. A 15-minute lease (start-up
# included) fits two calls: `BUDGET=565 STAGES="bert launch tests"` (the run's timeout_s 600), then at once,
# before the machine goes back (it waits 30 s), `STAGES="fp8 families"` with BUDGET what the lease has left.
# BUDGET (seconds) bounds the whole script: each stage's timeout is cut to what is left of it less RESERVE
# (default 20 s, for goals.md and the archive), and a stage with less than 30 s left is skipped and named
# (skipped_stages.txt). Without BUDGET only the stages' own timeouts apply. Each stage saves its results as it
# goes (bench_gpu.py after every system), so a stage cut by its timeout keeps what it measured. A later call on
# a fresh machine compares the launch with .gpu_inputs/bert128.json when /tmp has no bert128.json: copy the
# first call's there (or pass BENCH_JSON).
# Results go to $RESULTS (default /tmp/gpu_check) and, when $OUT is set (the lent machine's return
# folder, which takes at most 8 files), into $OUT/gpu_check.tgz with the whole log beside it. Last,
# benchmarks/gpu_goals.py judges issue 23's goals from them: goals.md (a verdict per goal, every row).
#   bert      bench_gpu.py, BERT-base: transformers eager / compiled / full-length rows against ours
#             (attention sdpa_padded, and varlen: PyTorch's flash kernels with BERT's dropout), compiled
#             by layer, each with the residual stream in fp32 and in bf16 (--residual-stream half), seq 128
#             on the real instances' lengths (tokens bucketed to 256), with --profile; then 300 steps of
#             the fastest kernel with each stream on the same batches (the bf16 stream's loss within 1%)
#   launch    launch/pretrain.py for 100 steps on the same instances: its logged tokens/s over steps 31-100
#             against the bench's row for the same model and shapes (launch_vs_bench.json), and the profile
#             of its steps 21-25 (--profile-steps: launch_profile.txt) to read beside the bench's
#   tests     the `gpu` tests in three parts, by value (-v --failures-at-once: a part cut off by its timeout
#             still names what ran and why each failure failed; a test at most 150 s where pytest-timeout is
#             installed): every CUDA kernel, their attention dropout and the forward compiled by inductor (by
#             layer and whole) against the padded model; fused AdamW and LAMB, bf16 accumulation, fp8 against
#             bf16, the liger MLM loss; CUDA graphs against the compiled forward
#   expandable  where the CUDA allocator retried in the launch's timed steps: the launch once more with
#             PYTORCH_CUDA_ALLOC_CONF=expandable_segments (launch_expandable_vs_bench.json)
#   fp8       ours in fp8 against ours in bf16 with --profile, and 300 steps of each on the same batches
#             (loss within 1%; the instances passed over again where 300 x 64 needs more)
#   families  bench_gpu.py --architecture roberta and albert at seq 128, against their transformers class
#             compiled (the goal's baseline; run C measured their eager rows)
#   finetune  bench_finetune.py --device cuda: NER and a relation task against HF Trainer (its default
#             shuffling, and its group_by_length batching as ours has by default)
#   bert512   the same as bert at seq 512 on BERT's length mix
#   autotune  ours compiled with max-autotune-no-cudagraphs beside the default mode: inductor's triton GEMM
#             templates timed against cuBLAS (they can take the bias and GELU into the GEMM), profiled
#   graphs    ours replayed as CUDA graphs (--compile-mode reduce-overhead) in the bench, then
#             launch/pretrain.py with them for 100 steps against that row (launch_graphs_vs_bench.json);
#             on the H200 the graphs added 0.5% to the bench and the launch paid for recordings
#   blocks    ours alone with 4 encoder layers per compiled region (the host's time per region call)
#   batch512  ours alone at micro-batch 512 on the same instances: the step's launch-bound share
#   whole     ours alone, the whole forward one region (--compile-scope whole) replayed as CUDA graphs:
#             the fewest launches, after the longest compile (over 100 s on an H200 when last tried)
#   fp8large  BERT-large (1,024 and 4,096 wide) in fp8 against bf16 at seq 128 x 128, profiled: where FP8's
#             GEMMs are large enough to pay for the scaling (torchao's tables), which BERT-base's are not
#
# SMOKE=1 runs the stages' commands on this CPU instead, each with a tiny model and a few steps (bench_gpu.py
# --quick, aot_eager, bf16; launch/pretrain.py on bert-tiny, uncompiled, where gpu_prepare.sh made the
# instances): a command line that a change broke fails here, not in a GPU lease. The tests stage skips its
# GPU tests here, and finetune needs the GPU. `SMOKE=1 PYTHON=.venv/bin/python STAGES="bert launch fp8
# families bert512 autotune graphs blocks batch512 whole fp8large" bash benchmarks/gpu_check.sh`.
#
# Packages the machine lacks sit as wheels in .whl/ and are installed into /tmp/site, not the
# system. Where the toolkit is not installed it is made importable as biomed_lm for the run: links in
# biomed_lm/ to tokenization/, pretrain/, ... mirror setup.py's package_dir, removed on exit.
set -uo pipefail
case "${1:-}" in  # settings come from the environment; --help started every stage on the CPU (QA)
  "") ;;
  -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "gpu_check: takes no arguments: STAGES, BUDGET, SMOKE, PYTHON, ... come from the environment (--help)" >&2
     exit 2 ;;
esac
REPO="$(cd "$(dirname "$0")/.." && pwd)"
RESULTS="${RESULTS:-/tmp/gpu_check}"; mkdir -p "$RESULTS"
PY="${PYTHON:-python3}"
if [ -z "${SMOKE:-}" ] && ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null
then  # without it the stages ran BERT-base on the CPU and failed on arguments that said nothing of a GPU
  echo "gpu_check: no CUDA device for $PY: this script measures a GPU; SMOKE=1 runs its stages on this CPU" >&2
  exit 2
fi
ALL="bert launch tests expandable fp8 families finetune bert512 autotune graphs blocks batch512 whole fp8large"
STAGES="${STAGES:-$ALL}"
INPUTS="$REPO/.gpu_inputs"
cd "$REPO"
for name in BUDGET RESERVE; do  # bash counts in whole seconds: "183.4" made every stage's timeout 1 s
  given="${!name:-}"; value="${given%%.*}"  # the fraction cut off: 183.9 is 183
  [[ -z "$given" || "$value" =~ ^[0-9]+$ ]] || { echo "gpu_check: $name must be seconds, not $given" >&2; exit 2; }
  [ -n "$given" ] && printf -v "$name" '%s' "$value"
done
# Each stage removes its own earlier results before it runs (a stage cut before its first save must not show an
# earlier call's); the other stages' stay, for a second call on the same machine (its launch, its expandable).
: > "$RESULTS/skipped_stages.txt"
fresh() { for file in "$@"; do rm -f "$RESULTS/$file"; done; }  # fresh FILE...: this run's results only

START=$SECONDS
left() { echo $(( ${BUDGET:-999999} - (SECONDS - START) - ${RESERVE:-20} )); }  # seconds the stages may still use
within() {  # within LIMIT: LIMIT, or less where the budget ends first (at least 1: `timeout 0` would not time out)
  local l; l=$(left); (( l < 1 )) && l=1; echo $(( $1 < l ? $1 : l ))
}

if [ -z "${SMOKE:-}" ] && compgen -G ".whl/*.whl" > /dev/null; then  # the GPU image's Python, not this one's
  # A failed install (two versions of one wheel, one built for another Python) would leave every stage without
  # datasets, deepspeed, torchao and liger, and their tests skipped quietly: stop here, saying so.
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_check: the carried wheels did not install (pip's error above): no stage was run" >&2; exit 3; }
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
LINKS=()
if ! "$PY" -c "import biomed_lm.pretrain" 2> /dev/null; then  # not installed: link the subpackages in
  for d in tokenization pretrain finetune experiments launch configs data; do
    [ -e "biomed_lm/$d" ] || { ln -s "../$d" "biomed_lm/$d" && LINKS+=("biomed_lm/$d"); }
  done
  trap 'rm -f "${LINKS[@]}"' EXIT
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WANDB_MODE=offline

stage() {  # stage NAME: whether to run it (asked for, and the budget leaves 30 s), said either way
  [[ " $STAGES " == *" $1 "* ]] || return 1
  if (( $(left) < 30 )); then
    echo "== $1 skipped: $(left) s of the budget left" | tee -a "$RESULTS/skipped_stages.txt"; return 1
  fi
  echo "== $1 ($(date +%T), $(left) s of the budget left)"
}
SMOKE_BENCH=(); SMOKE_LAUNCH=()  # the CPU's overrides, after each command's own arguments (the last one wins)
if [ -n "${SMOKE:-}" ]; then
  SMOKE_BENCH=(--device cpu --quick --compile on --compile-backend aot_eager --precision bf16 --windows 1
               --convergence-steps 3)
  SMOKE_LAUNCH=(--model bert-tiny --micro-batch-size 4 --precision fp32 --compile off)
fi
bench() {  # bench NAME TIMEOUT ARGS...: bench_gpu.py with its log and JSON in $OUT
  local name="$1" limit="$2"; shift 2
  fresh "$name.json" "$name.log"
  timeout -k 10 "$(within "$limit")" "$PY" benchmarks/bench_gpu.py --out "$RESULTS/$name.json" "$@" \
    "${SMOKE_BENCH[@]}" 2>&1 | tee "$RESULTS/$name.log"
}
REAL=()  # the real instances' lengths at 128, where gpu_prepare.sh made them
[ -d "$INPUTS/instances128" ] && REAL=(--instances "$INPUTS/instances128")
# launch/pretrain.py on the real instances, tokens bucketed as the bert stage's rows, its pace against the
# bert stage's row named ROW (NAME_vs_bench.json)
pretrain() {  # pretrain NAME ROW STEPS SKIP ARGS...
  local name="$1" row="$2" steps="$3" skip="$4"; shift 4
  rm -rf "/tmp/$name"; fresh "$name.log" "${name}_metrics.jsonl" "${name}_vs_bench.json"
  timeout -k 10 "$(within "${LAUNCH_TIMEOUT:-150}")" "$PY" launch/pretrain.py --model bert-base \
    --data-dir "$INPUTS/instances128" --tokenizer "$INPUTS/tokenizer" --output-dir "/tmp/$name" --max-steps "$steps" \
    --micro-batch-size 256 --gradient-accumulation-steps 1 --optimizer adamw --learning-rate 1e-4 --precision bf16 \
    --attn-implementation sdpa_padded --num-workers 4 --log-every 10 --checkpoint-every 1000 --no-export-hf \
    --bucket-tokens 256 --wandb-mode disabled "$@" "${SMOKE_LAUNCH[@]}" 2>&1 | tee "$RESULTS/$name.log" \
    | grep -v "^pretrain:"
  cp "/tmp/$name/metrics.jsonl" "$RESULTS/${name}_metrics.jsonl" 2> /dev/null
  local bench_json="${BENCH_JSON:-$RESULTS/bert128.json}"  # this call's bert stage, else an earlier call's, carried
  [ -f "$bench_json" ] || [ -n "${BENCH_JSON:-}" ] || bench_json="$INPUTS/bert128.json"
  "$PY" benchmarks/launch_vs_bench.py "/tmp/$name/metrics.jsonl" "$bench_json" --skip "$skip" \
    --system "$row" --out "$RESULTS/${name}_vs_bench.json"
}

{  # the machine, the versions and the commit, kept beside the results (gpu_goals.py heads its report with them)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2> /dev/null || echo "no nvidia-smi"
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
  git -C "$REPO" log -1 --format='commit %h %s' 2> /dev/null | cut -c1-100
  echo "stages: $STAGES${BUDGET:+ (budget $BUDGET s)}"
  # the carried packages import, with the versions the stages run (their import-time warnings left out)
  "$PY" -W ignore - << 'EOF' 2>&1 | grep -v -E "^\[|^W[0-9]{4} |Warning"
import importlib, importlib.metadata as metadata
for module, package in (("datasets", "datasets"), ("deepspeed", "deepspeed"), ("seqeval", "seqeval"),
                        ("torchao", "torchao"), ("liger_kernel", "liger-kernel"), ("pyarrow", "pyarrow"),
                        ("typing_extensions", "typing_extensions")):
    try:
        importlib.import_module(module)
        print(f"{package} {metadata.version(package)}")
    except Exception as error:  # noqa: BLE001  said, and the stages run without it
        print(f"{package}: IMPORT FAILED: {type(error).__name__}: {str(error)[:160]}")
EOF
} 2>&1 | tee "$RESULTS/environment.txt"

COMPILED="ours [sdpa_padded, compiled by layer]" GRAPHED="ours [sdpa_padded, compiled by layer, CUDA graphs]"
if stage bert; then  # each of ours with the residual stream in fp32 and in bf16, then 300 steps of each stream
  bench bert128 "${BERT_TIMEOUT:-360}" --seq-lengths 128 --batch 256 --kernels sdpa_padded varlen \
    --residual-stream fp32 half --bucket-tokens 256 --profile --convergence-steps 300 "${REAL[@]}"
fi
no_instances() {  # a launch stage without gpu_prepare.sh's instances: named, not silent
  [ -d "$INPUTS/instances128" ] && return 1
  echo "== $1 skipped: no $INPUTS/instances128 (run benchmarks/gpu_prepare.sh and carry .gpu_inputs)" \
    | tee -a "$RESULTS/skipped_stages.txt"
}
if stage launch && ! no_instances launch; then  # steps 21-25 profiled (launch_profile.txt), 31-100 timed
  pretrain launch "$COMPILED" 100 30 --profile-steps 5 --profile-after 20
  cp /tmp/launch/profile.txt "$RESULTS/launch_profile.txt" 2> /dev/null && head -14 "$RESULTS/launch_profile.txt"
fi
if stage tests; then
  # Three parts, in order of value, each a pytest run within what is left of the stage's limit: the kernels,
  # their dropout and the compiled forward (test_gpu.py, which decide what auto picks); the optimizers, numerics,
  # fp8 and the MLM loss; CUDA graphs, the longest. --tb=short -rfEs: each failure's reason in the summary too;
  # --continue-on-collection-errors: a file that cannot import costs its own tests only. Left out: the bench on
  # the GPU (the bert stage's run) and DeepSpeed's FusedAdam, which builds with nvcc on first use (minutes; it
  # does not build on the lent machines: the Docker image prebuilds it).
  PER_TEST=(); "$PY" -c "import pytest_timeout" 2> /dev/null && PER_TEST=(--timeout 150)
  TESTS_END=$(( SECONDS + $(within "${TEST_TIMEOUT:-240}") ))
  : > "$RESULTS/gpu_tests.log"
  gpu_tests() {  # gpu_tests PART -k EXPRESSION FILES...: one part, logged after a "-- part" line
    local part="$1"; shift
    local limit=$(( TESTS_END - SECONDS )); (( limit > 10 )) || { echo "-- part $part: no time left" \
      | tee -a "$RESULTS/gpu_tests.log"; return; }
    echo "-- part $part ($limit s)" | tee -a "$RESULTS/gpu_tests.log"
    timeout -k 10 "$limit" "$PY" -m pytest -v -p no:cacheprovider -m gpu --tb=short -rfEs --failures-at-once \
      --continue-on-collection-errors "${PER_TEST[@]}" "$@" 2>&1 | tee -a "$RESULTS/gpu_tests.log"
  }
  gpu_tests kernels -k "not test_bench_gpu_runs_on_the_gpu and not cuda_graphs" tests/test_gpu.py
  gpu_tests numerics -k "not deepspeed_fused_adam" tests/test_optim.py tests/test_pretrain_numerics.py \
    tests/test_fp8.py tests/test_mlm_loss.py
  gpu_tests graphs -k "cuda_graphs" tests/test_gpu.py
fi

# Where the allocator retried inside the launch's timed steps (a synchronize and cudaFree each): once more with
# expandable segments, which map more memory into a segment instead of freeing the cache
# (launch_expandable_vs_bench.json). After the tests: a second opinion on the launch is worth less than they are.
retried() {  # whether launch/pretrain.py's timed steps saw the CUDA allocator retry (launch_vs_bench.json)
  "$PY" -c "import json, sys; run = json.load(open(sys.argv[1]))['run']
sys.exit(0 if run.get('cuda_alloc_retries_in_window', 0) > 0 else 1)" "$RESULTS/launch_vs_bench.json" 2> /dev/null
}
if stage expandable && ! no_instances expandable; then
  if retried; then
    (export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; pretrain launch_expandable "$COMPILED" 100 30)
  else
    echo "   nothing to rerun: launch_vs_bench.json shows no allocator retry in the timed steps (or no launch ran)"
  fi
fi

if stage fp8; then
  # ours only (the bert stage measured transformers on the same batches): bf16 then fp8, then 300 steps of each
  bench fp8 "${FP8_TIMEOUT:-300}" --seq-lengths 128 --batch 256 --kernels sdpa_padded --precision fp8 --no-baselines \
    --bucket-tokens 256 --profile --convergence-steps 300 "${REAL[@]}"
fi

if stage families; then
  for family in roberta albert; do
    bench "$family" "${FAMILY_TIMEOUT:-150}" --architecture "$family" --seq-lengths 128 --batch 256 \
      --kernels sdpa_padded --baselines compiled --bucket-tokens 256 "${REAL[@]}"
  done
fi

if stage finetune; then
  TOKENIZER=(); [ -d "$INPUTS/tokenizer" ] && TOKENIZER=(--tokenizer "$INPUTS/tokenizer")
  fresh finetune.json bench_finetune.log
  timeout -k 10 "$(within "${FT_TIMEOUT:-240}")" "$PY" benchmarks/bench_finetune.py --device cuda --model bert-base \
    --epochs 2 --train-examples 2000 --grouped-baseline "${TOKENIZER[@]}" --output "$RESULTS/finetune.json" 2>&1 \
    | tee "$RESULTS/bench_finetune.log"
fi

if stage bert512; then
  bench bert512 "${BERT_TIMEOUT:-240}" --seq-lengths 512 --batch 64 --kernels sdpa_padded varlen --profile
fi

if stage autotune; then  # inductor's GEMM templates timed against cuBLAS, kept where faster (epilogues fused)
  bench autotune "${AUTOTUNE_TIMEOUT:-300}" --seq-lengths 128 --batch 256 --kernels sdpa_padded \
    --compile-mode default max-autotune-no-cudagraphs --bucket-tokens 256 --no-baselines --profile "${REAL[@]}"
fi

if stage graphs && ! no_instances graphs; then  # ours as CUDA graphs, then the launch against it
  TORCH_LOGS=cudagraphs bench graphs128 "${GRAPHS_TIMEOUT:-150}" --seq-lengths 128 --batch 256 --kernels sdpa_padded \
    --compile-mode reduce-overhead --bucket-tokens 256 --no-baselines "${REAL[@]}" > /dev/null  # the log: graphs128.log
  grep -A 2 "^system" "$RESULTS/graphs128.log"
  # 100 steps, the first 50 left out: a shape runs uncaptured once, then records
  BENCH_JSON="$RESULTS/graphs128.json" pretrain launch_graphs "$GRAPHED" 100 50 --compile-mode reduce-overhead
fi

if stage blocks; then  # ours only, 4 layers per compiled region: 3 region calls a forward instead of 12
  bench blocks "${BLOCKS_TIMEOUT:-120}" --seq-lengths 128 --batch 256 --kernels sdpa_padded --layers-per-graph 4 \
    --bucket-tokens 256 --no-baselines "${REAL[@]}"
fi

if stage batch512; then  # ours only, twice the micro-batch: how much of the step is launch overhead
  bench batch512 "${BATCH_TIMEOUT:-90}" --seq-lengths 128 --batch 512 --kernels sdpa_padded --bucket-tokens 256 \
    --no-baselines "${REAL[@]}"
fi

if stage whole; then  # varlen, whole forward, CUDA graphs: one region call a micro-batch
  bench whole "${WHOLE_TIMEOUT:-300}" --seq-lengths 128 --batch 256 --kernels varlen --compile-scope whole \
    --compile-mode reduce-overhead --bucket-tokens 256 --no-baselines "${REAL[@]}"
fi

if stage fp8large; then  # FP8 where the GEMMs are wider: BERT-large, bf16 then fp8, no convergence runs
  bench fp8large "${FP8_TIMEOUT:-300}" --model bert-large --seq-lengths 128 --batch 128 --kernels sdpa_padded \
    --precision fp8 --no-baselines --bucket-tokens 256 --profile "${REAL[@]}"
fi

echo "== done ($(date +%T))"
"$PY" benchmarks/gpu_goals.py "$RESULTS" --out "$RESULTS/goals.md"  # a verdict per goal, then every row
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/gpu_check.tgz" -C "$RESULTS" . && echo "results: \$OUT/gpu_check.tgz"
fi
