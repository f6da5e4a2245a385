#!/usr/bin/env bash
# One device call (issue 14): the runtime's host path of an LM step, this tree against an older runtime, in one
# call on one machine (a host-bound call's time moves between machines: compare only within a call). The older
# runtime's files (OLD, an ignored folder of runtime/*.py carried with the call, e.g. .snap/ab_dc28bab) are swapped
# in for the runs marked old and restored after; packages are the same (the runtime does not change a build).
# 1. `bench build` of both VoxCPM2 LM steps (verified) while the GPU TESTS run beside them, at this tree;
# 2. residual_lm_step new, old; base_lm_step new, old; residual_lm_step new again (time allowing): ttsaot_graph at
#    b1 and b16, each its own `bench run`;
# 3. per run its summary line; the JSONs (results_<n>_<new|old>/<device>/) in $OUT/results.tgz, the logs in
#    $OUT/run_logs.tgz (a call brings back 8 files at most).
#   BENCH_GIT_COMMIT=<this tree's commit, spelled out> OLD=.snap/ab_dc28bab bash bench/plans/runtime_host_ab.sh
#   (carry OLD)
#   CACHE=/tmp/ab_cache_new TESTS= RUNS="residual_lm_step:new residual_lm_step:old residual_lm_step:new" ...: after
#   split_rule_ab_h200.sh in the same call, on its `new` builds, the residual step alone
. "$(dirname "$0")/setup_device.sh"
OLD=${OLD:?an ignored folder holding the older runtime/*.py, carried with the call}
TESTS=${TESTS-tests/test_runtime_core.py tests/gpu/test_gpu_voxcpm2_lm.py}
CACHE=${CACHE:-/tmp/ab_cache}  # another plan's build cache (e.g. /tmp/ab_cache_new): the build below is then a no-change rebuild
mkdir -p /tmp/ab_new && cp runtime/*.py /tmp/ab_new/
timeout -s INT -k 10 "${BUILD_S:-200}" python3 -m bench build voxcpm2/residual_lm_step voxcpm2/base_lm_step \
  --axis batch=1,16 --jobs 2 --cache-dir "$CACHE" > "$LOGS/build.log" 2>&1 &
[ -n "$TESTS" ] && timeout "${TESTS_S:-200}" python3 -m pytest -m gpu -v -n 3 -p no:cacheprovider $TESTS \
  > "$LOGS/gpu_tests.txt" 2>&1 &
wait
echo "builds and tests done at $(( $(date +%s) - T0 )) s"; grep -h "bench build" "$LOGS/build.log" | cut -c1-200
if [ -n "$TESTS" ]; then
  echo "gpu tests: $(grep -cE ' PASSED' "$LOGS/gpu_tests.txt") passed, $(grep -cE ' FAILED| ERROR' "$LOGS/gpu_tests.txt") failed"
  grep -E "FAILED|ERROR" "$LOGS/gpu_tests.txt" | head -20 | cut -c1-300
fi
n=0
RUNS=${RUNS:-residual_lm_step:new residual_lm_step:old base_lm_step:new base_lm_step:old residual_lm_step:new}
for run in $RUNS; do
  st=${run%%:*}; which=${run##*:}; n=$((n + 1))
  [ $(( $(date +%s) - T0 )) -lt "${END_S:-560}" ] || { echo "skipped $run (time)"; continue; }
  if [ "$which" = old ]; then cp "$OLD"/runtime/*.py runtime/; else cp /tmp/ab_new/*.py runtime/; fi
  timeout -s INT -k 10 "${RUN_S:-150}" python3 -m bench run --family voxcpm2 --stages "$st" --axis batch=1,16 \
    --variants ttsaot_graph --no-coldstart --no-snake --stream-variants none --throughput-variants none \
    --stage-timeout $(( ${RUN_S:-150} - 10 )) --cache-dir "$CACHE" --record-failures \
    --out "$OUT/results_${n}_$which" > "$LOGS/run_${n}_${st}_$which.log" 2>&1
  echo "run $n $st $which rc $? at $(( $(date +%s) - T0 )) s"
  grep "ttsaot_graph: ok" "$LOGS/run_${n}_${st}_$which.log" | cut -c1-200
  python3 - "$OUT/results_${n}_$which" "$st" <<'P'
import json, pathlib, sys
for f in pathlib.Path(sys.argv[1]).glob(f"*/voxcpm2__{sys.argv[2]}.json"):
    for b, x in json.loads(f.read_text())["variants"]["ttsaot_graph"]["buckets"].items():
        print(f"  {b}: ms {x['ms']:.4f} p10 {x['p10_ms']:.4f} p90 {x['p90_ms']:.4f} "
              f"without checks {x.get('ms_without_input_validation', float('nan')):.4f}")
P
done
cp /tmp/ab_new/*.py runtime/
# at most 8 files come back from a device call: the runs' JSONs and logs as one archive each
tar czf "$OUT/results.tgz" -C "$OUT" $(cd "$OUT" && ls -d results_* 2>/dev/null) && rm -rf "$OUT"/results_*
tar czf "$OUT/run_logs.tgz" -C "$LOGS" $(cd "$LOGS" && ls run_*.log 2>/dev/null) && rm -f "$LOGS"/run_*.log
echo "done at $(( $(date +%s) - T0 )) s"
