#!/usr/bin/env bash
# One device call (issue 17, item 5): bench/probes/cuda_dynamic_package.py on the H100 — qwen code2wav's whole
# default plan as ONE dynamic-shape package (build time, golden cases) against static packages of b1_f50 and b4_f50
# (per-call time, outputs).   bash bench/plans/cuda_dynamic_h100.sh → $OUT/cuda_dynamic_package.json + probe.log
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
timeout -s INT -k 10 "${PROBE_S:-540}" python3 -m bench.probes.cuda_dynamic_package --stage "${STAGE:-qwen3-tts-12hz/code2wav}" \
  --buckets "${BUCKETS:-b1_f50,b4_f50}" --out "$OUT" > "$OUT/probe.log" 2>&1
echo "probe rc $? at $(( $(date +%s) - T0 )) s"
grep -v "Warning\|warn(" "$OUT/probe.log" | tail -20 | cut -c1-600
