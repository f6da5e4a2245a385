"""A loaded stage: input validation, bucket choice, padding, static buffers, CUDA-graph capture/replay, CPU path.

One lock per stage: a stage is safe to call from several threads; the graphs of one stage share one memory pool,
so outputs are copied out of the pool before the lock is released (the next replay overwrites them)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from .artifact import DTYPES, BucketEntry, StageEntry, TensorSpec, WeightSpec
from .errors import BindingError, InputDTypeError, InputShapeError
from .graphs import StaticGraph, new_pool
from .threads import cpu_threads_mode
from .validation import DeviceValueChecks, InputChecker, check_outputs

# The TF32 switches are process-global: two fp32 stages built for different settings, called from two threads,
# must not interleave their switch-set-call-restore regions (an exact stage would run with TF32 on).
_TF32_FLAGS_LOCK = threading.RLock()


class fp32_mode:
    """The TF32 setting an fp32 CUDA stage was built for, whatever the process-global flags say: exact fp32 by
    default, TF32 when the artifact was built with `--tf32` (metadata `allow_tf32`). Exact by default because
    cuDNN allows TF32 for fp32 convolutions unless told otherwise, AOTI's aten conv/matmul fallbacks read that
    flag at call time (for graphs, at capture), and TF32 moved the Fish DAC encoder's argmax codes on an H200
    (1.9e-2 relative code error vs the fp32 reference). Regions of different stages are serialised across threads
    (the flags are global); the caller's flags come back on exit."""

    def __init__(self, active: bool, tf32: bool) -> None:
        self.active, self.tf32 = active, tf32
        self._saved: list[tuple[bool, bool]] = []  # a stack: the same stage may re-enter from a nested call

    def __enter__(self):
        if self.active:
            _TF32_FLAGS_LOCK.acquire()
            self._saved.append((torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))
            torch.backends.cudnn.allow_tf32 = self.tf32
            torch.backends.cuda.matmul.allow_tf32 = self.tf32
        return self

    def __exit__(self, *exc):
        if self.active:
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = self._saved.pop()
            _TF32_FLAGS_LOCK.release()


class _Package:
    """One AOTI package through the C++ loader directly. `load_pt2` would also probe the host CPU ISA by compiling
    test programs and scan the archive for exported programs (seconds per package); the runtime has already
    checked compatibility from the manifest, so neither is needed here. A dynamic-shape package serves several
    buckets: the stage loads it once and binds its constants once; each bucket's runner calls it."""

    def __init__(self, path: Path, device: torch.device, single_threaded: bool) -> None:
        index = device.index if device.type == "cuda" and device.index is not None else -1
        self.path = path
        t0 = time.perf_counter()
        try:
            self.loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", single_threaded, 1, index)
        except RuntimeError as e:
            raise BindingError(f"{path}: not a loadable AOTInductor package ({str(e).splitlines()[0]})") from None
        self.load_s = time.perf_counter() - t0

    def bind(self, entry: StageEntry, weights: dict[str, torch.Tensor]) -> None:
        """The stage's weights as the package's constants (user-managed: `weights` must outlive the package)."""
        fqns = set(self.get_constant_fqns())
        if fqns != set(entry.constants):
            diff = sorted(fqns ^ set(entry.constants))[:3]
            raise BindingError(f"{self.path}: package constants differ from the manifest's ({diff})")
        self.load_constants({k: weights[k] for k in fqns}, check_full_update=True, user_managed=True)

    def signatures(self) -> dict[str, list] | None:
        """{bucket key: input signature [[shape], dtype] per input} the package was compiled for: `ttsaot_buckets`
        (a package serving several buckets), or the one bucket of `ttsaot_bucket` + `ttsaot_inputs`; None when the
        package carries no stamp."""
        meta = self.get_metadata()
        if "ttsaot_buckets" in meta:
            stamped = json.loads(meta["ttsaot_buckets"])
            return stamped if isinstance(stamped, dict) else None
        if meta.get("ttsaot_bucket") is None or meta.get("ttsaot_inputs") is None:
            return None
        return {meta["ttsaot_bucket"]: json.loads(meta["ttsaot_inputs"])}

    def get_constant_fqns(self) -> list[str]:
        return list(self.loader.get_constant_fqns())

    def get_metadata(self) -> dict[str, str]:
        return dict(self.loader.get_metadata())

    def load_constants(self, constants: dict[str, torch.Tensor], check_full_update: bool, user_managed: bool) -> None:
        self.loader.load_constants(constants, False, check_full_update, user_managed)


