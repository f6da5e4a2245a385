"""The package cache (builder/package_cache.py): a rebuild with no change exports and compiles nothing and still
passes the subprocess load check; a changed bucket, dtype or kernel source exports and compiles; a changed spec
field exports but reuses the package; a changed value that the package inlined misses; a corrupted entry or index
entry, or a missing package, is discarded and rebuilt; concurrent builds sharing the cache both succeed."""

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ttsaot.builder import build as build_mod
from ttsaot.builder import package_cache
from ttsaot.builder.buckets import BucketPlan
from ttsaot.builder.build import BuildError, build_family
from ttsaot.builder.families.qwen3_tts_12hz import FAMILY as QWEN
from ttsaot.builder.package_cache import (
    ENTRY,
    GOLDEN,
    INDEX,
    PACKAGE,
    PackageCache,
    module_layout,
    module_tensors,
    program_sources,
)

from . import package_cache_fixtures as pcf
from .package_cache_fixtures import Notes, cache_copy, dynamic_specs
from .test_build_atomic import _specs

ROOT = Path(__file__).resolve().parents[1]
# the run's filled caches (tests/package_cache_fixtures.py): one real build each, a private copy per test (`cached`)
filled_cache, cached, dynamic_filled_cache = pcf.filled_cache, pcf.cached, pcf.dynamic_filled_cache


def _entries(cache: Path) -> list[Path]:
    return [p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in (INDEX, GOLDEN)]


def _index(cache: Path) -> dict[str, dict]:
    """pre-export key → index entry (read as JSON; an unreadable one as its text)."""
    out = {}
    for p in (cache / INDEX).glob("*.json"):
        try:
            out[p.stem] = json.loads(p.read_text())
        except ValueError:
            out[p.stem] = {"text": p.read_text()}
    return out


def _count_exports(monkeypatch) -> list:
    """Every torch.export of the build (the builder's entry and torch's own), counted; both still export."""
    calls = []
    real_bucket, real_export = build_mod.export_bucket, torch.export.export

    def bucket(*a, **k):
        calls.append("export_bucket")
        return real_bucket(*a, **k)

    def export(*a, **k):
        calls.append("torch.export.export")
        return real_export(*a, **k)

    monkeypatch.setattr(build_mod, "export_bucket", bucket)
    monkeypatch.setattr(torch.export, "export", export)
    return calls


def _manifest(path: Path) -> dict:
    m = json.loads((path / "manifest.json").read_text())
    m.pop("created")  # the build's time
    return m


def _no_compile(monkeypatch) -> list:
    """Any AOTI compile fails the build with a recognisable error, and is counted."""
    calls = []

    def compiled(*a, **k):
        calls.append(k.get("model_name"))
        raise build_mod.CompileError("compile was called")

    monkeypatch.setattr(build_mod, "compile_bucket", compiled)
    return calls


def _count_golden(monkeypatch) -> list:
    """Every run of the golden forwards, counted (they still run)."""
    calls = []
    real = build_mod._golden_cases

    def golden(spec, *a, **k):
        calls.append(spec.name)
        return real(spec, *a, **k)

    monkeypatch.setattr(build_mod, "_golden_cases", golden)
    return calls


def test_rebuild_with_no_change_reuses_every_package(cached, monkeypatch, tmp_path):
    cache, first = cached
    calls = _no_compile(monkeypatch)
    exports = _count_exports(monkeypatch)
    forwards = _count_golden(monkeypatch)
    rep = Notes()
    res = build_family(QWEN.name, _specs(), tmp_path, "cpu", cache_dir=cache, reporter=rep)  # verified in a child
    assert calls == [] and "code2wav: 1 of 1 packages reused from the package cache" in rep.notes
    assert exports == []  # found through the pre-export index: not even exported
    assert forwards == []  # the golden cases of these very modules, weights and inputs: reused
    for rel in ("code2wav/b1_f8.pt2", "code2wav.safetensors", "golden/code2wav.safetensors"):
        assert (res.path / rel).read_bytes() == (first / rel).read_bytes(), rel
    assert not (res.path / "code2wav/b1_f8.pt2").is_symlink()
    assert _manifest(first) == _manifest(res.path)


