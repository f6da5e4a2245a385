#!/usr/bin/env bash
# One device call (issue 14): ttsaot::sample_tokens by bisection (GPU tests, `bench kernels --sections
# copy,sampler`; with GPU_TESTS, more GPU test files), then one predictor (STAGE) built both ways (KERNELS),
# profiled, and timed in one `bench run` process (VARIANTS).
#   OUT=... bash bench/plans/sampler_predictor_h100.sh        (Fish fast_ar: auto was Inductor's code)
#   STAGE=qwen3-tts-12hz/code_predictor KERNELS=ttsaot,inductor VARIANTS=ttsaot_kernels,ttsaot_inductor \
#     GPU_TESTS=tests/test_kernels_decode_attention.py OUT=... bash bench/plans/sampler_predictor_h100.sh
. "$(dirname "$0")/setup_device.sh"
STAGE=${STAGE:-fish-s2-pro/fast_ar}; KERNELS=${KERNELS:-auto,ttsaot}; VARIANTS=${VARIANTS:-ttsaot_graph,ttsaot_kernels}
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_sample.py ${GPU_TESTS:-} \
  > "$LOGS/gpu_tests.txt" 2>&1
echo "gpu tests at $(( $(date +%s) - T0 )) s:"; tail -2 "$LOGS/gpu_tests.txt"
timeout 120 python3 -m bench kernels --device cuda --sections copy,sampler --budget 100 --out "$OUT" \
  > "$LOGS/kernels.txt" 2>&1
echo "kernels at $(( $(date +%s) - T0 )) s:"; grep -E "sampler|copy" "$LOGS/kernels.txt" | tail -6
rm -rf "$LOGS/pk"; mkdir -p "$LOGS/pk"
OUT=$LOGS/pk STAGES=$STAGE KERNELS=$KERNELS VARIANTS=$VARIANTS PROFILE="ttsaot inductor" AXIS=batch=1 RUN=1 \
  END_S=$(( 575 - ($(date +%s) - T0) )) BUILD_S=260 bash bench/plans/predictor_kernels_h100.sh
mv "$LOGS/pk"/*.json "$OUT"/ 2>/dev/null; mkdir -p "$OUT/profiles"; mv "$LOGS/pk/profiles"/*.json "$OUT/profiles"/ 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
