"""Triton kernels of `ttsaot::skinny_linear` (semantics and rounding order: skinny_linear.py).

Imported by the launcher on first use: registering the op (and CPU builds, which trace its aten branch) needs no
kernel objects. Under TRITON_INTERPRET=1 (set before triton is first imported: tests/conftest.py) the kernels run
on CPU tensors in Triton's interpreter.

Decode-step GEMMs are bound by reading W once: each program owns BLOCK_N output columns (the matching gate AND
up rows of a fused gate_up weight, so SiLU·mul happens in registers), streams its W rows along K in BLOCK_K
chunks (rows are contiguous along K: coalesced, 16-byte loads) and optionally a contiguous K range of SPLIT_K
(when N alone gives too few programs to keep every SM streaming). x rows are tiny and come from L2.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from .common import cdiv, multiprocessor_count, next_power_of_2, shared_memory_per_block, size_hint
from .pdl_triton import grid_dependency_trigger, grid_dependency_wait
from .skinny_linear import tile_block_n
from .split_k_triton import last_to_arrive, reset_counter


@triton.jit
def _row_rstd(x_ptr, offs_m, m_mask, K, eps, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, CHUNKS: tl.constexpr):
    """1/sqrt(mean(x²) + eps) of BLOCK_M rows of x [M, K] in fp32 (every program recomputes its rows'). CHUNKS > 0:
    the K loop unrolled into that many chunks (CHUNKS · BLOCK_K ≥ K), so every chunk's load is issued before the
    first is summed: one L2 round trip before the first product instead of one per chunk."""
    ss = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    if CHUNKS > 0:
        for c in tl.static_range(CHUNKS):
            offs_k = c * BLOCK_K + tl.arange(0, BLOCK_K)
            x = tl.load(
                x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=m_mask[:, None] & (offs_k < K)[None, :], other=0.0
            ).to(tl.float32)
            ss += x * x
    else:
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(
                x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=m_mask[:, None] & (offs_k < K)[None, :], other=0.0
            ).to(tl.float32)
            ss += x * x
    return 1.0 / tl.sqrt(tl.sum(ss, axis=1) / K + eps)


@triton.jit
def _epilogue_values(
    acc,
    acc_up,
    offs_m,
    offs_n,
    m_mask,
    n_mask,
    b_ptr,
    r_ptr,
    N_OUT,
    scale,
    dt: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    """fp32 accumulators [BLOCK_M, BLOCK_N] → y in dt, rounding where eager bf16 ops round; 0 in masked lanes."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        if GATED:
            acc_up += tl.load(b_ptr + N_OUT + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    y = acc.to(dt)  # F.linear's output
    if GATED:
        g = y.to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dt)  # F.silu(gate)
        y = (s.to(tl.float32) * acc_up.to(dt).to(tl.float32)).to(dt)  # silu(gate) * up
    if HAS_RESIDUAL:
        offs = offs_m[:, None] * N_OUT + offs_n[None, :]
        r = tl.load(r_ptr + offs, mask=m_mask[:, None] & n_mask[None, :], other=0.0).to(tl.float32)
        branch = (y.to(tl.float32) * scale).to(dt)  # branch * scale (exact when scale == 1)
        y = (r + branch.to(tl.float32)).to(dt)  # residual + branch
    return y


@triton.jit
def _epilogue(
    acc,
    acc_up,
    offs_m,
    offs_n,
    m_mask,
    n_mask,
    b_ptr,
    r_ptr,
    y_ptr,
    N_OUT,
    scale,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    """fp32 accumulators [BLOCK_M, BLOCK_N] → y (`_epilogue_values`), stored."""
    y = _epilogue_values(
        acc, acc_up, offs_m, offs_n, m_mask, n_mask, b_ptr, r_ptr, N_OUT, scale, y_ptr.dtype.element_ty, HAS_BIAS,
        GATED, HAS_RESIDUAL,
    )  # fmt: skip
    tl.store(y_ptr + offs_m[:, None] * N_OUT + offs_n[None, :], y, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _sum_partials(
    part_ptr,
    offs_m,
    offs_n,
    mask,
    M,
    N_OUT,
    GATED: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The SPLIT_K fp32 partials [SPLIT_K, M, N] of one output tile, added in split order (deterministic: the same
    sums whichever program adds them). Loaded through L2 only (.cg): they were written by other programs."""
    n_acc = N_OUT * 2 if GATED else N_OUT
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        base = part_ptr + (s * M + offs_m)[:, None] * n_acc + offs_n[None, :]
        acc += tl.load(base, mask=mask, other=0.0, cache_modifier=".cg")
        if GATED:
            acc_up += tl.load(base + N_OUT, mask=mask, other=0.0, cache_modifier=".cg")
    return acc, acc_up


@triton.jit
def _x_tile(x_ptr, offs_m, m_mask, K, k0, k_hi, BLOCK_K: tl.constexpr):
    """The [BLOCK_M, BLOCK_K] x tile at k0; all-masked past k_hi."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    return tl.load(
        x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=m_mask[:, None] & (offs_k < k_hi)[None, :], other=0.0
    )


@triton.jit
def _w_rows(w_ptr, rows, n_mask, K, k0, k_hi, BLOCK_K: tl.constexpr):
    """The [BLOCK_N, BLOCK_K] tile of W rows `rows` at k0; all-masked past k_hi."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    w_mask = n_mask[:, None] & (offs_k < k_hi)[None, :]
    return tl.load(w_ptr + rows.to(tl.int64)[:, None] * K + offs_k[None, :], mask=w_mask, other=0.0)


@triton.jit
def _dot_w_tile(w_ptr, offs_n, n_mask, N_OUT, K, k0, k_hi, GATED: tl.constexpr, BLOCK_K: tl.constexpr):
    """The [BLOCK_N, BLOCK_K] W tile (and the matching up rows when GATED) at k0; all-masked past k_hi."""
    w = _w_rows(w_ptr, offs_n, n_mask, K, k0, k_hi, BLOCK_K)
    wu = w
    if GATED:
        wu = _w_rows(w_ptr, offs_n + N_OUT, n_mask, K, k0, k_hi, BLOCK_K)
    return w, wu


@triton.jit
def _normed(x, g_ptr, rstd, k0, k_hi, BLOCK_K: tl.constexpr):
    """The RMSNorm prologue on an x tile at k0, rounding where the eager RMSNorm rounds."""
    dt = x.dtype
    offs_k = k0 + tl.arange(0, BLOCK_K)
    gw = tl.load(g_ptr + offs_k, mask=offs_k < k_hi, other=0.0)
    x = (x.to(tl.float32) * rstd[:, None]).to(dt)  # normalised, cast back
    return (gw.to(tl.float32)[None, :] * x.to(tl.float32)).to(dt)  # × weight in x's dtype


@triton.jit
def _mma(x, w, acc, FP32_DOT: tl.constexpr):
    """acc + x · wᵀ on the tensor cores (exact fp32 products with FP32_DOT); swapped, `_mma(w, x, acc_t)`."""
    if FP32_DOT:
        acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    else:
        acc = tl.dot(x, tl.trans(w), acc)
    return acc


@triton.jit
def _mma_either(x, w, acc, SWAP_AB: tl.constexpr, FP32_DOT: tl.constexpr):
    """acc + x · wᵀ, or swapped acc + w · xᵀ (acc transposed): the same products."""
    if SWAP_AB:
        acc = _mma(w, x, acc, FP32_DOT)
    else:
        acc = _mma(x, w, acc, FP32_DOT)
    return acc


@triton.jit
def _dot_loop(
    x_ptr,
    w_ptr,
    g_ptr,
    rstd,
    offs_m,
    offs_n,
    m_mask,
    n_mask,
    N_OUT,
    K,
    k_lo,
    k_hi,
    HAS_NORM: tl.constexpr,
    GATED: tl.constexpr,
    FP32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SWAP_AB: tl.constexpr,
):
    """Tensor-core form: [BLOCK_M, BLOCK_K] x tile · [BLOCK_N, BLOCK_K]ᵀ W tile per step (cp.async-pipelined).
    SWAP_AB: the same products as [BLOCK_N, BLOCK_K] W · [BLOCK_K, BLOCK_M] xᵀ, so W is the MMA's M side: on sm_90
    a BLOCK_N ≥ 64 tile is one warpgroup MMA (wgmma) that reads W from shared memory where the cp.async stages put
    it, instead of each warp moving it into registers first (mma.sync at ≤ 32 rows takes the x side as M)."""
    acc = tl.zeros((BLOCK_N, BLOCK_M) if SWAP_AB else (BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_M) if SWAP_AB else (BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        x = _x_tile(x_ptr, offs_m, m_mask, K, k0, k_hi, BLOCK_K)
        if HAS_NORM:
            x = _normed(x, g_ptr, rstd, k0, k_hi, BLOCK_K)
        acc = _mma_either(x, _w_rows(w_ptr, offs_n, n_mask, K, k0, k_hi, BLOCK_K), acc, SWAP_AB, FP32_DOT)
        if GATED:  # the up rows loaded after the gate product (150 vs 200 registers at the gated 16-row tile)
            w_up = _w_rows(w_ptr, offs_n + N_OUT, n_mask, K, k0, k_hi, BLOCK_K)
            acc_up = _mma_either(x, w_up, acc_up, SWAP_AB, FP32_DOT)
    if SWAP_AB:  # back to [BLOCK_M, BLOCK_N] for the epilogue
        acc = tl.trans(acc)
        acc_up = tl.trans(acc_up)
    return acc, acc_up


@triton.jit
def _dot_stream_loop(
    x_ptr,
    w_ptr,
    g_ptr,
    rstd,
    w,
    wu,
    offs_m,
    offs_n,
    m_mask,
    n_mask,
    N_OUT,
    K,
    k_lo,
    k_hi,
    HAS_NORM: tl.constexpr,
    GATED: tl.constexpr,
    FP32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Streamed tensor-core form: the GEMV form's memory schedule with `tl.dot` products. No cp.async pipeline
    (num_stages 1, so little shared memory and several programs per SM, like the GEMV form's): the tiles of step
    k+1 (W from HBM, x from L2) are loaded into registers before the product of step k, and `w`/`wu`, the first W
    tile, was loaded by the caller before the grid-dependency wait."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    x = _x_tile(x_ptr, offs_m, m_mask, K, k_lo, k_hi, BLOCK_K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        x_next = _x_tile(x_ptr, offs_m, m_mask, K, k0 + BLOCK_K, k_hi, BLOCK_K)
        w_next, wu_next = _dot_w_tile(w_ptr, offs_n, n_mask, N_OUT, K, k0 + BLOCK_K, k_hi, GATED, BLOCK_K)
        if HAS_NORM:
            x = _normed(x, g_ptr, rstd, k0, k_hi, BLOCK_K)
        acc = _mma(x, w, acc, FP32_DOT)
        if GATED:
            acc_up = _mma(x, wu, acc_up, FP32_DOT)
        x = x_next
        w = w_next
        wu = wu_next
    return acc, acc_up


@triton.jit
def _fma_w_tile(w_ptr, offs_n3, n_mask3, N_OUT, K, k0, k_hi, GATED: tl.constexpr, BLOCK_K: tl.constexpr):
    """The [1, BLOCK_N, BLOCK_K] W tile (and the matching up rows when GATED) at k0; all-masked past k_hi."""
    offs_k3 = (k0 + tl.arange(0, BLOCK_K))[None, None, :]
    w_mask = n_mask3 & (offs_k3 < k_hi)
    w = tl.load(w_ptr + offs_n3.to(tl.int64) * K + offs_k3, mask=w_mask, other=0.0)
    wu = w
    if GATED:
        wu = tl.load(w_ptr + (offs_n3 + N_OUT).to(tl.int64) * K + offs_k3, mask=w_mask, other=0.0)
    return w, wu


@triton.jit
def _fma_loop(
    x_ptr,
    w_ptr,
    g_ptr,
    rstd,
    w,
    wu,
    offs_m,
    offs_n,
    M,
    N_OUT,
    K,
    k_lo,
    k_hi,
    HAS_NORM: tl.constexpr,
    GATED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """GEMV form: elementwise FMA into a [BLOCK_M, BLOCK_N, BLOCK_K] fp32 accumulator, reduced over K once at the
    end. x and W are loaded straight in that 3-D layout ([BLOCK_M, 1, BLOCK_K], [1, BLOCK_N, BLOCK_K]) so no tile
    goes through shared memory on the way to the FMAs. `w`/`wu`: the first W tile, loaded by the caller (before the
    grid-dependency wait); each step loads the next tile into registers before it multiplies the current one."""
    dt = x_ptr.dtype.element_ty
    offs_m3 = offs_m[:, None, None]
    offs_n3 = offs_n[None, :, None]
    m_mask3 = offs_m3 < M
    n_mask3 = offs_n3 < N_OUT
    if HAS_NORM:
        rstd3 = rstd[:, None, None]
    acc3 = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc3_up = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k3 = (k0 + tl.arange(0, BLOCK_K))[None, None, :]
        k_mask3 = offs_k3 < k_hi
        x = tl.load(x_ptr + offs_m3 * K + offs_k3, mask=m_mask3 & k_mask3, other=0.0)
        if HAS_NORM:
            gw = tl.load(g_ptr + offs_k3, mask=k_mask3, other=0.0)
            x = (x.to(tl.float32) * rstd3).to(dt)
            x = (gw.to(tl.float32) * x.to(tl.float32)).to(dt)
        xf = x.to(tl.float32)
        w_next, wu_next = _fma_w_tile(w_ptr, offs_n3, n_mask3, N_OUT, K, k0 + BLOCK_K, k_hi, GATED, BLOCK_K)
        acc3 += xf * w.to(tl.float32)
        if GATED:
            acc3_up += xf * wu.to(tl.float32)
        w = w_next
        wu = wu_next
    return tl.sum(acc3, axis=2), tl.sum(acc3_up, axis=2)


@triton.jit
def _fma_preloaded(
    x_ptr,
    g_ptr,
    rstd,
    w,
    wu,
    offs_m,
    M,
    K,
    k_lo,
    k_hi,
    eps,
    HAS_NORM: tl.constexpr,
    NORM_HERE: tl.constexpr,
    GATED: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """GEMV form with the program's whole K range in ONE W tile (`w`/`wu`, BLOCK_K ≥ the range), loaded by the
    caller before the grid-dependency wait: after it, one x load, the products and the reduction. NORM_HERE (the
    tile is the whole row: no split-K): the RMSNorm's rstd comes from the same x tile instead of a pass of its own."""
    dt = x_ptr.dtype.element_ty
    offs_m3 = offs_m[:, None, None]
    offs_k3 = (k_lo + tl.arange(0, BLOCK_K))[None, None, :]
    k_mask3 = offs_k3 < k_hi
    x = tl.load(x_ptr + offs_m3 * K + offs_k3, mask=(offs_m3 < M) & k_mask3, other=0.0)
    if HAS_NORM:
        if NORM_HERE:
            xf = x.to(tl.float32)
            rstd3 = (1.0 / tl.sqrt(tl.sum(xf * xf, axis=2) / K + eps))[:, :, None]
        else:
            rstd3 = rstd[:, None, None]
        gw = tl.load(g_ptr + offs_k3, mask=k_mask3, other=0.0)
        x = (x.to(tl.float32) * rstd3).to(dt)
        x = (gw.to(tl.float32) * x.to(tl.float32)).to(dt)
    xf = x.to(tl.float32)
    acc = tl.sum(xf * w.to(tl.float32), axis=2)
    acc_up = acc
    if GATED:
        acc_up = tl.sum(xf * wu.to(tl.float32), axis=2)
    return acc, acc_up


@triton.jit
def _gemv_program(
    x_ptr,
    w_ptr,
    g_ptr,
    w0,
    wu0,
    offs_m,
    m_mask,
    offs_n,
    M,
    N_OUT,
    K,
    k_lo,
    k_hi,
    eps,
    HAS_NORM: tl.constexpr,
    GATED: tl.constexpr,
    WHOLE_ROW: tl.constexpr,
    PRELOAD: tl.constexpr,
    NORM_BLOCK: tl.constexpr,
    NORM_CHUNKS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One program of the GEMV (FMA) form after the grid-dependency wait, up to its fp32 accumulators (acc, acc_up):
    the RMSNorm's rstd, then the K range k_lo..k_hi from its first W tile w0 / wu0 (`_fma_w_tile`, all of its W
    with PRELOAD), which the caller loaded before the wait. WHOLE_ROW: the range is the whole row (no split-K), so
    a PRELOAD tile gives the rstd too. skinny_linear_kernel's GEMV form and qkv_attention_kernel's projection.

    The caller loads w0, waits and makes the rows (offs_m = ... + the wait's token) itself: torch's access
    analysis follows a pointer back through the call that made any of its offsets, so rows returned from a call
    that takes x / W / g would mark those written too (every projection's weights became package outputs, H200
    at 2d3e484; tests/test_kernel_analysis.py)."""
    rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_NORM and not (PRELOAD and WHOLE_ROW):  # (one preloaded tile of the whole row: rstd from that tile)
        rstd = _row_rstd(x_ptr, offs_m, m_mask, K, eps, BLOCK_M, NORM_BLOCK if NORM_BLOCK > 0 else BLOCK_K, NORM_CHUNKS)
    if PRELOAD:
        acc, acc_up = _fma_preloaded(
            x_ptr, g_ptr, rstd, w0, wu0, offs_m, M, K, k_lo, k_hi, eps, HAS_NORM, WHOLE_ROW, GATED, BLOCK_K
        )
    else:
        acc, acc_up = _fma_loop(
            x_ptr,
            w_ptr,
            g_ptr,
            rstd,
            w0,
            wu0,
            offs_m,
            offs_n,
            M,
            N_OUT,
            K,
            k_lo,
            k_hi,
            HAS_NORM,
            GATED,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
        )
    return acc, acc_up


# What each kernel here may write (kernel_analysis.check_writes holds torch's access analysis to it)
WRITES = {
    "skinny_linear_kernel": frozenset({"y_ptr", "part_ptr", "sem_ptr"}),
    "split_k_epilogue_kernel": frozenset({"y_ptr"}),
}


@triton.jit
def skinny_linear_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    g_ptr,
    r_ptr,
    y_ptr,
    part_ptr,
    sem_ptr,
    M,
    N_OUT,
    K,
    K_SPLIT,
    eps,
    scale,
    HAS_NORM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    SPLIT_K: tl.constexpr,
    FUSED_REDUCE: tl.constexpr,
    USE_DOT: tl.constexpr,
    FP32_DOT: tl.constexpr,
    PDL: tl.constexpr,
    NORM_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STREAM: tl.constexpr,
    NORM_CHUNKS: tl.constexpr,
    PRELOAD: tl.constexpr,
    SWAP_AB: tl.constexpr,
):
    """Grid (cdiv(M, BLOCK_M), cdiv(N_OUT, BLOCK_N), SPLIT_K): the row tiles of one W block are neighbours in
    launch order, so with several row tiles W is read from HBM once and from L2 after. USE_DOT: tensor-core
    `tl.dot` on a BLOCK_M ≥ 16 tile (rows past M masked); otherwise the FMA (GEMV) form, for BLOCK_M = M ≤ 2.
    FP32_DOT: `tl.dot` in exact fp32 ("ieee", not TF32), on fp32 copies of 16-bit operands if need be (the same
    products, exact in fp32): fp32 weights, and Triton's CPU interpreter, which multiplies bf16 operands as raw
    integers. With SPLIT_K > 1 the fp32 partial sums go to part_ptr [SPLIT_K, M, N] and are added in split order
    (deterministic): by `split_k_epilogue_kernel`, or with FUSED_REDUCE by the tile's last program to arrive
    (counted in the zeroed int32 workspace sem_ptr, one counter per output tile, left zeroed). PDL (pdl.py): the
    GEMV form loads its first W tile, then waits for the previous kernel; x and the residual are read, and the
    outputs written, only after the wait. NORM_BLOCK: the chunk of K the RMSNorm prologue reads per step (0: BLOCK_K);
    NORM_CHUNKS > 0: that many chunks, unrolled (all loads in flight at once). STREAM (with USE_DOT): the streamed
    tensor-core form (`_dot_stream_loop`), which like the GEMV form loads its first W tile before the wait and lets
    its dependents launch at once. PRELOAD (GEMV form; the config's BLOCK_K covers the program's whole K range):
    all of the program's W is that first tile, loaded before the wait (`_fma_preloaded`). SWAP_AB (tile form):
    the products as W · xᵀ, W the MMA's M side (`_dot_loop`).
    """
    # fp32 scalars whatever the caller passes: AOTInductor types a float argument of a user kernel fp64 (torch's
    # _use_fp64_for_unbacked_floats), which turned the loop-carried state fp64 (H100 AOTI build failed).
    eps = tl.cast(eps, tl.float32)
    scale = tl.cast(scale, tl.float32)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N_OUT
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    # Every activation access (x, residual, y, partials) is addressed by row, and the rows depend on the wait's
    # result: none of them can be scheduled before the wait.
    # Trigger: the GEMV form at once (its dependents' W loads overlap this kernel; H100 B=1 steps 8-11% faster),
    # the tile form only after its K loop. (The B=16 step stayed 4-4.5% slower with the attribute whether the tile
    # form triggered early or late, so packages of more than pdl.MAX_ROWS rows launch without it. A tile form that
    # loaded its first W tile before the wait and triggered at once was slower still on the 1-row VoxCPM2 audio
    # packages, H100: local_encoder 0.572 vs 0.485 ms in one call, locdit 5.49 vs 5.20 ms in another;
    # bench/results/nvidia-h100/probes/tile_form_early_w/.)
    if not USE_DOT:  # W first (weights only: safe before the wait), then the wait with the early trigger
        w0, wu0 = _fma_w_tile(w_ptr, offs_n[None, :, None], n_mask[None, :, None], N_OUT, K, k_lo, k_hi, GATED, BLOCK_K)
        token = grid_dependency_wait(PDL, True)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M) + token
        m_mask = offs_m < M
        acc, acc_up = _gemv_program(
            x_ptr,
            w_ptr,
            g_ptr,
            w0,
            wu0,
            offs_m,
            m_mask,
            offs_n,
            M,
            N_OUT,
            K,
            k_lo,
            k_hi,
            eps,
            HAS_NORM,
            GATED,
            SPLIT_K == 1,
            PRELOAD,
            NORM_BLOCK,
            NORM_CHUNKS,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
        )
    else:
        if STREAM:  # weights only: safe before the wait
            w0, wu0 = _dot_w_tile(w_ptr, offs_n, n_mask, N_OUT, K, k_lo, k_hi, GATED, BLOCK_K)
        token = grid_dependency_wait(PDL, STREAM)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M) + token
        m_mask = offs_m < M
        rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
        if HAS_NORM:
            rstd = _row_rstd(
                x_ptr, offs_m, m_mask, K, eps, BLOCK_M, NORM_BLOCK if NORM_BLOCK > 0 else BLOCK_K, NORM_CHUNKS
            )
        if STREAM:
            acc, acc_up = _dot_stream_loop(
                x_ptr,
                w_ptr,
                g_ptr,
                rstd,
                w0,
                wu0,
                offs_m,
                offs_n,
                m_mask,
                n_mask,
                N_OUT,
                K,
                k_lo,
                k_hi,
                HAS_NORM,
                GATED,
                FP32_DOT,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
            )
        else:
            acc, acc_up = _dot_loop(
                x_ptr,
                w_ptr,
                g_ptr,
                rstd,
                offs_m,
                offs_n,
                m_mask,
                n_mask,
                N_OUT,
                K,
                k_lo,
                k_hi,
                HAS_NORM,
                GATED,
                FP32_DOT,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
                SWAP_AB,
            )
            offs_m += grid_dependency_trigger(PDL)
    finish = True  # this program writes y (a static True/False, or the runtime answer of the in-kernel reduction)
    if SPLIT_K > 1:
        n_acc = N_OUT * 2 if GATED else N_OUT
        base = part_ptr + (pid_k * M + offs_m)[:, None] * n_acc + offs_n[None, :]
        mask = m_mask[:, None] & n_mask[None, :]
        tl.store(base, acc, mask=mask)
        if GATED:
            tl.store(base + N_OUT, acc_up, mask=mask)
        finish = False  # split_k_epilogue_kernel adds the partials
        if FUSED_REDUCE:
            # the tile's last program adds the partials and runs the epilogue (split_k_triton.py): no second launch
            counter = sem_ptr + pid_m * tl.num_programs(1) + pid_n + token
            finish = last_to_arrive(counter, SPLIT_K)
            if finish:
                acc, acc_up = _sum_partials(part_ptr, offs_m, offs_n, mask, M, N_OUT, GATED, SPLIT_K, BLOCK_M, BLOCK_N)
    if finish:
        _epilogue(
            acc,
            acc_up,
            offs_m,
            offs_n,
            m_mask,
            n_mask,
            b_ptr,
            r_ptr,
            y_ptr,
            N_OUT,
            scale,
            HAS_BIAS,
            GATED,
            HAS_RESIDUAL,
        )
        if FUSED_REDUCE:
            reset_counter(counter)


@triton.jit
def split_k_epilogue_kernel(
    part_ptr,
    b_ptr,
    r_ptr,
    y_ptr,
    M,
    N_OUT,
    scale,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PDL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Sum the SPLIT_K partials in split order, then the same epilogue. Grid (cdiv(N_OUT, BLOCK_N),
    cdiv(M, BLOCK_M))."""
    scale = tl.cast(scale, tl.float32)  # fp32 whatever the caller passes (AOTI passes floats as fp64)
    token = grid_dependency_wait(PDL, True)
    part_ptr += token
    r_ptr += token
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    n_mask = offs_n < N_OUT
    mask = m_mask[:, None] & n_mask[None, :]
    acc, acc_up = _sum_partials(part_ptr, offs_m, offs_n, mask, M, N_OUT, GATED, SPLIT_K, BLOCK_M, BLOCK_N)
    _epilogue(
        acc, acc_up, offs_m, offs_n, m_mask, n_mask, b_ptr, r_ptr, y_ptr, N_OUT, scale, HAS_BIAS, GATED, HAS_RESIDUAL
    )


@triton.jit
def norm_out_epilogue_kernel(
    part_ptr,
    b_ptr,
    r_ptr,
    g_ptr,
    y_ptr,
    yn_ptr,
    M,
    N_OUT,
    scale,
    eps,
    HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PDL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """`skinny_linear_norm_out`'s second pass: whole rows (BLOCK_N ≥ N_OUT), grid (cdiv(M, BLOCK_M),). SPLIT_K ≥ 1:
    sum the partials in split order and run the epilogue (bias, residual) as split_k_epilogue_kernel does → y;
    SPLIT_K == 0: y was written by the projection's own epilogue, read back. Then the next RMSNorm of the row,
    rounding where the tile form's prologue rounds (`_row_rstd`, `_normed`) → yn: what the next projection would
    have computed from y before its first W tile."""
    scale = tl.cast(scale, tl.float32)  # fp32 whatever the caller passes (AOTI passes floats as fp64)
    eps = tl.cast(eps, tl.float32)
    token = grid_dependency_wait(PDL, True)
    part_ptr += token
    r_ptr += token
    y_ptr += token
    offs_n = tl.arange(0, BLOCK_N)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    n_mask = offs_n < N_OUT
    mask = m_mask[:, None] & n_mask[None, :]
    offs = offs_m[:, None] * N_OUT + offs_n[None, :]
    if SPLIT_K == 0:
        y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    else:
        acc, acc_up = _sum_partials(part_ptr, offs_m, offs_n, mask, M, N_OUT, False, SPLIT_K, BLOCK_M, BLOCK_N)
        y = _epilogue_values(
            acc, acc_up, offs_m, offs_n, m_mask, n_mask, b_ptr, r_ptr, N_OUT, scale, y_ptr.dtype.element_ty,
            HAS_BIAS, False, HAS_RESIDUAL,
        )  # fmt: skip
        tl.store(y_ptr + offs, y, mask=mask)
    yf = y.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(yf * yf, axis=1) / N_OUT + eps)
    tl.store(yn_ptr + offs, _normed(y, g_ptr, rstd, 0, N_OUT, BLOCK_N), mask=mask)


def _config(block_n: int, block_k: int, num_warps: int, num_stages: int, preload: bool = False) -> triton.Config:
    """An autotuned config. Each names PRELOAD, a constant the launcher leaves to the config (a kernel parameter may
    not have a default: AOTInductor's launcher does not bind defaults, which failed every H200 build at 7f42ce7,
    "launcher() missing ... argument"; tests/test_kernel_signatures.py)."""
    return triton.Config(
        {"BLOCK_N": block_n, "BLOCK_K": block_k, "PRELOAD": preload}, num_warps=num_warps, num_stages=num_stages
    )


# W values a PRELOAD program holds: 64 per thread at 4 warps (no spills in the sm_90 compile test)
PRELOAD_VALUES = 64 * 128
PRELOAD_MAX_K = 4096
# At most this many PRELOAD programs per SM: the largest grids measured faster took 1,280 programs (Fish fast_ar o,
# 8.9 → 5.2 µs) and 768 (code_predictor gate_up, 5.6 → 3.5); slower: 3,072 and 9,728 (`preload_config`).
PRELOAD_PROGRAMS_PER_SM = 10
PRELOAD_ENV = "TTSAOT_GEMV_PRELOAD"  # =0 at build time: no PRELOAD configs (the A/B; package_cache keys it)


# Tuned per bucket at AOTI compile time on the build GPU (one config is baked into each package). The lists are the
# smallest sets that keep the best time of every VoxCPM2 decode shape in the H100 sweep
# (bench/results/nvidia-h100/kernel_configs.json, `python -m bench kernels --sections configs`): the GEMV set
# reaches 93.9 us summed over qkv/o/gate_up/down at M = 1 and 2 (every candidate's best: 93.5; the previous four
# configs: 94.9), the tile set 167.9 us at M = 4, 8, 16 (best: 167.9; previous four: 168.6); the fourth GEMV config
# is the one-row gate_up's of the H200 sweep (`one_row_config`). Fewer configs, less autotuning per package at build
# time. The autotuner is not trusted with the choices the sweep settles: one row
# takes `one_row_config`, the tile form the BLOCK_N of `tile_block_n` (`_prune_gemv`, `_prune_tiles` below;
# builds had baked slower ones, bench/results/nvidia-h100/probes/tile_width_rule/, gemv_one_row_pin/). BLOCK_M,
# SPLIT_K and USE_DOT come from the launcher. The FMA accumulator holds BLOCK_M·BLOCK_N·BLOCK_K fp32 values: ≤ 64
# registers per thread at M = 1.
GEMV_CONFIGS = [
    _config(8, 1024, 8, 1),  # o, down at M = 1 (1024 | K)
    _config(8, 512, 4, 1),  # gate_up at M = 2; qkv at M = 1
    _config(2, 1024, 2, 1),  # o, down at M = 2
    _config(16, 256, 4, 1),  # gate_up at M = 1
    # PRELOAD (`preload_config`): the whole K range (≤ 4096) in one tile, 64 W values per thread at 4 warps
    *(_config(PRELOAD_VALUES // (bk * rows), bk, 4, 1, preload=True) for bk in (1024, 2048, 4096) for rows in (1, 2)),
]
# Few rows: a deep cp.async pipeline keeps ≥ 24 KB of W in flight per SM even at one program per SM (BLOCK_N 32:
# qkv and gate_up; 16: o and down at M = 16; 16 × 128 with 6 stages: o at M = 4 and 8).
GEMM_CONFIGS = [
    _config(16, 256, 4, 4),
    _config(32, 256, 4, 4),
    _config(16, 128, 4, 6),
]
# The epilogue flags are part of the key: a gated and a plain call of the same size are different kernels.
AUTOTUNE_KEY = ["M", "N_OUT", "K", "K_SPLIT", "BLOCK_M", "HAS_NORM", "GATED", "HAS_BIAS", "HAS_RESIDUAL"]


def preload_enabled() -> bool:
    """Whether one-row calls may take PRELOAD configs (PRELOAD_ENV, read at trace/autotune time; on by default)."""
    return os.environ.get(PRELOAD_ENV, "1") != "0"


def preload_config(k_range: int, gated: bool, n_out: int, multiprocessors: int) -> triton.Config | None:
    """The PRELOAD config of a one-row call: BLOCK_K the K range rounded up to 1024/2048/4096, BLOCK_N what
    PRELOAD_VALUES allow (half for gate and up rows). None where the range is longer than PRELOAD_MAX_K or the grid
    has more than PRELOAD_PROGRAMS_PER_SM programs per SM: a dependent kernel is launched only once every program
    has passed the early trigger, which a grid of many waves delays to its last ones (H200, Fish fast_ar b1: qkv
    in 3,072 programs and gate_up in 9,728 took 12.0 / 35.9 µs against 11.1 / 27.4 with the loop, the attention
    after qkv 5.8 against 3.4 µs; bench/results/nvidia-h200/probes/gemv_preload/)."""
    if k_range > PRELOAD_MAX_K:
        return None
    bk = max(1024, next_power_of_2(k_range))
    bn = PRELOAD_VALUES // (bk * (2 if gated else 1))
    if cdiv(n_out, bn) > PRELOAD_PROGRAMS_PER_SM * multiprocessors:
        return None
    return next(
        c for c in GEMV_CONFIGS if c.kwargs["PRELOAD"] and (c.kwargs["BLOCK_K"], c.kwargs["BLOCK_N"]) == (bk, bn)
    )


def one_row_config(
    k_range: int, norm: bool = False, gated: bool = False, n_out: int | None = None, multiprocessors: int | None = None
) -> triton.Config:
    """The GEMV config of one row, by rule: `preload_config` where it gives one (with n_out and multiprocessors
    given, and `preload_enabled`), else per epilogue:
    - gated (norm + gate_up + SiLU·mul): BLOCK_N 16 × BLOCK_K 256 × 4 warps, the fastest summed over the three
      gated shapes of the H200 sweep (bench/results/nvidia-h200/probes/gemv_configs/, M = 1): code_predictor 6.8 /
      fast_ar 28.9 / VoxCPM2 14.9 us, 50.6 in all, where BLOCK_N 8 × BLOCK_K 1024 × 8 warps (one 172-register
      program per SM) took 9.7 / - / 23.4 and 8 × 512 × 4 warps 6.3 / 30.7 / 16.5 (53.5); the H100 sweep's best at
      VoxCPM2 too (kernel_configs.json: 21.7 vs 22.2);
    - RMSNorm without gating (qkv): BLOCK_N 8 × BLOCK_K 512 × 4 warps: H200 code_predictor 5.0 / fast_ar 12.6 /
      VoxCPM2 6.1 us where 8 × 1024 × 8 warps took 6.6 / 13.1 / 7.3 (H100, VoxCPM2 only: 7.0 vs 6.5, an older
      kernel);
    - otherwise (o, down + residual): BLOCK_N 8 × BLOCK_K 1024 × 8 warps where 1024 divides the program's K range,
      else 8 × 512 × 4 warps. The first is the fastest or tied at the VoxCPM2 and code_predictor shapes in both
      sweeps (H200 o 4.7 / 3.6, down 8.7 / 4.5 us; H100 VoxCPM2 o 5.3, down 11.3 where the others took up to 6.4 /
      15.2). A K range that 1024 does not divide ends in a part-masked step that costs a whole loop trip (H100, Fish
      fast_ar K = 9728: down 23.8 → 21.7 us with the 512 config, probes/predictor_kernels/call3_0c73b31/)."""
    if n_out is not None and multiprocessors and preload_enabled():
        preload = preload_config(k_range, gated, n_out, multiprocessors)
        if preload is not None:
            return preload
    if gated:
        return GEMV_CONFIGS[3]
    first, second = GEMV_CONFIGS[0], GEMV_CONFIGS[1]
    if norm:
        return second
    return first if k_range % first.kwargs["BLOCK_K"] == 0 else second


# Configs only `one_row_config` hands out: two-row calls autotune over the H100 sweep's set as before (the gated
# one-row config was swept at one row only).
ONE_ROW_ONLY = GEMV_CONFIGS[3:]  # (the gated config and the PRELOAD ones)


def _prune_gemv(configs, named_args, **kwargs):
    """One row: only `one_row_config` of the call's K range and epilogue; the autotuner, timing each kernel alone, is
    not trusted with near-ties it can get wrong by a third. Two rows: all but ONE_ROW_ONLY."""
    meta = {**named_args, **kwargs}
    if size_hint(meta["M"]) != 1:
        return [c for c in configs if all(c is not o for o in ONE_ROW_ONLY)]
    one = one_row_config(
        size_hint(meta["K_SPLIT"]),
        bool(meta.get("HAS_NORM")),
        bool(meta.get("GATED")),
        size_hint(meta["N_OUT"]),
        multiprocessor_count(meta["x_ptr"].device) if "x_ptr" in meta else None,
    )
    return [c for c in configs if (c.kwargs, c.num_warps) == (one.kwargs, one.num_warps)] or configs


skinny_gemv_autotuned = triton.autotune(
    configs=GEMV_CONFIGS, key=AUTOTUNE_KEY, prune_configs_by={"early_config_prune": _prune_gemv}
)(skinny_linear_kernel)


# What Triton's pipelined tile loop takes beyond its operand buffers (barriers, the epilogue's layout conversion):
# an fp32 launch on the H200 that failed asked 265,216 bytes where the buffers count 262,144 (BLOCK_M 32, 4 stages of
# BLOCK_K 256, and BLOCK_N 32 plain or 16 gated: the only tile configs with that count).
SHARED_MEMORY_SLACK = 8 * 1024


def tile_shared_memory(config: triton.Config, block_m: int, element_bytes: int, gated: bool) -> int:
    """Bytes of shared memory the tile form's cp.async pipeline holds: num_stages buffers of the [BLOCK_M, BLOCK_K] x
    tile and the [BLOCK_N, BLOCK_K] W tile (two, gate and up, when gated), plus SHARED_MEMORY_SLACK."""
    w_rows = (2 if gated else 1) * config.kwargs["BLOCK_N"]
    operands = (block_m + w_rows) * config.kwargs["BLOCK_K"] * element_bytes
    return max(config.num_stages, 1) * operands + SHARED_MEMORY_SLACK


def _shallower(config: triton.Config) -> list[triton.Config]:
    """`config` with one stage fewer, down to one: made once, so the pruning hands out the same objects each time."""
    return [
        triton.Config(dict(config.kwargs), num_warps=config.num_warps, num_stages=s)
        for s in range(config.num_stages - 1, 0, -1)
    ]


# The tile configs' shallower variants. The stages are sized for bf16 on sm_90: at most 204,800 bytes (32 rows,
# gated, BLOCK_N 32) of its 232,448. fp32 operands take twice the bytes (the same gated tile at 16 / 32 rows:
# 335,872 / 401,408) and other GPUs have less (A100: 166,912).
SHALLOWER_GEMM_CONFIGS = {id(c): _shallower(c) for c in GEMM_CONFIGS}  # and SWAP_CONFIGS' (below)


def fit_shared_memory(
    configs: list[triton.Config], block_m: int, element_bytes: int, gated: bool, limit: int
) -> list[triton.Config]:
    """Each config, or else its deepest shallower variant whose pipeline fits `limit` bytes; configs with no fitting
    variant are dropped. A launch above the limit fails (Triton OutOfResources) rather than slowing down, and the
    autotuner does not get to catch it when the pruning leaves one candidate."""
    fitted = []
    for config in configs:
        shallower = SHALLOWER_GEMM_CONFIGS.get(id(config))
        for c in (config, *(shallower if shallower is not None else _shallower(config))):
            if tile_shared_memory(c, block_m, element_bytes, gated) <= limit:
                fitted.append(c)
                break
    return fitted


def _prune_tiles(configs, named_args, **kwargs):
    """The tile form's candidates: only those of the BLOCK_N `tile_block_n` picks for the call's shape (Triton's
    autotuner and Inductor's AOTI autotuning both call this with the launch's arguments by name), each with as many
    pipeline stages as the GPU's shared memory holds (`fit_shared_memory`)."""
    meta = {**named_args, **kwargs}
    x = meta["x_ptr"]
    bn = tile_block_n(
        size_hint(meta["M"]),
        size_hint(meta["N_OUT"]),
        meta["SPLIT_K"],
        meta["BLOCK_M"],
        multiprocessor_count(x.device),
        [c.kwargs["BLOCK_N"] for c in configs],
    )
    chosen = [c for c in configs if c.kwargs["BLOCK_N"] == bn]
    limit = shared_memory_per_block(x.device)
    # none fits even at one stage (no sm_80+ GPU at these tiles): the launch's own error names the resource
    return fit_shared_memory(chosen, meta["BLOCK_M"], x.element_size(), bool(meta.get("GATED")), limit) or chosen


skinny_gemm_autotuned = triton.autotune(
    configs=GEMM_CONFIGS, key=AUTOTUNE_KEY, prune_configs_by={"early_config_prune": _prune_tiles}
)(skinny_linear_kernel)


# The streamed tensor-core form (`STREAM`): no cp.async stages, so small shared memory and several programs per SM;
# its width is chosen by the same rule as the tile form's.
STREAM_CONFIGS = [
    _config(16, 256, 4, 1),
    _config(32, 256, 8, 1),
    _config(16, 128, 4, 1),
    _config(16, 512, 8, 1),
    _config(32, 128, 4, 1),
]

# A gated call at 32 rows holds two [32, BLOCK_N] accumulators and the next step's x and W (gate and up) tiles in
# registers: BLOCK_N × BLOCK_K above this spills under Triton 3.7 (sm_90 compile: 32 × 256 and 16 × 512 do).
STREAM_GATED_TILE = 4096


def _prune_stream(configs, named_args, **kwargs):
    """The streamed form's candidates: all but those that spill registers (gated calls at 32 rows)."""
    meta = {**named_args, **kwargs}
    if not (meta.get("GATED") and meta["BLOCK_M"] >= 32):
        return configs
    return [c for c in configs if c.kwargs["BLOCK_N"] * c.kwargs["BLOCK_K"] <= STREAM_GATED_TILE]


skinny_stream_autotuned = triton.autotune(
    configs=STREAM_CONFIGS, key=AUTOTUNE_KEY, prune_configs_by={"early_config_prune": _prune_stream}
)(skinny_linear_kernel)


# The swapped tile form (the launcher's SWAP_AB, skinny_linear.SWAP_AB_ENV): W tiles of SWAP_BLOCK_N rows as the
# sm_90 warpgroup MMA's M side, read from the cp.async stages in shared memory. Autotuning picks the depth; the width
# is fixed (a warpgroup MMA is 64 rows) and split-K makes up the programs (skinny_linear.plan_split_k). Shared memory
# of an sm_90 compile (Triton 3.7), gated at 16 rows: 147,456 bytes at 64 × 128 × 4 stages, 111,232 at 64 × 64 × 6;
# the plain 64 × 128 × 4: 81,920 (tile_shared_memory counts 8,192 more).
SWAP_CONFIGS = [
    _config(64, 128, 4, 4),
    _config(64, 64, 4, 6),
    _config(64, 256, 4, 3),
]
SHALLOWER_GEMM_CONFIGS.update({id(c): _shallower(c) for c in SWAP_CONFIGS})


# the tile form's pruning: one width to choose from, each depth fitted to the GPU's shared memory
skinny_swap_autotuned = triton.autotune(
    configs=SWAP_CONFIGS, key=AUTOTUNE_KEY, prune_configs_by={"early_config_prune": _prune_tiles}
)(skinny_linear_kernel)
