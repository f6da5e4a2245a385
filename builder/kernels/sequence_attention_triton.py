"""Triton kernel of `ttsaot::sequence_attention` (semantics: sequence_attention.py).

Imported by the launcher on first use, like decode_attention_triton.py.

Program (sequence n, query head h): the whole T × T attention of one head of one short sequence in registers. q and
its kv head's k (GQA: kv head h // (Hq/Hkv), no repeat_interleave) are read from the fused projection's rows and
rotated on the way in (the decode kernel's `_norm_rope`, one position per token), v read as is; scores q·kᵀ on the
tensor cores in fp32, softmax in fp32 (exp2), probabilities rounded to the compute dtype, · v in fp32, one rounding
at the store. Tokens are padded to T_PAD ≥ 16 (tl.dot's minimum): padded query rows are zero and never stored,
padded key columns are masked out, so no NaN reaches a stored row.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .decode_attention_triton import _norm_rope
from .pdl_triton import grid_dependency_wait

LOG2E = 1.4426950408889634


@triton.jit
def _attend(q, k, v, keys, scale_log2, FP32_DOT: tl.constexpr):
    """softmax(q·kᵀ · scale) · v of one head's rows in fp32: [R, hd] q, k, v in the compute dtype, `keys` [R, R] the
    keys each query row sees. Scores on the tensor cores in fp32, softmax in fp32 (exp2), probabilities rounded to
    the compute dtype, · v accumulated in fp32 (returned unrounded). A row that sees no key (padding) gets zeros."""
    dt = q.dtype
    if FP32_DOT:  # fp32 stages, and the interpreter (which multiplies 16-bit operands as raw integers)
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(keys, s * scale_log2, float("-inf"))
    mx = tl.max(s, axis=1)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    p = tl.where(keys, tl.exp2(s - mx[:, None]), 0.0)
    den = tl.sum(p, axis=1)
    p = (p / tl.where(den > 0, den, 1.0)[:, None]).to(dt)
    if FP32_DOT:
        return tl.dot(p.to(tl.float32), v.to(tl.float32), input_precision="ieee")
    return tl.dot(p, v)


# What each kernel here may write (kernel_analysis.check_writes holds torch's access analysis to it)
WRITES = {"sequence_attention_kernel": frozenset({"o_ptr"})}


@triton.jit
def sequence_attention_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    o_ptr,
    T,
    row_stride,
    scale_log2,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    T_PAD: tl.constexpr,
    ROPE: tl.constexpr,
    FP32_DOT: tl.constexpr,
    PDL: tl.constexpr,
):
    n = tl.program_id(0)
    h = tl.program_id(1)
    # PDL: let the dependent (o_proj) grid launch, wait for the qkv projection; everything read or written after.
    token = grid_dependency_wait(PDL, True)
    dt = qkv_ptr.dtype.element_ty
    kvh = h // (HQ // HKV)
    offs_t = tl.arange(0, T_PAD)
    t_mask = offs_t < T
    offs_d = tl.arange(0, HEAD_DIM)
    rows = (n * T + offs_t) * row_stride + token  # each token's fused row, in elements
    # positions clamped into the table: padded rows read row T-1 of it (their q/k are zero anyway)
    pos = tl.minimum(offs_t, T - 1)[:, None]
    q_rows = rows + h * HEAD_DIM
    q = _norm_rope(qkv_ptr, q_rows, offs_d, t_mask, qkv_ptr, cos_ptr, sin_ptr, pos, 0.0, False, ROPE, HEAD_DIM, "")
    k_rows = rows + (HQ + kvh) * HEAD_DIM
    k = _norm_rope(qkv_ptr, k_rows, offs_d, t_mask, qkv_ptr, cos_ptr, sin_ptr, pos, 0.0, False, ROPE, HEAD_DIM, "")
    v_rows = rows + (HQ + HKV + kvh) * HEAD_DIM
    v = tl.load(qkv_ptr + v_rows[:, None] + offs_d[None, :], mask=t_mask[:, None], other=0.0)
    keys = tl.broadcast_to(t_mask[None, :], (T_PAD, T_PAD))
    o = _attend(q, k, v, keys, scale_log2, FP32_DOT)
    out = o_ptr + token + ((n * T + offs_t) * (HQ * HEAD_DIM) + h * HEAD_DIM)[:, None] + offs_d[None, :]
    tl.store(out, o.to(dt), mask=t_mask[:, None])
