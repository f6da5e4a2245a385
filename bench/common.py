"""Shared helpers: environment facts, timing (CUDA events or perf_counter), time boxes, JSON I/O, worker
processes."""

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
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ttsaot.runtime.metrics import rel_error as rel_err  # noqa: F401  (the bench's name for the one metric)

REPO = Path(__file__).resolve().parents[1]
GPU_CXX = "/usr/bin/g++"  # AOTI packages built with the GPU machine's preset $CXX wrapper segfault on load


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


def set_tf32(on: bool) -> None:
    """cuDNN convolutions and cuBLAS matmuls in TF32 (on) or exact fp32 (off), for the runs that follow."""
    torch.backends.cudnn.allow_tf32 = on
    torch.backends.cuda.matmul.allow_tf32 = on


@contextlib.contextmanager
def kept_precision_flags():
    """The caller's float32 precision flags (matmul precision, the TF32 switches) and grad mode as they were after
    the block, whatever the block switched inside it: the flags are part of every package-cache key
    (builder/package_cache.py `_environment`), so a leaked one made later builds in the same process miss it. The
    bench's runs and every test (tests/conftest.py) are wrapped in it."""
    saved = (
        torch.get_float32_matmul_precision(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.is_grad_enabled(),
    )
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[1:3]
        torch.set_grad_enabled(saved[3])


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


def failure(e: BaseException) -> dict[str, Any]:
    """A recorded reason: skipped (cannot run here), timeout (over a budget), OOM, or failed."""
    msg = str(e)
    if isinstance(e, BudgetExceeded) or "exceeded its" in msg:
        return {"status": "timeout", "reason": msg.splitlines()[0][:400] if msg else "over its budget"}
    if isinstance(e, Skipped):
        return {"status": "skipped", "reason": msg}
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return {"status": "failed", "reason": f"OOM: {short_error(e)}"}
    return {"status": "failed", "reason": short_error(e)}


def cuda_device(device: str | torch.device) -> torch.device:
    """`cuda` → `cuda:0`; on CUDA also the compiler AOTI builds use, before anything compiles."""
    d = torch.device(device)
    if d.type == "cuda":
        if "CXX" not in os.environ and Path(GPU_CXX).exists():
            os.environ["CXX"] = GPU_CXX
        if d.index is None:
            d = torch.device("cuda", 0)
    return d


def child_env(device: str, **extra: str) -> dict[str, str]:
    """The environment of a bench worker process: this checkout first on the path; CPU runs share small
    machines (one Inductor compile thread); CUDA builds use GPU_CXX."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if not device.startswith("cuda"):
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    elif "CXX" not in env and Path(GPU_CXX).exists():
        env["CXX"] = GPU_CXX
    return env


INTERRUPTED = 130  # spawn's rc when this process was interrupted (SIGINT) while its worker ran


def spawn(cmd: list[str], env: dict, timeout: float, log_path: Path | None = None) -> tuple[int, str]:
    """Run a worker in its own session (a timeout kills it and its children, never anything else), echo its
    progress lines, keep its whole output in `log_path`; return (rc, the last line of output). A SIGINT to this
    process (a device plan's `timeout -s INT`) kills the worker too and returns INTERRUPTED, so the caller can
    keep what the worker had written before it re-raises (the worker, in its own session, never sees the signal)."""
    import selectors

    tail: list[str] = []
    log = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "w")  # noqa: SIM115 - closed below
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=str(REPO),
            start_new_session=True,
        )
    except Exception as e:  # noqa: BLE001
        return 1, short_error(e)
    deadline = time.time() + timeout
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    killed = interrupted = False
    while True:
        if time.time() > deadline and proc.poll() is None and not killed:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            killed = True
        try:
            ready = sel.select(timeout=1.0)
        except KeyboardInterrupt:  # the timeout's kill above, at once
            interrupted, deadline = True, 0.0
            continue
        if ready:
            line = proc.stdout.readline()
            if line:
                if log is not None:
                    log.write(line)
                if line.startswith("[bench]") or "Error" in line or "Traceback" in line:
                    sys.stderr.write("  " + line)
                tail = (tail + [line.rstrip()])[-20:]
                continue
        if proc.poll() is not None:
            rest = proc.stdout.read()
            if rest:
                tail = (tail + rest.rstrip().splitlines())[-20:]
                if log is not None:
                    log.write(rest)
            break
    rc = proc.wait()
    if log is not None:
        log.close()
    last = next((ln for ln in reversed(tail) if ln.strip() and not ln.startswith("[bench]")), "")
    if interrupted:
        return INTERRUPTED, f"interrupted (SIGINT) while running; last output: {last[:300]}"
    if killed:
        return 124, f"killed after the {timeout:.0f} s stage timeout; last output: {last[:300]}"
    if rc < 0:
        return rc, f"killed by signal {-rc} (crash or OOM); last output: {last[:300]}"
    return rc, last[:400]


def csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def ints(value: str) -> list[int]:
    return [int(v) for v in csv(value)]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
