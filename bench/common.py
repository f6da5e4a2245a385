"""Shared helpers: environment facts, timing (CUDA events or perf_counter), time boxes, JSON I/O."""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import platform
import re
import signal
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ttsaot.runtime.metrics import rel_error as rel_err  # noqa: F401  (the bench's name for the one metric)

REPO = Path(__file__).resolve().parents[1]


class Skipped(Exception):
    """A variant or measurement that cannot run here; the message is recorded as the reason."""


class BudgetExceeded(Skipped):
    pass


# ------------------------------------------------------------------------------------------ environment
def git_commit() -> str:
    """HEAD of the checkout, read from .git without running git (BENCH_GIT_COMMIT overrides: the GPU machine
    receives a copy of the working tree without .git)."""
    env = os.environ.get("BENCH_GIT_COMMIT")
    if env:
        return env
    gitdir = REPO / ".git"
    try:
        if gitdir.is_file():  # worktree: "gitdir: <path>"
            gitdir = Path(gitdir.read_text().split(":", 1)[1].strip())
        head = (gitdir / "HEAD").read_text().strip()
        if head.startswith("ref:"):
            ref = head.split(":", 1)[1].strip()
            # a worktree's branch refs live in the main repository's git dir (named by its `commondir`)
            common = gitdir / "commondir"
            roots = [gitdir] + ([(gitdir / common.read_text().strip()).resolve()] if common.is_file() else [])
            for root in roots:
                if (root / ref).is_file():
                    return (root / ref).read_text().strip()
                packed = root / "packed-refs"
                if packed.is_file():
                    for line in packed.read_text().splitlines():
                        if line.endswith(" " + ref):
                            return line.split()[0]
            return "unknown"
        return head
    except OSError:
        return "unknown"


def slugify(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def device_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "type": device.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": f"{platform.system()}-{platform.machine()}",
        "host_cpus": os.cpu_count(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        info["triton"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["name"] = props.name
        info["sm"] = f"{props.major}.{props.minor}"
        info["memory_gib"] = round(props.total_memory / 2**30, 1)
        info["multiprocessors"] = props.multi_processor_count
        info["driver"] = _nvidia_driver()
    else:
        info["name"] = f"cpu-{platform.machine()}"
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        info["threads"] = torch.get_num_threads()
    info["slug"] = slugify(info["name"]) if device.type == "cuda" else slugify(f"cpu-{platform.machine()}")
    return info


def _nvidia_driver() -> str | None:
    try:
        import subprocess

        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
        return out.splitlines()[0] if out else None
    except Exception:  # noqa: BLE001
        return None


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def source_hash(*folders: str) -> str:
    """sha256 over the Python sources of the given repo folders: cached artifacts are rebuilt when the
    builder or runtime changes."""
    h = hashlib.sha256()
    for folder in folders:
        for p in sorted((REPO / folder).rglob("*.py")):
            h.update(str(p.relative_to(REPO)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_json_default))
    os.replace(tmp, path)


def _json_default(o):
    if isinstance(o, torch.dtype):
        return str(o).removeprefix("torch.")
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, tuple | set):
        return list(o)
    return repr(o)


# ------------------------------------------------------------------------------------------------ timing
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], Any], device: torch.device, warmup: int, reps: int) -> dict[str, float]:
    """Median (and spread) of `reps` individually timed calls after `warmup` calls. CUDA: events around each
    call on the current stream; CPU: perf_counter."""
    for _ in range(warmup):
        fn()
    sync(device)
    times: list[float] = []
    if device.type == "cuda":
        pairs = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            pairs.append((s, e))
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) for s, e in pairs]
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {
        "ms": statistics.median(times),
        "min_ms": times[0],
        "p10_ms": times[int(0.1 * (len(times) - 1))],
        "p90_ms": times[int(0.9 * (len(times) - 1))],
        "reps": reps,
        "timer": "cuda_events" if device.type == "cuda" else "perf_counter",
    }


@contextlib.contextmanager
def time_box(seconds: float | None, what: str):
    """Raise BudgetExceeded if the block runs longer than `seconds` (SIGALRM, main thread only). Compiles are
    mostly Python, so the alarm lands; a stuck C call is still bounded by the parent's per-stage timeout."""
    if not seconds or seconds <= 0 or not hasattr(signal, "setitimer"):
        yield
        return

    def handler(signum, frame):
        raise BudgetExceeded(f"{what} exceeded its {seconds:.0f} s budget")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def as_tuple(x) -> tuple:
    return x if isinstance(x, tuple | list) else (x,)


def tensor_bytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))


def short_error(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:400] if msg else ''}"


def graph_replay_ms(calls: list[Callable[[], Any]], reps: int, warm_replays: int = 3) -> float:
    """Median ms per call of one CUDA graph (runtime.graphs.StaticGraph) that makes `calls` in order: launch gaps
    removed, the bench's one timing of captured call sequences."""
    from ttsaot.runtime.graphs import StaticGraph

    def body(_inputs):
        for c in calls:
            c()

    graph = StaticGraph(body, [], device=torch.device("cuda"), warmup_calls=1)
    for _ in range(warm_replays):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph
    return statistics.median(times) / len(calls)
