"""The tile form with W as the MMA's M side (`SWAP_AB`): `python -m bench.probes.swap_ab_tiles OUT.json [SECONDS]`.

At 16 rows the tile form runs mma.sync with x as the M side: every warp moves its W tile from shared memory into
registers (ldmatrix) before each product, one program of 4 warps per SM, and the B = 16 LM steps' projections
reach 60-70 % of their floor (H100 residual_lm_step b16: gate_up 23.6 µs against 16.75,
bench/results/nvidia-h100/probes/tail_linears_ab/). With SWAP_AB the same products are W · xᵀ: a BLOCK_N ≥ 64 tile
is one sm_90 warpgroup MMA (wgmma) that reads W where the cp.async stages put it (sm_90 compile: HGMMA, no LDSM).
Timed like the bench's `configs` section (graph of back-to-back calls over weights rotated past L2, the same-bytes
copy beside it, each result checked against the aten reference): the op's autotuned plan, its swept best tiles, and
swapped tiles × split-K (a split runs as the op runs it: its epilogue kernel included), and the op's swapped plan
(TTSAOT_SKINNY_SWAP_AB's: its split-K rule, the depth autotuned), at the VoxCPM2 LM steps' projections for 16 and 8
rows and the LocDiT's at 22."""

from __future__ import annotations

import json
import sys
import time

import torch

SWAP = {"SWAP_AB": True}
# name: (N, K, epilogue, rows)
SHAPES = {
    "voxcpm2_gate_up": (12288, 2048, {"norm": True, "gated": True}, (16, 8)),
    "voxcpm2_down": (2048, 6144, {"residual": True}, (16, 8)),
    "voxcpm2_qkv": (2560, 2048, {"norm": True}, (16, 8)),
    "voxcpm2_o": (2048, 2048, {"residual": True}, (16, 8)),
    "voxcpm2_locdit_gate_up": (8192, 1024, {"norm": True, "gated": True}, (22,)),
    "voxcpm2_locdit_qkv": (2560, 1024, {"norm": True}, (22,)),
}
# (BLOCK_N, BLOCK_K, num_warps, num_stages[, launch constants]): the op's fastest tile config at these shapes in the
# H100 sweep (kernel_configs.json), then swapped tiles
CANDIDATES = (
    (32, 256, 4, 4),
    (64, 128, 4, 4, SWAP),
    (64, 256, 4, 3, SWAP),
    (64, 64, 4, 6, SWAP),
    (128, 128, 8, 3, SWAP),
)


def main(argv: list[str]) -> int:
    import bench.kernels as kb
    from bench.common import device_info

    out = argv[0]
    deadline = time.monotonic() + (float(argv[1]) if len(argv) > 1 else 400.0)
    dev = torch.device("cuda")
    peak = kb._peak_copy(50, dev)
    res: dict = {"device": device_info(dev), "peak_copy": peak, "cases": {}}
    for name, (n, k, spec, rows) in SHAPES.items():
        for m in rows:
            if time.monotonic() > deadline:
                print(f"{name} M={m}: skipped (time)", flush=True)
                continue
            splits = (1, 2) if spec.get("gated") else (1, 2, 4)
            r = kb.bench_skinny_configs(
                m, n, k, spec, "dot", peak["gb_per_s"], 100, dev, time_left=lambda: deadline - time.monotonic(),
                with_plan=True, candidates=CANDIDATES, splits=splits, plan_variants={"swap_plan": {"swap_ab": True}},
            )  # fmt: skip
            res["cases"][f"{name}/M={m}"] = r
            timed = {key: v["graph_ms"] * 1e3 for key, v in r["runs"].items() if "graph_ms" in v}
            plan, swap_plan = (r.get(p, {}).get("graph_ms", float("nan")) * 1e3 for p in ("plan", "swap_plan"))
            best = sorted(timed.items(), key=lambda kv: kv[1])[:4]
            print(f"{name} M={m}: copy {r['copy_same_bytes']['ms'] * 1e3:.2f} plan {plan:.2f} swap plan "
                  f"{swap_plan:.2f} best "
                  + ", ".join(f"{key} {us:.2f}" for key, us in best), flush=True)  # fmt: skip
            runs = {**r["runs"], **{p: r[p] for p in ("plan", "swap_plan") if p in r}}
            errs = [key for key, v in runs.items() if "error" in v or v.get("rel_err_vs_reference", 0) > 1e-2]
            if errs:
                print("  failed or inexact:", errs, flush=True)
            with open(out, "w") as f:
                json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
