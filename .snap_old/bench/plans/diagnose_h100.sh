#!/usr/bin/env bash
# One device call: the full error of a ttsaot-kernel build of voxcpm2 base_lm_step (tiny preset, CUDA), then the
# kernel profiles of code2wav before (inductor) and after (ttsaot).
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.txt" 2>&1
timeout -s INT 150 build-artifacts --debug build voxcpm2 --stages base_lm_step --random-weights --preset tiny \
  --device cuda --cxx /usr/bin/g++ --kernels ttsaot --batch-buckets 1,4 --no-cache --jobs 1 --out /tmp/art \
  > "$OUT/build_tiny_lm.log" 2>&1
echo "tiny base_lm_step ttsaot build rc $? at $(( $(date +%s) - T0 )) s"
grep -v "^[EW]11\|FutureWarning\|return cls" "$OUT/build_tiny_lm.log" | grep -n "Error\|error\|subprocess" | cut -c1-300 | head -20
for k in ttsaot inductor; do
  L=$(( 400 - ($(date +%s) - T0) )); [ $L -lt 60 ] && break
  timeout -s INT $L python3 -m bench profile qwen3-tts-12hz/code2wav --axis batch=1,4 --axis frames=50 --kernels $k \
    --out "$OUT/profiles" > "$OUT/profile_$k.log" 2>&1
  echo "profile code2wav $k rc $? at $(( $(date +%s) - T0 )) s"; tail -12 "$OUT/profile_$k.log" | cut -c1-200
done
