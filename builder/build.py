"""The build pipeline for one family:

faithful eager module → passes → parity of the rewritten module → torch.export + AOTI per bucket, or once per
stage with the bucket axes dynamic (`--dynamic-packages`, on by default for CPU builds) → weights (from the
compile, identical across packages) → golden cases → manifest → fresh packages loaded once in a subprocess and
compared with eager → atomic rename into place."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime as _dt
import fcntl
import hashlib
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..runtime.artifact import (
    CHUNK_BYTES,
    FORMAT_VERSION,
    MANIFEST,
    BucketEntry,
    FileEntry,
    Manifest,
    OnnxEntry,
    StageEntry,
    TensorSpec,
    WeightSpec,
    check_files,
    json_value,
    read_manifest,
    write_manifest,
)
from ..runtime.dtypes import dtype_name
from ..runtime.errors import ArtifactError, ManifestError
from . import golden_reference
from .buckets import BucketPlan
from .build_inputs import INPUTS_KEY, build_inputs_key
from .cache_prune import describe, prune
from .dynamic_shapes import DynamicExportError, export_dynamic, plan_ranges, range_record, with_steps
from .export import CompileError, compile_bucket, compiler_info, export_bucket, export_program, inductor_options
from .kernels import pdl
from .kernels.qkv_attention import METADATA_KEY as QKV_ATTENTION_METADATA_KEY
from .kernels.qkv_attention import enabled as qkv_attention_enabled
from .kernels.sequence_attention_o import METADATA_KEY as ATTENTION_O_METADATA_KEY
from .kernels.sequence_attention_o import enabled as attention_o_enabled
from .kernels.skinny_linear import METADATA_KEY as STREAM_METADATA_KEY
from .kernels.skinny_linear import (
    NORM_OUT_OFF_METADATA_KEY,
    SWAP_AB_METADATA_KEY,
    norm_out_enabled,
    stream_tiles,
    swap_ab_tiles,
)
from .load_check import LoadCheck
from .module_copy import module_sharing_tensors
from .package_cache import (
    PackageCache,
    cache_key,
    cached_compile,
    golden_key,
    kernel_sources_hash,
    module_layout,
    module_tensors,
    module_values_digest,
    pre_export_key,
    program_sources,
    stable_text,
    tensor_digest,
)
from .parallel_compile import CompilePool, CompileTask, host_memory_bytes
from .pass_parity import pass_parity_problem
from .passes import cast_to_compute_dtype, count_parameters
from .saved_programs import StageTensors, save_program
from .stage_spec import StageSpec

VERIFY_TIMEOUT_S = 1800  # the subprocess that loads the fresh packages and runs the golden cases
FILE_MODE, DIR_MODE = 0o644, 0o755  # every file / folder of an artifact: written by the builder, read by servers


class BuildError(RuntimeError):
    """A build failed; nothing was written to the destination."""


class Reporter:
    """Progress callbacks; the CLI implements them with rich, tests use this silent default."""

    def stage_start(self, stage: str, n_buckets: int) -> None: ...
    def bucket_done(self, stage: str, key: str, seconds: float) -> None: ...
    def note(self, msg: str) -> None: ...


@dataclass
class BuildResult:
    path: Path
    manifest: Manifest
    seconds: float
    up_to_date: bool = False  # the installed artifact was built from the same inputs: checked, not rebuilt


def build_env(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": f"{platform.system()}-{platform.machine()}",
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        env["triton"] = None
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        env["sm"] = f"{major}.{minor}"
        env["gpu_name"] = torch.cuda.get_device_name(device)
    else:
        env["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    env.update(compiler_info())
    env["cxx11_abi"] = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    try:
        from importlib.metadata import version

        env["ttsaot"] = version("ttsaot")
    except Exception:  # noqa: BLE001
        env["ttsaot"] = None
    return env


class _BuildLock:
    """An exclusive lock per destination so two builds cannot interleave their renames: `flock` on
    `<out>/.<family>.lock`, a file that exists only while a build holds it (removed before the lock is released;
    a file left by a killed build is stale and simply taken over)."""

    def __init__(self, final: Path) -> None:
        self.final = final
        self.path = final.parent / f".{final.name}.lock"

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_CREAT | os.O_RDWR, FILE_MODE)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise BuildError(
                    f"another build is writing {self.final} (it holds {self.path}); wait for it to finish"
                ) from None
            # The holder we waited for may have removed the file after we opened it: then the lock we got is on
            # an unlinked file that nobody else can see. Retry on the file that is there now.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                return self
            os.close(fd)

    def __exit__(self, *exc):
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


class _TerminateAsInterrupt:
    """SIGTERM (a job scheduler, `kill`, a container stop) raises KeyboardInterrupt while a build runs, so the
    same cleanup as Ctrl-C removes the temporary directory. Library code that swallows the KeyboardInterrupt
    (seen: a SIGTERM during a CPU build let the build finish and exit 0) cannot hide it: the signal is remembered
    and `check()`, called between stages and before the install, raises it again. Signal handlers belong to the
    main thread: elsewhere this does nothing."""

    def __enter__(self):
        self.previous = None
        self.signalled: int | None = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._raise)
        return self

    def _raise(self, signum, frame):
        self.signalled = signum
        raise KeyboardInterrupt(f"terminated by signal {signum}")

    def check(self) -> None:
        if self.signalled is not None:
            raise KeyboardInterrupt(f"terminated by signal {self.signalled}")

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def _save_safetensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)


def _normalize_modes(root: Path) -> None:
    """One mode for the whole artifact (safetensors writes 0600 and mkdtemp makes 0700 folders; the rest follows
    the umask): files 0644, folders 0755."""
    root.chmod(DIR_MODE)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), DIR_MODE)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), FILE_MODE)


def _io_specs(descs: list[dict[str, Any]], where: str) -> list[TensorSpec]:
    """The stage spec's I/O descriptors, checked by the runtime's own rules before anything is compiled."""
    try:
        return [TensorSpec.from_dict(json_value(d), f"{where}[{i}]") for i, d in enumerate(descs)]
    except ManifestError as e:
        raise BuildError(
            f"{where}: the stage spec's I/O descriptor does not fit the artifact format "
            f"({str(e).removeprefix('manifest.json: ')})"
        ) from None


def _trace_switches() -> dict[str, str]:
    """Package metadata: the kernel layer's trace-time switches this process built with ("1" / "0"), which
    `inspect` reports: skinny_linear's streamed and swapped tile forms, the fused qkv + attention, the RMSNorm
    hand-over off, the LocDiT's attention inside o_proj."""
    return {
        STREAM_METADATA_KEY: "1" if stream_tiles() else "0",
        SWAP_AB_METADATA_KEY: "1" if swap_ab_tiles() else "0",
        QKV_ATTENTION_METADATA_KEY: "1" if qkv_attention_enabled() else "0",
        NORM_OUT_OFF_METADATA_KEY: "0" if norm_out_enabled() else "1",
        ATTENTION_O_METADATA_KEY: "1" if attention_o_enabled() else "0",
    }


def input_signature(args: tuple) -> str:
    return json.dumps([[list(a.shape), dtype_name(a.dtype)] for a in args])


def _golden_sizes(spec: StageSpec) -> list[dict[str, int]]:
    """One case per distinct size of every non-batch axis (at the smallest batch), the largest batch at the
    smallest sizes, and the family's off-bucket cases (exercise padding and trimming)."""
    if not spec.golden_buckets:
        return list(spec.golden_sizes)
    buckets = spec.plan.buckets()
    axes = list(spec.plan.axes)
    out: list[dict[str, int]] = []
    if "batch" in axes:
        bmin, bmax = min(spec.plan.axes["batch"]), max(spec.plan.axes["batch"])
        for b in buckets:
            if b["batch"] == bmin and b not in out:
                out.append(b)
        smallest = {a: (bmax if a == "batch" else min(spec.plan.axes[a])) for a in axes}
        if smallest not in out:
            out.append(smallest)
    else:
        out = list(buckets)
    for extra in spec.golden_sizes:
        if extra not in out:
            out.append(extra)
    return out


FORMATS = ("aoti", "onnx")


