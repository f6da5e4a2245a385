#!/usr/bin/env bash
# One device call (issue 14): two builds of each of STAGES as stages, A/B by graph replay. 1. the GPU tests of TESTS
# (files; TESTS= for none), beside 2. verified builds of STAGES for VARIANTS (stage_ab_h100.sh's: `new` this tree,
# `old` OTHER, `nonormout` this tree with TTSAOT_NORM_OUT=0, ...), side by side; 3. bench.probes.replay_ab of each
# stage's builds (graph replays alone, alternating, ROUNDS); 4. `bench profile` of PROFILES with the PROFILE_VARIANT
# build (`new`).
#   mkdir -p .snap/old && git archive <old> builder runtime bench pyproject.toml | tar -x -C .snap/old --exclude=bench/results
#   OTHER=.snap/old BENCH_GIT_COMMIT=$(git rev-parse --short HEAD) bash bench/plans/split_rule_ab_h200.sh  (carry .snap)
#   VARIANTS="new nonormout" STAGES="voxcpm2/locdit voxcpm2/local_encoder" TESTS="tests/x.py" bash bench/plans/...
#   VARIANTS="new stream streampdl" AXIS=batch=16 TESTS= ...: the LM steps at B=16, the streamed tile form with and
#   without the programmatic-launch attribute (AXIS: the bucket axis of builds, replays and profiles; default batch=1)
. "$(dirname "$0")/setup_device.sh"
STAGES=${STAGES:-voxcpm2/base_lm_step voxcpm2/residual_lm_step}; VARIANTS=${VARIANTS:-new old}
TESTS=${TESTS-tests/test_kernels_decode_attention.py}
# TESTS: pytest arguments, a quoted -k expression too
[ -n "$TESTS" ] && (eval "timeout ${TESTS_S:-300} python3 -m pytest -q -m gpu -n 4 -p no:cacheprovider $TESTS" \
  > "$OUT/gpu_tests.txt" 2>&1 &)
OUT=$OUT/stages TESTS= STAGES=$STAGES VARIANTS=$VARIANTS AXIS=${AXIS:-batch=1} JOBS=${JOBS:-3} VERIFY=1 BUILD_S=${BUILD_S:-300} END_S=0 \
  bash bench/plans/stage_ab_h100.sh > "$LOGS/stage_ab.txt" 2>&1
while pgrep -f "pytest -q -m gpu" > /dev/null; do sleep 2; done  # the tests, started in a subshell
echo "builds + tests at $(( $(date +%s) - T0 )) s"; tail -3 "$OUT/gpu_tests.txt" 2>/dev/null
grep -h "bench build" "$LOGS/stage_ab.txt" | cut -c1-160
for st in $STAGES; do
  # the artifact that holds this stage, the newest (bench build makes one per stage and axis: a second run at
  # another AXIS on the same machine would otherwise replay the first run's buckets)
  A=(); for v in $VARIANTS; do
    m=$(ls -t $(grep -l "\"${st#*/}\"" $(find "/tmp/ab_cache_$v" -path "*/${st%/*}/manifest.json")) | head -1)
    A+=(--artifact "$v=$(dirname "$m")"); done
  LEFT=$(( ${END_S:-560} - ($(date +%s) - T0) )); [ "$LEFT" -gt 30 ] || { echo "skipped replay $st"; continue; }
  timeout "$LEFT" python3 -m bench.probes.replay_ab "${A[@]}" --stage "${st#*/}" --rounds "${ROUNDS:-7}" \
    --out "$OUT/replay_${st#*/}" > "$OUT/replay_${st#*/}.txt" 2>&1
  echo "replay $st at $(( $(date +%s) - T0 )) s:"; tail -8 "$OUT/replay_${st#*/}.txt"
done
for st in ${PROFILES:-}; do
  LEFT=$(( ${END_S:-560} - ($(date +%s) - T0) )); [ "$LEFT" -gt 40 ] || { echo "skipped profile $st"; continue; }
  timeout -s INT -k 10 "$LEFT" python3 -m bench profile "$st" --axis "${AXIS:-batch=1}" --cache-dir "/tmp/ab_cache_${PROFILE_VARIANT:-new}" \
    --out "$OUT/profiles" --calls 10 --reps 50 > "$LOGS/profile_${st//\//_}.log" 2>&1
  echo "profile $st: $(grep -E '^\[b' "$LOGS/profile_${st//\//_}.log" | cut -c1-220)"
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs 2>/dev/null; rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
