"""The artifact format, v1: the one definition of manifest.json (spec: artifacts/README.md), its validation,
integrity and compatibility checks. Nothing here loads native code."""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import torch

from .dtypes import DTYPE_NAMES, torch_dtype
from .errors import (
    ArtifactNotFoundError,
    CompatibilityError,
    IntegrityError,
    ManifestError,
)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DTYPES: dict[str, torch.dtype] = {n: torch_dtype(n) for n in DTYPE_NAMES}  # format name → torch dtype
KERNEL_CHOICES = ("ttsaot", "inductor")  # StageEntry.kernels: what the packages' hot paths were compiled from
STAGE_KINDS = ("generic", "codec_decoder", "codec_encoder", "codebook_predictor", "lm_step", "lm_prefill")


def _overlapping(shape: list[int], stride: list[int]) -> bool:
    """True unless the strided layout is non-overlapping: dims of size > 1 sorted by stride must each step over
    the whole extent of the previous ones (e.g. a stride of 0 on a dim of size 2 broadcasts one element)."""
    dims = sorted((st, n) for n, st in zip(shape, stride) if n > 1)
    extent = 1
    for st, n in dims:
        if st < extent:
            return True
        extent = st * n
    return False


# Shape entries: an int (static), an axis name ("batch", "frames"), or [axis, scale] (output length = scale·axis).
ShapeEntry = int | str | list


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: list[ShapeEntry]
    pad: float | int | None = None  # value used to pad bucket axes (inputs only)
    range: dict | None = None  # {"dim": d, "low": int, "high": [per index along d]} for codes
    finite: bool = True  # float inputs must be free of NaN/Inf

    @classmethod
    def from_dict(cls, d: dict, where: str = "tensor") -> TensorSpec:
        """An I/O descriptor (artifacts/README.md) checked as the runtime checks a manifest's: ManifestError."""
        return _tensor_spec(d, where)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def axes(self) -> list[tuple[int, str, int]]:
        """(dim, axis, scale) for every bucketed dimension."""
        out = []
        for d, s in enumerate(self.shape):
            if isinstance(s, str):
                out.append((d, s, 1))
            elif isinstance(s, list):
                out.append((d, s[0], int(s[1])))
        return out

    def concrete(self, sizes: dict[str, int]) -> tuple[int, ...]:
        dims = []
        for s in self.shape:
            if isinstance(s, int):
                dims.append(s)
            elif isinstance(s, str):
                dims.append(sizes[s])
            else:
                dims.append(sizes[s[0]] * int(s[1]))
        return tuple(dims)


@dataclass(frozen=True)
class WeightSpec:
    dtype: str
    shape: list[int]
    stride: list[int]


@dataclass(frozen=True)
class BucketEntry:
    key: str
    sizes: dict[str, int]
    file: str
    sha256: str
    bytes: int


@dataclass(frozen=True)
class FileEntry:
    """`chunk_sha256`: optional sha256 of each consecutive `chunk_bytes` slice (the last may be shorter). Large
    weights files carry them so `load` can hash the slices in parallel instead of one sequential sha256 (validating
    the 2.6 GB base-LM stage took 1.75 s of a 6.1 s first step on an H200 host); together they cover every byte."""

    file: str
    sha256: str
    bytes: int
    chunk_bytes: int = 0
    chunk_sha256: tuple[str, ...] = ()

    @classmethod
    def of(cls, root: Path, rel: str, chunk_bytes: int | None = None) -> FileEntry:
        """The entry of the written file `root/rel`. With `chunk_bytes` (weights files), a file larger than one
        chunk also gets the per-slice digests that `load` checks in parallel."""
        path = Path(root) / rel
        size = path.stat().st_size
        if not chunk_bytes or size <= chunk_bytes:
            return cls(rel, sha256_of(path), size)
        whole, chunks = file_digests(path, chunk_bytes)
        return cls(rel, whole, size, chunk_bytes, tuple(chunks))


@dataclass(frozen=True)
class OnnxEntry:
    """The stage's optional ONNX model (`build --format onnx`): read by onnxruntime/TensorRT, never by this
    runtime, but integrity-checked with the other files. `dynamic_axes`: axis → {min, max[, multiple_of]}
    (symbolic in the graph); `static_axes`: axis → size the graph was fixed at (pad to it, as for a bucket)."""

    file: str
    sha256: str
    bytes: int
    opset: int
    external_data: list[FileEntry] = field(default_factory=list)
    dynamic_axes: dict[str, dict[str, int]] = field(default_factory=dict)
    static_axes: dict[str, int] = field(default_factory=dict)
    ops: list[str] = field(default_factory=list)
    custom_ops: dict[str, str] = field(default_factory=dict)
    updated_inputs: dict[str, str] = field(default_factory=dict)  # extra output → the input it replaces

    @classmethod
    def from_dict(cls, d: dict, where: str = "onnx") -> OnnxEntry:
        return _onnx_entry(d, where)

    @property
    def model(self) -> FileEntry:
        return FileEntry(self.file, self.sha256, self.bytes)

    def files(self) -> list[FileEntry]:
        return [self.model, *self.external_data]