def parse_formats(value: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    """`aoti`, `onnx`, `aoti,onnx` → a tuple in canonical order; refuses unknown or empty formats."""
    items = value.split(",") if isinstance(value, str) else list(value or ("aoti",))
    items = [f.strip().lower() for f in items if f.strip()]
    bad = [f for f in items if f not in FORMATS]
    if bad or not items:
        raise BuildError(f"unknown artifact format {bad[0] if bad else value!r} (have: {', '.join(FORMATS)})")
    return tuple(f for f in FORMATS if f in items)


def prepare_modules(spec: StageSpec, kernels: str = "inductor") -> tuple[torch.nn.Module, torch.nn.Module, list]:
    """The start of every stage build: (the faithful module, a copy rewritten by the stage's passes, and the kernel
    passes when `kernels` is "ttsaot", the pass reports), both fp32 on the CPU. The bench measures these same
    modules eagerly."""
    original = spec.make_module().eval()
    rewritten = copy.deepcopy(original)
    passes = spec.passes + (spec.kernel_passes if kernels == "ttsaot" else [])
    return original, rewritten, [p(rewritten) for p in passes]


def build_stage(
    spec: StageSpec, tmp: Path, device: torch.device, seed: int, reporter: Reporter, **options: Any
) -> StageEntry:
    """Build one stage into `tmp`; returns its manifest entry. `options`: prepare_stage's keywords (`cache`: reuse
    packages compiled before; `jobs`: compile the stage's packages on that many worker processes; ...)."""
    pending = prepare_stage(spec, tmp, device, seed, reporter, **options)
    _compile_all([pending.compile] if pending.compile is not None else [], options.get("jobs", 1))
    return pending.finish()


def prepare_stage(
    spec: StageSpec,
    tmp: Path,
    device: torch.device,
    seed: int,
    reporter: Reporter,
    extra_inductor_options: dict | None = None,
    formats: tuple[str, ...] = ("aoti",),
    cache: PackageCache | None = None,
    jobs: int = 1,
    defer_golden_bytes: float = 0,
) -> _PendingStage:
    """Everything of a stage's build but its AOTI compiles: golden cases, passes, ONNX export, the exports and
    package-cache lookups of its packages. `_compile_all` then compiles the packages of one or several stages
    (a CPU build's stages each have one or a few dynamic packages: compiling them side by side keeps `--jobs`
    workers busy), and `finish` writes the stage's files and returns its manifest entry. `defer_golden_bytes`: the
    golden cases wait (`_GoldenWork.run`, at the latest in `finish`) when keeping the fp32 modules they need takes
    no more host memory than this."""
    if spec.fp32_only and spec.dtype != torch.float32:
        raise BuildError(f"{spec.name}: this stage is fp32 only (numerics policy), refusing {spec.dtype}")
    inputs_spec = _io_specs(spec.inputs, f"{spec.name}.inputs")
    outputs_spec = _io_specs(spec.outputs, f"{spec.name}.outputs")
    kernels = spec.kernels_on(device)
    clock = _PhaseClock()
    original, rewritten, pass_reports = prepare_modules(spec, kernels)
    clock.lap("modules")
    before = count_parameters(original)

    # Golden inputs and the fp32 eager reference of the ORIGINAL faithful module (from the cache when it holds the
    # cases of these very modules, weights and inputs: builder/package_cache.py `golden_key`).
    golden_inputs = [
        _GoldenCase(sizes, seed * 1000 + i, spec.make_inputs(sizes, torch.Generator().manual_seed(seed * 1000 + i)))
        for i, sizes in enumerate(_golden_sizes(spec))
    ]
    cases = [c.name for c in golden_inputs]
    golden = _GoldenWork(
        spec, original, rewritten, golden_inputs, cache, tmp, f"golden/{spec.name}.safetensors", device
    )
    if golden.host_bytes <= defer_golden_bytes:
        # the compute-dtype cast below replaces the module's tensors (builder/passes/cast.py), never writes into them
        golden.rewritten = module_sharing_tensors(rewritten)
    else:
        golden.run()
        clock.lap(golden.label)  # the clock adds the seconds
    del original

    module = cast_to_compute_dtype(rewritten, spec.dtype).to(device).eval()
    after = count_parameters(module)
    entry = StageEntry(
        name=spec.name,
        kind=spec.kind,
        dtype=dtype_name(spec.dtype),
        inputs=inputs_spec,
        outputs=outputs_spec,
        weights=None,
        constants={},
        buckets=[],
        golden=None,
        golden_cases=cases,
        tolerance=float(spec.tolerance),
        metadata=json_value(spec.metadata),
        config=json_value(spec.config),
        passes=json_value(pass_reports),
        inductor_options=json_value(extra_inductor_options or {}),
        kernels=kernels,
        checkpoint=json_value({**spec.checkpoint_report, "params_before": before, "params_after": after}),
    )
    if "onnx" in formats:
        from .onnx_export import OnnxExportError, export_stage_onnx, manifest_entry

        try:
            res = export_stage_onnx(spec, module, tmp / "onnx" / f"{spec.name}.onnx", seed=seed)
        except OnnxExportError as e:
            raise BuildError(str(e)) from e
        entry = replace(entry, onnx=OnnxEntry.from_dict(json_value(manifest_entry(res, tmp)), f"{spec.name}.onnx"))
        reporter.note(
            f"{spec.name}: ONNX opset {res.opset}, dynamic {res.dynamic_axes or '-'}, "
            f"{res.seconds:.1f}s" + "".join(f"; {n}" for n in res.notes)
        )
        clock.lap("onnx")
    compile_ = None
    if "aoti" in formats:
        compile_ = _StageCompile(spec, module, tmp, device, seed, reporter, extra_inductor_options, cache, jobs)
        # with workers the static packages export as they are handed over (`_submit_compiles`)
        clock.lap("exports and cache lookups" if any(j.ep is not None for j in compile_.work) else "cache lookups")
    reporter.note(f"{spec.name}: prepared in {clock.text()}" + ("" if golden.done else "; golden cases deferred"))
    return _PendingStage(entry, compile_, golden, reporter)


@dataclass
class _GoldenWork:
    """A stage's golden cases (`_golden_cases`, or the package cache's copy), made during `prepare_stage` or, in a
    parallel build, deferred until every stage is exported and its packages are compiling: the cases run the fp32
    modules (on the build's GPU where it has room, builder/golden_reference.py), and in the build's own process they
    held back every later stage's exports (the H100 Fish build started its DAC encoder's compile ~250 s in, behind
    the encoder's golden cases: 248 s of the 296 s its preparation takes on a 2-core CPU,
    `bench.probes.prepare_phases`)."""

    spec: StageSpec
    original: torch.nn.Module | None
    rewritten: torch.nn.Module | None  # fp32, on the host
    inputs: list[_GoldenCase]
    cache: PackageCache | None
    tmp: Path
    rel: str  # the golden file, in tmp
    device: torch.device  # the build's
    golden: dict[str, torch.Tensor] | None = None  # None once done: fetched from the package cache into place
    key: str | None = None
    seconds: float = 0.0
    reference: torch.device | None = None  # where the cases ran (builder/golden_reference.py), once run
    # what keeping the cases' modules until they run takes: the faithful module and a copy of the rewritten one
    host_bytes: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.host_bytes = 2 * _module_bytes(self.original)

    @property
    def done(self) -> bool:
        return self.original is None

    def run(self) -> None:
        if self.done:
            return
        t0 = time.perf_counter()
        self.reference = golden_reference.reference_device(self.device, self.host_bytes)
        if self.cache is not None:
            self.key = _golden_key(self.spec, self.original, self.rewritten, self.inputs, self.reference)
        if self.key is None or not self.cache.fetch_golden(self.key, self.tmp / self.rel):
            self.golden = _golden_cases(self.spec, self.original, self.rewritten, self.inputs, self.reference)
        self.original = self.rewritten = None  # their memory goes now, not with the stage
        if self.reference.type == "cuda":
            torch.cuda.empty_cache()  # the fp32 modules' blocks, for the workers and the verifying subprocess
        self.seconds = time.perf_counter() - t0

    @property
    def label(self) -> str:
        cached = " (cached)" if self.golden is None else ""
        where = f" on {self.reference.type}" if self.reference is not None else ""
        return f"golden {len(self.inputs)} case(s){where}{cached}"

    def text(self) -> str:
        return f"{self.label} {self.seconds:.1f}s"


def _module_bytes(module: torch.nn.Module) -> int:
    """The bytes of a module's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


class _PhaseClock:
    """Wall seconds of a stage's preparation phases, for one build-log line: stages are prepared one after another
    in the build's own process while earlier stages compile, so a slow phase here delays every later compile (the
    H100 Fish build started its DAC encoder's compile ~250 s in)."""

    def __init__(self) -> None:
        self.t0 = self.last = time.perf_counter()
        self.laps: list[tuple[str, float]] = []

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps.append((name, now - self.last))
        self.last = now

    def text(self) -> str:
        parts = ", ".join(f"{name} {secs:.1f}s" for name, secs in self.laps)
        return f"{self.last - self.t0:.1f}s ({parts})"


@dataclass
class _PendingStage:
    """A prepared stage waiting for its compiles (`prepare_stage`)."""

    entry: StageEntry
    compile: _StageCompile | None
    golden: _GoldenWork
    reporter: Reporter

    @property
    def compiled(self) -> bool:
        """Whether every package of the stage is in (compiled or taken from the package cache)."""
        return self.compile is None or not self.compile.todo()

    def device_bytes(self) -> int:
        """What the prepared stage holds on its device until it is compiled: its module's tensors."""
        return 0 if self.compile is None else _module_bytes(self.compile.module)

    def make_golden(self) -> None:
        """The golden cases, if `prepare_stage` deferred them (a rewrite that changes the math stops the build here)."""
        if not self.golden.done:
            self.golden.run()
            self.reporter.note(f"{self.entry.name}: {self.golden.text()} while the packages compile")

    def finish(self) -> StageEntry:
        entry = self.entry
        self.make_golden()
        if self.compile is not None:
            entry = replace(entry, **self.compile.finalize())
        g = self.golden
        if g.golden is not None:
            _save_safetensors(g.golden, g.tmp / g.rel)
            if g.key is not None:
                g.cache.store_golden(g.key, g.tmp / g.rel)
        return replace(entry, golden=FileEntry.of(g.tmp, g.rel))


@dataclass(frozen=True)
class _GoldenCase:
    sizes: dict[str, int]
    seed: int  # of its inputs (the float64 pass-parity re-check draws them again)
    inputs: dict[str, torch.Tensor]

    @property
    def name(self) -> str:
        return BucketPlan.key(self.sizes)


def _golden_key(
    spec: StageSpec,
    original: torch.nn.Module,
    rewritten: torch.nn.Module,
    golden_inputs: list[_GoldenCase],
    reference: torch.device = golden_reference.HOST,
) -> str:
    """What decides `_golden_cases` on `reference` (builder/package_cache.py `golden_key` adds the code, torch and
    the CPU)."""
    return golden_key(
        {
            "reference": golden_reference.describe(reference),
            "spec": stable_text({f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}),
            "original": module_layout(original),
            "rewritten": module_layout(rewritten),
            "weights": module_values_digest(original),
            "inputs": [[c.name, {n: tensor_digest(t) for n, t in sorted(c.inputs.items())}] for c in golden_inputs],
        }
    )


def _golden_cases(
    spec: StageSpec,
    original: torch.nn.Module,
    rewritten: torch.nn.Module,
    golden_inputs: list[_GoldenCase],
    device: torch.device = golden_reference.HOST,
) -> dict[str, torch.Tensor]:
    """Per case: the inputs, the faithful module's outputs (and sampling margins), after checking that the
    rewritten module computes the same (`pass_parity`); the forwards on `device` (builder/golden_reference.py), the
    modules moved there in place, the cases returned on the host."""
    golden: dict[str, torch.Tensor] = {}
    original, rewritten = original.to(device), rewritten.to(device)
    for c in golden_inputs:
        case = c.name
        # the inputs as the forwards leave them (step modules write their cache inputs in place)
        inputs = {n: t.to(device) for n, t in c.inputs.items()}
        with torch.no_grad(), golden_reference.reference_forwards(device):
            ref = original(*[inputs[n] for n in spec.input_names])
            mid = rewritten(*[inputs[n] for n in spec.input_names])
            ref = ref if isinstance(ref, tuple) else (ref,)
            mid = mid if isinstance(mid, tuple) else (mid,)
            problem = pass_parity_problem(spec, original, rewritten, c.sizes, c.seed, ref, mid)
            if problem is not None:
                raise BuildError(problem)
            for o_desc, r in zip(spec.outputs, ref):
                golden[f"{case}/out/{o_desc['name']}"] = r.detach().contiguous().cpu()
            if spec.reference_margins is not None:
                # how decided each sampled code of the reference is: verify allows another code only at a near-tie
                for name, margin in spec.reference_margins(original, inputs).items():
                    golden[f"{case}/margin/{name}"] = margin.float().contiguous().cpu()
        for n in spec.input_names:
            golden[f"{case}/in/{n}"] = inputs[n].contiguous().cpu()
    return golden


class _StageCompile:
    """A stage's AOTI packages: one per bucket, or (`spec.dynamic_mode(device)`) one dynamic-shape package for as
    many buckets as the graph allows (`_dynamic_jobs`), or both (`cold`: static ones for the hot buckets). Made in
    three steps: here, the exports and the package cache's lookups (a package found through the pre-export index is
    not even exported); `_compile_all`, the compiles of what the cache did not have (of one or several stages);
    `finalize`, the stage's weights file (the constants every package binds, identical across packages) and the
    `weights`, `constants`, `buckets` and `packaging` fields of its entry."""

    def __init__(
        self,
        spec: StageSpec,
        module: torch.nn.Module,
        tmp: Path,
        device: torch.device,
        seed: int,
        reporter: Reporter,
        extra_inductor_options: dict | None,
        cache: PackageCache | None = None,
        jobs: int = 1,
    ) -> None:
        self.spec, self.module, self.tmp, self.device = spec, module, tmp, device
        self.reporter, self.extra, self.cache = reporter, extra_inductor_options, cache
        self.buckets = spec.plan.buckets()
        reporter.stage_start(spec.name, len(self.buckets))
        self.toolchain = build_env(device) if cache is not None else None
        self.results: dict[str, dict[str, torch.Tensor]] = {}  # package file → its weights
        self.reused = 0
        self.awaiting: list[_Job] = []  # packages another build sharing the cache is compiling (_submit_compiles)
        self.handed = StageTensors()  # the tensors of the programs handed to a compile pool (_hand_over)
        # What decides the exported program besides the bucket (builder/package_cache.py `pre_export_key`).
        self.tensors = module_tensors(module) if cache is not None else {}
        self.layout = _stage_layout(spec, module) if cache is not None else ""
        self.signatures: dict[str, str] = {}  # bucket key → the input signature its package is stamped with
        self.examples: dict[str, tuple] = {}
        for sizes in self.buckets:
            key = BucketPlan.key(sizes)
            ex = spec.make_inputs(sizes, torch.Generator().manual_seed(seed))
            self.examples[key] = tuple(ex[n].to(device) for n in spec.input_names)
            self.signatures[key] = input_signature(self.examples[key])
        self.kernels = spec.kernels_on(device)
        # Exported up front when the compiles run here, one after another, and the package cache keys on the
        # program. With workers, `_submit_compiles` exports each package and hands it over at once.
        export_all = cache is not None and jobs <= 1
        self.work: list[_Job] = []
        mode = spec.dynamic_mode(device)
        if mode == "off":
            self.packaging = {"mode": "static", "reason": _static_reason(spec, device)}
            self.work = self.static_work(self.buckets, export_all)
        else:
            # `cold`: the hot buckets keep a static package each (their kernels tuned for their shape), the others
            # share dynamic ones; `on`: every bucket is "cold"
            hot = [b for b in self.buckets if mode == "cold" and spec.is_hot(b)]
            cold = [b for b in self.buckets if b not in hot]
            self.work = self.static_work(hot, export_all, reason=HOT_REASON)
            if cold:
                self.work += _dynamic_jobs(self, module, seed, cold, set())
            self.packaging = _packaging(self.work)

    # ------------------------------------------------------------------------------------------ jobs
    def static_work(self, buckets: list[dict[str, int]], export: bool, reason: str = "") -> list[_Job]:
        """A static package per bucket, looked up in the cache, exported now when `export` (else at compile)."""
        work = []
        for sizes in buckets:
            job = self.static_job(sizes)
            job.reason = reason
            work.append(job)
            if not self.lookup(job) and export:
                self.export_static(job)
        return work

    def static_job(self, sizes: dict[str, int]) -> _Job:
        spec, key = self.spec, BucketPlan.key(sizes)
        # the package's own record of what it was compiled for: the runtime cross-checks it, so an edited
        # manifest cannot feed it other shapes
        metadata = {
            "ttsaot_stage": spec.name,
            "ttsaot_bucket": key,
            "ttsaot_family": spec.family,
            "ttsaot_inputs": self.signatures[key],
            pdl.METADATA_KEY: "1" if pdl.wanted_for(sizes) else "0",
            **_trace_switches(),
        }
        return _Job([key], [dict(sizes)], f"{spec.name}/{key}.pt2", self.examples[key], f"{spec.name}_{key}", metadata)

    def export_static(self, job: _Job) -> None:
        try:
            job.ep = export_bucket(self.module, job.args, self.device)
        except CompileError as e:
            raise BuildError(f"{self.spec.name}/{job.keys[0]}: {e}") from e
        self.exported(job)

    def context(self, job: _Job, dynamic: dict[str, tuple] | None) -> dict[str, Any]:
        """The package cache's part of the build: for a static package what it has always been (so `off` keeps
        reusing the entries of per-bucket builds), for a dynamic one every bucket it serves and the ranges."""
        spec = self.spec
        ctx: dict[str, Any] = {"family": spec.family, "stage": spec.name}
        if job.dynamic is None:
            ctx.update(bucket=job.keys[0], sizes=dict(job.sizes[0]))
        else:
            ctx.update(
                buckets={k: self.signatures[k] for k in job.keys}, dynamic={a: list(r) for a, r in dynamic.items()}
            )
        ctx.update(
            dtype=dtype_name(spec.dtype),
            kernels=self.kernels,
            inputs=input_signature(job.args),
            toolchain=self.toolchain,
            inductor_options=inductor_options(job.model_name, job.metadata, self.device, self.extra),
        )
        return ctx

    def lookup(self, job: _Job) -> bool:
        """Reuse the package of the job's pre-export key (no export); True when it was found."""
        if self.cache is None:
            return False
        job.pre_id = pre_export_key(self.context(job, job.dynamic), self.layout)
        found = self.cache.fetch_indexed(job.pre_id, self.tensors, self.tmp / job.rel)
        if found.weights is None:
            return False
        self.reused += 1
        if job.dynamic is not None:
            job.dynamic_got = _stamped_ranges(self.tmp / job.rel)
        self.finished(job, found.weights)
        return True

    def exported(self, job: _Job) -> None:
        if self.cache is not None:
            job.cache_id = cache_key(job.ep, self.context(job, job.dynamic_got or job.dynamic))
            job.sources = program_sources(job.ep)

    def finished(self, job: _Job, package_weights: dict[str, torch.Tensor], at: float | None = None) -> None:
        """`at`: when the package was done (a worker's finish, CompileTask.finished_at), if not now."""
        self.results[job.rel] = package_weights
        for key in job.keys:
            self.reporter.bucket_done(self.spec.name, key, (at or time.time()) - job.t0)

    def indexed(self, job: _Job) -> None:
        """Point the job's pre-export key at its package, now in the cache, so a rebuild skips the export."""
        if self.cache is not None and job.pre_id is not None and job.cache_id is not None:
            self.cache.index(job.pre_id, job.cache_id, job.sources, self.tensors)

    def todo(self) -> list[_Job]:
        return [job for job in self.work if job.rel not in self.results]

    def compile_here(self, job: _Job):
        return compile_bucket(
            self.module,
            job.args,
            self.device,
            self.tmp / job.rel,
            model_name=job.model_name,
            metadata=job.metadata,
            extra_options=self.extra,
            exported=job.ep,
        )

    # -------------------------------------------------------------------------------------- results
    def finalize(self) -> dict[str, Any]:
        spec, tmp = self.spec, self.tmp
        weights: dict[str, torch.Tensor] | None = None
        by_key: dict[str, BucketEntry] = {}
        for job in self.work:  # plan order below, whatever order the compiles finished in
            pw = self.results[job.rel]
            if weights is None:
                weights = pw
            elif list(pw) != list(weights) or any(not torch.equal(pw[k], weights[k]) for k in weights):
                diff = sorted(set(pw) ^ set(weights))[:3] or "values"
                raise BuildError(
                    f"{spec.name}/{job.label}: compiled constants differ from the first package's ({diff}); "
                    "weights could not be shared"
                )
            f = FileEntry.of(tmp, job.rel)
            for key, sizes in zip(job.keys, job.sizes):
                by_key[key] = BucketEntry(key=key, sizes=sizes, file=f.file, sha256=f.sha256, bytes=f.bytes)
        bucket_entries = [by_key[BucketPlan.key(sizes)] for sizes in self.buckets]
        if self.cache is not None:
            for msg in self.cache.notes:
                self.reporter.note(msg)
            self.cache.notes.clear()
            self.reporter.note(f"{spec.name}: {self.reused} of {len(self.work)} packages reused from the package cache")
        if len(self.work) < len(self.buckets):
            self.reporter.note(
                f"{spec.name}: {len(self.work)} package(s) for {len(self.buckets)} buckets "
                f"({_packaging_text(self.packaging)})"
            )
        assert weights is not None
        wrel = f"{spec.name}.safetensors"
        _save_safetensors(weights, tmp / wrel, metadata={"ttsaot_stage": spec.name})
        constants = {
            k: WeightSpec(dtype=dtype_name(t.dtype), shape=list(t.shape), stride=list(t.contiguous().stride()))
            for k, t in weights.items()
        }
        return {
            "weights": FileEntry.of(tmp, wrel, chunk_bytes=CHUNK_BYTES),
            "constants": constants,
            "buckets": bucket_entries,
            "packaging": json_value(self.packaging),
        }


def compile_cost(program: torch.export.ExportedProgram, args: tuple) -> tuple[int, int]:
    """What a package's compile is ranked by: the exported graph's operator calls (each one Inductor kernel or
    user kernel to generate, compile and maybe autotune), then its example inputs' elements (bigger buckets
    autotune longer)."""
    calls = sum(1 for n in program.graph.nodes if n.op == "call_function")
    return calls, _input_elements(args)


def _compile_all(stages: list[_StageCompile], jobs: int) -> None:
    """Compile the packages the cache did not have, of every stage given: in this process one after another, or
    on `jobs` spawned workers when there are several (across stages: a CPU build has one dynamic package per
    stage, so within one stage there would be nothing to spread)."""
    todo = [(st, job) for st in stages for job in st.todo()]
    if jobs <= 1 or len(todo) <= 1:
        for st, job in todo:
            if job.ep is None and st.cache is not None:  # the cache keys on the program
                st.export_static(job)
            try:
                w, from_cache = cached_compile(
                    st.cache, job.cache_id, job.sources, st.tmp / job.rel, partial(st.compile_here, job)
                )
            except CompileError as e:
                raise BuildError(f"{st.spec.name}/{job.label}: {e}") from e
            st.reused += from_cache
            st.indexed(job)
            st.finished(job, w)
        return
    with CompilePool(min(jobs, len(todo))) as pool:
        for st in stages:
            _submit_compiles(st, pool)
        while any(st.awaiting for st in stages):  # packages other builds are compiling
            if not _take_over_awaited(stages, pool):
                _wait_a_while(pool)
        _wait(pool)


def _submit_compiles(st: _StageCompile, pool: CompilePool) -> None:
    """Hand a prepared stage's packages to the pool, each as soon as it is ready: exported here (a static package
    not yet exported), taken from the package cache where it holds the program's package, left to wait where
    another build sharing the cache is compiling it (`PackageCache.claim`: `_take_over_awaited` reuses it once
    stored), else saved and submitted at its `compile_priority`. The exports run one after another in the build's
    process, largest bucket first: a worker that is free starts a task when it is submitted, so the stage's first
    compiles run while its other buckets export. Exported all first and then handed over (d20e7ea), the H200 Fish
    build's 18 DAC decoder programs took 33 s of exports before the first was submitted, while 7 of the 16 workers
    had work (fast_ar's 3, dac_encoder's 4: bench/results/nvidia-h200/build_logs/fish-s2-pro-cold.log)."""
    t0, exported = time.time(), 0
    for job in sorted(st.todo(), key=_submission_rank, reverse=True):  # stable: plan order for ties
        if job.ep is None:
            st.export_static(job)
            exported += 1
        if _reuse(st, job):
            continue
        if st.cache is not None and not st.cache.claim(job.cache_id):
            st.awaiting.append(job)
            continue
        _hand_over(st, pool, job)
        _wait(pool, block=False)  # a failed compile stops the build now, not after the stage's last export
    if exported:
        st.reporter.note(f"{st.spec.name}: {exported} program(s) exported while compiling, {time.time() - t0:.1f}s")


def _reuse(st: _StageCompile, job: _Job) -> bool:
    """Take the job's package from the package cache if it holds it (recorded as done); whether it did."""
    if st.cache is None:
        return False
    with st.cache.lock(job.cache_id):
        found = st.cache.fetch(job.cache_id, job.sources, st.tmp / job.rel)
    if found.weights is None:
        return False
    st.reused += 1
    st.indexed(job)
    st.finished(job, found.weights)
    return True


def _hand_over(st: _StageCompile, pool: CompilePool, job: _Job) -> None:
    """Save the job's exported program and submit its compile; once compiled, its package is stored in the cache
    (and the build's claim on it released) and recorded as done. The stage's tensors are written once for all its
    programs (builder/saved_programs.py): the first program's, before its task is submitted; a later program's
    tensors that file does not hold stay in its own archive."""
    tensors = pool.programs / f"{st.spec.name}__tensors.pt"
    if st.handed.entries:
        names = st.handed.held(job.ep)
    else:
        names = st.handed.add(job.ep)
        st.handed.write(tensors)
    path = pool.programs / f"{st.spec.name}__{job.model_name}.pt2"
    save_program(job.ep, path, names)
    task = CompileTask(
        f"{st.spec.name}/{job.label}",
        path,
        job.args,
        st.device,
        st.tmp / job.rel,
        job.model_name,
        job.metadata,
        st.extra,
        tensors=tensors,
        tensor_names=names,
    )

    def compiled(task: CompileTask, package_weights: dict[str, torch.Tensor]) -> None:
        if st.cache is not None:
            with st.cache.lock(job.cache_id):
                st.cache.store(job.cache_id, st.tmp / job.rel, package_weights, job.sources)
            st.cache.release_claim(job.cache_id)
            st.indexed(job)
        st.finished(job, package_weights, task.finished_at)

    pool.submit(task, compiled, priority=compile_priority(compile_cost(job.ep, job.args)))


# How often a build whose packages another build is compiling (PackageCache.claim) looks at their claims again.
CLAIM_POLL_S = 0.5


def _take_over_awaited(stages: list[_StageCompile], pool: CompilePool) -> bool:
    """The packages that waited for another build's compile, whose claim is free now: reused from the cache (that
    build stored them), else (it failed or stopped) compiled here. Whether any moved on."""
    moved = False
    for st in stages:
        for job in list(st.awaiting):
            if not st.cache.claim(job.cache_id):
                continue
            st.awaiting.remove(job)
            moved = True
            if _reuse(st, job):
                st.cache.release_claim(job.cache_id)
            else:
                _hand_over(st, pool, job)
    return moved


def _wait_a_while(pool: CompilePool) -> None:
    """Up to CLAIM_POLL_S: for one of this build's compiles to finish, or for other builds' compiles to move on."""
    if pool.outstanding:
        _wait(pool, any_=True, timeout=CLAIM_POLL_S)
    else:
        time.sleep(CLAIM_POLL_S)


def _input_elements(args: tuple) -> int:
    return sum(a.numel() for a in args if isinstance(a, torch.Tensor))


def _submission_rank(job: _Job) -> tuple[int, float]:
    """The order a stage's packages are handed over in, largest first: by `compile_priority` where the program is
    exported (dynamic ones are, at preparation), else by the bucket's input elements (a stage's static programs
    are exports of one module at different sizes: the same operators, the larger inputs autotune longer)."""
    if job.ep is not None:
        return 1, compile_priority(compile_cost(job.ep, job.args))
    return 0, float(_input_elements(job.args))


def compile_priority(cost: tuple[int, int]) -> float:
    """`compile_cost` as the pool's priority: the most expensive waiting compile starts first (operator calls, then
    input elements; the fraction keeps that order). Submitted in plan order, a full Fish build had its 4 dac_encoder
    packages start last, behind 21 others on 16 workers (H100: fast_ar and dac_decoder done by 359 s, dac_encoder
    0/4 at 489 s, bench/results/nvidia-h100/probes/package_cpu/; on an H200 one dac_encoder package took 320 s from
    submission against 241-297 s for the dac_decoder ones,
    bench/results/nvidia-h200/probes/builds_3e10dc8.json)."""
    calls, elements = cost
    return calls + elements / (elements + 1.0)


def _wait(pool: CompilePool, block: bool = True, any_: bool = False, timeout: float | None = None) -> None:
    """Every compile submitted so far finished and recorded (or, not blocking, those finished by now; `any_`: at
    least one more, or none within `timeout` seconds)."""
    try:
        if any_:
            pool.wait_any(timeout)
        else:
            pool.wait() if block else pool.poll()
    except CompileError as e:
        raise BuildError(str(e)) from e


def _finish_as_compiled(pending: list[_PendingStage], pool: CompilePool | None, stages: dict[str, StageEntry]) -> None:
    """Finish each pending stage (its weights file, digests and golden file; `_PendingStage.finish`) into `stages`
    once its own packages are in, while the pool compiles the others'. Finished after the last compile, one after
    another, the H200 VoxCPM2 build's 7 stages took 37 s, 7-8 s per LM stage (nvidia-h200/build_logs/
    voxcpm2-cold_a6ee558.log)."""
    while pending:
        for p in [p for p in pending if p.compiled]:
            stages[p.entry.name] = p.finish()
            pending.remove(p)
        compiles = [p.compile for p in pending if p.compile is not None]
        if not pending or _take_over_awaited(compiles, pool):
            continue
        if any(st.awaiting for st in compiles):  # packages other builds are compiling
            _wait_a_while(pool)
        else:
            _wait(pool, any_=True)


def _stamped_ranges(package: Path) -> dict[str, tuple] | None:
    """The dynamic ranges a package was compiled for (`ttsaot_dynamic`), or None when it has no record."""
    from torch._C._aoti import AOTIModelPackageLoader

    meta = AOTIModelPackageLoader.load_metadata_from_package(str(package), "model")
    raw = meta.get("ttsaot_dynamic")
    return {a: tuple(r) for a, r in json.loads(raw).items()} if raw else None


# `--dynamic-packages cold`: why a bucket has a static package of its own (the manifest's packaging.reason)
HOT_REASON = "a window every chunk of a stream hits (--dynamic-packages cold)"


def _static_reason(spec: StageSpec, device: torch.device) -> str:
    if spec.dynamic_packages == "off":
        return "dynamic packages off (--dynamic-packages off)"
    return f"dynamic packages off by default on {device.type} (--dynamic-packages auto)"


def _dynamic_jobs(
    st: _StageCompile, module: torch.nn.Module, seed: int, group: list[dict[str, int]], names: set[str]
) -> list[_Job]:
    """Packages for `group` (buckets, plan order): ONE exported with every axis that has more than one size in the
    group dynamic over its range, when the graph allows; else the axes it allows dynamic, and the buckets grouped
    by the static axes' values, one package per group (recursively). A group of one bucket, or whose axes all have
    one size, is a static package per bucket. A package the cache has (`st.lookup`) is reused without exporting;
    `names`: the package tags taken so far."""
    spec, device = st.spec, st.device
    axes = {a: sorted({b[a] for b in group}) for a in spec.plan.axes}
    request = with_steps(plan_ranges(axes), spec.axis_steps, axes)
    if len(group) == 1 or not request:
        out = []
        for sizes in group:
            job = st.static_job(sizes)
            out.append(job)
            if not st.lookup(job):
                st.export_static(job)
        return out
    # Example at the largest size of every axis: ≥ 2 on the dynamic ones (torch specialises 0/1 sizes).
    top = {a: s[-1] for a, s in axes.items()}
    ex = spec.make_inputs(top, torch.Generator().manual_seed(seed))
    args = tuple(ex[n].to(device) for n in spec.input_names)
    keys = [BucketPlan.key(b) for b in group]
    fixed = {a: s[0] for a, s in axes.items() if len(s) == 1 and len(spec.plan.axes[a]) > 1}
    tag = "dynamic" + (f"_{BucketPlan.key(fixed)}" if fixed else "")
    while tag in names:  # a narrowed range split a group without a new fixed axis
        tag += "x"
    job = _Job(keys, [dict(b) for b in group], f"{spec.name}/{tag}.pt2", args, f"{spec.name}_{tag}", {}, request)
    job.metadata = {
        "ttsaot_stage": spec.name,
        "ttsaot_family": spec.family,
        # every bucket the package serves with its input signature: the runtime refuses any other
        "ttsaot_buckets": json.dumps({k: json.loads(st.signatures[k]) for k in keys}),
        pdl.METADATA_KEY: "1" if all(pdl.wanted_for(b) for b in group) else "0",
        **_trace_switches(),
    }
    if st.lookup(job):
        names.add(tag)
        return [job]
    try:
        res = export_dynamic(
            lambda shapes: export_program(module, args, device, dynamic_shapes=shapes),
            spec.inputs,
            axes,
            request,
            spec.name,
        )
    except DynamicExportError as e:
        raise BuildError(str(e)) from e
    covered = [b for b in group if res.covers(b) and all(b[a] == top[a] for a in res.dropped)]
    if len(covered) == len(group) and res.dynamic:
        # no `reason`: the constraint torch.export raised on the way to these ranges (if any) left nothing static,
        # and a rebuild that finds the package in the cache never sees it (the manifest must not depend on that)
        job.ep, job.dynamic_got = res.program, res.dynamic
        # the ranges the program accepted (torch may have narrowed them, or made them steps), in the package too:
        # a rebuild that reuses it through the pre-export index reads them back (`_StageCompile.lookup`)
        job.metadata["ttsaot_dynamic"] = json.dumps({a: list(r) for a, r in res.dynamic.items()})
        names.add(tag)
        st.exported(job)
        return [job]
    # Some axis could not be dynamic (or only over part of its range): split and try again on each part. The
    # export made at the largest sizes is not reused (its group is re-exported); only fallback stages pay it.
    rest = [b for b in group if b not in covered] if covered and res.dynamic else group
    if res.dropped:
        parts: dict[tuple, list[dict[str, int]]] = {}
        for b in group:
            parts.setdefault(tuple(b[a] for a in res.dropped), []).append(b)
        subgroups = list(parts.values())
    elif rest is group:
        subgroups = [[b] for b in group]
    else:
        subgroups = [covered, rest]
    out = []
    for sub in subgroups:
        for j in _dynamic_jobs(st, module, seed, sub, names):
            j.reason = j.reason or res.reason
            out.append(j)
    return out


def _packaging(work: list[_Job]) -> dict[str, Any]:
    """The stage entry's `packaging`: per package file, the buckets it serves and its dynamic axes."""
    packages: dict[str, Any] = {}
    reasons = sorted({j.reason for j in work if j.reason})
    for j in work:
        rec: dict[str, Any] = {"buckets": list(j.keys)}
        if j.dynamic is not None:
            got = j.dynamic_got if j.dynamic_got is not None else j.dynamic
            rec["dynamic_axes"] = {a: range_record(r) for a, r in got.items()}
        packages[j.rel] = rec
    dynamic = any(j.dynamic is not None for j in work)
    return {
        "mode": "dynamic" if dynamic else "static",
        "reason": "; ".join(reasons) if reasons else ("" if dynamic else "no axis has more than one size"),
        "packages": packages,
    }


def _packaging_text(packaging: dict[str, Any]) -> str:
    axes = sorted({a for p in packaging.get("packages", {}).values() for a in p.get("dynamic_axes", {})})
    text = f"dynamic {', '.join(axes)}" if axes else "static"
    return text + (f"; static because: {packaging['reason']}" if packaging.get("reason") else "")


# StageSpec fields that do not shape a bucket's program: the plan (each bucket keys on its own sizes, so adding one
# leaves the others' keys alone; a dynamic package keys on every bucket it serves and its ranges), golden cases,
# the checkpoint report (file hashes: values, not layout), and the dynamic-packages choice (the context says
# whether a package is static or dynamic).
_NOT_PROGRAM = frozenset(
    {"plan", "golden_sizes", "golden_buckets", "checkpoint_report", "reference_margins", "dynamic_packages"}
)


def _stage_layout(spec: StageSpec, module: torch.nn.Module) -> str:
    """The stage's part of the pre-export key: its spec (config, I/O, passes, kernel choice) and the module the
    passes made, by layout (builder/package_cache.py `module_layout`)."""
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name not in _NOT_PROGRAM}
    return stable_text(fields) + "\n" + module_layout(module)


