"""The in-kernel split-K reduction shared by the GEMM kernels (conv1d's `_conv_gemm_jit`; skinny_linear's kernel
when its caller passes a zeroed counter workspace).

A split-K launch gives each output tile SPLIT_K programs, each reducing one range of K into an fp32 partial that it
stores in a workspace. Instead of a second (epilogue) launch, every program then counts its arrival in the tile's
int32 counter, and the last to arrive adds the partials in split order (deterministic: the same sums whoever adds
them) and runs the epilogue. That program resets the counter, so counters are zero between launches and one zeroed
buffer serves launch after launch (and graph replay after replay).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def last_to_arrive(counter_ptr, SPLIT_K: tl.constexpr):
    """Count this program's arrival at its tile (after its partial is stored); True in the tile's last program,
    which may then read every partial. The barrier orders all threads' partial stores before the one gpu-scope
    acq_rel atomic (the cooperative-groups grid-sync pattern: bar.sync, then one thread's release); the acquire
    makes the other programs' partials visible to it (read them through L2: cache_modifier=".cg")."""
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    return arrived == SPLIT_K - 1


@triton.jit
def reset_counter(counter_ptr):
    """The last program's reset: the counter is zero again for the next launch or replay."""
    tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
