#!/usr/bin/env bash
# The streamed tile form of skinny_linear (issue 14): its GPU tests, then `bench kernels --sections configs_stream`
# (every streamed candidate × split against the cp.async tile form's autotuned plan and a copy of the same bytes,
# at the stages' serving rows). $OUT/kernels_stream.json; logs in $OUT/logs.tgz.
#   bash bench/plans/stream_tiles_h100.sh
. "$(dirname "$0")/setup_device.sh"
timeout 240 python3 -m pytest -m gpu -q -n 4 tests/test_kernels_skinny_linear.py -k "streamed or autotuned" \
  > "$LOGS/gpu_tests.txt" 2>&1
echo "gpu tests: $(tail -1 "$LOGS/gpu_tests.txt") at $(( $(date +%s) - T0 )) s"
LEFT=$(( ${BUDGET_S:-540} - ($(date +%s) - T0) ))
timeout "$LEFT" python3 -m bench kernels --sections copy,configs_stream --budget $(( LEFT - 30 )) \
  --result "$OUT/kernels_stream.json" > "$LOGS/kernels.txt" 2>&1
tail -20 "$LOGS/kernels.txt"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
