"""Probe (issue 17): what a build compiled into Triton's cache — one row per cubin (kernel name, its cache
folder, when its backend compile started and ended: the folder's first IR file and the cubin, written as
Triton's stages finish), counted by kernel: Inductor's generated kernels (`triton_poi_` / `triton_red_` /
`triton_per_` ...) against ttsaot's own kernels and their autotuning candidates. `--since` keeps the cubins
written after a time (the second of two builds on one cache: what it did NOT reuse).

    python -m bench.probes.triton_cache_inventory $TRITON_CACHE_DIR [--since EPOCH_S] --out inventory.json
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path


def inventory(cache: Path, since: float = 0.0) -> dict:
    rows = []
    for cubin in sorted(cache.glob("*/*.cubin")):
        end = cubin.stat().st_mtime
        if end < since:
            continue
        first = min(f.stat().st_mtime for f in cubin.parent.iterdir())
        meta = {}
        js = cubin.with_suffix(".json")
        if js.exists():
            m = json.loads(js.read_text())
            meta = {k: m.get(k) for k in ("num_warps", "num_stages", "shared")}
        rows.append(
            {
                "name": cubin.stem,
                "folder": cubin.parent.name,
                "end": round(end, 2),
                "backend_s": round(end - first, 2),
                **meta,
            }
        )
    by_name = collections.Counter(r["name"] for r in rows)
    generated = sum(n for k, n in by_name.items() if k.startswith("triton_"))
    return {
        "cubins": len(rows),
        "inductor_generated": generated,
        "other": len(rows) - generated,
        "backend_s_sum": round(sum(r["backend_s"] for r in rows), 1),
        "by_name": dict(by_name.most_common()),
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cache", type=Path)
    ap.add_argument("--since", type=float, default=0.0)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    inv = inventory(a.cache, a.since)
    a.out.write_text(json.dumps(inv, indent=1))
    top = ", ".join(f"{k} {v}" for k, v in list(inv["by_name"].items())[:12])
    print(
        f"{inv['cubins']} cubins ({inv['inductor_generated']} Inductor-generated, {inv['other']} other), "
        f"backend {inv['backend_s_sum']} s summed; top: {top}"
    )


if __name__ == "__main__":
    main()
