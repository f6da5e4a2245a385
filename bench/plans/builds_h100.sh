#!/usr/bin/env bash
# One device call (< 9 minutes on an H100 host, 16 cores): `python -m bench builds` — each family's DEFAULT full build
# through the CLI, cold (empty package + Inductor caches), again with no change, every stage's fresh-process →
# first-output cold start, then cached into a new --out; packages compiled/reused, --jobs (the host's default).
# Each build's console output, lines stamped with their time: $OUT/<device-slug>/build_logs/; the host's CPU load
# every 5 s: $OUT/vmstat.txt.
#   bash bench/plans/builds_h100.sh            → $OUT/<device-slug>/builds.json (+ builds.log)
# Families run in this order until the budget is spent; what did not fit is recorded `skipped` with the reason in
# the JSON (status "incomplete"), never silently left out. The full VoxCPM2 build (7 stages, LM steps with a
# 4096-token cache) is last: it is the likeliest not to fit one call. FAMILIES / BUDGET_S override; BUILD_ARGS
# (e.g. "--batch-buckets 1 --frame-buckets 50") builds another plan, recorded as a deviation in the JSON.
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.txt" 2>&1
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia_smi.txt" 2>&1
BUDGET_S=${BUDGET_S:-470}
# the host's CPU load beside the builds (are 16 cores saturated, or does one long compile end the build?)
vmstat -t 5 > "$OUT/vmstat.txt" 2>&1 & VMSTAT=$!
# the JSON is rewritten after every section: a kill at the outer timeout still leaves what was measured
timeout -s TERM -k 20 $((BUDGET_S + 40)) python3 -m bench builds --device cuda --preset full --budget "$BUDGET_S" \
  --coldstart-budget 60 --families "${FAMILIES:-qwen3-tts-12hz,fish-s2-pro,voxcpm2}" --out "$OUT" \
  ${BUILD_ARGS:+--build-args "$BUILD_ARGS"} \
  > "$OUT/builds.log" 2>&1
RC=$?; kill $VMSTAT 2>/dev/null
echo "bench builds rc $RC at $(( $(date +%s) - T0 )) s"; tail -30 "$OUT/builds.log" | cut -c1-400
