"""Hardware counters of `ttsaot::skinny_linear` where it falls short of the copy: run under Nsight Compute.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... -o OUT/skinny \\
        python -m bench.probes.ncu_skinny

The tile form at the LocDiT's 22 rows reaches 48-66% of a same-bytes copy (bench/results/nvidia-h100/probes/
locdit_split_sweep/) where the GEMV form at one row reaches ~95%; every earlier probe timed variants from outside.
This one lets ncu read why: each case is launched once as the op launches it (autotuned before the profiled range,
so only the chosen config runs in it), then a D2D copy of the same weight bytes, each inside an NVTX range named
after the case (a same-dtype copy is a DMA memcpy, not a kernel: ncu does not profile it). Weights are random
(never all zero); ncu flushes the caches before each kernel it replays, so every W read comes from HBM.
"""

from __future__ import annotations

import sys

import torch

# name: (M, N, K, epilogue) — the LocDiT's four projections at one request (11 tokens × 2 for CFG), and two
# references that reach the copy: the base LM's qkv at one row (GEMV form) and gate_up at 16 rows (tile form).
CASES: dict[str, tuple[int, int, int, dict]] = {
    "locdit_qkv_m22": (22, 2560, 1024, {"norm": True}),
    "locdit_o_m22": (22, 1024, 2048, {"residual": True}),
    "locdit_gate_up_m22": (22, 8192, 1024, {"norm": True, "gated": True}),
    "locdit_down_m22": (22, 1024, 4096, {"residual": True}),
    "base_qkv_m1": (1, 2560, 2048, {"norm": True}),
    "base_gate_up_m16": (16, 12288, 2048, {"norm": True, "gated": True}),
}
# Variants of the LocDiT qkv at 22 rows, to contrast with the autotuned launch (1 program of 4 warps per SM, 80
# programs: shared memory allows no second): narrower tiles with fewer stages (160 programs, several per SM), and
# the streamed form (no cp.async stages).
VARIANTS: dict[str, tuple[str, dict]] = {
    "locdit_qkv_m22_bn16_s2": (
        "locdit_qkv_m22",
        {"config": {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 2}},
    ),
    "locdit_qkv_m22_bn16_w8_s2": (
        "locdit_qkv_m22",
        {"config": {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 8, "num_stages": 2}},
    ),
    "locdit_qkv_m22_stream": ("locdit_qkv_m22", {"stream": True}),
}


def main(argv: list[str]) -> int:
    import bench.kernels as kb
    from ttsaot.builder.kernels.skinny_linear import launch_skinny_linear

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    runs = []
    cases = {name: (*c, {}) for name, c in CASES.items()}
    cases.update({name: (*CASES[base], launch) for name, (base, launch) in VARIANTS.items()})
    for name, (m, n, k, spec, launch) in cases.items():
        t = kb._skinny_inputs(m, n, k, spec, 1, g, dev)
        kw = kb._skinny_kwargs(t, spec)
        src = t["weights"][0].view(-1)
        dst = torch.empty_like(src)
        kw = {**kw, **launch}
        launch_skinny_linear(t["x"], t["weights"][0], **kw)  # autotunes outside the profiled range
        dst.copy_(src)
        runs.append((name, t, kw, src, dst))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, t, kw, src, dst in runs:
        with torch.cuda.nvtx.range(f"{name}/kernel"):
            launch_skinny_linear(t["x"], t["weights"][0], **kw)
        with torch.cuda.nvtx.range(f"{name}/copy"):
            dst.copy_(src)
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("cases:", ", ".join(cases), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
