#!/usr/bin/env bash
# One device call (~8 minutes on an H100 host, 16 cores): where a build's time goes (issue 17). Fish S2 Pro, full
# preset, random weights, one bucket per stage (the plan whose cold build took 338 s and no-change rebuild 53.3 s),
# built cold (empty package, Inductor and Triton caches) and again with no change, the CLI process under cProfile and
# every compile worker profiled (TTSAOT_BUILD_PROFILE_DIR); `import torch` timed in fresh processes beside it.
#   bash bench/plans/build_profile_h100.sh   → $OUT/{summary_cold.txt, summary_warm.txt, profiles.tar.gz, ...}
# BUILD_ARGS overrides the plan (default "--batch-buckets 1 --frame-buckets 50"), FAMILY the family.
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.txt" 2>&1
W=$(mktemp -d); mkdir -p "$W/prof_cold" "$W/prof_warm"
export TTSAOT_CACHE_DIR=$W/packages TTSAOT_INDUCTOR_CACHE_DIR=$W/inductor TRITON_CACHE_DIR=$W/triton
FAMILY=${FAMILY:-fish-s2-pro}; BUILD_ARGS=${BUILD_ARGS:---batch-buckets 1 --frame-buckets 50}
{
  for i in 1 2 3; do
    python3 -c "import time; t=time.time(); import torch; a=time.time(); torch.cuda.init(); torch.zeros(1, device='cuda'); print(f'import torch {a-t:.2f} s, + CUDA init {time.time()-a:.2f} s')"
  done
  python3 -X importtime -c "import ttsaot.builder.cli" 2> "$W/importtime.txt"
  sort -t'|' -k2 -n -r "$W/importtime.txt" | head -25
} > "$OUT/imports.txt" 2>&1
for phase in cold warm; do
  t=$(date +%s.%N)
  TTSAOT_BUILD_PROFILE_DIR=$W/prof_$phase timeout -s TERM 420 python3 -m cProfile -o "$W/prof_$phase/parent.prof" \
    -m ttsaot.builder.cli build "$FAMILY" --random-weights --preset full --device cuda $BUILD_ARGS --out "$W/art" \
    > "$OUT/build_$phase.log" 2>&1
  echo "build $phase rc $? wall $(python3 -c "import time; print(round(time.time()-$t, 1))") s" | tee -a "$OUT/imports.txt"
  python3 -m bench.probes.build_profile "$W/prof_$phase"/*.prof --top 40 > "$OUT/summary_$phase.txt" 2>&1
done
tar czf "$OUT/profiles.tar.gz" -C "$W" prof_cold prof_warm importtime.txt
echo "done at $(( $(date +%s) - T0 )) s"; cat "$OUT/imports.txt"; grep -v "━" "$OUT/build_warm.log" | tail -12
for phase in cold warm; do head -30 "$OUT/summary_$phase.txt"; done
