"""Probe (issue 17): seconds to make each stage's module with random weights (`StageSpec.make_module`), with and
without torch's default parameter init (`builder.checkpoint.construct`), full presets on the host CPU; with
`--fill-threads N` the random draws (`builder.checkpoint.fill_by_name`) on N threads instead of one per core, and
with `--copies` what keeping a second copy of the module costs: `copy.deepcopy` against
`builder.module_copy.module_sharing_tensors` (what a build's deferred golden cases keep).

    python -m bench.probes.module_init_time [--family fish-s2-pro] [--preset full] [--stages a,b]
        [--fill-threads N] [--skip-only] [--copies]
"""

from __future__ import annotations

import argparse
import copy
import time

import torch


def main() -> None:
    from ttsaot.builder import checkpoint, parallel_compile
    from ttsaot.builder.families import get_family
    from ttsaot.builder.module_copy import module_sharing_tensors

    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="fish-s2-pro")
    ap.add_argument("--preset", default="full")
    ap.add_argument("--stages", default=None, help="comma-separated (default: the family's default stages)")
    ap.add_argument("--fill-threads", type=int, default=None, help="threads for the random draws (default: cores)")
    ap.add_argument("--skip-only", action="store_true", help="only with the default init skipped (as builds run)")
    ap.add_argument("--copies", action="store_true", help="also time a deep copy and a tensor-sharing copy")
    a = ap.parse_args()
    if a.fill_threads is not None:
        parallel_compile.usable_cores = lambda: a.fill_threads  # fill_by_name's thread count
    fam = get_family(a.family)
    specs = fam.specs(fam.options(preset=a.preset), a.stages.split(",") if a.stages else None)
    threads = a.fill_threads or parallel_compile.usable_cores()
    print(
        f"{a.family} ({a.preset}), torch {torch.__version__}, {torch.get_num_threads()} threads, {threads} fill threads"
    )
    for skip in (True,) if a.skip_only else (False, True):
        checkpoint.SKIP_DEFAULT_INIT = skip
        total = 0.0
        for s in specs:
            t0 = time.perf_counter()
            m = s.make_module()
            dt = time.perf_counter() - t0
            total += dt
            params = sum(p.numel() for p in m.parameters()) / 1e6
            print(
                f"  {'skip' if skip else 'default'} init  {s.name:14s} {dt:6.1f} s  {params:5.0f}M params", flush=True
            )
            if a.copies:
                for name, make in (("deepcopy", copy.deepcopy), ("sharing", module_sharing_tensors)):
                    t0 = time.perf_counter()
                    c = make(m)
                    print(f"    {name:8s} copy {time.perf_counter() - t0:6.2f} s", flush=True)
                    del c
            del m
        print(f"  {'skip' if skip else 'default'} init  total          {total:6.1f} s")


if __name__ == "__main__":
    main()
