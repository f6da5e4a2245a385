"""ONNX export (`build --format onnx|aoti,onnx`): custom-op lowering, every registered stage at the tiny preset
(onnx.checker full check + onnxruntime against eager), dynamic frame axis against the AOTI buckets, manifest
integrity, CLI."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from ttsaot.builder import onnx_export as ox  # noqa: E402
from ttsaot.builder.buckets import BucketPlan  # noqa: E402
from ttsaot.builder.build import build_family  # noqa: E402
from ttsaot.builder.cli import main  # noqa: E402
from ttsaot.builder.layers.snake import BakedSnakeBeta  # noqa: E402
from ttsaot.builder.onnx_verify import verify_onnx  # noqa: E402
from ttsaot.builder.passes import cast_to_compute_dtype  # noqa: E402
from ttsaot.builder.stage_spec import StageSpec  # noqa: E402
from ttsaot.runtime.artifact import parse_manifest, read_manifest  # noqa: E402
from ttsaot.runtime.errors import IntegrityError, ManifestError  # noqa: E402

from . import package_cache_fixtures as pcf  # noqa: E402
from .conftest import built_artifact, rel_err  # noqa: E402

CPU = ["CPUExecutionProvider"]


def _session(path: Path):
    return ort.InferenceSession(str(path), providers=CPU)


def _domains(model) -> set[str]:
    return {n.domain for n in model.graph.node} | {o.domain for o in model.opset_import}


# ------------------------------------------------------------------------------------ a small generic stage
class _ConvSnake(torch.nn.Module):
    """conv → baked SnakeBeta → conv: the custom op between standard ops, frames dynamic."""

    def __init__(self, c: int = 6) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.c1 = torch.nn.Conv1d(2, c, 3, padding=1)
        self.act = BakedSnakeBeta(torch.rand(c, generator=g) + 0.5, torch.rand(c, generator=g) + 0.2)
        self.c2 = torch.nn.Conv1d(c, 1, 1)

    def forward(self, x):
        return self.c2(self.act(self.c1(x.to(self.c1.weight.dtype)))).float()


def _small_spec(module_fn, dtype=torch.float32, frames=(8, 16)) -> StageSpec:
    def make_inputs(sizes, g):
        return {"x": torch.randn(sizes["batch"], 2, sizes["frames"], generator=g)}

    return StageSpec(
        family="test",
        name="convsnake",
        kind="generic",
        make_module=module_fn,
        passes=[],
        plan=BucketPlan({"batch": (1, 2), "frames": frames}),
        make_inputs=make_inputs,
        inputs=[{"name": "x", "dtype": "float32", "shape": ["batch", 2, "frames"], "pad": 0.0}],
        outputs=[{"name": "y", "dtype": "float32", "shape": ["batch", 1, "frames"]}],
        dtype=dtype,
        tolerance=1e-5,
    )


def test_snake_beta_lowers_to_standard_ops_fp32(tmp_path):
    m = _ConvSnake().eval()
    res = ox.export_stage_onnx(_small_spec(lambda: m), m, tmp_path / "s.onnx")
    model = onnx.load(str(res.path))
    assert _domains(model) <= {"", "ai.onnx"}
    assert "Sin" in res.ops and res.custom_ops == {"ttsaot.snake_beta.default": "translation"}
    assert res.opset == 20 and res.dynamic_axes == {"batch": {"min": 1, "max": 2}, "frames": {"min": 1, "max": 16}}
    assert [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim] == ["batch", "", "frames"]
    s = _session(res.path)
    for b, f in ((1, 5), (2, 16), (2, 13)):
        x = torch.randn(b, 2, f, generator=torch.Generator().manual_seed(f))
        with torch.no_grad():
            ref = m(x)
        out = torch.from_numpy(s.run(None, {"x": x.numpy()})[0])
        assert out.shape == ref.shape and rel_err(out, ref) < 1e-6, (b, f, rel_err(out, ref))


def test_snake_beta_bf16_graph_casts_around_sin(tmp_path):
    m = _ConvSnake().eval()
    low = cast_to_compute_dtype(copy.deepcopy(m), torch.bfloat16)
    res = ox.export_stage_onnx(_small_spec(lambda: m, dtype=torch.bfloat16), low, tmp_path / "s.onnx")
    assert res.opset == 22
    model = onnx.load(str(res.path))
    onnx.checker.check_model(model, full_check=True)
    sin = next(n for n in model.graph.node if n.op_type == "Sin")
    producers = {o: n for n in model.graph.node for o in n.output}
    # Sin's input comes from Mul(Cast(x → fp32), alpha): the snake math runs in fp32 in a bf16 graph.
    mul = producers[sin.input[0]]
    assert any(producers.get(i) is not None and producers[i].op_type == "Cast" for i in mul.input)
    assert "Cast" in res.ops


def test_unknown_custom_op_is_refused_then_lowered_through_the_registry(tmp_path):
    lib = torch.library.Library("ttsaot_onnxtest", "FRAGMENT")  # noqa: F841 - keeps the namespace alive
    torch.library.define("ttsaot_onnxtest::twice_plus", "(Tensor x) -> Tensor", lib=lib)
    torch.library.impl("ttsaot_onnxtest::twice_plus", "CompositeExplicitAutograd", lambda x: 2 * x + 1, lib=lib)
    torch.library.register_fake("ttsaot_onnxtest::twice_plus", lambda x: torch.empty_like(x), lib=lib)
    op = torch.ops.ttsaot_onnxtest.twice_plus.default

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.ttsaot_onnxtest.twice_plus(x).sin()

    spec = _small_spec(M)
    spec.inputs[0]["shape"] = ["batch", 2, "frames"]
    spec.outputs[0]["shape"] = ["batch", 2, "frames"]
    with pytest.raises(ox.OnnxExportError, match="twice_plus.*no ONNX lowering"):
        ox.export_stage_onnx(spec, M(), tmp_path / "a.onnx")
    x = torch.randn(2, 2, 9)
    try:
        ox.register_onnx_decomposition(op, lambda x: 2 * x + 1)
        res = ox.export_stage_onnx(spec, M(), tmp_path / "b.onnx")
        assert res.custom_ops == {"ttsaot_onnxtest.twice_plus.default": "decomposition"}
        got = _session(res.path).run(None, {"x": x.numpy()})[0]
        np.testing.assert_allclose(got, (2 * x + 1).sin().numpy(), rtol=1e-6, atol=1e-6)

        def twice_plus_onnx(x):
            from onnxscript import opset18 as o

            return o.Add(o.Mul(x, o.Constant(value_float=2.0)), o.Constant(value_float=1.0))

        ox.register_onnx_translation(op)(twice_plus_onnx)
        res = ox.export_stage_onnx(spec, M(), tmp_path / "c.onnx")
        assert res.custom_ops == {"ttsaot_onnxtest.twice_plus.default": "translation"}
        got = _session(res.path).run(None, {"x": x.numpy()})[0]
        np.testing.assert_allclose(got, (2 * x + 1).sin().numpy(), rtol=1e-6, atol=1e-6)
    finally:
        ox.ONNX_TRANSLATIONS.pop(op, None)
        ox.ONNX_DECOMPOSITIONS.pop(op, None)


class _CacheStep(torch.nn.Module):
    """A decode step writing its cache input in place, as the LM stages do (AOTI keeps that in place)."""

    def forward(self, x, pos, cache):
        rows = torch.arange(x.shape[0])[:, None]
        cache.index_put_((rows, pos[:, None]), x[:, None] * 2.0)
        return cache.sum(-1)


def test_inputs_written_in_place_become_outputs(tmp_path):
    def make_inputs(sizes, g):
        b = sizes["batch"]
        return {
            "x": torch.randn(b, generator=g),
            "pos": torch.randint(0, 6, (b,), generator=g),
            "cache": torch.randn(b, 6, generator=g),
        }

    spec = StageSpec(
        family="test",
        name="step",
        kind="generic",
        make_module=_CacheStep,
        passes=[],
        plan=BucketPlan({"batch": (1, 4)}),
        make_inputs=make_inputs,
        inputs=[
            {"name": "x", "dtype": "float32", "shape": ["batch"]},
            {"name": "pos", "dtype": "int64", "shape": ["batch"]},
            {"name": "cache", "dtype": "float32", "shape": ["batch", 6]},
        ],
        outputs=[{"name": "total", "dtype": "float32", "shape": ["batch"]}],
        dtype=torch.float32,
        tolerance=1e-6,
    )
    res = ox.export_stage_onnx(spec, _CacheStep(), tmp_path / "step.onnx")
    assert res.updated_inputs == {"cache_out": "cache"}
    ins = make_inputs({"batch": 3}, torch.Generator().manual_seed(1))
    total, cache_out = _session(res.path).run(None, {k: v.numpy() for k, v in ins.items()})
    cache = ins["cache"].clone()
    ref = _CacheStep()(ins["x"], ins["pos"], cache)
    np.testing.assert_allclose(total, ref.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(cache_out, cache.numpy())  # the eager in-place write, as an output


def test_external_data_is_listed_and_integrity_checked(tmp_path):
    m = _ConvSnake(c=256).eval()  # conv weights of 6 KiB: above the inline limit of 1 KiB per tensor
    spec = _small_spec(lambda: m)
    inline = ox.export_stage_onnx(spec, m, tmp_path / "inline" / "s.onnx")
    res = ox.export_stage_onnx(spec, m, tmp_path / "ext" / "s.onnx", external_threshold=0)
    assert inline.external_data == [] and [p.name for p in res.external_data] == ["s.onnx.data"]
    onnx.checker.check_model(str(res.path), full_check=True)
    x = torch.randn(1, 2, 11).numpy()
    np.testing.assert_array_equal(
        _session(res.path).run(None, {"x": x})[0], _session(inline.path).run(None, {"x": x})[0]
    )
    entry = ox.manifest_entry(res, tmp_path / "ext")
    assert entry["external_data"][0]["file"] == "s.onnx.data" and entry["external_data"][0]["bytes"] > 0
    # The runtime schema parses it and lists the data file among the stage's files (load() hashes them).
    stage = _manifest_with_onnx(entry)["stages"]["convsnake"]
    files = {f.file for f in stage.files()}
    assert {"s.onnx", "s.onnx.data"} <= files


def _manifest_with_onnx(onnx_entry: dict):
    fe = {"file": "g.safetensors", "sha256": "0" * 64, "bytes": 1}
    return {
        "stages": parse_manifest(
            {
                "format_version": 1,
                "family": "t",
                "device": "cpu",
                "build_env": {},
                "stages": {
                    "convsnake": {
                        "kind": "generic",
                        "dtype": "float32",
                        "inputs": [],
                        "outputs": [],
                        "weights": None,
                        "constants": {},
                        "buckets": [],
                        "golden": fe,
                        "tolerance": 1e-5,
                        "onnx": onnx_entry,
                    }
                },
            }
        ).stages
    }


def test_schema_requires_buckets_or_onnx():
    base = {
        "format_version": 1,
        "family": "t",
        "device": "cpu",
        "build_env": {},
        "stages": {
            "s": {
                "kind": "generic",
                "dtype": "float32",
                "inputs": [],
                "outputs": [],
                "weights": None,
                "constants": {},
                "buckets": [],
                "tolerance": 1e-5,
            }
        },
    }
    with pytest.raises(ManifestError, match="buckets is empty"):
        parse_manifest(base)
    base["stages"]["s"]["buckets"] = [
        {"key": "b1", "sizes": {"batch": 1}, "file": "s/b1.pt2", "sha256": "0", "bytes": 1}
    ]
    with pytest.raises(ManifestError, match="weights is missing"):
        parse_manifest(base)
    base["stages"]["s"]["onnx"] = {"file": "../x.onnx", "sha256": "0", "bytes": 1, "opset": 20}
    with pytest.raises(ManifestError, match="outside the artifact"):
        parse_manifest(base)


# ------------------------------------------------------------------------- every registered stage, tiny
def _registered_stages():
    """(family, stage) for every stage of every registered family; families whose modules are missing from this
    checkout become one skipped case with the reason."""
    from ttsaot.builder.families import FAMILIES, get_family

    out = []
    for fam_name in FAMILIES:
        try:
            names = get_family(fam_name).stages
        except Exception as e:  # noqa: BLE001 - a family not in this checkout (yet)
            out.append(
                pytest.param(
                    fam_name,
                    None,
                    marks=pytest.mark.skip(
                        reason=f"{fam_name}: stages unavailable in this checkout ({type(e).__name__}: {e})"
                    ),
                )
            )
            continue
        out += [pytest.param(fam_name, s, id=f"{fam_name}:{s}") for s in names]
    return out


def _tiny_spec(fam_name: str, stage: str, dtype: torch.dtype | None):
    from ttsaot.builder.families import get_family

    fam = get_family(fam_name)
    # small plans: each family gets the small-plan options it has (options are strict: no unknown names). VoxCPM2's
    # locdit unrolls its whole Euler solve: 4 steps (3 estimator calls, as tests/test_voxcpm2_audio.py builds it)
    # export the same ops as the default 10 (9 calls) at a third of the graph (~25 s less CPU export per run)
    small = {"batch_buckets": (1, 2), "frame_buckets": (8, 16), "encoder_seconds": (0.5, 1.0), "n_timesteps": 4}
    known = {f.name for f in dataclasses.fields(fam.Options)}
    opts = fam.options(preset="tiny", seed=0, dtype=dtype, **{k: v for k, v in small.items() if k in known})
    return fam.specs(opts, [stage])[0]


@pytest.mark.parametrize("fam_name,stage", _registered_stages())
def test_every_stage_exports_checks_and_matches_eager(fam_name, stage, tmp_path, request):
    """fp32 compute at the tiny preset: onnx.checker (full check), default-domain ops only, and onnxruntime CPU
    on every golden case (bucket sizes, off-bucket sizes) within the stage tolerance of the fp32 eager reference;
    integer outputs (sampled codes on explicit noise) must be identical."""
    spec = _tiny_spec(fam_name, stage, torch.float32)
    if (fam_name, stage) == ("qwen3-tts-12hz", "code2wav"):
        # `onnx_only_cli` is this very build (the same options, through the CLI): one export serves both tests
        artifact = request.getfixturevalue("onnx_only_cli")
        entry = read_manifest(artifact).stages[stage]
        axes = entry.onnx.dynamic_axes
        assert {a: axes[a]["max"] for a in axes} == {a: max(v) for a, v in spec.plan.axes.items()}
        assert entry.dtype == "float32" and entry.tolerance == spec.tolerance
    else:
        res = build_family(fam_name, [spec], tmp_path, formats="onnx", verify_in_subprocess=False)
        artifact, entry = res.path, res.manifest.stages[stage]
    assert entry.buckets == [] and entry.weights is None
    path = artifact / entry.onnx.file
    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path), load_external_data=False)
    assert _domains(model) <= {"", "ai.onnx"}
    assert [i.name for i in model.graph.input] == spec.input_names
    updated = entry.onnx.updated_inputs  # KV caches written in place → returned as `<input>_out`
    assert [o.name for o in model.graph.output] == [o["name"] for o in spec.outputs] + list(updated)
    if updated:
        _check_updated_inputs(spec, path, updated)
    results = verify_onnx(artifact, providers=CPU)
    assert results and not [r for r in results if r.skipped]
    bad = [r for r in results if not r.ok]
    assert not bad, bad
    for r in results:
        if r.metric == "mismatches":  # codes: exactly the eager codes for the same noise
            assert r.value == 0


@pytest.mark.parametrize("fam_name,stage", _registered_stages())
def test_every_stage_default_dtype_passes_the_checker(fam_name, stage, tmp_path):
    """The stage's default compute dtype (bf16 for most): the written model passes onnx.checker's full check at
    the recorded opset and uses default-domain ops only. (onnxruntime's CPU provider lacks bf16 kernels.)"""
    if stage != "code2wav" and not os.environ.get("TTSAOT_ONNX_ALL_DTYPES"):
        pytest.skip(
            "one more export per stage: set TTSAOT_ONNX_ALL_DTYPES=1 (code2wav, the bf16 SnakeBeta path, always runs)"
        )
    spec = _tiny_spec(fam_name, stage, None)
    if spec.dtype == torch.float32:
        pytest.skip(f"{stage}: default dtype is fp32, covered by the fp32 test")
    module = cast_to_compute_dtype(_rewritten(spec), spec.dtype).eval()
    res = ox.export_stage_onnx(spec, module, tmp_path / f"{stage}.onnx")  # runs the full check itself
    assert res.opset == ox.LOW_PRECISION_OPSET
    onnx.checker.check_model(str(res.path), full_check=True)
    assert _domains(onnx.load(str(res.path), load_external_data=False)) <= {"", "ai.onnx"}


def _check_updated_inputs(spec: StageSpec, path: Path, updated: dict[str, str]) -> None:
    """The `<input>_out` outputs equal what the eager module writes into those inputs in place."""
    module = _rewritten(spec)
    ins = spec.make_inputs({a: min(s) for a, s in spec.plan.axes.items()}, torch.Generator().manual_seed(5))
    feeds = {k: v.numpy() for k, v in ins.items()}
    eager_ins = {k: v.clone() for k, v in ins.items()}
    with torch.no_grad():
        module(*[eager_ins[n] for n in spec.input_names])
    outs = _session(path).run(list(updated), feeds)
    for (out_name, in_name), got in zip(updated.items(), outs):
        ref = eager_ins[in_name]
        assert not torch.equal(ref, ins[in_name]), f"{in_name} was not written by eager"
        assert rel_err(torch.from_numpy(got), ref) <= spec.tolerance, out_name


def _rewritten(spec: StageSpec) -> torch.nn.Module:
    m = spec.make_module().eval()
    for p in spec.passes:
        p(m)
    return m


# --------------------------------------------------------------- code2wav: dynamic frames vs AOTI buckets
dynamic_filled_cache = pcf.dynamic_filled_cache


@pytest.fixture(scope="session")
def code2wav_aoti_onnx(dynamic_filled_cache) -> Path:
    """Tiny code2wav fp32 with both formats: AOTI buckets batch {1} × frames {8, 16}, one ONNX model with a
    dynamic frame axis (batch has one size: static). Its AOTI package is the one dynamic package of
    tests/package_cache_fixtures.py `dynamic_specs` (the same program), reused from a copy of that fixture's cache
    instead of compiled again; the ONNX model is exported here."""
    from ttsaot.builder.families.qwen3_tts_12hz import FAMILY as QWEN

    def build(root: Path) -> Path:
        opts = QWEN.options(dtype=torch.float32, batch_buckets=(1,), frame_buckets=(8, 16))
        specs = QWEN.specs(opts, ["code2wav"])
        with tempfile.TemporaryDirectory() as tmp:
            cache = pcf.cache_copy(dynamic_filled_cache[0], Path(tmp) / "cache")
            return build_family(QWEN.name, specs, root, "cpu", formats="aoti,onnx", cache_dir=cache).path

    return built_artifact("qwen-code2wav-aoti-onnx", build)


def test_dynamic_frames_match_the_aoti_buckets(code2wav_aoti_onnx):
    from ttsaot.runtime import load

    m = json.loads((code2wav_aoti_onnx / "manifest.json").read_text())
    st = m["stages"]["code2wav"]
    assert [b["key"] for b in st["buckets"]] == ["b1_f8", "b1_f16"]
    assert st["onnx"]["dynamic_axes"] == {"frames": {"min": 1, "max": 16}} and st["onnx"]["static_axes"] == {"batch": 1}
    stage = load(code2wav_aoti_onnx, stages=["code2wav"])["code2wav"]
    sess = _session(code2wav_aoti_onnx / st["onnx"]["file"])
    g = torch.Generator().manual_seed(7)
    spf = st["metadata"]["samples_per_frame"]
    outs = {}
    for frames in (8, 16, 11):  # two bucket lengths, and one the AOTI stage pads into the 16 bucket
        codes = torch.randint(0, 64, (1, 16, frames), generator=g)
        aoti = stage(codes)
        onx = torch.from_numpy(sess.run(None, {"codes": codes.numpy()})[0])
        assert onx.shape == aoti.shape == (1, 1, frames * spf)
        outs[frames] = rel_err(onx, aoti)
        assert outs[frames] < st["tolerance"], outs


def test_cli_verify_checks_both_formats(code2wav_aoti_onnx):
    r = CliRunner().invoke(main, ["verify", str(code2wav_aoti_onnx)])
    assert r.exit_code == 0, r.output
    assert "aoti" in r.output and "onnx CPU" in r.output
    r = CliRunner().invoke(main, ["verify", str(code2wav_aoti_onnx), "--no-onnx"])
    assert r.exit_code == 0 and "onnx CPU" not in r.output


def test_inspect_shows_onnx(code2wav_aoti_onnx):
    r = CliRunner().invoke(main, ["inspect", str(code2wav_aoti_onnx), "--json"])
    assert r.exit_code == 0, r.output
    o = json.loads(r.output)["stages"][0]["onnx"]
    assert o["file"] == "onnx/code2wav.onnx" and o["opset"] == 20 and o["bytes"] > 0
    r = CliRunner().invoke(main, ["inspect", str(code2wav_aoti_onnx)])
    assert r.exit_code == 0 and "opset" in r.output and "onnx/code2wav" in r.output


def test_tampered_onnx_is_refused(code2wav_aoti_onnx, artifact_copy):
    from ttsaot.runtime import load

    art = artifact_copy(code2wav_aoti_onnx)
    p = art / "onnx" / "code2wav.onnx"
    data = bytearray(p.read_bytes())
    data[-10] ^= 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="code2wav.onnx"):
        load(art)
    r = CliRunner().invoke(main, ["verify", str(art), "--no-graphs"])
    assert r.exit_code == 1 and "code2wav.onnx" in r.output


