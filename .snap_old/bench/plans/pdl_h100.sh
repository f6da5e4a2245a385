#!/usr/bin/env bash
# One device call (issue 14): programmatic dependent launch of the decode kernels (builder/kernels/pdl.py).
# 1. base_lm_step (8 of 28 layers, ctx 512, B=1 and 16) built three ways in one process — ttsaot (PDL), ttsaot with
#    TTSAOT_PDL=0, inductor — checked against eager and each other, timed beside torch.compile + graph and the floor,
#    profiled (`python -m bench decode-stages --pdl-ab`);
# 2. the GPU tests of the two decode kernels (eager Triton launches of the same kernels, the wait compiled in).
#   bash bench/plans/pdl_h100.sh → $OUT/decode_stages_$STAGE.json (+ logs). STAGE (base_lm_step), STAGE_S, BATCHES,
#   TESTS_S (0 skips the tests) override.
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.txt" 2>&1
python3 - <<'PY' > "$OUT/env.txt" 2>&1
import inspect, torch, triton
from torch._higher_order_ops import triton_kernel_wrap as w
src = inspect.getsource(w)
print("torch", torch.__version__, "triton", triton.__version__)
print("pure inline asm skipped by the mutation analysis:", 'op.name == "tt.elementwise_inline_asm" and op.is_pure' in src)
from ttsaot.builder.kernels import pdl
import torch._inductor.codegen.cuda.device_op_overrides as d
print("launch helper rewritable:", pdl.rewrite_launch_helper(d.CUDADeviceOpOverrides().kernel_driver()) is not None)
PY
cat "$OUT/env.txt"
STAGE=${STAGE:-base_lm_step}
timeout -s INT -k 10 "${STAGE_S:-400}" python3 -m bench decode-stages --stage "$STAGE" --pdl-ab \
  --budget $(( ${STAGE_S:-400} - 40 )) --compile-mode default --batches "${BATCHES:-1,16}" \
  --result "$OUT/decode_stages_$STAGE.json" > "$OUT/decode_stages_$STAGE.log" 2>&1
echo "decode-stages rc $? at $(( $(date +%s) - T0 )) s"
grep -v "Warning\|warn(" "$OUT/decode_stages_$STAGE.log" | tail -8 | cut -c1-500
LEFT=$(( 575 - ($(date +%s) - T0) )); TESTS_S=${TESTS_S:-$LEFT}
if [ "$TESTS_S" -gt 30 ]; then
  timeout -s INT -k 10 "$TESTS_S" python3 -m pytest -m gpu -n 4 -q -p no:cacheprovider \
    tests/test_kernels_skinny_linear.py tests/test_kernels_decode_attention.py > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -5 "$OUT/gpu_tests.log" | cut -c1-300
fi
