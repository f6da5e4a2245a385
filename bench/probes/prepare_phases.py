"""Probe (issue 17): where each stage's preparation goes — the part of a build that runs in the build's own
process, one stage after another, while earlier stages' packages compile in workers (builder/build.py
`prepare_stage`: modules and passes, golden cases, the device move, exports and cache lookups). No package is
compiled. Prints the builder's own per-stage note (`<stage>: prepared in ...`).

    python -m bench.probes.prepare_phases --family fish-s2-pro --preset full --device cpu [--stages dac_encoder]
        [--dynamic-packages cold]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    from ttsaot.builder.build import Reporter, prepare_stage

    class Print(Reporter):
        def stage_start(self, stage: str, n_buckets: int) -> None:
            print(f"  {stage}: {n_buckets} bucket(s)", flush=True)

        def note(self, msg: str) -> None:
            print(f"  {msg}", flush=True)

    from ttsaot.builder.families import get_family

    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="fish-s2-pro")
    ap.add_argument("--preset", default="full")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--stages", default=None, help="comma-separated (default: the family's default stages)")
    ap.add_argument("--dynamic-packages", default=None, help="as the CLI's --dynamic-packages")
    ap.add_argument("--jobs", type=int, default=2, help="> 1: every package exported up front, as a parallel build")
    a = ap.parse_args()
    fam = get_family(a.family)
    kw = {"preset": a.preset, "device": a.device}
    if a.dynamic_packages:
        kw["dynamic_packages"] = a.dynamic_packages
    names = a.stages.split(",") if a.stages else None
    specs = fam.specs(fam.options(**kw), names)
    dev = torch.device(a.device)
    print(f"{a.family} ({a.preset}, {dev}), torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for spec in specs:
            prepare_stage(spec, Path(tmp), dev, 0, Print(), jobs=a.jobs)
    print(f"all stages prepared in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
