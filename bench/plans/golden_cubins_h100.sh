#!/usr/bin/env bash
# One device call (< 8 minutes on the 16-core host), issue 17's compile CPU work:
#  1. the GPU tests of the stage programs' hand-over to the workers and of golden cases on the GPU → $OUT/gpu_tests.txt
#  2. `bench.probes.golden_cost` on Fish full: each stage's golden cases on the host CPU (wall, CPU seconds) against
#     the GPU in exact fp32, and how far apart the two references are → $OUT/golden_cost.json
#  3. Triton's cache after ONE dac_decoder package (b1_f50), then after a second one (b1_f25) on the same caches:
#     what a package compiles (Inductor's kernels against ttsaot's autotuning candidates) and what the second
#     could reuse → $OUT/inventory_f*.json, each build's CPU seconds $OUT/time_f*.txt
. "$(dirname "$0")/setup_device.sh"
timeout -s INT -k 10 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_gpu_saved_programs.py \
  tests/gpu/test_gpu_golden_reference.py > "$OUT/gpu_tests.txt" 2>&1
tail -3 "$OUT/gpu_tests.txt"
timeout -s INT -k 10 "${GOLDEN_S:-220}" /usr/bin/time -f "golden_cost wall %e s user %U s sys %S s" \
  python3 -m bench.probes.golden_cost --family fish-s2-pro --preset full --out "$OUT/golden_cost.json" \
  > "$OUT/golden_cost.txt" 2>&1
grep -v Warning "$OUT/golden_cost.txt" | tail -5 | cut -c1-400
W=$(mktemp -d /tmp/inv-XXXX)
export TTSAOT_INDUCTOR_CACHE_DIR=$W/inductor TRITON_CACHE_DIR=$W/triton
for F in ${FRAMES:-50 25}; do
  S=$(date +%s)
  /usr/bin/time -f "f$F wall %e s user %U s sys %S s" -o "$OUT/time_f$F.txt" timeout 170 build-artifacts build \
    fish-s2-pro --random-weights --preset full --device cuda --out "$W/a$F" --cache-dir "$W/c" --stages dac_decoder \
    --batch-buckets 1 --frame-buckets "$F" > "$OUT/build_f$F.log" 2>&1
  cat "$OUT/time_f$F.txt"; grep -o "compiled ([0-9]*s)\|golden.*" "$OUT/build_f$F.log" | head -3
  python3 -m bench.probes.triton_cache_inventory "$W/triton" --since "$S" --out "$OUT/inventory_f$F.json"
done
echo "plan wall $(( $(date +%s) - T0 )) s"