@dataclass
class _Job:
    """One package's compile job: the buckets it serves, what it is compiled from and where it goes."""

    keys: list[str]  # the buckets it serves, plan order
    sizes: list[dict[str, int]]
    rel: str
    args: tuple  # the example inputs it is exported and compiled at
    model_name: str
    metadata: dict[str, str]
    dynamic: dict[str, tuple] | None = None  # the requested dynamic axis ranges; None: a static package
    ep: torch.export.ExportedProgram | None = None
    cache_id: str | None = None
    sources: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    t0: float = dataclasses.field(default_factory=time.time)
    pre_id: str | None = None  # the pre-export key (package cache index), when a cache is used
    dynamic_got: dict[str, tuple] | None = None  # the ranges the export accepted (narrower than asked, maybe)
    reason: str = ""  # why some plan axis is static in this package

    @property
    def label(self) -> str:
        return self.keys[0] if self.dynamic is None else Path(self.rel).stem


def subprocess_verify(
    path: Path,
    device: torch.device,
    load_check: LoadCheck,
    timeout: float = VERIFY_TIMEOUT_S,
    stages: list[str] | None = None,
) -> list[dict]:
    """Load the fresh packages in a child process and run the golden cases: a package that segfaults on load
    fails the build here instead of crashing a user's server later. `load_check`: the child, started early so that
    its imports overlap the build (builder/load_check.py)."""
    argv = [str(path), "--device", str(device), "--json"]
    if stages:
        argv += ["--stages", ",".join(stages)]
    proc = load_check.run(argv, timeout)
    if proc.returncode < 0:
        raise BuildError(
            f"loading the fresh packages killed the process with signal {-proc.returncode} "
            f"(on the GPU machine, set CXX=/usr/bin/g++ or pass --cxx); stderr: "
            f"{proc.stderr.strip().splitlines()[-1:] if proc.stderr.strip() else ''}"
        )
    try:
        results = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        # The last line of an AOTI failure is a generic "API call failed"; the cause is printed just before it.
        cause = [ln.strip() for ln in lines if "rror" in ln and "API call failed" not in ln][-2:]
        tail = " | ".join(cause + lines[-1:]) if lines else "no output"
        raise BuildError(f"verifying the fresh artifact failed: {tail}") from None
    bad = [r for r in results if not r["ok"]]
    if bad:
        r = bad[0]
        raise BuildError(
            f"{r['stage']}/{r['case']}: artifact output {r['output']!r} differs from eager "
            f"({r['metric']} {r['value']:.3g} > {r['limit']:.3g})"
        )
    return results


