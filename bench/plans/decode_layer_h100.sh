#!/usr/bin/env bash
# One device call (issue 14): the persistent one-launch decoder layer (`ttsaot::decode_layer`, weight slices in
# registers). The Qwen code_predictor built twice side by side in the background (`new`: the layer kernel; `fiveops`:
# TTSAOT_DECODE_LAYER=0, the five per-op kernels), meanwhile the layer's GPU tests; then the probe against the five
# ops (bench/probes/decode_layer_persistent.py) alone on the GPU; then `bench profile` of both builds, one at a time.
#   OUT=... bash bench/plans/decode_layer_h100.sh      (STAGES, AXIS, BUILD_S, PROBE_S override)
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; LOGS=$OUT/logs; mkdir -p "$LOGS"; T0=$(date +%s)
STAGES=${STAGES:-qwen3-tts-12hz/code_predictor}; AXIS=${AXIS:-batch=1}; BUILD_S=${BUILD_S:-300}
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$LOGS/install.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$LOGS/nvidia_smi.txt" 2>&1
for v in new fiveops; do
  sw=1; [ "$v" = fiveops ] && sw=0
  TTSAOT_DECODE_LAYER=$sw timeout -s INT -k 10 "$BUILD_S" python3 -m bench build $STAGES --axis "$AXIS" --no-verify \
    --jobs 2 --cache-dir "/tmp/dl_cache_$v" > "$LOGS/build_$v.log" 2>&1 &
done
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_decode_layer.py > "$LOGS/gpu_tests.txt" 2>&1
echo "gpu tests at $(( $(date +%s) - T0 )) s:"; tail -3 "$LOGS/gpu_tests.txt" | cut -c1-300
wait
echo "builds done at $(( $(date +%s) - T0 )) s"; grep -h "bench build" "$LOGS"/build_*.log | cut -c1-200
timeout "${PROBE_S:-150}" python3 -m bench.probes.decode_layer_persistent --out "$OUT" > "$LOGS/probe.txt" 2>&1
echo "probe at $(( $(date +%s) - T0 )) s:"; grep -E "five_ops|persistent" "$LOGS/probe.txt" | cut -c1-160
for st in $STAGES; do
  for v in new fiveops; do
    sw=1; [ "$v" = fiveops ] && sw=0
    LEFT=$(( 575 - ($(date +%s) - T0) )); [ "$LEFT" -gt 20 ] || { echo "skipped $st $v (time)"; continue; }
    TTSAOT_DECODE_LAYER=$sw timeout -s INT -k 10 "$LEFT" python3 -m bench profile "$st" --axis "$AXIS" \
      --cache-dir "/tmp/dl_cache_$v" --out "$OUT/$v" --calls 10 --reps 50 > "$LOGS/profile_${v}_${st//\//_}.log" 2>&1
    echo "$v $st: $(grep -E '^\[b' "$LOGS/profile_${v}_${st//\//_}.log" | cut -c1-220)"
  done
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
