"""A build whose inputs are those the installed artifact was built from checks that artifact instead of making it
again (builder/build_inputs.py); any changed input, a failing check or --no-cache builds."""

import os
import time

import pytest
import torch

from ttsaot.builder import build as build_mod
from ttsaot.builder import build_inputs
from ttsaot.builder.buckets import StreamingConfig
from ttsaot.builder.build import build_family
from ttsaot.builder.build_inputs import INPUTS_KEY, checkpoint_identity
from ttsaot.builder.families.qwen3_tts_12hz import FAMILY as QWEN
from ttsaot.builder.families.qwen3_tts_12hz import stages as qst
from ttsaot.builder.families.qwen3_tts_12hz.options import Qwen3TTSOptions
from ttsaot.runtime.artifact import read_manifest

from . import package_cache_fixtures as pcf


def _specs():
    opts = Qwen3TTSOptions(
        dtype=torch.float32, batch_buckets=(1,), frame_buckets=(8,), streaming=StreamingConfig(8, 0, 0, 0)
    )
    return [qst.code2wav_stage(opts)]


def _build(out, inputs, **kw):
    kw.setdefault("cache_dir", os.environ["TTSAOT_CACHE_DIR"])
    return build_family(QWEN.name, _specs(), out, "cpu", inputs=inputs, **kw)


class _Built(Exception):
    """Raised where a build would start preparing its stages: it did not skip."""


filled_cache, cached = pcf.filled_cache, pcf.cached


def test_same_inputs_check_the_installed_artifact_and_leave_it(tmp_path, monkeypatch, cached):
    # the builds' cache: a copy of one holding the b1_f8 package (tests/package_cache_fixtures.py), not compiled here
    monkeypatch.setenv("TTSAOT_CACHE_DIR", str(cached[0]))
    out = tmp_path / "out"
    first = _build(out, {"options": "a"})
    manifest = (first.path / "manifest.json").read_text()
    assert not first.up_to_date and read_manifest(first.path).build_env[INPUTS_KEY]

    def prepare(*a, **k):
        raise _Built

    with monkeypatch.context() as m:
        m.setattr(build_mod, "prepare_stage", prepare)
        again = _build(out, {"options": "a"})
        assert again.up_to_date
        assert (again.path / "manifest.json").read_text() == manifest  # not rewritten
        # another input (the caller's options), --no-cache, or a caller that names no inputs: a real build
        for inputs, kw in (({"options": "b"}, {}), ({"options": "a"}, {"cache_dir": None}), (None, {})):
            with pytest.raises(_Built):
                _build(out, inputs, **kw)
    assert (out / QWEN.name / "manifest.json").read_text() == manifest

    weights = next((out / QWEN.name).rglob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    notes = []

    class Notes(build_mod.Reporter):
        def note(self, msg):
            notes.append(msg)

    rebuilt = _build(out, {"options": "a"}, reporter=Notes())
    assert not rebuilt.up_to_date
    assert any("fails its check" in n for n in notes), notes
    assert _build(out, {"options": "a"}).up_to_date  # the rebuilt artifact is whole again


def test_checkpoint_identity_sees_content_of_small_files_and_rewrites_of_large_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(build_inputs, "CONTENT_HASH_BYTES", 16)
    (tmp_path / "config.json").write_text('{"a": 1}')
    (tmp_path / "model.safetensors").write_bytes(b"x" * 64)
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "download.lock").write_text("hub bookkeeping")
    first = checkpoint_identity(tmp_path)
    assert [f[0] for f in first] == ["config.json", "model.safetensors"]
    assert checkpoint_identity(tmp_path) == first
    (tmp_path / ".cache" / "download.lock").write_text("touched")
    assert checkpoint_identity(tmp_path) == first

    (tmp_path / "config.json").write_text('{"a": 2}')  # same size, other content
    second = checkpoint_identity(tmp_path)
    assert second != first

    st = (tmp_path / "model.safetensors").stat()
    time.sleep(0.05)
    (tmp_path / "model.safetensors").write_bytes(b"y" * 64)  # same size, rewritten in place
    os.utime(tmp_path / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))  # even with its mtime put back
    assert checkpoint_identity(tmp_path) != second