def test_a_bounded_cache_keeps_what_the_build_used_and_drops_the_rest(cached, monkeypatch, tmp_path):
    """`cache_max_bytes` (the CLI's --cache-max-size): after the build, least recently used entries go down to the
    bound — here 0, so every entry this build did not use — and none that it used, even over the bound."""
    cache, first = cached
    _no_compile(monkeypatch)
    old = cache / ("f" * 64)
    shutil.copytree(_entries(cache)[0], old)  # an entry of some earlier build, a day unused
    os.utime(old / ENTRY, (time.time() - 86400,) * 2)
    used = {p.name for p in _entries(cache)} - {old.name}
    rep = Notes()
    build_family(QWEN.name, _specs(), tmp_path, "cpu", cache_dir=cache, reporter=rep, cache_max_bytes=0)
    assert "code2wav: 1 of 1 packages reused from the package cache" in rep.notes
    assert {p.name for p in _entries(cache)} == used and not old.exists()
    assert any("1 least recently used entries removed" in n for n in rep.notes), rep.notes
    assert len(list((cache / GOLDEN).glob("*.json"))) >= 1  # this build's golden cases: reused, so kept


def test_changed_spec_field_exports_and_reuses_the_package(cached, monkeypatch, tmp_path):
    """A spec field that does not change the program misses the pre-export key: the build exports, finds the same
    package by the program's key, and indexes it under the new pre-export key too (the next build skips export)."""
    cache, first = cached
    calls = _no_compile(monkeypatch)
    exports = _count_exports(monkeypatch)
    before = set(_index(cache))
    specs = [replace(_specs()[0], tolerance=2e-4)]
    build_family(QWEN.name, specs, tmp_path / "a", "cpu", cache_dir=cache, verify_in_subprocess=False)
    assert calls == [] and "export_bucket" in exports
    added = set(_index(cache)) - before
    assert len(added) == 1 and _index(cache)[added.pop()]["package_key"] == _entries(cache)[0].name
    exports.clear()
    res = build_family(QWEN.name, specs, tmp_path / "b", "cpu", cache_dir=cache, verify_in_subprocess=False)
    assert exports == [] and calls == []
    assert (res.path / "code2wav/b1_f8.pt2").read_bytes() == (first / "code2wav/b1_f8.pt2").read_bytes()


def _scaled(make, name: str):
    """The faithful module with parameter `name` scaled: other weights values, the same layout."""
    module = make()
    with torch.no_grad():
        module.get_parameter(name).mul_(1.5)
    return module


def test_changed_weights_miss_the_golden_cases(cached, monkeypatch, tmp_path):
    """Other weight values (a bound constant: the package is reused) must not reuse the golden cases: the forwards
    run again, the artifact's cases are the new module's outputs, and the packages pass the subprocess check
    against them."""
    cache, first = cached
    (entry,) = _entries(cache)
    spec = _specs()[0]
    params = dict(spec.make_module().named_parameters())
    bound = [n for n, _, _ in json.loads((entry / ENTRY).read_text())["constants"] if n in params]
    assert bound, "no weight of the faithful module is bound by name"
    specs = [replace(spec, make_module=partial(_scaled, spec.make_module, bound[0]))]
    calls = _no_compile(monkeypatch)
    forwards = _count_golden(monkeypatch)
    res = build_family(QWEN.name, specs, tmp_path, "cpu", cache_dir=cache)  # verified in a child
    assert calls == [] and forwards == ["code2wav"]
    new, old = (load_file(str(p / "golden/code2wav.safetensors")) for p in (res.path, first))
    module = specs[0].make_module().eval()
    for case in res.manifest.stages["code2wav"].golden_cases:
        assert torch.equal(new[f"{case}/in/codes"], old[f"{case}/in/codes"])
        with torch.no_grad():
            out = module(new[f"{case}/in/codes"])
        assert torch.equal(new[f"{case}/out/wav"], out)
        assert not torch.equal(new[f"{case}/out/wav"], old[f"{case}/out/wav"])