@dataclass(frozen=True)
class StageEntry:
    name: str
    kind: str
    dtype: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    weights: FileEntry | None  # None only for ONNX-only stages (no buckets)
    constants: dict[str, WeightSpec]
    buckets: list[BucketEntry]
    golden: FileEntry | None
    golden_cases: list[str]
    tolerance: float
    metadata: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    passes: list[dict] = field(default_factory=list)
    inductor_options: dict[str, Any] = field(default_factory=dict)  # extra Inductor options of the compile
    kernels: str = "inductor"  # "ttsaot": hot paths run the ttsaot Triton kernel layer; "inductor": Inductor's
    checkpoint: dict[str, Any] = field(default_factory=dict)
    onnx: OnnxEntry | None = None
    # How the packages were made (informative: the runtime loads by `buckets`): {"mode": "dynamic" | "static",
    # "reason": why static axes are static, "packages": {file: {"buckets": [keys], "dynamic_axes": {axis: {min,
    # max[, multiple_of]}}}}}. A dynamic package serves several buckets: their entries name the same file.
    packaging: dict[str, Any] = field(default_factory=dict)

    def axis_names(self) -> list[str]:
        return list(self.buckets[0].sizes) if self.buckets else []

    def package_files(self) -> list[FileEntry]:
        """Each distinct package file once, in bucket order (buckets may share one)."""
        seen: dict[str, FileEntry] = {}
        for b in self.buckets:
            seen.setdefault(b.file, FileEntry(b.file, b.sha256, b.bytes))
        return list(seen.values())

    def files(self) -> list[FileEntry]:
        out = [self.weights] if self.weights is not None else []
        out += self.package_files()
        if self.golden:
            out.append(self.golden)
        if self.onnx is not None:
            out += self.onnx.files()
        return out


