"""Triton kernel of `ttsaot::sample_tokens` (semantics: sample.py). One program per row: the kept set (top-k, then
top-p) from the row held in registers, then the Gumbel-max draw over the unsorted row. Two ways to the kept set,
chosen per vocabulary by `use_sort` from what the H100 measured inside the predictors' graphs (one draw, one row):
- SORT (V ≤ SORT_MAX_VOCAB): the row sorted in registers (`tl.sort`, bitonic) and the thresholds read off it as the
  reference does: 35 µs per draw at V = 2048 in the code_predictor (3.21 ms per frame), where the radix select
  below took 40 µs (3.38 ms) and a 2-bit radix with [4, V] reductions 79 µs;
- radix select (larger V): no sort; the thresholds are found by bisection over the values' ordered keys, one bit
  per masked reduction (2 × 32 of them): 38 and 19.8 µs per draw at V = 4096 in two fast_ar builds; alone, 23.5 µs
  where the sort took 53 µs (bench/results/nvidia-h100/probes/predictor_copies/, calls 1, 3 and 6).

The radix select's sets, as the reference computes them from the sorted row (ordered = values in descending order,
k = top-k, e = exp(value − max) over the first k sorted entries, mass_before = the cumulative softmax mass before a
position):
- top-k: the k-th largest value v_k = the largest key K with count(key ≥ K) ≥ k. The softmax runs over exactly k
  entries: values tied with v_k at the boundary count (k − count(key > K)) times, so each tied token is weighted by
  that many over their number;
- top-p: the threshold is the value of the last sorted position whose mass before it is < p; grouping equal values,
  that is the largest key K whose mass of kept values ≥ K is ≥ p (a group is kept iff the mass strictly above it is
  < p); p ≤ 0 keeps the largest value only (the reference's n ≥ 1).
Both add the masses in another order than aten's cumsum: a row whose mass equals p to the last ulp may keep one
group more or less (as Inductor's fusion of the aten path may too).
"""

from __future__ import annotations

import triton
import triton.language as tl

SORT_MAX_VOCAB = 2048


def use_sort(block_v: int) -> bool:
    """Whether rows of this (power-of-2) width take the sort (module docstring: what the H100 measured)."""
    return block_v <= SORT_MAX_VOCAB


def warps(block_v: int, sort: bool) -> int:
    """Warps per program: ~8 row values per thread for the sort, ~16 for the radix select. Measured alone on the
    H100 (one row, a CUDA graph of 16 draws, bench/results/nvidia-h100/probes/sampler_warps/): the sort at V = 1024
    takes 24.9 / 12.0 / 7.1 / 7.2 µs at 1 / 2 / 4 / 8 warps, at V = 2048 58.4 / 35.7 / 21.8 / 14.4 / 14.3 µs at 1-16
    warps (the rule was 16 values per thread: 2 and 4 warps); the radix select at V = 4096 is fastest at 8 warps
    (23.6 µs; 38.5 at 4, 25.1 at 16)."""
    return max(1, min(16, block_v // (256 if sort else 512)))


@triton.jit
def _ordered_key(x):
    """fp32 → int64 in [0, 2^32) with the order of the values (−0.0 and +0.0 map together)."""
    bits = (x + 0.0).to(tl.int32, bitcast=True)  # + 0.0: −0.0 becomes +0.0
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # arithmetic shift: negative floats flip their magnitude bits
    return key.to(tl.int64) + 2147483648


@triton.jit
def _kept_by_sort(scaled, offs, valid, k, top_p):
    """The kept set from the row sorted in registers (`tl.sort`, bitonic), as the reference computes it."""
    ordered = tl.sort(scaled, descending=True)  # padding (-inf) sorts last and is never in the top k
    in_k = offs < k
    e = tl.where(in_k, tl.exp(ordered - tl.max(ordered, axis=0)), 0.0)
    probs = e / tl.sum(e, axis=0)
    mass_before = tl.cumsum(probs, axis=0) - probs
    n_p = tl.sum(((mass_before < top_p) & in_k).to(tl.int32), axis=0)
    n = tl.maximum(tl.where(top_p >= 1.0, k, tl.minimum(k, n_p)), 1)  # kept prefix length
    smallest = tl.max(tl.where(offs == n - 1, ordered, float("-inf")), axis=0)
    return valid & (scaled >= smallest)


@triton.jit
def _kept_by_radix(scaled, valid, k, top_p):
    """The kept set from thresholds found by radix select over the values' ordered keys (module docstring)."""
    key = tl.where(valid, _ordered_key(scaled), -1)  # padding: below every key, never counted

    # top-k: the largest K with count(key ≥ K) ≥ k, one bit at a time from the top
    kth = tl.zeros([], dtype=tl.int64)
    for bit in tl.static_range(31, -1, -1):
        cand = kth + (1 << bit)
        if tl.sum((key >= cand).to(tl.int32), axis=0) >= k:
            kth = cand
    above = tl.sum((key > kth).to(tl.int32), axis=0)
    tied = tl.sum((key == kth).to(tl.int32), axis=0)
    # softmax over the k sorted entries: tokens tied at the boundary share the (k − above) places left to them
    m = tl.max(tl.where(valid, scaled, float("-inf")), axis=0)
    e = tl.where(key >= kth, tl.exp(scaled - m), 0.0)
    e = tl.where(key == kth, e * ((k - above).to(tl.float32) / tied.to(tl.float32)), e)
    probs = e / tl.sum(e, axis=0)

    # top-p: the largest K whose mass of values ≥ K is ≥ p; clamped to the largest value (the first token is kept)
    pth = tl.zeros([], dtype=tl.int64)
    for bit in tl.static_range(31, -1, -1):
        cand = pth + (1 << bit)
        if tl.sum(tl.where(key >= cand, probs, 0.0), axis=0) >= top_p:
            pth = cand
    pth = tl.minimum(pth, tl.max(key, axis=0))
    threshold = tl.where(top_p >= 1.0, kth, tl.maximum(pth, kth))
    return valid & (key >= threshold)


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
    SORT: tl.constexpr,
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
    if SORT:
        kept = _kept_by_sort(scaled, offs, valid, k, top_p)
    else:
        kept = _kept_by_radix(scaled, valid, k, top_p)

    # Gumbel-max over the kept set of the unsorted row
    u = tl.load(u_ptr + row * u_row_stride + offs, mask=valid, other=0.5).to(tl.float32)
    u = tl.minimum(tl.maximum(u, U_MIN), U_MAX)  # constexpr bounds: AOTI would pass float arguments as fp64
    noisy = tl.where(kept, scaled - tl.log(-tl.log(u)), float("-inf"))
    drawn = tl.argmax(noisy, axis=0)
    best = tl.argmax(x, axis=0)  # greedy: the logits' argmax (first of equals, as torch.argmax)
    tl.store(out_ptr + row, tl.where(greedy, best, drawn).to(tl.int64))