def test_golden_key_sees_weight_values_and_inputs():
    spec = _specs()[0]
    original = spec.make_module().eval()
    sizes = {"batch": 1, "frames": 8}
    inputs = [build_mod._GoldenCase(sizes, 0, spec.make_inputs(sizes, torch.Generator().manual_seed(0)))]
    base = build_mod._golden_key(spec, original, original, inputs)
    assert build_mod._golden_key(spec, spec.make_module().eval(), original, inputs) == base
    name = next(iter(dict(original.named_parameters())))
    with torch.no_grad():
        original.get_parameter(name).view(-1)[0] += 1.0  # one value
    assert build_mod._golden_key(spec, original, original, inputs) != base
    other = [build_mod._GoldenCase(sizes, 1, spec.make_inputs(sizes, torch.Generator().manual_seed(1)))]
    assert build_mod._golden_key(spec, spec.make_module().eval(), original, other) != base


def test_values_digest_sees_scalars_and_plain_tensor_attributes():
    module = torch.nn.Linear(2, 2)
    module.scale = torch.nn.Parameter(torch.tensor(1.0))  # 0-dim: no byte view of its own
    module.table = [torch.zeros(3)]  # a tensor kept as a plain attribute (not a buffer)
    base = package_cache.module_values_digest(module)
    with torch.no_grad():
        module.scale.fill_(2.0)
    assert package_cache.module_values_digest(module) != base
    module.scale.data.fill_(1.0)
    assert package_cache.module_values_digest(module) == base
    module.table[0][1] = 1.0
    assert package_cache.module_values_digest(module) != base


def test_corrupted_golden_cases_are_recomputed(cached, monkeypatch, tmp_path):
    cache, first = cached
    rel = "golden/code2wav.safetensors"
    good = (first / rel).read_bytes()
    stored = [p for p in (cache / GOLDEN).glob("*.safetensors") if p.read_bytes() == good]  # (other specs' too)
    assert stored
    for p in stored:
        p.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))
    forwards = _count_golden(monkeypatch)
    rep = Notes()
    res = build_family(QWEN.name, _specs(), tmp_path, "cpu", cache_dir=cache, reporter=rep, verify_in_subprocess=False)
    assert forwards == ["code2wav"] and any("discarded golden cases" in n for n in rep.notes), rep.notes
    assert (res.path / rel).read_bytes() == good
    assert any(p.is_file() and p.read_bytes() == good for p in stored)  # this build's cases stored again


def test_module_layout_sees_attributes_layout_and_ties_not_values():
    spec = _specs()[0]
    module = spec.make_module().eval()
    base = module_layout(module)
    other = spec.make_module().eval()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    assert module_layout(other) == base  # weights' values: packages are weightless
    name, sub = next((n, m) for n, m in module.named_modules() if isinstance(m, torch.nn.Conv1d))
    changed = spec.make_module().eval()
    changed.get_submodule(name).dilation = (7,)  # a plain attribute forward reads
    assert module_layout(changed) != base
    assert module_layout(build_mod.cast_to_compute_dtype(spec.make_module(), torch.bfloat16)) != base
    tied = spec.make_module().eval()
    convs = [m for m in tied.modules() if isinstance(m, torch.nn.Conv1d) and m.weight.shape == sub.weight.shape]
    if len(convs) >= 2:
        convs[1].weight = convs[0].weight
        assert module_layout(tied) != base
    assert set(module_tensors(module)) >= set(dict(module.named_parameters()))


def test_changed_bucket_or_dtype_misses(cached, monkeypatch, tmp_path):
    cache, _ = cached
    calls = _no_compile(monkeypatch)
    exports = _count_exports(monkeypatch)
    specs = [replace(_specs()[0], plan=BucketPlan({"batch": (1,), "frames": (16,)}))]
    with pytest.raises(BuildError, match="code2wav/b1_f16: compile was called"):
        build_family(QWEN.name, specs, tmp_path, "cpu", cache_dir=cache)
    bf16 = _specs()
    bf16[0].dtype = torch.bfloat16
    with pytest.raises(BuildError, match="code2wav/b1_f8: compile was called"):
        build_family(QWEN.name, bf16, tmp_path, "cpu", cache_dir=cache)
    assert calls == ["code2wav_b1_f16", "code2wav_b1_f8"]
    assert exports.count("export_bucket") == 2  # the pre-export key missed both times