def subprocess_verify_onnx(
    path: Path, stages: list[str], reporter: Reporter, timeout: float = VERIFY_TIMEOUT_S
) -> list[dict]:
    """onnxruntime (CPU, and CUDA when available) on the fresh ONNX models against the golden cases, in a child
    process like the AOTI check. A provider without kernels for the graph is reported, not failed."""
    cmd = [sys.executable, "-m", "ttsaot.builder.onnx_verify", str(path), "--json", "--stages", ",".join(stages)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    try:
        results = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        raise BuildError(f"verifying the fresh ONNX models failed: {tail}") from None
    bad = [r for r in results if not r["ok"] and not r["skipped"]]
    if bad:
        r = bad[0]
        raise BuildError(
            f"{r['stage']}/{r['case']}: ONNX output {r['output']!r} on {r['provider']} differs from "
            f"eager ({r['metric']} {r['value']:.3g} > {r['limit']:.3g})"
        )
    for key in sorted({(r["stage"], r["provider"], r["skipped"]) for r in results if r["skipped"]}):
        reporter.note(f"ONNX {key[0]} not run on {key[1]}: {key[2]}")
    return results


def _use_private_inductor_cache() -> Path:
    """Point Inductor at a cache keyed by our kernel sources and the torch version.

    Seen on an H200 (torch 2.11): after the SnakeBeta Triton source changed, a warm default Inductor cache produced
    packages that failed at run time ("run_func_ API call failed"); a fresh cache built correct ones. Keying the
    cache directory on the kernels' source keeps reuse across builds without ever mixing kernel versions."""
    h = hashlib.sha256(torch.__version__.encode() + kernel_sources_hash().encode())
    base = Path(
        os.environ.get("TTSAOT_INDUCTOR_CACHE_DIR", Path(tempfile.gettempdir()) / f"ttsaot_inductor_{os.getuid()}")
    )
    path = base / h.hexdigest()[:16]
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return path


def build_family(
    family: str,
    specs: list[StageSpec],
    out_root: str | Path,
    device: str | torch.device = "cpu",
    seed: int = 0,
    preset: str | None = None,
    reporter: Reporter | None = None,
    verify_in_subprocess: bool = True,
    extra_inductor_options: dict | None = None,
    keep_existing_stages: bool = True,
    formats: str | tuple[str, ...] = ("aoti",),
    cache_dir: str | Path | None = None,
    jobs: int = 1,
    load_check: LoadCheck | None = None,
    inputs: dict[str, Any] | None = None,
    cache_max_bytes: int | None = None,
) -> BuildResult:
    """Build `specs` into <out_root>/<family>/ atomically (temp dir + rename, under a lock). `formats`: "aoti"
    (packages per bucket, or dynamic ones serving several: StageSpec.dynamic_packages), "onnx" (one ONNX model per
    stage, builder/onnx_export.py), or both. `cache_dir`: the package cache to reuse packages from and add to
    (builder/package_cache.py); None compiles every package. `jobs`: AOTI compiles run on up to that many worker
    processes (builder/parallel_compile.py): a stage's packages, and for a CPU build the packages of every stage side
    by side; the artifact is the same as with 1. `load_check`: the child process of the subprocess check, started
    by the caller before it imported torch (builder/load_check.py); None starts one here when the check runs. The
    build closes it, used or not. `inputs`: what the caller knows decides the stages' modules and weights beyond
    the specs (builder/build_inputs.py): with it and a cache, a build whose inputs are those the installed artifact
    was built from checks that artifact instead of rebuilding it (`BuildResult.up_to_date`); None always builds.
    `cache_max_bytes`: after a build that used the cache, its least recently used entries are removed down to this
    size, never one this build used (builder/cache_prune.py); None leaves the cache unbounded (the CLI bounds it:
    --cache-max-size)."""
    reporter = reporter or Reporter()
    t_start = time.time()
    with contextlib.ExitStack() as stack:
        if load_check is not None:
            stack.enter_context(load_check)
        if jobs < 1:
            raise BuildError(f"jobs must be at least 1, got {jobs}")
        formats = parse_formats(formats)
        if load_check is None and verify_in_subprocess and "aoti" in formats:
            load_check = stack.enter_context(LoadCheck())  # its imports overlap the stages' work
        res = _build_family(
            family,
            specs,
            out_root,
            device,
            seed,
            preset,
            reporter,
            verify_in_subprocess,
            extra_inductor_options,
            keep_existing_stages,
            formats,
            cache_dir,
            jobs,
            load_check,
            inputs,
            stack,
        )
    if cache_dir is not None and cache_max_bytes is not None and not res.up_to_date:
        _bound_cache(Path(cache_dir), cache_max_bytes, t_start, reporter)
    return res


def _bound_cache(root: Path, max_bytes: int, since: float, reporter: Reporter) -> None:
    """The cache within `max_bytes` after a build installed its artifact: a failure here is a note, not a failed
    build (the artifact is in place; the next build prunes again)."""
    try:
        pruned = prune(root, max_bytes, protect_since=since)
    except OSError as e:
        reporter.note(f"package cache: not pruned ({e})")
        return
    if pruned.removed or pruned.busy or pruned.stale_tmp or pruned.bytes_after > max_bytes:
        reporter.note(describe(pruned, max_bytes))


def _preparation_order(specs: list[StageSpec], device: torch.device) -> list[StageSpec]:
    """The order a parallel build prepares its stages in: the stages that go first on this device
    (`StageSpec.prepare_first_on`), then on CUDA fewest buckets first, on CPU the family's order. Stages are prepared
    one after another in the build's process, a CUDA stage exporting one program per bucket, so a stage of few
    buckets is ready soon and its packages (few, each a long serial chain in its worker) start compiling early; a
    stage of many buckets spreads over the workers anyway. In the H200 Fish build in the family's order the DAC
    encoder's 4 packages (~200 s each) started 117 s in, behind fast_ar and the DAC decoder's 18 exports, and for its
    last ~95 s only those 4 compiles ran: 4 of 16 cores busy (bench/results/nvidia-h200/probes/golden_on_gpu/).
    Fewest buckets first handed them over 35 s in and the build took 275.6 s cold against 329.5 s
    (bench/results/nvidia-h200/probes/builds_87ef34e/, another machine of the same kind); prepared first, 11-36 s in
    (bench/results/nvidia-h200/builds_fish-s2-pro.json, 251.7 s). In the H200 VoxCPM2 build, fewest buckets first
    put the LocDiT third: handed over 92 s in, its batch-1 package compiled for 256 s and was the last but the VAE
    decoder's to finish (bench/results/nvidia-h200/build_logs/voxcpm2-cold_a6ee558.log). A CPU build's stages each
    have one or a few dynamic packages: fewest buckets first made no difference there (the tiny Fish build on 2
    cores: 146.3 s in the family's order, 144.0 s fewest buckets first,
    bench/results/cpu/probes/prep_order_fish_tiny/), the DAC encoder prepared first did (173.9 against 204.4 s,
    bench/results/cpu/probes/tiny_prepare_first_lending/)."""
    first = [s for s in specs if device.type in s.prepare_first_on]
    rest = [s for s in specs if device.type not in s.prepare_first_on]
    if device.type == "cuda":
        rest.sort(key=lambda s: len(s.plan.buckets()))
    return first + rest


def _build_family(
    family: str,
    specs: list[StageSpec],
    out_root: str | Path,
    device: str | torch.device,
    seed: int,
    preset: str | None,
    reporter: Reporter,
    verify_in_subprocess: bool,
    extra_inductor_options: dict | None,
    keep_existing_stages: bool,
    formats: tuple[str, ...],
    cache_dir: str | Path | None,
    jobs: int,
    load_check: LoadCheck | None,
    inputs: dict[str, Any] | None,
    stack: contextlib.ExitStack,
) -> BuildResult:
    _use_private_inductor_cache()
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", 0)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BuildError("--device cuda requested but torch.cuda.is_available() is False")
    out_root = Path(out_root)
    final = out_root / family
    cache = PackageCache(Path(cache_dir)) if cache_dir is not None else None
    t_start = time.time()
    with _BuildLock(final), _TerminateAsInterrupt() as term:
        env = build_env(dev)
        if inputs is not None:  # recorded by every build; a --no-cache one (cache None) never skips
            env[INPUTS_KEY] = build_inputs_key(
                family, specs, inputs, dict(env), formats, extra_inductor_options, keep_existing_stages
            )
            current = None
            if cache is not None:
                current = _installed_if_current(final, env[INPUTS_KEY], dev, verify_in_subprocess, load_check, reporter)
            if current is not None:
                return BuildResult(path=final, manifest=current, seconds=time.time() - t_start, up_to_date=True)
            if load_check is not None and load_check.ended():
                load_check = stack.enter_context(LoadCheck())  # the check of the installed artifact used the child
        tmp: Path | None = None
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{family}.tmp-", dir=out_root))
            stages: dict[str, StageEntry] = {}
            # With several workers and stages, each stage's packages go to the compile pool once the stage is
            # prepared, each as soon as it is exported (`_submit_compiles`), and compile while the next stage is
            # prepared (exports and lowering are one core's work: a 2-core CPU build left its second core idle
            # through them), the largest waiting compile first. Packages
            # of different stages compile side by side: a CPU build's one or few dynamic packages per stage, or a
            # CUDA stage's few buckets, would leave the other workers idle while the next stage waits (the H100
            # qwen3-tts-12hz build compiled its 3 code_predictor packages only after code2wav's 22). A prepared
            # stage holds its module on the device: on CUDA the pool is drained before the prepared stages would
            # hold more than POOLED_DEVICE_SHARE of the GPU's memory. The stages' golden cases wait for the next
            # drain and run before it, while the pool compiles (within DEFERRED_GOLDEN_SHARE of the host's memory).
            budget = _pooled_device_bytes(dev)
            pending: list[_PendingStage] = []
            held = 0
            deferred = 0  # host bytes of the modules that deferred golden cases keep
            with contextlib.ExitStack() as compiles:  # closed (workers stopped) before tmp is removed on a failure
                pool = compiles.enter_context(CompilePool(jobs)) if jobs > 1 and len(specs) > 1 else None

                def flush() -> None:
                    nonlocal deferred
                    for p in pending:  # while the pool compiles their packages
                        p.make_golden()
                    deferred = 0
                    if pool is None:
                        _compile_all([p.compile for p in pending if p.compile is not None], jobs)
                    _finish_as_compiled(pending, pool, stages)

                for spec in _preparation_order(specs, dev) if pool is not None else specs:
                    room = _deferred_golden_bytes() - deferred if pool is not None else 0
                    prepared = prepare_stage(
                        spec, tmp, dev, seed, reporter, extra_inductor_options, formats, cache, jobs, room
                    )
                    term.check()
                    size = prepared.device_bytes()
                    if pending and held + size > budget:
                        flush()
                        held = 0
                    pending.append(prepared)
                    held += size
                    if not prepared.golden.done:  # counted after a flush, which runs only the earlier stages' cases
                        deferred += prepared.golden.host_bytes
                    if pool is None:
                        flush()
                        held = 0
                    elif prepared.compile is not None:
                        _submit_compiles(prepared.compile, pool)  # polls the pool after each submit
                flush()
            term.check()
            stages = {s.name: stages[s.name] for s in specs}  # the manifest lists them in the family's order
            kept = _carry_over_stages(final, tmp, env, dev, set(stages), reporter) if keep_existing_stages else {}
            if dev.type == "cpu":
                env["cpu_isa"] = _package_cpu_isa(tmp, stages)
            manifest = Manifest(
                format_version=FORMAT_VERSION,
                family=family,
                preset=preset,
                device=dev.type,
                build_env=json_value(env),
                stages={**kept, **stages},
                created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            )
            try:
                write_manifest(tmp, manifest)
            except ManifestError as e:
                raise BuildError(f"the manifest this build would write is invalid: {e}") from None
            _normalize_modes(tmp)
            if verify_in_subprocess:
                aoti_stages = [n for n, e in manifest.stages.items() if e.buckets]
                if aoti_stages:
                    reporter.note("verifying the fresh artifact in a subprocess")
                    try:
                        subprocess_verify(tmp, dev, load_check, stages=aoti_stages)
                    except BuildError:
                        if cache is not None:
                            cache.discard_used("the artifact built from it failed its load check")
                            for n in cache.notes:
                                reporter.note(n)
                        raise
                onnx_stages = [n for n, e in stages.items() if e.onnx is not None]
                if onnx_stages:
                    reporter.note("verifying the fresh ONNX models with onnxruntime in a subprocess")
                    subprocess_verify_onnx(tmp, onnx_stages, reporter)
            term.check()  # a SIGTERM that some library swallowed still stops the build before it installs
            _replace_dir(tmp, final)
        except BaseException:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)  # Ctrl-C and SIGTERM included: the previous artifact stays
            if cache is not None:
                cache.release_claims()  # a build waiting for one of these packages compiles it now
            raise
    return BuildResult(path=final, manifest=manifest, seconds=time.time() - t_start)


