"""Triton kernel of `ttsaot::qkv_attention` (semantics: qkv_attention.py).

Imported by the launcher on first use, like skinny_linear_triton.py.

One launch for a short-cache decode layer's attention half: the fused qkv projection's GEMV programs
(skinny_linear's GEMV form, `_gemv_program`: the RMSNorm prologue, the W tile loaded before the grid-dependency
wait) each write their BLOCK_N columns of the qkv row and count their arrival at their kv head; the program that
arrives last at kv head h has every column h needs (its G query heads, its key, its value) and runs that head's
whole-cache attention (decode_attention's `_whole_cache_head`) for every row. The split-K reduction's pattern
(split_k_triton.py): a barrier, one gpu-scope acq_rel atomic per program, the counter reset by the last, so the
workspace is zero between launches.

What it removes: the attention's own launch and the wait for the projection's whole grid (its last programs,
its memory flush) before the first attention program may read the qkv row.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .decode_attention_triton import _whole_cache_head
from .pdl_triton import grid_dependency_wait
from .skinny_linear_triton import GEMV_CONFIGS, _epilogue, _fma_w_tile, _gemv_program, _prune_gemv
from .split_k_triton import last_to_arrive, reset_counter

# What each kernel here may write (kernel_analysis.check_writes holds torch's access analysis to it)
WRITES = {"qkv_attention_kernel": frozenset({"qkv_ptr", "kc_ptr", "vc_ptr", "o_ptr", "ws_ptr"})}


@triton.jit(do_not_specialize=["layer"])  # one compiled kernel for every layer index
def qkv_attention_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    g_ptr,
    qkv_ptr,
    pos_ptr,
    kc_ptr,
    vc_ptr,
    cos_ptr,
    sin_ptr,
    qn_ptr,
    kn_ptr,
    o_ptr,
    ws_ptr,
    layer,
    M,
    N_OUT,
    K,
    K_SPLIT,
    S,
    CACHE_LAYER,
    eps,
    qk_eps,
    qk_scale,
    HAS_NORM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr,
    NORM_BLOCK: tl.constexpr,
    NORM_CHUNKS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    G_PAD: tl.constexpr,
    ROPE: tl.constexpr,
    QK_NORM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    FP32_DOT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRELOAD: tl.constexpr,
):
    """Grid (1, cdiv(N_OUT, BLOCK_N)): BLOCK_M = M ≤ 2 rows (the GEMV form), no split-K (K_SPLIT = K; a parameter
    for the GEMV configs' pruning). BLOCK_N divides HEAD_DIM, so each program's columns feed one kv head. qkv_ptr:
    the [M, N_OUT] scratch the projection writes and the attention reads. ws_ptr: ≥ HKV zeroed int32 counters, left
    zeroed. The cache holds S ≤ BLOCK_S positions (the whole-cache form). eps: the input RMSNorm's; qk_eps: the
    q/k norms'; qk_scale: softmax scale · log2(e). PDL: the wait is `_gemv_program`'s; every activation pointer
    (qkv, positions, caches, output, counters) is offset by its token."""
    # fp32 scalars whatever the caller passes (AOTInductor types a float argument of a user kernel fp64)
    eps = tl.cast(eps, tl.float32)
    qk_eps = tl.cast(qk_eps, tl.float32)
    qk_scale = tl.cast(qk_scale, tl.float32)
    G: tl.constexpr = HQ // HKV
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N_OUT
    # W first, then the wait, then the rows offset by its token (here, not in `_gemv_program`, which says why)
    w0, wu0 = _fma_w_tile(w_ptr, offs_n[None, :, None], n_mask[None, :, None], N_OUT, K, 0, K, False, BLOCK_K)
    token = grid_dependency_wait(PDL, True)
    offs_m = tl.arange(0, BLOCK_M) + token
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
        0,
        K,
        eps,
        HAS_NORM,
        False,
        True,
        PRELOAD,
        NORM_BLOCK,
        NORM_CHUNKS,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
    )
    _epilogue(acc, acc_up, offs_m, offs_n, m_mask, n_mask, b_ptr, qkv_ptr, qkv_ptr, N_OUT, 1.0, HAS_BIAS, False, False)
    # The kv head these columns feed: q heads h·G .. h·G + G - 1, then the keys, then the values.
    col = pid_n * BLOCK_N
    kv_col = col - HQ * HEAD_DIM
    h = tl.where(col < HQ * HEAD_DIM, col // (G * HEAD_DIM), (kv_col // HEAD_DIM) % HKV)
    counter = ws_ptr + token + h
    if last_to_arrive(counter, (G + 2) * HEAD_DIM // BLOCK_N):
        # unrolled over the GEMV form's rows (BLOCK_M = M ≤ 2): a runtime loop kept its pointers live across the
        # attention (more registers per thread in the sm_90 compile of the code predictor's case)
        for b in tl.static_range(BLOCK_M):
            if b < M:
                pos = tl.load(pos_ptr + token + b).to(tl.int32)
                pos = tl.minimum(tl.maximum(pos, 0), S - 1)  # never write or read outside the cache
                # (layer, b, h, 0, 0); no `.to` on `layer` (decode_attention_kernel says why)
                cache_off = ((b * HKV + h).to(tl.int64) * S + layer * CACHE_LAYER) * HEAD_DIM
                _whole_cache_head(
                    qkv_ptr + token + b * N_OUT,
                    pos,
                    kc_ptr + token + cache_off,
                    vc_ptr + token + cache_off,
                    o_ptr + token + b * (HQ * HEAD_DIM),
                    h,
                    S,
                    qn_ptr,
                    kn_ptr,
                    cos_ptr,
                    sin_ptr,
                    qk_eps,
                    qk_scale,
                    HQ,
                    HKV,
                    HEAD_DIM,
                    D_PAD,
                    G_PAD,
                    ROPE,
                    QK_NORM,
                    BLOCK_S,
                    FP32_DOT,
                    ".cg",  # the row other programs wrote: through L2, as the split-K reduction reads its partials
                )
        reset_counter(counter)


# The projection's configs are skinny_linear's GEMV ones, chosen the same way (one row: `one_row_config`, whose
# BLOCK_N values all divide a head of ≥ 16; two rows: autotuned over the two-row set).
qkv_attention_autotuned = triton.autotune(
    configs=GEMV_CONFIGS,
    key=["M", "N_OUT", "K", "K_SPLIT", "BLOCK_M", "HAS_NORM", "HAS_BIAS", "S", "HQ", "HKV", "HEAD_DIM", "ROPE"],
    prune_configs_by={"early_config_prune": _prune_gemv},
)(qkv_attention_kernel)
