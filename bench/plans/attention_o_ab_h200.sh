#!/usr/bin/env bash
# One device call (issue 14): `ttsaot::sequence_attention_o` in the LocDiT. 1. the probe's sweep
# (bench/probes/attention_o_fused.py; ATTENTION_O_SPLITS / _BLOCK_NS / _WARPS narrow it) alone on the GPU; 2. the GPU
# tests of TESTS (pytest args, quoted) beside 3. verified builds of STAGES for VARIANTS (stage_ab_h100.sh's: `attno` /
# `noattno` this tree with TTSAOT_ATTENTION_O=1 / 0, `old` OTHER), side by side; 4. bench.probes.replay_ab of each stage's
# builds; 5. `bench profile` of PROFILES with the PROFILE_VARIANT build (attno), for what is left of END_S.
#   mkdir -p .snap/old && git archive <old> builder runtime bench pyproject.toml | tar -x -C .snap/old --exclude=bench/results
#   OTHER=.snap/old BENCH_GIT_COMMIT=$(git rev-parse --short HEAD) TESTS="-k 'x or y' tests/a.py" \
#     bash bench/plans/attention_o_ab_h200.sh   (carry .snap)
. "$(dirname "$0")/setup_device.sh"
STAGES=${STAGES:-voxcpm2/locdit}; VARIANTS=${VARIANTS:-attno noattno old}
if [ "${PROBE_S:-150}" -gt 0 ]; then  # PROBE_S=0: no probe
  timeout "${PROBE_S:-150}" python3 -m bench.probes.attention_o_fused "$OUT/attention_o.json" cuda \
    > "$OUT/attention_o.txt" 2>&1
  echo "probe rc $? at $(( $(date +%s) - T0 )) s"; cut -c1-200 "$OUT/attention_o.txt" | tail -16
fi
[ -n "${TESTS:-}" ] && (eval "timeout ${TESTS_S:-300} python3 -m pytest -q -m gpu -n 4 -p no:cacheprovider $TESTS" \
  > "$OUT/gpu_tests.txt" 2>&1 &)
OUT=$OUT/stages TESTS= STAGES=$STAGES VARIANTS=$VARIANTS AXIS=batch=1 JOBS=${JOBS:-3} VERIFY=1 BUILD_S=${BUILD_S:-300} END_S=0 \
  bash bench/plans/stage_ab_h100.sh > "$LOGS/stage_ab.txt" 2>&1
echo "builds at $(( $(date +%s) - T0 )) s"; grep -h "bench build" "$LOGS/stage_ab.txt" | cut -c1-160
for st in $STAGES; do
  A=(); for v in $VARIANTS; do  # the artifact that holds this stage (bench build makes one per stage)
    m=$(grep -l "\"${st#*/}\"" $(find "/tmp/ab_cache_$v" -path "*/${st%/*}/manifest.json") | head -1)
    A+=(--artifact "$v=$(dirname "$m")"); done
  LEFT=$(( ${END_S:-550} - ($(date +%s) - T0) )); [ "$LEFT" -gt 30 ] || { echo "skipped replay $st"; continue; }
  timeout "$LEFT" python3 -m bench.probes.replay_ab "${A[@]}" --stage "${st#*/}" --rounds "${ROUNDS:-7}" \
    --out "$OUT/replay_${st#*/}" > "$OUT/replay_${st#*/}.txt" 2>&1
  echo "replay $st at $(( $(date +%s) - T0 )) s:"; tail -8 "$OUT/replay_${st#*/}.txt"
done
for st in ${PROFILES:-}; do
  LEFT=$(( ${END_S:-550} - ($(date +%s) - T0) )); [ "$LEFT" -gt 40 ] || { echo "skipped profile $st"; continue; }
  timeout -s INT -k 10 "$LEFT" python3 -m bench profile "$st" --axis batch=1 --cache-dir /tmp/ab_cache_${PROFILE_VARIANT:-attno} \
    --out "$OUT/profiles" --calls 10 --reps 50 > "$LOGS/profile_${st//\//_}.log" 2>&1
  echo "profile $st: $(grep -E '^\[b' "$LOGS/profile_${st//\//_}.log" | cut -c1-220)"
done
echo "gpu tests: $(tail -1 "$OUT/gpu_tests.txt" 2>/dev/null)"
tar czf "$OUT/logs.tgz" -C "$OUT" logs 2>/dev/null; rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
