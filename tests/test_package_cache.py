"""The package cache (builder/package_cache.py): a rebuild with no change compiles nothing and still passes the
subprocess load check; a changed bucket, dtype or kernel source compiles; a changed value that the package inlined
misses; a corrupted entry is discarded and rebuilt; concurrent builds sharing the cache both succeed."""

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ttsaot.builder import build as build_mod
from ttsaot.builder import package_cache
from ttsaot.builder.buckets import BucketPlan
from ttsaot.builder.build import BuildError, Reporter, build_family
from ttsaot.builder.families.qwen3_tts_12hz import FAMILY as QWEN
from ttsaot.builder.package_cache import ENTRY, PACKAGE, PackageCache, program_sources

from .test_build_atomic import _specs

ROOT = Path(__file__).resolve().parents[1]


class Notes(Reporter):
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, msg: str) -> None:
        self.notes.append(msg)


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    """One real build (b1_f8, fp32) that fills a fresh cache: (cache dir, artifact path)."""
    root = tmp_path_factory.mktemp("package_cache")
    rep = Notes()
    res = build_family(QWEN.name, _specs(), root / "first", "cpu", cache_dir=root / "cache", reporter=rep)
    assert "code2wav: 0 of 1 packages reused from the package cache" in rep.notes
    return root / "cache", res.path


