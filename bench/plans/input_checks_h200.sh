#!/usr/bin/env bash
# One device call: the captured input checks (runtime/validation.py DeviceValueChecks) on the stages whose calls
# check device inputs, and the fast_ar whole-cache attention at 4 against 8 warps.
# 1. `bench build` of STAGES (verified) and of fast_ar with TTSAOT_WHOLE_ATTENTION_WARPS=8, while the GPU tests of
#    the change (TESTS) run beside them;
# 2. per stage, `bench run --variants ttsaot_graph` (one process): the call with the captured checks (`ms`), with
#    the same checks run eagerly (`ms_eager_input_checks`, the runtime before) and without checks
#    (`ms_without_input_validation`);
# 3. bench.probes.replay_ab of the two fast_ar builds (graph replays alone, alternating, REPLAY_ROUNDS rounds);
# 4. `bench profile` of PROFILES (b1) for what is left of END_S.
#   BENCH_GIT_COMMIT=$(git rev-parse --short HEAD) bash bench/plans/input_checks_h200.sh
#   WHOLE8=0 TESTS= PROFILES="fish-s2-pro/fast_ar" ...: no second fast_ar build, no tests, profiles after the runs
. "$(dirname "$0")/setup_device.sh"
END_S=${END_S:-560}
STAGES=${STAGES:-qwen3-tts-12hz/code_predictor fish-s2-pro/fast_ar voxcpm2/residual_lm_step voxcpm2/locdit}
TESTS=${TESTS-tests/test_runtime_core.py tests/gpu/test_gpu_code2wav.py tests/gpu/test_gpu_voxcpm2_lm.py}
BUILD=$(printf '%s\n' $STAGES ${PROFILES:-} | sort -u)
timeout -s INT -k 10 300 python3 -m bench build $BUILD --axis batch=1 --jobs 2 --cache-dir /tmp/ab_cache_new \
  > "$LOGS/build_new.log" 2>&1 &
[ "${WHOLE8:-1}" = 1 ] && TTSAOT_WHOLE_ATTENTION_WARPS=8 timeout -s INT -k 10 300 python3 -m bench build fish-s2-pro/fast_ar --axis batch=1 \
  --jobs 2 --cache-dir /tmp/ab_cache_whole8 > "$LOGS/build_whole8.log" 2>&1 &
[ -n "$TESTS" ] && timeout 300 python3 -m pytest -m gpu -v -n 4 -p no:cacheprovider $TESTS > "$LOGS/gpu_tests.txt" 2>&1 &
wait
echo "builds and tests done at $(( $(date +%s) - T0 )) s"; grep -h "bench build" "$LOGS"/build_*.log | cut -c1-200
if [ -n "$TESTS" ]; then
  echo "gpu tests: $(grep -cE ' PASSED' "$LOGS/gpu_tests.txt") passed, $(grep -cE ' FAILED| ERROR' "$LOGS/gpu_tests.txt") failed"
  grep -E "FAILED|ERROR|Error" "$LOGS/gpu_tests.txt" | head -20 | cut -c1-300
fi
for fs in $STAGES; do
  LEFT=$(( END_S - ${RESERVE_S:-80} - ($(date +%s) - T0) )); [ "$LEFT" -gt 30 ] || { echo "skipped run $fs (time)"; continue; }
  timeout -s INT -k 10 "$LEFT" python3 -m bench run --family "${fs%/*}" --stages "${fs#*/}" --axis batch=1 \
    --variants ttsaot_graph --no-coldstart --no-snake --stage-timeout $(( LEFT - 5 )) --cache-dir /tmp/ab_cache_new \
    --out "$OUT/run" > "$LOGS/run_${fs//\//_}.log" 2>&1
  echo "run $fs at $(( $(date +%s) - T0 )) s:"
  python3 - "$OUT/run" "$fs" <<'PY'
import json, sys
from pathlib import Path
fam, st = sys.argv[2].split("/")
for f in Path(sys.argv[1]).rglob(f"{fam}__{st}.json"):
    for k, b in json.load(open(f))["variants"]["ttsaot_graph"].get("buckets", {}).items():
        print(f"  {k}: captured checks {b.get('ms', 0) * 1e3:.1f} us, eager checks "
              f"{b.get('ms_eager_input_checks', 0) * 1e3:.1f} us, no checks {b.get('ms_without_input_validation', 0) * 1e3:.1f} us")
PY
done
[ "${WHOLE8:-1}" = 1 ] && for _ in 1; do
A=(); for v in new whole8; do m=$(find "/tmp/ab_cache_$v" -path "*/fish-s2-pro/manifest.json" | head -1); A+=(--artifact "$v=$(dirname "$m")"); done
LEFT=$(( END_S - ($(date +%s) - T0) ))
[ "$LEFT" -gt 30 ] && timeout "$LEFT" python3 -m bench.probes.replay_ab "${A[@]}" --stage fast_ar --rounds "${REPLAY_ROUNDS:-7}" \
  --out "$OUT/replay_fast_ar" > "$LOGS/replay_fast_ar.txt" 2>&1
echo "replay at $(( $(date +%s) - T0 )) s:"; tail -8 "$LOGS/replay_fast_ar.txt"
done
for st in ${PROFILES:-}; do
  LEFT=$(( END_S - ($(date +%s) - T0) )); [ "$LEFT" -gt 20 ] || { echo "skipped profile $st (time)"; continue; }
  timeout -s INT -k 10 "$LEFT" python3 -m bench profile "$st" --axis batch=1 --cache-dir /tmp/ab_cache_new \
    --out "$OUT/profiles" --calls 10 --reps 50 > "$LOGS/profile_${st//\//_}.log" 2>&1
  echo "profile $st: $(grep -E '^\[b' "$LOGS/profile_${st//\//_}.log" | cut -c1-220)"
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