def _installed_if_current(
    final: Path,
    key: str,
    dev: torch.device,
    verify_in_subprocess: bool,
    load_check: LoadCheck | None,
    reporter: Reporter,
) -> Manifest | None:
    """The installed artifact's manifest when it was built from the inputs `key` names and still passes the check a
    fresh build would (the subprocess load check: every file's sha256, every package loaded, the golden cases; with
    the check off, the file digests). None, after saying why, when the build must run."""
    if not (final / MANIFEST).is_file():
        return None
    try:
        old = read_manifest(final)
    except ArtifactError:
        return None  # the full build replaces it
    if old.build_env.get(INPUTS_KEY) != key:
        return None
    try:
        aoti = [n for n, e in old.stages.items() if e.buckets]
        if verify_in_subprocess and aoti and load_check is not None:
            subprocess_verify(final, dev, load_check, stages=aoti)
        else:
            check_files(final, [f for e in old.stages.values() for f in e.files()])
        onnx = [n for n, e in old.stages.items() if e.onnx is not None]
        if verify_in_subprocess and onnx:
            subprocess_verify_onnx(final, onnx, reporter)
    except (BuildError, ArtifactError, OSError) as e:
        reporter.note(f"{final} was built from the same inputs but fails its check ({e}): building it again")
        return None
    for name, entry in old.stages.items():
        n = len(entry.package_files())
        reporter.note(f"{name}: {n} of {n} packages reused from the installed artifact")
    reporter.note(f"{final} is up to date: built from the same inputs, checked, left as it was")
    return old


