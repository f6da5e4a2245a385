#!/usr/bin/env bash
# One device call (issue 14): the persistent one-launch decoder layer (`ttsaot::decode_layer`). Its GPU tests (real
# predictor shapes, graph replays), the probe against the five per-op kernels (bench/probes/
# decode_layer_persistent.py), then the Qwen code_predictor built on it and on Inductor's code, profiled, and both
# timed in one `bench run` process (predictor_kernels_h100.sh).
#   OUT=... bash bench/plans/decode_layer_h100.sh        (STAGE, KERNELS, VARIANTS, PROFILE, AXIS as there)
. "$(dirname "$0")/setup_device.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$LOGS/nvidia_smi.txt" 2>&1
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_decode_layer.py ${GPU_TESTS:-} \
  > "$LOGS/gpu_tests.txt" 2>&1
echo "gpu tests at $(( $(date +%s) - T0 )) s:"; tail -3 "$LOGS/gpu_tests.txt"
timeout 150 python3 -m bench.probes.decode_layer_persistent --out "$OUT" > "$LOGS/probe.txt" 2>&1
echo "probe at $(( $(date +%s) - T0 )) s:"; cut -c1-400 "$LOGS/probe.txt" | tail -5
if [ -n "${STAGE:-qwen3-tts-12hz/code_predictor}" ]; then
  rm -rf "$LOGS/pk"; mkdir -p "$LOGS/pk"
  OUT=$LOGS/pk STAGES=${STAGE:-qwen3-tts-12hz/code_predictor} KERNELS=${KERNELS:-ttsaot,inductor} \
    VARIANTS=${VARIANTS:-ttsaot_kernels,ttsaot_inductor} PROFILE=${PROFILE:-ttsaot} AXIS=${AXIS:-batch=1} RUN=1 \
    END_S=$(( 575 - ($(date +%s) - T0) )) BUILD_S=280 bash bench/plans/predictor_kernels_h100.sh
  mv "$LOGS/pk"/*.json "$OUT"/ 2>/dev/null; mv "$LOGS/pk/profiles"/*.json "$OUT"/ 2>/dev/null
  mv "$LOGS/pk/logs.tgz" "$OUT/stage_logs.tgz" 2>/dev/null
fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
