"""Probe: what the default codec plan's batch × frames cap (BucketPlan.max_batch_frames) costs per call.

Loads a code2wav artifact that holds the full cross product at long windows, and times each batch the cap leaves
without a bucket twice in the same process: through its own bucket, and with the capped buckets removed from the
stage (what a default-plan artifact does: the rows run in the largest batch compiled at their window). Medians of
CUDA-synchronised wall times of the public stage call (graph replay, padding, output copy) after warm-up, random
codes. Writes one JSON.

    build-artifacts build qwen3-tts-12hz --preset full --random-weights --device cuda --stages code2wav \\
        --batch-buckets 1,2,4 --frame-buckets 128,256 --max-batch-frames 0 --out ART
    python3 bench/probes/batch_cap_cost.py ART/qwen3-tts-12hz --cap 325 --out cap_cost.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from ttsaot.runtime import load


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _median_ms(stage, x: torch.Tensor, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        stage(x)
    _sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        stage(x)
        _sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("artifact")
    p.add_argument("--cap", type=int, default=325)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", default="cap_cost.json")
    a = p.parse_args()
    stage = load(a.artifact)["code2wav"]
    full = stage.entry
    capped = dataclasses.replace(
        full,
        buckets=[b for b in full.buckets if b.sizes["batch"] == 1 or b.sizes["batch"] * b.sizes["frames"] <= a.cap],
    )
    g = torch.Generator().manual_seed(0)
    rng = stage.entry.inputs[0].range or {}
    high = min(rng.get("high", [2048]))
    books = stage.entry.inputs[0].shape[1]
    rows = []
    for b in full.buckets:
        B, F = b.sizes["batch"], b.sizes["frames"]
        if B == 1 or B * F <= a.cap:
            continue
        x = torch.randint(0, high, (B, books, F), generator=g)
        stage.entry = full
        own = _median_ms(stage, x, a.warmup, a.reps)
        stage.entry = capped
        via = stage._largest_batch_at({"batch": B, "frames": F})
        split = _median_ms(stage, x, a.warmup, a.reps)
        one_row = torch.randint(0, high, (1, books, F), generator=g)
        b1 = _median_ms(stage, one_row, a.warmup, a.reps)
        rows.append(
            {
                "bucket": b.key,
                "own_bucket_ms": own,
                "capped_ms": split,
                "capped_via_batch": via,
                "b1_ms": b1,
                "capped_over_own": split / own,
            }
        )
        print(
            f"{b.key}: own bucket {own:.3f} ms, capped (batches of {via}) {split:.3f} ms "
            f"= {split / own:.2f}x; one row {b1:.3f} ms",
            flush=True,
        )
    stage.entry = full
    info = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "cap": a.cap,
        "rows": rows,
        "artifact": str(a.artifact),
        "warmup": a.warmup,
        "reps": a.reps,
    }
    Path(a.out).write_text(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
