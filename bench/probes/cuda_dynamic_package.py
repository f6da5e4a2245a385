"""Probe (issue 17, item 5, on the GPU): does ONE dynamic-shape package per codec stage (`--dynamic-packages on`,
the CPU default) serve the stage's whole default plan on CUDA without measurable loss against static per-bucket
packages, and what does it save in build time?

For one stage (full preset, random weights, the CUDA defaults: --kernels auto): build the whole default plan with
`dynamic_packages="on"` (wall time, packages), then a static build (`"off"`) of a few of the plan's buckets; load
both, check that the dynamic artifact's golden cases pass (`verify`), and time each static bucket through both
(`stage(*inputs)`, or an LM stage's serving API, bench.variants.lm_serving_call: graph replay plus the copies
in and out; median of `--reps` calls after warm-up, random
non-zero inputs) and compare their outputs. Not the bench harness: a feasibility and cost measurement.

    python3 -m bench.probes.cuda_dynamic_package --stage qwen3-tts-12hz/code2wav --buckets b1_f50,b4_f50,b1_f16 \
        --out OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch


def _median_ms(fn, reps: int) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 4)


def _first(y):
    return y[0] if isinstance(y, tuple) else y


def _caller(stage, sizes: dict, args: list):
    """The stage's call on one bucket's inputs: `stage(*inputs)`, or an LM stage's serving API
    (bench.variants.lm_serving_call)."""
    if stage.entry.kind not in ("lm_step", "lm_prefill"):
        return lambda: stage(*args)
    from bench.variants import lm_serving_call

    run, _cache, _api = lm_serving_call(stage, sizes, args)  # run keeps the cache alive
    return lambda: run(args)


def _build(family: str, spec, root: Path, jobs: int) -> dict:
    from ttsaot.builder.build import build_family

    t0 = time.perf_counter()
    res = build_family(family, [spec], root, device="cuda", jobs=jobs)
    files = {b.file for b in res.manifest.stages[spec.name].buckets}
    return {"seconds": round(time.perf_counter() - t0, 1), "buckets": len(spec.plan.buckets()), "packages": len(files)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stage", default="qwen3-tts-12hz/code2wav")
    p.add_argument("--buckets", default="b1_f50,b4_f50,b1_f16", help="bucket keys of the plan timed both ways")
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--out", required=True)
    a = p.parse_args()

    from ttsaot.builder.buckets import BucketPlan
    from ttsaot.builder.families import get_family
    from ttsaot.builder.parallel_compile import default_jobs
    from ttsaot.runtime import load
    from ttsaot.runtime.verify import verify_bundle

    family, stage = a.stage.split("/")
    jobs = a.jobs or default_jobs()
    fam = get_family(family)
    out: dict = {"stage": a.stage, "device": torch.cuda.get_device_name(), "torch": torch.__version__, "jobs": jobs}
    with tempfile.TemporaryDirectory(prefix="ttsaot-dynprobe-") as tmp:
        dyn_spec = fam.specs(fam.options(preset="full", device="cuda", dynamic_packages="on"), [stage])[0]
        plan = dyn_spec.plan.buckets()
        wanted = [b for b in plan if BucketPlan.key(b) in a.buckets.split(",")]
        try:
            out["dynamic_build"] = _build(family, dyn_spec, Path(tmp) / "dyn", jobs)
        except Exception as e:  # noqa: BLE001 - the probe records why
            out["dynamic_build"] = {"error": f"{type(e).__name__}: {str(e)[:800]}"}
            print(json.dumps(out, indent=1))
            Path(a.out).mkdir(parents=True, exist_ok=True)
            (Path(a.out) / "cuda_dynamic_package.json").write_text(json.dumps(out, indent=1))
            return 1
        print("dynamic build", out["dynamic_build"], flush=True)
        static_spec = fam.specs(fam.options(preset="full", device="cuda", dynamic_packages="off"), [stage])[0]
        axes = {ax: tuple(sorted({b[ax] for b in wanted})) for ax in static_spec.plan.axes}
        static_spec = dataclasses.replace(static_spec, plan=BucketPlan(axes))
        out["static_build"] = _build(family, static_spec, Path(tmp) / "static", jobs)
        print("static build", out["static_build"], flush=True)

        t0 = time.perf_counter()
        dyn = load(Path(tmp) / "dyn" / family, device="cuda")
        out["dynamic_load_s"] = round(time.perf_counter() - t0, 2)
        out["dynamic_load_stats"] = dyn[stage].load_stats
        cases = verify_bundle(dyn, [stage])
        out["dynamic_verify"] = {"cases": len(cases), "failed": [str(c)[:200] for c in cases if not c.ok]}
        sta = load(Path(tmp) / "static" / family, device="cuda")
        rows = []
        for sizes in static_spec.plan.buckets():
            ex = dyn_spec.make_inputs(sizes, torch.Generator().manual_seed(7))
            args = [ex[n].to("cuda") for n in dyn_spec.input_names]
            run_dyn, run_sta = _caller(dyn[stage], sizes, args), _caller(sta[stage], sizes, args)
            y_dyn, y_sta = _first(run_dyn()), _first(run_sta())
            rel = ((y_dyn.double() - y_sta.double()).norm() / y_sta.double().norm().clamp_min(1e-30)).item()
            row = {
                "bucket": BucketPlan.key(sizes),
                "static_ms": _median_ms(run_sta, a.reps),
                "dynamic_ms": _median_ms(run_dyn, a.reps),
                "rel_diff": rel,
            }
            row["dynamic_over_static"] = round(row["dynamic_ms"] / row["static_ms"], 3)
            print(row, flush=True)
            rows.append(row)
        out["buckets"] = rows
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "cuda_dynamic_package.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
