"""A content-addressed cache of compiled AOTI packages, so that a rebuild compiles only what changed.

A package is compiled without its constants, so what it is depends on the exported program (graph, signature,
the names / shapes / dtypes of the tensors it binds — not their values), the bucket's example inputs, the dtype,
the kernel choice and the kernel layer's source, the Inductor options and the toolchain (torch, triton, CUDA,
C++ compiler, device / sm). All of that is the key. Two exceptions make values matter, and both are checked:
- Inductor inlines some constants into the generated code on CPU (seen: conv biases of the Qwen decoder; they
  never come back among the package's weights). The entry records a hash of the value of every tensor of the
  program that the package does not bind; a lookup whose values differ is a miss (the entry is replaced).
- the weights a reused package binds are taken from the program by name, so the entry is stored only when every
  compiled constant is one of the program's tensors with the same value (never a folded or derived one).

Layout: `<root>/<key>/{package.pt2, entry.json}`, written in a temporary folder and renamed into place, under a
lock per key (`<root>/<key>.lock`, the `filelock` the bench's artifact cache uses), so concurrent builds share
entries: one compiles, the other waits and reuses. An entry whose package does not hash to what it recorded is
discarded and rebuilt. Reused packages are copied into the artifact and still pass the build's subprocess load
check like fresh ones.

The key above needs the exported program, and torch.export (with the CPU lowering) costs seconds to a minute per
bucket. So each bucket also has a pre-export key (`pre_export_key`): what determines the program before it is
made — the stage spec, the rewritten module's structure, attributes and tensor layouts (not values), the bucket's
example-input layouts, dtype, kernel choice, the builder's own source, and the same toolchain / Inductor options /
environment as the key. `<root>/index/<pre-key>.json` records the package key it led to and the names and layouts
of the program's tensors, which are the module's own parameters and buffers (checked byte for byte before an index
entry is written), so a rebuild finds the package and its weights without exporting. An index entry only points:
the package entry is fetched and checked as above, and any miss (no entry, an unreadable one, a package gone or
stale) falls back to exporting, which rewrites the index entry.

The golden cases of a stage (the faithful module's fp32 eager outputs on the golden inputs) are kept too, as
`<root>/golden/<key>.{safetensors,json}`: `golden_key` covers what decides them — the stage spec, the faithful and
rewritten modules' layout, the values of every tensor of the faithful module (the weights, `module_values_digest`),
the golden inputs themselves, the builder's source, torch and the CPU's kernels and threads. A file that does not
hash to its record is discarded; any miss runs the forwards (and the passes' parity check) as without a cache."""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .cache_layout import (
    CACHE_ENV,
    COMPILING,
    ENTRY,
    GOLDEN,
    INDEX,
    KEY,
    PACKAGE,
    default_cache_dir,
    lock_name,
    lock_path,
)

ENTRY_FORMAT = 1
INDEX_FORMAT = 1
GOLDEN_FORMAT = 1
_BUILDER = Path(__file__).parent


def sources_hash(base: Path, pattern: str = "**/*.py", skip: tuple[str, ...] = ()) -> str:
    """sha256 over the files below `base` matching `pattern` (sorted; each as its path relative to `base` and its
    bytes), but the relative paths in `skip`."""
    h = hashlib.sha256()
    for src in sorted(base.glob(pattern)):
        rel = src.relative_to(base).as_posix()
        if rel not in skip:
            h.update(rel.encode() + b"\0" + src.read_bytes() + b"\0")
    return h.hexdigest()


def kernel_sources_hash() -> str:
    """The source text of the ttsaot kernel layer (builder/kernels/*.py): the custom ops, their Triton code and
    their CPU lowerings all end up in the compiled packages."""
    return sources_hash(_BUILDER / "kernels", "*.py")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _mark_used(record: Path) -> None:
    """An entry's "last used" is its record's modification time (what builder/cache_prune.py evicts by): a reuse
    refreshes it. Best effort: a read-only cache is still read."""
    try:
        os.utime(record)
    except OSError:
        pass


