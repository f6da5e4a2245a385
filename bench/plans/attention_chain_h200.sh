#!/usr/bin/env bash
# One device call (issue 14): where a predictor layer's attention time goes (bench/probes/attention_chain.py: the
# attention's warps, its q/k norm and RoPE, its marginal cost in a layer, and the fused ttsaot::qkv_attention layer,
# in PDL chains at batch 1 on the predictors' shapes); with STAGES, then those stages built as VARIANTS (default:
# plain, TTSAOT_QKV_ATTENTION=1 and the whole-cache attention at one warp) and profiled at b1 (stage_ab_h100.sh),
# and the kernels' GPU tests. ~2 min of probe, ~5 min of stages for one stage and three variants.
#   BENCH_GIT_COMMIT=$(git rev-parse --short HEAD) STAGES=qwen3-tts-12hz/code_predictor \
#     bash bench/plans/attention_chain_h200.sh
#   SHAPES="voxcpm2_base_lm voxcpm2_residual_lm" bash bench/plans/attention_chain_h200.sh   (the LM steps' split
#     plans × configs in a layer's chain: which plan the launcher should pick at a 512-token context)
. "$(dirname "$0")/setup_device.sh"
timeout "${PROBE_S:-240}" python3 -m bench.probes.attention_chain "$OUT/attention_chain.json" cuda ${SHAPES:-} \
  > "$OUT/attention_chain.txt" 2>&1
echo "probe at $(( $(date +%s) - T0 )) s:"; cut -c1-250 "$OUT/attention_chain.txt"
if [ -n "${STAGES:-}" ]; then
  OUT=$OUT/stages STAGES=$STAGES VARIANTS="${VARIANTS:-new fused whole1}" AXIS=batch=1 JOBS=${JOBS:-3} \
    BUILD_S=${BUILD_S:-280} END_S=$(( ${END_S:-570} - ($(date +%s) - T0) )) \
    TESTS="${TESTS:-tests/test_kernels_qkv_attention.py tests/test_kernels_decode_attention.py tests/test_kernels_skinny_linear.py}" \
    bash bench/plans/stage_ab_h100.sh
fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
