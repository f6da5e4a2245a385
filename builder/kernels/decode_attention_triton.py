"""Triton kernels of `ttsaot::decode_attention` (semantics: decode_attention.py).

Imported by the launcher on first use, like skinny_linear_triton.py.

Flash-decoding over a static cache: program (row b, kv head h, context split s) handles the G = Hq/Hkv query heads
that share kv head h as the rows of one tile, so K/V are read once per kv head (no repeat_interleave). Each
program rebuilds this token's q/k/v from the fused projection (q/k RMSNorm, RoPE) in registers; the program whose
split holds position p writes k/v there and adds position p's key/value from its registers, while the cache loop
reads positions < p only, so no program ever reads the slot being written (no ordering between programs needed). With
several splits, the partial (max, sum, unnormalised output) of each split goes to a small fp32 buffer and a second
kernel combines the splits in a fixed order (deterministic).
"""

from __future__ import annotations

import triton
import triton.language as tl

ROPE_NONE, ROPE_NEOX, ROPE_INTERLEAVED = 0, 1, 2
LOG2E = 1.4426950408889634


@triton.jit
def _norm_rope(
    x_ptr,
    rows,
    offs_d,
    row_mask,
    w_ptr,
    cos_ptr,
    sin_ptr,
    pos,
    eps,
    QK_NORM: tl.constexpr,
    ROPE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """Heads `rows` ([R] head offsets in elements) of the fused qkv row → [R, HEAD_DIM] in x's dtype: RMSNorm over
    the head (project rounding), then the rotation in fp32 with fp32 tables, cast back (as the eager `_rope`)."""
    dt = x_ptr.dtype.element_ty
    mask = row_mask[:, None]
    x = tl.load(x_ptr + rows[:, None] + offs_d[None, :], mask=mask, other=0.0)
    if ROPE == 1:  # NeoX rotate-half: partner d ± HEAD_DIM/2, −sin on the first half
        offs_p = (offs_d + HEAD_DIM // 2) % HEAD_DIM
        sign = tl.where(offs_d < HEAD_DIM // 2, -1.0, 1.0)
        tab = pos * HEAD_DIM + offs_d
    else:  # interleaved pairs (2i, 2i+1): partner d ^ 1, −sin on the even element, angle i = d // 2
        offs_p = offs_d ^ 1
        sign = tl.where(offs_d % 2 == 0, -1.0, 1.0)
        tab = pos * (HEAD_DIM // 2) + offs_d // 2
    if ROPE != 0:
        xp = tl.load(x_ptr + rows[:, None] + offs_p[None, :], mask=mask, other=0.0)
    if QK_NORM:
        xf = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / HEAD_DIM + eps)
        w = tl.load(w_ptr + offs_d).to(tl.float32)
        x = (w[None, :] * (xf * rstd[:, None]).to(dt).to(tl.float32)).to(dt)
        if ROPE != 0:
            wp = tl.load(w_ptr + offs_p).to(tl.float32)
            xp = (wp[None, :] * (xp.to(tl.float32) * rstd[:, None]).to(dt).to(tl.float32)).to(dt)
    if ROPE != 0:
        c = tl.load(cos_ptr + tab)
        s = tl.load(sin_ptr + tab)
        x = (x.to(tl.float32) * c[None, :] + xp.to(tl.float32) * (sign * s)[None, :]).to(dt)
    return x


@triton.jit(do_not_specialize=["layer"])  # one compiled kernel for every layer index
def decode_attention_kernel(
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
    QKV_ROW,
    CACHE_LAYER,
    SPLIT_SIZE,
    NUM_SPLITS,
    eps,
    qk_scale,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    G_PAD: tl.constexpr,
    ROPE: tl.constexpr,
    QK_NORM: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
    BLOCK_S: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """Grid (B·HKV, NUM_SPLITS). qk_scale = softmax scale · log2(e) (the softmax runs in base 2). SINGLE_SPLIT
    (NUM_SPLITS == 1): the output is written directly, no partials. FP32_DOT: as in skinny_linear_triton."""
    # fp32 scalars whatever the caller passes: AOTInductor types a float argument of a user kernel fp64 (torch's
    # _use_fp64_for_unbacked_floats), which turned the loop-carried softmax state fp64 (H100 AOTI build failed).
    eps = tl.cast(eps, tl.float32)
    qk_scale = tl.cast(qk_scale, tl.float32)
    G: tl.constexpr = HQ // HKV
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // HKV
    h = pid % HKV
    dt = qkv_ptr.dtype.element_ty
    pos = tl.load(pos_ptr + b).to(tl.int32)
    pos = tl.minimum(tl.maximum(pos, 0), S - 1)  # never write or read outside the cache
    offs_d = tl.arange(0, HEAD_DIM)
    offs_g = tl.arange(0, G_PAD)
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
        eps,
        QK_NORM,
        ROPE,
        HEAD_DIM,
    )  # [G_PAD, HEAD_DIM]
    one = tl.arange(0, 1)
    k_new = _norm_rope(
        row, (HQ + h) * HEAD_DIM + one, offs_d, one == 0, kn_ptr, cos_ptr, sin_ptr, pos, eps, QK_NORM, ROPE, HEAD_DIM
    )  # [1, HEAD_DIM]
    v_new = tl.load(row + (HQ + HKV + h) * HEAD_DIM + one[:, None] + offs_d[None, :])
    # (layer, b, h, 0, 0). No `.to` on `layer`: Triton specialises an int argument equal to 1 into a constexpr
    # (a plain Python int), which has no `.to` (H100: every layer-1 launch failed to compile under AOTI).
    cache_off = (pid.to(tl.int64) * S + layer * CACHE_LAYER) * HEAD_DIM
    k_base = kc_ptr + cache_off
    v_base = vc_ptr + cache_off
    lo = split * SPLIT_SIZE
    writer = (pos >= lo) & (pos < lo + SPLIT_SIZE)
    tl.store(k_base + pos * HEAD_DIM + offs_d[None, :], k_new, mask=writer)
    tl.store(v_base + pos * HEAD_DIM + offs_d[None, :], v_new, mask=writer)

    # Cached keys lo ≤ s < min(lo + SPLIT_SIZE, pos): plain loads → dot → online softmax (base 2).
    m_i = tl.full([G_PAD], -1.0e30, dtype=tl.float32)  # finite: an empty split never computes −inf − (−inf)
    l_i = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, HEAD_DIM], dtype=tl.float32)
    hi = tl.minimum(lo + SPLIT_SIZE, pos)
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
    # This token's key/value (position pos) from registers, in the split that holds pos. Other splits add
    # nothing (score −inf); a split past pos is inactive and stores nothing.
    s_new = tl.sum(q.to(tl.float32) * k_new.to(tl.float32), axis=1) * qk_scale  # [G_PAD]
    s_new = tl.where(writer, s_new, float("-inf"))
    m_new = tl.maximum(m_i, s_new)
    alpha = tl.exp2(m_i - m_new)
    p_new = tl.exp2(s_new - m_new)
    l_i = l_i * alpha + p_new
    acc = acc * alpha[:, None] + p_new.to(dt).to(tl.float32)[:, None] * v_new.to(tl.float32)
    m_i = m_new

    heads = h * G + offs_g
    g_mask = (offs_g < G)[:, None]
    if SINGLE_SPLIT:
        o = acc / l_i[:, None]
        tl.store(
            o_ptr + b.to(tl.int64) * (HQ * HEAD_DIM) + heads[:, None] * HEAD_DIM + offs_d[None, :],
            o.to(dt),
            mask=g_mask,
        )
    else:
        active = lo <= pos
        slot = (b * HQ + heads).to(tl.int64) * NUM_SPLITS + split  # [G_PAD]
        tl.store(part_o_ptr + slot[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=g_mask & active)
        tl.store(part_ml_ptr + slot * 2, m_i, mask=(offs_g < G) & active)
        tl.store(part_ml_ptr + slot * 2 + 1, l_i, mask=(offs_g < G) & active)


@triton.jit
def combine_splits_kernel(
    part_o_ptr,
    part_ml_ptr,
    pos_ptr,
    o_ptr,
    S,
    SPLIT_SIZE,
    NUM_SPLITS,
    HQ: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """One program per (row, query head): merge the row's active splits (those at or before its position) in
    split order, CHUNK splits at a time (the running max first, then the weighted sums)."""
    pid = tl.program_id(0)
    b = pid // HQ
    pos = tl.load(pos_ptr + b).to(tl.int32)
    pos = tl.minimum(tl.maximum(pos, 0), S - 1)
    last = pos // SPLIT_SIZE
    base = pid.to(tl.int64) * NUM_SPLITS
    m_max = tl.full([CHUNK], -1.0e30, dtype=tl.float32)
    for c in range(0, last + 1, CHUNK):
        offs_c = c + tl.arange(0, CHUNK)
        m_max = tl.maximum(m_max, tl.load(part_ml_ptr + (base + offs_c) * 2, mask=offs_c <= last, other=-1.0e30))
    m_all = tl.max(m_max, axis=0)
    offs_d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    denom = tl.zeros([CHUNK], dtype=tl.float32)
    for c in range(0, last + 1, CHUNK):
        offs_c = c + tl.arange(0, CHUNK)
        act = offs_c <= last
        mc = tl.load(part_ml_ptr + (base + offs_c) * 2, mask=act, other=-1.0e30)
        lc = tl.load(part_ml_ptr + (base + offs_c) * 2 + 1, mask=act, other=0.0)
        w = tl.where(act, tl.exp2(mc - m_all), 0.0)
        denom += w * lc
        part = tl.load(part_o_ptr + (base + offs_c)[:, None] * HEAD_DIM + offs_d[None, :], mask=act[:, None], other=0.0)
        acc += tl.sum(part * w[:, None], axis=0)
    o = acc / tl.sum(denom, axis=0)
    tl.store(o_ptr + pid.to(tl.int64) * HEAD_DIM + offs_d, o.to(o_ptr.dtype.element_ty))


# BLOCK_S comes from the launcher (it must not exceed the split size); the autotuner picks warps and stages per
# bucket at AOTI compile time.
ATTENTION_CONFIGS = [
    triton.Config({}, num_warps=4, num_stages=2),
    triton.Config({}, num_warps=4, num_stages=3),
    triton.Config({}, num_warps=8, num_stages=2),
]
decode_attention_autotuned = triton.autotune(
    configs=ATTENTION_CONFIGS,
    key=["S", "SPLIT_SIZE", "HQ", "HKV", "BLOCK_S", "ROPE", "QK_NORM", "SINGLE_SPLIT"],
)(decode_attention_kernel)
