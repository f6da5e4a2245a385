#!/usr/bin/env bash
# One device call (issue 14): ttsaot::sample_tokens before and after the two-bit radix select
# (bench/probes/sampler_radix4.py; BASE: a file with the earlier kernel, carried, or a git revision), its GPU tests;
# WARPS=1: the working tree's kernel at 1-16 warps (bench/probes/sampler_warps.py); STAGES: then those predictors
# built (golden codes verified on the GPU) and profiled at batch 1 (bench/plans/predictor_kernels_h100.sh).
#   BASE=.probe_base/sample_triton_01d382b.py STAGES=qwen3-tts-12hz/code_predictor bash bench/plans/sampler_radix4_h200.sh
. "$(dirname "$0")/setup_device.sh"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_sample.py > "$LOGS/gpu_tests.txt" 2>&1
echo "gpu tests at $(( $(date +%s) - T0 )) s:"; tail -2 "$LOGS/gpu_tests.txt"
timeout 200 python3 -m bench.probes.sampler_radix4 "$OUT/sampler_radix4.json" "${BASE:-01d382b}" > "$OUT/sampler_radix4.txt" 2>&1
echo "radix4 probe at $(( $(date +%s) - T0 )) s:"; cut -c1-250 "$OUT/sampler_radix4.txt"
if [ "${WARPS:-0}" = 1 ]; then
  timeout 150 python3 -m bench.probes.sampler_warps "$OUT/sampler_warps.json" > "$OUT/sampler_warps.txt" 2>&1
  echo "warps probe at $(( $(date +%s) - T0 )) s:"; cut -c1-200 "$OUT/sampler_warps.txt"
fi
if [ -n "${STAGES:-}" ]; then
  OUT=$LOGS/pk STAGES=$STAGES KERNELS=ttsaot PROFILE=ttsaot RUN=0 AXIS=batch=1 BUILD_S=${BUILD_S:-260} \
    END_S=$(( ${END_S:-560} - ($(date +%s) - T0) )) bash bench/plans/predictor_kernels_h100.sh
  mkdir -p "$OUT/profiles"; mv "$LOGS/pk/profiles"/*.json "$OUT/profiles"/ 2>/dev/null; mv "$LOGS/pk/logs.tgz" "$OUT/stage_logs.tgz"
fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
