"""Probe (issue 17): what a stage's golden cases cost on the build host's CPU against the build's GPU
(builder/golden_reference.py), and how far the two references are apart. Per stage: the faithful + rewritten fp32
modules once, the cases on the host (wall, and the process's CPU seconds over all its threads), then the same
cases on the GPU in exact fp32 (wall), and per output the relative error between the two (integer outputs: the
number of differing codes). No package is compiled.

    python -m bench.probes.golden_cost --family fish-s2-pro --preset full [--stages dac_encoder] --out golden.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def _timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - w0, time.process_time() - c0


def stage_cost(spec) -> dict:
    """The stage's cases on the host, then on the GPU (the modules moved there), timed; their differences."""
    from ttsaot.builder import build
    from ttsaot.runtime.metrics import rel_error

    gpu = torch.device("cuda")
    original, rewritten, _ = build.prepare_modules(spec, spec.kernels_on(gpu))
    sizes = build._golden_sizes(spec)

    def cases(n: int = len(sizes)):  # fresh inputs per run: step modules write their cache inputs in place
        return [
            build._GoldenCase(s, i, spec.make_inputs(s, torch.Generator().manual_seed(i))) for i, s in enumerate(sizes)
        ][:n]

    host, host_s, host_cpu = _timed(lambda: build._golden_cases(spec, original, rewritten, cases()))
    build._golden_cases(spec, original, rewritten, cases(1), gpu)  # moves the modules there, warms cuDNN
    dev, dev_s, dev_cpu = _timed(lambda: build._golden_cases(spec, original, rewritten, cases(), gpu))
    return {
        "stage": spec.name,
        "cases": len(sizes),
        "host_wall_s": round(host_s, 2),
        "host_cpu_s": round(host_cpu, 1),
        "gpu_wall_s": round(dev_s, 2),
        "gpu_cpu_s": round(dev_cpu, 1),
        "gpu_vs_host": {
            n: (rel_error(dev[n], t) if t.is_floating_point() else int((dev[n] != t).sum()))
            for n, t in host.items()
            if "/in/" not in n
        },
    }


def main() -> None:
    from ttsaot.builder.families import get_family

    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="fish-s2-pro")
    ap.add_argument("--preset", default="full")
    ap.add_argument("--stages", default=None, help="comma-separated (default: the family's default stages)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    fam = get_family(a.family)
    specs = fam.specs(fam.options(preset=a.preset, device="cuda"), a.stages.split(",") if a.stages else None)
    rows = []
    for spec in specs:
        rows.append(stage_cost(spec))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    a.out.write_text(
        json.dumps(
            {
                "family": a.family,
                "preset": a.preset,
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "device": torch.cuda.get_device_name(),
                "stages": rows,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
