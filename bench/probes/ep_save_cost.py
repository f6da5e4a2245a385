"""Probe (issue 17): what the build's own process pays per package it hands to a compile worker — the
`torch.export.save` of the bucket's ExportedProgram (builder/build.py `_submit_compiles`), weights included, one
after another for every package of a stage — split into its parts: the tensors' raw bytes, the archive's writes,
and the program alone (`serialize` without state dict or constants). Also the worker's `torch.export.load`; and
the hand-over of `--buckets` programs of the stage both ways: every program saved whole (what builds did before)
against the stage's tensors written once + each program without them (builder/saved_programs.py).

    python -m bench.probes.ep_save_cost --family fish-s2-pro --stage dac_decoder --preset full [--reps 3] [--buckets 3]
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
    from ttsaot.builder.saved_programs import StageTensors, load_program, save_program

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="fish-s2-pro")
    ap.add_argument("--stage", default="dac_decoder")
    ap.add_argument("--preset", default="full")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--buckets", type=int, default=3, help="programs handed over in the stage comparison")
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
        # the stage's hand-over, both ways
        buckets = spec.plan.buckets()[: a.buckets]
        eps = [ep] + [
            export_bucket(
                module,
                tuple(spec.make_inputs(b, torch.Generator().manual_seed(0))[n] for n in spec.input_names),
                torch.device("cpu"),
            )
            for b in buckets[1:]
        ]
        whole = [Path(tmp) / f"whole{i}.pt2" for i in range(len(eps))]
        res["stage_buckets"] = buckets
        res["whole_save_s"] = _seconds(lambda: [torch.export.save(e, str(p)) for e, p in zip(eps, whole)])
        res["whole_load_s"] = _seconds(lambda: [torch.export.load(str(p)) for p in whole])
        shared, names, bare = StageTensors(), [], [Path(tmp) / f"bare{i}.pt2" for i in range(len(eps))]
        tensors = Path(tmp) / "tensors.pt"

        def handoff() -> None:
            names.extend(shared.add(e) for e in eps)
            shared.write(tensors)
            for e, p, n in zip(eps, bare, names):
                save_program(e, p, n)

        res["shared_save_s"] = _seconds(handoff)
        res["shared_load_s"] = _seconds(lambda: [load_program(p, tensors, n) for p, n in zip(bare, names)])
        res["shared_mb"] = round((tensors.stat().st_size + sum(p.stat().st_size for p in bare)) / 1e6, 1)
        res["whole_mb"] = round(sum(p.stat().st_size for p in whole) / 1e6, 1)
    print(json.dumps(res, indent=1))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
