"""CPU latency of one stage call by OpenMP thread count, on an idle and on a loaded machine (issue 19, item 4).

    python -m bench.cpu_threads [--artifact DIR] [--calls 30] [--out bench/results/cpu/<host>.json]

Without --artifact it builds the `make demo` code2wav artifact (tiny qwen3-tts-12hz, fp32, batch 1,2 × frames
16,48) with `build-artifacts`. Calls are B=2, F=16 through the public API (`load(..., cpu_threads=n)`). "default"
is `cpu_threads=None`: the process's torch/OMP setting (torch.get_num_threads() at start). Conditions: "as_found"
(whatever else runs on the machine) and "plus_busy" (`--load-procs` busy-loop processes added beside the
measurement). The machine's other work is not controlled here: the JSON records the 1-minute load average before
each condition, so an "as_found" run on a shared machine is not an idle one.
`cpu_per_wall` (process CPU time / wall time over the timed calls) shows how many threads really ran."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUSY_LOOP = "while True: pass"
# Run in a fresh process: OS threads before and after package calls with `cpu_threads=n`. OpenMP starts its worker
# threads on the first parallel region that asks for them, so n - 1 new threads show the packages' OpenMP team
# follows the runtime's per-call setting (torch and the packages share torch's libgomp).
TEAM_PROBE = """
import os, sys, torch
from ttsaot.runtime import load
st = load(sys.argv[1], stages=["code2wav"], cpu_threads=int(sys.argv[2]))["code2wav"]
before = len(os.listdir("/proc/self/task"))
for _ in range(3):
    st(torch.randint(0, 64, (2, 16, 16)))
print(len(os.listdir("/proc/self/task")) - before)
"""


def physical_cores() -> int:
    """Distinct (package, core) pairs in /proc/cpuinfo; os.cpu_count() where that is unavailable."""
    try:
        pairs, phys = set(), None
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("physical id"):
                phys = line.split(":")[1].strip()
            elif line.startswith("core id"):
                pairs.add((phys, line.split(":")[1].strip()))
        return len(pairs) or (os.cpu_count() or 1)
    except OSError:
        return os.cpu_count() or 1


def build_demo_artifact(out: Path) -> Path:
    cli = Path(sys.executable).with_name("build-artifacts")
    subprocess.run(
        [
            str(cli),
            "build",
            "qwen3-tts-12hz",
            "--stages",
            "code2wav",
            "--preset",
            "tiny",
            "--random-weights",
            "--device",
            "cpu",
            "--dtype",
            "fp32",
            "--batch-buckets",
            "1,2",
            "--frame-buckets",
            "16,48",
            "--chunk-frames",
            "16",
            "--left-context-frames",
            "32",
            "--nonstreaming-chunk-frames",
            "0",
            "--out",
            str(out),
        ],
        check=True,
    )
    return out / "qwen3-tts-12hz"


def time_calls(stage, codes, calls: int, warmup: int = 3) -> dict:
    for _ in range(warmup):
        stage(codes)
    times = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(calls):
        t0 = time.perf_counter()
        stage(codes)
        times.append((time.perf_counter() - t0) * 1e3)
    wall = time.perf_counter() - wall0
    times.sort()
    return {
        "median_ms": round(statistics.median(times), 2),
        "p90_ms": round(times[int(0.9 * (len(times) - 1))], 2),
        "min_ms": round(times[0], 2),
        "max_ms": round(times[-1], 2),
        "cpu_per_wall": round((time.process_time() - cpu0) / wall, 2),
        "calls": calls,
    }


def main(argv: list[str] | None = None) -> int:
    import torch

    from ttsaot.runtime import load

    p = argparse.ArgumentParser(prog="python -m bench.cpu_threads")
    p.add_argument("--artifact", type=Path, default=None, help="a qwen3-tts-12hz artifact dir (default: build one)")
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--load-procs", type=int, default=1, help="busy-loop processes for the loaded condition")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)

    default_threads = torch.get_num_threads()
    cores = physical_cores()
    settings = {"default": None, "1": 1, f"physical_cores={cores}": cores}
    tmp = None
    art = a.artifact
    if art is None:
        tmp = tempfile.TemporaryDirectory(prefix="ttsaot-cpu-threads-")
        art = build_demo_artifact(Path(tmp.name))
    codes = torch.randint(0, 64, (2, 16, 16), generator=torch.Generator().manual_seed(0))
    result = {
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "logical_cpus": os.cpu_count(),
        "physical_cores": cores,
        "torch": torch.__version__,
        "default_torch_threads": default_threads,
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "stage": "qwen3-tts-12hz code2wav (tiny, fp32), B=2 F=16",
        "conditions": {},
    }
    result["omp_worker_threads_started"] = {
        str(n): int(
            subprocess.run(
                [sys.executable, "-c", TEAM_PROBE, str(art), str(n)], capture_output=True, text=True, check=True
            ).stdout.split()[-1]
        )
        for n in sorted({1, cores})
    }
    print(f"OS threads started by package calls, by cpu_threads: {result['omp_worker_threads_started']}")
    stages = {name: load(art, stages=["code2wav"], cpu_threads=n)["code2wav"] for name, n in settings.items()}
    ref = stages["default"](codes)
    for name, st in stages.items():  # thread count must not change the result beyond kernel-order noise
        assert torch.allclose(st(codes), ref, rtol=1e-4, atol=1e-5), name
    for load_name, procs in (("as_found", 0), ("plus_busy", a.load_procs)):
        busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(procs)]
        try:
            time.sleep(1.0 if procs else 0.0)
            for name, st in stages.items():
                key = f"{load_name}/{name}"
                rec = {"loadavg_1m_before": round(os.getloadavg()[0], 2), "busy_loop_procs": procs}
                rec.update(time_calls(st, codes, a.calls))
                result["conditions"][key] = rec
                print(
                    f"{key:32s} {rec['median_ms']:9.2f} ms median  p90 {rec['p90_ms']:9.2f}  max "
                    f"{rec['max_ms']:9.2f}  cpu/wall {rec['cpu_per_wall']:.2f}  (load {rec['loadavg_1m_before']})",
                    flush=True,
                )
        finally:
            for b in busy:
                b.kill()
                b.wait()
    if tmp is not None:
        tmp.cleanup()
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
