"""Session fixtures for the bench tests: ONE `python -m bench build` of the tiny fp32 VoxCPM2 local_encoder (batch
1) into a fresh bench artifact cache, shared by tests/test_bench_prebuild.py (the build lands where `bench run`
looks) and tests/test_bench_profile.py (`profile_stage` on a copy of that cache reuses the artifact instead of
compiling the same one again: the same artifact key, fp32 and batch 1 being what the CPU profile asks for). Import
into a test module by assigning them (as tests/fish_fixtures.py's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, built_artifact

# the target and plan of `profile_stage("voxcpm2", "local_encoder", device=cpu, axes={"batch": (1,)})` on CPU
TARGET = "voxcpm2/local_encoder:fp32"
AXES = {"batch": (1,)}


def _prebuild(root: Path) -> Path:
    cache = root / "cache"
    cmd = [sys.executable, "-m", "bench", "build", TARGET, "--device", "cpu", "--jobs", "1", "--cache-dir", str(cache)]
    cmd += [f"--axis={name}={','.join(map(str, sizes))}" for name, sizes in AXES.items()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return cache


@pytest.fixture(scope="session")
def local_encoder_bench_cache() -> Path:
    """The bench artifact cache holding the prebuilt local_encoder. Read-only: copy it before a run may add to it."""
    return built_artifact("bench-local-encoder-fp32", _prebuild)
