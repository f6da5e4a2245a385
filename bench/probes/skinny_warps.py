"""The tile form at the LocDiT's 22 rows with more warps per SM: `python -m bench.probes.skinny_warps OUT.json`.

Nsight Compute (bench/probes/ncu_skinny.py, bench/results/nvidia-h100/probes/ncu_skinny/) found the autotuned
launches of these projections at one program of 4 warps per SM (shared memory allows no second): one warp per
scheduler, issuing or waiting on fixed-latency dependencies as often as on memory. This times, like the bench's
`configs_predictors` section (graph of back-to-back calls over rotated weights, the same-bytes copy beside it,
each result checked against the aten reference), the autotuned plan against the same tiles at 8 warps and a few
narrower/wider tiles at 8 warps, split-K 1 (the plans' choice for qkv and gate_up)."""

from __future__ import annotations

import json
import sys

import torch

SHAPES = {  # name: (N, K, epilogue)
    "locdit_qkv": (2560, 1024, {"norm": True}),
    "locdit_gate_up": (8192, 1024, {"norm": True, "gated": True}),
}
# (BLOCK_N, BLOCK_K, num_warps, num_stages)
CANDIDATES = (
    (32, 256, 4, 4),
    (32, 256, 8, 4),
    (32, 128, 8, 4),
    (16, 256, 8, 3),
    (64, 128, 8, 3),
    (32, 256, 8, 2),
)


def main(argv: list[str]) -> int:
    import bench.kernels as kb
    from bench.common import device_info

    dev = torch.device("cuda")
    res: dict = {"device": device_info(dev), "cases": {}}
    for name, (n, k, spec) in SHAPES.items():
        r = kb.bench_skinny_configs(
            22, n, k, spec, "dot", 3000.0, 200, dev, with_plan=True, candidates=CANDIDATES, splits=(1,)
        )
        res["cases"][name] = r
        us = {c: round(v["graph_ms"] * 1e3, 2) for c, v in r["runs"].items() if "graph_ms" in v}
        plan = round(r.get("plan", {}).get("graph_ms", float("nan")) * 1e3, 2)
        print(name, "copy", round(r["copy_same_bytes"]["ms"] * 1e3, 2), "us; plan", plan, "us;", us, flush=True)
    with open(argv[0], "w") as f:
        json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
