"""Triton kernel of `ttsaot::sample_tokens` (semantics: sample.py). One program per row: the kept set (top-k, then
top-p) from the row held in registers, then the Gumbel-max draw over the unsorted row. The work follows what the row
asks for (H200, one row alone, a CUDA graph of 16 draws, bench/results/nvidia-h200/probes/sampler_radix4/):
- greedy rows (temperature ≤ 0): the logits' argmax only, 1.6-1.9 µs at V = 1024-4096 (the kept set used to be
  found and thrown away: 7.0 / 14.7 / 23.3 µs; call3);
- the radix select (below) searches only the thresholds the row sets: top-k off (k ≤ 0 or ≥ V) and top-p off
  (p ≥ 1) each skip their 32 reductions;
- SORT (V ≤ SORT_MAX_VOCAB): rows with top-p take the row sorted in registers (`tl.sort`, bitonic) and the
  thresholds read off it as the reference does (6.7 / 14.1 µs at V = 1024 / 2048 with top-k 30 + top-p 0.9, where
  the radix select took 13.5 / 17.2); rows without top-p take the radix select (Qwen's top-k 50 at V = 2048: 9.1 µs
  where the sort took 14.6);
- larger V: the radix select throughout (V = 4096: 24.5 µs with both thresholds, 14.0-15.0 with one, at 16 warps;
  `warps` now gives it 8).
The H100 had chosen the sort up to 2048 from the predictors' graphs when every row searched both thresholds: 35 µs
per draw at V = 2048 in the code_predictor, the radix select 40 µs, a 2-bit radix with [4, V] reductions 79 µs;
alone at V = 4096, the radix select 23.5 µs where the sort took 53 (bench/results/nvidia-h100/probes/
predictor_copies/). Two bits per round, three counts packed in one int64 reduction, halved the top-k search's
rounds but not its time (each int64 reduction cost about two int32 ones; V = 2048, top-k 50: 9.3 against 9.1 µs
with one bit per round, V = 4096: 15.4 against 14.0; sampler_radix4/call4), and three mass sums per round cost
more than the rounds they saved (call2).

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
    """Whether rows of this (power-of-2) width with top-p take the sort (module docstring)."""
    return block_v <= SORT_MAX_VOCAB


def warps(block_v: int) -> int:
    """Warps per program: ~8 row values per thread up to 8 warps, for the sort and the radix select alike. H200, one
    row alone, a CUDA graph of 16 draws (bench/results/nvidia-h200/probes/sampler_radix4/): the sort at V = 1024 /
    2048 takes 6.5 / 13.7 µs at 4 / 8 warps (12.0 / 21.8 at half as many; call2); the radix select at V = 1024 /
    2048 14.2 / 18.0 µs at 4 / 8 warps (26.1 / 27.1 at half as many; call2, the two-bit variant), at V = 4096
    13.3 / 22.7 µs at 8 warps under Qwen's top-k 50 / Fish's top-k 30 + top-p 0.9 where 16 took 14.0 / 24.5
    (call4; the H100 too had found 8 fastest there: 23.6 µs, 25.1 at 16, nvidia-h100/probes/sampler_warps/).
    Above 4096 unmeasured."""
    return max(1, min(8, block_v // 256))


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
def _kept_by_radix(scaled, valid, k, top_p, V):
    """The kept set from thresholds found by radix select over the values' ordered keys (module docstring), one bit
    per masked reduction. A threshold the row does not ask for is not searched: top-k off (k = V) keeps every key,
    top-p off (p ≥ 1) skips the mass search."""
    key = tl.where(valid, _ordered_key(scaled), -1)  # padding: below every key, never counted

    # top-k: the largest K with count(key ≥ K) ≥ k, one bit at a time from the top
    kth = tl.zeros([], dtype=tl.int64)
    if k < V:
        for bit in tl.static_range(31, -1, -1):
            cand = kth + (1 << bit)
            if tl.sum((key >= cand).to(tl.int32), axis=0) >= k:
                kth = cand
    above = tl.sum((key > kth).to(tl.int32), axis=0)
    tied = tl.sum((key == kth).to(tl.int32), axis=0)
    # softmax over the k sorted entries: tokens tied at the boundary share the (k − above) places left to them
    # (k = V: kth = 0 is below every valid key, so above = V and nothing is tied)
    m = tl.max(tl.where(valid, scaled, float("-inf")), axis=0)
    e = tl.where(key >= kth, tl.exp(scaled - m), 0.0)
    e = tl.where(key == kth, e * ((k - above).to(tl.float32) / tl.maximum(tied, 1).to(tl.float32)), e)
    probs = e / tl.sum(e, axis=0)

    # top-p: the largest K whose mass of values ≥ K is ≥ p; clamped to the largest value (the first token is kept).
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


# What each kernel here may write (kernel_analysis.check_writes holds torch's access analysis to it)
WRITES = {"sample_tokens_kernel": frozenset({"out_ptr"})}


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