def test_changed_kernel_source_misses(cached, monkeypatch, tmp_path):
    cache, _ = cached
    builder = tmp_path / "builder"  # a copy of the sources the keys read, one kernel file edited
    shutil.copytree(package_cache._BUILDER, builder, ignore=shutil.ignore_patterns("__pycache__"))
    assert package_cache.builder_sources_hash() == _with_builder(
        monkeypatch, builder, package_cache.builder_sources_hash
    )
    src = builder / "kernels" / "skinny_linear.py"
    src.write_text(src.read_text() + "\n# edited\n")
    monkeypatch.setattr(package_cache, "_BUILDER", builder)
    _no_compile(monkeypatch)
    exports = _count_exports(monkeypatch)
    with pytest.raises(BuildError, match="code2wav/b1_f8: compile was called"):
        build_family(QWEN.name, _specs(), tmp_path / "out", "cpu", cache_dir=cache)
    assert exports.count("export_bucket") == 1


def _with_builder(monkeypatch, builder: Path, fn):
    with monkeypatch.context() as m:
        m.setattr(package_cache, "_BUILDER", builder)
        return fn()


def test_corrupted_index_entry_exports_and_repairs_it(cached, monkeypatch, tmp_path):
    cache, first = cached
    calls = _no_compile(monkeypatch)
    exports = _count_exports(monkeypatch)
    before = _index(cache)
    for pre in before:  # truncated JSON naming a path outside the cache
        (cache / INDEX / f"{pre}.json").write_text('{"format": 1, "pre_key": "' + pre + '", "package_key": "../x"')
    rep = Notes()
    res = build_family(QWEN.name, _specs(), tmp_path, "cpu", cache_dir=cache, reporter=rep, verify_in_subprocess=False)
    assert calls == [] and exports.count("export_bucket") == 1  # exported once, the package found by its key
    assert any("discarded index entry" in n for n in rep.notes), rep.notes
    after = _index(cache)
    assert [k for k in before if after[k] == before[k]] != []  # this build's entry repaired
    assert (res.path / "code2wav.safetensors").read_bytes() == (first / "code2wav.safetensors").read_bytes()
    exports.clear()
    build_family(QWEN.name, _specs(), tmp_path / "again", "cpu", cache_dir=cache, verify_in_subprocess=False)
    assert exports == []


@pytest.mark.heavy  # compiles a package again (CI covers the fallback through the corrupted-index test)
def test_missing_package_exports_compiles_and_repairs_the_index(cached, monkeypatch, tmp_path):
    cache, first = cached
    copy = tmp_path / "cache"  # the shared cache keeps its entry for the other tests
    shutil.copytree(cache, copy, ignore=shutil.ignore_patterns("*.lock"))
    (entry,) = _entries(copy)
    shutil.rmtree(entry)
    before = _index(copy)
    compiles = []
    real = build_mod.compile_bucket
    monkeypatch.setattr(build_mod, "compile_bucket", lambda *a, **k: compiles.append(1) or real(*a, **k))
    exports = _count_exports(monkeypatch)
    res = build_family(QWEN.name, _specs(), tmp_path / "out", "cpu", cache_dir=copy, verify_in_subprocess=False)
    assert compiles == [1] and exports.count("export_bucket") == 1
    assert [e.name for e in _entries(copy)] == [entry.name] and _index(copy) == before
    for rel in ("code2wav.safetensors", "golden/code2wav.safetensors"):
        assert (res.path / rel).read_bytes() == (first / rel).read_bytes(), rel
    m1, m2 = _manifest(first)["stages"]["code2wav"], _manifest(res.path)["stages"]["code2wav"]
    for m in (m1, m2):  # a fresh compile is the same package, not the same bytes (the .so differs)
        m["buckets"] = [{k: v for k, v in b.items() if k != "sha256"} for b in m["buckets"]]
    assert m1 == m2


def test_changed_inlined_value_misses(cached, tmp_path):
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
    assert pc.fetch(entry.name, sources, tmp_path / "probe.pt2").weights is not None
    if meta["unbound"]:
        name = next(iter(meta["unbound"]))
        changed = {**sources, name: sources[name] + 1}
        found = pc.fetch(entry.name, changed, tmp_path / "probe2.pt2")
        assert found.weights is None and name in found.why
    bound = meta["constants"][0][0]
    with_other_weights = {**sources, bound: sources[bound] * 2}
    found = pc.fetch(entry.name, with_other_weights, tmp_path / "probe3.pt2")
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


