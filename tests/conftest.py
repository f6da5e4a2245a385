"""Shared fixtures. Artifacts are built once per test session (and shared between xdist workers through a file
lock) because every AOTI compile costs tens of seconds on a 2-core CI machine."""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning. `make test` runs 2 xdist workers, each with an OpenMP team as
# wide as the machine (2 on CI): by default libgomp spins ~300k iterations after every parallel region, burning
# the core the other worker needs (tests/test_serve.py met the same starvation between threads; the service's
# __main__ sets this too). Only how waiting threads wait changes, not what runs: measured on a 2-core box, a
# -n 2 run of eager-heavy test files took 94 -> 60 CPU-s and 57 -> 42 s. Set before torch (and so libgomp)
# is imported in this process; child processes (load checks, compiles) inherit it. An explicit value wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import json
import shutil
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from hypothesis import HealthCheck, settings

from ttsaot.runtime.metrics import rel_error as rel_err  # noqa: F401  (tests import the one metric from here)

warnings.filterwarnings("ignore", category=FutureWarning)

# Without a GPU, Triton kernels can only run under Triton's interpreter (tests/test_kernels_*.py), and Triton reads
# TRITON_INTERPRET when it decorates its own library functions at `import triton`: set it before anything imports
# triton. Nothing else on CPU launches a Triton kernel (CPU builds trace the custom ops' aten branches).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Property tests: CI runs a fixed, reproducible set (derandomized, hypothesis pinned in pyproject's `test` extra);
# `HYPOTHESIS_PROFILE=explore make test` searches freely with more, random examples on a developer's machine.
settings.register_profile(
    "ci", max_examples=30, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck), print_blob=True
)
settings.register_profile(
    "explore",
    max_examples=300,
    derandomize=False,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("TTSAOT_TEST_ARTIFACTS", ROOT / ".pytest_artifacts"))


def built_artifact(name: str, build: Callable[[Path], Path]) -> Path:
    """Build once into CACHE/<name>; later callers (other workers, other tests) reuse it.

    Each pytest run has its own directory (the run id is set by the controlling process and inherited by xdist
    workers), so stale artifacts from older code are never reused and concurrent runs do not collide."""
    root = CACHE / os.environ["TTSAOT_TEST_RUN"] / name
    root.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root) + ".lock"):
        done = root / ".done"
        if not done.exists():
            if root.exists():
                shutil.rmtree(root)
            root.mkdir(parents=True)
            path = build(root)
            done.write_text(str(path.relative_to(root)))
        return root / done.read_text()


def computed_once(name: str, compute: Callable[[], object]):
    """The JSON result of `compute()`, computed once per run and shared like `built_artifact` (a module fixture is
    set up again on every xdist worker that runs one of the module's tests): for costly child-process checks."""

    def write(root: Path) -> Path:
        out = root / "result.json"
        out.write_text(json.dumps(compute()))
        return out

    return json.loads(built_artifact(name, write).read_text())


def pytest_configure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER") and "TTSAOT_TEST_RUN" not in os.environ:
        os.environ["TTSAOT_TEST_RUN"] = uuid.uuid4().hex[:12]
        config._ttsaot_owns_run = True
    # CLI builds use the package cache by default: keep the tests' entries out of the user's cache, one per run
    os.environ.setdefault("TTSAOT_CACHE_DIR", str(CACHE / os.environ["TTSAOT_TEST_RUN"] / "package-cache"))


def _unit(item) -> str:
    """What xdist's `--dist loadgroup` hands to one worker as a whole: the tests of an `xdist_group`, else one test."""
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return item.nodeid
    return str(mark.kwargs.get("name", mark.args[0] if mark.args else ""))