def _replace_file(path: Path, write: Callable[[Path], Any]) -> None:
    """Write `path` through a temporary file beside it and an atomic rename: a reader sees the old file or the
    whole new one, never a part (the temporary file is removed if `write` fails)."""
    fd, name = tempfile.mkstemp(prefix=f".tmp-{path.name[:12]}-", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def tensor_digest(t: torch.Tensor) -> str:
    t = t.detach().to("cpu").contiguous()
    h = hashlib.sha256(str((t.dtype, tuple(t.shape))).encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy())  # reshape: a 0-dim tensor has no byte view; no copy
    return h.hexdigest()


def tensor_digests(tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    """`tensor_digest` of each, on threads (hashlib releases the GIL while it hashes): a full-size stage holds
    gigabytes, hashed for its golden-case key on every cached build (5.8 s of sha256 in Fish's H100 profile,
    bench/results/nvidia-h100/probes/build_profile/)."""
    if len(tensors) < 2:
        return {k: tensor_digest(t) for k, t in tensors.items()}
    from concurrent.futures import ThreadPoolExecutor

    from ..runtime.artifact import HASH_THREADS

    workers = min(HASH_THREADS, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ttsaot-digest") as pool:
        return dict(zip(tensors, pool.map(tensor_digest, tensors.values())))


def _arg_text(a: Any) -> str:
    if isinstance(a, torch.fx.Node):
        return f"%{a.name}"
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_arg_text(x) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner})"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k!r}: {_arg_text(v)}" for k, v in a.items()) + "}"
    return repr(a)


