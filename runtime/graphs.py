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
    construction. `warmup_s` / `capture_s`: seconds the warm-up calls (synchronised) and the capture took.

    guard: `guard(static_inputs)` -> a 1-D bool tensor, True where a check FAILED (read-only, no side effects). The
    graph then runs fn only where every flag is False. Captured: the checks and an event recorded as a node of the
    graph come first, then fn inside a conditional node, so a call whose checks fail leaves fn's work (and its
    writes: an LM step's KV cache) undone, in ONE graph launch; the host reads the flags behind that event, on a
    stream of their own, without waiting for fn. (A check graph replayed and read back before fn's graph is
    launched cost 62-69 µs a decode-step call on an H200 against no checks: its launch, its kernels, the read-back
    and the launch after it; bench/results/nvidia-h200/probes/input_checks_graph/.) After each `replay`, `failures`
    holds the flags as host bools. The warm-up runs the guard, never fn (warmup_calls is ignored): a guarded graph
    is made lazily over buffers that hold a live request (`guarded_twin`), and fn was warmed up by the plain graph
    over the same buffers."""

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
        guard: Callable[[list[torch.Tensor]], torch.Tensor] | None = None,
    ) -> None:
        self.fn = fn
        self.guard = guard
        self.inputs = list(static_inputs)
        self.keep_alive = keep_alive
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: Any = None
        self.failures: list[bool] = []
        self.warmup_peak_bytes: int | None = None
        self.warmup_s = self.capture_s = 0.0
        if not capture:
            return
        # a guarded graph warms up its checks only (the class docstring: never fn on a live request)
        warmup_calls = 0 if guard is not None else WARMUP_CALLS if warmup_calls is None else warmup_calls
        device = device if device is not None else self.inputs[0].device
        first_in_pool = _claim_pool(pool) and pool_reserve and guard is None
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        base = torch.cuda.memory_allocated(device)
        if first_in_pool:
            torch.cuda.reset_peak_memory_stats(device)
        side = warmup_stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            probe = guard(self.inputs) if guard is not None else None  # loads the checks' kernels
            for _ in range(warmup_calls):
                fn(self.inputs)
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        t1 = time.perf_counter()
        self.warmup_s = t1 - t0
        #: bytes allocated beyond the static inputs at the warm-up's peak (one call's intermediates + outputs)
        self.warmup_peak_bytes = torch.cuda.max_memory_allocated(device) - base if first_in_pool else None
        if probe is not None:
            # The flags are read after each replay on a stream of their own, behind the graph's event: nothing
            # host-side is captured (a copy into pinned memory inside a capture depends on how torch's host
            # allocator treats captures).
            self._flags_host = torch.empty(probe.shape, dtype=torch.bool, pin_memory=True)
            self._reader = torch.cuda.Stream(device)
            self._checked = torch.cuda.Event(external=True)  # a node of the graph: its arrival is the checks'
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            if self.warmup_peak_bytes:
                # allocated and freed inside the capture, so the block lands in the pool (no kernel is recorded)
                reserve = torch.empty(self.warmup_peak_bytes, dtype=torch.uint8, device=device)
                del reserve
            if guard is None:
                self.outputs = fn(self.inputs)
            else:
                self._failed = guard(self.inputs)
                self._checked.record()
                self.graph.begin_capture_to_if_node(torch.logical_not(self._failed.any()))
                try:
                    self.outputs = fn(self.inputs)
                finally:
                    self.graph.end_capture_to_conditional_node()
        self.capture_s = time.perf_counter() - t1

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def replay(self) -> Any:
        """Run on the current contents of the static inputs; returns the static outputs (overwritten by the next
        replay). Guarded: fn runs only where the guard passes (`failures`); the outputs are then last time's."""
        if self.guard is not None:
            return self._replay_guarded()
        if self.graph is None:
            return self.fn(self.inputs)
        self.graph.replay()
        return self.outputs

    def _replay_guarded(self) -> Any:
        assert self.guard is not None
        if self.graph is None:  # the CPU path: the same decision, eagerly
            self.failures = [bool(f) for f in self.guard(self.inputs).tolist()]
            if not any(self.failures):
                self.outputs = self.fn(self.inputs)
            return self.outputs
        self.graph.replay()
        self._reader.wait_event(self._checked)  # this replay's checks, not its body
        with torch.cuda.stream(self._reader):
            self._flags_host.copy_(self._failed, non_blocking=True)
        self._reader.synchronize()
        self.failures = [bool(f) for f in self._flags_host.tolist()]
        return self.outputs

    def __call__(self, inputs: Sequence[torch.Tensor]) -> Any:
        """Copy `inputs` (same shapes as the static inputs) into the static buffers, then replay."""
        for dst, src in zip(self.inputs, inputs):
            if dst.data_ptr() != src.data_ptr():
                dst.copy_(src)
        return self.replay()


def guarded_twin(
    plain: StaticGraph, guard: Callable[[list[torch.Tensor]], torch.Tensor], pool: Any = None
) -> tuple[StaticGraph | None, str | None]:
    """A guarded graph of `plain`'s fn over its buffers (StaticGraph `guard`; captured where `plain` is), and None;
    or None and why, where this torch or driver cannot capture one (the caller then reads its checks back before
    replaying `plain`)."""
    device = plain.inputs[0].device
    try:
        twin = StaticGraph(
            plain.fn, plain.inputs, device, pool, capture=plain.captured, keep_alive=plain.keep_alive, guard=guard
        )
    except Exception as e:  # an older torch or driver: conditional nodes, external events
        return None, f"{type(e).__name__}: {e}"
    return twin, None
