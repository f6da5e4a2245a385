"""`ttsaot::skinny_linear`: y = epilogue(prologue(x) @ Wᵀ) for the few-row GEMMs of decode steps and short
re-prefills (M = batch ≤ 16, or batch × positions ≤ a few hundred), where reading W once is the whole cost.

    skinny_linear(x [..., K], weight [N, K], bias [N]? = None, norm_weight [K]? = None, norm_eps = 1e-6,
                  gated = False, residual [..., N_out]? = None, residual_scale = 1.0) -> y [..., N_out]

W is in nn.Linear layout (row-major [N, K]) in x's dtype (bf16 or fp32); products accumulate in fp32; y has
x's dtype. N_out = N/2 when gated, else N. Each step below rounds to x's dtype exactly where the eager modules
(layers.norms.RMSNorm, nn.Linear, layers.mlp.SwiGLU, the families' residual adds) round, so a layer built from this
op computes the eager layer's function up to the order of the fp32 accumulation:

1. prologue, if norm_weight: x̂ = round(norm_weight · round(x · rsqrt(mean(x²) + eps)))   (mean over K in fp32);
2. z = round(x̂ @ Wᵀ + bias)                        (F.linear: fp32 accumulate, bias added before the rounding);
3. gated: gate = z[..., :N/2], up = z[..., N/2:] (rows [0, N/2) and [N/2, N) of a fused gate_up weight);
   z = round(round(silu(gate)) · up)               (F.silu(gate) * up, each eager op rounding once);
4. residual: y = round(residual + round(z · residual_scale))   (`residual + branch * scale`; with scale 1.0 the
   inner rounding is exact, i.e. `residual + branch`).

The Triton kernels (skinny_linear_triton.py) implement this on CUDA; the aten reference below is the same math and
is what CPU builds and the ONNX exporter use (decompositions.py). One op serves every stage: M ≤ 2 takes the GEMV
(FMA) form, larger M a tensor-core tile of 16/32/64 rows; split-K is used where N alone is too narrow to keep the
GPU streaming, with a deterministic second pass.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F

from .common import HAVE_TRITON, cdiv, multiprocessor_count, next_power_of_2, no_wrap, rms_norm, size_hint
from .decompositions import register_cpu_decomposition
from .pdl import kernels_wait

OP_NAME = "ttsaot::skinny_linear"
# (y, RMSNorm(y)) of a projection whose output is the residual stream the next projection normalises: the norm in the
# projection's second pass, where each program holds whole rows, instead of in every program of the next one
# (`skinny_linear_norm_out` below; `norm_out_pays` says where a layer uses it).
NORM_OUT_OP_NAME = "ttsaot::skinny_linear_norm_out"
# M up to this takes the FMA (GEMV) form by default, larger M the tensor-core tile: the FMA accumulator holds
# BLOCK_M·BLOCK_N·BLOCK_K fp32 values (200+ registers per thread at M = 4 with the GEMV configs).
GEMV_MAX_M = 2
# Above this many rows the op is plain aten (cuBLAS + Inductor's fused epilogue), decided at trace time from the
# bucket's static shape: the tile form falls behind cuBLAS there (H100, bench/results/nvidia-h100/probes/
# kernels_phase1/: 1.4-3.2x torch at M = 11..20, but 0.46-0.9x at the Fish fast_ar's M = 44 / 176).
MAX_KERNEL_ROWS = 32
NORM_ROW_ELEMENTS = 4096  # the GEMV form's RMSNorm prologue reads up to this many x values at once (norm_block)
MIN_SPLIT_K_CHUNK = 1024  # split-K never gives a program less than this much of K
SPLIT_K_ALIGN = 512  # split boundaries are multiples of the largest BLOCK_K of the autotuned configs
# TTSAOT_SKINNY_STREAM=1 at build time: the op's tile form (M > GEMV_MAX_M) runs streamed (no cp.async stages,
# several programs per SM, the first W tile loaded before the programmatic-launch wait:
# skinny_linear_triton._dot_stream_loop). Off by default until a GPU has timed it in the stages
# (bench/plans/stage_ab_h100.sh, variant `stream`); part of every package key (package_cache.KERNEL_SWITCHES).
STREAM_ENV = "TTSAOT_SKINNY_STREAM"
METADATA_KEY = "ttsaot_skinny_stream"  # "1" / "0" in each package's metadata: whether it was traced streamed
# TTSAOT_SKINNY_SWAP_AB=1 at build time: the op's 16-bit tile form computes W · xᵀ instead of x · Wᵀ
# (skinny_linear_triton._dot_loop), W tiles of SWAP_BLOCK_N rows as the sm_90 warpgroup MMA's M side, read where the
# cp.async stages put them; split-K makes up the programs the 64-row width leaves too few of (plan_split_k). Off by
# default until a GPU has timed it in the stages (bench/plans/stage_ab_h100.sh, variant `swap`); a package key switch.
SWAP_AB_ENV = "TTSAOT_SKINNY_SWAP_AB"
SWAP_AB_METADATA_KEY = "ttsaot_skinny_swap_ab"  # "1" / "0" in each package's metadata
SWAP_BLOCK_N = 64  # one warpgroup MMA's rows
SWAP_MIN_SPLIT_K_CHUNK = 512  # the swapped form's split-K gives a program at least this much of K
TILE_NORM_BLOCK = 256  # the tile forms' RMSNorm chunk: [BLOCK_M ≤ 32, 256] per unrolled load


def skinny_linear_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    gated: bool = False,
    residual: torch.Tensor | None = None,
    residual_scale: float = 1.0,
) -> torch.Tensor:
    """The op in aten: the eager modules' own calls, in their order."""
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, norm_eps)
    y = F.linear(x, weight, bias)
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    if residual is not None:
        y = residual + (y if residual_scale == 1.0 else y * residual_scale)
    return y


