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
from .validation import all_finite


@dataclass
class CaseResult:
    stage: str
    case: str
    output: str
    metric: str  # "rel" (‖out−ref‖/‖ref‖) or "mismatches" (integer outputs: count of differing entries)
    value: float
    limit: float
    ok: bool
    near_ties: int = 0  # code rows that left the reference at a near-tie (allowed; see compare_sampled)


def compare(out: torch.Tensor, ref: torch.Tensor, tolerance: float) -> tuple[str, float, float, bool]:
    out, ref = out.detach().cpu(), ref.detach().cpu()
    if out.shape != ref.shape:
        return "shape", float("inf"), 0.0, False
    if not ref.is_floating_point():
        n = int((out != ref).sum())
        return "mismatches", float(n), 0.0, n == 0
    rel = rel_error(out, ref)
    ok = all_finite(out) and rel <= tolerance
    return "rel", rel, tolerance, ok


def compare_sampled(
    out: torch.Tensor, ref: torch.Tensor, margin: torch.Tensor, tolerance: float
) -> tuple[str, float, float, bool, torch.Tensor]:
    """Sampled codes [B, codes] against the reference, given the reference draws' near-tie margins (stored by the
    builder: the gap between the two best noisy scores relative to the logits' size). A row may leave the
    reference only at a draw whose margin is below the stage's tolerance: there the math does not decide the code
    at this precision. Its later codes (and the row's other outputs) depend on that draw and are not compared.
    Any other difference is a mismatch. Returns (metric, mismatches, 0, ok, rows that left at a near-tie)."""
    out, ref, margin = out.detach().cpu(), ref.detach().cpu(), margin.detach().cpu()
    if out.shape != ref.shape or margin.shape != ref.shape:
        return "shape", float("inf"), 0.0, False, torch.zeros(0, dtype=torch.bool)
    differ = out != ref
    first = torch.where(differ.any(dim=1), differ.int().argmax(dim=1), torch.zeros(ref.shape[0], dtype=torch.long))
    at_first = margin.gather(1, first[:, None])[:, 0]
    near_tie = differ.any(dim=1) & (at_first < tolerance)
    n = int(differ[~near_tie].sum())
    return "mismatches", float(n), 0.0, n == 0, near_tie


def code_rows(codes: torch.Tensor) -> torch.Tensor:
    """Decided codes as `compare_sampled`'s rows, each code depending on the row's earlier ones: a predictor's draws
    [B, codes] as they are; an encoder's quantizer choices [B, codebooks, frames] one row per frame (a residual
    quantizer's codes of a frame depend on its earlier codebooks' choices, not on other frames')."""
    return codes.transpose(1, 2).reshape(-1, codes.shape[1]) if codes.dim() == 3 else codes


def compare_decided(
    out: torch.Tensor, ref: torch.Tensor, margin: torch.Tensor, tolerance: float
) -> tuple[str, float, float, bool, torch.Tensor]:
    """`compare_sampled` over `code_rows` of an output whose golden case stores margins (every verifier's rule for
    decided codes); the near-tie flags are per code row."""
    return compare_sampled(code_rows(out), code_rows(ref), code_rows(margin), tolerance)


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
            outs = dict(zip((s.name for s in entry.outputs), outs if isinstance(outs, tuple) else (outs,)))
            sampled = [n for n in outs if f"{case}/margin/{n}" in golden]
            left = None  # batch rows that left the reference at a near-tie: their other outputs have no reference
            for out_name in sampled:
                out, ref = outs[out_name], golden[f"{case}/out/{out_name}"]
                margin = golden[f"{case}/margin/{out_name}"]
                metric, value, limit, ok, near = compare_decided(out, ref, margin, entry.tolerance)
                if near.numel():  # (empty where the shapes differ)
                    rows = near.view(ref.shape[0], -1).any(dim=1)
                    left = rows if left is None else left | rows
                results.append(CaseResult(name, case, out_name, metric, value, limit, ok, int(near.sum())))
            for out_name, o in outs.items():
                if out_name in sampled:
                    continue
                ref = golden[f"{case}/out/{out_name}"]
                if left is not None and bool(left.any()) and left.shape[0] == ref.shape[0]:
                    o, ref = o.detach().cpu()[~left], ref[~left]
                metric, value, limit, ok = compare(o, ref, entry.tolerance)
                results.append(CaseResult(name, case, out_name, metric, value, limit, ok))
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
            ties = f", {r.near_ties} near-tie row(s)" if r.near_ties else ""
            print(
                f"{'ok ' if r.ok else 'BAD'} {r.stage}/{r.case}/{r.output}: {r.metric}={r.value:.3g} "
                f"(limit {r.limit:.3g}{ties})"
            )
    return 0 if results and all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
