"""Decode attention's context splits at the LM steps' batch sizes: `python -m bench.probes.attention_splits OUT.json`.

At B = 16 the VoxCPM2 residual step's attention took 8.3 µs a layer on an H100, 12-13 % of the step
(bench/results/nvidia-h100/probes/tail_linears_ab/profiles/), over 128 programs: `plan_num_splits` gave the 32
(row, kv head) pairs 4 splits each, about one program per SM (8 since, bench/results/nvidia-h100/probes/
swap_ab_step/). Each program walks its split's positions BLOCK_S at a time, so a short split is a few dependent
loads. This times, like the bench's `sweep` section (a CUDA graph of calls
over layers rotated past L2, outputs checked against the reference, the bytes' floor at the peak copy rate), the
plan's split count against 2-16 splits and BLOCK_S 32 / 64 at B = 1, 4, 16 and contexts 512 / 2048."""

from __future__ import annotations

import json
import sys
import time

import torch

BATCHES = (16, 4, 1)
CONTEXTS = (512, 2048)
SPLITS = (2, 4, 8, 16)
BLOCKS = (32, 64)


def main(argv: list[str]) -> int:
    import bench.kernels as kb
    from bench.common import device_info
    from ttsaot.builder.kernels.common import multiprocessor_count
    from ttsaot.builder.kernels.decode_attention import BLOCK_S, MIN_CHUNK, plan_num_splits

    out = argv[0]
    deadline = time.monotonic() + (float(argv[1]) if len(argv) > 1 else 300.0)
    dev = torch.device("cuda")
    peak = kb._peak_copy(50, dev)
    hkv = kb.ATTENTION["hkv"]
    res: dict = {"device": device_info(dev), "peak_copy": peak, "cases": {}}
    for b in BATCHES:
        plan = plan_num_splits(b * hkv, kb.ATTENTION["cache_positions"], multiprocessor_count(dev))
        for ctx in CONTEXTS:
            launches = {"plan": {"num_splits": plan, "min_chunk": MIN_CHUNK, "block_s": BLOCK_S}}
            for s in SPLITS:
                for bs in BLOCKS:
                    launches[f"splits={s}/block_s={bs}"] = {"num_splits": s, "min_chunk": bs, "block_s": bs}
            times = {}
            for name, kw in launches.items():
                if time.monotonic() > deadline:
                    break
                try:
                    r = kb.bench_attention_case(b, ctx, True, peak["gb_per_s"], 100, dev, launch_kw=kw)
                    times[name] = r["kernel"]["graph_ms"] * 1e3
                    if r["rel_err_vs_reference"] > 1e-2 or not r["workspace_zero_after_timing"]:
                        print(f"  B={b} ctx={ctx} {name}: inexact or workspace left dirty", flush=True)
                    res["cases"][f"B={b}/ctx={ctx}/{name}"] = r
                except Exception as e:  # noqa: BLE001 - a launch the kernel refuses is a result too
                    res["cases"][f"B={b}/ctx={ctx}/{name}"] = {"error": f"{type(e).__name__}: {e}"[:300]}
            floor = next((r["kernel"]["floor_ms"] * 1e3 for k, r in res["cases"].items()
                          if k.startswith(f"B={b}/ctx={ctx}/") and "kernel" in r), float("nan"))  # fmt: skip
            best = sorted(times.items(), key=lambda kv: kv[1])[:3]
            print(f"B={b} ctx={ctx}: floor {floor:.2f} plan ({plan} splits) {times.get('plan', float('nan')):.2f} best "
                  + ", ".join(f"{k} {us:.2f}" for k, us in best), flush=True)  # fmt: skip
            with open(out, "w") as f:
                json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
