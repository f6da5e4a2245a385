"""Cold start: process start → first output, in a fresh subprocess.

ttsaot:   import torch + ttsaot.runtime → load (validate, weights, bind every bucket, capture every graph) →
          first call → output on the host.
compile:  import torch + builder → module construction with random weights (stands in for reading a
          checkpoint) → torch.compile + warm-up (+ manual CUDA-graph capture in the vLLM-Omni mode) →
          first call, with an EMPTY Inductor cache (a fresh machine). Only the primary shape is compiled, so
          this is a lower
          bound for a server that must serve several shapes; ttsaot loads all of its buckets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import REPO, short_error


def child_main(a) -> None:
    """Runs in the fresh process; prints one JSON line. `a.t_spawn` is the parent's time.time() at spawn."""
    t_start = time.time()  # `python -m bench` has imported torch by now (bench.common)
    import torch

    device = torch.device(a.device)
    out: dict[str, Any] = {"mode": a.mode}
    inputs = torch.load(a.inputs)
    if a.mode == "ttsaot":
        from ttsaot.runtime import graphs, load

        if a.warmup_calls is not None:  # an A/B of the calls before each capture (bench/probes/coldstart_warmups.py)
            graphs.WARMUP_CALLS = a.warmup_calls
        t0 = time.time()
        bundle = load(a.artifact, device=device, stages=[a.stage])
        stage = bundle[a.stage]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out["load_s"] = time.time() - t0
        # where the load went: manifest + file checks, weights, package loads, warm-up calls + graph captures
        out["load_stats"] = {**bundle.load_stats, **stage.load_stats}
        out["bucket_load_stats"] = stage.bucket_load_stats
        out["buckets_loaded"] = len(stage.buckets)
        out["cuda_graphs"] = stage.uses_cuda_graphs
        t0 = time.time()
        y = stage(*[x.to(device) for x in inputs])
    else:
        torch.set_grad_enabled(False)
        from ttsaot.builder.build import prepare_modules
        from ttsaot.builder.passes import cast_to_compute_dtype

        from .specs import make_spec
        from .variants import capture_graph

        axes = {k: tuple(v) for k, v in json.loads(a.axes).items()} if a.axes else None
        spec, _ = make_spec(a.family, a.stage, a.preset, seed=a.seed, axes=axes, dtype=a.dtype)
        t0 = time.time()
        _, m, _ = prepare_modules(spec, "inductor")
        m = cast_to_compute_dtype(m, spec.dtype).to(device).eval()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out["module_s"] = time.time() - t0
        t0 = time.time()
        c = torch.compile(m, mode=a.compile_mode, dynamic=False)
        xs = [x.to(device) for x in inputs]
        if device.type == "cuda" and a.compile_mode != "reduce-overhead":
            c(*xs)  # compile on the default stream, then capture (as bench/variants.py does)
            torch.cuda.synchronize(device)
            fn = capture_graph(c, [x.clone() for x in xs], device)
        elif a.compile_mode == "reduce-overhead":

            def fn(v):
                torch.compiler.cudagraph_mark_step_begin()
                return c(*v)

            for _ in range(3):
                fn(xs)
        else:

            def fn(v):
                return c(*v)

            fn(xs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out["compile_s"] = time.time() - t0
        out["compile_mode"] = a.compile_mode
        t0 = time.time()
        y = fn(xs)
    y = y[0] if isinstance(y, tuple | list) else y
    host = y.float().cpu()  # the output on the host = the first audio a client could receive
    t_end = time.time()
    out["output_sum"] = float(host.double().sum())  # tells two processes' outputs apart (A/B of load settings)
    out["first_call_ms"] = (t_end - t0) * 1e3
    out["first_output_s"] = t_end - a.t_spawn
    out["startup_s"] = t_start - a.t_spawn  # interpreter start + import torch
    print(json.dumps(out), flush=True)


def measure(
    mode: str,
    setup: dict,
    stage_res: dict,
    device: str,
    timeout: float,
    compile_mode: str,
    python: str = sys.executable,
    warmup_calls: int | None = None,
) -> dict[str, Any]:
    """Parent side: spawn the child with an empty Inductor cache and return its numbers (or the failure)."""
    st = stage_res["stage"]
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=str(Path(cache) / "triton"))
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        cmd = [
            python,
            "-m",
            "bench",
            "_coldstart",
            "--mode",
            mode,
            "--device",
            device,
            "--inputs",
            setup["inputs"],
            "--stage",
            st["stage"],
            "--family",
            st["family"],
            "--preset",
            st["preset"],
            "--seed",
            str(st["seed"]),
            "--axes",
            json.dumps(st["axes"]),
            "--compile-mode",
            compile_mode,
            "--artifact",
            setup["artifact"],
        ]
        if st.get("dtype_override"):
            cmd += ["--dtype", st["dtype_override"]]
        if warmup_calls is not None:
            cmd += ["--warmup-calls", str(warmup_calls)]
        t_spawn = time.time()
        cmd += ["--t-spawn", repr(t_spawn)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(REPO))
        except subprocess.TimeoutExpired:
            return {"status": "skipped", "reason": f"exceeded its {timeout:.0f} s budget"}
        except Exception as e:  # noqa: BLE001
            return {"status": "failed", "reason": short_error(e)}
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"status": "failed", "reason": f"exit {proc.returncode}: {tail[:400]}"}
    out = json.loads(lines[-1])
    out["status"] = "ok"
    out["wall_s"] = time.time() - t_spawn
    out["inductor_cache"] = "empty (fresh temporary directory)"
    return out