def _two_builds_at_once(child: str, tmp_path: Path, cache: Path) -> list[str]:
    """Run the build script `child` (a `_CHILD`-like template) in two processes at once, writing to
    tmp_path/o0 and tmp_path/o1 with one cache; their printed notes, once both succeeded."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", child.format(root=str(ROOT), out=str(tmp_path / f"o{i}"), cache=str(cache))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [c.communicate(timeout=1500) for c in children]
    for c, (_, err) in zip(children, outs):
        assert c.returncode == 0, err[-3000:]
    return [out for out, _ in outs]


@pytest.mark.heavy
def test_corrupted_entry_is_rebuilt_by_one_of_two_concurrent_builds(cached, tmp_path):
    # On a copy: the recompiled package's bytes differ from the shared fixture's (which other tests compare with)
    cache = tmp_path / "cache"
    shutil.copytree(cached[0], cache, ignore=shutil.ignore_patterns("*.lock"))
    (entry,) = _entries(cache)
    pkg = entry / PACKAGE
    data = bytearray(pkg.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pkg.write_bytes(bytes(data))
    outs = _two_builds_at_once(_CHILD, tmp_path, cache)
    discarded = [out for out in outs if "does not match its recorded sha256" in out]
    reused = [out for out in outs if "1 of 1 packages reused" in out]
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
    specs = [replace(_specs()[0], plan=BucketPlan({"batch": (1,), "frames": (8, 16)}), dynamic_packages="off")]
    rep = Notes()
    res = build_family(QWEN.name, specs, tmp_path, "cpu", cache_dir=cache, reporter=rep, jobs=2)
    assert "code2wav: 1 of 2 packages reused from the package cache" in rep.notes, rep.notes
    assert (res.path / "code2wav/b1_f8.pt2").read_bytes() == (first / "code2wav/b1_f8.pt2").read_bytes()
    assert len(_entries(cache)) == 2
    rep = Notes()
    build_family(QWEN.name, specs, tmp_path / "again", "cpu", cache_dir=cache, reporter=rep, jobs=2)
    assert "code2wav: 2 of 2 packages reused from the package cache" in rep.notes, rep.notes


def test_dynamic_package_is_reused_on_a_no_change_rebuild_and_recompiled_for_a_new_bucket(
    dynamic_filled_cache, monkeypatch, tmp_path
):
    """A dynamic package (one for the stage's buckets) keys on every bucket it serves: a rebuild with no change
    exports and compiles nothing; a bucket added to the plan widens the range, so the package is compiled again.
    The first build (a fresh cache: 0 of 1 packages reused, the package compiled) is `dynamic_filled_cache`'s."""
    cache = cache_copy(dynamic_filled_cache[0], tmp_path / "cache")
    first = dynamic_filled_cache[1]
    specs = dynamic_specs()
    assert specs[0].plan.axes == {"batch": (1,), "frames": (8, 16)} and specs[0].dynamic_packages == "on"
    calls, exports = _no_compile(monkeypatch), _count_exports(monkeypatch)
    rep = Notes()
    res = build_family(QWEN.name, specs, tmp_path / "again", "cpu", cache_dir=cache, reporter=rep)  # verified
    assert calls == [] and exports == [] and "code2wav: 1 of 1 packages reused from the package cache" in rep.notes
    rel = "code2wav/dynamic.pt2"
    assert (res.path / rel).read_bytes() == (first / rel).read_bytes()
    assert _manifest(first) == _manifest(res.path)
    wider = [replace(specs[0], plan=BucketPlan({"batch": (1,), "frames": (8, 16, 24)}))]
    with pytest.raises(BuildError, match="code2wav/dynamic: compile was called"):
        build_family(QWEN.name, wider, tmp_path / "wider", "cpu", cache_dir=cache)
    assert calls == ["code2wav_dynamic"]


def test_tensor_digests_on_threads_are_the_serial_ones_and_keep_their_format():
    """The golden-case key hashes every weight on threads; the digest stays sha256(repr(dtype, shape) + bytes), so
    cache entries written before stay valid."""
    import hashlib

    from ttsaot.builder.package_cache import tensor_digest, tensor_digests

    ts = {"w": torch.randn(3, 4), "s": torch.tensor(3.0), "t": torch.randn(5, 7).bfloat16().t(), "e": torch.empty(0, 3)}
    assert tensor_digests(ts) == {k: tensor_digest(t) for k, t in ts.items()}
    w = ts["w"]
    want = hashlib.sha256(str((w.dtype, tuple(w.shape))).encode() + w.numpy().tobytes()).hexdigest()
    assert tensor_digest(w) == want


def test_the_same_graph_over_another_range_is_another_package():
    """program_fingerprint covers the symbolic sizes' ranges: a program exported for batch 1..4 must not reuse the
    package compiled for 1..8 (AOTInductor specialises code to the range)."""

    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    def exported(hi: int):
        dim = torch.export.Dim("batch", min=1, max=hi)
        return torch.export.export(Double(), (torch.randn(4, 3),), dynamic_shapes=({0: dim},))

    assert package_cache.program_fingerprint(exported(8)) == package_cache.program_fingerprint(exported(8))
    assert package_cache.program_fingerprint(exported(4)) != package_cache.program_fingerprint(exported(8))


def test_an_artifact_that_fails_its_load_check_takes_its_packages_out_of_the_cache(cached, monkeypatch, tmp_path):
    """The load check names a bucket, not a cache entry: every entry the failed build stored or reused is dropped,
    so the next build compiles it again instead of reusing a package that cannot pass."""
    cache, _ = cached
    assert len(_entries(cache)) == 1
    calls = _no_compile(monkeypatch)

    def failing_check(*a, **k):
        raise BuildError("verifying the fresh artifact failed: code2wav/b1_f8: package outputs differ")

    monkeypatch.setattr(build_mod, "subprocess_verify", failing_check)
    rep = Notes()
    with pytest.raises(BuildError, match="package outputs differ"):
        build_family(QWEN.name, _specs(), tmp_path / "out", "cpu", cache_dir=cache, reporter=rep)
    assert calls == []  # the package was reused, then failed the check
    assert _entries(cache) == [] and not (tmp_path / "out" / QWEN.name).exists()
    assert any("failed its load check" in n for n in rep.notes), rep.notes
    with pytest.raises(BuildError, match="compile was called"):  # the next build no longer finds it
        build_family(QWEN.name, _specs(), tmp_path / "again", "cpu", cache_dir=cache, verify_in_subprocess=False)


# ------------------------------------------------------------------------------- compile claims (PackageCache.claim)
_HOLD = """
import sys
from filelock import FileLock
lock = FileLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
sys.stdin.read()
"""


def _another_build_claims(root: Path, key: str) -> subprocess.Popen:
    """A process holding `key`'s compile claim (another build compiling it) until its stdin closes."""
    from ttsaot.builder.cache_layout import COMPILING, lock_name, lock_path

    root.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(lock_path(root, lock_name(COMPILING, key)))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "held"
    return child


def _awaiting_stage(cache: PackageCache, tmp_path: Path, key: str):
    """What `_take_over_awaited` reads of a `_StageCompile`: one package waiting for another build's compile."""
    from types import SimpleNamespace

    job = build_mod._Job(["b1_f8"], [{"batch": 1, "frames": 8}], "code2wav/b1_f8.pt2", (), "m", {}, cache_id=key)
    job.sources = {"w": torch.arange(4.0)}
    st = SimpleNamespace(cache=cache, tmp=tmp_path / "out", awaiting=[job], reused=0, done=[])
    st.indexed = lambda j: None
    st.finished = lambda j, weights: st.done.append((j.rel, weights))
    return st, job


def test_a_package_another_build_is_compiling_is_waited_for_then_reused(tmp_path):
    cache, key = PackageCache(tmp_path / "cache"), "ab" * 32
    st, job = _awaiting_stage(cache, tmp_path, key)
    other = _another_build_claims(cache.root, key)
    try:
        assert not cache.claim(key)
        assert not build_mod._take_over_awaited([st], None)  # still compiling there: nothing moves
        assert st.awaiting == [job] and not st.done
        package = tmp_path / "compiled.pt2"  # what the other build stores once its worker is done
        package.write_bytes(b"the other build's package")
        with cache.lock(key):
            assert cache.store(key, package, dict(job.sources), job.sources)
    finally:
        other.stdin.close()
        other.wait(timeout=30)
    assert build_mod._take_over_awaited([st], None)
    assert st.awaiting == [] and st.reused == 1 and [rel for rel, _ in st.done] == [job.rel]
    assert (st.tmp / job.rel).read_bytes() == b"the other build's package"
    assert not cache.claims  # released once reused


def test_a_package_whose_claimant_stopped_without_storing_it_is_compiled_here(monkeypatch, tmp_path):
    cache, key = PackageCache(tmp_path / "cache"), "cd" * 32
    st, job = _awaiting_stage(cache, tmp_path, key)
    handed = []
    monkeypatch.setattr(build_mod, "_hand_over", lambda st, pool, job: handed.append(job))
    other = _another_build_claims(cache.root, key)
    other.kill()  # died mid-compile: its claim goes with its process, nothing was stored
    other.wait(timeout=30)
    assert build_mod._take_over_awaited([st], None)
    assert handed == [job] and st.awaiting == [] and st.reused == 0
    assert set(cache.claims) == {key}  # held while this build compiles it (released after its store)


def test_a_build_compiling_in_process_waits_for_a_claim_then_reuses(tmp_path):
    """`cached_compile` (a build compiling in its own process) waits for another build's claim rather than
    compile the same package beside it."""
    import threading

    from ttsaot.builder.package_cache import cached_compile

    cache, key = PackageCache(tmp_path / "cache"), "ef" * 32
    sources = {"w": torch.arange(3.0)}
    other = _another_build_claims(cache.root, key)
    result, compiled = [], []
    t = threading.Thread(
        target=lambda: result.append(
            cached_compile(cache, key, sources, tmp_path / "out.pt2", lambda: compiled.append(1))
        )
    )
    t.start()
    t.join(1.0)
    assert t.is_alive() and not result  # waiting for the claim
    package = tmp_path / "compiled.pt2"
    package.write_bytes(b"stored by the claimant")
    with cache.lock(key):
        assert cache.store(key, package, dict(sources), sources)
    other.stdin.close()
    other.wait(timeout=30)
    t.join(30)
    assert not compiled and result and result[0][1] is True  # reused, not compiled
    assert (tmp_path / "out.pt2").read_bytes() == b"stored by the claimant"


@pytest.mark.heavy
def test_two_builds_started_together_compile_each_package_once(tmp_path):
    """Two builds with workers (--jobs 2) on one empty cache, started together: each of the two packages is
    compiled by one build and reused by the other (before claims, both compiled both)."""
    child = _CHILD.replace(
        'build_family("qwen3-tts-12hz", _specs(), {out!r}, "cpu", cache_dir={cache!r}, reporter=Print())',
        "from dataclasses import replace\n"
        "from ttsaot.builder.buckets import BucketPlan\n"
        'plan = BucketPlan({{"batch": (1,), "frames": (8, 16)}})\n'
        'specs = [replace(_specs()[0], plan=plan, dynamic_packages="off")]\n'
        'build_family("qwen3-tts-12hz", specs, {out!r}, "cpu", cache_dir={cache!r}, reporter=Print(), jobs=2)',
    )
    cache = tmp_path / "cache"
    outs = _two_builds_at_once(child, tmp_path, cache)
    reused = []
    for out in outs:
        (line,) = [ln for ln in out.splitlines() if "packages reused from the package cache" in ln]
        reused.append(int(line.split("code2wav: ")[1].split(" of ")[0]))
    assert sum(reused) == 2, outs  # 4 packages built, 2 compiles
    assert len(_entries(cache)) == 2
    for rel in ("code2wav/b1_f8.pt2", "code2wav/b1_f16.pt2"):
        a, b = (tmp_path / f"o{i}/qwen3-tts-12hz" / rel for i in (0, 1))
        assert a.read_bytes() == b.read_bytes()


def test_every_build_switch_of_the_kernel_layer_is_in_the_package_key():
    """A `TTSAOT_*` variable the kernel layer reads at build time changes the packages it compiles, so it must be
    part of every package key (package_cache.KERNEL_SWITCHES), or a build with it set would reuse a package
    compiled without it."""
    import re

    kernels = Path(package_cache.__file__).parent / "kernels"
    read = {name for f in kernels.glob("*.py") for name in re.findall(r"\"(TTSAOT_[A-Z0-9_]+)\"", f.read_text())}
    assert "TTSAOT_PDL_MAX_ROWS" in read
    assert not read - set(package_cache.KERNEL_SWITCHES), read - set(package_cache.KERNEL_SWITCHES)
