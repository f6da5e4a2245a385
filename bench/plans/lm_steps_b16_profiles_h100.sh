#!/usr/bin/env bash
# One device call (issue 14): kernel profiles of the VoxCPM2 LM steps at B=16, where they sit furthest from their
# byte floor (H100 at dc28bab: base_lm_step 1.86×, residual_lm_step 1.98×, against 1.37× / 1.64× at B=1) and where no
# H100 profile is committed. Full preset, bf16, ctx 512, the CUDA default (the kernel layer). Both stages build
# concurrently at batch 16 alone (`bench build`, verified), then `bench profile` per stage: call time, kernels per
# call and per layer, the top kernels with time and GB/s, each launch shape's own time, one call in launch order.
#   BENCH_GIT_COMMIT=<this tree's commit, spelled out> bash bench/plans/lm_steps_b16_profiles_h100.sh
#   → $OUT/profiles.tgz (profiles/*.json|txt) and the build / profile logs
. "$(dirname "$0")/setup_device.sh"
CACHE=/tmp/b16_cache
mkdir -p "$OUT/profiles"
timeout -s INT -k 10 "${BUILD_S:-240}" python3 -m bench build voxcpm2/base_lm_step voxcpm2/residual_lm_step \
  --axis batch=16 --jobs 2 --cache-dir "$CACHE" > "$LOGS/build.log" 2>&1
echo "builds done at $(( $(date +%s) - T0 )) s"; grep -h "bench build" "$LOGS/build.log" | cut -c1-200
for st in base_lm_step residual_lm_step; do
  if [ $(( $(date +%s) - T0 )) -gt "${LIMIT_S:-500}" ]; then echo "skipped $st (time)"; continue; fi
  timeout -s INT -k 10 90 python3 -m bench profile "voxcpm2/$st" --axis batch=16 --cache-dir "$CACHE" \
    --out "$OUT/profiles" > "$LOGS/profile_$st.log" 2>&1
  echo "profile $st rc $? at $(( $(date +%s) - T0 )) s"
  grep -E "^\[b" -A16 "$LOGS/profile_$st.log" | cut -c1-250
done
ls "$OUT/profiles"
# at most 8 files come back from a device call: the profiles travel as one archive
tar czf "$OUT/profiles.tgz" -C "$OUT" profiles && rm -rf "$OUT/profiles"
