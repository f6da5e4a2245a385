"""Triton kernel of `ttsaot::decode_attention` (semantics: decode_attention.py).

Imported by the launcher on first use, like skinny_linear_triton.py.

Flash-decoding over a static cache in ONE launch: program (row b, kv head h, split s) handles the G = Hq/Hkv query
heads that share kv head h as the rows of one tile, so K/V are read once per kv head (no repeat_interleave). Each
program rebuilds this token's q/k/v from the fused projection (q/k RMSNorm, RoPE) in registers; the program whose
positions hold p writes k/v there and adds position p's key/value from its registers, while the cache loop reads
positions < p only, so no program ever reads the slot being written.

Splits are sized at RUN time from the row's position: the row's p + 1 positions are cut into NUM_SPLITS (fixed per
bucket) whole BLOCK_S blocks of at least MIN_CHUNK positions, so a short context runs in one program that writes
the output directly and a long one spreads over all NUM_SPLITS programs. With several active splits each writes its
partial (max, sum, unnormalised output) to a small fp32 buffer, then takes a ticket from a per-(row, kv head)
counter in `ws` (int32, zero on entry): the program holding the last ticket merges the partials in split order
(deterministic whatever the arrival order), writes the output and puts the counter back to zero, so the workspace
is unchanged by the call and one zeroed buffer serves every layer of a step. No second (combine) launch.

A cache of at most BLOCK_S positions planned as one split (the codebook predictors' 10-17 positions) takes the
WHOLE form: its keys/values are one tile loaded without waiting for the position (decode_attention_kernel).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .pdl_triton import grid_dependency_wait

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
    CACHE: tl.constexpr,
):
    """Heads `rows` ([R] head offsets in elements) of the fused qkv row → [R, len(offs_d)] in x's dtype: RMSNorm
    over the head (project rounding), then the rotation in fp32 (tables of any float dtype, widened as loaded),
    cast back (as the eager `_rope`).
    `offs_d` may run past HEAD_DIM (a tile padded for tl.dot): those lanes are zero. `pos`: one position for every
    head (a decode step's token), or [R, 1] positions, one per row (a sequence's tokens, sequence_attention).
    CACHE: the x loads' cache modifier ("" or ".cg": rows other programs of the same launch wrote, read through L2)."""
    dt = x_ptr.dtype.element_ty
    d_mask = offs_d < HEAD_DIM
    mask = row_mask[:, None] & d_mask[None, :]
    x = tl.load(x_ptr + rows[:, None] + offs_d[None, :], mask=mask, other=0.0, cache_modifier=CACHE)
    if ROPE == 1:  # NeoX rotate-half: partner d ± HEAD_DIM/2, −sin on the first half
        offs_p = (offs_d + HEAD_DIM // 2) % HEAD_DIM
        sign = tl.where(offs_d < HEAD_DIM // 2, -1.0, 1.0)
        tab = pos * HEAD_DIM + offs_d
    else:  # interleaved pairs (2i, 2i+1): partner d ^ 1, −sin on the even element, angle i = d // 2
        offs_p = offs_d ^ 1
        sign = tl.where(offs_d % 2 == 0, -1.0, 1.0)
        tab = pos * (HEAD_DIM // 2) + offs_d // 2
    if ROPE != 0:
        xp = tl.load(x_ptr + rows[:, None] + offs_p[None, :], mask=mask, other=0.0, cache_modifier=CACHE)
    if QK_NORM:
        xf = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / HEAD_DIM + eps)
        w = tl.load(w_ptr + offs_d, mask=d_mask, other=0.0).to(tl.float32)
        x = (w[None, :] * (xf * rstd[:, None]).to(dt).to(tl.float32)).to(dt)
        if ROPE != 0:
            wp = tl.load(w_ptr + offs_p, mask=d_mask, other=0.0).to(tl.float32)
            xp = (wp[None, :] * (xp.to(tl.float32) * rstd[:, None]).to(dt).to(tl.float32)).to(dt)
    if ROPE != 0:
        c = tl.load(cos_ptr + tab, mask=d_mask, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + tab, mask=d_mask, other=0.0).to(tl.float32)
        x = (x.to(tl.float32) * c + xp.to(tl.float32) * (sign * s)).to(dt)
    return x


@triton.jit
def _token_heads(
    row,
    h,
    pos,
    offs_d,
    offs_g,
    qn_ptr,
    kn_ptr,
    cos_ptr,
    sin_ptr,
    eps,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    QK_NORM: tl.constexpr,
    ROPE: tl.constexpr,
    CACHE: tl.constexpr,
):
    """This token's heads of kv head h from its fused qkv row: q [G_PAD, D_PAD] (the G = HQ/HKV query heads that
    share h; padded rows zero), k [1, D_PAD] (normed and rotated like q) and v [1, D_PAD], in the row's dtype."""
    G: tl.constexpr = HQ // HKV
    d_mask = offs_d < HEAD_DIM
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
        CACHE,
    )
    one = tl.arange(0, 1)
    k = _norm_rope(
        row,
        (HQ + h) * HEAD_DIM + one,
        offs_d,
        one == 0,
        kn_ptr,
        cos_ptr,
        sin_ptr,
        pos,
        eps,
        QK_NORM,
        ROPE,
        HEAD_DIM,
        CACHE,
    )
    v_ptrs = row + (HQ + HKV + h) * HEAD_DIM + one[:, None] + offs_d[None, :]
    v = tl.load(v_ptrs, mask=d_mask[None, :], other=0.0, cache_modifier=CACHE)
    return q, k, v


@triton.jit
def _token_to_cache(
    row,
    h,
    pos,
    k_base,
    v_base,
    write,
    offs_d,
    offs_g,
    qn_ptr,
    kn_ptr,
    cos_ptr,
    sin_ptr,
    eps,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    QK_NORM: tl.constexpr,
    ROPE: tl.constexpr,
    CACHE: tl.constexpr,
):
    """`_token_heads`, and this token's k/v written at slot `pos` of its (row, kv head) cache where `write` (the
    program holding the position). Returns q, k, v."""
    q, k_new, v_new = _token_heads(
        row, h, pos, offs_d, offs_g, qn_ptr, kn_ptr, cos_ptr, sin_ptr, eps, HQ, HKV, HEAD_DIM, QK_NORM, ROPE, CACHE
    )
    new_mask = write & (offs_d < HEAD_DIM)[None, :]
    tl.store(k_base + pos * HEAD_DIM + offs_d[None, :], k_new, mask=new_mask)
    tl.store(v_base + pos * HEAD_DIM + offs_d[None, :], v_new, mask=new_mask)
    return q, k_new, v_new


@triton.jit
def _attend_block(q, kt, vt, valid, m_i, l_i, acc, qk_scale, FP32_DOT: tl.constexpr):
    """One block of the online softmax (base 2): q [G_PAD, D_PAD] over keys/values kt, vt [BLOCK_S, D_PAD] where
    `valid` [BLOCK_S]; the running (max, sum, unnormalised output) in fp32. Scores stay fp32; the probabilities are
    rounded to q's dtype before · v (decode_attention.py). vt must be zero where not valid (0 · NaN would poison
    the sum)."""
    dt = q.dtype
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
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _softmax_start(G_PAD: tl.constexpr, D_PAD: tl.constexpr):
    """The empty online-softmax state. The max starts finite: an empty range never computes −inf − (−inf)."""
    m_i = tl.full([G_PAD], -1.0e30, dtype=tl.float32)
    return m_i, tl.zeros([G_PAD], dtype=tl.float32), tl.zeros([G_PAD, D_PAD], dtype=tl.float32)


@triton.jit
def _cache_block(k_base, v_base, block, limit, offs_d, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr):
    """Cache block `block` of one (row, kv head) ([S, HEAD_DIM] at k_base / v_base): its positions [BLOCK_S] and
    keys / values [BLOCK_S, D_PAD], loaded at positions < `limit` (zero elsewhere). limit = S: the whole block
    whatever the position (the caller masks the slots it may not read); limit = p: the cached keys only."""
    offs_s = block * BLOCK_S + tl.arange(0, BLOCK_S)
    kv_off = offs_s[:, None] * HEAD_DIM + offs_d[None, :]
    mask = (offs_s < limit)[:, None] & (offs_d < HEAD_DIM)[None, :]
    kt = tl.load(k_base + kv_off, mask=mask, other=0.0)
    return offs_s, kt, tl.load(v_base + kv_off, mask=mask, other=0.0)


@triton.jit
def _attend_dealt(
    q,
    k_base,
    v_base,
    first,
    end,
    step,
    pos,
    m_i,
    l_i,
    acc,
    qk_scale,
    offs_d,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """The online softmax of q continued over the cache blocks first, first + step, ... < end of one (row, kv head)
    (the blocks dealt to one split), their positions < pos only."""
    for block in range(first, end, step):
        offs_s, kt, vt = _cache_block(k_base, v_base, block, pos, offs_d, HEAD_DIM, BLOCK_S)
        m_i, l_i, acc = _attend_block(q, kt, vt, offs_s < pos, m_i, l_i, acc, qk_scale, FP32_DOT)
    return m_i, l_i, acc


@triton.jit
def _attend_token(q, k, v, take, m_i, l_i, acc, qk_scale):
    """The online-softmax state after adding this token's own key/value (k, v [1, D_PAD], from registers) where
    `take` (the program holding position p); unchanged elsewhere."""
    s = tl.sum(q.to(tl.float32) * k.to(tl.float32), axis=1) * qk_scale  # [G_PAD]
    s = tl.where(take, s, float("-inf"))
    m_new = tl.maximum(m_i, s)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new)
    l_i = l_i * alpha + p
    acc = acc * alpha[:, None] + p.to(q.dtype).to(tl.float32)[:, None] * v.to(tl.float32)
    return m_new, l_i, acc


@triton.jit
def _whole_cache_head(
    row,
    pos,
    k_base,
    v_base,
    o_row,
    h,
    S,
    qn_ptr,
    kn_ptr,
    cos_ptr,
    sin_ptr,
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
    ROW_CACHE: tl.constexpr,
):
    """The WHOLE form of one (row, kv head) whose cache (S ≤ BLOCK_S positions, [S, HEAD_DIM] at k_base / v_base)
    is one tile: this token's heads from the fused qkv `row`, its k/v written at `pos` (clamped by the caller), the
    G query heads' outputs stored at `o_row` (the row's [HQ·HEAD_DIM] output). The cache is loaded first,
    addressed without the position: those loads go out with the position's and the token's, one round trip, where
    the loop's bounds wait for the position. Slot p (written here) and the slots past it are read too and masked
    out of the softmax. decode_attention_kernel's one-split short caches and qkv_attention_kernel's heads (ROW_CACHE
    ".cg": its row was written by other programs of the launch, read through L2 after the arrival's acquire)."""
    G: tl.constexpr = HQ // HKV
    dt = row.dtype.element_ty
    offs_d = tl.arange(0, D_PAD)
    d_mask = offs_d < HEAD_DIM
    offs_g = tl.arange(0, G_PAD)
    offs_s, k_all, v_all = _cache_block(k_base, v_base, 0, S, offs_d, HEAD_DIM, BLOCK_S)
    every = pos >= 0  # (one program per (row, kv head): it holds the position)
    q, k_new, v_new = _token_to_cache(
        row, h, pos, k_base, v_base, every, offs_d, offs_g, qn_ptr, kn_ptr, cos_ptr, sin_ptr, eps, HQ, HKV,
        HEAD_DIM, QK_NORM, ROPE, ROW_CACHE,
    )  # fmt: skip
    m_i, l_i, acc = _softmax_start(G_PAD, D_PAD)
    seen = offs_s < pos
    v_all = tl.where(seen[:, None], v_all, 0.0)  # slots past the context may hold anything
    m_i, l_i, acc = _attend_block(q, k_all, v_all, seen, m_i, l_i, acc, qk_scale, FP32_DOT)
    m_i, l_i, acc = _attend_token(q, k_new, v_new, every, m_i, l_i, acc, qk_scale)
    heads = h * G + offs_g
    o_ptrs = o_row + heads[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptrs, (acc / l_i[:, None]).to(dt), mask=(offs_g < G)[:, None] & d_mask[None, :])


@triton.jit
def _merge_partial(part_o_ptr, part_ml_ptr, slot, mask, offs_d, m_all, l_all, o_all, D_PAD: tl.constexpr):
    """One split's partial (max, sum, unnormalised output at `slot` [G_PAD]) merged into the running state, read
    through L2 (other programs wrote it). Where `mask` is off the loads give (−1e30, 0, 0), which leaves the state
    exactly as it is (its weight is 0, the state's 1)."""
    ms = tl.load(part_ml_ptr + slot * 2, mask=mask, other=-1.0e30, cache_modifier=".cg")
    ls = tl.load(part_ml_ptr + slot * 2 + 1, mask=mask, other=0.0, cache_modifier=".cg")
    ps = tl.load(
        part_o_ptr + slot[:, None] * D_PAD + offs_d[None, :], mask=mask[:, None], other=0.0, cache_modifier=".cg"
    )
    m_next = tl.maximum(m_all, ms)
    a_old = tl.exp2(m_all - m_next)
    a_s = tl.exp2(ms - m_next)
    return m_next, l_all * a_old + ls * a_s, o_all * a_old[:, None] + ps * a_s[:, None]


# What each kernel here may write (kernel_analysis.check_writes holds torch's access analysis to it)
WRITES = {"decode_attention_kernel": frozenset({"kc_ptr", "vc_ptr", "o_ptr", "part_o_ptr", "part_ml_ptr", "ws_ptr"})}


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
    ws_ptr,
    layer,
    S,
    QKV_ROW,
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
    NUM_SPLITS: tl.constexpr,
    MIN_CHUNK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    FP32_DOT: tl.constexpr,
    PDL: tl.constexpr,
    WHOLE: tl.constexpr,
    EARLY_BLOCK: tl.constexpr,
):
    """Grid (B·HKV, NUM_SPLITS). qk_scale = softmax scale · log2(e) (the softmax runs in base 2). D_PAD = the head
    dim padded to ≥ 16 for tl.dot (lanes past HEAD_DIM are masked). NUM_SPLITS == 1: no partials, no workspace.
    FP32_DOT: as in skinny_linear_triton. WHOLE (one split, S ≤ BLOCK_S): the cache is one tile, loaded before
    the position is known (no loop). The last split merges the partials in NUM_SPLITS unrolled, masked steps, so
    every split's loads are in flight at once (a masked step leaves the state exactly as it is; a loop over the
    active splits gave the same bits and took 1.4-2.0 µs more per layer in the VoxCPM2 LMs' chains on the H200,
    bench/results/nvidia-h200/probes/lm_split_norm_cost/). PDL (pdl.py): everything here is written
    by earlier kernels or by this step (qkv, positions, caches, workspace, output buffers), so the wait comes first;
    the early launch of the next kernel (o_proj, which starts loading its weights) is what it buys.
    EARLY_BLOCK (split form; the op's `cache_settled`): each split's first cache block is loaded BEFORE the wait.
    Sound only where no kernel of the stage call's launch chain writes the cache slots before a row's position (one
    decode step per call: earlier calls wrote them); a loop of steps in one graph (the predictors) breaks that."""
    # fp32 scalars whatever the caller passes: AOTInductor types a float argument of a user kernel fp64 (torch's
    # _use_fp64_for_unbacked_floats), which turned the loop-carried softmax state fp64 (H100 AOTI build failed).
    eps = tl.cast(eps, tl.float32)
    qk_scale = tl.cast(qk_scale, tl.float32)
    G: tl.constexpr = HQ // HKV
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // HKV
    h = pid % HKV
    offs_d = tl.arange(0, D_PAD)
    # (layer, b, h, 0, 0). No `.to` on `layer`: Triton specialises an int argument equal to 1 into a constexpr
    # (a plain Python int), which has no `.to` (H100: every layer-1 launch failed to compile under AOTI).
    cache_off = (pid.to(tl.int64) * S + layer * CACHE_LAYER) * HEAD_DIM
    if EARLY_BLOCK and not WHOLE:
        offs_s0, k0, v0 = _cache_block(kc_ptr + cache_off, vc_ptr + cache_off, split, S, offs_d, HEAD_DIM, BLOCK_S)
    token = grid_dependency_wait(PDL, True)
    qkv_ptr += token
    pos_ptr += token
    kc_ptr += token
    vc_ptr += token
    o_ptr += token
    part_o_ptr += token
    part_ml_ptr += token
    ws_ptr += token
    dt = qkv_ptr.dtype.element_ty
    pos = tl.load(pos_ptr + b).to(tl.int32)
    pos = tl.minimum(tl.maximum(pos, 0), S - 1)  # never write or read outside the cache
    k_base = kc_ptr + cache_off
    v_base = vc_ptr + cache_off
    row = qkv_ptr + b.to(tl.int64) * QKV_ROW
    o_row = o_ptr + b.to(tl.int64) * (HQ * HEAD_DIM)
    if WHOLE:
        _whole_cache_head(
            row,
            pos,
            k_base,
            v_base,
            o_row,
            h,
            S,
            qn_ptr,
            kn_ptr,
            cos_ptr,
            sin_ptr,
            eps,
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
            "",
        )
    else:
        # The cache blocks are dealt to the splits in turn: split s holds blocks s, s + n, s + 2n, ... of the
        # row's p + 1 positions, n = the splits in use (NUM_SPLITS, fewer where a split would get under MIN_CHUNK
        # positions: a short context runs in one program). So a split's first block is addressed without the
        # position: its loads go out with the position's (or before the wait, EARLY_BLOCK), where a contiguous
        # chunk's bounds waited for the position.
        if not EARLY_BLOCK:
            offs_s0, k0, v0 = _cache_block(k_base, v_base, split, S, offs_d, HEAD_DIM, BLOCK_S)
        MIN_BLOCKS: tl.constexpr = (MIN_CHUNK + BLOCK_S - 1) // BLOCK_S
        n_blocks = pos // BLOCK_S + 1  # blocks holding positions 0..p
        n_active = tl.minimum(tl.maximum(n_blocks // MIN_BLOCKS, 1), NUM_SPLITS)
        active = split < n_active
        writer = active & ((pos // BLOCK_S) % n_active == split)  # the split holding p

        d_mask = offs_d < HEAD_DIM
        offs_g = tl.arange(0, G_PAD)
        g_mask = offs_g < G
        q, k_new, v_new = _token_to_cache(
            row, h, pos, k_base, v_base, writer, offs_d, offs_g, qn_ptr, kn_ptr, cos_ptr, sin_ptr, eps, HQ, HKV,
            HEAD_DIM, QK_NORM, ROPE, "",
        )  # fmt: skip
        # Cached keys s < p of this split's blocks (none for an inactive split; the first block's slot p and those
        # past it, read as they were, masked out), then this token's key/value (position p) from registers, in the
        # split that holds p; other splits add nothing. An inactive split runs through masked rather than leaving
        # early: the early exit measured slower (H100, b1: base_lm_step 1,169.2 µs against 1,155.3,
        # bench/results/nvidia-h100/probes/attention_early_block/).
        seen = (offs_s0 < pos) & active
        m_i, l_i, acc = _softmax_start(G_PAD, D_PAD)
        m_i, l_i, acc = _attend_block(q, k0, tl.where(seen[:, None], v0, 0.0), seen, m_i, l_i, acc, qk_scale, FP32_DOT)
        m_i, l_i, acc = _attend_dealt(
            q,
            k_base,
            v_base,
            split + n_active,
            tl.where(active, tl.cdiv(pos, BLOCK_S), 0),
            n_active,
            pos,
            m_i,
            l_i,
            acc,
            qk_scale,
            offs_d,
            HEAD_DIM,
            BLOCK_S,
            FP32_DOT,
        )
        m_i, l_i, acc = _attend_token(q, k_new, v_new, writer, m_i, l_i, acc, qk_scale)

        heads = h * G + offs_g
        o_ptrs = o_row + heads[:, None] * HEAD_DIM + offs_d[None, :]
        out_mask = g_mask[:, None] & d_mask[None, :]
        if NUM_SPLITS == 1:
            tl.store(o_ptrs, (acc / l_i[:, None]).to(dt), mask=out_mask)
        else:
            # One active split (a short context): it is the whole answer. (l = 0 only where nothing is stored:
            # inactive splits, padded heads; 1 there keeps the masked lanes finite.)
            l_safe = tl.where(l_i > 0, l_i, 1.0)
            tl.store(o_ptrs, (acc / l_safe[:, None]).to(dt), mask=out_mask & active & (n_active == 1))
            multi = active & (n_active > 1)
            slot = (b * HQ + heads).to(tl.int64) * NUM_SPLITS + split  # [G_PAD]
            tl.store(part_o_ptr + slot[:, None] * D_PAD + offs_d[None, :], acc, mask=g_mask[:, None] & multi)
            tl.store(part_ml_ptr + slot * 2, m_i, mask=g_mask & multi)
            tl.store(part_ml_ptr + slot * 2 + 1, l_i, mask=g_mask & multi)
            tl.debug_barrier()  # every thread's partial is written before the ticket is taken
            ticket = tl.atomic_add(ws_ptr + pid, 1, mask=multi, sem="acq_rel", scope="gpu")
            if multi & (ticket == n_active - 1):
                # The last of the row's splits: merge the partials in split order (deterministic), from L2.
                tl.debug_barrier()
                base = (b * HQ + heads).to(tl.int64) * NUM_SPLITS  # [G_PAD]
                m_all = tl.full([G_PAD], -1.0e30, dtype=tl.float32)
                l_all = tl.zeros([G_PAD], dtype=tl.float32)
                o_all = tl.zeros([G_PAD, D_PAD], dtype=tl.float32)
                for s in tl.static_range(NUM_SPLITS):
                    m_all, l_all, o_all = _merge_partial(
                        part_o_ptr,
                        part_ml_ptr,
                        base + s,
                        g_mask & (s < n_active),
                        offs_d,
                        m_all,
                        l_all,
                        o_all,
                        D_PAD,
                    )
                tl.store(o_ptrs, (o_all / tl.where(l_all > 0, l_all, 1.0)[:, None]).to(dt), mask=out_mask)
                tl.atomic_xchg(ws_ptr + pid, 0, sem="relaxed", scope="gpu")  # the workspace is zero again


# The split form at a fixed config, a rule instead of the autotuner, which times the kernel alone and baked
# different configs for some layers in two base_lm_step builds of one tree
# (bench/results/nvidia-h200/probes/whole_warps_fast_ar/: their calls 1,202.9 and 1,153.7 µs, not settled by that
# call). 8 warps, 2 stages: the fastest of the three former candidates in the VoxCPM2 LMs' layer chains at the
# launcher's plan (B = 1, 9 splits, 512-token context, H200: base LM 12.21 µs a layer against 12.79 at 4 warps /
# 2 stages, residual LM 11.94 against 12.31; bench/results/nvidia-h200/probes/lm_split_norm_cost/attention_chain.txt).
# Heads narrower than 64 (the tiny presets' 8) at 4 warps: their tiles are too small to give 8 warps cp.async
# copies (an sm_90 compile of head dim 8 at 8 warps has none). BLOCK_S, NUM_SPLITS and MIN_CHUNK come from the
# launcher (decode_attention.py).
SPLIT_STAGES = 2
SPLIT_WARPS_WIDE, SPLIT_WARPS_NARROW, SPLIT_WIDE_HEAD = 8, 4, 64
ATTENTION_KEY = ["S", "HQ", "HKV", "HEAD_DIM", "BLOCK_S", "NUM_SPLITS", "MIN_CHUNK", "ROPE", "QK_NORM", "WHOLE"]
decode_attention_split = {
    w: triton.autotune(configs=[triton.Config({}, num_warps=w, num_stages=SPLIT_STAGES)], key=ATTENTION_KEY)(
        decode_attention_kernel
    )
    for w in (SPLIT_WARPS_NARROW, SPLIT_WARPS_WIDE)
}


def split_warps(head_dim: int) -> int:
    """The split form's warps for a head width (the rule above)."""
    return SPLIT_WARPS_WIDE if head_dim >= SPLIT_WIDE_HEAD else SPLIT_WARPS_NARROW


# The whole-cache form (the predictors' short caches) at a fixed warp count (decode_attention.whole_warps: a rule
# by the RoPE form, or the A/B switch): no loop to pipeline, so one stage; one config each, nothing to time. An
# sm_90 compile of the code predictor's case: 5 barriers at 1 warp, 34 at 4 (bench/results/cpu/probes/sm90_compile/).
WHOLE_WARPS = (1, 2, 4, 8)
decode_attention_whole = {
    w: triton.autotune(configs=[triton.Config({}, num_warps=w, num_stages=1)], key=ATTENTION_KEY)(
        decode_attention_kernel
    )
    for w in WHOLE_WARPS
}
