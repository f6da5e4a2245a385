"""Session fixtures for the package cache (builder/package_cache.py): fresh caches, each filled by ONE real build
once per run (tests/conftest.py `built_artifact`), that the tests building the same package copy instead of
compiling it again. Import into a test module by assigning them (as tests/fish_fixtures.py's).

- `filled_cache`: the tiny fp32 code2wav at b1_f8 (`_specs()` of tests/test_build_atomic.py): tests/
  test_package_cache.py, test_build_atomic.py, test_up_to_date.py and test_cli.py build that package, and each used
  to compile it again: a build that fails its load check drops every entry it used from its cache (builder/build.py),
  so in the run's shared cache the fault-injection builds of test_build_atomic.py compiled it once each.
- `dynamic_filled_cache`: the same stage's one dynamic package for b1 x frames {8, 16}, which
  tests/test_package_cache.py rebuilds and tests/test_onnx.py's AOTI + ONNX build compiles too (the same program).

A test takes its own copy (`cached`, `cache_copy`): it edits, corrupts, adds to or fails a check in that copy only.
(tests/test_build_atomic.py imports this module, and so do the build scripts some tests run in a child process:
nothing here imports tests/conftest.py at import time.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ttsaot.builder.build import Reporter


class Notes(Reporter):
    """A reporter that keeps the build's notes."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, msg: str) -> None:
        self.notes.append(msg)


def cache_copy(cache: Path, dst: Path) -> Path:
    """A private copy of a filled cache at `dst` (its lock files left behind)."""
    shutil.copytree(cache, dst, ignore=shutil.ignore_patterns("*.lock"))
    return dst


def _fill_a_fresh_cache(root: Path, specs: list) -> Path:
    from ttsaot.builder.build import build_family
    from ttsaot.builder.families.qwen3_tts_12hz import FAMILY as QWEN

    rep = Notes()
    res = build_family(QWEN.name, specs, root / "first", "cpu", cache_dir=root / "cache", reporter=rep)
    assert "code2wav: 0 of 1 packages reused from the package cache" in rep.notes, rep.notes
    return res.path


def b1_f8_specs() -> list:
    from .test_build_atomic import _specs

    return _specs()


def dynamic_specs() -> list:
    """One dynamic package (`on`) for the buckets b1_f8 and b1_f16."""
    from dataclasses import replace

    from ttsaot.builder.buckets import BucketPlan

    return [replace(b1_f8_specs()[0], plan=BucketPlan({"batch": (1,), "frames": (8, 16)}), dynamic_packages="on")]


@pytest.fixture(scope="session")
def filled_cache() -> tuple[Path, Path]:
    """One real build (b1_f8, fp32) that fills a fresh cache (its package compiled: 0 of 1 reused): (cache dir,
    artifact path). Read-only: tests take `cached`."""
    from .conftest import built_artifact

    first = built_artifact("package-cache-b1-f8", lambda root: _fill_a_fresh_cache(root, b1_f8_specs()))
    return first.parent.parent / "cache", first


@pytest.fixture
def cached(filled_cache, tmp_path_factory) -> tuple[Path, Path]:
    """(a private copy of the filled cache, the artifact its build wrote)."""
    cache, first = filled_cache
    return cache_copy(cache, tmp_path_factory.mktemp("package_cache") / "cache"), first


@pytest.fixture(scope="session")
def dynamic_filled_cache() -> tuple[Path, Path]:
    """One real build of `dynamic_specs()` (its one dynamic package compiled: 0 of 1 reused) into a fresh cache:
    (cache dir, artifact path). Read-only: tests copy the cache (`cache_copy`)."""
    from .conftest import built_artifact

    first = built_artifact("package-cache-dynamic-b1", lambda root: _fill_a_fresh_cache(root, dynamic_specs()))
    return first.parent.parent / "cache", first
