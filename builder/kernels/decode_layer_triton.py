"""Triton kernel of `ttsaot::decode_layer` (semantics: decode_layer.py): a whole pre-norm decoder layer's decode
step in ONE persistent launch.

Why one launch: at batch ≤ 16 a decode step reads each weight once and the GEMVs already stream at the speed of a
copy of the same bytes; what is left above the byte floor is each launch's ramp and tail (≈ 3 µs per kernel on an
H100, six kernels per layer: bench/results/nvidia-h100/kernel_configs.json). Here the layer's six phases
(qkv → attention splits → split merge → o_proj → gate_up → down) are WORK ITEMS of one kernel, handed out in
phase order through an atomic ticket. A program that takes an item of phase p first issues the loads of the
item's first weight chunk (weights never depend on earlier phases), then waits until phase p-1 has finished, so
the wait hides behind that chunk's fetch instead of draining the GPU between kernels.

No deadlock whatever the number of resident programs: an item only waits for items of EARLIER phases, which were
all handed out before it, to programs already running (they took their tickets), which never wait for a later
item. So the kernel is correct with any grid, any occupancy and other kernels sharing the GPU, and under
TRITON_INTERPRET=1 (programs run one after another: the first takes every item in order).

Counters (int32 `ctr`, zero on entry): [0] the ticket, [1 + p] items of phase p done, [EXIT] programs that ran out
of work; the last program to exit puts them back to zero, so the buffer can be reused by the next layer and by
the autotuner's repeated runs. Intermediates (qkv, split partials, attention output, the residual stream after
attention, the SwiGLU activation) go through small global buffers that stay in L2; they are read with `.cg`
(L2, not a possibly stale L1 line).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .decode_attention_triton import _norm_rope
from .skinny_linear_triton import _epilogue, _row_rstd

EXIT = tl.constexpr(8)  # counter slot of the programs that ran out of work (slots 1..6: the phases' done counts)
N_COUNTERS = tl.constexpr(16)


@triton.jit
def _wait(ctr_ptr, slot, need):
    """Spin until counter `slot` reaches `need`: plain volatile reads while waiting (hundreds of waiting programs
    hammering one address with atomics would slow the very increments they wait for), then one acquire so that
    the item's later loads see the writes released with the count."""
    c = tl.load(ctr_ptr + slot, volatile=True)
    while c < need:
        c = tl.load(ctr_ptr + slot, volatile=True)
    tl.atomic_add(ctr_ptr + slot, 0, sem="acquire", scope="gpu")


@triton.jit
def _signal(ctr_ptr, slot):
    """This item's stores are done (every thread: the barrier), released to the programs that wait on `slot`."""
    tl.debug_barrier()
    tl.atomic_add(ctr_ptr + slot, 1, sem="release", scope="gpu")


