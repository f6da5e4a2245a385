"""L2 prefetch of the NEXT op's weights from inside the current kernel (used by skinny_linear and decode_attention).

A decode step is a chain of short bandwidth-bound kernels (H100, bench/results/nvidia-h100/kernel_configs.json:
each GEMV streams at the rate of a copy of the same bytes, 94-110%, yet the step sits at 1.8x its byte floor):
between two kernels of the chain HBM idles through the tail of one, the launch gap and the ramp of the next, and
through the whole of the latency-bound attention. A kernel given `prefetch` issues `prefetch.global.L2` for the
first `n_elems` elements of that tensor (the next projection's weight), spread over all its programs, so those
lines arrive while HBM would otherwise idle and the next kernel finds them in L2. Results never depend on it: a
prefetch moves no data into registers and changes nothing in memory.

PTX only: Triton's CPU interpreter has no inline assembly, so the launchers pass PREFETCH=False off-GPU (the tests
there check that the argument threads through and changes nothing; the GPU bench times it).
"""

from __future__ import annotations

import triton
import triton.language as tl

LINE_BYTES = 128  # one prefetch per L2 line (the GPU's cache line; sectors are 32 B)
PREFETCH_BLOCK = tl.constexpr(1024)  # lines per loop step of one program


@triton.jit
def prefetch_l2(ptr, n_elems, pid, n_programs, LINE_ELEMS: tl.constexpr, BLOCK: tl.constexpr):
    """Program `pid` of `n_programs` prefetches its contiguous share of the lines of ptr[0 : n_elems] into L2."""
    n_lines = tl.cdiv(n_elems, LINE_ELEMS)
    per = tl.cdiv(n_lines, n_programs)
    lo = pid * per
    hi = tl.minimum(lo + per, n_lines)
    for start in range(lo, hi, BLOCK):
        lines = start + tl.arange(0, BLOCK)
        lines = tl.where(lines < hi, lines, lo)  # no mask on inline asm: an extra prefetch of line `lo` is harmless
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;",
            "=r,l",
            [ptr + lines.to(tl.int64) * LINE_ELEMS],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
