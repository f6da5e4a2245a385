#!/usr/bin/env bash
# One device call (issue 15): where the exact-fp32 codec stages' time goes, layer by layer. Builds the VoxCPM2
# vae_decoder (b1_f36) and the Fish dac_encoder (10 s clip) with --kernels ttsaot side by side, then `bench profile`
# each (the per-name table and the one-call timeline in launch order), then `bench codec-stages` on the same
# packages (the package cache the builds filled: the harness's figure next to eager), then the conv kernels' GPU tests.
#   bash bench/plans/codec_timeline_h100.sh > $OUT/run.log 2>&1     → $OUT/profiles.tgz
set -u
cd "$(dirname "$0")/../.."
# always /usr/bin/g++, never an inherited $CXX: the device's preset wrapper builds packages that segfault on load
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT/profiles"; T0=$(date +%s); PC=/tmp/ttsaot-plan-packages
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
PIDS=()
declare -A AXES=(
  ["fish-s2-pro/dac_encoder"]="--axis samples=442368"
  ["voxcpm2/vae_decoder"]="--axis batch=1 --axis frames=36"
)
for t in ${TASKS:-voxcpm2/vae_decoder fish-s2-pro/dac_encoder}; do
  # shellcheck disable=SC2086
  timeout -s INT -k 10 "${BUILD_S:-330}" python3 -m bench build "$t" --kernels ttsaot --no-verify --package-cache $PC \
    ${AXES[$t]} > "$OUT/profiles/build_${t//[\/:]/_}.log" 2>&1 &
  PIDS+=($!)
done
wait "${PIDS[@]}"
echo "builds done at $(( $(date +%s) - T0 )) s"; grep -h "bench build" "$OUT"/profiles/build_*.log | cut -c1-200
for t in ${TASKS:-voxcpm2/vae_decoder fish-s2-pro/dac_encoder}; do
  # shellcheck disable=SC2086
  timeout -s INT -k 10 90 python3 -m bench profile "$t" --kernels ttsaot ${AXES[$t]} --out "$OUT/profiles" \
    --calls 10 --reps 30 > "$OUT/profiles/profile_${t//[\/:]/_}.log" 2>&1
  echo "profile $t rc $? at $(( $(date +%s) - T0 )) s"; grep -E "^\[b|^\[s" "$OUT/profiles/profile_${t//[\/:]/_}.log" | cut -c1-250
done
LEFT=$(( ${LIMIT_S:-560} - ($(date +%s) - T0) - 60 ))
if [ -n "${CODEC_STAGES:-vae_decoder,dac_encoder}" ] && [ "$LEFT" -gt 60 ]; then
  timeout -s INT -k 10 "$LEFT" python3 -m bench codec-stages --stages "${CODEC_STAGES:-vae_decoder,dac_encoder}" \
    --variants eager --budget $(( LEFT - 30 )) --package-cache $PC --out "$OUT" > "$OUT/profiles/codec_stages.log" 2>&1
  echo "codec-stages rc $? at $(( $(date +%s) - T0 )) s"; tail -n 12 "$OUT/profiles/codec_stages.log" | cut -c1-200
fi
if [ $(( $(date +%s) - T0 )) -lt "${TEST_BEFORE_S:-480}" ]; then
  timeout -s INT -k 10 "${TEST_S:-100}" python3 -m pytest -q -m gpu tests/gpu/test_gpu_kernels_conv.py -x 2>&1 | tail -5
fi
# at most 8 files come back from a device call: the profiles travel as one archive
tar czf "$OUT/profiles.tgz" -C "$OUT" profiles && rm -rf "$OUT/profiles"
echo "done at $(( $(date +%s) - T0 )) s"
