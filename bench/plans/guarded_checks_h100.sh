#!/usr/bin/env bash
# One short device call: the guarded graphs (runtime/graphs.py StaticGraph `guard`: a bucket's device-input checks
# and its package in one graph, the package in a conditional node). 1. the GPU tests of TESTS beside a `bench
# build` of STAGE; 2. `bench run --variants ttsaot_graph` of STAGE: the call through the guarded graph
# (`ms_guarded_checks`), with the check graph read back before the plain graph (`ms_two_graph_checks`), with eager
# checks and without.
#   BENCH_GIT_COMMIT=$(git rev-parse --short HEAD) TESTS="tests/test_runtime_core.py ..." bash bench/plans/guarded_checks_h100.sh
. "$(dirname "$0")/setup_device.sh"
END_S=${END_S:-260}; STAGE=${STAGE:-voxcpm2/residual_lm_step}
timeout -s INT -k 10 "${BUILD_S:-200}" python3 -m bench build "$STAGE" --axis batch=1 --jobs 1 --cache-dir /tmp/ab_cache_new \
  > "$LOGS/build.log" 2>&1 &
[ -n "${TESTS:-}" ] && timeout "${TESTS_S:-220}" python3 -m pytest -m gpu -v -n "${TEST_WORKERS:-3}" -p no:cacheprovider $TESTS \
  > "$OUT/gpu_tests.txt" 2>&1 &
wait
echo "build and tests at $(( $(date +%s) - T0 )) s"; grep -h "bench build" "$LOGS/build.log" | cut -c1-200
[ -n "${TESTS:-}" ] && { grep -E " PASSED| FAILED| ERROR" "$OUT/gpu_tests.txt" | sed 's/^.*:://' | cut -c1-160; tail -1 "$OUT/gpu_tests.txt"; }
LEFT=$(( END_S - ($(date +%s) - T0) ))
if [ "$LEFT" -gt 30 ]; then
  timeout -s INT -k 10 "$LEFT" python3 -m bench run --family "${STAGE%/*}" --stages "${STAGE#*/}" --axis batch=1 \
    --variants ttsaot_graph --no-coldstart --no-snake --stage-timeout $(( LEFT - 5 )) --cache-dir /tmp/ab_cache_new \
    --out "$OUT/run" > "$LOGS/run.log" 2>&1
  echo "run rc $? at $(( $(date +%s) - T0 )) s"
  python3 - "$OUT/run" "$STAGE" <<'PY'
import json, sys
from pathlib import Path
fam, st = sys.argv[2].split("/")
for f in Path(sys.argv[1]).rglob(f"{fam}__{st}.json"):
    for k, b in json.load(open(f))["variants"]["ttsaot_graph"].get("buckets", {}).items():
        print(f"  {k}: guarded graph {b.get('ms_guarded_checks', 0) * 1e3:.1f} us, check graph read back first "
              f"{b.get('ms_two_graph_checks', 0) * 1e3:.1f} us, eager checks {b.get('ms_eager_input_checks', 0) * 1e3:.1f} us, "
              f"no checks {b.get('ms_without_input_validation', 0) * 1e3:.1f} us, rel err {b.get('rel_err_vs_fp32')}")
PY
else
  echo "run skipped (time)"
fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
