#!/usr/bin/env bash
# One device call (issue 15, item 4): GPU memory beyond the weights, and the load / warm-up + capture time, of the
# FULL DEFAULT bucket plans of qwen3-tts-12hz code2wav (bf16, kernels auto), fish-s2-pro dac_decoder and voxcpm2
# vae_decoder (full presets, random weights). Each stage is loaded with CUDA graphs in a fresh process, and its
# golden cases are re-run through the graphs after the readings. Result: $OUT/<device-slug>/memory.json (+ log).
# The artifact and package caches stay in /tmp: a second call on the still-warm machine reuses what finished.
#   BUILD_S=190 JOBS=8 bash bench/plans/memory_h100.sh
# CPU smoke of the same path (tiny preset, one bucket):
#   DEVICE=cpu PRESET=tiny STAGES=qwen3-tts-12hz/code2wav EXTRA="--axis batch=1 --axis frames=8" bash bench/plans/memory_h100.sh
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; T0=$(date +%s)
[ -n "${SKIP_INSTALL:-}" ] || python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.txt" 2>&1
if [ "${DEVICE:-cuda}" = cuda ]; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; fi
STAGES=${STAGES:-qwen3-tts-12hz/code2wav,fish-s2-pro/dac_decoder,voxcpm2/vae_decoder}
LEFT=$(( ${TOTAL_S:-285} - ($(date +%s) - T0) ))
# --no-verify: the builder's own subprocess load check would load every package a second time; the measuring
# process runs the golden cases through the loaded graphs instead.
timeout -s INT -k 10 "$LEFT" python3 -m bench memory "$STAGES" --device "${DEVICE:-cuda}" --preset "${PRESET:-full}" \
  --jobs "${JOBS:-8}" --build-budget "${BUILD_S:-190}" --load-timeout "${LOAD_S:-100}" --no-verify \
  --cache-dir /tmp/ttsaot-memory/cache --package-cache /tmp/ttsaot-memory/packages --out "$OUT" ${EXTRA:-} \
  > "$OUT/memory.log" 2>&1
echo "bench memory rc $? at $(( $(date +%s) - T0 )) s"
grep -v "Warning\|return cls.__new__" "$OUT/memory.log" | tail -15 | cut -c1-600