def _entries(cache: Path) -> list[Path]:
    return [p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")]


def _no_compile(monkeypatch) -> list:
    """Any AOTI compile fails the build with a recognisable error, and is counted."""
    calls = []

    def compiled(*a, **k):
        calls.append(k.get("model_name"))
        raise build_mod.CompileError("compile was called")

    monkeypatch.setattr(build_mod, "compile_bucket", compiled)
    return calls


def test_rebuild_with_no_change_reuses_every_package(cached, monkeypatch, tmp_path):
    cache, first = cached
    calls = _no_compile(monkeypatch)
    rep = Notes()
    res = build_family(QWEN.name, _specs(), tmp_path, "cpu", cache_dir=cache, reporter=rep)  # verified in a child
    assert calls == [] and "code2wav: 1 of 1 packages reused from the package cache" in rep.notes
    for rel in ("code2wav/b1_f8.pt2", "code2wav.safetensors", "golden/code2wav.safetensors"):
        assert (res.path / rel).read_bytes() == (first / rel).read_bytes(), rel
    assert not (res.path / "code2wav/b1_f8.pt2").is_symlink()
    m1, m2 = (json.loads((p / "manifest.json").read_text()) for p in (first, res.path))
    assert m1["stages"]["code2wav"]["buckets"] == m2["stages"]["code2wav"]["buckets"]


def test_changed_bucket_or_dtype_misses(cached, monkeypatch, tmp_path):
    cache, _ = cached
    calls = _no_compile(monkeypatch)
    specs = [replace(_specs()[0], plan=BucketPlan({"batch": (1,), "frames": (16,)}))]
    with pytest.raises(BuildError, match="code2wav/b1_f16: compile was called"):
        build_family(QWEN.name, specs, tmp_path, "cpu", cache_dir=cache)
    bf16 = _specs()
    bf16[0].dtype = torch.bfloat16
    with pytest.raises(BuildError, match="code2wav/b1_f8: compile was called"):
        build_family(QWEN.name, bf16, tmp_path, "cpu", cache_dir=cache)
    assert calls == ["code2wav_b1_f16", "code2wav_b1_f8"]


def test_changed_kernel_source_misses(cached, monkeypatch, tmp_path):
    cache, _ = cached
    builder = tmp_path / "builder"  # a copy of the sources the key reads, one kernel file edited
    shutil.copytree(package_cache._BUILDER / "kernels", builder / "kernels")
    shutil.copy(package_cache._BUILDER / "export.py", builder / "export.py")
    src = builder / "kernels" / "skinny_linear.py"
    src.write_text(src.read_text() + "\n# edited\n")
    monkeypatch.setattr(package_cache, "_BUILDER", builder)
    _no_compile(monkeypatch)
    with pytest.raises(BuildError, match="code2wav/b1_f8: compile was called"):
        build_family(QWEN.name, _specs(), tmp_path / "out", "cpu", cache_dir=cache)


def test_changed_inlined_value_misses(cached):
    """Inductor inlines some CPU constants into the code (they are not among the package's weights): a lookup
    with another value of one of them must not reuse the package."""
    cache, first = cached
    (entry,) = _entries(cache)
    meta = json.loads((entry / ENTRY).read_text())
    spec = _specs()[0]
    module = spec.make_module().eval()
    for p in spec.passes:
        p(module)
    module = build_mod.cast_to_compute_dtype(module, spec.dtype).eval()
    sizes = spec.plan.buckets()[0]
    ex = spec.make_inputs(sizes, torch.Generator().manual_seed(0))
    sources = program_sources(
        build_mod.export_bucket(module, tuple(ex[n] for n in spec.input_names), torch.device("cpu"))
    )
    pc = PackageCache(cache)
    assert pc.fetch(entry.name, sources, first.parent / "probe.pt2").weights is not None
    if meta["unbound"]:
        name = next(iter(meta["unbound"]))
        changed = {**sources, name: sources[name] + 1}
        found = pc.fetch(entry.name, changed, first.parent / "probe2.pt2")
        assert found.weights is None and name in found.why
    bound = meta["constants"][0][0]
    with_other_weights = {**sources, bound: sources[bound] * 2}
    found = pc.fetch(entry.name, with_other_weights, first.parent / "probe3.pt2")
    assert found.weights is not None and torch.equal(found.weights[bound], sources[bound] * 2)


_CHILD = """
import sys
sys.path.insert(0, {root!r})
from tests.test_build_atomic import _specs
from ttsaot.builder.build import Reporter, build_family

class Print(Reporter):
    def note(self, msg):
        print(msg, flush=True)

build_family("qwen3-tts-12hz", _specs(), {out!r}, "cpu", cache_dir={cache!r}, reporter=Print())
"""


@pytest.mark.heavy
def test_corrupted_entry_is_rebuilt_by_one_of_two_concurrent_builds(cached, tmp_path):
    cache, _ = cached
    (entry,) = _entries(cache)
    pkg = entry / PACKAGE
    data = bytearray(pkg.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pkg.write_bytes(bytes(data))
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD.format(root=str(ROOT), out=str(tmp_path / f"o{i}"), cache=str(cache))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [c.communicate(timeout=1500) for c in children]
    for c, (_, err) in zip(children, outs):
        assert c.returncode == 0, err[-3000:]
    discarded = [out for out, _ in outs if "does not match its recorded sha256" in out]
    reused = [out for out, _ in outs if "1 of 1 packages reused" in out]
    assert len(discarded) == 1 and len(reused) == 1, outs  # one rebuilt it, the other waited and reused
    meta = json.loads((entry / ENTRY).read_text())
    assert package_cache._sha256_file(entry / PACKAGE) == meta["sha256"]
    assert (tmp_path / "o0/qwen3-tts-12hz/code2wav/b1_f8.pt2").read_bytes() == (
        tmp_path / "o1/qwen3-tts-12hz/code2wav/b1_f8.pt2"
    ).read_bytes()


@pytest.mark.heavy
def test_added_bucket_compiles_one_package_in_a_worker(cached, tmp_path):
    """--jobs 2 with the cache: the known bucket is reused, the new one compiled in a worker and stored."""
    cache, first = cached
    specs = [replace(_specs()[0], plan=BucketPlan({"batch": (1,), "frames": (8, 16)}))]
    rep = Notes()
    res = build_family(QWEN.name, specs, tmp_path, "cpu", cache_dir=cache, reporter=rep, jobs=2)
    assert "code2wav: 1 of 2 packages reused from the package cache" in rep.notes, rep.notes
    assert (res.path / "code2wav/b1_f8.pt2").read_bytes() == (first / "code2wav/b1_f8.pt2").read_bytes()
    assert len(_entries(cache)) == 2
    rep = Notes()
    build_family(QWEN.name, specs, tmp_path / "again", "cpu", cache_dir=cache, reporter=rep, jobs=2)
    assert "code2wav: 2 of 2 packages reused from the package cache" in rep.notes, rep.notes
