#!/usr/bin/env bash
# One device call (issue 15): the Fish dac_encoder (10 s clip, exact fp32 body) from this tree and from OTHER (a
# `git archive` of another commit carried beside it): (1) the GPU tests of $GPU_TESTS, (2) both built side by side
# and profiled in turn (stage_ab_h100.sh), (3) `bench codec-stages dac_encoder` of this tree in what is left: the
# artifact's graph replay against eager, and its codes against exact fp32's.
#   OTHER=../.snap_old bash bench/plans/dac_encoder_ab_h100.sh
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; T0=$(date +%s); TOTAL_S=${TOTAL_S:-570}
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# shellcheck disable=SC2086
timeout -k 5 120 python3 -m pytest -q -m gpu ${GPU_TESTS:-tests/test_kernels_window_attention.py} > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -3 "$OUT/gpu_tests.txt"
STAGES=fish-s2-pro/dac_encoder AXIS=samples=442368 VARIANTS="new old" BUILD_S=${BUILD_S:-240} \
  bash bench/plans/stage_ab_h100.sh
LEFT=$(( TOTAL_S - ($(date +%s) - T0) ))
echo "codec-stages with $LEFT s left"
timeout -s INT -k 10 "$LEFT" python3 -m bench codec-stages --stages dac_encoder --variants "${CODEC_VARIANTS:-eager}" \
  --budget $(( LEFT - 30 )) --package-cache /tmp/ab_cache_new --out "$OUT" > "$OUT/codec_stages.log" 2>&1
echo "codec-stages rc $? at $(( $(date +%s) - T0 )) s"
grep -v "Warning\|return cls.__new__" "$OUT/codec_stages.log" | tail -8 | cut -c1-400
