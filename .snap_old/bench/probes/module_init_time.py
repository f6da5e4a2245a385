"""Probe (issue 17): seconds to make each stage's module with random weights (`StageSpec.make_module`), with and
without torch's default parameter init (`builder.checkpoint.construct`), full presets on the host CPU.

    python -m bench.probes.module_init_time [--family fish-s2-pro] [--preset full]
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    from ttsaot.builder import checkpoint
    from ttsaot.builder.families import get_family

    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="fish-s2-pro")
    ap.add_argument("--preset", default="full")
    a = ap.parse_args()
    fam = get_family(a.family)
    specs = fam.specs(fam.options(preset=a.preset))
    print(f"{a.family} ({a.preset}), torch {torch.__version__}, {torch.get_num_threads()} threads")
    for skip in (False, True):
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
            del m
        print(f"  {'skip' if skip else 'default'} init  total          {total:6.1f} s")


if __name__ == "__main__":
    main()
