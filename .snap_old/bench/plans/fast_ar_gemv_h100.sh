#!/usr/bin/env bash
# One device call (issue 14): Fish fast_ar (full, bf16, batch 1) built with `--kernels ttsaot` and profiled, then the
# GEMV launch configs × split-K swept at its four projections' real shapes and one row (`bench kernels --sections
# configs` with the shape table cut to them: weights rotated past L2, each config against a copy of the same bytes).
# $OUT: the profile JSON, the sweep JSON, the logs in one tarball.
#   SWEEP_S=240 bash bench/plans/fast_ar_gemv_h100.sh
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; LOGS=$OUT/logs; mkdir -p "$LOGS"; T0=$(date +%s)
BUILD_S=${BUILD_S:-200}; SWEEP_S=${SWEEP_S:-240}; CACHE=/tmp/fa_cache
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$LOGS/install.txt" 2>&1
timeout -s INT -k 10 "$BUILD_S" python3 -m bench build fish-s2-pro/fast_ar --axis batch=1 --kernels ttsaot --jobs 8 \
  --cache-dir "$CACHE" > "$LOGS/build.log" 2>&1
echo "build done at $(( $(date +%s) - T0 )) s: $(grep -h 'bench build' "$LOGS/build.log" | cut -c1-200)"
timeout -s INT -k 10 120 python3 -m bench profile fish-s2-pro/fast_ar --axis batch=1 --kernels ttsaot \
  --cache-dir "$CACHE" --out "$OUT" --calls 10 --reps 50 > "$LOGS/profile.log" 2>&1
grep -E '^\[b' "$LOGS/profile.log" | cut -c1-220; mv "$OUT"/*.txt "$LOGS"/ 2>/dev/null
timeout -s INT -k 10 $(( SWEEP_S + 40 )) python3 - > "$LOGS/sweep.log" 2>&1 <<PY
import os, torch, bench.kernels as kb
from pathlib import Path
from bench.common import write_json
out = Path(os.environ["OUT"]) / "kernels_fast_ar_gemv.json"
# Fish S2 Pro fast_ar decode (dim 2560, 32 q / 8 kv heads of 128, FFN 9728), one row
kb.SKINNY_SHAPES = {
    "fish_fast_ar_qkv": (6144, 2560, {"norm": True}, (1,)),
    "fish_fast_ar_o": (2560, 4096, {"residual": True}, (1,)),
    "fish_fast_ar_gate_up": (19456, 2560, {"norm": True, "gated": True}, (1,)),
    "fish_fast_ar_down": (2560, 9728, {"residual": True}, (1,)),
}
kb.CONFIG_SWEEP_M = ((1, "gemv"),)
r = kb.run_kernels(torch.device("cuda"), False, $SWEEP_S, ("copy", "configs"), False,
                   progress=lambda res: write_json(out, res))
write_json(out, r)
print(kb.summary(r))
PY
tail -40 "$LOGS/sweep.log" | cut -c1-200
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
