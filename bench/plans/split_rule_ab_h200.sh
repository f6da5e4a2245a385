#!/usr/bin/env bash
# One device call (issue 14): the split-form attention rule (005c08b) against the tree before it, as stages.
# 1. the decode-attention GPU tests, beside 2. builds of STAGES from this tree (`new`) and OTHER (`old`, verified,
# side by side); 3. bench.probes.replay_ab of each stage's two builds (graph replays alone, alternating, ROUNDS).
#   mkdir -p .snap/old && git archive <old> builder runtime bench pyproject.toml | tar -x -C .snap/old --exclude=bench/results
#   OTHER=.snap/old BENCH_GIT_COMMIT=$(git rev-parse --short HEAD) bash bench/plans/split_rule_ab_h200.sh  (carry .snap)
. "$(dirname "$0")/setup_device.sh"
STAGES=${STAGES:-voxcpm2/base_lm_step voxcpm2/residual_lm_step}
[ "${TESTS:-1}" = 1 ] && timeout 300 python3 -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/test_kernels_decode_attention.py \
  > "$OUT/gpu_tests.txt" 2>&1 &
OUT=$OUT/stages STAGES=$STAGES VARIANTS="new old" AXIS=batch=1 JOBS=${JOBS:-3} VERIFY=1 BUILD_S=${BUILD_S:-300} END_S=0 \
  bash bench/plans/stage_ab_h100.sh > "$LOGS/stage_ab.txt" 2>&1
wait
echo "builds + tests at $(( $(date +%s) - T0 )) s"; tail -3 "$OUT/gpu_tests.txt"; grep -h "bench build" "$LOGS/stage_ab.txt" | cut -c1-160
for st in $STAGES; do
  A=(); for v in new old; do  # the artifact that holds this stage (bench build makes one per stage)
    m=$(grep -l "\"${st#*/}\"" $(find "/tmp/ab_cache_$v" -path "*/voxcpm2/manifest.json") | head -1)
    A+=(--artifact "$v=$(dirname "$m")"); done
  LEFT=$(( ${END_S:-560} - ($(date +%s) - T0) )); [ "$LEFT" -gt 30 ] || { echo "skipped replay $st"; continue; }
  timeout "$LEFT" python3 -m bench.probes.replay_ab "${A[@]}" --stage "${st#*/}" --rounds "${ROUNDS:-7}" \
    --out "$OUT/replay_${st#*/}" > "$OUT/replay_${st#*/}.txt" 2>&1
  echo "replay $st at $(( $(date +%s) - T0 )) s:"; tail -6 "$OUT/replay_${st#*/}.txt"
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs stages/logs 2>/dev/null; rm -rf "$LOGS" "$OUT/stages/logs"
echo "done at $(( $(date +%s) - T0 )) s"