@dataclass(frozen=True)
class Manifest:
    format_version: int
    family: str
    preset: str | None
    device: str  # "cuda" | "cpu"
    build_env: dict[str, Any]
    stages: dict[str, StageEntry]
    created: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The manifest.json object: what `parse_manifest` reads back into an equal Manifest."""
        return _plain(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict) -> Manifest:
        return parse_manifest(data)


# ------------------------------------------------------------------------------------ writing
# Optional fields left out of manifest.json while they hold their default (the parser restores the default).
_OMITTED_AT_DEFAULT: dict[str, tuple[str, ...]] = {
    "FileEntry": ("chunk_bytes", "chunk_sha256"),
    "TensorSpec": ("pad", "range", "finite"),
    "StageEntry": ("onnx", "packaging"),
}
# Fields that are the key of the enclosing object, not written inside it.
_KEYED: dict[str, tuple[str, ...]] = {"StageEntry": ("name",)}


def _default(f) -> Any:
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else MISSING


def _plain(obj: Any) -> Any:
    """Dataclasses of this module → JSON values (tuples → lists), in field order."""
    if is_dataclass(obj) and not isinstance(obj, type):
        kind = type(obj).__name__
        omit, keyed = _OMITTED_AT_DEFAULT.get(kind, ()), _KEYED.get(kind, ())
        out = {}
        for f in fields(obj):
            v = getattr(obj, f.name)
            if f.name in keyed or (f.name in omit and v == _default(f)):
                continue
            out[f.name] = _plain(v)
        return out
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def json_value(value: Any) -> Any:
    """A free-form manifest value (config, metadata, pass reports, build_env) as it reads back from JSON: tuples
    become lists, keys strings. The builder stores these so that what it wrote equals what the runtime reads."""
    return json.loads(json.dumps(value))


def write_manifest(root: str | Path, manifest: Manifest) -> Path:
    """Write <root>/manifest.json. The text is read back with `parse_manifest` first: a manifest the runtime
    would refuse, or read differently, is never written (ManifestError names the field)."""
    text = manifest.to_json()
    back = parse_manifest(json.loads(text))
    if back != manifest:
        diff = [n for n in (f.name for f in fields(Manifest)) if getattr(back, n) != getattr(manifest, n)]
        raise ManifestError(
            f"manifest.json: {', '.join(diff)} would not read back as written (a value that is "
            "not plain JSON, e.g. a tuple: store it with json_value())"
        )
    path = Path(root) / MANIFEST
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------ parsing
def _get(d: dict, key: str, typ, where: str):
    if not isinstance(d, dict):
        raise ManifestError(f"manifest.json: {where} must be an object")
    if key not in d:
        raise ManifestError(f"manifest.json: {where}.{key} is missing")
    v = d[key]
    if typ is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise ManifestError(
            f"manifest.json: {where}.{key} has type {type(v).__name__}, expected {getattr(typ, '__name__', typ)}"
        )
    return v


def _known_fields(d: Any, cls: type, where: str) -> None:
    """Every key must be a field of the format (a field this runtime does not know means another format)."""
    if not isinstance(d, dict):
        raise ManifestError(f"manifest.json: {where} must be an object")
    names = {f.name for f in fields(cls)} - set(_KEYED.get(cls.__name__, ()))
    extra = sorted(k for k in d if k not in names)
    if extra:
        raise ManifestError(
            f"manifest.json: {where} has unknown field {extra[0]!r} (format v{FORMAT_VERSION} "
            f"fields: {', '.join(f.name for f in fields(cls) if f.name in names)})"
        )


def _safe_relpath(p: str, where: str) -> str:
    # Files are named relative to the artifact root; refuse anything that could escape it.
    if os.path.isabs(p) or ".." in Path(p).parts or p.startswith("~"):
        raise ManifestError(f"manifest.json: {where} names a path outside the artifact: {p!r}")
    return p


def _tensor_spec(d: dict, where: str) -> TensorSpec:
    _known_fields(d, TensorSpec, where)
    dtype = _get(d, "dtype", str, where)
    if dtype not in DTYPES:
        raise ManifestError(f"manifest.json: {where}.dtype {dtype!r} is not one of {sorted(DTYPES)}")
    shape = _get(d, "shape", list, where)
    for s in shape:
        ok = (
            (isinstance(s, int) and not isinstance(s, bool) and s >= 0)
            or isinstance(s, str)
            or (isinstance(s, list) and len(s) == 2 and isinstance(s[0], str) and _positive_int(s[1]))
        )
        if not ok:
            raise ManifestError(f"manifest.json: {where}.shape has an invalid entry {s!r}")
    rng = d.get("range")
    if rng is not None:
        _check_range_spec(rng, shape, f"{where}.range")
    pad = d.get("pad")
    if pad is not None and not _is_number(pad):
        raise ManifestError(f"manifest.json: {where}.pad must be a number or null, got {pad!r}")
    finite = d.get("finite", True)
    if not isinstance(finite, bool):
        raise ManifestError(f"manifest.json: {where}.finite must be true or false, got {finite!r}")
    return TensorSpec(name=_get(d, "name", str, where), dtype=dtype, shape=shape, pad=pad, range=rng, finite=finite)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _check_range_spec(rng: Any, shape: list, where: str) -> None:
    """`{dim, low, high[]}`: high holds one int bound for every index along dim, or one per index of a static
    dimension (per-codebook sizes)."""
    ok = (
        isinstance(rng, dict)
        and _is_int(rng.get("dim"))
        and 0 <= rng["dim"] < len(shape)
        and _is_int(rng.get("low", 0))
        and isinstance(rng.get("high"), list)
        and rng["high"]
        and all(_is_int(h) for h in rng["high"])
    )
    if not ok:
        raise ManifestError(
            f"manifest.json: {where} must be {{dim: a dimension of the tensor, low: int, "
            f"high: [int, ...]}}, got {rng!r}"
        )
    size = shape[rng["dim"]]
    if len(rng["high"]) != 1 and size != len(rng["high"]):
        raise ManifestError(
            f"manifest.json: {where}.high has {len(rng['high'])} bounds for dimension "
            f"{rng['dim']} of size {size!r} (one bound for all, or one per index of a static "
            "dimension)"
        )
    if any(h <= rng.get("low", 0) for h in rng["high"]):
        raise ManifestError(f"manifest.json: {where}.high bounds must exceed low")


def _file_entry(d: dict, where: str, check_fields: bool = True) -> FileEntry:
    if check_fields:
        _known_fields(d, FileEntry, where)
    size = _get(d, "bytes", int, where)
    chunk, digests = d.get("chunk_bytes", 0), d.get("chunk_sha256", [])
    if not (
        isinstance(chunk, int)
        and not isinstance(chunk, bool)
        and chunk >= 0
        and isinstance(digests, list)
        and all(isinstance(x, str) for x in digests)
    ):
        raise ManifestError(f"manifest.json: {where}.chunk_bytes must be an int ≥ 0 and chunk_sha256 a list of strings")
    if (chunk > 0) != bool(digests) or (chunk and len(digests) != -(-size // chunk)):
        raise ManifestError(
            f"manifest.json: {where} has {len(digests)} chunk digests for {size} bytes in chunks of {chunk}"
        )
    return FileEntry(
        file=_safe_relpath(_get(d, "file", str, where), where),
        sha256=_get(d, "sha256", str, where),
        bytes=size,
        chunk_bytes=chunk,
        chunk_sha256=tuple(digests),
    )


def _stage(name: str, d: dict) -> StageEntry:
    w = f"stages.{name}"
    _known_fields(d, StageEntry, w)
    kind = _get(d, "kind", str, w)
    if kind not in STAGE_KINDS:
        raise ManifestError(f"manifest.json: {w}.kind {kind!r} is unknown to this runtime ({', '.join(STAGE_KINDS)})")
    dtype = _get(d, "dtype", str, w)
    if dtype not in DTYPES:
        raise ManifestError(f"manifest.json: {w}.dtype {dtype!r} is unknown")
    buckets = []
    for i, b in enumerate(_get(d, "buckets", list, w)):
        bw = f"{w}.buckets[{i}]"
        _known_fields(b, BucketEntry, bw)
        sizes = _get(b, "sizes", dict, bw)
        if not all(_positive_int(v) for v in sizes.values()):  # `true` is no size: torch refuses bool dims
            raise ManifestError(f"manifest.json: {bw}.sizes must be positive integers")
        buckets.append(
            BucketEntry(
                key=_get(b, "key", str, bw),
                sizes=sizes,
                file=_safe_relpath(_get(b, "file", str, bw), bw),
                sha256=_get(b, "sha256", str, bw),
                bytes=_get(b, "bytes", int, bw),
            )
        )
    onnx = _onnx_entry(d["onnx"], f"{w}.onnx") if d.get("onnx") is not None else None
    if not buckets and onnx is None:
        raise ManifestError(f"manifest.json: {w}.buckets is empty")
    if buckets and d.get("weights") is None:
        raise ManifestError(f"manifest.json: {w}.weights is missing")
    axes = set(buckets[0].sizes) if buckets else set()
    if any(set(b.sizes) != axes for b in buckets):
        raise ManifestError(f"manifest.json: {w}.buckets do not all have the same axes")
    _check_shared_files(buckets, w)
    packaging = _get_optional(d, "packaging", dict, w, {})
    _check_packaging(packaging, buckets, f"{w}.packaging")
    constants = {}
    for cname, c in _get(d, "constants", dict, w).items():
        cw = f"{w}.constants[{cname!r}]"
        _known_fields(c, WeightSpec, cw)
        cd = _get(c, "dtype", str, cw)
        if cd not in DTYPES:
            raise ManifestError(f"manifest.json: {cw}.dtype {cd!r} is unknown")
        shape, stride = _get(c, "shape", list, cw), _get(c, "stride", list, cw)
        if len(shape) != len(stride) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in [*shape, *stride]
        ):
            raise ManifestError(f"manifest.json: {cw} shape/stride must be equal-length lists of non-negative ints")
        if _overlapping(shape, stride):
            raise ManifestError(
                f"manifest.json: {cw} stride {stride} makes elements of shape {shape} share memory "
                "(a weight cannot be written into such a layout)"
            )
        if stride != contiguous_stride(shape):
            # the packages index their constants densely: a gapped layout would be read as garbage, not refused
            raise ManifestError(
                f"manifest.json: {cw} stride {stride} is not the contiguous layout "
                f"{contiguous_stride(shape)} of shape {shape} (what the packages index)"
            )
        constants[cname] = WeightSpec(dtype=cd, shape=shape, stride=stride)
    golden = d.get("golden")
    metadata = d.get("metadata", {})
    cases = _get_optional(d, "golden_cases", list, w, [])
    if not all(isinstance(c, str) for c in cases):
        raise ManifestError(f"manifest.json: {w}.golden_cases must be a list of strings")
    tolerance = _get(d, "tolerance", float, w)
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ManifestError(f"manifest.json: {w}.tolerance must be a finite number ≥ 0, got {tolerance!r}")
    inputs = [_tensor_spec(x, f"{w}.inputs[{i}]") for i, x in enumerate(_get(d, "inputs", list, w))]
    outputs = [_tensor_spec(x, f"{w}.outputs[{i}]") for i, x in enumerate(_get(d, "outputs", list, w))]
    _check_metadata(kind, metadata, inputs, f"{w}.metadata")
    if buckets:
        _check_axes(kind, axes, inputs, outputs, w)
    if kind == "codec_decoder":
        _check_decoder_hop(metadata["samples_per_frame"], outputs, w)
    return StageEntry(
        name=name,
        kind=kind,
        dtype=dtype,
        inputs=inputs,
        outputs=outputs,
        weights=(_file_entry(_get(d, "weights", dict, w), f"{w}.weights") if d.get("weights") is not None else None),
        constants=constants,
        buckets=buckets,
        golden=_file_entry(golden, f"{w}.golden") if golden else None,
        golden_cases=list(cases),
        tolerance=tolerance,
        metadata=dict(metadata),
        config=_get_optional(d, "config", dict, w, {}),
        passes=_get_optional(d, "passes", list, w, []),
        inductor_options=_get_optional(d, "inductor_options", dict, w, {}),
        kernels=_kernels(d, w),
        checkpoint=_get_optional(d, "checkpoint", dict, w, {}),
        onnx=onnx,
        packaging=packaging,
    )


def _check_shared_files(buckets: list[BucketEntry], where: str) -> None:
    """Buckets that share a package name it with one digest and size (a file has one content), and keys are
    unique (the runtime keeps one runner per key)."""
    by_file: dict[str, BucketEntry] = {}
    keys: set[str] = set()
    for b in buckets:
        if b.key in keys:
            raise ManifestError(f"manifest.json: {where}.buckets list key {b.key!r} twice")
        keys.add(b.key)
        first = by_file.setdefault(b.file, b)
        if (first.sha256, first.bytes) != (b.sha256, b.bytes):
            raise ManifestError(
                f"manifest.json: {where}.buckets {first.key!r} and {b.key!r} share {b.file!r} with different "
                "sha256 or bytes"
            )


def _check_packaging(p: dict, buckets: list[BucketEntry], where: str) -> None:
    """`packaging` describes the buckets' files: every file it names is a bucket file, and the buckets it lists
    for a file are exactly the buckets that name it."""
    if not p:
        return
    if p.get("mode") not in ("dynamic", "static") or not isinstance(p.get("reason", ""), str):
        raise ManifestError(f"manifest.json: {where} must have mode dynamic|static and a string reason")
    pkgs = p.get("packages", {})
    if not isinstance(pkgs, dict):
        raise ManifestError(f"manifest.json: {where}.packages must map package file → its record")
    for file, rec in pkgs.items():
        served = sorted(b.key for b in buckets if b.file == file)
        listed = rec.get("buckets") if isinstance(rec, dict) else None
        if not isinstance(listed, list) or sorted(listed) != served:
            raise ManifestError(
                f"manifest.json: {where}.packages[{file!r}] lists buckets {listed!r}, the buckets naming that file "
                f"are {served}"
            )
        dyn = rec.get("dynamic_axes", {})
        if not (
            isinstance(dyn, dict)
            and all(isinstance(r, dict) and all(_is_int(r.get(k)) for k in ("min", "max")) for r in dyn.values())
        ):
            raise ManifestError(f"manifest.json: {where}.packages[{file!r}].dynamic_axes must map axis → {{min, max}}")


# Output axes a stage kind derives from its bucket axes (runtime: Stage._derived_sizes); every other axis an I/O
# descriptor names must be a bucket axis.
DERIVED_AXES: dict[str, tuple[str, ...]] = {"codec_encoder": ("frames",)}  # ⌈samples / samples_per_frame⌉
# Bucket axes a kind's runtime class reads by name (the decoder chunks along `frames`, the encoder derives frames
# from `samples`, the LMs bind caches per `batch` and prefill `tokens`): without them it would fail deep inside a
# call with a bare KeyError, so a manifest that lacks one is refused at load.
REQUIRED_AXES: dict[str, tuple[str, ...]] = {
    "codec_decoder": ("frames",),
    "codec_encoder": ("samples",),
    "lm_step": ("batch",),
    "lm_prefill": ("batch", "tokens"),
}


def _check_axes(kind: str, axes: set[str], inputs: list[TensorSpec], outputs: list[TensorSpec], where: str) -> None:
    """Inputs name only bucket axes and together name all of them (the request's sizes pick the bucket); outputs
    name bucket axes or the kind's derived axes."""
    for axis in REQUIRED_AXES.get(kind, ()):
        if axis not in axes:
            raise ManifestError(
                f"manifest.json: {where}.buckets have no {axis!r} axis, which stage kind {kind!r} needs "
                f"(axes: {', '.join(sorted(axes))})"
            )
    named = set()
    for i, spec in enumerate(inputs):
        for _, axis, _ in spec.axes():
            if axis not in axes:
                raise ManifestError(
                    f"manifest.json: {where}.inputs[{i}].shape names axis {axis!r}, which is not a "
                    f"bucket axis ({', '.join(sorted(axes))})"
                )
            named.add(axis)
    if named != axes:
        raise ManifestError(f"manifest.json: {where}.buckets axis {sorted(axes - named)[0]!r} is named by no input")
    allowed = axes | set(DERIVED_AXES.get(kind, ()))
    for i, spec in enumerate(outputs):
        for _, axis, _scale in spec.axes():
            if axis not in allowed:
                raise ManifestError(
                    f"manifest.json: {where}.outputs[{i}].shape names axis {axis!r}, which is neither "
                    f"a bucket axis nor derived by kind {kind!r}"
                )


def _check_decoder_hop(samples_per_frame: int, outputs: list[TensorSpec], where: str) -> None:
    """A decoder's streaming trims `samples_per_frame` samples per context frame while the packages' outputs are
    checked against the descriptors' `[frames, scale]`: the two must agree, or streamed audio is cut at the wrong
    sample with no error."""
    for i, spec in enumerate(outputs):
        for _, axis, scale in spec.axes():
            if axis == "frames" and scale != samples_per_frame:
                raise ManifestError(
                    f"manifest.json: {where}.outputs[{i}].shape has {scale} samples per frame, metadata."
                    f"samples_per_frame says {samples_per_frame}"
                )


def contiguous_stride(shape: list[int]) -> list[int]:
    """Row-major strides of `shape` (as torch computes them: a dimension of size 0 counts as 1)."""
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return out[::-1]


def _get_optional(d: dict, key: str, typ, where: str, default):
    return _get(d, key, typ, where) if d.get(key) is not None else type(default)(default)


# What each stage kind's runtime class reads from `metadata` (artifacts/README.md "Stage metadata by kind"):
# key → (check, what it must be). Validated at load so an edited value is a ManifestError, never a bare
# ValueError or KeyError from deep inside a call.
def _positive_int(v: Any) -> bool:
    return _is_int(v) and v > 0


def _non_negative_int(v: Any) -> bool:
    return _is_int(v) and v >= 0


_STREAMING_KEYS = ("chunk_frames", "left_context_frames", "first_chunk_frames", "nonstreaming_chunk_frames")
_REQUIRED_METADATA: dict[str, dict[str, tuple[Any, str]]] = {
    "codec_decoder": {
        "sample_rate": (_positive_int, "a positive int"),
        "samples_per_frame": (_positive_int, "a positive int"),
    },
    "codec_encoder": {
        "sample_rate": (_positive_int, "a positive int"),
        "samples_per_frame": (_positive_int, "a positive int"),
    },
    "lm_step": {
        "max_len": (_positive_int, "a positive int"),
        "cache_dtype": (lambda v: v in DTYPES, "a dtype name"),
        "cache_inputs": (
            lambda v: isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v),
            "two input names [k, v]",
        ),
        "cache_shape": (
            lambda v: (
                isinstance(v, list)
                and len(v) == 5
                and v.count("batch") == 1
                and all(v_ == "batch" or _positive_int(v_) for v_ in v)
            ),
            "[layers, 'batch', kv_heads, positions, head_dim]",
        ),
        "position_input": (lambda v: isinstance(v, str), "an input name"),
    },
}
_REQUIRED_METADATA["lm_prefill"] = {
    **{k: v for k, v in _REQUIRED_METADATA["lm_step"].items() if k != "position_input"},
    "length_input": (lambda v: isinstance(v, str), "an input name"),
}


