"""Language-model stages with runtime-owned static KV caches: `lm_step` (one token per row) and `lm_prefill`
(a right-padded prompt per row), VoxCPM2 `base_lm_*` / `residual_lm_*`.

The KV cache contract (stage metadata `cache_inputs`, `cache_shape`, `max_len`, `scratch_position`):

* A :class:`KVCache` holds `k` and `v` tensors `[layers, batch, kv_heads, max_len + 1, head_dim]` of ONE batch
  bucket, allocated once, plus host-side per-row bookkeeping (`positions`: tokens held per row). The compiled
  programs take the two tensors as inputs and write them in place (no copy of the cache per call).
* Slot `max_len` is scratch: rows that are not being stepped get position `max_len` (and rows that are not
  being prefilled get length 0), so their writes land there and never touch a live row.
* One cache serves both stages of one LM: `prefill = bundle["base_lm_prefill"]; step = bundle["base_lm_step"]`,
  `cache = step.new_cache(batch)` (or `step.cache(batch)`, the stage's own cache per bucket, allocated on first
  use), `prefill.prefill(..., lengths=..., cache=cache)`, then `step.step(..., cache=cache)` per token. A cache is
  accepted by any stage whose metadata `cache_shape` (with the bucket's batch) and `cache_dtype` match.
* On CUDA the cache tensors ARE the captured graphs' static input buffers: a graph is captured per
  (bucket, cache) on first use, with the scratch position / zero lengths so capture never writes live rows.

The plain ``stage(*inputs)`` call (used by ``verify``) also works: caches are then passed explicitly as
tensors of exactly the bucket's shape, positions/lengths explicitly too, and are updated in place.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from pathlib import Path

import torch

from .artifact import DTYPES, TensorSpec
from .errors import InputDTypeError, InputRangeError, InputShapeError, InputValueError
from .graphs import StaticGraph, new_pool
from .host_copies import copy_to_device, to_device
from .stage import Stage
from .validation import DeviceValueChecks


class KVCache:
    """Static KV cache of one LM for one batch bucket (see the module docstring)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, max_len: int, lm: str = "") -> None:
        if k.shape != v.shape or k.dtype != v.dtype or k.device != v.device:
            raise InputShapeError("KVCache: k and v must have the same shape, dtype and device")
        if k.dim() != 5 or k.shape[3] != max_len + 1:
            raise InputShapeError(
                f"KVCache: expected [layers, batch, kv_heads, {max_len + 1}, head_dim], got {tuple(k.shape)}"
            )
        self.k, self.v, self.max_len, self.lm = k, v, int(max_len), lm
        self.batch = int(k.shape[1])
        self.positions = torch.zeros(self.batch, dtype=torch.int64)  # host-side: tokens held per row

    @classmethod
    def allocate(
        cls, shape: Sequence[int], dtype: torch.dtype, device: torch.device, max_len: int, lm: str = ""
    ) -> KVCache:
        return cls(
            torch.zeros(tuple(shape), dtype=dtype, device=device),
            torch.zeros(tuple(shape), dtype=dtype, device=device),
            max_len,
            lm,
        )

    def reset(self, rows: Sequence[int] | None = None) -> None:
        """Forget the rows' tokens (no memory is cleared: positions past a row's length are never read)."""
        if rows is None:
            self.positions.zero_()
        else:
            self.positions[self._rows(rows)] = 0

    def remaining(self, row: int) -> int:
        return self.max_len - int(self.positions[row])

    def _rows(self, rows: Sequence[int]) -> torch.Tensor:
        r = torch.as_tensor(list(rows), dtype=torch.int64)
        if r.numel() == 0:
            raise InputValueError("KVCache: no rows given")
        if bool(((r < 0) | (r >= self.batch)).any()) or len(set(r.tolist())) != r.numel():
            raise InputShapeError(f"KVCache: rows {r.tolist()} must be distinct and in [0, {self.batch})")
        return r

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def __repr__(self) -> str:
        return (
            f"KVCache({self.lm!r}, batch={self.batch}, max_len={self.max_len}, shape={tuple(self.k.shape)}, "
            f"dtype={self.k.dtype}, device={self.k.device})"
        )


