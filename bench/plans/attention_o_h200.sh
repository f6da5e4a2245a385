#!/usr/bin/env bash
# One device call (issue 14): `ttsaot::sequence_attention_o`, the LocDiT attention inside its o_proj
# (bench/probes/attention_o_fused.py: head splits × BLOCK_N × warps against the stage's chain qkv →
# sequence_attention → o_proj + norm hand-over, CHAIN layer passes per graph), then the GPU tests of TESTS, then
# `bench profile` of PROFILES (b1, the stages at this tree) for what is left of END_S. BG_TESTS (pytest arguments)
# start at once beside the probe: tests whose time is a CPU-bound fixture build.
#   BENCH_GIT_COMMIT=$(git rev-parse --short HEAD) TESTS="tests/test_kernels_sequence_attention_o.py" \
#     BG_TESTS="tests/gpu/test_gpu_voxcpm2_lm.py -k plain_call" PROFILES="voxcpm2/base_lm_step" \
#     bash bench/plans/attention_o_h200.sh
. "$(dirname "$0")/setup_device.sh"
if [ -n "${BG_TESTS:-}" ]; then
  timeout "${BG_TESTS_S:-400}" python3 -m pytest -q -m gpu -p no:cacheprovider $BG_TESTS > "$OUT/gpu_tests_bg.txt" 2>&1 &
fi
timeout "${PROBE_S:-300}" python3 -m bench.probes.attention_o_fused "$OUT/attention_o.json" cuda \
  > "$OUT/attention_o.txt" 2>&1
echo "probe rc $? at $(( $(date +%s) - T0 )) s"; cut -c1-200 "$OUT/attention_o.txt" | tail -32
if [ -n "${TESTS:-}" ]; then
  timeout "${TESTS_S:-200}" python3 -m pytest -q -m gpu -n 4 -p no:cacheprovider $TESTS > "$OUT/gpu_tests.txt" 2>&1
  echo "tests rc $? at $(( $(date +%s) - T0 )) s"; tail -4 "$OUT/gpu_tests.txt" | cut -c1-300
fi
for st in ${PROFILES:-}; do
  LEFT=$(( ${END_S:-570} - ($(date +%s) - T0) )); [ "$LEFT" -gt 60 ] || { echo "skipped profile $st"; continue; }
  timeout -s INT -k 10 "$LEFT" python3 -m bench profile "$st" --axis batch=1 --out "$OUT/profiles" --calls 10 \
    --reps 50 > "$LOGS/profile_${st//\//_}.log" 2>&1
  echo "profile $st: $(grep -E '^\[b' "$LOGS/profile_${st//\//_}.log" | cut -c1-220)"
done
wait
[ -n "${BG_TESTS:-}" ] && { echo "background tests at $(( $(date +%s) - T0 )) s:"; tail -4 "$OUT/gpu_tests_bg.txt" | cut -c1-300; }
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
