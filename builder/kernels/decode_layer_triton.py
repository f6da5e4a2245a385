"""Triton kernel of `ttsaot::decode_layer` (semantics: decode_layer.py): a whole decoder layer's decode step in
ONE persistent launch whose weight reads are in flight while it waits.

The five ops of a kernel-layer step (skinny_linear ×4 + decode_attention, decode_modules.py) are five dependent
launches per layer; a codebook predictor's frame runs 75-140 layer passes of small weights (Qwen code_predictor:
31.5 MB per layer, 4-13 MB per projection), and each launch's ramp and drain outweigh its bytes: the five ops with
programmatic launches took 28.9 µs per Qwen layer on the H100 against a 10.5 µs byte floor. Two earlier persistent
designs (git history; bench/results/nvidia-h100/probes/decode_layer_run/, decode_layer_barrier/) streamed each
phase's weights in 16 KB tiles, one tile ahead, AFTER its barrier: 16-32 KB in flight per SM, and no faster.

Here one grid of one program per SM runs the five as phases separated by grid-wide barriers:

    A  qkv = round(norm(x) @ Wqkvᵀ)                    row slices over the programs
    B  o = attention(qkv) (q/k norm, RoPE, cache write) one (row, kv head) per program
    C  x1 = x + o @ Woᵀ                                 row slices
    D  h = silu(gate)·up of norm(x1) @ Wguᵀ             row slices (gate and up rows together)
    E  y = x1 + h @ Wdownᵀ                              row slices

and every program owns ONE contiguous slice of each weight (ROWS_* rows = next power of 2 of N / programs), held in
registers as [ROWS, KC] chunks along K. A phase's first chunk (with the default TILE, its whole slice for the Qwen
predictor: 64 KB of Wqkv, 32 KB of Wo, 128 KB of Wgu, 48 KB of Wdown per SM) is loaded BEFORE the barrier that
precedes the phase (weights never depend on it), so the barrier's latency, and the attention phase, overlap the
weight stream; each further chunk is loaded before the current one is multiplied. EARLY: the gate/up chunk is
requested before the first barrier too (during the attention phase), at the cost of holding it longer.

Numerics: each phase rounds where the five ops round (skinny_linear's RMSNorm prologue and epilogue device
functions, decode_attention's per-head functions); the fp32 products are summed per chunk along K (a tree over KC
lanes, then chunk by chunk), where the GEMV form sums per BLOCK_K lane first: equal up to the order of fp32 addition.

Barrier: the cooperative-groups pattern (CTA barrier, one gpu-scope release atomic per program on a counter, spin
on acquire loads of it, CTA barrier). The counter lives in the caller's zeroed int32 workspace (`ws`, 2 entries):
ws[0] counts arrivals (barrier k waits for k·G), ws[1] counts programs past the last barrier, and the last of them
puts both back to zero, so the workspace is zero again for the next layer or replay. A grid barrier needs every
program resident at once: the grid is at most one program per SM; a program may fill its SM (the slices), so the
next kernel is let launch (programmatic dependent launch) only after the last barrier, when every program of this
one is resident: launched earlier, its waiting programs could hold the SMs this grid's last programs need.

PHASE ≥ 0 runs that phase alone without barriers (five launches in order): Triton's CPU interpreter runs programs
one after another, where a spin barrier would never return, so the CPU tests check the phases this way and the
GPU tests the persistent form (PHASE = -1).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .decode_attention_triton import _attend_cached, _attend_token, _token_heads
from .pdl_triton import grid_dependency_trigger, grid_dependency_wait
from .skinny_linear_triton import _epilogue, _fma_w_tile, _row_rstd


@triton.jit
def _grid_barrier(ws_ptr, target):
    """Wait until `target` arrivals are counted at ws_ptr[0] (this program's included)."""
    tl.debug_barrier()  # every thread's stores of this phase precede the release
    tl.atomic_add(ws_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(ws_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(ws_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _slice_chunk(w_ptr, N_OUT, K, c, GATED: tl.constexpr, ROWS: tl.constexpr, KC: tl.constexpr):
    """Chunk c ([1, ROWS, KC], and the matching up rows when GATED) of this program's weight slice: rows
    pid·ROWS ... pid·ROWS + ROWS - 1 (masked past N_OUT, so a program past the last slice loads nothing)."""
    offs_n = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    return _fma_w_tile(w_ptr, offs_n[None, :, None], (offs_n < N_OUT)[None, :, None], N_OUT, K, c * KC, K, GATED, KC)


@triton.jit
def _slice_phase(
    x_ptr,
    w_ptr,
    b_ptr,
    g_ptr,
    r_ptr,
    y_ptr,
    w,
    wu,
    M,
    N_OUT,
    K,
    eps,
    scale,
    HAS_NORM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ROWS: tl.constexpr,
    KC: tl.constexpr,
    CHUNKS: tl.constexpr,
    NORM_BLOCK: tl.constexpr,
):
    """y = epilogue(prologue(x) @ Wᵀ) on this program's row slice. `w`/`wu`: chunk 0, loaded by the caller before
    the barrier; chunk c + 1 is loaded before chunk c is multiplied. x rows (≤ BLOCK_M) come from L2."""
    dt = x_ptr.dtype.element_ty
    offs_n = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    n_mask = offs_n < N_OUT
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    offs_m3 = offs_m[:, None, None]
    m_mask3 = offs_m3 < M
    if HAS_NORM:
        rstd = _row_rstd(x_ptr, offs_m, m_mask, K, eps, BLOCK_M, NORM_BLOCK, 0)
        rstd3 = rstd[:, None, None]
    acc = tl.zeros([BLOCK_M, ROWS], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, ROWS], dtype=tl.float32)
    for c in tl.static_range(CHUNKS):
        if c + 1 < CHUNKS:
            w_next, wu_next = _slice_chunk(w_ptr, N_OUT, K, c + 1, GATED, ROWS, KC)
        offs_k3 = (c * KC + tl.arange(0, KC))[None, None, :]
        k_mask3 = offs_k3 < K
        x = tl.load(x_ptr + offs_m3 * K + offs_k3, mask=m_mask3 & k_mask3, other=0.0)
        if HAS_NORM:  # skinny_linear's prologue: normalised, cast back, × weight in x's dtype
            gw = tl.load(g_ptr + offs_k3, mask=k_mask3, other=0.0)
            x = (x.to(tl.float32) * rstd3).to(dt)
            x = (gw.to(tl.float32) * x.to(tl.float32)).to(dt)
        xf = x.to(tl.float32)
        acc += tl.sum(xf * w.to(tl.float32), axis=2)
        if GATED:
            acc_up += tl.sum(xf * wu.to(tl.float32), axis=2)
        if c + 1 < CHUNKS:
            w = w_next
            wu = wu_next
    _epilogue(acc, acc_up, offs_m, offs_n, m_mask, n_mask, b_ptr, r_ptr, y_ptr, N_OUT, scale, HAS_BIAS, GATED,
              HAS_RESIDUAL)  # fmt: skip


@triton.jit
def _attention_phase(
    qkv_ptr,
    pos_ptr,
    kc_ptr,
    vc_ptr,
    cos_ptr,
    sin_ptr,
    qn_ptr,
    kn_ptr,
    o_ptr,
    layer,
    M,
    S,
    CACHE_LAYER,
    eps,
    qk_scale,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    G_PAD: tl.constexpr,
    ROPE: tl.constexpr,
    QK_NORM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """decode_attention with one program per (row, kv head) (no context split: the predictors' caches hold a frame,
    ≤ a few dozen positions), pairs pid, pid + G, ..."""
    G: tl.constexpr = HQ // HKV
    offs_d = tl.arange(0, D_PAD)
    d_mask = offs_d < HEAD_DIM
    offs_g = tl.arange(0, G_PAD)
    for item in range(tl.program_id(0), M * HKV, tl.num_programs(0)):
        b = item // HKV
        h = item % HKV
        pos = tl.load(pos_ptr + b).to(tl.int32)
        pos = tl.minimum(tl.maximum(pos, 0), S - 1)  # never write or read outside the cache
        row = qkv_ptr + tl.cast(b, tl.int64) * ((HQ + 2 * HKV) * HEAD_DIM)
        q, k_new, v_new = _token_heads(
            row, h, pos, offs_d, offs_g, qn_ptr, kn_ptr, cos_ptr, sin_ptr, eps, HQ, HKV, HEAD_DIM, QK_NORM, ROPE
        )
        cache_off = (tl.cast(item, tl.int64) * S + layer * CACHE_LAYER) * HEAD_DIM  # (layer, b, h, 0, 0)
        tl.store(kc_ptr + cache_off + pos * HEAD_DIM + offs_d[None, :], k_new, mask=d_mask[None, :])
        tl.store(vc_ptr + cache_off + pos * HEAD_DIM + offs_d[None, :], v_new, mask=d_mask[None, :])
        m_i, l_i, acc = _attend_cached(
            q,
            kc_ptr + cache_off,
            vc_ptr + cache_off,
            0,
            pos,
            qk_scale,
            offs_d,
            HEAD_DIM,
            G_PAD,
            D_PAD,
            BLOCK_S,
            FP32_DOT,
        )
        m_i, l_i, acc = _attend_token(q, k_new, v_new, pos >= 0, m_i, l_i, acc, qk_scale)  # always taken
        heads = h * G + offs_g
        o_ptrs = o_ptr + tl.cast(b, tl.int64) * (HQ * HEAD_DIM) + heads[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(o_ptrs, (acc / l_i[:, None]).to(q.dtype), mask=(offs_g < G)[:, None] & d_mask[None, :])


@triton.jit(do_not_specialize=["layer"])  # one compiled kernel for every layer index
def decode_layer_kernel(
    x_ptr,
    pos_ptr,
    kc_ptr,
    vc_ptr,
    ws_ptr,
    in_norm_ptr,
    qkv_w_ptr,
    qkv_b_ptr,
    qn_ptr,
    kn_ptr,
    cos_ptr,
    sin_ptr,
    o_w_ptr,
    o_b_ptr,
    post_norm_ptr,
    gu_w_ptr,
    gu_b_ptr,
    down_w_ptr,
    down_b_ptr,
    qkv_ptr,
    attn_ptr,
    x1_ptr,
    h_ptr,
    y_ptr,
    layer,
    M,
    S,
    CACHE_LAYER,
    norm_eps,
    qk_eps,
    qk_scale,
    residual_scale,
    D: tl.constexpr,
    INTER: tl.constexpr,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    G_PAD: tl.constexpr,
    ROPE: tl.constexpr,
    QK_NORM: tl.constexpr,
    HAS_QKV_BIAS: tl.constexpr,
    HAS_O_BIAS: tl.constexpr,
    HAS_GU_BIAS: tl.constexpr,
    HAS_DOWN_BIAS: tl.constexpr,
    PHASE: tl.constexpr,
    PDL: tl.constexpr,
    EARLY: tl.constexpr,
    FP32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ROWS_QKV: tl.constexpr,
    KC_QKV: tl.constexpr,
    CH_QKV: tl.constexpr,
    ROWS_O: tl.constexpr,
    KC_O: tl.constexpr,
    CH_O: tl.constexpr,
    ROWS_GU: tl.constexpr,
    KC_GU: tl.constexpr,
    CH_GU: tl.constexpr,
    ROWS_DN: tl.constexpr,
    KC_DN: tl.constexpr,
    CH_DN: tl.constexpr,
    NORM_BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """Grid (programs,): at most one per SM. x [M, D] → y [M, D]; scratch qkv, attn, x1, h written on the way (each
    phase reads what the previous one wrote, after the barrier). ROWS_* / KC_* / CH_*: each column phase's slice
    rows per program, chunk width along K and chunk count (decode_layer.slice_plan). PDL (pdl.py): the first qkv
    chunk is loaded, then the wait; the dependent kernel is let launch after the last barrier (module docstring)."""
    # fp32 scalars whatever the caller passes (AOTI types a float argument of a user kernel fp64)
    norm_eps = tl.cast(norm_eps, tl.float32)
    qk_eps = tl.cast(qk_eps, tl.float32)
    qk_scale = tl.cast(qk_scale, tl.float32)
    residual_scale = tl.cast(residual_scale, tl.float32)
    NQKV: tl.constexpr = (HQ + 2 * HKV) * HEAD_DIM
    NO: tl.constexpr = HQ * HEAD_DIM
    G = tl.num_programs(0)
    if PHASE < 0 or PHASE == 0:
        w, wu = _slice_chunk(qkv_w_ptr, NQKV, D, 0, False, ROWS_QKV, KC_QKV)
        token = grid_dependency_wait(PDL, False)
        _slice_phase(x_ptr + token, qkv_w_ptr, qkv_b_ptr, in_norm_ptr, x_ptr, qkv_ptr + token, w, wu, M, NQKV, D,
                     norm_eps, 1.0, True, HAS_QKV_BIAS, False, False, BLOCK_M, ROWS_QKV, KC_QKV, CH_QKV,
                     NORM_BLOCK)  # fmt: skip
    if PHASE < 0 or PHASE == 2:  # Wo's first chunk streams through the barrier and the attention phase
        wo, wou = _slice_chunk(o_w_ptr, D, NO, 0, False, ROWS_O, KC_O)
    if PHASE < 0 and EARLY:  # and the gate/up chunk too
        wg, wgu = _slice_chunk(gu_w_ptr, INTER, D, 0, True, ROWS_GU, KC_GU)
    if PHASE < 0:
        _grid_barrier(ws_ptr, G)
    if PHASE < 0 or PHASE == 1:
        _attention_phase(qkv_ptr, pos_ptr, kc_ptr, vc_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr, attn_ptr, layer, M, S,
                         CACHE_LAYER, qk_eps, qk_scale, HQ, HKV, HEAD_DIM, D_PAD, G_PAD, ROPE, QK_NORM, BLOCK_S,
                         FP32_DOT)  # fmt: skip
    if PHASE < 0:
        _grid_barrier(ws_ptr, 2 * G)
    if PHASE < 0 or PHASE == 2:
        _slice_phase(attn_ptr, o_w_ptr, o_b_ptr, attn_ptr, x_ptr, x1_ptr, wo, wou, M, D, NO, norm_eps,
                     residual_scale, False, HAS_O_BIAS, False, True, BLOCK_M, ROWS_O, KC_O, CH_O,
                     NORM_BLOCK)  # fmt: skip
    if PHASE == 3 or (PHASE < 0 and not EARLY):
        wg, wgu = _slice_chunk(gu_w_ptr, INTER, D, 0, True, ROWS_GU, KC_GU)
    if PHASE < 0:
        _grid_barrier(ws_ptr, 3 * G)
    if PHASE < 0 or PHASE == 3:
        _slice_phase(x1_ptr, gu_w_ptr, gu_b_ptr, post_norm_ptr, x1_ptr, h_ptr, wg, wgu, M, INTER, D, norm_eps, 1.0,
                     True, HAS_GU_BIAS, True, False, BLOCK_M, ROWS_GU, KC_GU, CH_GU, NORM_BLOCK)  # fmt: skip
    if PHASE < 0 or PHASE == 4:
        wd, wdu = _slice_chunk(down_w_ptr, D, INTER, 0, False, ROWS_DN, KC_DN)
        if PHASE < 0:
            _grid_barrier(ws_ptr, 4 * G)
            # Every program is resident now: the next kernel may launch (its programs take what ours free).
            y_ptr += grid_dependency_trigger(PDL)
            # Past the last barrier: count out; the last program out zeroes both counters (nobody reads them any
            # more in this launch) for the next layer or replay.
            out = tl.atomic_add(ws_ptr + 1, 1, sem="relaxed", scope="gpu")
            if out == G - 1:
                tl.atomic_xchg(ws_ptr, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(ws_ptr + 1, 0, sem="relaxed", scope="gpu")
        _slice_phase(h_ptr, down_w_ptr, down_b_ptr, h_ptr, x1_ptr, y_ptr, wd, wdu, M, D, INTER, norm_eps,
                     residual_scale, False, HAS_DOWN_BIAS, False, True, BLOCK_M, ROWS_DN, KC_DN, CH_DN,
                     NORM_BLOCK)  # fmt: skip
