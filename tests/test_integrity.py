"""Corrupted, truncated, tampered and mismatched artifacts give typed errors before any native code runs."""

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from ttsaot.runtime import (
    ArtifactNotFoundError,
    BindingError,
    CompatibilityError,
    IntegrityError,
    ManifestError,
    load,
)


def _manifest(path):
    return json.loads((path / "manifest.json").read_text())


def _write_manifest(path, m):
    (path / "manifest.json").write_text(json.dumps(m))


def _resha(path, entry):
    p = path / entry["file"]
    entry["sha256"] = hashlib.sha256(p.read_bytes()).hexdigest()
    entry["bytes"] = p.stat().st_size


def test_bit_flip_in_package_is_refused_before_dlopen(qwen_tiny_fp32, artifact_copy):
    art = artifact_copy(qwen_tiny_fp32)
    pkg = art / _manifest(art)["stages"]["code2wav"]["buckets"][0]["file"]
    data = bytearray(pkg.read_bytes())
    data[len(data) // 2] ^= 0x01
    pkg.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="sha256"):
        load(art)


def test_truncated_weights_are_refused(qwen_tiny_fp32, artifact_copy):
    art = artifact_copy(qwen_tiny_fp32)
    w = art / "code2wav.safetensors"
    w.write_bytes(w.read_bytes()[:-100])
    with pytest.raises(IntegrityError, match="bytes"):
        load(art)


def test_missing_file(qwen_tiny_fp32, artifact_copy):
    art = artifact_copy(qwen_tiny_fp32)
    (art / "golden" / "code2wav.safetensors").unlink()
    with pytest.raises(IntegrityError, match="missing"):
        load(art)
    with pytest.raises(ArtifactNotFoundError):
        load(art / "nope")


@pytest.mark.parametrize(
    "mutate, err, match",
    [
        (lambda m: m.__setitem__("format_version", 2), ManifestError, "format_version 2"),
        (lambda m: m.pop("stages"), ManifestError, "stages is missing"),
        (lambda m: m["stages"]["code2wav"].__setitem__("kind", "teleporter"), ManifestError, "unknown"),
        (
            lambda m: m["stages"]["code2wav"]["buckets"][0].__setitem__("file", "../../etc/passwd"),
            ManifestError,
            "outside the artifact",
        ),
        (lambda m: m["stages"]["code2wav"].__setitem__("tolerance", "small"), ManifestError, "tolerance"),
        # found by the explore profile of the manifest fuzz test: both used to reach a call (KeyError, NaN output)
        (
            lambda m: m["stages"]["code2wav"]["inputs"][0]["shape"].__setitem__(0, ""),
            ManifestError,
            "names axis '', which is not a bucket axis",
        ),
        (
            lambda m: next(
                c for c in m["stages"]["code2wav"]["constants"].values() if len(c["shape"]) == 1
            ).__setitem__("stride", [2]),
            ManifestError,
            "not the contiguous layout",
        ),
        (
            lambda m: m["stages"]["code2wav"]["outputs"][0]["shape"].__setitem__(2, ["samples", 64]),
            ManifestError,
            "neither a bucket axis nor derived",
        ),
        (lambda m: m["stages"]["code2wav"]["outputs"][0]["shape"][2].__setitem__(1, 0), ManifestError, "invalid entry"),
        (lambda m: m["build_env"].__setitem__("torch", "1.0.0"), CompatibilityError, "torch 1.0.0"),
        (lambda m: m.__setitem__("device", "cuda"), CompatibilityError, "built for device 'cuda'"),
        (
            lambda m: (
                m["build_env"].__setitem__("cpu_isa", "AVX512 AMX_TILE")
                if torch.backends.cpu.get_cpu_capability() != "AVX512"
                else m["build_env"].__setitem__("torch", "0")
            ),
            CompatibilityError,
            "compiled for CPU ISA 'AVX512 AMX_TILE'|built with torch 0,",  # whichever of the two the host gets
        ),
    ],
)
def test_bad_manifest_fields(qwen_tiny_fp32, artifact_copy, mutate, err, match):
    art = artifact_copy(qwen_tiny_fp32)
    m = _manifest(art)
    mutate(m)
    _write_manifest(art, m)
    with pytest.raises(err, match=match):
        load(art, device="cpu")


