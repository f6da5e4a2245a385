"""Dynamic-shape packages (`build --dynamic-packages`, on by default for CPU builds): one package serves several
buckets. The session's tiny code2wav (`qwen_tiny_fp32`: batch {1,2} x frames {8,16,48}, built on CPU with the
default `auto`) has one package for its six buckets; tests/test_artifact_qwen.py runs every bucket of it against
eager. Here: the layout and the manifest, the package loaded once, a bucket the package was not compiled for is
refused, `off` keeps the per-bucket layout, and an axis torch.export cannot keep symbolic falls back to grouping."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from ttsaot.builder import build as build_mod
from ttsaot.builder.buckets import BucketPlan
from ttsaot.builder.build import Reporter, build_family
from ttsaot.builder.dynamic_shapes import export_dynamic, plan_ranges, with_steps
from ttsaot.builder.export import CompiledBucket, export_program
from ttsaot.builder.families import get_family
from ttsaot.builder.families.qwen3_tts_12hz import FAMILY as QWEN
from ttsaot.builder.options import OptionsError
from ttsaot.builder.stage_spec import StageSpec, resolve_dynamic_packages
from ttsaot.runtime import BindingError, IntegrityError, ManifestError, load
from ttsaot.runtime import artifact as artifact_mod
from ttsaot.runtime.artifact import parse_manifest, read_manifest
from ttsaot.runtime.verify import verify_bundle

from .test_build_atomic import _specs


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _package_metadata(path: Path) -> dict:
    from torch._C._aoti import AOTIModelPackageLoader

    return dict(AOTIModelPackageLoader.load_metadata_from_package(str(path), "model"))


def test_auto_is_on_for_cpu_and_the_stages_choice_on_cuda():
    assert resolve_dynamic_packages("auto", torch.device("cpu")) == "on"
    assert resolve_dynamic_packages("auto", torch.device("cuda", 0)) == "off"
    assert resolve_dynamic_packages("on", torch.device("cuda", 0)) == "on"
    assert resolve_dynamic_packages("off", torch.device("cpu")) == "off"
    assert resolve_dynamic_packages("cold", torch.device("cuda", 0)) == "cold"
    # a stage's own CUDA default (StageSpec.cuda_auto_packages) decides `auto` there, never an explicit choice
    assert resolve_dynamic_packages("auto", torch.device("cuda", 0), "on") == "on"
    assert resolve_dynamic_packages("off", torch.device("cuda", 0), "on") == "off"
    assert resolve_dynamic_packages("auto", torch.device("cpu"), "off") == "on"
    with pytest.raises(ValueError, match="dynamic_packages must be one of"):
        resolve_dynamic_packages("auto", torch.device("cuda", 0), "auto")
    # the VoxCPM2 LM prefills (once per request) are one dynamic package on CUDA too; the steps stay static
    from ttsaot.builder.families.voxcpm2 import FAMILY as VOX

    cuda = torch.device("cuda", 0)
    modes = {s.name: s.dynamic_mode(cuda) for s in VOX.specs(VOX.options(device="cuda"), None)}
    assert modes["base_lm_prefill"] == modes["residual_lm_prefill"] == "on"
    assert {modes[n] for n in modes if not n.endswith("_prefill")} == {"off"}
    explicit = VOX.specs(VOX.options(device="cuda", dynamic_packages="off"), ["base_lm_prefill"])[0]
    assert explicit.dynamic_mode(cuda) == "off"
    with pytest.raises(OptionsError, match="dynamic_packages must be one of auto, on, off, cold"):
        QWEN.options(dynamic_packages="maybe")
    assert QWEN.specs(QWEN.options(dynamic_packages="off"), ["code2wav"])[0].dynamic_packages == "off"


def test_cpu_build_names_one_package_for_every_bucket(qwen_tiny_fp32):
    st = _manifest(qwen_tiny_fp32)["stages"]["code2wav"]
    files = {b["file"] for b in st["buckets"]}
    assert files == {"code2wav/dynamic.pt2"} and len(st["buckets"]) == 6
    assert sorted(p.name for p in (qwen_tiny_fp32 / "code2wav").iterdir()) == ["dynamic.pt2"]
    rec = st["packaging"]
    assert rec["mode"] == "dynamic" and rec["reason"] == ""
    assert rec["packages"]["code2wav/dynamic.pt2"] == {
        "buckets": [b["key"] for b in st["buckets"]],
        "dynamic_axes": {"batch": {"min": 1, "max": 2}, "frames": {"min": 8, "max": 48}},
    }
    # the package's own record: every bucket it serves, with the input shapes the manifest will feed it
    meta = _package_metadata(qwen_tiny_fp32 / "code2wav/dynamic.pt2")
    assert json.loads(meta["ttsaot_dynamic"]) == {"batch": [1, 2], "frames": [8, 48]}
    stamped = json.loads(meta["ttsaot_buckets"])
    assert stamped == {b["key"]: [[[b["sizes"]["batch"], 16, b["sizes"]["frames"]], "int64"]] for b in st["buckets"]}


def test_shared_package_is_loaded_and_bound_once(qwen_tiny_fp32):
    stage = load(qwen_tiny_fp32)["code2wav"]
    assert len(stage._packages) == 1 and len(stage._runners) == 6
    assert len({id(r.model) for r in stage._runners.values()}) == 1
    stats = stage.bucket_load_stats
    assert {s["package"] for s in stats.values()} == {"code2wav/dynamic.pt2"}
    loaded = [k for k, s in stats.items() if s["package_load_s"] > 0]
    assert len(loaded) == 1  # the package's load counted once, on the bucket that loaded it
    assert stage.load_stats["package_load_s"] == pytest.approx(stats[loaded[0]]["package_load_s"], abs=1e-3)
    assert all(r.ok for r in verify_bundle(load(qwen_tiny_fp32)))  # every golden case through the shared package


def test_a_shared_file_is_hashed_once(qwen_tiny_fp32, monkeypatch):
    hashed = []
    real = artifact_mod.sha256_of

    def counting(path, *a, **k):
        hashed.append(Path(path).name)
        return real(path, *a, **k)

    monkeypatch.setattr(artifact_mod, "sha256_of", counting)
    m = read_manifest(qwen_tiny_fp32)
    artifact_mod.check_files(qwen_tiny_fp32, m.stages["code2wav"].files())
    assert hashed.count("dynamic.pt2") == 1


def test_a_bucket_the_package_was_not_compiled_for_is_refused(qwen_tiny_fp32, artifact_copy):
    """The manifest adds b1_f32 on the shared file (its sha256 is right): the package serves frames 8..48, so AOTI
    would run it, but it was compiled and verified for six buckets only."""
    art = artifact_copy(qwen_tiny_fp32)
    m = _manifest(art)
    st = m["stages"]["code2wav"]
    st["buckets"].append({**st["buckets"][0], "key": "b1_f32", "sizes": {"batch": 1, "frames": 32}})
    st["packaging"]["packages"]["code2wav/dynamic.pt2"]["buckets"].append("b1_f32")
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BindingError, match=r"compiled for bucket\(s\) \['b1_f16'.*lists it as 'b1_f32'"):
        load(art)


def test_an_edited_bucket_of_a_shared_package_is_refused(qwen_tiny_fp32, artifact_copy):
    art = artifact_copy(qwen_tiny_fp32)
    m = _manifest(art)
    m["stages"]["code2wav"]["buckets"][1]["sizes"]["frames"] = 32  # b1_f16 now claims 32 frames
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BindingError, match="package inputs .* differ from the manifest's .* for bucket 'b1_f16'"):
        load(art)


def test_a_bit_flip_in_a_shared_package_is_refused(qwen_tiny_fp32, artifact_copy):
    art = artifact_copy(qwen_tiny_fp32)
    pkg = art / "code2wav/dynamic.pt2"
    data = bytearray(pkg.read_bytes())
    data[len(data) // 3] ^= 0x10
    pkg.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="dynamic.pt2: sha256"):
        load(art)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda st: st["buckets"][1].update(sha256="0" * 64), "share 'code2wav/dynamic.pt2' with different sha256"),
        (lambda st: st["buckets"][1].update(key="b1_f8"), "list key 'b1_f8' twice"),
        (
            lambda st: st["packaging"]["packages"]["code2wav/dynamic.pt2"]["buckets"].pop(),
            r"packaging.packages\['code2wav/dynamic.pt2'\] lists buckets",
        ),
        (lambda st: st["packaging"].update(mode="half"), "mode dynamic|static"),
    ],
)
def test_inconsistent_shared_entries_are_manifest_errors(qwen_tiny_fp32, edit, match):
    m = _manifest(qwen_tiny_fp32)
    edit(m["stages"]["code2wav"])
    with pytest.raises(ManifestError, match=match):
        parse_manifest(m)


# ------------------------------------------------------------------------------- layouts without compiling
def _fake_compile(calls: list):
    """compile_bucket that writes a small file and returns the program's tensors as constants: the layout and the
    manifest of a build, without AOTI (the build's subprocess check is off in these tests)."""

    def fake(module, args, device, package_path, model_name, metadata, extra_options=None, exported=None):
        calls.append((model_name, metadata))
        package_path.parent.mkdir(parents=True, exist_ok=True)
        package_path.write_bytes(json.dumps(metadata).encode())
        weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
        return CompiledBucket(package_path, weights, metadata)

    return fake


def _two_by_two(dynamic: str):
    return [replace(_specs()[0], plan=BucketPlan({"batch": (1, 2), "frames": (8, 16)}), dynamic_packages=dynamic)]


@pytest.mark.parametrize("dynamic", ["off", "on"])
def test_off_keeps_one_package_per_bucket_and_on_shares_one(dynamic, tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(build_mod, "compile_bucket", _fake_compile(calls))
    monkeypatch.setattr(build_mod, "_package_cpu_isa", lambda tmp, stages: "")
    res = build_family(QWEN.name, _two_by_two(dynamic), tmp_path, "cpu", verify_in_subprocess=False)
    st = res.manifest.stages["code2wav"]
    keys = ["b1_f8", "b1_f16", "b2_f8", "b2_f16"]
    assert [b.key for b in st.buckets] == keys
    if dynamic == "off":  # today's layout: one file per bucket, stamped with its one bucket
        assert [b.file for b in st.buckets] == [f"code2wav/{k}.pt2" for k in keys]
        assert [m["ttsaot_bucket"] for _, m in calls] == keys and all("ttsaot_buckets" not in m for _, m in calls)
        assert st.packaging == {"mode": "static", "reason": "dynamic packages off (--dynamic-packages off)"}
    else:
        assert {b.file for b in st.buckets} == {"code2wav/dynamic.pt2"} and len(calls) == 1
        assert sorted(json.loads(calls[0][1]["ttsaot_buckets"])) == sorted(keys)
        assert st.packaging["packages"]["code2wav/dynamic.pt2"]["dynamic_axes"] == {
            "batch": {"min": 1, "max": 2},
            "frames": {"min": 8, "max": 16},
        }
    assert sorted(p.name for p in (res.path / "code2wav").iterdir()) == sorted({Path(b.file).name for b in st.buckets})


def test_cold_keeps_the_hot_windows_static_and_shares_a_dynamic_package_for_the_rest(tmp_path, monkeypatch):
    """`--dynamic-packages cold`: the buckets of the windows every chunk hits (hot_sizes) keep a package of their
    own; the others (padding targets hit about once per request) share one dynamic package."""
    calls: list = []
    monkeypatch.setattr(build_mod, "compile_bucket", _fake_compile(calls))
    monkeypatch.setattr(build_mod, "_package_cpu_isa", lambda tmp, stages: "")
    plan = BucketPlan({"batch": (1, 2), "frames": (8, 12, 16)})
    spec = replace(_specs()[0], plan=plan, dynamic_packages="cold", hot_sizes={"frames": (8,)})
    res = build_family(QWEN.name, [spec], tmp_path, "cpu", verify_in_subprocess=False)
    st = res.manifest.stages["code2wav"]
    files = {b.key: b.file for b in st.buckets}
    assert files == {
        "b1_f8": "code2wav/b1_f8.pt2",
        "b1_f12": "code2wav/dynamic.pt2",
        "b1_f16": "code2wav/dynamic.pt2",
        "b2_f8": "code2wav/b2_f8.pt2",
        "b2_f12": "code2wav/dynamic.pt2",
        "b2_f16": "code2wav/dynamic.pt2",
    }
    assert len(calls) == 3
    pk = st.packaging
    assert pk["mode"] == "dynamic" and pk["reason"] == build_mod.HOT_REASON
    assert pk["packages"]["code2wav/b1_f8.pt2"] == {"buckets": ["b1_f8"]}
    assert pk["packages"]["code2wav/dynamic.pt2"]["dynamic_axes"] == {
        "batch": {"min": 1, "max": 2},
        "frames": {"min": 12, "max": 16},
    }
    # a stage with no hot sizes said (a decode step) stays static throughout
    all_hot = [replace(spec, hot_sizes=None)]
    res = build_family(QWEN.name, all_hot, tmp_path / "all_hot", "cpu", verify_in_subprocess=False)
    assert [b.file for b in res.manifest.stages["code2wav"].buckets] == [
        f"code2wav/{k}.pt2" for k in ("b1_f8", "b1_f12", "b1_f16", "b2_f8", "b2_f12", "b2_f16")
    ]


def test_the_hot_windows_of_each_family_default_plan():
    """Which frame buckets `cold` keeps static: a stream's first chunk and steady window (and Qwen's long one-shot
    window); the Fish DAC encoder has none (reference audio of any length)."""
    from ttsaot.builder.families.fish_s2_pro import FAMILY as FISH
    from ttsaot.builder.families.voxcpm2 import FAMILY as VOX

    want = {
        (FISH, "dac_decoder"): (18, {"frames": (4, 50)}, 6),
        (FISH, "dac_encoder"): (4, {"samples": ()}, 0),
        (QWEN, "code2wav"): (16, {"frames": (25, 50, 325)}, 7),
        (VOX, "vae_decoder"): (12, {"frames": (12, 36)}, 6),
    }
    for (fam, stage), (buckets, hot_sizes, hot) in want.items():
        spec = fam.specs(fam.options(dynamic_packages="cold"), [stage])[0]
        plan = spec.plan.buckets()
        assert (len(plan), spec.hot_sizes, sum(spec.is_hot(b) for b in plan)) == (buckets, hot_sizes, hot), stage
    assert QWEN.specs(QWEN.options(), ["code_predictor"])[0].hot_sizes is None


def test_hot_frames_pad_each_window_to_its_bucket():
    from ttsaot.builder.buckets import StreamingConfig, hot_frames

    streaming = StreamingConfig(chunk_frames=25, left_context_frames=25, first_chunk_frames=4)
    assert streaming.hot_windows() == [4, 50, 300 + 25]
    assert hot_frames(streaming, (8, 32, 64, 400)) == (8, 64, 400)  # 4 → 8, 50 → 64, 325 → 400
    assert hot_frames(streaming, (8, 32)) == (8,)  # no bucket holds the longer windows


class _FramesMustBe8Or16(nn.Module):
    """Batch can be symbolic; frames cannot (the view needs a constant frame count: torch.export specialises it)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x):
        b, c, f = x.shape
        y = x.float().reshape(b, c, 2, 4 if f == 8 else 8)  # a Python branch on the size: f is specialised
        return (y.sum(-1) * self.w[: y.shape[-1]].sum()).reshape(b, c * 2)


def _toy_spec(plan: BucketPlan) -> StageSpec:
    return StageSpec(
        family="toy",
        name="toy",
        kind="generic",
        make_module=_FramesMustBe8Or16,
        passes=[],
        plan=plan,
        make_inputs=lambda sizes, g: {"x": torch.randn(sizes["batch"], 3, sizes["frames"], generator=g)},
        inputs=[{"name": "x", "dtype": "float32", "shape": ["batch", 3, "frames"]}],
        outputs=[{"name": "y", "dtype": "float32", "shape": ["batch", 6]}],
        dtype=torch.float32,
        tolerance=1e-5,
    )


def test_export_dynamic_keeps_the_axes_the_graph_allows():
    spec = _toy_spec(BucketPlan({"batch": (1, 2, 4), "frames": (8, 16)}))
    module = _FramesMustBe8Or16().eval()
    x = torch.randn(4, 3, 16)
    res = export_dynamic(
        lambda shapes: export_program(module, (x,), torch.device("cpu"), dynamic_shapes=shapes),
        spec.inputs,
        spec.plan.axes,
        plan_ranges(spec.plan.axes),
        "toy",
    )
    assert res.dynamic == {"batch": (1, 4)} and res.dropped == ["frames"] and res.reason
    assert res.covers({"batch": 2, "frames": 16}) and not res.covers({"batch": 5, "frames": 16})
    out = res.program.module()(torch.ones(3, 3, 16))  # any batch in the range
    assert out.shape == (3, 6)


class _WholeSteps(nn.Module):
    """Takes its samples in whole steps of 4 (a strided conv stack's `samples // hop`): a plain range is refused."""

    def forward(self, x):
        b, c, n = x.shape
        return x.reshape(b, c, n // 4, 4).sum(-1)


@pytest.mark.parametrize("steps", [{}, {"samples": 4}])
def test_a_declared_step_exports_the_axis_stepped_from_the_first_try(steps):
    """StageSpec.axis_steps: the same stepped range, one export instead of a refused plain range and a retry."""
    axes = {"samples": (8, 16, 24)}
    x = torch.randn(1, 3, 24)
    calls: list = []

    def export(shapes):
        calls.append(shapes)
        return export_program(_WholeSteps().eval(), (x,), torch.device("cpu"), dynamic_shapes=shapes)

    inputs = [{"name": "x", "dtype": "float32", "shape": [1, 3, "samples"]}]
    res = export_dynamic(export, inputs, axes, with_steps(plan_ranges(axes), steps, axes), "toy")
    assert res.dynamic == {"samples": (8, 24, 4)} and res.covers({"samples": 16}) and not res.covers({"samples": 18})
    assert len(calls) == (1 if steps else 2)


def test_with_steps_keeps_a_plain_range_where_a_size_is_not_whole_steps():
    axes = {"samples": (8, 18), "batch": (1, 2)}
    ranges = plan_ranges(axes)
    assert with_steps(ranges, {"samples": 4}, axes) == ranges  # 18 is not whole steps of 4
    assert with_steps(ranges, {"samples": 2, "frames": 2}, axes) == {"samples": (8, 18, 2), "batch": (1, 2)}
    fish = get_family("fish-s2-pro")
    enc = fish.specs(fish.options(), ["dac_encoder"])[0]
    assert enc.axis_steps == {"samples": enc.metadata["samples_per_frame"]}
    assert all(n % enc.axis_steps["samples"] == 0 for n in enc.plan.axes["samples"])


def test_a_static_axis_groups_the_buckets_one_package_per_value(tmp_path, monkeypatch):
    """frames cannot be dynamic: one package per frame size, batch dynamic in each; the manifest says why."""
    calls: list = []
    monkeypatch.setattr(build_mod, "compile_bucket", _fake_compile(calls))
    monkeypatch.setattr(build_mod, "_package_cpu_isa", lambda tmp, stages: "")
    monkeypatch.setattr(build_mod, "_golden_cases", lambda spec, *a: {"x": torch.zeros(1)})
    spec = replace(_toy_spec(BucketPlan({"batch": (1, 2), "frames": (8, 16)})), golden_buckets=False)
    notes = []

    class Notes(Reporter):
        def note(self, msg: str) -> None:
            notes.append(msg)

    res = build_family("toy", [spec], tmp_path, "cpu", verify_in_subprocess=False, reporter=Notes())
    st = res.manifest.stages["toy"]
    assert {b.key: b.file for b in st.buckets} == {
        "b1_f8": "toy/dynamic_f8.pt2",
        "b1_f16": "toy/dynamic_f16.pt2",
        "b2_f8": "toy/dynamic_f8.pt2",
        "b2_f16": "toy/dynamic_f16.pt2",
    }
    pk = st.packaging
    assert pk["mode"] == "dynamic" and pk["reason"]
    assert pk["packages"]["toy/dynamic_f8.pt2"] == {
        "buckets": ["b1_f8", "b2_f8"],
        "dynamic_axes": {"batch": {"min": 1, "max": 2}},
    }
    assert [json.loads(m["ttsaot_buckets"]) for _, m in calls] == [
        {"b1_f8": [[[1, 3, 8], "float32"]], "b2_f8": [[[2, 3, 8], "float32"]]},
        {"b1_f16": [[[1, 3, 16], "float32"]], "b2_f16": [[[2, 3, 16], "float32"]]},
    ]
    assert any("2 package(s) for 4 buckets (dynamic batch; static because:" in n for n in notes), notes


@pytest.mark.parametrize("dynamic", ["off", "on"])
def test_packages_record_whether_their_launches_are_programmatic(dynamic, tmp_path, monkeypatch):
    """builder/kernels/pdl.py: a static package of ≤ 2 rows asks compile_bucket for programmatic launches, a larger
    one does not, and a dynamic package only when every bucket it serves would."""
    calls: list = []
    monkeypatch.setattr(build_mod, "compile_bucket", _fake_compile(calls))
    monkeypatch.setattr(build_mod, "_package_cpu_isa", lambda tmp, stages: "")
    specs = [replace(_specs()[0], plan=BucketPlan({"batch": (1, 4), "frames": (8,)}), dynamic_packages=dynamic)]
    build_family(QWEN.name, specs, tmp_path, "cpu", verify_in_subprocess=False)
    got = {name: m["ttsaot_pdl"] for name, m in calls}
    if dynamic == "off":
        assert got == {"code2wav_b1_f8": "1", "code2wav_b4_f8": "0"}
    else:
        assert list(got.values()) == ["0"]


def test_a_symbol_is_never_asked_to_stop_at_two():
    """dynamic_shapes.axis_dim: a range [1, 2] is exported as [1, 3] (a saved-and-loaded program over [1, 2] came
    out of AOTInductor with the size baked to 2); other ranges are asked as they are."""
    from ttsaot.builder.dynamic_shapes import axis_dim

    def bounds(d):
        return d.min, d.max

    assert bounds(axis_dim("batch", 1, 2)) == (1, 3)
    assert bounds(axis_dim("batch", 1, 4)) == (1, 4)
    assert bounds(axis_dim("frames", 8, 32)) == (8, 32)
    assert bounds(axis_dim("samples", 2048, 4096, 2048)) == (2048, 6144)  # 2048 × [1, 2] → 2048 × [1, 3]