# The prefill and the step stage of one LM hold the same layer weights under the same constant names (e.g.
# `base_lm.layers.0.self_attn.qkv_proj.weight`, 2.5 GiB for VoxCPM2's base LM in bf16). Stages of one artifact
# loaded on one device bind ONE copy: a constant equal in name, dtype, shape, stride and value to one already
# bound by a sibling LM stage is replaced by that tensor before binding (the duplicate is freed).
_SHARED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _share_weights(root, device: torch.device, weights: dict[str, torch.Tensor]) -> int:
    shared = 0
    for name, t in list(weights.items()):
        key = (str(Path(root).resolve()), str(device), name, t.dtype, tuple(t.shape), tuple(t.stride()))
        prev = _SHARED.get(key)
        if prev is not None and prev is not t and torch.equal(prev, t):
            weights[name] = prev
            shared += t.numel() * t.element_size()
        elif prev is None:
            _SHARED[key] = t
    return shared


def _cache_graph(
    run_fn,
    specs: list[TensorSpec],
    shapes: list[tuple],
    cache: KVCache,
    cache_idx: list[int],
    idle: dict[int, int],
    device: torch.device,
    pool,
    capture: bool,
) -> StaticGraph:
    """Static inputs of one bucket package bound to one cache: row-input buffers + the cache tensors themselves.
    On CUDA a graph is captured over them; without capture (CPU) `replay` runs the package on the same buffers,
    which exercises the identical scatter/gather path."""
    inputs: list[torch.Tensor] = []
    for i, (spec, shape) in enumerate(zip(specs, shapes)):
        if i in cache_idx:
            inputs.append(cache.k if cache_idx.index(i) == 0 else cache.v)
        else:
            # idle control value (scratch position / zero length): warm-up and capture touch no live row
            inputs.append(torch.full(shape, idle.get(i, 0), dtype=spec.torch_dtype, device=device))
    return StaticGraph(run_fn, inputs, device, pool, capture=capture, keep_alive=cache)


