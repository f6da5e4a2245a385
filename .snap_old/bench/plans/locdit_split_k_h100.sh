#!/usr/bin/env bash
# The skinny GEMM at the LocDiT rows (issue 14): wider tiles × split-K with the in-kernel reduction vs the
# autotuned plan, next to a copy of the same bytes; the fused reduction's GPU tests; the thin-conv stage probe
# (issue 15). One device call, from a `git archive` snapshot in .snap:
#     cd .snap && bash bench/plans/locdit_split_k_h100.sh > $OUT/run.log 2>&1
set -u
export CXX=/usr/bin/g++
SWEEP_S=${SWEEP_S:-300}
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1 || echo "pip install failed"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
python3 - <<PY
import os, torch, bench.kernels as kb
from pathlib import Path
from bench.common import write_json
out = Path(os.environ["OUT"]) / "kernels_locdit_fused_split_k.json"
kb.PREDICTOR_SHAPES = {k: v for k, v in kb.PREDICTOR_SHAPES.items() if "locdit" in k}
r = kb.run_kernels(torch.device("cuda"), False, $SWEEP_S, ("copy", "predictors", "configs_predictors"), False,
                   progress=lambda res: write_json(out, res))
write_json(out, r)
print(kb.summary(r))
PY
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_skinny_linear.py -k "fused" 2>&1 | tail -5
timeout 150 python3 bench/probes/thin_conv_stages.py --out "$OUT/thin_conv_stages.json" 2>&1 | tail -30
