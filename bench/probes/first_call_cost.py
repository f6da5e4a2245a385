"""Probe (issue 17): what a bucket package's first call costs at load, where the runtime's warm-up call before
each graph capture spends 50-140 ms per package whatever its size (Fish dac_decoder, 18 packages:
../results/nvidia-h200/probes/coldstart_warmups/).

    python -m bench.probes.first_call_cost --artifact DIR/FAMILY --stage STAGE --out OUT [--child]

Loads the stage without CUDA graphs, then per bucket: the first and second call of its package (synchronised),
the package archive's kernel binaries (count, bytes); the first call of the second bucket under torch.profiler
(CPU + CUDA activities: the driver calls it makes, summed by name). Run once as is and once (a child process) with
CUDA_MODULE_LOADING=EAGER, where the driver loads every kernel when a module is loaded instead of at first launch.
Writes OUT/first_call_cost.json."""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any


def measure(artifact: Path, stage: str) -> dict[str, Any]:
    import torch

    from ttsaot.runtime import load

    dev = torch.device("cuda")
    torch.zeros(1, device=dev)  # CUDA context before the clock
    t0 = time.perf_counter()
    bundle = load(artifact, device=dev, stages=[stage], cuda_graphs=False)
    st = bundle[stage]
    out: dict[str, Any] = {"load_s": time.perf_counter() - t0, "load_stats": st.load_stats, "buckets": {}}
    runners = list(st._runners.items())
    for i, (key, r) in enumerate(runners):
        xs = [torch.zeros(s, dtype=spec.torch_dtype, device=dev) for spec, s in zip(st.entry.inputs, r.shapes)]
        with zipfile.ZipFile(r.model.path) as z:
            bins = [i for i in z.infolist() if i.filename.endswith((".cubin", ".fatbin", ".hsaco"))]
        rec: dict[str, Any] = {"kernel_files": len(bins), "kernel_bytes": sum(b.file_size for b in bins)}
        torch.cuda.synchronize(dev)
        if i == 1:  # one first call under the profiler (the first bucket's may include one-off process set-up)
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                t = time.perf_counter()
                r.call(xs)
                torch.cuda.synchronize(dev)
                rec["first_ms_profiled"] = (time.perf_counter() - t) * 1e3
            sums: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
            for e in prof.events():
                if e.device_type.name == "CPU":
                    sums[e.name][0] += 1
                    sums[e.name][1] += e.self_cpu_time_total / 1e3
            rec["profile_cpu_ms_by_name"] = {
                k: {"calls": v[0], "self_ms": round(v[1], 3)}
                for k, v in sorted(sums.items(), key=lambda kv: -kv[1][1])[:30]
            }
        else:
            t = time.perf_counter()
            r.call(xs)
            torch.cuda.synchronize(dev)
            rec["first_ms"] = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        r.call(xs)
        torch.cuda.synchronize(dev)
        rec["second_ms"] = (time.perf_counter() - t) * 1e3
        out["buckets"][key] = rec
        print(f"{key}: {json.dumps({k: v for k, v in rec.items() if k != 'profile_cpu_ms_by_name'})}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifact", type=Path, required=True)
    ap.add_argument("--stage", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--child", action="store_true", help="measure in this process and print the JSON")
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(measure(a.artifact, a.stage)), flush=True)
        return
    res: dict[str, Any] = {}
    for mode in ("LAZY", "EAGER"):
        env = dict(os.environ, CUDA_MODULE_LOADING=mode)
        cmd = [sys.executable, "-m", "bench.probes.first_call_cost", "--artifact", str(a.artifact), "--stage",
               a.stage, "--out", str(a.out), "--child"]  # fmt: skip
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        print(f"== CUDA_MODULE_LOADING={mode} (rc {p.returncode})\n{p.stdout[-3000:]}{p.stderr[-1500:]}", flush=True)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        res[mode] = json.loads(line[7:]) if line else {"error": p.stderr[-1500:]}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "first_call_cost.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