def longest_compiles_first(items: list) -> list:
    """The order a run hands its tests out in: units (`_unit`) by their `compiles(seconds)` marks, the most first,
    ties (every unmarked test) in collection order, a group's tests together. With `-n 8 --dist loadgroup` xdist
    gives the workers units in this order (one each, then more to a worker whenever two or fewer of its tests are
    left), so the GPU suite's long fixture builds start at once on separate workers. In collection order the cold
    pass at 97e2f69 gave one worker the bf16 predictors' fixture (211 s) and then both full-size predictor frames
    (74 + 105 s) one after another, ending the run
    (bench/results/nvidia-h200/probes/gpu_suite/suite_cold_97e2f69.txt). A CPU run, with no such marks, keeps its
    order."""
    cost: dict[str, float] = {}
    members: dict[str, list] = {}
    for item in items:
        unit = _unit(item)
        members.setdefault(unit, []).append(item)
        mark = item.get_closest_marker("compiles")
        cost[unit] = cost.get(unit, 0.0) + (float(mark.args[0]) if mark is not None else 0.0)
    units = sorted(members, key=lambda u: -cost[u])  # stable: collection order for ties
    return [item for unit in units for item in members[unit]]


def pytest_collection_modifyitems(config, items):
    items[:] = longest_compiles_first(items)


def pytest_unconfigure(config):
    if getattr(config, "_ttsaot_owns_run", False):
        shutil.rmtree(CACHE / os.environ.pop("TTSAOT_TEST_RUN"), ignore_errors=True)


@pytest.fixture(scope="session")
def qwen_tiny_fp32() -> Path:
    """Tiny code2wav, fp32, buckets batch {1,2} × frames {8,16,48}; streaming chunk 16 + context 32 (≥ the
    tiny receptive field of 28 frames, so streamed audio must equal one-shot audio)."""
    from ttsaot.builder.buckets import StreamingConfig
    from ttsaot.builder.build import build_family
    from ttsaot.builder.families.qwen3_tts_12hz import FAMILY as QWEN

    def build(root: Path) -> Path:
        opts = QWEN.options(
            dtype=torch.float32,
            batch_buckets=(1, 2),
            frame_buckets=(8, 16, 48),
            streaming=StreamingConfig(16, 32, 0, 0),
        )
        # through the run's package cache (as the CLI builds): tests/oracle/test_qwen_code2wav_oracle.py builds the
        # same program from a checkpoint of the same weights and reuses this package (or this build reuses its)
        cache = os.environ["TTSAOT_CACHE_DIR"]
        return build_family(QWEN.name, QWEN.specs(opts, ["code2wav"]), root, "cpu", cache_dir=cache).path

    return built_artifact("qwen-tiny-fp32", build)


@pytest.fixture(scope="session")
def qwen_tiny_bf16() -> Path:
    from ttsaot.builder.buckets import StreamingConfig
    from ttsaot.builder.build import build_family
    from ttsaot.builder.families.qwen3_tts_12hz import FAMILY as QWEN

    def build(root: Path) -> Path:
        opts = QWEN.options(
            dtype=torch.bfloat16, batch_buckets=(1,), frame_buckets=(16,), streaming=StreamingConfig(16, 0, 0, 0)
        )
        return build_family(QWEN.name, QWEN.specs(opts, ["code2wav"]), root, "cpu").path

    return built_artifact("qwen-tiny-bf16", build)


@pytest.fixture(autouse=True)
def _precision_flags_restored():
    """Every test leaves the float32 precision flags and grad mode as it found them. The flags are part of every
    package-cache key: a test that changed one for the rest of its worker (the bench's `set_tf32` does) made later
    builds of the same program miss the run's cache, depending on the order xdist gave that worker."""
    from bench.common import kept_precision_flags

    with kept_precision_flags():
        yield


@pytest.fixture
def artifact_copy(tmp_path) -> Callable[[Path], Path]:
    """A writable copy of a built artifact, for fault-injection tests."""

    def copy(src: Path) -> Path:
        dst = tmp_path / src.name
        shutil.copytree(src, dst)
        return dst

    return copy
