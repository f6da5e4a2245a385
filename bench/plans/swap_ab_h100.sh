#!/usr/bin/env bash
# One device call (issue 14): skinny_linear's swapped tile form (TTSAOT_SKINNY_SWAP_AB=1: W · xᵀ on sm_90 warpgroup
# MMAs) 1. per projection (bench.probes.swap_ab_tiles: the op's plan, its tile configs and swapped tiles × split-K
# against a same-bytes copy), alone on the GPU; then 2. the VoxCPM2 LM steps built both ways (`new`, `swap`) at
# B=16 with the swapped form's GPU tests beside the builds, replayed A/B, and the swapped residual step profiled
# (split_rule_ab_h200.sh). ATTENTION_S=<seconds>: first `bench kernels --sections sweep_attention` (decode
# attention's context splits × BLOCK_S at B = 1 / 4 / 16 against its plan), alone on the GPU.
#   BENCH_GIT_COMMIT=<this tree's commit> bash bench/plans/swap_ab_h100.sh
#   PROBE_S=0 ATTENTION_S=150 TESTS= PROFILES= JOBS=4 ...: the steps' A/B and the attention splits (~400 s)
. "$(dirname "$0")/setup_device.sh"
if [ "${PROBE_S:-260}" -gt 0 ]; then  # PROBE_S=0: the stages only
  timeout "${PROBE_S:-260}" python3 -m bench.probes.swap_ab_tiles "$OUT/swap_ab_tiles.json" "$(( ${PROBE_S:-260} - 40 ))" \
    > "$OUT/swap_ab_tiles.txt" 2>&1
  echo "probe at $(( $(date +%s) - T0 )) s"; grep -v Warning "$OUT/swap_ab_tiles.txt" | tail -14 | cut -c1-260
fi
if [ -n "${ATTENTION_S:-}" ]; then  # ATTENTION_S=<seconds>: the attention sweep first, alone on the GPU
  timeout "$ATTENTION_S" python3 -m bench kernels --sections copy,sweep_attention --budget "$(( ATTENTION_S - 30 ))" \
    --out "$OUT/attention_splits" > "$OUT/attention_splits.txt" 2>&1
  echo "attention splits at $(( $(date +%s) - T0 )) s"; grep "sweep best" "$OUT/attention_splits.txt" | cut -c1-240
fi
OUT=$OUT STAGES="${STAGES:-voxcpm2/residual_lm_step voxcpm2/base_lm_step}" VARIANTS="new swap" AXIS=batch=16 \
  TESTS="${TESTS-tests/test_kernels_skinny_linear.py -k 'alternative_tile_forms and swap'}" PROFILES="${PROFILES-voxcpm2/residual_lm_step}" \
  PROFILE_VARIANT=swap BUILD_S=${BUILD_S:-220} END_S=$(( ${END_S:-560} - ($(date +%s) - T0) )) ROUNDS=${ROUNDS:-5} \
  bash "$(dirname "$0")/split_rule_ab_h200.sh"