def _val_text(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"{v.dtype}{list(v.shape)}{list(v.stride())}{v.device.type}"
    if isinstance(v, (list, tuple)):
        return "(" + ",".join(_val_text(x) for x in v) + ")"
    return repr(v) if isinstance(v, (int, float, bool, str, type(None))) else type(v).__name__


def _graph_text(gm: torch.fx.GraphModule) -> str:
    """Every node: op, target, arguments and the shape/dtype/stride it computes; submodule graphs (higher-order
    ops) included. Not `print_readable`: its source-location comments would tie the key to the checkout path."""
    lines = []
    for node in gm.graph.nodes:
        lines.append(
            f"{node.op} {node.name} {node.target} {_arg_text(node.args)} {_arg_text(node.kwargs)} "
            f"{_val_text(node.meta.get('val'))}"
        )
        if node.op == "get_attr":
            sub = getattr(gm, str(node.target), None)
            if isinstance(sub, torch.fx.GraphModule):
                lines.append(f"<{node.target}>\n{_graph_text(sub)}\n</{node.target}>")
    return "\n".join(lines)


def program_sources(ep: torch.export.ExportedProgram) -> dict[str, torch.Tensor]:
    """The tensors an exported program carries (parameters, buffers, lifted constants) by fully qualified name:
    the names AOTI gives the constants of a package compiled from `ep.module()`."""
    out = {k: v for k, v in ep.constants.items() if isinstance(v, torch.Tensor)}
    out.update(ep.state_dict)
    return out


def program_fingerprint(ep: torch.export.ExportedProgram) -> str:
    """Everything of the exported program that shapes a weightless package: the graph, the signature, the ranges
    of its symbolic sizes (the same graph exported over another range compiles to another package) and the layout
    (not the values) of every tensor it carries."""
    h = hashlib.sha256(_graph_text(ep.graph_module).encode())
    h.update(str(ep.graph_signature).encode())
    h.update(str(sorted((str(s), str(r)) for s, r in ep.range_constraints.items())).encode())
    for name, t in sorted(program_sources(ep).items()):
        h.update(f"{name} {t.dtype} {list(t.shape)} {list(t.stride())}\n".encode())
    return h.hexdigest()


KERNEL_SWITCHES = (
    "TTSAOT_PDL",
    "TTSAOT_PDL_MAX_ROWS",
    "TTSAOT_SKINNY_STREAM",
    "TTSAOT_SKINNY_SWAP_AB",
    "TTSAOT_GEMV_PRELOAD",
    "TTSAOT_QKV_ATTENTION",
    "TTSAOT_WHOLE_ATTENTION_WARPS",
    "TTSAOT_NORM_OUT",
    "TTSAOT_ATTENTION_O",
    "TTSAOT_ATTENTION_EARLY_BLOCK",
)


def _inductor_env() -> dict[str, str]:
    """Environment variables that change what Inductor or Triton generate (the cache location does not), and the
    kernel layer's build switches: TTSAOT_PDL (kernels/pdl.py: whether the launch helper gets the
    programmatic-launch attribute), TTSAOT_PDL_MAX_ROWS (kernels/pdl.py: up to how many rows a package gets it),
    TTSAOT_SKINNY_STREAM (kernels/skinny_linear.py: the streamed tile form),
    TTSAOT_SKINNY_SWAP_AB (kernels/skinny_linear.py: =1, the 16-bit tile form as W · xᵀ on warpgroup MMAs),
    TTSAOT_GEMV_PRELOAD (kernels/skinny_linear_triton.py: =0, no one-row call loads its W before the wait),
    TTSAOT_QKV_ATTENTION (kernels/qkv_attention.py: =1, the predictors' steps trace the fused qkv + attention op),
    TTSAOT_WHOLE_ATTENTION_WARPS (kernels/decode_attention.py: the whole-cache attention's warps, not autotuned),
    TTSAOT_NORM_OUT (kernels/skinny_linear.py: =0, no layer hands its next RMSNorm to the projection before it),
    TTSAOT_ATTENTION_O (kernels/sequence_attention_o.py: =1, the LocDiT layers' attention inside o_proj, one op),
    TTSAOT_ATTENTION_EARLY_BLOCK (kernels/decode_attention.py: =0, no split attention loads its first cache block
    before its PDL wait)."""
    skip = {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_COMPILE_THREADS"}  # where / how fast
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if (k.startswith(("TORCHINDUCTOR_", "TRITON_", "TORCH_COMPILE_")) or k in KERNEL_SWITCHES) and k not in skip
    }


def _environment() -> dict[str, Any]:
    """What both keys take from this process rather than from the build: the kernel layer's and export.py's
    source, the precision flags Inductor reads at compile time, and the Inductor / Triton environment."""
    return {
        "kernel_sources": kernel_sources_hash(),
        "export_source": hashlib.sha256((_BUILDER / "export.py").read_bytes()).hexdigest(),
        "precision": [
            torch.get_float32_matmul_precision(),
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
        ],
        "env": _inductor_env(),
    }


def _digest(info: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(info, sort_keys=True, default=str).encode()).hexdigest()


def cache_key(ep: torch.export.ExportedProgram, context: dict[str, Any]) -> str:
    """`context`: what the build adds (stage, bucket sizes, dtype, kernel choice, example-input signature, Inductor
    options incl. the package's metadata, build environment); `_environment()` is added here."""
    return _digest(
        {"entry_format": ENTRY_FORMAT, "program": program_fingerprint(ep), "context": context, **_environment()}
    )


def builder_sources_hash() -> str:
    """The source text of the builder (every builder/**/*.py but the CLI): the families' modules, layers, passes
    and export code that decide what torch.export makes of a stage."""
    return sources_hash(_BUILDER, skip=("cli.py",))


def pre_export_key(context: dict[str, Any], layout: str) -> str:
    """The key of a bucket BEFORE it is exported: the same `context` and `_environment()` as `cache_key`, with the
    builder's source and `layout` (the stage spec and the module, `stable_text` / `module_layout`) in place of the
    exported program, which they determine. It names an index entry pointing at the package's `cache_key`."""
    info = {
        "index_format": INDEX_FORMAT,
        "context": context,
        "layout": layout,
        "builder_sources": builder_sources_hash(),
    }
    return _digest({**info, **_environment()})


def module_values_digest(module: torch.nn.Module) -> str:
    """A hash of the values of every tensor a module holds: parameters and buffers by every name, and tensors kept
    as plain attributes (directly or in a list, tuple or dict), which `module_layout` records by layout only."""
    h = hashlib.sha256()
    for name, digest in sorted(tensor_digests(module_tensors(module)).items()):
        h.update(f"{name} {digest}\n".encode())
    for mname, m in module.named_modules(remove_duplicate=False):
        for k, v in sorted(vars(m).items()):
            if k in _MODULE_INTERNALS:
                continue
            items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, (list, tuple)) else [("", v)]
            for i, t in items:
                if isinstance(t, torch.Tensor):
                    h.update(f"{mname}.{k}[{i}] {tensor_digest(t)}\n".encode())
    return h.hexdigest()