def _check_metadata(kind: str, md: Any, inputs: list[TensorSpec], where: str) -> None:
    if not isinstance(md, dict):
        raise ManifestError(f"manifest.json: {where} must be an object")
    for key, (ok, what) in _REQUIRED_METADATA.get(kind, {}).items():
        if key not in md:
            raise ManifestError(f"manifest.json: {where}.{key} is missing (stage kind {kind!r} needs it)")
        if not ok(md[key]):
            raise ManifestError(f"manifest.json: {where}.{key} must be {what}, got {md[key]!r}")
    names = [s.name for s in inputs]
    for key in ("cache_inputs", "position_input", "length_input"):
        if key in md and kind in ("lm_step", "lm_prefill"):
            for n in md[key] if isinstance(md[key], list) else [md[key]]:
                if n not in names:
                    raise ManifestError(f"manifest.json: {where}.{key} names {n!r}, which is not an input")
    if kind in ("lm_step", "lm_prefill"):
        cache_len = md["cache_shape"][3]
        if cache_len != md["max_len"] + 1:
            raise ManifestError(
                f"manifest.json: {where}.cache_shape positions {cache_len} must be max_len + 1 "
                f"({md['max_len'] + 1}: the scratch slot)"
            )
        if "lm" in md and not isinstance(md["lm"], str):
            raise ManifestError(f"manifest.json: {where}.lm must be a string")
    st = md.get("streaming")
    if st is not None and not (isinstance(st, dict) and all(_non_negative_int(st.get(k, 0)) for k in _STREAMING_KEYS)):
        raise ManifestError(f"manifest.json: {where}.streaming must map {', '.join(_STREAMING_KEYS)} to ints ≥ 0")
    sd = md.get("sampling_defaults")
    if sd is not None and not (
        isinstance(sd, dict)
        and _is_number(sd.get("temperature", 1.0))
        and _non_negative_int(sd.get("top_k", 0))
        and _is_number(sd.get("top_p", 1.0))
        and 0 < sd.get("top_p", 1.0) <= 1
    ):
        raise ManifestError(
            f"manifest.json: {where}.sampling_defaults must be {{temperature: number, top_k: int ≥ 0, top_p: (0, 1]}}}}"
        )
    if not isinstance(md.get("allow_tf32", False), bool):
        raise ManifestError(f"manifest.json: {where}.allow_tf32 must be true or false")