def skinny_linear_norm_out_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    residual_scale: float,
    out_norm_weight: torch.Tensor,
    out_norm_eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`skinny_linear_norm_out` in aten: y = skinny_linear(x, weight, bias, residual=..., residual_scale=...) and
    the next RMSNorm of y, rms_norm(y, out_norm_weight, out_norm_eps)."""
    y = skinny_linear_reference(x, weight, bias, residual=residual, residual_scale=residual_scale)
    return y, rms_norm(y, out_norm_weight, out_norm_eps)


def _out_features(weight: torch.Tensor, gated: bool) -> int:
    return weight.shape[0] // 2 if gated else weight.shape[0]


def _check(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    gated: bool,
    residual: torch.Tensor | None,
    op: str = "skinny_linear",
) -> None:
    torch._check(weight.dim() == 2, lambda: f"{op}: weight must be [N, K], got {tuple(weight.shape)}")
    torch._check(
        x.dim() >= 1 and x.shape[-1] == weight.shape[1],
        lambda: f"{op}: x {tuple(x.shape)} does not end in K = {weight.shape[1]}",
    )
    torch._check(
        # float64: the aten reference only (the builder's float64 pass-parity re-check), never a Triton launch
        (x.dtype in (torch.float32, torch.bfloat16) or (x.dtype == torch.float64 and x.device.type != "cuda"))
        and weight.dtype == x.dtype,
        lambda: f"{op}: x and weight must share a float dtype, got {x.dtype} / {weight.dtype}",
    )
    torch._check(
        weight.stride(1) == 1 and weight.stride(0) == weight.shape[1],
        lambda: f"{op}: weight must be contiguous (nn.Linear layout)",
    )
    torch._check(not gated or weight.shape[0] % 2 == 0, lambda: f"{op}: gated needs an even N (gate rows then up rows)")
    n = weight.shape[0]
    torch._check(
        bias is None or (bias.shape == (n,) and bias.dtype == x.dtype),
        lambda: f"{op}: bias must be [{n}] in {x.dtype}",
    )
    torch._check(
        norm_weight is None or (norm_weight.shape == (x.shape[-1],) and norm_weight.dtype == x.dtype),
        lambda: f"{op}: norm_weight must be [{x.shape[-1]}] in {x.dtype}",
    )
    out_shape = (*x.shape[:-1], _out_features(weight, gated))
    torch._check(
        residual is None or (tuple(residual.shape) == out_shape and residual.dtype == x.dtype),
        lambda: f"{op}: residual must be {list(out_shape)} in {x.dtype}",
    )


def _check_norm_out(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    out_norm_weight: torch.Tensor,
) -> None:
    op = "skinny_linear_norm_out"
    _check(x, weight, bias, None, False, residual, op)
    n = weight.shape[0]
    torch._check(
        out_norm_weight.shape == (n,) and out_norm_weight.dtype == x.dtype,
        lambda: f"{op}: out_norm_weight must be [{n}] in {x.dtype}",
    )


def plan_split_k(m: int, n_out: int, k: int, multiprocessors: int, use_dot: bool, swapped: bool = False) -> int:
    """How many K ranges. Each range costs a second (epilogue) launch, so only when the column tiles (nominal
    BLOCK_N 8 for the GEMV form, 16 for tensor cores) × row tiles leave more than a quarter of the SMs idle; doubled
    while that holds and each range keeps at least MIN_SPLIT_K_CHUNK of K. Swapped (SWAP_BLOCK_N-row tiles): while
    they leave more than half the SMs idle, each range ≥ SWAP_MIN_SPLIT_K_CHUNK (down at 16 rows: 32 tiles × 4)."""
    # swapped: while under half the SMs (the H200 sweep's best at 8 and 16 rows, probes/swap_ab_tiles/)
    width, min_chunk, (num, den) = (
        (SWAP_BLOCK_N, SWAP_MIN_SPLIT_K_CHUNK, (2, 1)) if swapped else (16 if use_dot else 8, MIN_SPLIT_K_CHUNK, (4, 3))
    )
    tiles = cdiv(n_out, width) * cdiv(m, _block_m(m, use_dot))
    split = 1
    while num * tiles * split < den * multiprocessors and k // (2 * split) >= min_chunk and split < 8:
        split *= 2
    return split


def tile_block_n(
    rows: int, n_out: int, split_k: int, block_m: int, multiprocessors: int, choices: Iterable[int]
) -> int:
    """The tensor-core form's BLOCK_N, chosen by rule instead of by the autotuner: the widest of `choices` whose
    programs (row tiles × column tiles × K ranges) still number at least half the SMs, else the narrowest. Wider
    tiles read x (every program reads all its rows) fewer times; below half the SMs too little W streams at once.
    In the H100 sweeps (kernel_configs.json, probes/locdit_fused_split_k/: qkv, o, gate_up, down at M = 4, 8, 16,
    22, unsplit and split in 2) it picks the fastest BLOCK_N in every case but one (down, M = 16, split 2: 14.5 vs
    14.0 us), while the other width costs up to 1.8x (qkv at M = 16: 10.0 vs 18.2 us); the autotuner, timing each
    kernel alone, baked LocDiT qkv at BLOCK_N 16 in a recorded build (9.6 vs 8.7 us in the graph,
    probes/tile_width_rule/). Autotuning still picks among the chosen width's depths (BLOCK_K, stages)."""
    widths = sorted(set(choices), reverse=True)
    for bn in widths:
        if 2 * cdiv(rows, block_m) * cdiv(n_out, bn) * split_k >= multiprocessors:
            return bn
    return widths[-1]


