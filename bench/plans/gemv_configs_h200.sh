#!/usr/bin/env bash
# One device call (issue 14): the GEMV form's one-row candidates, with and without the next W tile prefetched, at
# M = 1 on the predictors' and VoxCPM2's decode shapes (`configs_gemv`), then the predictors' shapes at their decode
# rows as the op's plan runs them (`predictors`), beside the 1 GiB copy. $OUT/<device>/kernels.json + the log.
#   BENCH_GIT_COMMIT=<tree> bash bench/plans/gemv_configs_h200.sh
. "$(dirname "$0")/setup_device.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$LOGS/nvidia_smi.txt" 2>&1
python3 -m bench kernels --sections "${SECTIONS:-copy,configs_gemv,predictors}" --budget "${BUDGET_S:-470}" \
  --out "$OUT" > "$LOGS/kernels.txt" 2>&1
echo "bench rc $? at $(( $(date +%s) - T0 )) s"; tail -40 "$LOGS/kernels.txt" | cut -c1-240
