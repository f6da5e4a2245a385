"""Re-run an artifact's golden cases through the runtime and compare with the stored eager reference.

Also the build-time subprocess check: `python -m ttsaot.runtime.verify DIR --device D --json`; a package that
crashes on load kills this process, not the builder, which then fails the build with a clear message."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .errors import IntegrityError
from .metrics import rel_error


@dataclass
class CaseResult:
    stage: str
    case: str
    output: str
    metric: str          # "rel" (‖out−ref‖/‖ref‖) or "mismatches" (integer outputs: count of differing entries)
    value: float
    limit: float
    ok: bool


def compare(out: torch.Tensor, ref: torch.Tensor, tolerance: float) -> tuple[str, float, float, bool]:
    out, ref = out.detach().cpu(), ref.detach().cpu()
    if out.shape != ref.shape:
        return "shape", float("inf"), 0.0, False
    if not ref.is_floating_point():
        n = int((out != ref).sum())
        return "mismatches", float(n), 0.0, n == 0
    rel = rel_error(out, ref)
    ok = bool(torch.isfinite(out).all()) and rel <= tolerance
    return "rel", rel, tolerance, ok


def load_golden(path: Path) -> dict[str, torch.Tensor]:
    """The golden cases of a stage; an unreadable file is an IntegrityError naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise IntegrityError(f"{path}: unreadable golden cases ({e})") from None


def verify_bundle(bundle, stages: list[str] | None = None) -> list[CaseResult]:
    from .artifact import check_file

    results: list[CaseResult] = []
    for name, stage in bundle.items():
        if stages and name not in stages:
            continue
        entry = stage.entry
        if entry.golden is None:
            continue
        golden = load_golden(check_file(bundle.root, entry.golden))
        for case in entry.golden_cases:
            inputs = {s.name: golden[f"{case}/in/{s.name}"] for s in entry.inputs}
            outs = stage(**inputs)
            outs = outs if isinstance(outs, tuple) else (outs,)
            for spec, o in zip(entry.outputs, outs):
                metric, value, limit, ok = compare(o, golden[f"{case}/out/{spec.name}"], entry.tolerance)
                results.append(CaseResult(name, case, spec.name, metric, value, limit, ok))
    return results


def main(argv: list[str] | None = None) -> int:
    from . import load

    p = argparse.ArgumentParser(prog="python -m ttsaot.runtime.verify")
    p.add_argument("artifact")
    p.add_argument("--device", default=None)
    p.add_argument("--stages", default=None)
    p.add_argument("--no-graphs", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    stages = a.stages.split(",") if a.stages else None
    bundle = load(a.artifact, device=a.device, stages=stages, cuda_graphs=not a.no_graphs)
    results = verify_bundle(bundle, stages)
    if a.json:
        print(json.dumps([asdict(r) for r in results]))
    else:
        for r in results:
            print(f"{'ok ' if r.ok else 'BAD'} {r.stage}/{r.case}/{r.output}: {r.metric}={r.value:.3g} "
                  f"(limit {r.limit:.3g})")
    return 0 if results and all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
