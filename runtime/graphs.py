"""The one CUDA-graph capture/replay primitive: every captured callable (a bucket package, an LM package bound to
one KV cache, a bench variant) goes through :class:`StaticGraph`.

Recipe (AOTI.md §3): static input buffers owned by the caller; warm-up call(s) on a side stream (lazy cubin
loads and allocator growth must happen before capture; one side stream per device for every warm-up, see
`warmup_stream`); capture of one call into the given memory pool (graphs
of one stage share a pool, captured largest first); replay writes the same static outputs every time, so callers
copy what they keep before the next replay.

Pool reserve. The caching allocator backs each large request of a capture with its own cudaMalloc'd segment and
never merges two segments, so a codec whose activations grow layer by layer (code2wav: 40 MB blocks at 2 kHz, 80 MB
at 8 kHz, 120 MB at 24 kHz for one 325-frame row) left every scale's freed blocks stranded beside the next scale's
new ones: the 325-frame graph's pool reserved 1.1 GB for a 490 MiB warm-up peak (H100, bench/results/nvidia-h100/
probes/memory_run9). The first capture into a pool therefore starts by allocating and freeing ONE block of the
peak the warm-up calls measured: the capture's allocations are carved out of that segment, freed neighbours merge,
and the later (smaller) graphs of the pool fit in it. It records no kernel; what best-fit placement cannot fit in
the segment gets segments of its own as before (code2wav: its six largest graphs' pool held 618 MiB for b1_f325's
490 MiB reserve, 1050 MiB without it; the whole 22-graph default plan 622 MiB, probes/memory_run10). Measuring the
warm-up's peak resets the device's peak-memory statistics (torch.cuda.reset_peak_memory_stats)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

# Calls before a capture: a package's first call loads kernels lazily (AOTI's, cuDNN's), sets up library state for
# its shapes, and grows the allocator, none of which may happen inside the capture. cuDNN's attention plans were
# most of each Fish DAC decoder package's 50-140 ms (bench/results/nvidia-h200/probes/first_call_cost/); with that
# attention on ttsaot::window_attention the 18 packages take 8-55 ms, 138 ms the first (H200,
# bench/results/nvidia-h200/builds.json). A second call repeats only GPU work (3 warm-up calls made no
# measurable difference against 1: probes/coldstart_warmups/).
WARMUP_CALLS = 1

_WARMUP_STREAMS: dict[int, Any] = {}
_LOCK = threading.Lock()  # guards _WARMUP_STREAMS and _CAPTURED_POOLS
_CAPTURED_POOLS: set[Any] = set()  # pool handles that already hold a capture (their reserve is made)


def warmup_stream(device: torch.device) -> Any:
    """The side stream that every warm-up before a capture on `device` runs on: one per device, not one per graph.
    The caching allocator reuses a freed block only on the stream it was allocated on, and torch.cuda.Stream()
    hands out up to 32 different pool streams, so with a stream per graph each warm-up's intermediates stayed
    cached where the next warm-up could not use them: a stage's default-pool reserve grew with the sum of its
    buckets' warm-ups instead of the largest one."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _LOCK:
        stream = _WARMUP_STREAMS.get(index)
        if stream is None:
            stream = _WARMUP_STREAMS[index] = torch.cuda.Stream(torch.device("cuda", index))
        return stream


def _claim_pool(pool: Any) -> bool:
    """True for the first capture into `pool` (None: a graph's own private pool, always first)."""
    if pool is None:
        return True
    with _LOCK:
        if pool in _CAPTURED_POOLS:
            return False
        _CAPTURED_POOLS.add(pool)
        return True


def new_pool() -> Any:
    """A memory-pool handle for graphs that share their intermediates (one per stage)."""
    return torch.cuda.graph_pool_handle()


class StaticGraph:
    """`fn(static_inputs)` captured once and replayed.

    fn: takes the list of static input tensors, returns the outputs (a tensor, a tuple or a list: kept as it is).
    capture=False keeps the static buffers but calls `fn` on them at every replay (the CPU path of stages that
    use static buffers; exercises the same scatter/gather code without a GPU). keep_alive: an object the graph
    must not outlive (e.g. the KV cache whose tensors are among the static inputs). pool_reserve=False skips the
    first capture's pool reserve (module docstring; for comparisons). warmup_calls: None = WARMUP_CALLS, read at
    construction. `warmup_s` / `capture_s`: seconds the warm-up calls (synchronised) and the capture took."""

    def __init__(
        self,
        fn: Callable[[list[torch.Tensor]], Any],
        static_inputs: Sequence[torch.Tensor],
        device: torch.device | None = None,
        pool: Any = None,
        capture: bool = True,
        warmup_calls: int | None = None,
        keep_alive: Any = None,
        pool_reserve: bool = True,
    ) -> None:
        self.fn = fn
        self.inputs = list(static_inputs)
        self.keep_alive = keep_alive
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: Any = None
        self.warmup_peak_bytes: int | None = None
        self.warmup_s = self.capture_s = 0.0
        if not capture:
            return
        if warmup_calls is None:
            warmup_calls = WARMUP_CALLS
        device = device if device is not None else self.inputs[0].device
        first_in_pool = _claim_pool(pool) and pool_reserve
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        base = torch.cuda.memory_allocated(device)
        if first_in_pool:
            torch.cuda.reset_peak_memory_stats(device)
        side = warmup_stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(warmup_calls):
                fn(self.inputs)
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        t1 = time.perf_counter()
        self.warmup_s = t1 - t0
        #: bytes allocated beyond the static inputs at the warm-up's peak (one call's intermediates + outputs)
        self.warmup_peak_bytes = torch.cuda.max_memory_allocated(device) - base if first_in_pool else None
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            if self.warmup_peak_bytes:
                # allocated and freed inside the capture, so the block lands in the pool (no kernel is recorded)
                reserve = torch.empty(self.warmup_peak_bytes, dtype=torch.uint8, device=device)
                del reserve
            self.outputs = fn(self.inputs)
        self.capture_s = time.perf_counter() - t1

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def replay(self) -> Any:
        """Run on the current contents of the static inputs; returns the static outputs (overwritten by the next
        replay)."""
        if self.graph is None:
            return self.fn(self.inputs)
        self.graph.replay()
        return self.outputs

    def __call__(self, inputs: Sequence[torch.Tensor]) -> Any:
        """Copy `inputs` (same shapes as the static inputs) into the static buffers, then replay."""
        for dst, src in zip(self.inputs, inputs):
            if dst.data_ptr() != src.data_ptr():
                dst.copy_(src)
        return self.replay()
