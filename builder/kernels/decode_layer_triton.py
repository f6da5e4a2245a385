"""Triton kernel of `ttsaot::decode_layer` (semantics: decode_layer.py): a whole decoder layer's decode step in
ONE persistent launch.

The five ops of a kernel-layer step (skinny_linear ×4 + decode_attention, decode_modules.py) are five launches per
layer; a codebook predictor's frame runs 75-140 layer passes of small weights, so each launch's fixed cost (start,
ramp, drain, the wait on the previous grid) outweighs its bytes: the Qwen code_predictor on the H100 took ~40 µs
per layer pass against ~10 µs to read the layer's weights (bench/results/nvidia-h100/probes/predictor_copies/).
Here one grid of about one program per SM runs the five as phases separated by grid-wide barriers:

    A  qkv = round(norm(x) @ Wqkvᵀ)                    columns spread over the programs
    B  o = attention(qkv) (q/k norm, RoPE, cache write) one (row, kv head) per program
    C  x1 = x + o @ Woᵀ                                 columns
    D  h = silu(gate)·up of norm(x1) @ Wguᵀ             columns (gate and up rows together)
    E  y = x1 + h @ Wdownᵀ                              columns

Each phase calls the same device functions as the standalone kernels (skinny_linear_triton's FMA loop and
epilogue, decode_attention_triton's per-head attention), so the numerics are those of the five ops exactly. Before
it waits at a barrier, every program loads its first weight tile of the next phase (weights never depend on the
barrier), so the barrier's latency overlaps the weight stream.

Barrier: the cooperative-groups pattern (CTA barrier, one gpu-scope release atomic per program on a counter, spin
on acquire loads of it, CTA barrier). The counter lives in the caller's zeroed int32 workspace (`ws`, 2 entries):
ws[0] counts arrivals (barrier k waits for k·G), ws[1] counts programs past the last barrier, and the last of them
puts both back to zero, so the workspace is zero again for the next layer or replay. A grid barrier needs every
program resident at once: the grid is at most one program per SM and a program uses well under half an SM
(registers, no large shared tiles), so even another kernel (a second stream's) running beside it cannot keep a
program out.

PHASE ≥ 0 runs that phase alone without barriers (five launches in order): Triton's CPU interpreter runs programs
one after another, where a spin barrier would never return, so the CPU tests check the phases this way and the
GPU tests the persistent form (PHASE = -1).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .decode_attention_triton import _attend_cached, _attend_token, _token_heads
from .pdl_triton import grid_dependency_trigger, grid_dependency_wait
from .skinny_linear_triton import _dot_loop, _epilogue, _fma_loop, _fma_w_tile, _row_rstd


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
def _prefetch_l2(ptrs):
    """Ask L2 for the 128-byte lines at `ptrs` (one prefetch per element), without waiting for them."""
    return tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _prefetch_phase(w_ptr, N_OUT, K, GATED: tl.constexpr, BLOCK_N: tl.constexpr, K_LINES: tl.constexpr):
    """Prefetch into L2 the W rows this program will stream in a column phase (its tiles pid, pid + G, ...; the
    matching up rows too when GATED): every line of the phase is then in flight from DRAM at once, whatever the
    phase chain is waiting for. K_LINES: the 128-byte lines of a row, rounded up to a power of 2."""
    LINE: tl.constexpr = 1024 // w_ptr.dtype.element_ty.primitive_bitwidth  # elements per 128-byte line
    lines = tl.minimum(tl.arange(0, K_LINES) * LINE, K - 1)  # padded lines repeat the last one
    for t in range(tl.program_id(0), tl.cdiv(N_OUT, BLOCK_N), tl.num_programs(0)):
        rows = tl.minimum(t * BLOCK_N + tl.arange(0, BLOCK_N), N_OUT - 1).to(tl.int64)
        _prefetch_l2(w_ptr + rows[:, None] * K + lines[None, :])
        if GATED:
            _prefetch_l2(w_ptr + (rows + N_OUT)[:, None] * K + lines[None, :])


@triton.jit
def _first_w_tile(w_ptr, N_OUT, K, GATED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """This program's first W tile of a column phase (masked away where the program has no column tile)."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    return _fma_w_tile(w_ptr, offs_n[None, :, None], (offs_n < N_OUT)[None, :, None], N_OUT, K, 0, K, GATED, BLOCK_K)


