"""AOTI compiles in worker processes (`build --jobs N`): a stage's packages (one per bucket, or dynamic ones serving
several), and in a CPU build the packages of all stages together (builder/build.py `_compile_all`).

The parent exports every package (deterministic, and the package cache keys on the program) and hands each worker
the saved ExportedProgram: a worker only runs AOTInductor on it, writes the package where the serial build would,
and returns the constants the package binds. Workers are spawned, never forked: the parent has run eager forwards
on OpenMP / CUDA, which a forked child cannot use safely."""

from __future__ import annotations

import heapq
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import torch

from .export import CompileError, compile_bucket
from .saved_programs import load_program

# Set to a folder, every compile worker writes a cProfile of its compile there (`<stage>__<bucket>.prof`), read by
# `python -m bench.probes.build_profile` next to the parent's own profile (`python -m cProfile -o ... -m
# ttsaot.builder.cli build ...`): where a package's compile time goes (Inductor, Triton, autotuning, the C++ build).
PROFILE_DIR_ENV = "TTSAOT_BUILD_PROFILE_DIR"

GIB = 2**30
MEMORY_PER_JOB = 4 * GIB  # an AOTI compile of a full-size stage peaks at a few GiB (Inductor + the C++ compiler)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform has one, else the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def host_memory_bytes() -> int | None:
    """The host's physical memory (None where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def default_jobs() -> int:
    """As many compiles as the host's cores and memory allow: min(usable cores, physical memory / 4 GiB)."""
    cores = usable_cores()
    memory = host_memory_bytes()
    if memory is None:
        return max(1, cores)
    return max(1, min(cores, memory // MEMORY_PER_JOB))


@dataclass
class CompileTask:
    label: str  # "<stage>/<bucket>", named by any failure
    program: Path  # the bucket's ExportedProgram, saved (builder/saved_programs.py `save_program`)
    args: tuple
    device: torch.device
    package_path: Path
    model_name: str
    metadata: dict[str, str]
    extra_options: dict | None
    # time.time() when its worker finished, stamped by the pool as the result arrives: the parent may notice it
    # much later (it runs the deferred golden cases between polls), and the build log reports compile times from it
    finished_at: float | None = None
    # the stage's tensors, written once for all its programs (builder/saved_programs.py); None: `program` has them
    tensors: Path | None = None
    tensor_names: dict[str, str] = field(default_factory=dict)


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
    ep = load_program(task.program, task.tensors, task.tensor_names)
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


class CompilePool:
    """Compiles handed over while the caller goes on (a build exports its next stage while the workers compile the
    stages before it): `submit` queues a task, at most `jobs` run at once on spawned workers, the waiting task of
    the highest priority starts first (ties: submission order), and `poll` / `wait` run each finished task's
    `on_done(task, weights)` in the calling thread. The first failure raises CompileError naming the task from
    `poll` or `wait`; leaving the `with` block on an error (or an interrupt) cancels what has not started and
    terminates and joins the running workers, so nothing writes after the caller cleans up. The pool owns a
    temporary folder for the saved programs (`programs`)."""

    def __init__(self, jobs: int) -> None:
        self.jobs = max(1, jobs)
        self._cond = threading.Condition()
        self._waiting: list[tuple[float, int, CompileTask, Callable]] = []
        self._running = 0
        self._submitted = 0
        self._outstanding = 0
        self._finished: queue.Queue = queue.Queue()
        self._closing = False
        self._executor: ProcessPoolExecutor | None = None
        self._feeder: threading.Thread | None = None
        self._programs: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> CompilePool:
        self._programs = tempfile.TemporaryDirectory(prefix="ttsaot-programs-")
        self._executor = ProcessPoolExecutor(
            max_workers=self.jobs,
            mp_context=get_context("spawn"),
            initializer=_share_cores,
            initargs=(max(1, usable_cores() // self.jobs),),
        )
        self._feeder = threading.Thread(target=self._feed, name="ttsaot-compile-feeder", daemon=True)
        self._feeder.start()
        return self

    @property
    def programs(self) -> Path:
        """Where the caller saves the programs it submits (removed with the pool)."""
        assert self._programs is not None, "CompilePool used outside its with-block"
        return Path(self._programs.name)

    def submit(
        self,
        task: CompileTask,
        on_done: Callable[[CompileTask, dict[str, torch.Tensor]], None],
        priority: float = 0.0,
    ) -> None:
        with self._cond:
            heapq.heappush(self._waiting, (-priority, self._submitted, task, on_done))
            self._submitted += 1
            self._outstanding += 1
            self._cond.notify_all()

    def poll(self) -> None:
        """Run `on_done` of every task finished so far (never blocks); raise the first failure."""
        while True:
            try:
                item = self._finished.get_nowait()
            except queue.Empty:
                return
            self._handle(*item)

    def wait(self) -> None:
        """Block until every task submitted so far has finished, running their `on_done`."""
        while self._outstanding:
            self._handle(*self._finished.get())

    def wait_any(self, timeout: float | None = None) -> bool:
        """Block until a task finishes (unless one has since the last call), running `on_done` of each finished;
        with `timeout`, at most that many seconds. Whether one finished."""
        if not self._outstanding:
            raise RuntimeError("CompilePool.wait_any: no task is running or waiting")
        try:
            item = self._finished.get(timeout=timeout)
        except queue.Empty:
            return False
        self._handle(*item)
        self.poll()
        return True

    @property
    def outstanding(self) -> int:
        """Tasks submitted and not yet handled (waiting, running, or finished and not yet polled)."""
        return self._outstanding

    def _handle(self, task: CompileTask, on_done: Callable, fut: Future) -> None:
        self._outstanding -= 1
        try:
            weights = fut.result()
        except CompileError as e:
            raise CompileError(f"{task.label}: {e}") from e
        except Exception as e:  # noqa: BLE001 - a worker killed (memory, signal) or an unexpected error
            raise CompileError(f"{task.label}: compile worker failed: {type(e).__name__}: {e}") from e
        on_done(task, weights)

    def _feed(self) -> None:
        """Feeder thread: starts the waiting task of the highest priority whenever a worker is free (the executor's
        own queue is first come, first served: tasks go to it only as workers free up)."""
        while True:
            with self._cond:
                while not self._closing and (self._running >= self.jobs or not self._waiting):
                    self._cond.wait()
                if self._closing:
                    return
                task, on_done = self._next()
                self._running += 1
            try:
                fut = self._executor.submit(_compile_saved, task)
            except Exception as e:  # noqa: BLE001 - a broken or shut-down executor: reported like a failed compile
                fut = Future()
                fut.set_exception(e)
            fut.add_done_callback(lambda f, t=task, d=on_done: self._done(t, d, f))

    def _next(self) -> tuple[CompileTask, Callable]:
        """The waiting task to start next (the caller holds the lock)."""
        _, _, task, on_done = heapq.heappop(self._waiting)
        return task, on_done

    def _done(self, task: CompileTask, on_done: Callable, fut: Future) -> None:
        task.finished_at = time.time()
        self._finished.put((task, on_done, fut))
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    def __exit__(self, exc_type, exc, tb) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._feeder is not None:
            self._feeder.join()
        if exc_type is not None or self._outstanding:
            # A failure, Ctrl-C or SIGTERM (KeyboardInterrupt, builder/build.py): the running compiles are of no use
            # any more and may take minutes, so they are stopped rather than awaited (an H100 run killed by its time
            # box was killed again 10 s later while this waited on them); joined below, so none writes afterwards.
            _terminate_workers(self._executor)
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._programs.cleanup()


def compile_in_workers(
    tasks: list[CompileTask], jobs: int, on_done: Callable[[CompileTask, dict[str, torch.Tensor]], None]
) -> None:
    """Compile `tasks` (already saved) on `jobs` spawned processes, in list order; `on_done(task, weights)` runs in
    this process as each one finishes (CompilePool, which also says what a failure does)."""
    if not tasks:
        return
    with CompilePool(min(jobs, len(tasks))) as pool:
        for i, t in enumerate(tasks):
            pool.submit(t, on_done, priority=-i)
        pool.wait()


def _terminate_workers(pool: ProcessPoolExecutor) -> None:
    terminate = getattr(pool, "terminate_workers", None)  # Python ≥ 3.14
    if terminate is not None:
        terminate()
        return
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.terminate()


__all__ = ["CompilePool", "CompileTask", "compile_in_workers", "default_jobs"]