# A CUDA build's pooled stages hold their modules on the GPU side by side, next to the compile workers (each
# loads one program and autotunes on the same GPU): at most this share of its memory.
POOLED_DEVICE_SHARE = 0.25


def _pooled_device_bytes(dev: torch.device) -> float:
    """How many bytes of prepared stages a build may hold before compiling them (no bound on CPU)."""
    if dev.type != "cuda":
        return math.inf
    return torch.cuda.get_device_properties(dev).total_memory * POOLED_DEVICE_SHARE


# A parallel build's deferred golden cases keep each stage's fp32 modules on the host (the faithful one and a copy
# of the rewritten one) until the pool is drained: at most this share of the host's memory, else they run at once.
DEFERRED_GOLDEN_SHARE = 0.25


def _deferred_golden_bytes() -> float:
    """0 (nothing deferred) where the host's memory is unknown."""
    return (host_memory_bytes() or 0) * DEFERRED_GOLDEN_SHARE


def _package_cpu_isa(tmp: Path, stages: dict[str, StageEntry]) -> str:
    from torch._C._aoti import AOTIModelPackageLoader

    for entry in stages.values():
        if not entry.buckets:
            continue
        pkg = tmp / entry.buckets[0].file
        meta = AOTIModelPackageLoader.load_metadata_from_package(str(pkg), "model")
        return meta.get("AOTI_CPU_ISA", "")
    return ""