class _LMStage(Stage):
    """Shared machinery of the two LM kinds: cache checks, row scatter/gather, per-(bucket, cache) graphs."""

    control_key = ""  # metadata key naming the positions / lengths input
    # the rows' device value checks read back before the launch (`_run_rows`): a kind whose writes reach live slots
    verdict_first = False

    def __init__(self, root, entry, device, weights, cuda_graphs: bool = True, cpu_threads: int | None = None) -> None:
        _share_weights(root, device, weights)
        # Packages are loaded and bound by Stage; graphs are captured here, per cache, on first use.
        super().__init__(root, entry, device, weights, cuda_graphs=False, cpu_threads=cpu_threads)
        self.uses_cuda_graphs = cuda_graphs and device.type == "cuda"
        # per-(bucket, cache) static input buffers: always with CUDA graphs; settable on CPU (tests the same path)
        self.static_buffers = self.uses_cuda_graphs
        self._graph_pool = new_pool() if self.uses_cuda_graphs else None
        md = entry.metadata
        self.max_len = int(md["max_len"])
        self.lm = str(md.get("lm", ""))
        self.cache_dtype = DTYPES[md["cache_dtype"]]
        self._cache_names = list(md["cache_inputs"])
        names = self.input_names
        self._cache_idx = [names.index(n) for n in self._cache_names]
        self._control_idx = names.index(md[self.control_key])
        self._row_idx = [i for i in range(len(names)) if i not in self._cache_idx and i != self._control_idx]
        self._graphs: dict[tuple[str, int], StaticGraph] = {}
        # per (bucket, cache) graph: its row inputs' value checks over the same buffers (validation.py), where the
        # rows' zero padding passes them. (Stage's own `_values_capturable` stays False here, the packages having
        # no graphs of their own: a plain `stage(*inputs)` call with explicit caches checks its inputs eagerly.)
        self._value_checks: dict[tuple[str, int], DeviceValueChecks] = {}
        self._row_specs = [entry.inputs[i] for i in self._row_idx]
        self._rows_capturable = DeviceValueChecks.capturable(self._row_specs, [0] * len(self._row_specs))
        self._caches: dict[int, KVCache] = {}
        self._cache_lock = threading.Lock()
        self.batch_buckets = sorted({b.sizes["batch"] for b in entry.buckets})

    # ------------------------------------------------------------------------------ caches
    def cache_shape(self, batch: int) -> tuple[int, ...]:
        return tuple(batch if s == "batch" else int(s) for s in self.entry.metadata["cache_shape"])

    def new_cache(self, batch: int) -> KVCache:
        """A fresh cache for the smallest batch bucket ≥ batch (the caller owns it)."""
        b = self._bucket_batch(batch)
        return KVCache.allocate(self.cache_shape(b), self.cache_dtype, self.device, self.max_len, self.lm)

    def cache(self, batch: int) -> KVCache:
        """This stage's own cache for the batch bucket ≥ batch, allocated once; hand it to the other stage of the
        same LM (`prefill.prefill(..., cache=step.cache(b))`)."""
        b = self._bucket_batch(batch)
        with self._cache_lock:
            if b not in self._caches:
                self._caches[b] = self.new_cache(b)
            return self._caches[b]

    def release(self, cache: KVCache) -> None:
        """Drop the graphs / static buffers bound to `cache` (they keep it alive): call before discarding a cache
        made with `new_cache` on a CUDA-graph stage. The stage's own `cache(b)` caches live as long as the stage."""
        with self._lock:
            for key in [k for k in self._graphs if k[1] == id(cache)]:
                del self._graphs[key]
                self._value_checks.pop(key, None)
            if self.uses_cuda_graphs and not self._graphs:
                # The last graph of the pool is gone, and with it the pool: capturing into the old handle again
                # trips the allocator's `use_count > 0` assert (H100, a step after release + new_cache).
                self._graph_pool = new_pool()

    def _bucket_batch(self, batch: int) -> int:
        fits = [b for b in self.batch_buckets if b >= batch]
        if not fits:
            raise InputShapeError(f"{self.name}: batch {batch} exceeds the largest bucket ({self.batch_buckets[-1]})")
        return fits[0]

    def _check_cache(self, cache: KVCache) -> None:
        if not isinstance(cache, KVCache):
            raise InputDTypeError(f"{self.name}: cache must be a KVCache, got {type(cache).__name__}")
        if cache.batch not in self.batch_buckets:
            raise InputShapeError(f"{self.name}: cache batch {cache.batch} is not a bucket ({self.batch_buckets})")
        want = self.cache_shape(cache.batch)
        if tuple(cache.k.shape) != want or cache.k.dtype != self.cache_dtype or cache.max_len != self.max_len:
            raise InputShapeError(
                f"{self.name}: cache {tuple(cache.k.shape)} {cache.k.dtype} does not fit this "
                f"stage ({want} {self.cache_dtype}, max_len {self.max_len})"
            )
        if cache.k.device != self.device:
            raise InputShapeError(f"{self.name}: cache is on {cache.k.device}, the stage runs on {self.device}")
        if self.lm and cache.lm and cache.lm != self.lm:
            raise InputShapeError(f"{self.name}: cache belongs to {cache.lm!r}, this stage is {self.lm!r}")
        if not (cache.k.is_contiguous() and cache.v.is_contiguous()):
            raise InputShapeError(f"{self.name}: cache tensors must be contiguous")

    # ------------------------------------------------------------------------------ running
    def _row_inputs(
        self, args: Sequence, n: int, sizes: dict[str, int]
    ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor] | None]:
        """Validate the per-row inputs (leading dim n; other axes as in `sizes`) and return them on the device,
        with, where their value checks are pending (they run over the graph's buffers: `_run_rows`), the same
        tensors by name."""
        specs = self._row_specs
        if len(args) != len(specs):
            raise InputShapeError(
                f"{self.name}: takes {len(specs)} row inputs ({', '.join(s.name for s in specs)}), got {len(args)}"
            )
        named = {spec.name: x if isinstance(x, torch.Tensor) else torch.as_tensor(x) for spec, x in zip(specs, args)}
        defer = (self.static_buffers or self.uses_cuda_graphs) and self.capture_value_checks and self._rows_capturable
        _, pending = self._inputs.check_deferring(
            specs, named, sizes={"batch": n, **sizes}, values=self.validate_inputs, defer=defer
        )
        return [named[spec.name] for spec in specs], named if pending else None

    def _run_rows(
        self,
        bucket,
        cache: KVCache,
        rows: torch.Tensor,
        row_inputs: list[torch.Tensor],
        control: torch.Tensor,
        idle_control: int,
        out_sizes: dict[str, int],
        pending: dict[str, torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """Scatter the rows into bucket-shaped inputs, run (graph or direct) on the cache, gather the rows.

        `pending`: the rows' value checks run over the filled buffers (validation.DeviceValueChecks), their
        verdict read once the step's graph is launched: a step writes each stepped row's cache slot at its position
        only (and idle rows the scratch slot), which no row reads yet, so a refused step leaves every live slot as
        it was; the check graph has replaced what failed in its buffers by finite values first, so that slot is
        computed from finite inputs. A kind whose writes reach its rows' live slots (a prefill) sets
        `verdict_first`: the verdict before the launch.

        When the rows are the whole bucket in order (a decode loop over a full batch) the inputs are copied in
        and the outputs copied out whole, with no index tensor; the host-side control (and row) vectors reach
        the device through pinned memory (host_copies.py), so nothing here waits for the GPU."""
        runner = self._runners[bucket.key]
        B = bucket.sizes["batch"]
        whole = rows.numel() == B and rows.tolist() == list(range(B))  # a list compare: no tensor ops on the host
        row_index = slice(None) if whole else to_device(rows, self.device)
        ctl = torch.full((B,), idle_control, dtype=torch.int64)
        ctl[rows] = control
        with self._lock:
            if self.static_buffers or self.uses_cuda_graphs:
                g = self._graphs.get((bucket.key, id(cache)))
                if g is None:
                    g = _cache_graph(
                        runner.call,
                        self.entry.inputs,
                        runner.shapes,
                        cache,
                        self._cache_idx,
                        {self._control_idx: idle_control},
                        self.device,
                        self._graph_pool,
                        capture=self.uses_cuda_graphs,
                    )
                    self._graphs[(bucket.key, id(cache))] = g
                    self._value_checks[(bucket.key, id(cache))] = DeviceValueChecks(
                        self._inputs,
                        self._row_specs,
                        [g.inputs[i] for i in self._row_idx],
                        self.device,
                        self._graph_pool,
                        capture=self.uses_cuda_graphs,
                    )
                for i, x in zip(self._row_idx, row_inputs):
                    dst = g.inputs[i]
                    if whole and x.shape == dst.shape:
                        dst.copy_(x)
                        continue
                    dst.zero_()
                    dst[(row_index, *(slice(0, s) for s in x.shape[1:]))] = x
                checks = self._value_checks[(bucket.key, id(cache))] if pending is not None else None
                if checks is not None and self.verdict_first:
                    checks.run(pending)
                    checks = None
                flags = checks.launch() if checks is not None else None
                copy_to_device(g.inputs[self._control_idx], ctl)
                outs = g.replay()
                if checks is not None:
                    checks.verdict(flags, pending)
            else:
                full = [None] * len(self.entry.inputs)
                for i, x in zip(self._row_idx, row_inputs):
                    buf = torch.zeros(runner.shapes[i], dtype=x.dtype, device=self.device)
                    buf[(row_index, *(slice(0, s) for s in x.shape[1:]))] = x
                    full[i] = buf
                full[self._control_idx] = to_device(ctl, self.device)
                full[self._cache_idx[0]], full[self._cache_idx[1]] = cache.k, cache.v
                outs = list(runner.call(full))
            result = []
            for spec, o in zip(self.entry.outputs, outs):
                idx = [row_index] + [
                    slice(0, out_sizes[s]) if isinstance(s, str) and s != "batch" else slice(None)
                    for s in spec.shape[1:]
                ]
                # a copy either way (advanced indexing copies; a whole-batch view is cloned): safe from the next
                # replay, which rewrites the graph's output buffers
                result.append(o[tuple(idx)].clone() if whole else o[tuple(idx)])
        return result

    def _resolve_rows(self, cache: KVCache, rows: Sequence[int] | None, n: int) -> torch.Tensor:
        r = cache._rows(range(n) if rows is None else rows)
        if r.numel() != n:
            raise InputShapeError(f"{self.name}: {r.numel()} rows given for inputs of batch {n}")
        return r

    # ---------------------------------------------------------------- plain call (verify, tests)
    def _run(self, named: dict[str, torch.Tensor], sizes: dict[str, int], pending: bool = False) -> list[torch.Tensor]:
        """`stage(*inputs)` with explicit caches: the batch must be a bucket's batch (the caches' own batch);
        other axes are padded. The caches are written in place."""
        bucket = self.pick_bucket(sizes)
        if bucket is None or bucket.sizes["batch"] != sizes["batch"]:
            raise InputShapeError(
                f"{self.name}: explicit caches need a batch equal to a bucket "
                f"({self.batch_buckets}), got {sizes['batch']}"
            )
        for n in self._cache_names:
            if not named[n].is_contiguous():
                raise InputShapeError(f"{self.name}: cache input {n!r} must be contiguous")
        runner = self._runners[bucket.key]
        full = []
        for i, spec in enumerate(self.entry.inputs):
            x = named[spec.name]
            if i in self._cache_idx or tuple(x.shape) == runner.shapes[i]:
                full.append(x if i in self._cache_idx else x.contiguous())
            else:
                buf = torch.full(runner.shapes[i], spec.pad or 0, dtype=x.dtype, device=self.device)
                buf[tuple(slice(0, s) for s in x.shape)].copy_(x)
                full.append(buf)
        with self._lock:
            outs = list(runner.call(full))
        trimmed = []
        for spec, o in zip(self.entry.outputs, outs):
            sl = [slice(None)] * o.dim()
            for d, axis, scale in spec.axes():
                sl[d] = slice(0, sizes[axis] * scale)
            trimmed.append(o[tuple(sl)].contiguous())
        return trimmed


class LMStepStage(_LMStage):
    """One decode step for a set of rows of a cache: `step(*row_inputs, cache=..., rows=None)`.

    row_inputs are the stage's non-state inputs in manifest order without `positions` (VoxCPM2 base_lm_step:
    `embeds [n,H]`; residual_lm_step: `lm_hidden, feat_embed [n,H]`), n = len(rows) (default rows 0..n-1). Each
    row's position is the cache's bookkeeping (`cache.positions[row]`), advanced by one after the step; a row
    already holding `max_len` tokens is refused with InputRangeError before anything runs."""

    control_key = "position_input"

    def step(self, *row_inputs, cache: KVCache, rows: Sequence[int] | None = None):
        self._check_cache(cache)
        if not row_inputs:
            raise InputShapeError(f"{self.name}: no inputs")
        n = int(torch.as_tensor(row_inputs[0]).shape[0])
        r = self._resolve_rows(cache, rows, n)
        pos = cache.positions[r]
        if int(pos.max()) >= self.max_len:
            row = int(r[(pos >= self.max_len).nonzero()[0, 0]])
            raise InputRangeError(
                f"{self.name}: row {row} already holds {int(cache.positions[row])} tokens, the "
                f"cache holds max_len={self.max_len}; finish or reset the request, or rebuild "
                f"with a larger --max-len"
            )
        x, pending = self._row_inputs(row_inputs, n, {})
        bucket = next(b for b in self.entry.buckets if b.sizes["batch"] == cache.batch)
        outs = self._run_rows(bucket, cache, r, x, pos, self.max_len, {}, pending)
        cache.positions[r] += 1
        return outs[0] if len(outs) == 1 else tuple(outs)


class LMPrefillStage(_LMStage):
    """A prompt per row, from position 0: `prefill(*row_inputs, lengths=..., cache=..., rows=None)`.

    row_inputs: the non-state inputs without `lengths` (VoxCPM2 base_lm_prefill: `text_tokens, text_mask,
    feat_embed, feat_mask`; residual_lm_prefill: `lm_hidden, feat_embed, feat_mask`), right-padded to a common
    length T ≤ the largest tokens bucket; lengths [n] (1 ≤ length ≤ T). Rows not named are untouched (length 0:
    their writes go to the scratch slot). Afterwards `cache.positions[row] = lengths[i]`. Outputs are trimmed
    to [n, T, ...]; positions ≥ a row's length hold padding values."""

    control_key = "length_input"
    verdict_first = True  # a prefill rewrites its rows' slots from 0: a refused one must not have run

    def prefill(self, *row_inputs, lengths, cache: KVCache, rows: Sequence[int] | None = None):
        self._check_cache(cache)
        lengths = torch.as_tensor(lengths, dtype=torch.int64).cpu().reshape(-1)
        n = lengths.numel()
        r = self._resolve_rows(cache, rows, n)
        tok = next(j for j, i in enumerate(self._row_idx) if "tokens" in self.entry.inputs[i].shape)
        T = int(torch.as_tensor(row_inputs[tok]).shape[1]) if len(row_inputs) > tok else 0
        if T == 0:
            raise InputValueError(f"{self.name}: empty prompt")
        largest = max(b.sizes["tokens"] for b in self.entry.buckets)
        if T > largest:
            raise InputShapeError(f"{self.name}: prompt of {T} tokens exceeds the largest prefill bucket ({largest})")
        if bool(((lengths < 1) | (lengths > T)).any()):
            raise InputRangeError(f"{self.name}: lengths {lengths.tolist()} must be in [1, {T}]")
        if bool((lengths > self.max_len).any()):
            raise InputRangeError(
                f"{self.name}: a prompt of {int(lengths.max())} tokens exceeds max_len={self.max_len}"
            )
        x, pending = self._row_inputs(row_inputs, n, {"tokens": T})
        bucket = min(
            (b for b in self.entry.buckets if b.sizes["batch"] == cache.batch and b.sizes["tokens"] >= T),
            key=lambda b: b.sizes["tokens"],
        )
        outs = self._run_rows(bucket, cache, r, x, lengths, 0, {"tokens": T}, pending)
        cache.positions[r] = lengths
        return outs[0] if len(outs) == 1 else tuple(outs)