def _first_matrix_constant(stage: dict) -> dict:
    return next(c for c in stage["constants"].values() if sum(n > 1 for n in c["shape"]) >= 2)


@pytest.mark.parametrize(
    "stride_of",
    [
        lambda c: [0] + c["stride"][1:],  # the fuzzer's case: one element broadcast over a dim
        lambda c: [1] * len(c["stride"]),  # rows overlapping columns
    ],
)
def test_overlapping_weight_strides_are_a_manifest_error(qwen_tiny_fp32, artifact_copy, stride_of):
    """Hypothesis found a stride of 0 in a constant's layout reaching `copy_` as an untyped RuntimeError."""
    art = artifact_copy(qwen_tiny_fp32)
    m = _manifest(art)
    c = _first_matrix_constant(m["stages"]["code2wav"])
    c["stride"] = stride_of(c)
    _write_manifest(art, m)
    with pytest.raises(ManifestError, match="share memory"):
        load(art, device="cpu")


def test_not_json(qwen_tiny_fp32, artifact_copy):
    art = artifact_copy(qwen_tiny_fp32)
    (art / "manifest.json").write_bytes(b"\x00\xffnot json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        load(art)


def _replace_weight(art, fn):
    m = _manifest(art)
    wpath = art / "code2wav.safetensors"
    sd = load_file(str(wpath))
    fn(sd)
    save_file(sd, str(wpath))
    _resha(art, m["stages"]["code2wav"]["weights"])
    _write_manifest(art, m)


def test_weight_with_wrong_shape_is_refused_not_segfault(qwen_tiny_fp32, artifact_copy):
    art = artifact_copy(qwen_tiny_fp32)
    name = next(iter(_manifest(art)["stages"]["code2wav"]["constants"]))
    _replace_weight(art, lambda sd: sd.__setitem__(name, torch.zeros(3, 3, dtype=sd[name].dtype)))
    with pytest.raises(BindingError, match="manifest says"):
        load(art)


def test_weight_with_wrong_dtype_is_refused(qwen_tiny_fp32, artifact_copy):
    art = artifact_copy(qwen_tiny_fp32)
    consts = _manifest(art)["stages"]["code2wav"]["constants"]
    name = next(k for k, v in consts.items() if v["dtype"] == "float32")
    _replace_weight(art, lambda sd: sd.__setitem__(name, sd[name].double()))
    with pytest.raises(BindingError):
        load(art)


def test_missing_weight_is_refused(qwen_tiny_fp32, artifact_copy):
    art = artifact_copy(qwen_tiny_fp32)
    name = next(iter(_manifest(art)["stages"]["code2wav"]["constants"]))
    _replace_weight(art, lambda sd: sd.pop(name))
    with pytest.raises(BindingError, match="missing"):
        load(art)


def test_trusted_pin(qwen_tiny_fp32):
    sha = hashlib.sha256((qwen_tiny_fp32 / "manifest.json").read_bytes()).hexdigest()
    assert load(qwen_tiny_fp32, trusted_sha256=sha)["code2wav"] is not None
    with pytest.raises(IntegrityError, match="trusted pin"):
        load(qwen_tiny_fp32, trusted_sha256="0" * 64)


def test_check_weights_alignment_and_stride():
    from ttsaot.runtime.artifact import WeightSpec
    from ttsaot.runtime.stage import _check_weight

    spec = WeightSpec(dtype="float32", shape=[4, 4], stride=[4, 1])
    _check_weight("s", "w", torch.zeros(4, 4), spec, torch.device("cpu"))
    with pytest.raises(BindingError, match="stride"):
        _check_weight("s", "w", torch.zeros(4, 4).t(), spec, torch.device("cpu"))
    base = torch.zeros(17)
    misaligned = base[1:].view(4, 4)
    with pytest.raises(BindingError, match="16-byte"):
        _check_weight("s", "w", misaligned, spec, torch.device("cpu"))


def _chunk_weights(art, chunk_bytes):
    """Rewrite the code2wav weights entry with per-slice digests, as the builder does for files > 64 MiB."""
    from ttsaot.runtime.artifact import file_digests

    m = _manifest(art)
    entry = m["stages"]["code2wav"]["weights"]
    whole, chunks = file_digests(art / entry["file"], chunk_bytes)
    assert whole == entry["sha256"] and len(chunks) > 3
    entry.update(chunk_bytes=chunk_bytes, chunk_sha256=chunks)
    _write_manifest(art, m)
    return art / entry["file"], len(chunks)


def test_chunked_weights_load_and_a_flipped_byte_names_its_chunk(qwen_tiny_fp32, artifact_copy):
    art = artifact_copy(qwen_tiny_fp32)
    w, n = _chunk_weights(art, 1 << 12)
    load(art)  # every slice verified (on a thread pool), then bound
    data = bytearray(w.read_bytes())
    data[(n // 2) * 4096 + 7] ^= 0x01
    w.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=f"chunk {n // 2} "):
        load(art)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda e: e.update(chunk_sha256=e["chunk_sha256"][:-1]), "chunk digests"),
        (lambda e: e.update(chunk_bytes=0), "chunk digests"),
        (lambda e: e.update(chunk_bytes="4096"), "chunk_bytes"),
        (lambda e: e.update(chunk_sha256=[1] * len(e["chunk_sha256"])), "chunk_sha256"),
    ],
)
def test_bad_chunk_fields_are_manifest_errors(qwen_tiny_fp32, artifact_copy, mutate, match):
    art = artifact_copy(qwen_tiny_fp32)
    _chunk_weights(art, 1 << 12)
    m = _manifest(art)
    mutate(m["stages"]["code2wav"]["weights"])
    _write_manifest(art, m)
    with pytest.raises(ManifestError, match=match):
        load(art)


