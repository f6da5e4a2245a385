"""AOTI compiles in worker processes (`build --jobs N`): a stage's packages (one per bucket, or dynamic ones serving
several), and in a CPU build the packages of all stages together (builder/build.py `_compile_all`).

The parent exports every package (deterministic, and the package cache keys on the program) and hands each worker
the saved ExportedProgram: a worker only runs AOTInductor on it, writes the package where the serial build would,
and returns the constants the package binds. Workers are spawned, never forked: the parent has run eager forwards
on OpenMP / CUDA, which a forked child cannot use safely."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import torch

from .export import CompileError, compile_bucket

# Set to a folder, every compile worker writes a cProfile of its compile there (`<stage>__<bucket>.prof`), read by
# `python -m bench.probes.build_profile` next to the parent's own profile (`python -m cProfile -o ... -m
# ttsaot.builder.cli build ...`): where a package's compile time goes (Inductor, Triton, autotuning, the C++ build).
PROFILE_DIR_ENV = "TTSAOT_BUILD_PROFILE_DIR"

GIB = 2**30
MEMORY_PER_JOB = 4 * GIB  # an AOTI compile of a full-size stage peaks at a few GiB (Inductor + the C++ compiler)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_jobs() -> int:
    """As many compiles as the host's cores and memory allow: min(usable cores, physical memory / 4 GiB)."""
    cores = _cores()
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return max(1, cores)
    return max(1, min(cores, memory // MEMORY_PER_JOB))


@dataclass
class CompileTask:
    label: str  # "<stage>/<bucket>", named by any failure
    program: Path  # torch.export.save of the bucket's ExportedProgram
    args: tuple
    device: torch.device
    package_path: Path
    model_name: str
    metadata: dict[str, str]
    extra_options: dict | None


# Inductor gives every process a pool of Triton compile workers as large as the host's cores (capped at 32): with
# `--jobs` compiles side by side, 16 compiles on 16 cores could start up to 256 of them, each importing torch and
# Triton.
COMPILE_THREADS_ENV = "TORCHINDUCTOR_COMPILE_THREADS"


def _share_cores(threads: int) -> None:
    """Worker initializer: this compile's share of the host's cores as its Inductor compile workers (the pool is
    made at the first compile, from the config), unless the user set TORCHINDUCTOR_COMPILE_THREADS."""
    if COMPILE_THREADS_ENV not in os.environ:
        from torch._inductor import config

        config.compile_threads = threads


def _compile_saved(task: CompileTask) -> dict[str, torch.Tensor]:
    folder = os.environ.get(PROFILE_DIR_ENV)
    if not folder:
        return _compile_program(task)
    import cProfile

    profile = cProfile.Profile()
    try:
        return profile.runcall(_compile_program, task)
    finally:
        Path(folder).mkdir(parents=True, exist_ok=True)
        profile.dump_stats(Path(folder) / f"{task.label.replace('/', '__')}.prof")


def _compile_program(task: CompileTask) -> dict[str, torch.Tensor]:
    ep = torch.export.load(str(task.program))
    cb = compile_bucket(
        None,
        task.args,
        task.device,
        task.package_path,
        model_name=task.model_name,
        metadata=task.metadata,
        extra_options=task.extra_options,
        exported=ep,
    )
    return cb.weights


def compile_in_workers(
    tasks: list[CompileTask], jobs: int, on_done: Callable[[CompileTask, dict[str, torch.Tensor]], None]
) -> None:
    """Compile `tasks` on `jobs` spawned processes; `on_done(task, weights)` runs in this process as each one
    finishes. The first failure (or an interrupt) cancels what has not started, terminates the running ones and
    joins them (so nothing writes after the caller cleans up), then raises CompileError naming the task (or lets
    the interrupt through)."""
    if not tasks:
        return
    workers = min(jobs, len(tasks))
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=get_context("spawn"),
        initializer=_share_cores,
        initargs=(max(1, _cores() // workers),),
    )
    finished = False
    try:
        futures: dict[Future, CompileTask] = {pool.submit(_compile_saved, t): t for t in tasks}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                task = futures[fut]
                try:
                    weights = fut.result()
                except CompileError as e:
                    raise CompileError(f"{task.label}: {e}") from e
                except Exception as e:  # noqa: BLE001 - a worker killed (memory, signal) or an unexpected error
                    raise CompileError(f"{task.label}: compile worker failed: {type(e).__name__}: {e}") from e
                on_done(task, weights)
        finished = True
    finally:
        if not finished:
            # A failure, Ctrl-C or SIGTERM (KeyboardInterrupt, builder/build.py): the running compiles are of no use
            # any more and may take minutes, so they are stopped rather than awaited (an H100 run killed by its time
            # box was killed again 10 s later while this waited on them); joined below, so none writes afterwards.
            _terminate_workers(pool)
        pool.shutdown(wait=True, cancel_futures=True)


def _terminate_workers(pool: ProcessPoolExecutor) -> None:
    terminate = getattr(pool, "terminate_workers", None)  # Python ≥ 3.14
    if terminate is not None:
        terminate()
        return
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.terminate()


__all__ = ["CompileTask", "compile_in_workers", "default_jobs"]
