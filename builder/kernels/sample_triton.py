"""Triton kernel of `ttsaot::sample_tokens` (semantics: sample.py). One program per row: the row's scaled logits
sorted in registers, the top-k/top-p threshold from the sorted values, the Gumbel-max draw over the unsorted row."""

from __future__ import annotations

import triton
import triton.language as tl


def warps(block_v: int) -> int:
    """Warps per program: ≤ 16 row values per thread and tensor (the sort and the scans keep several alive)."""
    return max(1, min(16, block_v // 512))


@triton.jit
def sample_tokens_kernel(
    logits_ptr,
    u_ptr,
    t_ptr,
    k_ptr,
    p_ptr,
    out_ptr,
    V,
    logits_row_stride,
    u_row_stride,
    U_MIN: tl.constexpr,
    U_MAX: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_V)
    valid = offs < V
    x = tl.load(logits_ptr + row * logits_row_stride + offs, mask=valid, other=float("-inf")).to(tl.float32)
    t = tl.load(t_ptr + row).to(tl.float32)
    greedy = t <= 0.0
    scaled = x / tl.where(greedy, 1.0, t)
    top_k = tl.load(k_ptr + row).to(tl.int32)
    k = tl.where((top_k <= 0) | (top_k > V), V, top_k)
    top_p = tl.load(p_ptr + row).to(tl.float32)
    # top-k then top-p on the row sorted in descending order (padding, -inf, sorts last and is never in the top k)
    ordered = tl.sort(scaled, descending=True)
    in_k = offs < k
    e = tl.where(in_k, tl.exp(ordered - tl.max(ordered, axis=0)), 0.0)
    probs = e / tl.sum(e, axis=0)
    mass_before = tl.cumsum(probs, axis=0) - probs
    n_p = tl.sum(((mass_before < top_p) & in_k).to(tl.int32), axis=0)
    n = tl.maximum(tl.where(top_p >= 1.0, k, tl.minimum(k, n_p)), 1)  # kept prefix length
    threshold = tl.max(tl.where(offs == n - 1, ordered, float("-inf")), axis=0)  # its smallest value
    # Gumbel-max over the kept set of the unsorted row
    u = tl.load(u_ptr + row * u_row_stride + offs, mask=valid, other=0.5).to(tl.float32)
    u = tl.minimum(tl.maximum(u, U_MIN), U_MAX)  # constexpr bounds: AOTI would pass float arguments as fp64
    noisy = tl.where(valid & (scaled >= threshold), scaled - tl.log(-tl.log(u)), float("-inf"))
    drawn = tl.argmax(noisy, axis=0)
    best = tl.argmax(x, axis=0)  # greedy: the logits' argmax (first of equals, as torch.argmax)
    tl.store(out_ptr + row, tl.where(greedy, best, drawn).to(tl.int64))
