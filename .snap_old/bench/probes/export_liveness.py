"""Probe (issue 15, code2wav graph memory): the live-tensor peak of a codec stage's exported program, by liveness
over its graph (each node's output bytes from its fake value, freed after its last user; custom-op tuple outputs
counted through their getitems). A lower bound on what one call holds at once: Inductor fuses the pointwise ops
between the ttsaot ops and may keep buffers longer; the CUDA graph pool then adds the allocator's placement.

Exported on CPU without the CPU decompositions, so each `ttsaot::conv*` op stays one node with its CUDA-path
output; bf16 as the CUDA build computes.

    python3 bench/probes/export_liveness.py --frames 325 --batch 1 --out bench/results/cpu/probes/export_liveness
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def liveness_peak(graph: torch.fx.Graph) -> tuple[int, str, list[tuple[str, int, list[int], str]]]:
    """(peak bytes, the node where it is reached, the tensors live then: name, bytes, shape, dtype)."""
    nodes = list(graph.nodes)
    last_use = {}
    for i, n in enumerate(nodes):
        for a in n.all_input_nodes:
            last_use[a] = i
    live: dict[torch.fx.Node, int] = {}
    cur = peak = 0
    at, at_live = "", []
    for i, n in enumerate(nodes):
        v = n.meta.get("val")
        if n.op == "call_function" and isinstance(v, torch.Tensor):
            live[n] = v.numel() * v.element_size()
            cur += live[n]
            if cur > peak:
                peak, at = cur, n.name
                at_live = [
                    (m.name, b, list(m.meta["val"].shape), str(m.meta["val"].dtype).removeprefix("torch."))
                    for m, b in sorted(live.items(), key=lambda kv: -kv[1])
                    if b >= 2**20
                ]
        for m in [m for m in live if last_use.get(m, -1) <= i and m is not n]:
            cur -= live.pop(m)
    return peak, at, at_live


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--frames", type=int, default=325)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    from ttsaot.builder.build import prepare_modules
    from ttsaot.builder.families import get_family
    from ttsaot.builder.passes import cast_to_compute_dtype

    fam = get_family("qwen3-tts-12hz")
    opts = fam.options(preset="full", kernels="ttsaot", batch_buckets=(a.batch,), frame_buckets=(a.frames,))
    spec = fam.specs(opts, ["code2wav"])[0]
    _, rewritten, _ = prepare_modules(spec, "ttsaot")
    module = cast_to_compute_dtype(rewritten, torch.bfloat16).eval()
    sizes = {"batch": a.batch, "frames": a.frames}
    ex = spec.make_inputs(sizes, torch.Generator().manual_seed(0))
    with torch.no_grad():
        ep = torch.export.export(module, tuple(ex[n] for n in spec.input_names), strict=False)
    peak, at, at_live = liveness_peak(ep.graph)
    res = {
        "stage": "qwen3-tts-12hz/code2wav",
        "preset": "full",
        "dtype": "bfloat16",
        "sizes": sizes,
        "peak_bytes": peak,
        "peak_mib": round(peak / 2**20, 1),
        "peak_at": at,
        "live_at_peak": at_live,
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"code2wav_b{a.batch}_f{a.frames}.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