def _carry_over_stages(
    final: Path, tmp: Path, env: dict, dev: torch.device, rebuilt: set[str], reporter: Reporter
) -> dict[str, StageEntry]:
    """Keep stages of an existing artifact that this build does not rebuild, if they were built for the same
    format, device and torch: `--stages code_predictor` must not delete a previously built `code2wav`."""
    if not (final / MANIFEST).is_file():
        return {}
    try:
        old = read_manifest(final)
    except ArtifactError as e:
        reporter.note(f"not keeping the stages of the existing {final} (its manifest is unreadable: {e})")
        return {}
    same = (
        old.device == dev.type
        and old.build_env.get("torch") == env["torch"]
        and old.build_env.get("sm") == env.get("sm")
    )
    if not same:
        return {}
    kept = {}
    for name, entry in old.stages.items():
        if name in rebuilt:
            continue
        for f in entry.files():
            (tmp / f.file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(final / f.file, tmp / f.file)
        kept[name] = entry
    return kept


def _replace_dir(tmp: Path, final: Path) -> None:
    """Two renames: the destination is always either the old artifact or the new one, never a mix. Ctrl-C and
    SIGTERM are held back between them (delivered right after), so an interrupt cannot leave neither in place."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        _rename_into_place(tmp, final)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _rename_into_place(tmp: Path, final: Path) -> None:
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)


def stage_summary(result: BuildResult) -> list[dict]:
    rows = []
    for name, st in result.manifest.stages.items():
        rows.append(
            {
                "stage": name,
                "buckets": len(st.buckets),
                "packages": len(st.package_files()),
                "dtype": st.dtype,
                "weights_mib": round(st.weights.bytes / 2**20, 2) if st.weights is not None else 0.0,
                "package_mib": round(sum(f.bytes for f in st.package_files()) / 2**20, 2),
                **(
                    {"onnx_mib": round(sum(f.bytes for f in st.onnx.files()) / 2**20, 2)} if st.onnx is not None else {}
                ),
            }
        )
    return rows


__all__ = ["BuildError", "BuildResult", "Reporter", "build_family", "build_stage", "stage_summary"]
