#!/usr/bin/env bash
# One device call (issue 17): what a package's first call costs at load. Builds Fish's DAC decoder (full, batch
# bucket 1: its 6 frame buckets; BUILD_ARGS overrides), then bench/probes/first_call_cost.py (lazy and eager module
# loading, a profiled first call, the packages' kernel binaries).
#   OUT=... bash bench/plans/first_call_cost_h100.sh
. "$(dirname "$0")/setup_device.sh"
ART=/tmp/fc_art; rm -rf "$ART"
timeout -s INT -k 10 "${BUILD_S:-240}" build-artifacts build fish-s2-pro --random-weights --preset full \
  --stages dac_decoder ${BUILD_ARGS:---batch-buckets 1} --device cuda --no-verify --out "$ART" > "$LOGS/build.log" 2>&1
echo "build rc $? at $(( $(date +%s) - T0 )) s"
timeout "${PROBE_S:-120}" python3 -m bench.probes.first_call_cost --artifact "$ART/fish-s2-pro" --stage dac_decoder \
  --out "$OUT" > "$LOGS/probe.txt" 2>&1
echo "probe rc $? at $(( $(date +%s) - T0 )) s:"; grep -vE "^\s*$" "$LOGS/probe.txt" | cut -c1-260 | head -40
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
