#!/usr/bin/env bash
# One device call (issue 15): (1) the GPU tests of the graph primitive (the first capture's pool reserve), (2) GPU
# memory of code2wav's capped default plan's largest graphs with that reserve (same buckets as
# results/nvidia-h100/probes/memory_run9, which held 1103 MiB beyond the weights without it), (3) codec-stages for
# the tasks in $TASKS (ttsaot artifact vs eager in the stage's precision, eager with TF32, and the faithful fp32
# module under PyTorch's defaults), in what is left of the call.
#   TOTAL_S=570 TASKS=dac_encoder,vae_decoder bash bench/plans/codec_round_h100.sh
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout -k 5 90 python3 -m pytest -q -m gpu tests/test_runtime_core.py tests/test_bench_memory.py > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -3 "$OUT/gpu_tests.txt"
if [ "${MEMORY:-1}" != 0 ]; then
  OUT="$OUT" SKIP_INSTALL=1 TOTAL_S=${MEMORY_S:-320} BUILD_S=${MEMORY_BUILD_S:-280} LOAD_S=40 JOBS=6 \
    STAGES=qwen3-tts-12hz/code2wav EXTRA="--axis frames=64,128,325" bash bench/plans/memory_h100.sh
fi
LEFT=$(( ${TOTAL_S:-570} - ($(date +%s) - T0) ))
echo "codec-stages with $LEFT s left"
timeout -s INT -k 10 "$LEFT" python3 -m bench codec-stages --stages "${TASKS:-dac_encoder,vae_decoder}" \
  --variants "${VARIANTS:-eager}" --budget $(( LEFT - 60 )) --out "$OUT" ${CODEC_EXTRA:-} > "$OUT/codec_stages.log" 2>&1
echo "codec-stages rc $? at $(( $(date +%s) - T0 )) s"
grep -v "Warning\|return cls.__new__" "$OUT/codec_stages.log" | tail -25 | cut -c1-400
