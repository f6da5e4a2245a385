#!/usr/bin/env bash
# One device call (issue 14): this tree's kernel defaults on the decode stages — STAGES built verified (loaded and
# checked against eager) and profiled at b1 (stage_ab_h100.sh, variant `new`, by STAGE_END_S), then each of
# RUN_STAGES side by side in one process by `bench run` (eager, the reference loop, the torch.compile loop with its
# CUDA graphs, ttsaot from the same package cache) for what is left of END_S.
#   BENCH_GIT_COMMIT=$(git rev-parse --short HEAD) bash bench/plans/defaults_h200.sh
. "$(dirname "$0")/setup_device.sh"
END_S=${END_S:-520}
OUT=$OUT/stages STAGES=${STAGES:-qwen3-tts-12hz/code_predictor fish-s2-pro/fast_ar} VARIANTS=new VERIFY=1 AXIS=batch=1 \
  JOBS=${JOBS:-2} BUILD_S=${BUILD_S:-240} END_S=$(( ${STAGE_END_S:-330} - ($(date +%s) - T0) )) \
  bash bench/plans/stage_ab_h100.sh
for fs in ${RUN_STAGES:-qwen3-tts-12hz/code_predictor}; do
  LEFT=$(( END_S - ($(date +%s) - T0) )); [ "$LEFT" -gt 60 ] || { echo "skipped run $fs (time)"; continue; }
  timeout -s INT -k 10 "$LEFT" python3 -m bench run --family "${fs%/*}" --stages "${fs#*/}" --axis batch=1 \
    --variants "${RUN_VARIANTS:-eager,ttsaot_graph,loop_eager_host,loop_compile_graph}" --no-coldstart --no-snake \
    --compile-budget $(( LEFT - 60 )) --stage-timeout $(( LEFT - 5 )) --cache-dir /tmp/ab_cache_new --out "$OUT/run" \
    > "$LOGS/run_${fs//\//_}.log" 2>&1
  echo "run $fs at $(( $(date +%s) - T0 )) s:"; tail -12 "$LOGS/run_${fs//\//_}.log" | cut -c1-250
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
