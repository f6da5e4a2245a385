#!/usr/bin/env bash
# One device call (issue 15, item 1): kernel profiles of the Fish dac_decoder (bf16, b1_f29), dac_encoder (10 s clip)
# and VoxCPM2 vae_decoder (b1_f36), each built with --kernels ttsaot and --kernels inductor (full preset, random
# weights). The three stages build concurrently (`bench build`, both kernel choices each), then `bench profile` per
# stage and choice: call time, kernels per call, top kernels, the gap between kernel time and replay time.
#   bash bench/plans/codec_profiles_h100.sh          → $OUT/profiles.tgz (profiles/*.json|txt) and the build / profile logs
set -u
cd "$(dirname "$0")/../.."
# always /usr/bin/g++, never an inherited $CXX: the device's preset wrapper builds packages that segfault on load
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT/profiles"; T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
declare -A AXES=(
  ["fish-s2-pro/dac_decoder:bf16"]="--axis batch=1 --axis frames=29"
  ["fish-s2-pro/dac_encoder"]="--axis samples=442368"
  ["voxcpm2/vae_decoder"]="--axis batch=1 --axis frames=36"
)
for t in "${!AXES[@]}"; do
  # shellcheck disable=SC2086
  timeout -s INT -k 10 "${BUILD_S:-300}" python3 -m bench build "$t" --kernels ttsaot,inductor --no-verify --jobs 4 \
    ${AXES[$t]} > "$OUT/build_${t//[\/:]/_}.log" 2>&1 &
done
wait
echo "builds done at $(( $(date +%s) - T0 )) s"; grep -h "bench build" "$OUT"/build_*.log | cut -c1-200
for k in ttsaot inductor; do
  for t in "${!AXES[@]}"; do
    if [ $(( $(date +%s) - T0 )) -gt "${LIMIT_S:-520}" ]; then echo "skipped $t $k (time)"; continue; fi
    # shellcheck disable=SC2086
    timeout -s INT -k 10 60 python3 -m bench profile "$t" --kernels "$k" ${AXES[$t]} --out "$OUT/profiles" \
      --calls 10 --reps 30 > "$OUT/profile.one" 2>&1
    echo "profile $t $k rc $? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/profile.log"; cat "$OUT/profile.one" >> "$OUT/profile.log"
    grep -E "^\[b|^\[s|kernels=" "$OUT/profile.one" | cut -c1-250
  done
done
rm -f "$OUT/profile.one"; ls "$OUT/profiles"
# at most 8 files come back from a device call: the profiles travel as one archive
tar czf "$OUT/profiles.tgz" -C "$OUT" profiles && rm -rf "$OUT/profiles"