@triton.jit
def _linear_phase(
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
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NORM_BLOCK: tl.constexpr,
    USE_DOT: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """y = epilogue(prologue(x) @ Wᵀ) over column tiles pid, pid + G, ...: skinny_linear's GEMV form (`w`/`wu`: the
    first tile, loaded by the caller (`_first_w_tile`), each next one loaded before the current one's epilogue), or
    with USE_DOT its tensor-core tile form (BLOCK_M ≥ 16 rows, rows past M masked; the K loop cp.async-pipelined
    over the kernel's num_stages)."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_NORM:
        rstd = _row_rstd(x_ptr, offs_m, m_mask, K, eps, BLOCK_M, NORM_BLOCK)
    if USE_DOT:
        for t in range(pid, tl.cdiv(N_OUT, BLOCK_N), G):
            offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
            n_mask = offs_n < N_OUT
            acc, acc_up = _dot_loop(
                x_ptr, w_ptr, g_ptr, rstd, offs_m, offs_n, m_mask, n_mask, N_OUT, K, 0, K, HAS_NORM, GATED,
                FP32_DOT, BLOCK_M, BLOCK_N, BLOCK_K,
            )  # fmt: skip
            _epilogue(acc, acc_up, offs_m, offs_n, m_mask, n_mask, b_ptr, r_ptr, y_ptr, N_OUT, scale, HAS_BIAS,
                      GATED, HAS_RESIDUAL)  # fmt: skip
    else:
        for t in range(pid, tl.cdiv(N_OUT, BLOCK_N), G):
            offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
            acc, acc_up = _fma_loop(
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
                0,
                K,
                HAS_NORM,
                GATED,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
            )
            nxt = offs_n + G * BLOCK_N
            w, wu = _fma_w_tile(w_ptr, nxt[None, :, None], (nxt < N_OUT)[None, :, None], N_OUT, K, 0, K, GATED, BLOCK_K)
            _epilogue(
                acc,
                acc_up,
                offs_m,
                offs_n,
                m_mask,
                offs_n < N_OUT,
                b_ptr,
                r_ptr,
                y_ptr,
                N_OUT,
                scale,
                HAS_BIAS,
                GATED,
                HAS_RESIDUAL,
            )


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
    LATE_TRIGGER: tl.constexpr,
    USE_DOT: tl.constexpr,
    FP32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BK_D: tl.constexpr,
    BK_O: tl.constexpr,
    BK_GU: tl.constexpr,
    BK_DOWN: tl.constexpr,
    NORM_BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PREFETCH: tl.constexpr,
    LINES_D: tl.constexpr,
    LINES_O: tl.constexpr,
    LINES_I: tl.constexpr,
):
    """Grid (programs,): at most one per SM. x [M, D] → y [M, D]; scratch qkv, attn, x1, h written on the way (each
    phase reads what the previous one wrote, after the barrier). PDL (pdl.py): the first W tile is loaded, then the
    wait; the dependent kernel is let launch at once, or with LATE_TRIGGER only when the last phase starts (its
    programs then load their first weights while this layer's down projection streams). PREFETCH: every program
    first asks L2 for all the weight rows it will stream (LINES_*: 128-byte lines per row of K = D, Hq·hd, I)."""
    # fp32 scalars whatever the caller passes (AOTI types a float argument of a user kernel fp64)
    norm_eps = tl.cast(norm_eps, tl.float32)
    qk_eps = tl.cast(qk_eps, tl.float32)
    qk_scale = tl.cast(qk_scale, tl.float32)
    residual_scale = tl.cast(residual_scale, tl.float32)
    NQKV: tl.constexpr = (HQ + 2 * HKV) * HEAD_DIM
    NO: tl.constexpr = HQ * HEAD_DIM
    G = tl.num_programs(0)
    if PREFETCH:  # the whole layer's weights requested at once (they fit L2; the launcher decides)
        _prefetch_phase(qkv_w_ptr, NQKV, D, False, BLOCK_N, LINES_D)
        _prefetch_phase(o_w_ptr, D, NO, False, BLOCK_N, LINES_O)
        _prefetch_phase(gu_w_ptr, INTER, D, True, BLOCK_N, LINES_D)
        _prefetch_phase(down_w_ptr, D, INTER, False, BLOCK_N, LINES_I)
    if PHASE < 0 or PHASE == 0:
        w, wu = _first_w_tile(qkv_w_ptr, NQKV, D, False, BLOCK_N, BK_D) if not USE_DOT else (0, 0)
        token = grid_dependency_wait(PDL, not LATE_TRIGGER)
        _linear_phase(
            x_ptr + token,
            qkv_w_ptr,
            qkv_b_ptr,
            in_norm_ptr,
            x_ptr,
            qkv_ptr + token,
            w,
            wu,
            M,
            NQKV,
            D,
            norm_eps,
            1.0,
            True,
            HAS_QKV_BIAS,
            False,
            False,
            BLOCK_M,
            BLOCK_N,
            BK_D,
            NORM_BLOCK,
            USE_DOT,
            FP32_DOT,
        )
    if PHASE < 0:
        _grid_barrier(ws_ptr, G)
    if PHASE < 0 or PHASE == 1:
        _attention_phase(
            qkv_ptr,
            pos_ptr,
            kc_ptr,
            vc_ptr,
            cos_ptr,
            sin_ptr,
            qn_ptr,
            kn_ptr,
            attn_ptr,
            layer,
            M,
            S,
            CACHE_LAYER,
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
        )
    if PHASE < 0 or PHASE == 2:
        w, wu = _first_w_tile(o_w_ptr, D, NO, False, BLOCK_N, BK_O) if not USE_DOT else (0, 0)
        if PHASE < 0:
            _grid_barrier(ws_ptr, 2 * G)
        _linear_phase(
            attn_ptr,
            o_w_ptr,
            o_b_ptr,
            attn_ptr,
            x_ptr,
            x1_ptr,
            w,
            wu,
            M,
            D,
            NO,
            norm_eps,
            residual_scale,
            False,
            HAS_O_BIAS,
            False,
            True,
            BLOCK_M,
            BLOCK_N,
            BK_O,
            NORM_BLOCK,
            USE_DOT,
            FP32_DOT,
        )
    if PHASE < 0 or PHASE == 3:
        w, wu = _first_w_tile(gu_w_ptr, INTER, D, True, BLOCK_N, BK_GU) if not USE_DOT else (0, 0)
        if PHASE < 0:
            _grid_barrier(ws_ptr, 3 * G)
        _linear_phase(
            x1_ptr,
            gu_w_ptr,
            gu_b_ptr,
            post_norm_ptr,
            x1_ptr,
            h_ptr,
            w,
            wu,
            M,
            INTER,
            D,
            norm_eps,
            1.0,
            True,
            HAS_GU_BIAS,
            True,
            False,
            BLOCK_M,
            BLOCK_N,
            BK_GU,
            NORM_BLOCK,
            USE_DOT,
            FP32_DOT,
        )
    if PHASE < 0 or PHASE == 4:
        w, wu = _first_w_tile(down_w_ptr, D, INTER, False, BLOCK_N, BK_DOWN) if not USE_DOT else (0, 0)
        if LATE_TRIGGER:  # the next kernel's programs launch now, during this last phase (the token is 0)
            y_ptr += grid_dependency_trigger(PDL)
        if PHASE < 0:
            _grid_barrier(ws_ptr, 4 * G)
            # Past the last barrier: count out; the last program out zeroes both counters (nobody reads them any
            # more in this launch) for the next layer or replay.
            out = tl.atomic_add(ws_ptr + 1, 1, sem="relaxed", scope="gpu")
            if out == G - 1:
                tl.atomic_xchg(ws_ptr, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(ws_ptr + 1, 0, sem="relaxed", scope="gpu")
        _linear_phase(
            h_ptr,
            down_w_ptr,
            down_b_ptr,
            h_ptr,
            x1_ptr,
            y_ptr,
            w,
            wu,
            M,
            D,
            INTER,
            norm_eps,
            residual_scale,
            False,
            HAS_DOWN_BIAS,
            False,
            True,
            BLOCK_M,
            BLOCK_N,
            BK_DOWN,
            NORM_BLOCK,
            USE_DOT,
            FP32_DOT,
        )
