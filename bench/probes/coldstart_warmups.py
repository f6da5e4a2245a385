"""Probe (issue 17): the warm-up calls before each CUDA-graph capture at load (runtime/graphs.py WARMUP_CALLS), in
fresh processes, alternating the counts (and the artifacts, when several are given: an A/B of two builds), on
artifacts already built.

    python -m bench.probes.coldstart_warmups --artifact [LABEL=]DIR/FAMILY [--artifact ...] [--stages a,b]
                                             [--calls 3,1] [--repeats 3] --out OUT

Per stage, count and repeat: bench/coldstart.py's measurement (fresh process, empty Inductor cache: first output
beyond `import torch`, the load's phases, every bucket's warm-up and capture seconds) and the first output's sum,
which must not depend on the count. Writes OUT/coldstart_warmups.json."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any


def _artifacts(values: list[str]) -> dict[str, Path]:
    """--artifact [LABEL=]DIR, repeatable: the label (default: the directory's name) → the artifact."""
    out: dict[str, Path] = {}
    for v in values:
        label, sep, path = v.partition("=")
        out[label if sep else Path(v).name] = Path(path if sep else v)
    return out


def main() -> None:
    from bench.build_times import golden_inputs
    from bench.coldstart import measure

    ap = argparse.ArgumentParser()
    ap.add_argument("--artifact", action="append", required=True, metavar="[LABEL=]DIR",
                    help="an artifact (DIR/FAMILY); repeat to alternate several (an A/B of two builds)")  # fmt: skip
    ap.add_argument("--stages", default=None)
    ap.add_argument("--calls", default="3,1")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    artifacts = _artifacts(a.artifact)
    counts = [int(c) for c in a.calls.split(",")]
    res: dict[str, Any] = {"artifacts": {k: str(v) for k, v in artifacts.items()}, "counts": counts, "runs": [],
                           "summary": {}}  # fmt: skip
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    for rep in range(a.repeats):
        for n in counts:
            for label, artifact in artifacts.items():
                manifest = json.loads((artifact / "manifest.json").read_text())
                stages = a.stages.split(",") if a.stages else list(manifest["stages"])
                for stage in stages:
                    inputs = golden_inputs(artifact, stage, a.out / f"{label}.{stage}.coldstart.pt")
                    st = {"family": manifest["family"], "stage": stage, "preset": "full", "seed": 0, "axes": {}}
                    r = measure("ttsaot", {"artifact": str(artifact), "inputs": str(inputs)}, {"stage": st}, "cuda",
                                a.timeout, "default", warmup_calls=n)  # fmt: skip
                    if r.get("status") == "ok":
                        r["beyond_import_s"] = round(r["first_output_s"] - r["startup_s"], 3)
                    res["runs"].append({"repeat": rep, "warmup_calls": n, "artifact": label, "stage": stage, **r})
                    ls = r.get("load_stats", {})
                    print(f"rep {rep} calls {n} {label} {stage}: beyond import {r.get('beyond_import_s')} s, warm-up "
                          f"+ capture {ls.get('warmup_capture_s')} (warm-up {ls.get('warmup_s')}) s, output sum "
                          f"{r.get('output_sum')} {r.get('status')} {r.get('reason', '')}", flush=True)  # fmt: skip
                    (a.out / "coldstart_warmups.json").write_text(json.dumps(res, indent=1))
    for key in sorted({(r["artifact"], r["stage"], r["warmup_calls"]) for r in res["runs"]}):
        ok = [r for r in res["runs"] if (r["artifact"], r["stage"], r["warmup_calls"]) == key and r["status"] == "ok"]
        if ok:
            res["summary"][f"{key[0]}/{key[1]}/calls={key[2]}"] = {
                "beyond_import_s_median": statistics.median(r["beyond_import_s"] for r in ok),
                "warmup_capture_s_median": statistics.median(r["load_stats"]["warmup_capture_s"] for r in ok),
                "warmup_s_median": statistics.median(r["load_stats"]["warmup_s"] for r in ok),
                "output_sums": sorted({r["output_sum"] for r in ok}),
                "runs": len(ok),
            }
    res["seconds"] = time.time() - t0
    (a.out / "coldstart_warmups.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res["summary"], indent=1))


if __name__ == "__main__":
    main()
