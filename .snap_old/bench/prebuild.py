"""`python -m bench build`: build (or reuse) the artifacts that `bench run` would build, several stages at a time.

Building is CPU-bound (Inductor codegen + a C++ compile per bucket) and timing must run alone on the GPU, so on a
many-core GPU machine the artifacts are built first, in parallel processes, into the same cache `bench run`
reuses (bench/artifacts.py `build_or_reuse`, keyed by the stage options, torch, device kind and sources)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from .common import REPO, cuda_device, short_error


def _build_one(
    family: str,
    stage: str,
    preset: str,
    seed: int,
    dtype: str | None,
    device: str,
    cache_dir: str,
    kernels: str = "auto",
    axes: dict[str, tuple[int, ...]] | None = None,
    verify: bool = True,
    full_plan: bool = False,
    package_cache: str | None = None,
    compile_jobs: int = 1,
) -> dict:
    import torch

    from .artifacts import build_or_reuse
    from .specs import make_spec

    t0 = time.time()
    try:
        spec, desc = make_spec(
            family,
            stage,
            preset,
            seed=seed,
            axes=axes,
            dtype=dtype,
            kernels=kernels,
            full_plan=full_plan,
            device=str(device),
        )
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", 0)
        path, info = build_or_reuse(
            spec,
            desc,
            dev,
            Path(cache_dir),
            verify=verify,
            package_cache=Path(package_cache) if package_cache else None,
            jobs=compile_jobs,
        )
        return {"stage": f"{family}/{stage}", "dtype": dtype, "kernels": kernels, "ok": True, "path": str(path), **info}
    except Exception as e:  # noqa: BLE001 - one failed build must not stop the others; bench run records it
        return {
            "stage": f"{family}/{stage}",
            "dtype": dtype,
            "kernels": kernels,
            "ok": False,
            "error": short_error(e),
            "seconds": round(time.time() - t0, 1),
        }


def add_parser(sub) -> None:
    p = sub.add_parser("build", help="build the bench artifacts of several stages in parallel (no timing)")
    p.add_argument(
        "targets",
        nargs="+",
        metavar="FAMILY/STAGE[:DTYPE]",
        help="e.g. fish-s2-pro/dac_decoder fish-s2-pro/dac_decoder:bf16 voxcpm2/locdit",
    )
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 4))
    p.add_argument("--preset", default=None, help="full (default on CUDA) or tiny")
    p.add_argument("--device", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", default=str(REPO / "bench" / ".cache"))
    p.add_argument(
        "--package-cache",
        default=None,
        metavar="DIR",
        help="the builder's per-package cache to reuse packages from and add to (e.g. shared with codec-stages)",
    )
    p.add_argument(
        "--axis",
        action="append",
        default=None,
        metavar="NAME=SIZES",
        help="bucket sizes of an axis, as `run`/`profile --axis` (default: the bench's buckets)",
    )
    p.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="skip the builder's subprocess verification of each artifact (saves a load per build)",
    )
    p.add_argument(
        "--kernels",
        type=lambda v: [k.strip() for k in v.split(",") if k.strip()],
        default=["auto"],
        help="kernel choices to build each target with, e.g. auto,inductor (what `run` measures as "
        "ttsaot_graph and ttsaot_inductor)",
    )


def parse_target(text: str) -> tuple[str, str, str | None]:
    name, _, dtype = text.partition(":")
    family, sep, stage = name.partition("/")
    if not sep or not family or not stage:
        raise argparse.ArgumentTypeError(f"expected FAMILY/STAGE[:DTYPE], got {text!r}")
    return family, stage, dtype or None


def main(a) -> int:
    import torch

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    preset = a.preset or ("full" if device.startswith("cuda") else "tiny")
    cuda_device(device)  # sets the compiler AOTI builds use on CUDA
    from .specs import parse_axes

    targets = [parse_target(t) for t in a.targets]
    axes = parse_axes(a.axis) or None
    tasks = [
        dict(
            family=f,
            stage=s,
            preset=preset,
            seed=a.seed,
            dtype=d,
            device=device,
            cache_dir=a.cache_dir,
            kernels=k,
            axes=axes,
            verify=a.verify,
            package_cache=a.package_cache,
        )
        for f, s, d in targets
        for k in a.kernels
    ]
    results = build_many(tasks, a.jobs)
    return 1 if any(not r["ok"] for r in results) else 0


def build_many(
    tasks: list[dict], jobs: int, threads_per_job: int | None = None, timeout: float | None = None
) -> list[dict]:
    """Run `_build_one(**task)` for every task on up to `jobs` spawned processes; the results in task order.
    threads_per_job: torch/OpenMP/Inductor threads of each build (default: the cores shared between the jobs).
    timeout: seconds for all of them; the builds still running then are killed (with their compile workers) and
    their results say `skipped`."""
    # Share the cores between the builds: each build's torch threads and Inductor compile workers default to the
    # whole machine, and 12 such builds on a 64-core H200 host finished none in 270 s (seen 2026-11-21).
    jobs = max(1, min(jobs, len(tasks)))
    per_job = str(threads_per_job or max(1, (os.cpu_count() or jobs) // jobs))
    for var in ("TORCHINDUCTOR_COMPILE_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = per_job
    # spawn: each build in a fresh interpreter (no CUDA context inherited through fork)
    import multiprocessing as mp
    import signal
    from concurrent.futures import TimeoutError as FuturesTimeout

    results: list[dict | None] = [None] * len(tasks)
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"))

    def kill_all() -> None:
        for proc in list(getattr(pool, "_processes", {}).values()):
            _kill_tree(proc.pid)

    def stop(signum, frame):  # a timeout killing this process must not leave builds running on
        kill_all()
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        futs = {pool.submit(_build_one, **task): i for i, task in enumerate(tasks)}
        try:
            for fut in as_completed(futs, timeout=timeout):
                r = fut.result()
                results[futs[fut]] = r
                print(
                    f"[bench build] {r['stage']}{':' + r['dtype'] if r['dtype'] else ''} "
                    f"(kernels={r['kernels']}): {'ok' if r['ok'] else 'FAILED'} {r.get('seconds')} s "
                    f"{'(cached)' if r.get('cached') else ''}{r.get('error', '')}",
                    file=sys.stderr,
                    flush=True,
                )
        except FuturesTimeout:
            kill_all()
            for i, task in enumerate(tasks):
                if results[i] is None:
                    results[i] = {
                        "stage": f"{task['family']}/{task['stage']}",
                        "dtype": task.get("dtype"),
                        "kernels": task.get("kernels", "auto"),
                        "ok": False,
                        "skipped": f"not built within the {timeout:.0f} s build budget",
                    }
    finally:
        signal.signal(signal.SIGTERM, previous)
        pool.shutdown(wait=False, cancel_futures=True)
    return [r for r in results if r is not None]


def _kill_tree(pid: int) -> None:
    """SIGKILL `pid` and its descendants (a build's compile workers, found through /proc before the kill)."""
    import signal

    children: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            children += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for child in children:
        _kill_tree(child)
