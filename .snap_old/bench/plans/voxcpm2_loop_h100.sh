#!/usr/bin/env bash
# One device call (issue 14): the VoxCPM2 decode loop on the artifacts, every stage on its CUDA default (`--kernels
# auto`: the kernel layer for the bf16 LM steps, locdit and local_encoder). The five loop stages build side by side
# (`bench build`, full preset, the loop's buckets), then `python -m bench voxcpm-loop` reuses them: per-step time,
# each stage alone, the streamed decoder, the VAE window, and the first step in a fresh process; then `bench profile`
# of each of PROFILES (locdit local_encoder), then the GPU tests of TESTS (files) if set. $OUT: the loop JSON, the
# profile JSONs and one tarball of the logs.
#   BATCHES=1 TESTS="tests/test_kernels_sequence_attention.py" bash bench/plans/voxcpm2_loop_h100.sh
#   (BUILD_S, LOOP_S override the time boxes). BATCHES=1,16 no longer fits one call (the five stages' b1 + b16
#   builds ran past a 330 s box on locdit, H100 2026-11-24): run BATCHES=1 and BATCHES=16 in two calls.
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; LOGS=$OUT/logs; mkdir -p "$LOGS"; T0=$(date +%s)
BATCHES=${BATCHES:-1}; BUILD_S=${BUILD_S:-330}; LOOP_S=${LOOP_S:-180}
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$LOGS/install.txt" 2>&1
STAGES=(voxcpm2/base_lm_step voxcpm2/residual_lm_step voxcpm2/locdit voxcpm2/local_encoder voxcpm2/vae_decoder)
timeout -s INT -k 10 "$BUILD_S" python3 -m bench build "${STAGES[@]}" --axis "batch=$BATCHES" --jobs 5 \
  > "$LOGS/build.log" 2>&1
echo "build rc $? at $(( $(date +%s) - T0 )) s"; grep "bench build" "$LOGS/build.log" | cut -c1-300
timeout -s INT -k 10 "$LOOP_S" python3 -m bench voxcpm-loop --batches "$BATCHES" --phases build,ttsaot,first_step \
  --budget $(( LOOP_S - 15 )) --coldstart-budget 60 --result "$OUT/voxcpm2__decode_loop.json" > "$LOGS/loop.log" 2>&1
echo "loop rc $? at $(( $(date +%s) - T0 )) s"; grep "\[bench\]" "$LOGS/loop.log" | cut -c1-300
for st in ${PROFILES-locdit local_encoder}; do
  LEFT=$(( 560 - ($(date +%s) - T0) )); [ "$LEFT" -gt 30 ] || { echo "profile $st skipped (time)"; continue; }
  timeout -s INT -k 10 "$LEFT" python3 -m bench profile "voxcpm2/$st" --axis "batch=$BATCHES" --out "$OUT" \
    --calls 10 --reps 30 > "$LOGS/profile_$st.log" 2>&1
  echo "profile $st rc $? at $(( $(date +%s) - T0 )) s"; grep -E "^\[b|kernels=" "$LOGS/profile_$st.log" | cut -c1-300
done
mv "$OUT"/*.txt "$LOGS"/ 2>/dev/null
LEFT=$(( 575 - ($(date +%s) - T0) ))
if [ -n "${TESTS:-}" ] && [ "$LEFT" -gt 30 ]; then  # GPU tests of the given files (pytest -m gpu)
  timeout -s INT -k 10 "$LEFT" python3 -m pytest -m gpu -n 4 -q -p no:cacheprovider $TESTS > "$LOGS/gpu_tests.log" 2>&1
  echo "gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -4 "$LOGS/gpu_tests.log" | cut -c1-300
fi
python3 - "$OUT/voxcpm2__decode_loop.json" <<'EOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except OSError as e:
    sys.exit(f"no loop result: {e}")
print(json.dumps({k: r.get(k) for k in ("ttsaot", "first_step")}, indent=1, default=str)[:5000])
EOF
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done at $(( $(date +%s) - T0 )) s"