def _kernels(d: dict, where: str) -> str:
    value = d.get("kernels", "inductor")
    if value not in KERNEL_CHOICES:
        raise ManifestError(f"manifest.json: {where}.kernels must be one of {', '.join(KERNEL_CHOICES)}, got {value!r}")
    return value


def _onnx_entry(d: dict, where: str) -> OnnxEntry:
    _known_fields(d, OnnxEntry, where)
    opset = _get(d, "opset", int, where)
    ext = [
        _file_entry(x, f"{where}.external_data[{i}]")
        for i, x in enumerate(_get(d, "external_data", list, where) if "external_data" in d else [])
    ]
    dyn = d.get("dynamic_axes", {}) or {}
    static = d.get("static_axes", {}) or {}
    ok_dyn = isinstance(dyn, dict) and all(
        isinstance(r, dict) and all(isinstance(r.get(k), int) for k in ("min", "max")) for r in dyn.values()
    )
    if not ok_dyn:
        raise ManifestError(f"manifest.json: {where}.dynamic_axes must map axis → {{min, max}}")
    if not (isinstance(static, dict) and all(isinstance(v, int) and v > 0 for v in static.values())):
        raise ManifestError(f"manifest.json: {where}.static_axes must map axis → positive size")
    model = _file_entry(d, where, check_fields=False)
    return OnnxEntry(
        file=model.file,
        sha256=model.sha256,
        bytes=model.bytes,
        opset=opset,
        external_data=ext,
        dynamic_axes={k: dict(v) for k, v in dyn.items()},
        static_axes=dict(static),
        ops=list(d.get("ops", [])),
        custom_ops=dict(d.get("custom_ops", {})),
        updated_inputs=dict(d.get("updated_inputs", {})),
    )


