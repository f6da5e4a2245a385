"""Cross-request batching: many independent callers, one stage call per batch.

    batcher = Batcher(bundle["code2wav"])                  # one worker thread per stage
    wav = batcher(codes)                                   # from any thread; same result as stage(codes)
    wav = await batcher.acall(codes)                       # from asyncio
    with batcher.open_stream() as s:                       # a codec stream with its own left context
        for chunk in chunks:
            play(s.push(chunk))                            # or: await s.apush(chunk)
    codes = predictor_batcher.generate(hidden, code0, generator=g)   # per-request noise, batched replay

Concurrent requests are gathered for at most `max_wait_s` (default 2 ms) into the smallest covering batch
bucket, run as ONE stage call (one CUDA-graph replay), and each caller gets exactly its rows. The wait is only
spent while more requests are expected (open streams, or the size of the previous batch): a lone caller never
waits. Requests of different lengths along the other bucket axes (codec frames) are right-padded with the input's
pad value to the longest one: the stage pads to its bucket the same way, so this changes nothing the stage would
not, and each caller's outputs are trimmed to its own sizes (frames × samples_per_frame for a codec).

Invariants a caller can rely on:
* a request's rows equal a direct stage call of the same batch (same bucket), and are within the stage tolerance
  of a call of that request alone; sampled codes come from noise drawn with the request's own generator
  (`CodebookPredictorStage.draw_noise`), so they do not depend on who shares the batch;
* a request the stage refuses gets its own typed `InputError`; the others in its batch are then re-run alone and
  get their results (a bad request costs its batch one call per member, never a wrong or lost result);
* a full queue (or all stream slots taken) raises `OverloadedError` at once instead of queueing latency;
* a cancelled request (Future.cancel, a cancelled asyncio task) leaves the queue and is never run; a closed,
  cancelled or garbage-collected stream frees its slot;
* every accepted request ends in a result or an exception, whatever the worker hits.

Torch and the standard library only (the runtime's rule). LM stages are refused: their rows live in KV caches,
batch them with `step(rows=...)` on one cache."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .errors import InputError, InputShapeError, TTSAOTError

log = logging.getLogger(__name__)

DEFAULT_MAX_WAIT_S = 0.002
NOT_BATCHABLE_KINDS = ("lm_step", "lm_prefill")


class OverloadedError(TTSAOTError):
    """The batcher cannot take the request now (queue full, every stream slot taken, or shut down). Nothing was
    started; retry later (a service answers 503)."""


@dataclass
class BatcherConfig:
    max_wait_s: float = DEFAULT_MAX_WAIT_S  # longest a batch's first request waits for more (only if more expected)
    max_queue: int = 256  # requests waiting for the worker; more → OverloadedError
    max_streams: int = 256  # open streaming sessions; more → OverloadedError
    max_batch: int | None = None  # rows per stage call; default: the stage's largest batch bucket
    output_device: str | None = None  # e.g. "cpu": copy each batch's outputs off the device once, in the worker

    def __post_init__(self) -> None:
        if self.max_wait_s < 0 or self.max_queue < 1 or self.max_streams < 0:
            raise ValueError("BatcherConfig: max_wait_s >= 0, max_queue >= 1 and max_streams >= 0 are required")
        if self.max_batch is not None and self.max_batch < 1:
            raise ValueError("BatcherConfig: max_batch must be >= 1")


@dataclass(frozen=True)
class BatchRecord:
    """One stage call, as the metrics hook sees it (called in the worker thread after the results are out)."""

    stage: str
    requests: int  # callers served by this call
    rows: int  # rows of the call (before the stage pads to its bucket)
    waits_s: tuple[float, ...]  # per request: enqueue → start of the call
    run_s: float  # the stage call (including the isolation re-runs after an InputError)
    queue_depth: int  # requests still waiting when the call started
    failed: int = 0  # requests that ended in an exception


Observer = Callable[[BatchRecord], None]


@dataclass
class BatcherStats:
    requests: int = 0
    batches: int = 0
    rejected: int = 0
    cancelled: int = 0
    failed: int = 0
    isolated_batches: int = 0  # batches re-run request by request
    rows_histogram: dict[int, int] = field(default_factory=dict)  # rows per call → number of calls
    wait_s_total: float = 0.0
    run_s_total: float = 0.0


class ContextWindow:
    """One stream's left context, with `CodecDecoderStage.stream`'s windowing: each chunk of new frames [B, K, n]
    is decoded together with up to `left_context` previous frames, whose samples are then dropped."""

    def __init__(self, left_context: int, max_frames: int, name: str = "stream") -> None:
        if left_context < 0:
            raise InputShapeError(f"{name}: left context must be >= 0, got {left_context}")
        self.left_context, self.max_frames, self.name = left_context, max_frames, name
        self.history: torch.Tensor | None = None

    def next(self, new: torch.Tensor) -> tuple[torch.Tensor, int]:
        """→ (window to decode, context frames at its start); the history advances."""
        if not isinstance(new, torch.Tensor) or new.dim() != 3:
            shape = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
            raise InputShapeError(f"{self.name}: each chunk must be [B, K, frames], got {shape}")
        if self.history is not None and self.history.shape[:-1] != new.shape[:-1]:
            raise InputShapeError(
                f"{self.name}: chunk {tuple(new.shape)} does not continue the stream's "
                f"[B, K] = {tuple(self.history.shape[:-1])}"
            )
        window = new if self.history is None else torch.cat([self.history.to(new.device), new], dim=-1)
        used = window.shape[-1] - new.shape[-1]
        if window.shape[-1] > self.max_frames:
            raise InputShapeError(
                f"{self.name}: chunk of {new.shape[-1]} frames + {used} context exceeds the "
                f"largest bucket ({self.max_frames}); send smaller chunks"
            )
        keep = min(self.left_context, window.shape[-1])
        self.history = window[..., window.shape[-1] - keep :] if keep else None
        return window, used


class _Request:
    __slots__ = ("named", "rows", "sizes", "key", "alone", "post", "future", "t_enqueue")

    def __init__(
        self,
        named: dict[str, torch.Tensor] | None,
        rows: int,
        sizes: dict[str, int],
        key: Any,
        alone: Callable[[], Any],
        post: Callable[[Any], Any] | None,
    ) -> None:
        self.named, self.rows, self.sizes, self.key = named, rows, sizes, key
        self.alone, self.post = alone, post  # alone(): this request by itself, straight through the stage
        self.future: Future = Future()
        self.t_enqueue = 0.0


class Batcher:
    """Gathers concurrent requests to one stage into batched stage calls, on one worker thread."""

    def __init__(self, stage, config: BatcherConfig | None = None, observer: Observer | None = None) -> None:
        if stage.kind in NOT_BATCHABLE_KINDS:
            raise ValueError(
                f"{stage.name}: {stage.kind} stages keep per-row state in their KV caches; batch "
                "their rows with step(rows=...)/prefill(rows=...) on one cache, not with a Batcher"
            )
        self.stage = stage
        self.config = config or BatcherConfig()
        self.observers: list[Observer] = [observer] if observer is not None else []
        self.stats = BatcherStats()
        self._inputs = list(stage.entry.inputs)
        self._names = [s.name for s in self._inputs]
        self._batch_dim = {s.name: _axis_dim(s, "batch") for s in self._inputs}
        self._out_batch_dim = [_axis_dim(s, "batch") for s in stage.entry.outputs]
        input_axes = {a for s in self._inputs for _, a, _ in s.axes()}
        output_axes = {a for s in stage.entry.outputs for _, a, _ in s.axes()}
        # Batchable: every input and output has a batch axis, and outputs are trimmed by input axes only.
        self.batchable = (
            None not in self._batch_dim.values() and None not in self._out_batch_dim and output_axes <= input_axes
        )
        largest = int(stage.max_sizes.get("batch", 1))
        self.max_rows = min(self.config.max_batch or largest, largest) if self.batchable else 1
        self._cond = threading.Condition()
        self._queue: deque[_Request] = deque()
        self._queued_rows = 0
        self._open_streams = 0
        self._last_requests = 1
        self._closed = False
        self._keys = itertools.count()
        self._worker = threading.Thread(target=self._work, name=f"batcher-{stage.name}", daemon=True)
        self._worker.start()

    # ---------------------------------------------------------------------------------------- public
    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def open_streams(self) -> int:
        return self._open_streams

    @property
    def alive(self) -> bool:
        """The worker is running and the batcher takes requests (a health check reads this)."""
        return self._worker.is_alive() and not self._closed

    def submit(self, *args, **named) -> Future:
        """`stage(*args, **named)` as a Future (its result: the stage's output for these rows)."""
        return self._enqueue(self._request(args, named))

    def __call__(self, *args, **named):
        return self.submit(*args, **named).result()

    async def acall(self, *args, **named):
        return await asyncio.wrap_future(self.submit(*args, **named))

    def submit_generate(
        self,
        hidden,
        code0_or_token,
        temperature=None,
        top_k=None,
        top_p=None,
        generator: torch.Generator | list[torch.Generator] | None = None,
        noise: torch.Tensor | None = None,
        **extra,
    ) -> Future:
        """`CodebookPredictorStage.generate` as a Future. The request's noise is drawn here, in the caller's
        thread, with its own generator(s) (`draw_noise`), so its codes do not depend on the batch it joins."""
        stage = self.stage
        if not hasattr(stage, "draw_noise"):
            raise TypeError(f"{stage.name}: generate() needs a codebook_predictor stage, this is {stage.kind!r}")
        if noise is None:
            rows = int(hidden.shape[0]) if isinstance(hidden, (torch.Tensor, np.ndarray)) and hidden.ndim else 1
            noise = stage.draw_noise(rows, generator)
        params = dict(temperature=temperature, top_k=top_k, top_p=top_p)

        def alone():
            return stage.generate(hidden, code0_or_token, noise=noise, **params, **extra)

        named = self._sampling_inputs(hidden, code0_or_token, noise, params, extra)
        return self._enqueue(self._describe(named, alone, mode="generate"))

    def generate(self, *args, **kwargs):
        return self.submit_generate(*args, **kwargs).result()

    async def agenerate(self, *args, **kwargs):
        return await asyncio.wrap_future(self.submit_generate(*args, **kwargs))

    def open_stream(self, left_context_frames: int | None = None) -> StreamSession:
        """A codec-decoder stream with its own left context (default: the stage's streaming configuration)."""
        if not hasattr(self.stage, "samples_per_frame"):
            raise TypeError(f"{self.stage.name}: streams need a codec_decoder stage, this is {self.stage.kind!r}")
        with self._cond:
            if self._closed:
                raise OverloadedError(f"{self.stage.name}: the batcher is shut down")
            if self._open_streams >= self.config.max_streams:
                self.stats.rejected += 1
                raise OverloadedError(
                    f"{self.stage.name}: all {self.config.max_streams} stream slots are taken; retry later"
                )
            self._open_streams += 1
        ctx = (
            self.stage.metadata.get("streaming", {}).get("left_context_frames", 0)
            if left_context_frames is None
            else left_context_frames
        )
        try:
            return StreamSession(self, ContextWindow(ctx, int(self.stage.max_sizes["frames"]), self.stage.name))
        except BaseException:
            self._release_stream()
            raise

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop the worker; requests still queued end with OverloadedError. Idempotent."""
        with self._cond:
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
            self._queued_rows = 0
            self._cond.notify_all()
        for r in pending:
            _fail(r.future, OverloadedError(f"{self.stage.name}: the batcher was shut down"))
        if threading.current_thread() is not self._worker:
            self._worker.join(timeout)

    def __enter__(self) -> Batcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Batcher({self.stage.name!r}, max_rows={self.max_rows}, max_wait_s={self.config.max_wait_s}, "
            f"queue={self.queue_depth}, streams={self.open_streams})"
        )

    # ---------------------------------------------------------------------------------------- intake
    def _request(self, args: tuple, kwargs: dict, post: Callable[[Any], Any] | None = None) -> _Request:
        stage = self.stage

        def alone():
            return stage(*args, **kwargs)

        named = self._named(args, kwargs)
        return self._describe(named, alone, mode="call", post=post)

    def _named(self, args: tuple, kwargs: dict) -> dict[str, torch.Tensor] | None:
        """The inputs by name when they are tensors (numpy arrays converted as the stage does); None when the
        request is malformed: it then runs alone and the stage's validator names the problem."""
        if len(args) > len(self._names) or set(kwargs) - set(self._names):
            return None
        named = dict(zip(self._names, args))
        if set(named) & set(kwargs):
            return None
        named.update(kwargs)
        if set(named) != set(self._names):
            return None
        for k, v in named.items():
            if isinstance(v, np.ndarray):
                named[k] = torch.from_numpy(v)
            elif not isinstance(v, torch.Tensor):
                return None
        return named

    def _sampling_inputs(self, hidden, code0, noise, params: dict, extra: dict) -> dict | None:
        names = self._names
        if not all(isinstance(x, torch.Tensor) for x in (hidden, code0, noise)) or hidden.dim() == 0:
            return None
        rows = int(hidden.shape[0])
        # unset parameters take the family's serving defaults, as `generate` does
        defaults = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, **self.stage.metadata.get("sampling_defaults", {})}
        named = {names[0]: hidden, names[1]: code0, "noise": noise}
        for key, dtype in (("temperature", torch.float32), ("top_k", torch.int64), ("top_p", torch.float32)):
            try:
                t = torch.as_tensor(defaults[key] if params[key] is None else params[key], dtype=dtype)
            except (TypeError, ValueError, RuntimeError):
                return None
            named[key] = t.expand(rows) if t.dim() == 0 else t
        named.update(extra)
        return named if set(named) == set(names) else None

    def _describe(
        self, named: dict | None, alone: Callable[[], Any], mode: str, post: Callable[[Any], Any] | None = None
    ) -> _Request:
        """Sizes and batching key of a request. A request that does not match the stage's input structure, or
        that the stage would split or chunk by itself, gets a unique key: it runs alone."""
        sizes = self._sizes(named) if named is not None and self.batchable else None
        if (
            sizes is None
            or sizes["batch"] > self.max_rows
            or any(n > self.stage.max_sizes[a] for a, n in sizes.items() if a != "batch")
        ):
            return _Request(None, 1, {"batch": 1}, ("alone", next(self._keys)), alone, post)
        key = (mode, tuple(str(named[n].device) for n in self._names))
        return _Request(named, sizes["batch"], sizes, key, alone, post)

    def _sizes(self, named: dict[str, torch.Tensor]) -> dict[str, int] | None:
        sizes: dict[str, int] = {}
        for spec in self._inputs:
            x = named[spec.name]
            if x.dtype != spec.torch_dtype or x.dim() != len(spec.shape):
                return None
            if any(isinstance(s, int) and x.shape[d] != s for d, s in enumerate(spec.shape)):
                return None
            for d, axis, _ in spec.axes():
                n = int(x.shape[d])
                if n == 0 or sizes.setdefault(axis, n) != n:
                    return None
        return sizes

    def _enqueue(self, req: _Request) -> Future:
        with self._cond:
            if self._closed:
                raise OverloadedError(f"{self.stage.name}: the batcher is shut down")
            if len(self._queue) >= self.config.max_queue:
                self.stats.rejected += 1
                raise OverloadedError(
                    f"{self.stage.name}: {len(self._queue)} requests already queued "
                    f"(max_queue={self.config.max_queue}); retry later"
                )
            req.t_enqueue = time.perf_counter()
            self._queue.append(req)
            self._queued_rows += req.rows
            self.stats.requests += 1
            self._cond.notify()
        req.future.add_done_callback(lambda f, r=req: self._forget(r) if f.cancelled() else None)
        return req.future

    def _forget(self, req: _Request) -> None:
        """A cancelled request leaves the queue at once (frees its place for others)."""
        with self._cond:
            try:
                self._queue.remove(req)
            except ValueError:
                return
            self._queued_rows -= req.rows
            self.stats.cancelled += 1

    def _release_stream(self) -> None:
        with self._cond:
            self._open_streams -= 1

    # ---------------------------------------------------------------------------------------- worker
    def _work(self) -> None:
        try:
            if self.stage.device.type == "cuda":  # a thread starts on device 0; the stage's graphs may be elsewhere
                torch.cuda.set_device(self.stage.device)
            while True:
                group = self._next_group()
                if group is None:
                    return
                self._run_group(group)
        except BaseException as e:  # the worker must never leave a caller waiting
            log.exception("%s: batcher worker died", self.stage.name)
            with self._cond:
                self._closed = True
                pending = list(self._queue)
                self._queue.clear()
            for r in pending:
                _fail(r.future, OverloadedError(f"{self.stage.name}: the batcher stopped ({type(e).__name__})"))
            raise

    def _next_group(self) -> list[_Request] | None:
        with self._cond:
            while True:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return None
                # Wait (bounded) only while more requests are expected: the open streams, or as many callers as
                # the last batch served. A lone caller never waits.
                expected = min(max(self._open_streams, self._last_requests), self.max_rows)
                deadline = self._queue[0].t_enqueue + self.config.max_wait_s
                while self._queue and self._queued_rows < expected and not self._closed:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                group = self._take_group()
                if group:
                    return group

    def _take_group(self) -> list[_Request]:
        """FIFO: the oldest request, then every later compatible one while the rows fit a batch bucket."""
        group: list[_Request] = []
        skipped: list[_Request] = []
        rows, sizes = 0, {}
        while self._queue and rows < self.max_rows:
            r = self._queue.popleft()
            self._queued_rows -= r.rows
            if group and (
                r.key != group[0].key
                or rows + r.rows > self.max_rows
                or self.stage.pick_bucket(merged := _merge(sizes, r.sizes)) is None
            ):
                skipped.append(r)
                continue
            if not r.future.set_running_or_notify_cancel():
                continue  # cancelled while queued
            if not group:
                merged = dict(r.sizes)
            group.append(r)
            rows, sizes = rows + r.rows, merged
            if r.key[0] == "alone":
                break
        for r in reversed(skipped):
            self._queue.appendleft(r)
            self._queued_rows += r.rows
        return group

    def _run_group(self, group: list[_Request]) -> None:
        t0 = time.perf_counter()
        depth = len(self._queue)
        failed = 0
        try:
            if len(group) == 1:
                failed = self._run_alone(group[0])
            else:
                try:
                    outs = self._call_batch(group)
                except InputError:
                    # someone's request is bad: re-run each alone so only it gets the error
                    self.stats.isolated_batches += 1
                    failed = sum(self._run_alone(r) for r in group)
                except Exception as e:  # noqa: BLE001 - a stage failure is every member's failure
                    failed = len(group)
                    for r in group:
                        _fail(r.future, e)
                else:
                    failed = self._deliver(group, outs)
        finally:
            for r in group:  # nothing may be left pending, whatever happened above
                if not r.future.done():
                    _fail(r.future, OverloadedError(f"{self.stage.name}: the request was dropped"))
        run_s = time.perf_counter() - t0
        rows = sum(r.rows for r in group)
        waits = tuple(t0 - r.t_enqueue for r in group)
        st = self.stats
        st.batches += 1
        st.failed += failed
        st.rows_histogram[rows] = st.rows_histogram.get(rows, 0) + 1
        st.wait_s_total += sum(waits)
        st.run_s_total += run_s
        self._last_requests = len(group)
        record = BatchRecord(self.stage.name, len(group), rows, waits, run_s, depth, failed)
        for obs in self.observers:
            try:
                obs(record)
            except Exception:  # noqa: BLE001 - metrics must not stop serving
                log.exception("%s: batch observer failed", self.stage.name)

    def _run_alone(self, r: _Request) -> int:
        try:
            out = r.alone()
            if self.config.output_device is not None:
                out = _to(out, self.config.output_device)
            r.future.set_result(r.post(out) if r.post else out)
            return 0
        except Exception as e:  # noqa: BLE001 - handed to the caller
            _fail(r.future, e)
            return 1

    def _call_batch(self, group: list[_Request]) -> list[torch.Tensor]:
        merged: dict[str, int] = {}
        for r in group:
            merged = _merge(merged, r.sizes) if merged else dict(r.sizes)
        batched = {}
        for spec in self._inputs:
            parts = [_pad_to(r.named[spec.name], spec, merged, r.rows) for r in group]
            batched[spec.name] = torch.cat(parts, dim=self._batch_dim[spec.name])
        if group[0].key[0] == "generate":
            n = self._names
            extra = {
                k: v for k, v in batched.items() if k not in (n[0], n[1], "noise", "temperature", "top_k", "top_p")
            }
            out = self.stage.generate(
                batched[n[0]],
                batched[n[1]],
                temperature=batched["temperature"],
                top_k=batched["top_k"],
                top_p=batched["top_p"],
                noise=batched["noise"],
                **extra,
            )
        else:
            out = self.stage(**batched)
        outs = list(out) if isinstance(out, tuple) else [out]
        if self.config.output_device is not None:
            outs = [o.to(self.config.output_device) for o in outs]
        return outs

    def _deliver(self, group: list[_Request], outs: list[torch.Tensor]) -> int:
        failed, offset = 0, 0
        specs = self.stage.entry.outputs
        for r in group:
            parts = []
            for spec, o, bdim in zip(specs, outs, self._out_batch_dim):
                idx = [slice(None)] * o.dim()
                idx[bdim] = slice(offset, offset + r.rows)
                for d, axis, scale in spec.axes():
                    if axis != "batch":
                        idx[d] = slice(0, r.sizes[axis] * scale)
                parts.append(o[tuple(idx)])
            offset += r.rows
            value = parts[0] if len(parts) == 1 else tuple(parts)
            try:
                r.future.set_result(r.post(value) if r.post else value)
            except Exception as e:  # noqa: BLE001 - a failing post-processing step is that caller's error
                _fail(r.future, e)
                failed += 1
        return failed


