"""CPU thread count of package calls.

AOTInductor CPU packages are compiled with `cpp.dynamic_threads=True`: their OpenMP regions take the calling
thread's OpenMP thread count at call time (`omp_get_max_threads()`), which `torch.set_num_threads` sets (the
package and torch share torch's bundled libgomp). The runtime sets it around every CPU package call, in the
calling thread, and restores it after: a serving process's own torch setting is left as it was."""

from __future__ import annotations

import torch

# The default of `load(..., cpu_threads=)`: see README "CPU threads" and bench/results/cpu/ for the measurement
# behind it.
DEFAULT_CPU_THREADS: int | None = 1


class cpu_threads_mode:
    """`with cpu_threads_mode(n):` runs the body with n OpenMP threads in this thread; None: no change."""

    def __init__(self, threads: int | None) -> None:
        if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
            raise ValueError(f"cpu_threads must be a positive int or None, got {threads!r}")
        self.threads = threads
        self._saved: list[int] = []  # a stack: calls may nest (a stage calling itself for chunks)

    def __enter__(self):
        if self.threads is not None:
            before = torch.get_num_threads()
            self._saved.append(before)
            if before != self.threads:
                torch.set_num_threads(self.threads)
        return self

    def __exit__(self, *exc):
        if self.threads is not None:
            before = self._saved.pop()
            if torch.get_num_threads() != before:
                torch.set_num_threads(before)
