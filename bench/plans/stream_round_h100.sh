#!/usr/bin/env bash
# One device call for skinny_linear's streamed tile form (issue 14), everything that needs the GPU in one lease:
# the locdit stage built twice side by side (default tile form / TTSAOT_SKINNY_STREAM=1, caches apart) while the
# streamed form's GPU tests run, then `bench profile` of both builds, then the kernel-level config sweep
# (`bench kernels --sections copy,configs_stream`) with what time is left. $OUT/<variant>/ the profiles,
# $OUT/kernels_stream.json, the logs in $OUT/logs.tgz.
#   STAGES=voxcpm2/locdit bash bench/plans/stream_round_h100.sh     (SWEEP=0: no kernel sweep)
. "$(dirname "$0")/setup_device.sh"
STAGES=${STAGES:-voxcpm2/locdit}; AXIS=${AXIS:-batch=1}; BUILD_S=${BUILD_S:-330}; BUDGET_S=${BUDGET_S:-575}
variant() {  # NAME CMD...: the default tile form or the streamed one
  local name=$1; shift
  case $name in new) "$@" ;; stream) TTSAOT_SKINNY_STREAM=1 "$@" ;; esac
}
for v in new stream; do
  variant "$v" timeout -s INT -k 10 "$BUILD_S" python3 -m bench build $STAGES --axis "$AXIS" --no-verify --jobs 3 \
    --cache-dir "/tmp/ab_cache_$v" > "$LOGS/build_$v.log" 2>&1 &
done
timeout 200 python3 -m pytest -m gpu -q -n 2 tests/test_kernels_skinny_linear.py -k "streamed or autotuned" \
  > "$LOGS/gpu_tests.txt" 2>&1
echo "gpu tests: $(tail -1 "$LOGS/gpu_tests.txt") at $(( $(date +%s) - T0 )) s"
wait
echo "builds done at $(( $(date +%s) - T0 )) s"; grep -h "bench build" "$LOGS"/build_*.log | cut -c1-200
for st in $STAGES; do
  for v in new stream; do
    LEFT=$(( BUDGET_S - ($(date +%s) - T0) )); [ "$LEFT" -gt 20 ] || { echo "skipped $st $v (time)"; continue; }
    variant "$v" timeout -s INT -k 10 "$LEFT" python3 -m bench profile "$st" --axis "$AXIS" \
      --cache-dir "/tmp/ab_cache_$v" --out "$OUT/$v" --calls 10 --reps 50 > "$LOGS/profile_${v}_${st//\//_}.log" 2>&1
    echo "$v $st: $(grep -E '^\[b' "$LOGS/profile_${v}_${st//\//_}.log" | cut -c1-220)"
  done
done
for v in new stream; do mkdir -p "$LOGS/$v" && mv "$OUT/$v"/*.txt "$LOGS/$v"/ 2>/dev/null; done
LEFT=$(( BUDGET_S - ($(date +%s) - T0) ))
if [ "${SWEEP:-1}" = 1 ] && [ "$LEFT" -gt 60 ]; then
  timeout "$LEFT" python3 -m bench kernels --sections copy,configs_stream --budget $(( LEFT - 20 )) \
    --result "$OUT/kernels_stream.json" > "$LOGS/kernels.txt" 2>&1
  tail -25 "$LOGS/kernels.txt" | cut -c1-220
else echo "kernel sweep skipped ($LEFT s left)"; fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
