"""Shared by the GPU tests: how their artifacts are built.

Every fixture artifact is built once per test run, whichever xdist workers need it (`tests/conftest.built_artifact`:
a module fixture is otherwise set up again on every worker that runs one of the module's tests, and with `-n 8`
the Fish DAC and VoxCPM2-audio fixtures serve three tests each, code2wav's and the VoxCPM2 LM's two).
Every GPU build goes through one package cache that outlives the run (`GPU_CACHE_ENV`, default
`.pytest_artifacts/gpu-package-cache`): a re-run after a change recompiles only the packages the change touches
(issue 17: "developers pay on every change"). The cache is content-addressed (builder/package_cache.py: the key
covers the exported program, the kernel sources, the toolchain) and every reused package still passes the build's
subprocess load check and golden cases, so a stale entry cannot be served. Each build bounds it to
`GPU_CACHE_MAX_BYTES`, least recently used entries first (builder/cache_prune.py). `TTSAOT_GPU_TEST_CACHE=off`
compiles everything, as a first run does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..conftest import CACHE, built_artifact

# The fixtures' builds compile their packages on this many workers: with -n 8 on the 16-core H100 host their
# serial compiles were the suite's critical path (code2wav's fixture 158 s, the VoxCPM2 LM's 136 s: gpu_suite run4).
GPU_BUILD_JOBS = 4
GPU_CACHE_ENV = "TTSAOT_GPU_TEST_CACHE"
GPU_CACHE_MAX_BYTES = 5 * 10**9  # a cold run of the suite stores ~135 MB (gpu_suite run6)


def gpu_package_cache() -> Path | None:
    """The GPU tests' package cache (None when `TTSAOT_GPU_TEST_CACHE=off`)."""
    where = os.environ.get(GPU_CACHE_ENV, "")
    if where.lower() in ("off", "0", "none"):
        return None
    return Path(where) if where else CACHE / "gpu-package-cache"


def build_on_gpu(family: str, specs: Sequence, out: str | Path, **kw) -> Path:
    """`build_family(..., "cuda")` with the GPU tests' compile workers and package cache; the artifact's path."""
    from ttsaot.builder.build import build_family

    kw = {"jobs": GPU_BUILD_JOBS, "cache_dir": gpu_package_cache(), "cache_max_bytes": GPU_CACHE_MAX_BYTES, **kw}
    return build_family(family, list(specs), out, "cuda", **kw).path


# The VoxCPM2 LM steps' cache length in the GPU tests: the LM fixture's fp32 steps serve the end-to-end test's too
# (one compile of each, through the package cache)
VOXCPM2_LM_MAX_LEN = 32


def code2wav_options(dtype, batch_buckets: tuple[int, ...] = (1, 2), frame_buckets: tuple[int, ...] = (16,)):
    """The GPU tests' code2wav builds (its fixture's and the ONNX tests'): a package of the same bucket and dtype is
    compiled once for both (the package cache), and each costs the CPU-bound cold suite ~60-100 CPU seconds
    (bench/results/nvidia-h200/probes/gpu_suite_cpu/)."""
    from ttsaot.builder.buckets import StreamingConfig
    from ttsaot.builder.families.qwen3_tts_12hz.options import Qwen3TTSOptions

    return Qwen3TTSOptions(
        dtype=dtype, batch_buckets=batch_buckets, frame_buckets=frame_buckets, streaming=StreamingConfig(8, 8, 0, 0)
    )


def gpu_artifact(name: str, family: str, specs: Sequence, **kw) -> Path:
    """A fixture's artifact: built by the first worker that asks (`build_on_gpu`), reused by every other."""
    return built_artifact(f"gpu-{name}", lambda root: build_on_gpu(family, specs, root, **kw))
