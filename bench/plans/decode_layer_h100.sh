#!/usr/bin/env bash
# One device call (< 10 min on an H100): the persistent decode-layer kernel (ttsaot::decode_layer) and the
# single-launch decode_attention — their GPU tests (real VoxCPM2 / Qwen shapes against the references), then the
# VoxCPM2 decode steps through bench decode-stages (ttsaot vs inductor vs torch.compile + graph, profiled).
#   LAYER_TESTS_S=120 TESTS_S=100 BASE_S=380 RESIDUAL_S=0 bash bench/plans/decode_layer_h100.sh
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.txt" 2>&1
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia_smi.txt" 2>&1
# the layer kernel's GPU tests first: a hang there (rc 124) skips the stage runs, which would hang the same way
timeout -s INT -k 10 "${LAYER_TESTS_S:-120}" python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/test_kernels_decode_layer.py > "$OUT/gpu_tests_layer.log" 2>&1
LAYER_RC=$?; echo "layer gpu tests rc $LAYER_RC at $(( $(date +%s) - T0 )) s"; tail -15 "$OUT/gpu_tests_layer.log" | cut -c1-300
if [ "${TESTS_S:-100}" -gt 0 ]; then
  timeout -s INT -k 10 "${TESTS_S:-100}" python3 -m pytest -q -p no:cacheprovider -m gpu -x \
    ${TESTS:-tests/test_kernels_decode_attention.py} > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -15 "$OUT/gpu_tests.log" | cut -c1-300
fi
[ "$LAYER_RC" = 124 ] && { echo "layer kernel hung: stage runs skipped"; exit 1; }
run_stage() {  # stage seconds jobs batches
  [ "$2" -gt 0 ] || return 0
  timeout -s INT -k 10 "$2" python3 -m bench decode-stages --stage "$1" --batches "$4" --budget $(($2 - 40)) \
    --jobs "$3" --compile-mode "${COMPILE_MODE:-default}" --out "$OUT" > "$OUT/decode_stages_$1.log" 2>&1
  echo "$1 rc $? at $(( $(date +%s) - T0 )) s"; grep -v "Warning\|warn(" "$OUT/decode_stages_$1.log" | tail -12 | cut -c1-400
}
run_stage base_lm_step "${BASE_S:-380}" "${BASE_JOBS:-1}" "${BASE_BATCHES:-1,16}"
LEFT=$(( 585 - ($(date +%s) - T0) ))
R=${RESIDUAL_S:-0}; run_stage residual_lm_step "$(( R < LEFT ? R : LEFT ))" "${RESIDUAL_JOBS:-1}" "${RESIDUAL_BATCHES:-1,16}"