def parse_manifest(data: dict) -> Manifest:
    version = data.get("format_version") if isinstance(data, dict) else None
    if version != FORMAT_VERSION:
        raise ManifestError(
            f"manifest.json: format_version {version!r} is not supported by this runtime "
            f"(it reads version {FORMAT_VERSION}); rebuild the artifact with this ttsaot"
        )
    _known_fields(data, Manifest, "manifest")
    device = _get(data, "device", str, "manifest")
    if device not in ("cuda", "cpu"):
        raise ManifestError(f"manifest.json: device {device!r} must be 'cuda' or 'cpu'")
    stages = {n: _stage(n, s) for n, s in _get(data, "stages", dict, "manifest").items()}
    if not stages:
        raise ManifestError("manifest.json: no stages")
    preset = data.get("preset")
    if preset is not None and not isinstance(preset, str):
        raise ManifestError(f"manifest.json: preset must be a string or null, got {preset!r}")
    return Manifest(
        format_version=version,
        family=_get(data, "family", str, "manifest"),
        preset=preset,
        device=device,
        build_env=_get(data, "build_env", dict, "manifest"),
        stages=stages,
        created=_get_optional(data, "created", str, "manifest", ""),
    )


def read_manifest(root: str | Path, trusted_sha256: str | None = None) -> Manifest:
    """Read and validate <root>/manifest.json. With `trusted_sha256`, the manifest's own hash must match the
    pin (the manifest in turn pins every other file), so a pinned artifact cannot be swapped."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        inside = _artifacts_below(Path(root))
        if inside:
            raise ArtifactNotFoundError(
                f"{root}: not an artifact (no {MANIFEST}) but a folder of them: "
                f"{', '.join(inside)}; pass one, e.g. {Path(root) / inside[0]}"
            )
        raise ArtifactNotFoundError(f"{path}: not found; build one with `build-artifacts build FAMILY --out ...`")
    raw = path.read_bytes()
    if trusted_sha256 is not None:
        got = hashlib.sha256(raw).hexdigest()
        if got != trusted_sha256.lower():
            raise IntegrityError(
                f"{path}: sha256 {got[:16]}… does not match the trusted pin {trusted_sha256[:16]}…; refusing to load"
            )
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ManifestError(f"{path}: not valid JSON ({e})") from None
    return parse_manifest(data)


def _artifacts_below(folder: Path) -> list[str]:
    """Names of the subfolders that hold an artifact (a `--out` folder holds one per family)."""
    try:
        return sorted(p.name for p in folder.iterdir() if (p / MANIFEST).is_file() and not p.name.startswith("."))
    except OSError:
        return []


READ_BLOCK = 4 << 20  # bytes per read while hashing
HASH_THREADS = 16  # at most this many files/slices hashed at once


def sha256_of(path: str | Path, offset: int = 0, length: int | None = None, step: int = READ_BLOCK) -> str:
    """sha256 of a file, or of its `length` bytes from `offset` (a chunk of a chunked entry)."""
    h = hashlib.sha256()
    left = float("inf") if length is None else length
    with open(path, "rb") as f:
        f.seek(offset)
        while left > 0 and (block := f.read(int(min(step, left)))):
            h.update(block)  # hashlib releases the GIL on large updates: chunks hash in parallel threads
            left -= len(block)
    return h.hexdigest()


# Slice size of the chunk digests the builder writes for large files (artifacts/README.md "file entry").
CHUNK_BYTES = 64 << 20


def file_digests(path: Path, chunk_bytes: int = CHUNK_BYTES) -> tuple[str, list[str]]:
    """(sha256 of the whole file, sha256 of each chunk_bytes slice), in one read."""
    whole, chunks = hashlib.sha256(), []
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            whole.update(block)
            chunks.append(hashlib.sha256(block).hexdigest())
    return whole.hexdigest(), chunks


def check_files(root: Path, entries: list[FileEntry], workers: int | None = None) -> list[Path]:
    """Size, then sha256, of every file BEFORE anything reads it as weights or dlopens it. Every size is checked
    first; then the digests (whole files, and the slices of chunked entries) are computed on a thread pool. Returns
    one path per distinct file, in first-named order."""
    unique: dict[str, FileEntry] = {}
    for e in entries:  # a file named twice (buckets sharing a package) is hashed once
        if unique.setdefault(e.file, e) != e:
            raise IntegrityError(f"{root / e.file}: the manifest names it twice with different sizes or digests")
    entries = list(unique.values())
    paths = []
    for e in entries:
        path = root / e.file
        if not path.is_file():
            raise IntegrityError(f"{path}: missing (the manifest lists it); rebuild or re-copy the artifact")
        size = path.stat().st_size
        if size != e.bytes:
            raise IntegrityError(f"{path}: {size} bytes, the manifest says {e.bytes} (truncated or replaced)")
        paths.append(path)
    jobs = []  # (path, offset, length, expected digest, what failed)
    for e, path in zip(entries, paths):
        if e.chunk_sha256:
            jobs += [
                (path, i * e.chunk_bytes, e.chunk_bytes, d, f"chunk {i} (bytes {i * e.chunk_bytes}…)")
                for i, d in enumerate(e.chunk_sha256)
            ]
        else:
            jobs.append((path, 0, e.bytes, e.sha256, "sha256"))
    if workers is None:
        workers = min(HASH_THREADS, os.cpu_count() or 1, len(jobs))
    if workers > 1 and len(jobs) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ttsaot-sha256") as pool:
            got = list(pool.map(lambda j: sha256_of(*j[:3]), jobs))
    else:
        got = [sha256_of(*j[:3]) for j in jobs]
    for (path, _off, _len, want, what), digest in zip(jobs, got):
        if digest != want:
            raise IntegrityError(
                f"{path}: {what} sha256 {digest[:16]}… differs from the manifest's {want[:16]}… "
                "(corrupt or tampered); rebuild the artifact"
            )
    return paths


def check_file(root: Path, entry: FileEntry) -> Path:
    """Size then sha256 of one file, BEFORE anything reads it as weights or dlopens it."""
    return check_files(root, [entry])[0]


# ------------------------------------------------------------------------------- compatibility
_ISA_RANK = {"DEFAULT": 0, "NO AVX": 0, "AVX2": 1, "AVX512": 2}


def check_compatible(m: Manifest, device: torch.device) -> None:
    """Refuse, with one line saying what was built for what, an artifact this process cannot run."""
    env = m.build_env
    rebuild = f"rebuild with `build-artifacts build {m.family} --device {device.type}` on this machine"
    if m.device != device.type:
        raise CompatibilityError(
            f"artifact {m.family!r} was built for device {m.device!r}, loading on {device.type!r}; {rebuild}"
        )
    built_torch = str(env.get("torch"))
    if built_torch != torch.__version__:
        raise CompatibilityError(
            f"artifact {m.family!r} was built with torch {built_torch}, this process has "
            f"torch {torch.__version__} (AOTI packages are not promised across versions); "
            f"{rebuild}"
        )
    abi = env.get("cxx11_abi")
    if abi is not None and bool(abi) != bool(torch._C._GLIBCXX_USE_CXX11_ABI):
        raise CompatibilityError(
            f"artifact {m.family!r} was built against the {'new' if abi else 'old'} C++ ABI, "
            f"this torch uses the other one; {rebuild}"
        )
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise CompatibilityError("artifact needs CUDA but torch.cuda.is_available() is False")
        major, minor = torch.cuda.get_device_capability(device)
        here = f"{major}.{minor}"
        if str(env.get("sm")) != here:
            raise CompatibilityError(
                f"artifact {m.family!r} was built for GPU architecture sm_{env.get('sm')} "
                f"({env.get('gpu_name')}), this GPU is sm_{here} "
                f"({torch.cuda.get_device_name(device)}); {rebuild}"
            )
        built_cuda = env.get("cuda")
        if built_cuda and torch.version.cuda and built_cuda.split(".")[0] != torch.version.cuda.split(".")[0]:
            raise CompatibilityError(
                f"artifact {m.family!r} was built with CUDA {built_cuda}, this torch uses "
                f"CUDA {torch.version.cuda}; {rebuild}"
            )
    else:
        built_isa = str(env.get("cpu_isa", ""))
        here = torch.backends.cpu.get_cpu_capability()
        need = max((_ISA_RANK.get(tok, 0) for tok in built_isa.split()), default=0)
        if need > _ISA_RANK.get(here, 0):
            raise CompatibilityError(
                f"artifact {m.family!r} was compiled for CPU ISA {built_isa!r}, this CPU "
                f"supports {here!r} (would crash with an illegal instruction); {rebuild}"
            )
