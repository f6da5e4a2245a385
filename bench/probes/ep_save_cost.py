"""Probe (issue 17): what the build's own process pays per package it hands to a compile worker — the
`torch.export.save` of the bucket's ExportedProgram (builder/build.py `_submit_compiles`), weights included, one
after another for every package of a stage — split into its parts: the tensors' raw bytes, the archive's writes,
and the program alone (`serialize` without state dict or constants). Also the worker's `torch.export.load`.

    python -m bench.probes.ep_save_cost --family fish-s2-pro --stage dac_decoder --preset full [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch


def _seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return round(time.perf_counter() - t, 3)


def main() -> None:
    from torch._export.serde.serialize import serialize
    from torch.export.pt2_archive._package import _get_raw_tensor_bytes

    from ttsaot.builder.build import prepare_modules
    from ttsaot.builder.export import export_bucket
    from ttsaot.builder.families import get_family

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="fish-s2-pro")
    ap.add_argument("--stage", default="dac_decoder")
    ap.add_argument("--preset", default="full")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    a = ap.parse_args()

    fam = get_family(a.family)
    (spec,) = fam.specs(fam.options(preset=a.preset), [a.stage])
    _, module, _ = prepare_modules(spec, "inductor")
    sizes = spec.plan.buckets()[0]
    inputs = spec.make_inputs(sizes, torch.Generator().manual_seed(0))
    ep = export_bucket(module, tuple(inputs[n] for n in spec.input_names), torch.device("cpu"))
    tensors = list(ep.state_dict.values()) + [t for t in ep.constants.values() if isinstance(t, torch.Tensor)]
    res: dict = {
        "family": a.family,
        "stage": a.stage,
        "preset": a.preset,
        "bucket": sizes,
        "dtype": str(spec.dtype),
        "torch": torch.__version__,
        "host_cpus": os.cpu_count(),
        "weight_mb": round(sum(t.numel() * t.element_size() for t in tensors) / 1e6, 1),
        "graph_nodes": len(ep.graph.nodes),
    }
    with tempfile.TemporaryDirectory(prefix="ep-save-") as tmp:
        path = str(Path(tmp) / "program.pt2")
        res["save_s"] = [_seconds(lambda: torch.export.save(ep, path)) for _ in range(a.reps)]
        res["archive_mb"] = round(os.path.getsize(path) / 1e6, 1)
        res["load_s"] = _seconds(lambda: torch.export.load(path))
        raw: list[bytes] = []
        res["raw_bytes_s"] = _seconds(lambda: raw.extend(_get_raw_tensor_bytes(t) for t in ep.state_dict.values()))

        def write() -> None:
            with open(Path(tmp) / "raw.bin", "wb") as f:
                for b in raw:
                    f.write(b)

        res["plain_write_s"] = _seconds(write)
        res["program_only_s"] = _seconds(lambda: serialize(ep, serialize_state_dict=False, serialize_constants=False))
    print(json.dumps(res, indent=1))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
