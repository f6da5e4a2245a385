"""Probe (issue 17, item 5 / the 3-minute tiny CPU build): can ONE AOTInductor package with a dynamic batch ×
frames range serve every bucket of a codec stage's default plan on CPU, and at what per-call cost?

For each codec decoder (tiny preset, random weights, fp32, kernels=inductor, the builder's own passes): export once
with `Dim`s spanning the default plan's batch and frame sizes, AOTI-compile on CPU, load, and run every bucket of the
plan against the eager module (max relative error); then compile the plan's middle bucket alone (static shapes, what
the builder does today) and time both packages on that bucket (median of 20 calls after 3 warm-up calls, 2 threads).
Not the builder's path (no manifest, no golden cases, no package cache): a feasibility and cost measurement.

    python3 bench/probes/cpu_dynamic_package.py --out bench/results/cpu/probes/dynamic_package
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.export import Dim

STAGES = (("qwen3-tts-12hz", "code2wav"), ("fish-s2-pro", "dac_decoder"), ("voxcpm2", "vae_decoder"))


def _first(out):
    return out[0] if isinstance(out, tuple | list) else out


def _median_ms(fn, args, reps: int = 20) -> float:
    for _ in range(3):
        fn(*args)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*args)
        times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 3)


def probe(family: str, stage: str, tmp: Path) -> dict:
    import torch._inductor

    from ttsaot.builder.build import prepare_modules
    from ttsaot.builder.families import get_family
    from ttsaot.builder.passes import cast_to_compute_dtype

    fam = get_family(family)
    spec = fam.specs(fam.options(preset="tiny"), [stage])[0]
    _, rewritten, _ = prepare_modules(spec, "inductor")
    module = cast_to_compute_dtype(rewritten, torch.float32).eval()
    buckets = spec.plan.buckets()
    mid = buckets[len(buckets) // 2]

    def inputs(sizes, seed):
        ex = spec.make_inputs(sizes, torch.Generator().manual_seed(seed))
        return tuple(ex[n] for n in spec.input_names)

    # one input, codes / latents [batch, C, frames]: batch and frames vary over the plan
    assert len(spec.input_names) == 1, spec.input_names
    dims = {
        0: Dim("batch", min=min(b["batch"] for b in buckets), max=max(b["batch"] for b in buckets)),
        2: Dim("frames", min=min(b["frames"] for b in buckets), max=max(b["frames"] for b in buckets)),
    }
    rec: dict = {"family": family, "stage": stage, "buckets": len(buckets), "middle_bucket": mid}
    with torch.no_grad():
        t0 = time.perf_counter()
        ep = torch.export.export(module, inputs(mid, 0), dynamic_shapes=(dims,), strict=False)
        rec["dynamic_export_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        dyn_path = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp / f"{stage}_dynamic.pt2"))
        rec["dynamic_compile_s"] = round(time.perf_counter() - t0, 1)
        dyn = torch._inductor.aoti_load_package(dyn_path)
        worst = 0.0
        for i, sizes in enumerate(buckets):
            args = inputs(sizes, i + 1)
            ref, out = _first(module(*args)), _first(dyn(*args))
            worst = max(worst, float((out - ref).abs().max() / ref.abs().max()))
        rec["dynamic_worst_rel_error_over_plan"] = float(f"{worst:.3g}")
        t0 = time.perf_counter()
        ep_static = torch.export.export(module, inputs(mid, 0), strict=False)
        st_path = torch._inductor.aoti_compile_and_package(ep_static, package_path=str(tmp / f"{stage}_static.pt2"))
        rec["static_export_and_compile_s"] = round(time.perf_counter() - t0, 1)
        static = torch._inductor.aoti_load_package(st_path)
        args = inputs(mid, 99)
        rec["middle_bucket_ms"] = {
            "eager": _median_ms(module, args),
            "static_package": _median_ms(static, args),
            "dynamic_package": _median_ms(dyn, args),
        }
    return rec


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    torch.set_num_threads(2)
    a.out.mkdir(parents=True, exist_ok=True)
    res = {"torch": torch.__version__, "threads": torch.get_num_threads(), "stages": []}
    with tempfile.TemporaryDirectory() as tmp:
        for family, stage in STAGES:
            rec = probe(family, stage, Path(tmp))
            print(json.dumps(rec), flush=True)
            res["stages"].append(rec)
            (a.out / "dynamic_package.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