def k_ranges(k: int, split: int, align: int) -> tuple[int, int]:
    """(K range per program, number of ranges) for `split` ranges whose boundaries are multiples of `align`: fewer
    ranges than asked where K is short."""
    k_split = cdiv(cdiv(k, split), align) * align
    return k_split, cdiv(k, k_split)


def norm_block(k: int, m: int, use_dot: bool, stream: bool = False, gated: bool = False) -> int:
    """The K chunk of the RMSNorm prologue (each program recomputes its rows' rstd before its first product), 0 for
    the config's BLOCK_K in a rolled loop. The GEMV form reads the whole row in one step where it fits
    NORM_ROW_ELEMENTS fp32 values: its K loop over x is not pipelined, so every chunk is one more dependent L2 round
    trip before the first product (Fish fast_ar, K = 2560: 3 trips at BLOCK_K 1024). Measured only at the stage:
    fast_ar 4.76 → 4.69 ms on the H100, within what two processes differ by
    (bench/results/nvidia-h100/probes/predictor_kernels/). The tile forms read TILE_NORM_BLOCK columns per chunk,
    all chunks unrolled (`NORM_CHUNKS`), so their loads are in flight together: on the H200 the tile form at the
    plan's width 32 took 114.8 µs over eight normed shapes against 121.0 with BLOCK_K chunks in a loop
    (bench/results/nvidia-h200/probes/norm_prologue/: Fish fast_ar gate_up at 4 rows 38.4 → 34.0, LocDiT qkv at 22
    7.9 → 6.8). Except a gated call at 32 rows (two accumulators, 255 registers rolled or not in an sm_90 compile
    with Triton 3.7), whose unrolled prologue was slower (LocDiT gate_up 12.0 → 12.6 µs): it keeps the rolled loop."""
    if use_dot and (stream or not (gated and _block_m(m, True) >= 32)):
        return min(next_power_of_2(k), TILE_NORM_BLOCK)
    if use_dot:
        return 0
    return min(next_power_of_2(k), max(NORM_ROW_ELEMENTS // next_power_of_2(m), 16))


def _block_m(m: int, use_dot: bool) -> int:
    return (16 if m <= 16 else 32 if m <= 32 else 64) if use_dot else next_power_of_2(m)


def stream_tiles() -> bool:
    """Whether this build's tile-form calls run streamed (STREAM_ENV), decided at trace time."""
    return os.environ.get(STREAM_ENV, "0") == "1"


def swap_ab_tiles() -> bool:
    """Whether this build's 16-bit tile-form calls compute W · xᵀ (SWAP_AB_ENV), decided at trace time."""
    return os.environ.get(SWAP_AB_ENV, "0") == "1"


def swaps(x: torch.Tensor, m: int, n_out: int, k: int, gated: bool, use_dot: bool, stream: bool, swap_ab: bool) -> bool:
    """Whether a call runs the swapped tile form: asked for, the cp.async tile form (not streamed), 16-bit operands
    (an fp32 call's exact products are not a warpgroup MMA's), one 16-row tile, and gate_up or a down-like K ≥ 2·N
    projection: in the H200 sweep (bench/results/nvidia-h200/probes/swap_ab_tiles/) those gained (VoxCPM2 gate_up at
    16 rows 20.17 → 16.73 µs, down at 8 rows 13.28 → 10.58) while qkv, o and the LocDiT's 22-row calls gained nothing
    or lost (o at 8 rows 6.34 against 6.38; qkv at 16 rows 9.49 against 9.00)."""
    tall = gated or k >= 2 * n_out
    return swap_ab and use_dot and not stream and x.element_size() == 2 and _block_m(m, use_dot) == 16 and tall


NORM_OUT_ENV = "TTSAOT_NORM_OUT"  # =0 at build time: layers keep every RMSNorm in the next projection's prologue
NORM_OUT_OFF_METADATA_KEY = "ttsaot_norm_out_off"  # "1" in each package's metadata traced with NORM_OUT_ENV=0
# Fewest rows for which a layer hands its RMSNorm to the projection before it: the prologue cost 1.25-3.36 µs a
# projection at 16 and 22 rows but 0.45-0.50 at 4 (H200, lm_split_norm_cost/), and the local encoder's 5-row b1
# stage was slower with the hand-over (366.1 against 358.2 µs) while the LocDiT's 22-row one gained 404 µs
# (bench/results/nvidia-h200/probes/norm_out_ab/).
NORM_OUT_MIN_ROWS = 16


def norm_out_enabled() -> bool:
    """Whether layers may hand their RMSNorms to the projection before them (NORM_OUT_ENV, read at trace time)."""
    return os.environ.get(NORM_OUT_ENV, "1") != "0"


def norm_out_pays(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a residual projection of x (weight [N, K]) should compute the next RMSNorm in its second pass
    (`skinny_linear_norm_out`), decided at trace time from the bucket's static shape: on the kernel path (CUDA, rows
    ≤ MAX_KERNEL_ROWS) where the plan splits K, so that the second pass is launched anyway. Each program of the next
    projection then starts on its W tiles at once instead of after its rows' rstd: at the LocDiT's 22 rows on the
    H200, qkv 6.69 → 5.44 µs and gate_up 11.89 → 8.53 µs without the prologue
    (bench/results/nvidia-h200/probes/lm_split_norm_cost/). Unsplit, it would add a launch; below NORM_OUT_MIN_ROWS
    the prologue is too cheap to pay for a second pass of whole rows. NORM_OUT_ENV=0: never."""
    if not norm_out_enabled() or x.device.type != "cuda" or not kernel_rows(x):
        return False
    n_out, k = weight.shape
    m = size_hint(x.numel() // max(k, 1))
    if m < NORM_OUT_MIN_ROWS:
        return False
    use_dot = m > GEMV_MAX_M
    swapped = swaps(x, m, n_out, k, False, use_dot, stream_tiles(), swap_ab_tiles())
    split = plan_split_k(m, n_out, k, multiprocessor_count(x.device), use_dot, swapped)
    return k_ranges(k, split, SPLIT_K_ALIGN)[1] > 1


def kernel_rows(x: torch.Tensor) -> bool:
    """Whether a call with this x runs the Triton kernels (else its aten reference): rows ≤ MAX_KERNEL_ROWS. Shapes
    are static per bucket, so each bucket's package bakes one choice; a symbolic row count keeps the kernels."""
    rows = x.numel() // max(x.shape[-1], 1) if x.dim() else 1
    return not isinstance(rows, int) or rows <= MAX_KERNEL_ROWS


def launch_skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    gated: bool = False,
    residual: torch.Tensor | None = None,
    residual_scale: float = 1.0,
    *,
    wrap: Callable[[Any], Any] = no_wrap,
    config: dict | None = None,
    split_k: int | None = None,
    use_dot: bool | None = None,
    semaphores: torch.Tensor | None = None,
    stream: bool = False,
    out_norm_weight: torch.Tensor | None = None,
    out_norm_eps: float = 1e-6,
    swap_ab: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Run the Triton kernels (CUDA, or CPU under TRITON_INTERPRET=1). `config` ({"BLOCK_N", "BLOCK_K", "num_warps",
    "num_stages"}, and launch constants to override, e.g. "PRELOAD": True) skips autotuning (the interpreter tests and
    the bench's sweeps); `split_k` and `use_dot` override the plan. `semaphores`: a zeroed int32 workspace of ≥ one
    counter per output tile, left zeroed; with it a split-K call adds its partials in the same kernel (the last program
    of each output tile to finish), without it the second (epilogue) kernel does. No stage passes one: a per-call
    counter fill (an Inductor kernel) breaks the programmatic-launch chain of the 1-row packages (H100 LocDiT b1: 5.62
    vs 4.92 ms, bench/results/nvidia-h100/probes/skinny_split_k_ab/), and one workspace per stage call shared by all its
    projections was slower too (LocDiT b1 4667 vs 4558 µs, local encoder 526 vs 461 µs: the tile's last program reduces
    serially where the epilogue kernel's programs, launched early, run at once; probes/skinny_counters_ab/). The bench
    times both (`--sections configs_predictors`). `stream`: the tensor-core form with the GEMV form's memory schedule
    (skinny_linear_triton._dot_stream_loop). `out_norm_weight`: `skinny_linear_norm_out`'s call, returning (y, the
    RMSNorm of y's rows), its second pass `norm_out_epilogue_kernel` (in place of the split-K epilogue kernel).
    `swap_ab`: a 16-bit tile-form call computes W · xᵀ (`swaps`; skinny_linear_triton.SWAP_CONFIGS)."""
    from . import skinny_linear_triton as kernels

    norm_out = out_norm_weight is not None
    torch._check(not (norm_out and (gated or semaphores is not None)), lambda: "norm_out: not gated, no semaphores")

    k = weight.shape[1]
    n_out = _out_features(weight, gated)
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    y = x.new_empty((*x.shape[:-1], n_out))
    r2 = residual.reshape(-1, n_out).contiguous() if residual is not None else x2
    if use_dot is None:
        use_dot = m > GEMV_MAX_M
    block_m = _block_m(m, use_dot)
    swapped = swaps(x, m, n_out, k, gated, use_dot, stream, swap_ab)
    if split_k is None:
        split_k = plan_split_k(m, n_out, k, multiprocessor_count(x.device), use_dot, swapped)
    k_split, split_k = k_ranges(k, split_k, config["BLOCK_K"] if config else SPLIT_K_ALIGN)
    part = x2.new_empty((split_k, m, weight.shape[0]), dtype=torch.float32) if split_k > 1 else x2
    fused_reduce = split_k > 1 and semaphores is not None
    if fused_reduce:
        configs = kernels.SWAP_CONFIGS if swapped else kernels.GEMM_CONFIGS if use_dot else kernels.GEMV_CONFIGS
        block_n = config["BLOCK_N"] if config else min(c.kwargs["BLOCK_N"] for c in configs)
        tiles = cdiv(m, block_m) * cdiv(n_out, block_n)
        torch._check(
            semaphores.dtype == torch.int32 and semaphores.numel() >= tiles and semaphores.device == x.device,
            lambda: f"skinny_linear: semaphores must be ≥ {tiles} int32 counters on {x.device}",
        )
    flags = dict(
        HAS_NORM=norm_weight is not None, HAS_BIAS=bias is not None, GATED=gated, HAS_RESIDUAL=residual is not None
    )
    args = (
        x2,
        weight,
        bias if bias is not None else x2,
        norm_weight if norm_weight is not None else x2,
        r2,
        y,
        part,
        semaphores if fused_reduce else part,
        m,
        n_out,
        k,
        k_split,
        float(norm_eps),
        float(residual_scale),
    )
    meta = dict(
        flags,
        SPLIT_K=split_k,
        FUSED_REDUCE=fused_reduce,
        USE_DOT=use_dot,
        BLOCK_M=block_m,
        FP32_DOT=x.dtype == torch.float32 or x.device.type != "cuda",
        PDL=kernels_wait(x.device),
        NORM_BLOCK=norm_block(k, m, use_dot, stream, gated),
        STREAM=use_dot and stream,
        SWAP_AB=swapped,
    )  # off-GPU = the interpreter
    # the tile forms' chunks unrolled (the GEMV form's norm_block covers the row where it fits: no loop to unroll)
    unroll = use_dot and meta["NORM_BLOCK"] > 0 and isinstance(k, int)
    meta["NORM_CHUNKS"] = cdiv(k, meta["NORM_BLOCK"]) if unroll else 0

    def grid(meta):
        return (cdiv(m, meta["BLOCK_M"]), cdiv(n_out, meta["BLOCK_N"]), split_k)

    if config is None:
        if not use_dot:
            kernel = kernels.skinny_gemv_autotuned
        elif stream:
            kernel = kernels.skinny_stream_autotuned
        else:
            kernel = kernels.skinny_swap_autotuned if swapped else kernels.skinny_gemm_autotuned
        wrap(kernel)[grid](*args, **meta)
    else:
        wrap(kernels.skinny_linear_kernel)[grid](*args, **{**meta, "PRELOAD": False, **config})
    if norm_out:
        yn = launch_norm_out_pass(
            part, bias, r2 if residual is not None else None, residual_scale, out_norm_weight, out_norm_eps, y,
            split_k, wrap=wrap,
        )  # fmt: skip
        return y, yn
    if split_k > 1 and not fused_reduce:
        # The norm was applied in the first pass: the epilogue kernel takes the epilogue flags only.
        epilogue = {k: v for k, v in flags.items() if k != "HAS_NORM"}
        bm = min(16, next_power_of_2(m))
        wrap(kernels.split_k_epilogue_kernel)[(cdiv(n_out, 128), cdiv(m, bm))](
            part,
            args[2],
            r2,
            y,
            m,
            n_out,
            float(residual_scale),
            **epilogue,
            SPLIT_K=split_k,
            PDL=meta["PDL"],
            BLOCK_M=bm,
            BLOCK_N=128,
        )
    return y


def launch_norm_out_pass(
    part: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    residual_scale: float,
    out_norm_weight: torch.Tensor,
    out_norm_eps: float,
    y: torch.Tensor,
    split_k: int,
    *,
    wrap: Callable[[Any], Any] = no_wrap,
) -> torch.Tensor:
    """The norm hand-over's second pass (`norm_out_epilogue_kernel`) after a projection into y ([..., N], written
    here from the fp32 partials [split_k, M, N] when split_k > 1, else already written by the projection and read
    back), whole rows per program: the row's RMSNorm needs every column of y. Returns the RMSNorm of y's rows."""
    from . import skinny_linear_triton as kernels

    n_out = y.shape[-1]
    m = y.numel() // n_out
    yn = torch.empty_like(y)
    wrap(kernels.norm_out_epilogue_kernel)[(m,)](
        part,
        bias if bias is not None else y,
        residual if residual is not None else y,
        out_norm_weight,
        y,
        yn,
        m,
        n_out,
        float(residual_scale),
        float(out_norm_eps),
        HAS_BIAS=bias is not None,
        HAS_RESIDUAL=residual is not None,
        SPLIT_K=split_k if split_k > 1 else 0,
        PDL=kernels_wait(y.device),
        BLOCK_M=1,
        BLOCK_N=next_power_of_2(n_out),
    )
    return yn


if HAVE_TRITON:

    @torch.library.triton_op(OP_NAME, mutates_args=())
    def skinny_linear(
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        norm_weight: torch.Tensor | None = None,
        norm_eps: float = 1e-6,
        gated: bool = False,
        residual: torch.Tensor | None = None,
        residual_scale: float = 1.0,
    ) -> torch.Tensor:
        _check(x, weight, bias, norm_weight, gated, residual)
        if x.device.type != "cuda" or not kernel_rows(x):
            # Also what a CPU compile traces (fake tensors): plain aten ops that Inductor's C++ backend fuses; and
            # on CUDA above MAX_KERNEL_ROWS, where Inductor's cuBLAS call + fused epilogue is faster.
            return skinny_linear_reference(x, weight, bias, norm_weight, norm_eps, gated, residual, residual_scale)
        return launch_skinny_linear(
            x,
            weight,
            bias,
            norm_weight,
            norm_eps,
            gated,
            residual,
            residual_scale,
            wrap=torch.library.wrap_triton,
            stream=stream_tiles(),
            swap_ab=swap_ab_tiles(),
        )

    @torch.library.triton_op(NORM_OUT_OP_NAME, mutates_args=())
    def skinny_linear_norm_out(
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        residual: torch.Tensor | None,
        residual_scale: float,
        out_norm_weight: torch.Tensor,
        out_norm_eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check_norm_out(x, weight, bias, residual, out_norm_weight)
        if x.device.type != "cuda" or not kernel_rows(x):
            return skinny_linear_norm_out_reference(
                x, weight, bias, residual, residual_scale, out_norm_weight, out_norm_eps
            )
        return launch_skinny_linear(
            x,
            weight,
            bias,
            residual=residual,
            residual_scale=residual_scale,
            wrap=torch.library.wrap_triton,
            stream=stream_tiles(),
            swap_ab=swap_ab_tiles(),
            out_norm_weight=out_norm_weight,
            out_norm_eps=out_norm_eps,
        )

else:

    @torch.library.custom_op(NORM_OUT_OP_NAME, mutates_args=())
    def skinny_linear_norm_out(
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        residual: torch.Tensor | None,
        residual_scale: float,
        out_norm_weight: torch.Tensor,
        out_norm_eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check_norm_out(x, weight, bias, residual, out_norm_weight)
        args = (x, weight, bias, residual, residual_scale, out_norm_weight, out_norm_eps)
        return skinny_linear_norm_out_reference(*args)

    @skinny_linear_norm_out.register_fake
    def _(x, weight, bias, residual, residual_scale, out_norm_weight, out_norm_eps):
        _check_norm_out(x, weight, bias, residual, out_norm_weight)
        y = x.new_empty((*x.shape[:-1], weight.shape[0]))
        return y, torch.empty_like(y)

    @torch.library.custom_op(OP_NAME, mutates_args=())
    def skinny_linear(
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        norm_weight: torch.Tensor | None = None,
        norm_eps: float = 1e-6,
        gated: bool = False,
        residual: torch.Tensor | None = None,
        residual_scale: float = 1.0,
    ) -> torch.Tensor:
        _check(x, weight, bias, norm_weight, gated, residual)
        return skinny_linear_reference(x, weight, bias, norm_weight, norm_eps, gated, residual, residual_scale)

    @skinny_linear.register_fake
    def _(x, weight, bias=None, norm_weight=None, norm_eps=1e-6, gated=False, residual=None, residual_scale=1.0):
        _check(x, weight, bias, norm_weight, gated, residual)
        return x.new_empty((*x.shape[:-1], _out_features(weight, gated)))


register_cpu_decomposition(torch.ops.ttsaot.skinny_linear.default, skinny_linear_reference)
register_cpu_decomposition(torch.ops.ttsaot.skinny_linear_norm_out.default, skinny_linear_norm_out_reference)