@triton.jit
def _gemv_item(
    x_ptr,
    w_ptr,
    g_ptr,
    b_ptr,
    r_ptr,
    y_ptr,
    ctr_ptr,
    wait_slot,
    wait_need,
    n0,
    M,
    N_OUT,
    K,
    eps,
    scale,
    HAS_NORM: tl.constexpr,
    GATED: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    USE_DOT: tl.constexpr,
    FP32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """y[:, n0:n0+BLOCK_N] = epilogue(prologue(x) @ W[n0:n0+BLOCK_N]ᵀ) with skinny_linear's rounding (its
    `_row_rstd` / `_epilogue`); the first W chunk is loaded before waiting for x. USE_DOT: tensor cores on a
    BLOCK_M ≥ 16 tile; else FMA over [BLOCK_M, BLOCK_N, BLOCK_K] reduced per chunk."""
    dt = w_ptr.dtype.element_ty
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N_OUT
    w_rows = offs_n.to(tl.int64) * K
    w_rows_up = (offs_n + N_OUT).to(tl.int64) * K
    offs_k = tl.arange(0, BLOCK_K)
    w_mask = n_mask[:, None] & (offs_k < K)[None, :]
    w = tl.load(w_ptr + w_rows[:, None] + offs_k[None, :], mask=w_mask, other=0.0)
    wu = w
    if GATED:
        wu = tl.load(w_ptr + w_rows_up[:, None] + offs_k[None, :], mask=w_mask, other=0.0)
    _wait(ctr_ptr, wait_slot, wait_need)
    rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_NORM:
        rstd = _row_rstd(x_ptr, offs_m, m_mask, K, eps, BLOCK_M, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(
            x_ptr + offs_m[:, None] * K + offs_k[None, :],
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
            cache_modifier=".cg",
        )
        if HAS_NORM:
            gw = tl.load(g_ptr + offs_k, mask=k_mask, other=0.0)
            x = (x.to(tl.float32) * rstd[:, None]).to(dt)  # normalised, cast back
            x = (gw.to(tl.float32)[None, :] * x.to(tl.float32)).to(dt)  # × weight in x's dtype
        # the next chunk's weights are requested before this chunk's math (masked off past K)
        nk = k0 + BLOCK_K + tl.arange(0, BLOCK_K)
        nw_mask = n_mask[:, None] & (nk < K)[None, :]
        w_next = tl.load(w_ptr + w_rows[:, None] + nk[None, :], mask=nw_mask, other=0.0)
        wu_next = w_next
        if GATED:
            wu_next = tl.load(w_ptr + w_rows_up[:, None] + nk[None, :], mask=nw_mask, other=0.0)
        if USE_DOT:
            if FP32_DOT:
                acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
                if GATED:
                    acc_up = tl.dot(x.to(tl.float32), tl.trans(wu.to(tl.float32)), acc_up, input_precision="ieee")
            else:
                acc = tl.dot(x, tl.trans(w), acc)
                if GATED:
                    acc_up = tl.dot(x, tl.trans(wu), acc_up)
        else:
            xf = x.to(tl.float32)[:, None, :]
            acc += tl.sum(xf * w.to(tl.float32)[None, :, :], axis=2)
            if GATED:
                acc_up += tl.sum(xf * wu.to(tl.float32)[None, :, :], axis=2)
        w = w_next
        wu = wu_next
    _epilogue(
        acc, acc_up, offs_m, offs_n, m_mask, n_mask, b_ptr, r_ptr, y_ptr, N_OUT, scale, False, GATED, HAS_RESIDUAL
    )


@triton.jit
def _attention_item(
    item,
    qkv_ptr,
    pos_ptr,
    kc_ptr,
    vc_ptr,
    cos_ptr,
    sin_ptr,
    qn_ptr,
    kn_ptr,
    o_ptr,
    part_o_ptr,
    part_ml_ptr,
    layer,
    S,
    CACHE_LAYER,
    qk_eps,
    qk_scale,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    G_PAD: tl.constexpr,
    ROPE: tl.constexpr,
    QK_NORM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    MIN_CHUNK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """Item = (row b, kv head h, context split s): decode_attention's program (decode_attention_triton.py) on the
    qkv this kernel wrote; with NUM_SPLITS > 1 the split's (max, sum, unnormalised output) go to the partials."""
    G: tl.constexpr = HQ // HKV
    pid = item // NUM_SPLITS
    split = item % NUM_SPLITS
    b = pid // HKV
    h = pid % HKV
    dt = qkv_ptr.dtype.element_ty
    pos = tl.load(pos_ptr + b).to(tl.int32)
    pos = tl.minimum(tl.maximum(pos, 0), S - 1)  # never write or read outside the cache
    offs_d = tl.arange(0, HEAD_DIM)
    offs_g = tl.arange(0, G_PAD)
    QKV_ROW: tl.constexpr = (HQ + 2 * HKV) * HEAD_DIM
    row = qkv_ptr + b.to(tl.int64) * QKV_ROW
    q = _norm_rope(
        row,
        (h * G + offs_g) * HEAD_DIM,
        offs_d,
        offs_g < G,
        qn_ptr,
        cos_ptr,
        sin_ptr,
        pos,
        qk_eps,
        QK_NORM,
        ROPE,
        HEAD_DIM,
    )  # [G_PAD, HEAD_DIM]
    one = tl.arange(0, 1)
    k_new = _norm_rope(
        row,
        (HQ + h) * HEAD_DIM + one,
        offs_d,
        one == 0,
        kn_ptr,
        cos_ptr,
        sin_ptr,
        pos,
        qk_eps,
        QK_NORM,
        ROPE,
        HEAD_DIM,
    )  # [1, HEAD_DIM]
    v_new = tl.load(row + (HQ + HKV + h) * HEAD_DIM + one[:, None] + offs_d[None, :])
    cache_off = (pid.to(tl.int64) * S + layer * CACHE_LAYER) * HEAD_DIM  # (layer, b, h, 0, 0)
    k_base = kc_ptr + cache_off
    v_base = vc_ptr + cache_off
    # this row's split size (as decode_attention): p + 1 positions over NUM_SPLITS items, whole BLOCK_S blocks,
    # ≥ MIN_CHUNK; a split past p is empty and stores the empty state (weight 0 in the merge)
    chunk = tl.maximum(tl.cdiv(tl.cdiv(pos + 1, NUM_SPLITS), BLOCK_S) * BLOCK_S, MIN_CHUNK)
    lo = split * chunk
    writer = (pos >= lo) & (pos < lo + chunk)
    tl.store(k_base + pos * HEAD_DIM + offs_d[None, :], k_new, mask=writer)
    tl.store(v_base + pos * HEAD_DIM + offs_d[None, :], v_new, mask=writer)

    m_i = tl.full([G_PAD], -1.0e30, dtype=tl.float32)  # finite: an empty split never computes −inf − (−inf)
    l_i = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, HEAD_DIM], dtype=tl.float32)
    hi = tl.minimum(lo + chunk, pos)
    for start in range(lo, hi, BLOCK_S):
        offs_s = start + tl.arange(0, BLOCK_S)
        valid = offs_s < hi
        kv_off = offs_s[:, None] * HEAD_DIM + offs_d[None, :]
        kt = tl.load(k_base + kv_off, mask=valid[:, None], other=0.0)
        vt = tl.load(v_base + kv_off, mask=valid[:, None], other=0.0)
        if FP32_DOT:
            sc = tl.dot(q.to(tl.float32), tl.trans(kt.to(tl.float32)), input_precision="ieee")
        else:
            sc = tl.dot(q, tl.trans(kt))  # [G_PAD, BLOCK_S] fp32
        sc = tl.where(valid[None, :], sc * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(sc - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if FP32_DOT:
            pv = tl.dot(p.to(dt).to(tl.float32), vt.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(dt), vt)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    s_new = tl.sum(q.to(tl.float32) * k_new.to(tl.float32), axis=1) * qk_scale  # [G_PAD]
    s_new = tl.where(writer, s_new, float("-inf"))
    m_new = tl.maximum(m_i, s_new)
    alpha = tl.exp2(m_i - m_new)
    p_new = tl.exp2(s_new - m_new)
    l_i = l_i * alpha + p_new
    acc = acc * alpha[:, None] + p_new.to(dt).to(tl.float32)[:, None] * v_new.to(tl.float32)
    m_i = m_new

    heads = h * G + offs_g
    g_mask = offs_g < G
    if NUM_SPLITS == 1:
        tl.store(
            o_ptr + b.to(tl.int64) * (HQ * HEAD_DIM) + heads[:, None] * HEAD_DIM + offs_d[None, :],
            (acc / l_i[:, None]).to(dt),
            mask=g_mask[:, None],
        )
    else:
        # an inactive split (past the row's position) stores its empty state: the merge weighs it 0
        slot = (b * HQ + heads).to(tl.int64) * NUM_SPLITS + split  # [G_PAD]
        tl.store(part_o_ptr + slot[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=g_mask[:, None])
        tl.store(part_ml_ptr + slot * 2, m_i, mask=g_mask)
        tl.store(part_ml_ptr + slot * 2 + 1, l_i, mask=g_mask)


@triton.jit
def _merge_item(
    item,
    o_ptr,
    part_o_ptr,
    part_ml_ptr,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    G_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    """Item = (row b, kv head h): its G query heads' splits merged in split order (deterministic)."""
    G: tl.constexpr = HQ // HKV
    b = item // HKV
    h = item % HKV
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    g_mask = offs_g < G
    heads = h * G + offs_g
    base = (b * HQ + heads).to(tl.int64) * NUM_SPLITS  # [G_PAD]
    m_all = tl.full([G_PAD], -1.0e30, dtype=tl.float32)
    l_all = tl.zeros([G_PAD], dtype=tl.float32)
    o_all = tl.zeros([G_PAD, HEAD_DIM], dtype=tl.float32)
    for s in range(0, NUM_SPLITS):
        ms = tl.load(part_ml_ptr + (base + s) * 2, mask=g_mask, other=-1.0e30, cache_modifier=".cg")
        ls = tl.load(part_ml_ptr + (base + s) * 2 + 1, mask=g_mask, other=0.0, cache_modifier=".cg")
        ps = tl.load(
            part_o_ptr + (base + s)[:, None] * HEAD_DIM + offs_d[None, :],
            mask=g_mask[:, None],
            other=0.0,
            cache_modifier=".cg",
        )
        m_next = tl.maximum(m_all, ms)
        a_old = tl.exp2(m_all - m_next)
        a_s = tl.exp2(ms - m_next)
        l_all = l_all * a_old + ls * a_s
        o_all = o_all * a_old[:, None] + ps * a_s[:, None]
        m_all = m_next
    dt = o_ptr.dtype.element_ty
    tl.store(
        o_ptr + b.to(tl.int64) * (HQ * HEAD_DIM) + heads[:, None] * HEAD_DIM + offs_d[None, :],
        (o_all / l_all[:, None]).to(dt),
        mask=g_mask[:, None],
    )


@triton.jit(do_not_specialize=["layer"])  # one compiled kernel for every layer index
def decode_layer_kernel(
    x_ptr,
    pos_ptr,
    kc_ptr,
    vc_ptr,
    cos_ptr,
    sin_ptr,
    ln1_ptr,
    wqkv_ptr,
    qn_ptr,
    kn_ptr,
    wo_ptr,
    ln2_ptr,
    wgu_ptr,
    wd_ptr,
    qkv_ptr,
    part_o_ptr,
    part_ml_ptr,
    o_ptr,
    h_ptr,
    act_ptr,
    y_ptr,
    ctr_ptr,
    layer,
    S,
    CACHE_LAYER,
    M,
    eps,
    qk_eps,
    qk_scale,
    scale,
    D: tl.constexpr,
    INTER: tl.constexpr,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    G_PAD: tl.constexpr,
    ROPE: tl.constexpr,
    QK_NORM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    MIN_CHUNK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    USE_DOT: tl.constexpr,
    FP32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PROGRAMS_PER_SM: tl.constexpr,
):
    """Grid (any number of programs; PROGRAMS_PER_SM × SMs from the launcher, a tuning knob the kernel itself does
    not read): each takes tickets until the layer's items run out (module docstring). A program reserves its next
    ticket when it starts an item, so the ticket's round trip hides behind the item's work (still deadlock-free:
    every item waits only on smaller tickets, and the smallest unfinished one is always being processed)."""
    # fp32 scalars whatever the caller passes (AOTInductor passes a user kernel's float arguments as fp64)
    eps = tl.cast(eps, tl.float32)
    qk_eps = tl.cast(qk_eps, tl.float32)
    qk_scale = tl.cast(qk_scale, tl.float32)
    scale = tl.cast(scale, tl.float32)
    NQKV: tl.constexpr = (HQ + 2 * HKV) * HEAD_DIM
    HO: tl.constexpr = HQ * HEAD_DIM
    # phase ends (cumulative item counts): qkv, attention splits, split merge, o_proj, gate_up, down
    E0: tl.constexpr = (NQKV + BLOCK_N - 1) // BLOCK_N
    n_attn = M * HKV * NUM_SPLITS
    n_merge = M * HKV if NUM_SPLITS > 1 else 0
    E1 = E0 + n_attn
    E2 = E1 + n_merge
    E3 = E2 + (D + BLOCK_N - 1) // BLOCK_N
    E4 = E3 + (INTER + BLOCK_N - 1) // BLOCK_N
    E5 = E4 + (D + BLOCK_N - 1) // BLOCK_N
    t = tl.atomic_add(ctr_ptr, 1, sem="relaxed", scope="gpu")
    while t < E5:
        t_next = tl.atomic_add(ctr_ptr, 1, sem="relaxed", scope="gpu")
        if t < E0:
            _gemv_item(
                x_ptr,
                wqkv_ptr,
                ln1_ptr,
                x_ptr,
                x_ptr,
                qkv_ptr,
                ctr_ptr,
                1,
                0,
                t * BLOCK_N,
                M,
                NQKV,
                D,
                eps,
                scale,
                True,
                False,
                False,
                USE_DOT,
                FP32_DOT,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
            )
            _signal(ctr_ptr, 1)
        elif t < E1:
            _wait(ctr_ptr, 1, E0)
            _attention_item(
                t - E0,
                qkv_ptr,
                pos_ptr,
                kc_ptr,
                vc_ptr,
                cos_ptr,
                sin_ptr,
                qn_ptr,
                kn_ptr,
                o_ptr,
                part_o_ptr,
                part_ml_ptr,
                layer,
                S,
                CACHE_LAYER,
                qk_eps,
                qk_scale,
                HQ,
                HKV,
                HEAD_DIM,
                G_PAD,
                ROPE,
                QK_NORM,
                NUM_SPLITS,
                MIN_CHUNK,
                BLOCK_S,
                FP32_DOT,
            )
            _signal(ctr_ptr, 2)
        elif t < E2:
            _wait(ctr_ptr, 2, n_attn)
            _merge_item(t - E1, o_ptr, part_o_ptr, part_ml_ptr, HQ, HKV, HEAD_DIM, G_PAD, NUM_SPLITS)
            _signal(ctr_ptr, 3)
        elif t < E3:
            # o_proj + residual: waits for the merge (or, with one split, for the attention items)
            if NUM_SPLITS > 1:
                _gemv_item(
                    o_ptr,
                    wo_ptr,
                    x_ptr,
                    x_ptr,
                    x_ptr,
                    h_ptr,
                    ctr_ptr,
                    3,
                    n_merge,
                    (t - E2) * BLOCK_N,
                    M,
                    D,
                    HO,
                    eps,
                    scale,
                    False,
                    False,
                    True,
                    USE_DOT,
                    FP32_DOT,
                    BLOCK_M,
                    BLOCK_N,
                    BLOCK_K,
                )
            else:
                _gemv_item(
                    o_ptr,
                    wo_ptr,
                    x_ptr,
                    x_ptr,
                    x_ptr,
                    h_ptr,
                    ctr_ptr,
                    2,
                    n_attn,
                    (t - E2) * BLOCK_N,
                    M,
                    D,
                    HO,
                    eps,
                    scale,
                    False,
                    False,
                    True,
                    USE_DOT,
                    FP32_DOT,
                    BLOCK_M,
                    BLOCK_N,
                    BLOCK_K,
                )
            _signal(ctr_ptr, 4)
        elif t < E4:
            _gemv_item(
                h_ptr,
                wgu_ptr,
                ln2_ptr,
                x_ptr,
                x_ptr,
                act_ptr,
                ctr_ptr,
                4,
                E3 - E2,
                (t - E3) * BLOCK_N,
                M,
                INTER,
                D,
                eps,
                scale,
                True,
                True,
                False,
                USE_DOT,
                FP32_DOT,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
            )
            _signal(ctr_ptr, 5)
        else:
            _gemv_item(
                act_ptr,
                wd_ptr,
                x_ptr,
                x_ptr,
                h_ptr,
                y_ptr,
                ctr_ptr,
                5,
                E4 - E3,
                (t - E4) * BLOCK_N,
                M,
                D,
                INTER,
                eps,
                scale,
                False,
                False,
                True,
                USE_DOT,
                FP32_DOT,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
            )
        t = t_next
    # out of work: the last program to get here has seen every item finish (each finishes before its program
    # exits) and puts the counters back to zero for the next launch
    done = tl.atomic_add(ctr_ptr + EXIT, 1, sem="acq_rel", scope="gpu")
    if done == tl.num_programs(0) - 1:
        offs = tl.arange(0, N_COUNTERS)
        tl.store(ctr_ptr + offs, tl.zeros([N_COUNTERS], dtype=tl.int32))


# Tuned per bucket at AOTI compile time on the build GPU (one config per package); BLOCK_M, USE_DOT, NUM_SPLITS come
# from the shapes. More programs per SM = more items (weight chunks) in flight per SM.
LAYER_CONFIGS = [
    triton.Config({"BLOCK_N": 16, "BLOCK_K": 512, "PROGRAMS_PER_SM": 4}, num_warps=4, num_stages=1),
    triton.Config({"BLOCK_N": 8, "BLOCK_K": 1024, "PROGRAMS_PER_SM": 4}, num_warps=4, num_stages=1),
    triton.Config({"BLOCK_N": 16, "BLOCK_K": 1024, "PROGRAMS_PER_SM": 2}, num_warps=8, num_stages=1),
    triton.Config({"BLOCK_N": 16, "BLOCK_K": 256, "PROGRAMS_PER_SM": 8}, num_warps=2, num_stages=1),
]
decode_layer_autotuned = triton.autotune(
    configs=LAYER_CONFIGS, key=["M", "S", "D", "INTER", "HQ", "HKV", "HEAD_DIM", "NUM_SPLITS", "MIN_CHUNK", "USE_DOT"]
)(decode_layer_kernel)
