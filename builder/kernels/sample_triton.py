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


def warps(block_v: int) -> int:
    """Warps per program: ~8 row values per thread, for the sort and the radix select alike. H200, one row alone, a
    CUDA graph of 16 draws, random rows (bench/results/nvidia-h200/probes/sampler_radix4/call2/sampler_warps.txt):
    the sort at V = 1024 / 2048 takes 6.5 / 13.7 µs at 4 / 8 warps (12.0 / 21.8 at half as many); the radix select
    (two-bit top-k, a two-bit top-p since reverted) 14.2 / 18.0 / 27.7 µs at 4 / 8 / 16 warps for V = 1024 / 2048 /
    4096, 26.1 / 27.1 / 30.5 at half as many (the H100 had preferred 8 warps at 4096 for the one-bit search:
    23.6 µs, 25.1 at 16, nvidia-h100/probes/sampler_warps/)."""
    return max(1, min(16, block_v // 256))


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


# Counts packed three to an int64 (21 bits each: rows of up to 2^21 tokens, far above MAX_VOCAB), so that one
# reduction answers a radix-4 digit's three comparisons.
# (Module globals a jit function reads must be `tl.constexpr(...)` objects; the interpreter also takes plain ints.)
COUNT_BITS = tl.constexpr(21)
COUNT_MASK = tl.constexpr((1 << 21) - 1)


@triton.jit
def _counts_at_least(key, base, step):
    """count(key ≥ base + j·step) for j = 1, 2, 3: one packed int64 reduction."""
    one = tl.full([], 1, tl.int64)
    packed = tl.sum(
        (key >= base + step).to(tl.int64)
        + ((key >= base + 2 * step).to(tl.int64) << COUNT_BITS)
        + ((key >= base + 3 * step).to(tl.int64) << (2 * COUNT_BITS)),
        axis=0,
    )
    return packed & (COUNT_MASK * one), (packed >> COUNT_BITS) & (COUNT_MASK * one), packed >> (2 * COUNT_BITS)


@triton.jit
def _kept_by_radix(scaled, valid, k, top_p, V):
    """The kept set from thresholds found by radix select over the values' ordered keys (module docstring). The
    top-k threshold two bits per round: a round compares every key with the three candidates of its next base-4
    digit at once (one packed reduction, `_counts_at_least`) and keeps the largest that still qualifies, 16 rounds
    where one bit per round took 32. A threshold the row does not ask for is not searched: top-k off (k = V) keeps
    every key, top-p off (p ≥ 1) skips the mass search."""
    key = tl.where(valid, _ordered_key(scaled), -1)  # padding: below every key, never counted

    # top-k: the largest K with count(key ≥ K) ≥ k, base-4 digits from the top
    kth = tl.zeros([], dtype=tl.int64)
    if k < V:
        for shift in tl.static_range(30, -1, -2):
            n1, n2, n3 = _counts_at_least(key, kth, tl.full([], 1 << shift, tl.int64))
            digit = (n1 >= k).to(tl.int64) + (n2 >= k).to(tl.int64) + (n3 >= k).to(tl.int64)
            kth += digit << shift
    one = tl.full([], 1, tl.int64)
    packed = tl.sum((key > kth).to(tl.int64) + ((key == kth).to(tl.int64) << COUNT_BITS), axis=0)
    above = packed & (COUNT_MASK * one)
    tied = packed >> COUNT_BITS
    # softmax over the k sorted entries: tokens tied at the boundary share the (k − above) places left to them
    # (k = V: kth = 0 is below every valid key, so above = V and nothing is tied)
    m = tl.max(tl.where(valid, scaled, float("-inf")), axis=0)
    e = tl.where(key >= kth, tl.exp(scaled - m), 0.0)
    e = tl.where(key == kth, e * ((k - above).to(tl.float32) / tl.maximum(tied, 1).to(tl.float32)), e)
    probs = e / tl.sum(e, axis=0)

    # top-p: the largest K whose mass of values ≥ K is ≥ p; clamped to the largest value (the first token is kept).
    # One bit per round: a mass cannot be packed as the counts are, and three sums per round cost more than the
    # rounds they save (H200, V = 2048, top-k 30 + top-p 0.9: 27.4 µs where one bit per round took 20.1,
    # bench/results/nvidia-h200/probes/sampler_radix4/call2).
    threshold = kth
    if top_p < 1.0:
        pth = tl.zeros([], dtype=tl.int64)
        for bit in tl.static_range(31, -1, -1):
            cand = pth + (1 << bit)
            if tl.sum(tl.where(key >= cand, probs, 0.0), axis=0) >= top_p:
                pth = cand
        pth = tl.minimum(pth, tl.max(key, axis=0))
        threshold = tl.maximum(pth, kth)
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
    # the noise is independent of the thresholds: its load is issued with the row's, not after the search
    u = tl.load(u_ptr + row * u_row_stride + offs, mask=valid, other=0.5).to(tl.float32)
    t = tl.load(t_ptr + row).to(tl.float32)
    top_k = tl.load(k_ptr + row).to(tl.int32)
    k = tl.where((top_k <= 0) | (top_k > V), V, top_k)
    top_p = tl.load(p_ptr + row).to(tl.float32)
    if t <= 0.0:
        # greedy: the logits' argmax (first of equals, as torch.argmax); no thresholds to search
        token = tl.argmax(x, axis=0)
    else:
        scaled = x / t
        kept = valid
        if SORT:
            # rows with top-p: the sort (the mass search one bit per round is slower); top-k alone: the radix select
            if top_p < 1.0:
                kept = _kept_by_sort(scaled, offs, valid, k, top_p)
            else:
                kept = _kept_by_radix(scaled, valid, k, top_p, V)
        else:
            kept = _kept_by_radix(scaled, valid, k, top_p, V)
        # Gumbel-max over the kept set of the unsorted row
        u = tl.minimum(tl.maximum(u, U_MIN), U_MAX)  # constexpr bounds: AOTI would pass float arguments as fp64
        noisy = tl.where(kept, scaled - tl.log(-tl.log(u)), float("-inf"))
        token = tl.argmax(noisy, axis=0)
    tl.store(out_ptr + row, token.to(tl.int64))
