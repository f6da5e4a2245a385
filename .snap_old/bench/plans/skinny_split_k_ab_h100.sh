#!/usr/bin/env bash
# One device call (issue 14): a skinny_linear change A/B'd at the stage — this tree (`new`) vs OTHER (`old`, a
# `git archive` of another commit), the LocDiT stage built from each and profiled in turn
# (bench/plans/stage_ab_h100.sh) — then the kernel sweep at the LocDiT rows (`--sections configs_predictors`) and
# the skinny GPU tests (split-K under contention, real shapes autotuned). Used for
# bench/results/nvidia-h100/probes/skinny_split_k_ab/ (new = f2a3c20, since reverted).
#   OTHER=../.snap_old bash bench/plans/skinny_split_k_ab_h100.sh > $OUT/run.log 2>&1
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
T0=$(date +%s)
VARIANTS="new old" STAGES="${STAGES:-voxcpm2/locdit}" BUILD_S=${BUILD_S:-300} bash bench/plans/stage_ab_h100.sh
echo "a/b done at $(( $(date +%s) - T0 )) s"
LEFT=$(( ${LIMIT_S:-570} - ($(date +%s) - T0) - 100 ))
if [ "$LEFT" -gt 40 ]; then
  timeout -k 10 "$LEFT" python3 - <<PY
import os, torch, bench.kernels as kb
from pathlib import Path
from bench.common import write_json
out = Path(os.environ["OUT"]) / "kernels_locdit_split_k.json"
kb.PREDICTOR_SHAPES = {k: v for k, v in kb.PREDICTOR_SHAPES.items() if "locdit" in k}
r = kb.run_kernels(torch.device("cuda"), False, $LEFT - 15, ("copy", "predictors", "configs_predictors"), False,
                   progress=lambda res: write_json(out, res))
write_json(out, r)
print(kb.summary(r))
PY
fi
timeout -k 10 90 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_skinny_linear.py -k "split_k or real_shapes" \
  2>&1 | tail -4
echo "done at $(( $(date +%s) - T0 )) s"