class StreamSession:
    """One codec stream through a Batcher: chunks of new frames in, their audio out, the left context kept here.
    Chunks of different streams share the batcher's stage calls. Pushes may be pipelined (the window is taken at
    submit time, from codes only). A chunk the stage refuses ends the stream (its context would carry the bad
    codes). Close it (or use `with`); a garbage-collected session frees its slot too."""

    def __init__(self, batcher: Batcher, window: ContextWindow) -> None:
        self.batcher, self.window = batcher, window
        self.samples_per_frame = int(batcher.stage.samples_per_frame)
        self.sample_rate = int(batcher.stage.sample_rate)
        self.closed = False
        self.error: BaseException | None = None
        self._lock = threading.RLock()  # an error inside submit ends the stream under this lock
        self._pending: set[Future] = set()
        self._finalizer = weakref.finalize(self, batcher._release_stream)

    def submit(self, codes: torch.Tensor | np.ndarray) -> Future:
        """Queue a chunk [B, K, n] of new frames; the Future's result is its wave [B, 1, n·samples_per_frame]."""
        if isinstance(codes, np.ndarray):
            codes = torch.from_numpy(codes)
        with self._lock:
            if self.closed:
                raise InputShapeError(
                    f"{self.batcher.stage.name}: stream is closed"
                    + (f" after an error ({self.error})" if self.error else "")
                )
            before = self.window.history
            try:
                window, used = self.window.next(codes)
            except InputError as e:
                self._end(e)
                raise
            cut = used * self.samples_per_frame
            req = self.batcher._request((window,), {}, post=(lambda wav: wav[..., cut:]) if cut else None)
            try:
                fut = self.batcher._enqueue(req)
            except OverloadedError:
                self.window.history = before  # not queued: the stream goes on as if this chunk was never sent
                raise
            self._pending.add(fut)
        fut.add_done_callback(self._done)
        return fut

    def push(self, codes: torch.Tensor | np.ndarray, timeout: float | None = None) -> torch.Tensor:
        """Decode one chunk and wait for its wave. A refused chunk ends the stream before this raises."""
        fut = self.submit(codes)
        try:
            return fut.result(timeout)
        except InputError as e:
            self._end(e)  # (the done-callback does it too, but may run after the caller has woken up)
            raise

    async def apush(self, codes: torch.Tensor | np.ndarray) -> torch.Tensor:
        fut = self.submit(codes)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            self.close()  # the caller went away: the stream's slot and queued chunks are freed
            raise
        except InputError as e:
            self._end(e)
            raise

    def _done(self, fut: Future) -> None:
        with self._lock:
            self._pending.discard(fut)
        if not fut.cancelled() and isinstance(fut.exception(), InputError):
            self._end(fut.exception())

    def _end(self, error: BaseException | None) -> None:
        if self.error is None:
            self.error = error
        self.close()

    def close(self) -> None:
        """Free the slot; chunks still queued are cancelled. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            pending = list(self._pending)
        for f in pending:
            f.cancel()
        self._finalizer()

    def __enter__(self) -> StreamSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> StreamSession:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------------------------------ helpers
def _axis_dim(spec, axis: str) -> int | None:
    return next((d for d, a, _ in spec.axes() if a == axis), None)


def _merge(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    out = {k: max(a[k], b[k]) for k in a}
    out["batch"] = a["batch"] + b["batch"]
    return out


def _pad_to(x: torch.Tensor, spec, sizes: dict[str, int], rows: int) -> torch.Tensor:
    """Right-pad `x` along its non-batch bucket axes to `sizes`, with the input's pad value (as the stage does)."""
    shape = list(x.shape)
    for d, axis, _ in spec.axes():
        if axis != "batch":
            shape[d] = sizes[axis]
    if shape == list(x.shape):
        return x
    out = torch.full(shape, spec.pad if spec.pad is not None else 0, dtype=x.dtype, device=x.device)
    out[tuple(slice(0, n) for n in x.shape)] = x
    return out


def _to(out, device: str):
    return tuple(o.to(device) for o in out) if isinstance(out, tuple) else out.to(device)


def _fail(fut: Future, error: BaseException) -> None:
    if not fut.done():
        try:
            fut.set_exception(error)
        except Exception:  # noqa: BLE001 - raced with a cancel: nothing left to tell
            pass


__all__ = [
    "BatchRecord",
    "Batcher",
    "BatcherConfig",
    "BatcherStats",
    "ContextWindow",
    "OverloadedError",
    "StreamSession",
]
