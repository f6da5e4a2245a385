"""Triton kernel of `ttsaot::sequence_attention_o` (semantics: sequence_attention_o.py).

Imported by the launcher on first use, like sequence_attention_triton.py.

Program (column tile, head range): o_proj's BLOCK_N output columns over HEADS_PER_SPLIT query heads' part of K. For
each head of its range it first computes that head's attention for every row of the call at once: all sequences'
tokens in one [BLOCK_M, BLOCK_M] score tile, block-diagonal by sequence (a token sees its own sequence's T tokens),
q and k rotated on the way in (the decode kernel's `_norm_rope`, NeoX, fp32), scores and softmax in fp32,
probabilities rounded to the compute dtype, · v in fp32 and the head's output rounded once, as
`sequence_attention_kernel` rounds it. Then that head's [BLOCK_M, head_dim] · W[cols, head]ᵀ on the tensor cores
into the tile's fp32 accumulator. Every column tile recomputes its heads' attention (a few KFLOP a head): the price
of dropping the attention's launch, its programmatic-launch wait and o's round trip through memory.

SPLIT == 1: the tile's epilogue (bias, residual) writes y; else fp32 partials [SPLIT, M, N_OUT] that the op's second
pass (`norm_out_epilogue_kernel`) adds in split order. Padded rows (≥ M) see no key: their probabilities are 0 and
nothing of them is stored.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .decode_attention_triton import _norm_rope
from .pdl_triton import grid_dependency_wait
from .sequence_attention_triton import _attend
from .skinny_linear_triton import _epilogue, _mma

# What each kernel here may write (kernel_analysis.check_writes holds torch's access analysis to it)
WRITES = {"sequence_attention_o_kernel": frozenset({"y_ptr", "part_ptr"})}


@triton.jit
def sequence_attention_o_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    w_ptr,
    b_ptr,
    r_ptr,
    y_ptr,
    part_ptr,
    M,
    T,
    QKV_ROW,
    N_OUT,
    K,
    scale_log2,
    residual_scale,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PER_SPLIT: tl.constexpr,
    SPLIT: tl.constexpr,
    ROPE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FP32_DOT: tl.constexpr,
    PDL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Grid (cdiv(N_OUT, BLOCK_N), SPLIT): o_proj columns × head ranges."""
    residual_scale = tl.cast(residual_scale, tl.float32)  # AOTI passes floats as fp64
    scale_log2 = tl.cast(scale_log2, tl.float32)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    # PDL: let the dependent (the second pass) launch, wait for the qkv projection; everything read or written after
    token = grid_dependency_wait(PDL, True)
    dt = qkv_ptr.dtype.element_ty
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    seq = offs_m // T
    pos = (offs_m % T)[:, None]
    same = (seq[:, None] == seq[None, :]) & m_mask[None, :]  # a token attends to its own sequence's tokens
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N_OUT
    rows = offs_m * QKV_ROW + token
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for i in range(HEADS_PER_SPLIT):
        h = pid_k * HEADS_PER_SPLIT + i
        kvh = h // (HQ // HKV)
        q = _norm_rope(qkv_ptr, rows + h * HEAD_DIM, offs_d, m_mask, qkv_ptr, cos_ptr, sin_ptr, pos, 0.0, False, ROPE,
                       HEAD_DIM, "")  # fmt: skip
        k = _norm_rope(qkv_ptr, rows + (HQ + kvh) * HEAD_DIM, offs_d, m_mask, qkv_ptr, cos_ptr, sin_ptr, pos, 0.0,
                       False, ROPE, HEAD_DIM, "")  # fmt: skip
        v_rows = rows + (HQ + HKV + kvh) * HEAD_DIM
        v = tl.load(qkv_ptr + v_rows[:, None] + offs_d[None, :], mask=m_mask[:, None], other=0.0)
        o = _attend(q, k, v, same, scale_log2, FP32_DOT)  # padded rows see no key: zeros
        # the head's W columns after its attention (loaded first, they held registers the attention then spilled)
        w = tl.load(
            w_ptr + offs_n.to(tl.int64)[:, None] * K + (h * HEAD_DIM + offs_d)[None, :], mask=n_mask[:, None], other=0.0
        )
        acc = _mma(o.to(dt), w, acc, FP32_DOT)
    if SPLIT > 1:
        part = part_ptr + token + (pid_k * M + offs_m)[:, None] * N_OUT + offs_n[None, :]
        tl.store(part, acc, mask=m_mask[:, None] & n_mask[None, :])
    else:
        _epilogue(acc, acc, offs_m, offs_n, m_mask, n_mask, b_ptr, r_ptr + token, y_ptr + token, N_OUT,
                  residual_scale, HAS_BIAS, False, True)  # fmt: skip
