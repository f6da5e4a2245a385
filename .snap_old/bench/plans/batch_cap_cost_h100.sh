#!/usr/bin/env bash
# One device call (< 6 min on an H100 host): the per-call cost of the default codec plan's batch × frames cap.
# Builds full code2wav with the whole cross product at the long windows (batch 1,2,4 × frames 128,256,
# --max-batch-frames 0: 6 packages), then bench/probes/batch_cap_cost.py times each batch the default cap (325)
# leaves without a bucket, through its own bucket and through the smaller batches a default artifact uses.
#   bash bench/plans/batch_cap_cost_h100.sh      → $OUT/cap_cost.json, $OUT/cap_cost.log
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.txt 2>&1
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia_smi.txt" 2>&1
timeout -s INT -k 10 "${BUILD_S:-360}" python3 -m ttsaot.builder.cli build qwen3-tts-12hz --preset full --random-weights \
  --device cuda --stages code2wav --batch-buckets 1,2,4 --frame-buckets 128,256 --max-batch-frames 0 --no-cache \
  --no-verify --jobs 6 --out /tmp/capart > /tmp/build.log 2>&1
echo "build rc $? at $(( $(date +%s) - T0 )) s"; grep -v "Warning\|__new__\|frombuffer" /tmp/build.log | tail -3 | cut -c1-300
timeout 120 python3 bench/probes/batch_cap_cost.py /tmp/capart/qwen3-tts-12hz --cap 325 --out "$OUT/cap_cost.json" \
  > "$OUT/cap_cost.log" 2>&1
echo "probe rc $? at $(( $(date +%s) - T0 )) s"; grep -v "Warning\|__new__\|frombuffer" "$OUT/cap_cost.log" | tail -6