def check_weights(entry: StageEntry, weights: dict[str, torch.Tensor], device: torch.device) -> None:
    """AOTI binds user-managed constants without checking anything and segfaults or computes garbage on a
    mismatch (AOTI.md §2.4): check name, device, dtype, shape, stride and 16-byte alignment here."""
    missing = sorted(set(entry.constants) - set(weights))
    extra = sorted(set(weights) - set(entry.constants))
    if missing or extra:
        what = f"missing {missing[:3]}" if missing else f"unexpected {extra[:3]}"
        raise BindingError(f"stage {entry.name!r}: weights file does not match the packages' constants ({what})")
    for name, spec in entry.constants.items():
        _check_weight(entry.name, name, weights[name], spec, device)


def _check_weight(stage: str, name: str, t: torch.Tensor, spec: WeightSpec, device: torch.device) -> None:
    where = f"stage {stage!r} constant {name!r}"
    if t.device != device:
        raise BindingError(f"{where} is on {t.device}, the stage runs on {device}")
    if t.dtype != DTYPES[spec.dtype]:
        raise BindingError(f"{where} has dtype {t.dtype}, the package was compiled for {spec.dtype}")
    if list(t.shape) != list(spec.shape):
        raise BindingError(f"{where} has shape {list(t.shape)}, the package expects {spec.shape}")
    if list(t.stride()) != list(spec.stride):
        raise BindingError(f"{where} has stride {list(t.stride())}, the package expects {spec.stride}")
    if t.numel() and t.data_ptr() % 16:
        raise BindingError(f"{where} is not 16-byte aligned (Inductor assumes every constant is)")


def load_weights(path: Path, entry: StageEntry, device: torch.device) -> dict[str, torch.Tensor]:
    """Each tensor in its own allocation with the recorded strides (never views into one blob)."""
    from safetensors import SafetensorError, safe_open

    out: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                spec = entry.constants.get(name)
                if spec is None:
                    out[name] = t
                    continue
                if t.dtype != DTYPES[spec.dtype] or list(t.shape) != list(spec.shape):
                    raise BindingError(
                        f"stage {entry.name!r} weight {name!r} is {t.dtype} {list(t.shape)} in the "
                        f"file, the manifest says {spec.dtype} {spec.shape}"
                    )
                dst = torch.empty_strided(spec.shape, spec.stride, dtype=t.dtype, device=device)
                try:
                    dst.copy_(t)
                except RuntimeError as e:  # a layout the manifest checks missed: still a typed error
                    raise BindingError(
                        f"stage {entry.name!r} weight {name!r} cannot be laid out with stride "
                        f"{spec.stride}: {str(e).splitlines()[0]}"
                    ) from None
                out[name] = dst
    except SafetensorError as e:
        raise BindingError(f"{path}: unreadable weights ({e})") from None
    return out


CPU_INPUT_SLACK = 64  # elements


