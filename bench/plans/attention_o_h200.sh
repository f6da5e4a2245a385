#!/usr/bin/env bash
# One device call (issue 14): the LocDiT attention inside its o_proj (bench/probes/attention_o_fused.py: head splits
# × BLOCK_N against the stage's chain qkv → sequence_attention → o_proj + norm hand-over, CHAIN layer passes per
# graph), then `bench profile` of PROFILES (b1, the stages at this tree) for what is left of END_S.
#   BENCH_GIT_COMMIT=$(git rev-parse --short HEAD) PROFILES="voxcpm2/base_lm_step voxcpm2/residual_lm_step" \
#     bash bench/plans/attention_o_h200.sh
. "$(dirname "$0")/setup_device.sh"
timeout "${PROBE_S:-300}" python3 -m bench.probes.attention_o_fused "$OUT/attention_o.json" cuda \
  > "$OUT/attention_o.txt" 2>&1
echo "probe rc $? at $(( $(date +%s) - T0 )) s"; cut -c1-200 "$OUT/attention_o.txt" | tail -20
for st in ${PROFILES:-}; do
  LEFT=$(( ${END_S:-570} - ($(date +%s) - T0) )); [ "$LEFT" -gt 60 ] || { echo "skipped profile $st"; continue; }
  timeout -s INT -k 10 "$LEFT" python3 -m bench profile "$st" --axis batch=1 --out "$OUT/profiles" --calls 10 \
    --reps 50 > "$LOGS/profile_${st//\//_}.log" 2>&1
  echo "profile $st: $(grep -E '^\[b' "$LOGS/profile_${st//\//_}.log" | cut -c1-220)"
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
