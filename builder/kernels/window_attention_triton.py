"""Triton kernel of `ttsaot::window_attention` (semantics: window_attention.py).

Imported by the launcher on first use, like sequence_attention_triton.py.

Program (query block, batch × head): its BLOCK_M queries [m0, m0 + BLOCK_M) see keys (m0 − window, m0 + BLOCK_M),
so it visits only the key blocks of that range (a 864-token sequence with a 512 window: ≤ 9 of 14 blocks at 64).
Per key block: scores on the tensor cores, the window and causal mask, an online softmax in fp32 (running max and
sum, exp2 of log2e-scaled scores), the probabilities · v accumulated in fp32; one division and one store at the end.
Every real query row sees at least itself, so the finite initial max never meets an all-masked real row; padded
query rows (≥ T) are never stored."""

from __future__ import annotations

import triton
import triton.language as tl

from .conv1d import _rn_tf32

LOG2E = 1.4426950408889634


# Tuned per shape at AOTI compile time (one config baked into each package). With 64 × 64 tiles the DAC encoder's
# 864-token layers ran 60 µs (224 programs: 1.7 waves on 132 SMs) and its quantizer's 216-token layers 18 µs (64
# programs); 32-query tiles give those shapes 432 / 112 programs.
CONFIGS = [
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=2),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=2, num_stages=3),
]


def _prune(configs, named_args, **kwargs):
    """fp32 products at D = 128: no 64-key steps (tf32x3 splits each operand in two, which doubles the registers a
    tile holds)."""
    meta = {**named_args, **kwargs}
    if meta["FP32_DOT"] and meta["HEAD_DIM"] > 64:
        return [c for c in configs if c.kwargs["BLOCK_N"] <= 32]
    return configs


def interpreter_tiles(head_dim: int) -> dict[str, int]:
    """The interpreter's one launch (it multiplies in fp32 whatever the dtype; autotuning would only time the
    interpreter): the first of CONFIGS that `_prune` keeps."""
    return _prune(CONFIGS, {"FP32_DOT": True, "HEAD_DIM": head_dim})[0].kwargs


# What each kernel here may write (kernel_analysis.check_writes holds torch's access analysis to it)
WRITES = {"window_attention_kernel": frozenset({"o_ptr"})}


@triton.jit
def window_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    T,
    H,
    window,
    scale_log2,
    sq_b,
    sq_t,
    sq_h,
    sk_b,
    sk_t,
    sk_h,
    sv_b,
    sv_t,
    sv_h,
    HEAD_DIM: tl.constexpr,
    PRECISION: tl.constexpr,
    FP32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # fp32 whatever the caller passes: AOTInductor types a float argument of a user kernel fp64
    scale_log2 = tl.cast(scale_log2, tl.float32)
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    dt = q_ptr.dtype.element_ty
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    m_mask = offs_m < T
    q = tl.load(
        q_ptr + b * sq_b + h * sq_h + offs_m.to(tl.int64)[:, None] * sq_t + offs_d[None, :],
        mask=m_mask[:, None],
        other=0.0,
    )
    if FP32_DOT:
        q = q.to(tl.float32)
        if PRECISION == "tf32":
            q = _rn_tf32(q)
    k_base = k_ptr + b * sk_b + h * sk_h
    v_base = v_ptr + b * sv_b + h * sv_h
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # finite: exp2(m_old − m_new) stays 0 or 1, never NaN
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    lo = (tl.maximum(m0 - window + 1, 0) // BLOCK_N) * BLOCK_N
    hi = tl.minimum(m0 + BLOCK_M, T)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < T
        kv_rows = offs_n.to(tl.int64)[:, None]
        k = tl.load(k_base + kv_rows * sk_t + offs_d[None, :], mask=n_mask[:, None], other=0.0)
        v = tl.load(v_base + kv_rows * sv_t + offs_d[None, :], mask=n_mask[:, None], other=0.0)
        if FP32_DOT:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
            if PRECISION == "tf32":  # round to the nearest TF32 value, as cuDNN does (the tensor cores truncate)
                k = _rn_tf32(k)
                v = _rn_tf32(v)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        else:
            s = tl.dot(q, tl.trans(k))
        visible = (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] > offs_m[:, None] - window) & n_mask[None, :]
        s = tl.where(visible, s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        if FP32_DOT:
            if PRECISION == "tf32":
                p = _rn_tf32(p)
            acc = tl.dot(p, v, acc, input_precision=PRECISION)
        else:
            acc = tl.dot(p.to(dt), v, acc)
        m_i = m_new
    o = acc / tl.where(m_mask, l_i, 1.0)[:, None]  # padded rows may have seen no key (l = 0)
    out = o_ptr + ((b * T + offs_m.to(tl.int64)) * (H * HEAD_DIM) + h * HEAD_DIM)[:, None] + offs_d[None, :]
    tl.store(out, o.to(dt), mask=m_mask[:, None])


window_attention_autotuned = triton.autotune(
    configs=CONFIGS,
    key=["T", "H", "window", "HEAD_DIM", "PRECISION", "FP32_DOT"],
    prune_configs_by={"early_config_prune": _prune},
)(window_attention_kernel)