def golden_key(info: dict[str, Any]) -> str:
    """The key of a stage's golden cases (the fp32 eager outputs of the faithful module on the golden inputs).
    `info`: what the build adds (the stage spec, the modules' layout and values digest, the golden inputs' digests);
    added here: the builder's source (the modules' code, the passes whose parity the cases also checked), the
    torch version, the CPU's kernels and thread count (they decide the last bits of the outputs) and
    `_environment()` (precision flags)."""
    return _digest(
        {
            "golden_format": GOLDEN_FORMAT,
            "info": info,
            "builder_sources": builder_sources_hash(),
            "torch": torch.__version__,
            "cpu": [torch.backends.cpu.get_cpu_capability(), torch.get_num_threads(), os.uname().machine],
            **_environment(),
        }
    )


# What every nn.Module carries (parameters, submodules, hooks, ...): covered by module_layout's own lines.
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module())) | {"training"}


def stable_text(v: Any) -> str:
    """A text of `v` that is the same in every process (no object addresses): values of plain data, the layout of
    tensors (never their values: packages are weightless), the qualified names of functions and classes."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return repr(v)
    if isinstance(v, (torch.dtype, torch.device, enum.Enum)):
        return str(v)
    if isinstance(v, torch.Tensor):
        return f"tensor({v.dtype}, {list(v.shape)}, {list(v.stride())}, {v.device.type})"
    if isinstance(v, (list, tuple, set, frozenset)):
        items = [stable_text(x) for x in v]
        return f"{type(v).__name__}[{', '.join(sorted(items) if isinstance(v, (set, frozenset)) else items)}]"
    if isinstance(v, dict):
        return "{" + ", ".join(sorted(f"{stable_text(k)}: {stable_text(x)}" for k, x in v.items())) + "}"
    if isinstance(v, functools.partial):
        return f"partial({stable_text(v.func)}, {stable_text(v.args)}, {stable_text(v.keywords)})"
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        fields = ", ".join(f"{f.name}={stable_text(getattr(v, f.name))}" for f in dataclasses.fields(v))
        return f"{_qualname(type(v))}({fields})"
    if callable(v) and hasattr(v, "__qualname__"):
        return _qualname(v)
    return _qualname(type(v))


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def module_layout(module: torch.nn.Module) -> str:
    """Everything of a module that torch.export reads besides the code (the builder's source): every submodule's
    class and plain attributes, its hooks, and the name, layout, aliasing and persistence of every parameter and
    buffer — not their values."""
    lines = []
    for name, m in module.named_modules(remove_duplicate=False):
        attrs = {k: v for k, v in vars(m).items() if k not in _MODULE_INTERNALS}
        hooks = [len(m._forward_pre_hooks), len(m._forward_hooks)]
        lines.append(f"module {name!r} {_qualname(type(m))} {stable_text(attrs)} hooks={hooks}")
        lines.append(f"  non_persistent {sorted(m._non_persistent_buffers_set)}")
    first: dict[int, str] = {}
    named = [("param", *kv) for kv in module.named_parameters(remove_duplicate=False)]
    named += [("buffer", *kv) for kv in module.named_buffers(remove_duplicate=False)]
    for kind, name, t in named:
        alias = first.setdefault(id(t), name)
        lines.append(f"{kind} {name} {stable_text(t)} requires_grad={t.requires_grad} same_as={alias}")
    return "\n".join(lines)


def module_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's parameters and buffers by every name they have: what an exported program's tensors are."""
    out = dict(module.named_parameters(remove_duplicate=False))
    out.update(module.named_buffers(remove_duplicate=False))
    return out


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same layout and the same bytes (the weights file is written from one or the other)."""
    if (a.dtype, a.shape, a.stride(), a.device) != (b.dtype, b.shape, b.stride(), b.device):
        return False
    if a.data_ptr() == b.data_ptr():
        return True
    return torch.equal(
        a.detach().contiguous().view(-1).view(torch.uint8), b.detach().contiguous().view(-1).view(torch.uint8)
    )


@dataclass
class Lookup:
    """What a lookup found: `weights` (constant name → tensor, in the package's order) when the package was reused
    and copied to the destination; `why` when it was not (absent, stale values, corrupted...)."""

    weights: dict[str, torch.Tensor] | None
    why: str = ""


@dataclass
class PackageCache:
    root: Path
    notes: list[str] = field(default_factory=list)  # what happened to entries (corrupted, not cacheable)
    # the entries this build stored or reused: discarded together when its artifact fails the load check
    used: set[str] = field(default_factory=set)
    # the compile claims this build holds (`claim`): key → its held lock
    claims: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    def lock(self, key: str):
        """Exclusive per key across processes: a concurrent build of the same package waits, then reuses it."""
        from filelock import FileLock

        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(str(lock_path(self.root, key)))

    def claim(self, key: str, wait: bool = False) -> bool:
        """Claim the compile of `key`'s package for this build: False (`wait` False) when another build holds the
        claim, i.e. is compiling that package right now. A build that compiles in workers looks a package up
        (`fetch`, under `lock`) before it hands it over, but does not hold that lock while a worker compiles (its
        next lookups and hand-overs would wait on it): builds started together on one cache missed the same
        packages and each compiled them (tests/test_package_cache.py, two builds started together; in the GPU test
        suite with one xdist worker per core the VoxCPM2 end-to-end test, started beside the LM fixture whose
        packages it shares, took 325 CPU seconds against 107 after it, most likely for that reason:
        bench/results/nvidia-h200/probes/gpu_suite_cpu/). A build whose claim fails waits for the claim
        instead, then reuses the package, or compiles it if the claimant failed. Held until `release_claim` (after
        the store) or `release_claims` (a failed build); a build that dies loses its claims with its process.
        Never wait for a claim while holding a key's `lock` (the claimant takes it to store)."""
        if key in self.claims:
            return True
        from filelock import FileLock, Timeout

        self.root.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(lock_path(self.root, lock_name(COMPILING, key))))
        try:
            lock.acquire(timeout=-1 if wait else 0)
        except Timeout:
            return False
        self.claims[key] = lock
        return True

    def release_claim(self, key: str) -> None:
        lock = self.claims.pop(key, None)
        if lock is not None:
            lock.release()

    def release_claims(self) -> None:
        """Release every claim this build holds (it failed or was stopped: another build may compile them)."""
        for key in list(self.claims):
            self.release_claim(key)

    def _discard(self, entry: Path, why: str) -> None:
        self.notes.append(f"package cache: discarded {entry.name[:12]} ({why})")
        shutil.rmtree(entry, ignore_errors=True)

    def fetch(self, key: str, sources: dict[str, torch.Tensor], dest: Path) -> Lookup:
        """Copy the cached package of `key` to `dest` and return the weights it binds, taken from `sources`.
        Call under `lock(key)`. A corrupted entry is discarded."""
        entry = self.root / key
        if not (entry / ENTRY).is_file():
            return Lookup(None, "absent")
        try:
            meta = json.loads((entry / ENTRY).read_text())
            ok = meta["format"] == ENTRY_FORMAT and meta["key"] == key
            constants, unbound = meta["constants"], meta["unbound"]
        except (OSError, ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            self._discard(entry, "unreadable entry.json")
            return Lookup(None, "corrupted")
        for name, digest in unbound.items():
            if name not in sources or tensor_digest(sources[name]) != digest:
                why = f"the value of {name!r}, inlined into the package's code, changed"
                self.notes.append(f"package cache: recompiling {entry.name[:12]} ({why})")
                return Lookup(None, why)
        weights: dict[str, torch.Tensor] = {}
        for name, dtype, shape in constants:
            t = sources.get(name)
            if t is None or str(t.dtype) != dtype or list(t.shape) != shape:
                self._discard(entry, f"constant {name!r} does not fit the program")
                return Lookup(None, "corrupted")
            weights[name] = t.detach().to("cpu")
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(entry / PACKAGE, dest)
            digest = _sha256_file(dest)
        except OSError as e:
            digest = f"unreadable ({e})"
        if digest != meta.get("sha256"):
            dest.unlink(missing_ok=True)
            self._discard(entry, "package.pt2 does not match its recorded sha256")
            return Lookup(None, "corrupted")
        _mark_used(entry / ENTRY)
        self.used.add(key)
        return Lookup(weights)

    def store(
        self, key: str, package: Path, weights: dict[str, torch.Tensor], sources: dict[str, torch.Tensor]
    ) -> bool:
        """Record a freshly compiled package; False (nothing stored) when a constant is not one of the program's
        tensors unchanged, since a reuse could not rebuild its value. Call under `lock(key)`."""
        for name, t in weights.items():
            s = sources.get(name)
            if s is None or s.dtype != t.dtype or s.shape != t.shape or not torch.equal(s.detach().to("cpu"), t):
                self.notes.append(
                    f"package cache: {package.name} not cached (constant {name!r} is derived by the "
                    "compile, not one of the program's tensors)"
                )
                return False
        meta = {
            "format": ENTRY_FORMAT,
            "key": key,
            "sha256": _sha256_file(package),
            "bytes": package.stat().st_size,
            "constants": [[n, str(t.dtype), list(t.shape)] for n, t in weights.items()],
            "unbound": {n: tensor_digest(t) for n, t in sorted(sources.items()) if n not in weights},
        }
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:12]}-", dir=self.root))
        try:
            shutil.copyfile(package, tmp / PACKAGE)
            (tmp / ENTRY).write_text(json.dumps(meta, indent=1))
            final = self.root / key
            if final.exists():  # a stale entry (inlined values changed): the new one replaces it
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.used.add(key)
        return True

    def discard_used(self, why: str) -> None:
        """Drop every entry this build stored or reused (`used`): its artifact failed the load check, which names a
        bucket but not a cache entry, and a package that cannot pass must not be served to the next build (a
        package compiled wrong stays wrong: with its key unchanged, every rebuild would reuse it and fail the same
        way). The next build compiles them again; index entries that point at them miss and are repaired."""
        for key in sorted(self.used):
            with self.lock(key):
                if (self.root / key).exists():
                    self._discard(self.root / key, why)
        self.used.clear()

    def _index_path(self, pre_key: str) -> Path:
        return self.root / INDEX / f"{pre_key}.json"

    def fetch_indexed(self, pre_key: str, tensors: dict[str, torch.Tensor], dest: Path) -> Lookup:
        """Reuse a package without exporting: the index entry of `pre_key` names the package's key and the tensors
        of its program, taken here from `tensors` (`module_tensors` of the module the build would export); the
        package entry is then fetched as by `fetch` (sha256, inlined values, constants all checked). A miss of any
        kind returns no weights: the build exports, and `index` repairs the entry. An unreadable entry, or one
        whose tensors the module does not have, is discarded."""
        path = self._index_path(pre_key)
        with self.lock(lock_name(INDEX, pre_key)):
            if not path.is_file():
                return Lookup(None, "not indexed")
            try:
                meta = json.loads(path.read_text())
                ok = meta["format"] == INDEX_FORMAT and meta["pre_key"] == pre_key
                key = meta["package_key"]
                ok = ok and isinstance(key, str) and KEY.fullmatch(key) is not None
                layout = {name: (dtype, shape, stride) for name, dtype, shape, stride in meta["sources"]}
            except (OSError, ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                self._discard_index(path, "unreadable index entry")
                return Lookup(None, "corrupted index entry")
            sources: dict[str, torch.Tensor] = {}
            for name, (dtype, shape, stride) in layout.items():
                t = tensors.get(name)
                if t is None or (str(t.dtype), list(t.shape), list(t.stride())) != (dtype, shape, stride):
                    self._discard_index(path, f"the module has no tensor {name!r} of the indexed layout")
                    return Lookup(None, "corrupted index entry")
                sources[name] = t
        with self.lock(key):
            return self.fetch(key, sources, dest)

    def index(
        self,
        pre_key: str,
        key: str,
        sources: dict[str, torch.Tensor],
        tensors: dict[str, torch.Tensor],
    ) -> bool:
        """Point `pre_key` at the package entry of `key`, once that entry exists; `sources` are the exported
        program's tensors, `tensors` the module's. False (nothing written) when some program tensor is not the
        module's tensor of the same name, byte for byte: a reuse without export could not bind it."""
        if not (self.root / key / ENTRY).is_file():
            return False
        for name, t in sources.items():
            m = tensors.get(name)
            if m is None or not _same_tensor(m, t):
                self.notes.append(
                    f"package cache: {key[:12]} not indexed (program tensor {name!r} is not the module's own); "
                    "its rebuilds export"
                )
                return False
        meta = {
            "format": INDEX_FORMAT,
            "pre_key": pre_key,
            "package_key": key,
            "sources": [[n, str(t.dtype), list(t.shape), list(t.stride())] for n, t in sorted(sources.items())],
        }
        path = self._index_path(pre_key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock(lock_name(INDEX, pre_key)):
            _replace_file(path, lambda tmp: tmp.write_text(json.dumps(meta, indent=1)))
        return True

    def fetch_golden(self, key: str, dest: Path) -> bool:
        """Copy the golden cases stored under `key` to `dest`; False (nothing at `dest`) when there are none or
        the stored file does not hash to what its record says (then it is discarded)."""
        base = self.root / GOLDEN / key
        with self.lock(lock_name(GOLDEN, key)):
            try:
                meta = json.loads(base.with_suffix(".json").read_text())
                ok = meta["format"] == GOLDEN_FORMAT and meta["key"] == key
                digest = meta["sha256"]
            except FileNotFoundError:
                return False
            except (OSError, ValueError, KeyError, TypeError):
                ok = False
            if ok:
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    shutil.copyfile(base.with_suffix(".safetensors"), dest)
                    ok = _sha256_file(dest) == digest
                except OSError:
                    ok = False
            if not ok:
                dest.unlink(missing_ok=True)
                self.notes.append(f"package cache: discarded golden cases {key[:12]} (unreadable or corrupted)")
                base.with_suffix(".json").unlink(missing_ok=True)
                base.with_suffix(".safetensors").unlink(missing_ok=True)
            else:
                _mark_used(base.with_suffix(".json"))
            return ok

    def store_golden(self, key: str, path: Path) -> None:
        """Record the golden cases file `path` under `key` (its record last, so a reader never sees a half-written
        entry)."""
        base = self.root / GOLDEN / key
        base.parent.mkdir(parents=True, exist_ok=True)
        meta = {"format": GOLDEN_FORMAT, "key": key, "sha256": _sha256_file(path)}
        with self.lock(lock_name(GOLDEN, key)):
            _replace_file(base.with_suffix(".safetensors"), lambda tmp: shutil.copyfile(path, tmp))
            _replace_file(base.with_suffix(".json"), lambda tmp: tmp.write_text(json.dumps(meta)))

    def _discard_index(self, path: Path, why: str) -> None:
        self.notes.append(f"package cache: discarded index entry {path.stem[:12]} ({why})")
        path.unlink(missing_ok=True)


def cached_compile(
    cache: PackageCache | None,
    key: str | None,
    sources: dict[str, torch.Tensor],
    dest: Path,
    compile_fn: Callable[[], Any],
) -> tuple[dict[str, torch.Tensor], bool]:
    """The weights of the package now at `dest` and whether it came from the cache: reuse the entry of `key`, or
    run `compile_fn` (which writes `dest` and returns a CompiledBucket) and store what it made."""
    if cache is None or key is None:
        return compile_fn().weights, False
    cache.claim(key, wait=True)  # another build compiling it in its workers: wait, then reuse what it stores
    try:
        with cache.lock(key):
            found = cache.fetch(key, sources, dest)
            if found.weights is not None:
                return found.weights, True
            weights = compile_fn().weights
            cache.store(key, dest, weights, sources)
            return weights, False
    finally:
        cache.release_claim(key)


__all__ = [
    "CACHE_ENV",
    "PackageCache",
    "builder_sources_hash",
    "cache_key",
    "cached_compile",
    "default_cache_dir",
    "golden_key",
    "kernel_sources_hash",
    "module_layout",
    "module_tensors",
    "module_values_digest",
    "pre_export_key",
    "program_fingerprint",
    "program_sources",
    "stable_text",
]
