"""`ttsaot::sample_tokens` at other warp counts: `python -m bench.probes.sampler_warps OUT.json` times the kernel
alone (bench/kernels.py `bench_sampler_case`: a CUDA graph of 16 draws, tokens compared with the aten sampler) for
each way to the kept set (the sort, V ≤ 2048; the radix select) × 1-16 warps × the predictors' vocabularies
(1024, 2048, 4096) at one row, under the Fish defaults (top-k 30, top-p 0.9: both thresholds searched) and random
rows. The kernel takes its warps from `sample_triton.warps`; this probe replaces that rule per case."""

from __future__ import annotations

import json
import sys

import torch


def main(argv: list[str]) -> int:
    import bench.kernels as kb
    import ttsaot.builder.kernels.sample_triton as S
    from bench.common import device_info

    dev = torch.device("cuda")
    res: dict = {"device": device_info(dev), "cases": {}}
    rule, sort_rule = S.warps, S.use_sort
    for V in (1024, 2048, 4096):
        for sort in (True, False) if V <= 2048 else (False,):
            for w in (1, 2, 4, 8, 16):
                S.warps = lambda block_v, w=w: w
                S.use_sort = lambda block_v, sort=sort: sort
                key = f"V={V}/{'sort' if sort else 'radix'}/w{w}" + (
                    " (rule)" if w == rule(V) and sort == sort_rule(V) else ""
                )
                try:
                    c = kb.bench_sampler_case(V, 1, 1.0, 30, dev)
                    res["cases"][key] = {
                        "us": round(c["kernel"]["graph_ms"] * 1e3, 2),
                        "aten_us": round(c["aten"]["graph_ms"] * 1e3, 2),
                        "tokens_differing": c["tokens_differing"],
                    }
                except Exception as e:  # noqa: BLE001 - a config that does not compile is a result too
                    res["cases"][key] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                print(key, res["cases"][key], flush=True)
                json.dump(res, open(argv[0], "w"), indent=1)
    S.warps, S.use_sort = rule, sort_rule
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