def _with_slack(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A contiguous tensor of `shape` followed by unused elements. Inductor's vectorised CPU tail loops were seen
    (gdb, Fish DAC encoder) to read up to 15 elements past an input's end, which segfaults when the input ends at
    an unmapped page; the caller's own tensors are therefore never handed to a CPU package directly. The slack is
    zeroed (the tensor itself is the caller's to fill): what such a loop reads there is then the same at every call
    instead of whatever the allocator left (suspected, not shown, in one flaky CPU-test run where two calls on the
    same code2wav input differed: tests/test_batching.py::test_context_window_is_the_stage_stream_windowing)."""
    n = math.prod(shape)
    buf = torch.empty(n + CPU_INPUT_SLACK, dtype=dtype, device=device)
    buf[n:].zero_()
    return buf[:n].view(shape)


class _BucketRunner:
    """One bucket of a stage: its package (bound to the stage weights, possibly shared with other buckets), and on
    CUDA its own static buffers and captured graph. `load_s`: the package's load time when this runner loaded it,
    0 when another bucket's runner already had (so sums count each package once)."""

    def __init__(
        self,
        package: _Package,
        bucket: BucketEntry,
        entry: StageEntry,
        device: torch.device,
        use_graph: bool,
        pool,
        cpu_threads: int | None = None,
        loaded_here: bool = True,
        checker: InputChecker | None = None,
    ) -> None:
        self.bucket = bucket
        self.device = device
        self.model = package
        self.load_s = package.load_s if loaded_here else 0.0
        self._check_signature(package, bucket, entry)
        self.run_fn = self.model.loader.run
        self.shapes = [spec.concrete(bucket.sizes) for spec in entry.inputs]
        self.fp32 = fp32_mode(
            device.type == "cuda" and entry.dtype == "float32", tf32=bool(entry.metadata.get("allow_tf32", False))
        )
        self.threads = cpu_threads_mode(cpu_threads if device.type == "cpu" else None)
        self.graph: StaticGraph | None = None
        self.value_checks: DeviceValueChecks | None = None
        self.outputs_checked = False
        t0 = time.perf_counter()
        if use_graph:
            static = [
                torch.full(shape, spec.pad if spec.pad is not None else 0, dtype=spec.torch_dtype, device=device)
                for spec, shape in zip(entry.inputs, self.shapes)
            ]
            self.graph = StaticGraph(self.call, static, device, pool)
            if checker is not None:
                # the inputs' value checks over the same buffers, replayed right before the package's graph
                self.value_checks = DeviceValueChecks(checker, entry.inputs, static, device, pool)
        self.capture_s = time.perf_counter() - t0

    @staticmethod
    def _check_signature(package: _Package, bucket: BucketEntry, entry: StageEntry) -> None:
        """The manifest says what shapes to feed; the package says which buckets it was compiled for, with their
        input shapes. The manifest's bucket must be one of them, with the same shapes and dtypes: AOTI does not
        check input shapes and computes garbage (or crashes) on a mismatch, and a dynamic package's guards would
        only catch sizes outside its whole range."""
        path = package.path
        stamped = package.signatures()
        if stamped is None or bucket.key not in stamped:
            raise BindingError(
                f"{path}: package was compiled for bucket(s) {sorted(stamped) if stamped else None}, the manifest "
                f"lists it as {bucket.key!r}"
            )
        want = [[list(spec.concrete(bucket.sizes)), spec.dtype] for spec in entry.inputs]
        got = stamped[bucket.key]
        if got != want:
            raise BindingError(
                f"{path}: package inputs {got} differ from the manifest's {want} for bucket "
                f"{bucket.key!r}; the manifest was edited or belongs to another build"
            )

    def call(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """One package call under the TF32 setting the stage was built for and, on CPU, the stage's thread count:
        every path (direct, warm-up, capture, the LM stages' per-cache graphs) goes through here."""
        with self.fp32, self.threads:
            return self.run_fn(inputs)

    def run(
        self, inputs: list[torch.Tensor], pads: list, check: dict[str, torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        """inputs: the caller's (unpadded, validated) tensors; padding to the bucket happens here. `check`: the
        caller's tensors by name, whose value checks are pending (InputChecker.check_deferring): they run on the
        filled buffers (`value_checks`) right before the package's graph, and their verdict is read once that graph
        is launched (a stateless package: a refused call's outputs are never handed out)."""
        if self.graph is not None:
            for dst, src, pad in zip(self.graph.inputs, inputs, pads):
                if tuple(src.shape) != tuple(dst.shape):
                    dst.fill_(pad if pad is not None else 0)
                dst[tuple(slice(0, n) for n in src.shape)].copy_(src)
            if check is None:
                return self.graph.replay()
            assert self.value_checks is not None  # pending only where every runner has them
            flags = self.value_checks.launch()
            outs = self.graph.replay()
            self.value_checks.verdict(flags, check)
            return outs
        padded = []
        for src, shape, pad in zip(inputs, self.shapes, pads):
            buf = (
                _with_slack(shape, src.dtype, self.device)
                if self.device.type == "cpu"
                else torch.empty(shape, dtype=src.dtype, device=self.device)
            )
            if tuple(src.shape) != shape:
                buf.fill_(pad if pad is not None else 0)
            buf[tuple(slice(0, n) for n in src.shape)].copy_(src)
            padded.append(buf)
        return list(self.call(padded))


def _allocator_bytes(device: torch.device) -> tuple[int, int] | None:
    """(allocated, reserved) bytes of the CUDA caching allocator on `device`; None on CPU. Host-side counters:
    no synchronisation."""
    if device.type != "cuda":
        return None
    return torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)


class Stage:
    """Callable stage: `stage(*inputs)` or `stage(name=tensor, ...)` → output tensor (or tuple of them).

    cpu_threads (CPU stages): OpenMP threads each package call runs with, set around the call in the calling
    thread and restored after it; None leaves the process's setting (torch.set_num_threads / OMP_NUM_THREADS)."""

    def __init__(
        self,
        root: Path,
        entry: StageEntry,
        device: torch.device,
        weights: dict[str, torch.Tensor],
        cuda_graphs: bool = True,
        cpu_threads: int | None = None,
    ) -> None:
        self.root, self.entry, self.device = root, entry, device
        self.name, self.kind = entry.name, entry.kind
        self.metadata = entry.metadata
        self.validate_inputs = True
        # False: the device inputs' value checks run eagerly (aten ops from the host) instead of replaying the
        # bucket's captured check graph (validation.DeviceValueChecks): the same checks, for A/Bs
        self.capture_value_checks = True
        self.cpu_threads = cpu_threads if device.type == "cpu" else None
        self._lock = threading.RLock()
        self._inputs = InputChecker(self.name, device)
        self._weights = weights  # owned here: AOTI keeps raw handles, so these must outlive every runner
        use_graph = cuda_graphs and device.type == "cuda"
        self.uses_cuda_graphs = use_graph
        self._pool = new_pool() if use_graph else None
        # The value checks of device inputs run as one graph per bucket over its static buffers
        # (validation.DeviceValueChecks) where every padding value passes them; eagerly otherwise.
        self._values_capturable = use_graph and DeviceValueChecks.capturable(
            entry.inputs, [s.pad for s in entry.inputs]
        )
        # Capture the largest buckets first so smaller graphs reuse their pool blocks.
        order = sorted(entry.buckets, key=lambda b: -math.prod(b.sizes.values()))
        self._runners = {}
        # Per bucket, in load order: its package file, seconds to load that package (0 when an earlier bucket that
        # shares it loaded it) and to warm up + capture its graph, and on CUDA
        # how much the caching allocator grew meanwhile (allocated / reserved bytes: its static inputs, its graph's
        # outputs and whatever of its intermediates the pool could not reuse from larger graphs).
        self.bucket_load_stats: dict[str, dict[str, float | int | bool | str]] = {}
        # One package per distinct file, loaded and bound once, shared by the buckets that name it.
        self._packages: dict[str, _Package] = {}
        for b in order:
            mem0 = _allocator_bytes(device)
            package = self._packages.get(b.file)
            fresh = package is None
            if package is None:
                package = _Package(root / b.file, device, single_threaded=(device.type == "cuda"))
                package.bind(entry, weights)
                self._packages[b.file] = package
            runner = _BucketRunner(
                package,
                b,
                entry,
                device,
                use_graph,
                self._pool,
                cpu_threads=self.cpu_threads,
                loaded_here=fresh,
                checker=self._inputs if self._values_capturable else None,
            )
            self._runners[b.key] = runner
            st: dict[str, float | int | bool | str] = {
                "package": b.file,
                "package_load_s": round(runner.load_s, 4),
                "capture_s": round(runner.capture_s, 4),  # warm-up calls + capture, the buffers' set-up included
                "warmup_s": round(runner.graph.warmup_s, 4) if runner.graph is not None else 0.0,
                "graph": runner.graph is not None,
            }
            if mem0 is not None:
                mem1 = _allocator_bytes(device)
                st.update(allocated_bytes=mem1[0] - mem0[0], reserved_bytes=mem1[1] - mem0[1])
            if runner.graph is not None and runner.graph.warmup_peak_bytes is not None:
                st["pool_reserve_bytes"] = runner.graph.warmup_peak_bytes  # the first capture's reserve
            self.bucket_load_stats[b.key] = st
        # Where start-up time goes, per phase (seconds): users tune cold start with this.
        self.load_stats = {
            "package_load_s": round(sum(r.load_s for r in self._runners.values()), 3),
            "warmup_capture_s": round(sum(r.capture_s for r in self._runners.values()), 3),
            # of which the warm-up calls (each package's first call: lazy loads and per-shape library set-up)
            "warmup_s": round(sum(r.graph.warmup_s for r in self._runners.values() if r.graph is not None), 3),
        }
        self._axes = entry.axis_names()
        self.max_sizes = {a: max(b.sizes[a] for b in entry.buckets) for a in self._axes}

    # ------------------------------------------------------------------------------ public
    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.entry.inputs]

    @property
    def buckets(self) -> list[dict[str, int]]:
        return [dict(b.sizes) for b in self.entry.buckets]

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights this stage holds on its device (tensors shared with another stage count in each)."""
        return sum(t.numel() * t.element_size() for t in self._weights.values())

    def __call__(self, *args, **kwargs):
        named = self._bind(args, kwargs)
        sizes, pending = self._validate(named)
        outs = self._run(named, sizes, pending)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def __repr__(self) -> str:
        return (
            f"Stage({self.name!r}, kind={self.kind!r}, device={self.device}, buckets={len(self._runners)}, "
            f"graphs={self.uses_cuda_graphs})"
        )

    # ---------------------------------------------------------------------------- internals
    def _bind(self, args: Sequence, kwargs: dict) -> dict[str, torch.Tensor]:
        names = self.input_names
        if len(args) > len(names):
            raise InputShapeError(f"{self.name}: takes {len(names)} inputs ({', '.join(names)}), got {len(args)}")
        named = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise InputShapeError(f"{self.name}: unknown input {k!r} (inputs: {', '.join(names)})")
            if k in named:
                raise InputShapeError(f"{self.name}: input {k!r} given twice")
            named[k] = v
        missing = [n for n in names if n not in named]
        if missing:
            raise InputShapeError(f"{self.name}: missing input {missing[0]!r}")
        for k, v in named.items():
            if isinstance(v, np.ndarray):
                named[k] = torch.from_numpy(v)
            elif not isinstance(v, torch.Tensor):
                raise InputDTypeError(
                    f"{self.name}: input {k!r} must be a torch.Tensor or numpy array, got {type(v).__name__}"
                )
        return named

    def _validate(self, named: dict[str, torch.Tensor]) -> tuple[dict[str, int], bool]:
        """Check every input (runtime/validation.py) and move it to the device: the request's axis sizes, and
        whether the value checks of its device inputs are pending (they run over the bucket's buffers)."""
        sizes, pending = self._inputs.check_deferring(
            self.entry.inputs,
            named,
            values=self.validate_inputs,
            defer=self.capture_value_checks and self._values_capturable,
        )
        return self._derived_sizes(sizes), pending

    def _derived_sizes(self, sizes: dict[str, int]) -> dict[str, int]:
        """Bucket-axis sizes plus the output axes a kind derives from them (the encoder's `frames`)."""
        return sizes

    def pick_bucket(self, sizes: dict[str, int]) -> BucketEntry | None:
        fits = [b for b in self.entry.buckets if all(b.sizes[a] >= sizes[a] for a in self._axes)]
        return min(fits, key=lambda b: math.prod(b.sizes.values())) if fits else None

    def _run(self, named: dict[str, torch.Tensor], sizes: dict[str, int], pending: bool = False) -> list[torch.Tensor]:
        """`pending`: the device inputs' value checks are still to run (`_validate`)."""
        if pending and self.pick_bucket(sizes) is None:
            # not one bucket's buffers (a split batch, an overflow): the whole request is checked here, so errors
            # index the caller's tensors
            self._inputs.check_values(self.entry.inputs, named)
            pending = False
        if "batch" in sizes and sizes["batch"] > self.max_sizes.get("batch", sizes["batch"]):
            return self._run_split_batch(named, sizes, self.max_sizes["batch"])
        for axis in self._axes:
            if sizes[axis] > self.max_sizes[axis]:
                return self._run_overflow(named, sizes, axis)
        if "batch" in sizes and self.pick_bucket(sizes) is None:
            # a plan without the large-batch buckets of its long windows (BucketPlan.max_batch_frames): the
            # rows go through in the largest batch compiled at this size (batch 1 always is)
            return self._run_split_batch(named, sizes, self._largest_batch_at(sizes))
        return self._run_bucket(named, sizes, pending)

    def _largest_batch_at(self, sizes: dict[str, int]) -> int:
        fits = [
            b.sizes["batch"]
            for b in self.entry.buckets
            if b.sizes["batch"] <= sizes["batch"] and all(b.sizes[a] >= sizes[a] for a in self._axes if a != "batch")
        ]
        if not fits:
            raise InputShapeError(f"{self.name}: no bucket covers {sizes} even at batch 1; rebuild with one")
        return max(fits)

    def _run_bucket(
        self, named: dict[str, torch.Tensor], sizes: dict[str, int], pending: bool = False
    ) -> list[torch.Tensor]:
        bucket = self.pick_bucket(sizes)
        assert bucket is not None
        runner = self._runners[bucket.key]
        inputs = [named[s.name] for s in self.entry.inputs]
        pads = [s.pad for s in self.entry.inputs]
        with self._lock:
            outs = runner.run(inputs, pads, named if pending else None)
            if not runner.outputs_checked:
                self._check_outputs(runner, outs)
            trimmed = []
            for spec, o in zip(self.entry.outputs, outs):
                idx = [slice(None)] * o.dim()
                for d, axis, scale in spec.axes():
                    idx[d] = slice(0, sizes[axis] * scale)
                # clone: graph outputs live in the stage pool and the next replay overwrites them
                trimmed.append(o[tuple(idx)].clone() if runner.graph is not None else o[tuple(idx)].contiguous())
        return trimmed

    def _check_outputs(self, runner: _BucketRunner, outs: list[torch.Tensor]) -> None:
        """Once per bucket: the package's outputs must be what the manifest says, or trimming would be wrong."""
        check_outputs(
            self.name, runner.bucket.key, self.entry.outputs, self._derived_sizes(dict(runner.bucket.sizes)), outs
        )
        runner.outputs_checked = True

    def _batch_dim(self, spec: TensorSpec) -> int | None:
        return next((d for d, axis, _ in spec.axes() if axis == "batch"), None)

    def _run_split_batch(self, named, sizes, step: int) -> list[torch.Tensor]:
        parts = []
        for start in range(0, sizes["batch"], step):
            sub = {}
            for spec in self.entry.inputs:
                d = self._batch_dim(spec)
                sub[spec.name] = named[spec.name].narrow(d, start, min(step, sizes["batch"] - start))
            parts.append(self._run(sub, {**sizes, "batch": min(step, sizes["batch"] - start)}))
        return [
            torch.cat([p[i] for p in parts], dim=self._batch_dim(spec)) for i, spec in enumerate(self.entry.outputs)
        ]

    def _run_overflow(self, named, sizes, axis: str) -> list[torch.Tensor]:
        raise InputShapeError(
            f"{self.name}: {axis} = {sizes[axis]} exceeds the largest bucket "
            f"({self.max_sizes[axis]}); rebuild with larger buckets"
        )