# ------------------------------------------------------------------------------------- onnx-only builds
def _onnx_only_cli_build(out: Path) -> Path:
    r = CliRunner().invoke(
        main,
        [
            "build",
            "qwen3-tts-12hz",
            "--preset",
            "tiny",
            "--random-weights",
            "--dtype",
            "fp32",
            "--stages",
            "code2wav",
            "--batch-buckets",
            "1,2",
            "--frame-buckets",
            "8,16",
            "--format",
            "onnx",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    return out / "qwen3-tts-12hz"


@pytest.fixture(scope="session")
def onnx_only_cli() -> Path:
    """`build --format onnx` of the tiny fp32 code2wav, batch {1, 2} × frames {8, 16}: the options `_tiny_spec`
    gives code2wav, so the every-stage test checks this export too. Built once per run; read-only."""
    return built_artifact("qwen-code2wav-onnx-cli", _onnx_only_cli_build)


def test_onnx_only_build_via_cli(onnx_only_cli):
    from ttsaot.runtime import load

    art = onnx_only_cli
    st = json.loads((art / "manifest.json").read_text())["stages"]["code2wav"]
    assert st["buckets"] == [] and st["weights"] is None and not list((art).glob("code2wav/*.pt2"))
    assert st["onnx"]["dynamic_axes"] == {"batch": {"min": 1, "max": 2}, "frames": {"min": 1, "max": 16}}
    with pytest.raises(ManifestError, match="only an ONNX model"):
        load(art)
    r = CliRunner().invoke(main, ["verify", str(art)])
    assert r.exit_code == 0, r.output
    assert r.output.count("onnx CPU") >= 4  # golden cases b1_f8, b1_f16, b2_f8, b1_f5


def test_unknown_format_is_a_usage_error(tmp_path):
    r = CliRunner().invoke(
        main, ["build", "qwen3-tts-12hz", "--random-weights", "--format", "tflite", "--out", str(tmp_path)]
    )
    assert r.exit_code == 2 and "tflite" in r.output
