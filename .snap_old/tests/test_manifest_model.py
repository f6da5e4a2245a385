"""One manifest model: the builder writes manifest.json with the same dataclasses and code the runtime reads it
with; every field is in the schema and in artifacts/README.md."""

import json
import re
from dataclasses import fields, replace
from pathlib import Path

import pytest

from ttsaot.runtime import ArtifactNotFoundError, ManifestError, read_manifest
from ttsaot.runtime.artifact import (
    _REQUIRED_METADATA,
    STAGE_KINDS,
    BucketEntry,
    FileEntry,
    Manifest,
    OnnxEntry,
    StageEntry,
    TensorSpec,
    WeightSpec,
    parse_manifest,
    write_manifest,
)

SPEC = Path(__file__).resolve().parents[1] / "artifacts" / "README.md"


def _manifest(**stage_changes) -> Manifest:
    """A manifest using every field and every optional form (chunked weights, ONNX, Inductor options)."""
    sha = "ab" * 32
    stage = StageEntry(
        name="code2wav",
        kind="codec_decoder",
        dtype="bfloat16",
        inputs=[
            TensorSpec(
                "codes", "int64", ["batch", 16, "frames"], pad=0, range={"dim": 1, "low": 0, "high": [2048] * 16}
            )
        ],
        outputs=[TensorSpec("wav", "float32", ["batch", 1, ["frames", 1920]])],
        weights=FileEntry("code2wav.safetensors", sha, 150, chunk_bytes=64, chunk_sha256=(sha, sha, sha)),
        constants={"w": WeightSpec("bfloat16", [4, 2], [2, 1])},
        buckets=[BucketEntry("b1_f8", {"batch": 1, "frames": 8}, "code2wav/b1_f8.pt2", sha, 10)],
        golden=FileEntry("golden/code2wav.safetensors", sha, 20),
        golden_cases=["b1_f8"],
        tolerance=0.05,
        metadata={
            "sample_rate": 24000,
            "samples_per_frame": 1920,
            "streaming": {"chunk_frames": 25, "left_context_frames": 25},
        },
        config={"upsample_rates": [8, 5, 4, 3]},
        passes=[{"pass": "fuse", "dropped": {}}],
        inductor_options={"max_autotune": True},
        checkpoint={"random_weights": True, "seed": 0},
        onnx=OnnxEntry(
            "onnx/code2wav.onnx",
            sha,
            30,
            22,
            external_data=[FileEntry("onnx/code2wav.onnx.data", sha, 40)],
            dynamic_axes={"batch": {"min": 1, "max": 4}},
            static_axes={"frames": 8},
            ops=["Conv"],
            custom_ops={"ttsaot.snake_beta.default": "translation"},
        ),
    )
    stage = replace(stage, **stage_changes)
    return Manifest(
        format_version=1,
        family="qwen3-tts-12hz",
        preset="tiny",
        device="cpu",
        build_env={"torch": "2.13.0", "cpu_isa": "AVX2"},
        stages={"code2wav": stage},
        created="2026-01-01T00:00:00+00:00",
    )


def test_write_read_round_trip(tmp_path):
    m = _manifest()
    write_manifest(tmp_path, m)
    raw = json.loads((tmp_path / "manifest.json").read_text())
    back = read_manifest(tmp_path)
    assert back == m
    assert back.to_dict() == raw == m.to_dict()
    st = raw["stages"]["code2wav"]
    assert "name" not in st  # the key of `stages` is the name
    assert st["inductor_options"] == {"max_autotune": True}
    assert "pad" not in raw["stages"]["code2wav"]["outputs"][0]  # optional fields at their default are omitted
    assert "chunk_bytes" not in st["golden"] and st["weights"]["chunk_bytes"] == 64


def test_built_artifact_is_exactly_what_the_model_writes(qwen_tiny_fp32):
    raw = json.loads((qwen_tiny_fp32 / "manifest.json").read_text())
    m = read_manifest(qwen_tiny_fp32)
    assert m.to_dict() == raw
    assert parse_manifest(m.to_dict()) == m
    assert m.stages["code2wav"].inductor_options == {} and "inductor_options" in raw["stages"]["code2wav"]


def test_inspect_json_shows_inductor_options(tmp_path):
    write_manifest(tmp_path, _manifest())
    shown = json.loads(read_manifest(tmp_path).to_json())  # what `build-artifacts inspect` reads
    assert shown["stages"]["code2wav"]["inductor_options"] == {"max_autotune": True}


