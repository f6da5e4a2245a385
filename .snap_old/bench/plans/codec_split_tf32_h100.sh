#!/usr/bin/env bash
# One device call (issue 15): (1) the conv kernels' GPU tests, in the background; (2) codec-stages for $TASKS (the
# ttsaot artifact vs the eager module in the stage's precision: call time, error, the encoder's codes vs exact fp32).
# Written for the pre-split tf32x3 weights (reverted: probes/tf32x3_split_weights/), then used for the encoder with
# its linears on the conv kernel (codec_stages_dac_encoder_linears.json). The tests share the GPU with the timings.
#   TASKS=dac_encoder,vae_decoder bash bench/plans/codec_split_tf32_h100.sh   → $OUT/codec_stages.json + logs
set -u
cd "$(dirname "$0")/../.."
# always /usr/bin/g++, never an inherited $CXX: the device's preset wrapper builds packages that segfault on load
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout -k 5 "${TESTS_S:-300}" python3 -m pytest -q -m gpu tests/gpu/test_gpu_kernels_conv.py -p no:cacheprovider \
  > "$OUT/gpu_conv_tests.txt" 2>&1 &
TESTS=$!
timeout -s INT -k 10 "${STAGES_S:-480}" python3 -m bench codec-stages --stages "${TASKS:-dac_encoder,vae_decoder}" \
  --variants "${VARIANTS:-eager}" --budget $(( ${STAGES_S:-480} - 60 )) --out "$OUT" ${CODEC_EXTRA:-} \
  > "$OUT/codec_stages.log" 2>&1
echo "codec-stages rc $? at $(( $(date +%s) - T0 )) s"
wait $TESTS; echo "gpu conv tests rc $? at $(( $(date +%s) - T0 )) s"; tail -4 "$OUT/gpu_conv_tests.txt"
grep -v "Warning\|return cls.__new__" "$OUT/codec_stages.log" | tail -25 | cut -c1-400