def test_builder_writes_chunk_digests_for_large_weights(tmp_path):
    from ttsaot.runtime.artifact import FileEntry, check_files

    (tmp_path / "w.bin").write_bytes(bytes(range(256)) * 100)  # 25,600 bytes
    e = FileEntry.of(tmp_path, "w.bin", chunk_bytes=4096)
    assert e.chunk_bytes == 4096 and len(e.chunk_sha256) == 7
    assert e.sha256 == hashlib.sha256((tmp_path / "w.bin").read_bytes()).hexdigest()
    assert not FileEntry.of(tmp_path, "w.bin").chunk_sha256  # packages, golden files: whole digest
    check_files(tmp_path, [e], workers=4)


def _replace_with_garbage(art, entry: dict) -> None:
    """Overwrite a listed file with bytes that are not safetensors and re-pin it in the manifest, as a consistent
    but wrong artifact would be: only the file reader can notice."""
    (art / entry["file"]).write_bytes(b"\xff" * 64 + b"not a safetensors file")
    entry.pop("chunk_bytes", None)
    entry.pop("chunk_sha256", None)
    _resha(art, entry)


def test_unreadable_weights_file_is_named(qwen_tiny_fp32, artifact_copy):
    art = artifact_copy(qwen_tiny_fp32)
    m = _manifest(art)
    _replace_with_garbage(art, m["stages"]["code2wav"]["weights"])
    _write_manifest(art, m)
    with pytest.raises(BindingError, match=f"{art / 'code2wav.safetensors'}: unreadable weights"):
        load(art)


def test_unreadable_golden_file_is_named(qwen_tiny_fp32, artifact_copy):
    from ttsaot.runtime.verify import verify_bundle

    art = artifact_copy(qwen_tiny_fp32)
    m = _manifest(art)
    _replace_with_garbage(art, m["stages"]["code2wav"]["golden"])
    _write_manifest(art, m)
    with pytest.raises(IntegrityError, match=f"{art / 'golden' / 'code2wav.safetensors'}: unreadable golden"):
        verify_bundle(load(art))