def test_a_value_that_would_not_read_back_is_never_written(tmp_path):
    with pytest.raises(ManifestError, match="stages would not read back"):
        write_manifest(tmp_path, _manifest(config={"upsample_rates": (8, 5)}))  # a tuple reads back as a list
    with pytest.raises(ManifestError, match="sample_rate is missing"):
        write_manifest(tmp_path, _manifest(metadata={}))  # what the runtime refuses, the builder cannot write
    assert not (tmp_path / "manifest.json").exists()


@pytest.mark.parametrize(
    "where",
    [
        "",
        "stages.code2wav",
        "stages.code2wav.inputs.0",
        "stages.code2wav.weights",
        "stages.code2wav.buckets.0",
        "stages.code2wav.constants.w",
        "stages.code2wav.onnx",
    ],
)
def test_unknown_fields_are_refused(where):
    d = _manifest().to_dict()
    node = d
    for k in filter(None, where.split(".")):
        node = node[int(k)] if isinstance(node, list) else node[k]
    node["colour"] = "blue"
    with pytest.raises(ManifestError, match="unknown field 'colour'"):
        parse_manifest(d)


def test_parent_folder_names_the_artifacts_inside(tmp_path):
    for fam in ("fish-s2-pro", "qwen3-tts-12hz"):
        (tmp_path / fam).mkdir()
        write_manifest(tmp_path / fam, _manifest())
    (tmp_path / "not-an-artifact").mkdir()
    with pytest.raises(
        ArtifactNotFoundError,
        match=r"folder of them: fish-s2-pro, qwen3-tts-12hz; pass one, "
        r"e\.g\. .*fish-s2-pro",
    ):
        read_manifest(tmp_path)
    with pytest.raises(ArtifactNotFoundError, match="build one with"):
        read_manifest(tmp_path / "not-an-artifact")


# ----------------------------------------------------------------------------------- the written spec
def _spec_text() -> str:
    return SPEC.read_text()


@pytest.mark.parametrize("cls", [Manifest, StageEntry, TensorSpec, FileEntry, BucketEntry, WeightSpec, OnnxEntry])
def test_every_field_is_in_the_spec(cls):
    text = _spec_text()
    missing = [f.name for f in fields(cls) if f.name != "name" or cls is TensorSpec if f"`{f.name}`" not in text]
    assert not missing, f"{cls.__name__} fields not in artifacts/README.md: {missing}"


def test_every_kind_and_its_required_metadata_are_in_the_spec():
    text = _spec_text()
    table = text[text.index("### Stage metadata by kind") :]
    for kind in STAGE_KINDS:
        assert f"`{kind}`" in table, kind
    for kind, keys in _REQUIRED_METADATA.items():
        row = next(line for line in table.splitlines() if re.search(rf"`{kind}`", line))
        for key in keys:
            assert f"`{key}`" in row, (kind, key)


def test_kernels_choice_is_recorded_and_validated(tmp_path):
    m = _manifest(kernels="ttsaot")
    write_manifest(tmp_path, m)
    assert read_manifest(tmp_path).stages["code2wav"].kernels == "ttsaot"
    d = m.to_dict()
    del d["stages"]["code2wav"]["kernels"]
    assert parse_manifest(d).stages["code2wav"].kernels == "inductor"  # older artifacts: Inductor's code
    d["stages"]["code2wav"]["kernels"] = "cudnn"
    with pytest.raises(ManifestError, match="kernels must be one of"):
        parse_manifest(d)


def test_a_kind_needs_the_bucket_axes_its_runtime_class_reads():
    d = _manifest().to_dict()
    st = d["stages"]["code2wav"]
    st["buckets"][0]["sizes"] = {"batch": 1, "time": 8}  # the decoder chunks along `frames`
    st["inputs"][0]["shape"] = ["batch", 16, "time"]
    st["outputs"][0]["shape"] = ["batch", 1, ["time", 1920]]
    with pytest.raises(ManifestError, match="no 'frames' axis, which stage kind 'codec_decoder' needs"):
        parse_manifest(d)
    st["kind"] = "generic"  # a generic stage reads no axis by name
    assert parse_manifest(d).stages["code2wav"].axis_names() == ["batch", "time"]
