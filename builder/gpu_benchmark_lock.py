"""One autotuning measurement at a time per GPU, across the compile workers of a build and across builds.

A CUDA build compiles its packages in `--jobs` worker processes (builder/parallel_compile.py), and AOTInductor
autotunes every Triton kernel with several configs (the conv GEMMs' tiles and split-Ks, the skinny GEMMs' splits) by
timing each one on the GPU at compile time. Timings taken while other workers' kernels run on the same GPU are
noise, and the winner is baked into the package for good: in the H100 profile of a `vae_decoder` built beside a
`dac_encoder`, 1×1 convs of one shape (17,280 × 128) ran 23.6-25 µs and 49.5 µs, and with this lock 24-30 µs
(bench/results/nvidia-h100/probes/codec_timeline; a near tie can still go the wrong way, the autotuner timing with a
cold L2). While a compile runs, `serialized_gpu_benchmarks` makes Inductor's autotuner
(`CachingAutotuner.benchmark_all_configs`, which times every config of one kernel) hold an exclusive `flock` on a
per-GPU lock file; compiling, the C++ build and everything else still run side by side (code2wav's 22 packages on
16 workers compiled in 352 s with it, 366 s without: probes/code2wav_build_lock)."""

from __future__ import annotations

import fcntl
import functools
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

_MARK = "_ttsaot_serialized"


def lock_path(device: torch.device) -> Path:
    """The lock file of one GPU, shared by every process on the host (the device's UUID where torch reports one:
    the same GPU under any CUDA_VISIBLE_DEVICES numbering)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    name = f"gpu-{uuid}" if uuid is not None else f"gpu{index}"
    return Path(tempfile.gettempdir()) / f"ttsaot-{name}.benchmarks.lock"


@contextmanager
def holding(path: Path) -> Iterator[None]:
    """Inside: an exclusive flock on `path` (created when missing; the lock goes with the process). The file is
    opened read-only (flock needs no write access: another user's lock file on a shared host still serves); where
    it cannot be opened at all, the body runs unlocked rather than failing the build."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def exclusive(fn: Callable[..., Any], path: Path) -> Callable[..., Any]:
    """`fn` run while `holding` the lock on `path`."""

    @functools.wraps(fn)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with holding(path):
            return fn(*args, **kwargs)

    setattr(locked, _MARK, True)
    return locked


@contextmanager
def serialized_gpu_benchmarks(device: torch.device) -> Iterator[None]:
    """Inside: Inductor's autotuning measurements on `device` hold its lock (see the module doc). Nothing changes
    off CUDA, or where this torch has no `CachingAutotuner.benchmark_all_configs`; nesting is harmless."""
    if device.type != "cuda":
        yield
        return
    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except ImportError:
        yield
        return
    original = getattr(CachingAutotuner, "benchmark_all_configs", None)
    if original is None or getattr(original, _MARK, False):
        yield
        return
    CachingAutotuner.benchmark_all_configs = exclusive(original, lock_path(device))
    try:
        yield
    finally:
        CachingAutotuner.benchmark_all_configs = original
