#!/usr/bin/env bash
# One device call (< 10 min on an H100 host): issue 15's memory reading of the full default code2wav plan (and
# vae_decoder's) via memory_h100.sh in the background (AOTI compiles on JOBS cores), and in the foreground
# voxcpm2 residual_lm_step at B=16 (ttsaot vs inductor vs torch.compile + graph, profiled) on the remaining cores.
# The decode timing finishes before the memory plan's load phase begins (builds first), so the memory readings'
# device-wide column (mem_get_info) sees one process; the log lines carry the seconds to check it.
#   bash bench/plans/memory_residual_h100.sh
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT/memory" "$OUT/decode"; T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.txt" 2>&1
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia_smi.txt" 2>&1
OUT=$OUT/memory TOTAL_S=${MEMORY_S:-560} BUILD_S=${BUILD_S:-420} JOBS=${JOBS:-11} \
  STAGES=${STAGES:-qwen3-tts-12hz/code2wav,voxcpm2/vae_decoder} bash bench/plans/memory_h100.sh \
  > "$OUT/memory_plan.txt" 2>&1 &
MEM=$!
timeout -s INT -k 10 "${RESIDUAL_S:-330}" python3 -m bench decode-stages --stage residual_lm_step --batches "${BATCHES:-16}" \
  --budget $(( ${RESIDUAL_S:-330} - 40 )) --jobs 2 --compile-mode default --out "$OUT/decode" \
  > "$OUT/decode/residual.log" 2>&1
echo "residual rc $? at $(( $(date +%s) - T0 )) s"; tail -8 "$OUT/decode/residual.log" | cut -c1-400
wait $MEM; echo "memory plan done at $(( $(date +%s) - T0 )) s"; cat "$OUT/memory_plan.txt" | cut -c1-400
