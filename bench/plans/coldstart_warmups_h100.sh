#!/usr/bin/env bash
# One device call (issue 17): the warm-up calls before each CUDA-graph capture at load. Builds Fish's DAC decoder
# (full, default plan: 18 buckets; STAGES overrides) with the tree's code, then bench/probes/coldstart_warmups.py
# alone on the host (fresh processes, WARMUP_CALLS 3 and 1 alternating, REPEATS each), then the GPU suite for the
# time left (`pytest -m gpu -v`, with the tree's WARMUP_CALLS default) as the correctness check.
#   OUT=... bash bench/plans/coldstart_warmups_h100.sh
. "$(dirname "$0")/setup_device.sh"
ART=/tmp/cw_art; rm -rf "$ART"
timeout -s INT -k 10 "${BUILD_S:-260}" build-artifacts build fish-s2-pro --random-weights --preset full \
  --stages "${STAGES:-dac_decoder}" --device cuda --out "$ART" > "$LOGS/build.log" 2>&1
echo "build rc $? at $(( $(date +%s) - T0 )) s: $(tail -2 "$LOGS/build.log" | cut -c1-200)"
timeout "${PROBE_S:-150}" python3 -m bench.probes.coldstart_warmups --artifact "$ART/fish-s2-pro" \
  --repeats "${REPEATS:-3}" --out "$OUT" > "$LOGS/probe.txt" 2>&1
echo "probe at $(( $(date +%s) - T0 )) s:"; grep -E "^rep" "$LOGS/probe.txt" | cut -c1-200
LEFT=$(( 580 - ($(date +%s) - T0) ))
if [ "$LEFT" -gt 60 ]; then
  timeout -s INT -k 10 "$LEFT" python3 -m pytest -m gpu -v -n 8 --durations=30 -p no:cacheprovider tests/gpu \
    tests/test_runtime_core.py tests/test_kernels_skinny_linear.py > "$LOGS/gpu_tests.txt" 2>&1
  echo "gpu tests at $(( $(date +%s) - T0 )) s: $(grep -cE ' PASSED' "$LOGS/gpu_tests.txt") passed, \
$(grep -cE ' FAILED| ERROR' "$LOGS/gpu_tests.txt") failed/errors"; grep -E "FAILED|ERROR" "$LOGS/gpu_tests.txt" | head -5
fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
