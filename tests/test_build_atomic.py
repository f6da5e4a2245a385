"""Builds are atomic: a failure, Ctrl-C or SIGTERM leaves the previous artifact intact and no temp or lock files;
a lock stops two builds into one directory; a package that crashes on load fails the build, not the user later;
every file of an artifact has one mode."""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ttsaot.builder import build as build_mod
from ttsaot.builder.buckets import StreamingConfig
from ttsaot.builder.build import BuildError, _BuildLock, build_family
from ttsaot.builder.families.qwen3_tts_12hz import FAMILY as QWEN
from ttsaot.builder.families.qwen3_tts_12hz import stages as qst
from ttsaot.builder.families.qwen3_tts_12hz.options import Qwen3TTSOptions

from . import package_cache_fixtures as pcf


def _specs(**kw):
    opts = Qwen3TTSOptions(
        dtype=torch.float32, batch_buckets=(1,), frame_buckets=(8,), streaming=StreamingConfig(8, 0, 0, 0), **kw
    )
    return [qst.code2wav_stage(opts)]


@pytest.fixture
def previous(qwen_tiny_fp32, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(qwen_tiny_fp32, out / "qwen3-tts-12hz")
    return out, (out / "qwen3-tts-12hz" / "manifest.json").read_text()


# A private copy of a cache holding the b1_f8 package (tests/package_cache_fixtures.py): the tests below that build
# it reuse it instead of compiling it; a reused package still goes through the subprocess load check and the golden
# comparison they test. (With the run's shared cache, each build that failed its load check dropped the entry, and
# the next test compiled it again: three compiles here.)
filled_cache, cached = pcf.filled_cache, pcf.cached


def _no_temp(out):
    return not [p for p in out.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_interrupt_leaves_previous_artifact(previous, monkeypatch):
    out, before = previous

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(build_mod, "compile_bucket", boom)
    with pytest.raises(KeyboardInterrupt):
        build_family(QWEN.name, _specs(), out, "cpu")
    assert (out / "qwen3-tts-12hz" / "manifest.json").read_text() == before
    assert _no_temp(out)


def test_compile_failure_is_reported_per_bucket(previous, monkeypatch):
    out, before = previous

    def fail(*a, **k):
        raise build_mod.CompileError("AOTInductor compile failed: no space left on device")

    monkeypatch.setattr(build_mod, "compile_bucket", fail)
    with pytest.raises(BuildError, match="code2wav/b1_f8: AOTInductor compile failed: no space"):
        build_family(QWEN.name, _specs(), out, "cpu")
    assert (out / "qwen3-tts-12hz" / "manifest.json").read_text() == before
    assert _no_temp(out)


def test_lock_prevents_interleaved_builds(previous):
    out, _ = previous
    with _BuildLock(out / "qwen3-tts-12hz"):
        with pytest.raises(BuildError, match=f"another build is writing {out / 'qwen3-tts-12hz'} "):
            build_family(QWEN.name, _specs(), out, "cpu")
    assert not (out / ".qwen3-tts-12hz.lock").exists()


def test_package_crash_on_load_fails_the_build(previous, cached, monkeypatch, tmp_path):
    out, before = previous
    fake = tmp_path / "crashing-python"
    fake.write_text("#!/bin/sh\nkill -SEGV $$\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(build_mod.sys, "executable", str(fake))
    with pytest.raises(BuildError, match="signal 11"):
        build_family(QWEN.name, _specs(), out, "cpu", cache_dir=cached[0])
    assert (out / "qwen3-tts-12hz" / "manifest.json").read_text() == before
    assert _no_temp(out)


def test_verification_really_compares(previous, cached):
    # A zero tolerance cannot be met (kernel-order noise ~1e-7): the subprocess check must catch it.
    out, before = previous
    specs = _specs()
    specs[0].tolerance = 0.0
    with pytest.raises(BuildError, match="differs from eager"):
        build_family(QWEN.name, specs, out, "cpu", cache_dir=cached[0])
    assert (out / "qwen3-tts-12hz" / "manifest.json").read_text() == before


def test_rebuild_replaces_and_keeps_permissions(previous, cached):
    out, before = previous
    res = build_family(QWEN.name, _specs(), out, "cpu", cache_dir=cached[0])
    m = json.loads((res.path / "manifest.json").read_text())
    assert [b["key"] for b in m["stages"]["code2wav"]["buckets"]] == ["b1_f8"]
    assert (res.path / "manifest.json").read_text() != before
    paths = [res.path, *res.path.rglob("*")]
    modes = {str(p.relative_to(res.path)): oct(stat.S_IMODE(p.stat().st_mode)) for p in paths}
    assert modes["."] == "0o755" and modes["code2wav.safetensors"] == "0o644"  # safetensors alone writes 0600
    assert all(m == ("0o755" if (res.path / p).is_dir() else "0o644") for p, m in modes.items()), modes
    assert _no_temp(out)
    assert sorted(p.name for p in out.iterdir()) == ["qwen3-tts-12hz"]  # no lock file left behind


ROOT = Path(__file__).resolve().parents[1]
_CHILD_BUILD = """
import sys
sys.path.insert(0, {root!r})
from tests.test_build_atomic import _specs
from ttsaot.builder.build import build_family
build_family("qwen3-tts-12hz", _specs(), {out!r}, "cpu")
"""


def test_sigterm_mid_build_leaves_nothing_behind(previous):
    """A scheduler or `kill` stopping a build is handled like Ctrl-C: temp dir and lock file removed."""
    out, before = previous
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD_BUILD.format(root=str(ROOT), out=str(out))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 600
        while not [p for p in out.iterdir() if ".tmp-" in p.name]:
            assert child.poll() is None, child.communicate()
            assert time.time() < deadline, "the build never created its temp dir"
            time.sleep(0.05)
        time.sleep(0.5)  # inside build_stage (eager reference, export, compile)
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode != 0 and "terminated by signal 15" in err, err[-2000:]
    assert (out / "qwen3-tts-12hz" / "manifest.json").read_text() == before
    assert sorted(p.name for p in out.iterdir()) == ["qwen3-tts-12hz"], list(out.iterdir())


def test_a_swallowed_sigterm_still_stops_the_build():
    """A library that catches the KeyboardInterrupt a SIGTERM raises (the CPU build once finished and exited 0
    after one) cannot hide it: the build re-raises it between stages and before installing."""
    from ttsaot.builder.build import _TerminateAsInterrupt

    with _TerminateAsInterrupt() as term:
        term.check()  # nothing yet
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs at the next bytecode boundary
        except KeyboardInterrupt:
            pass  # what the swallowing library does
        with pytest.raises(KeyboardInterrupt, match="terminated by signal 15"):
            term.check()
    assert signal.getsignal(signal.SIGTERM) is not term._raise  # the previous handler is back
