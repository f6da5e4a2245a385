"""Probe: the graph replay alone of every bucket of two or more builds of a stage, alternating, in one process (an
A/B of the GPU work without the host's part of a call: input copies, validation, the per-call synchronisation that
`bench profile`'s call_ms includes and whose noise, ±100 µs between runs on an H200 host, can hide a 50 µs change).

    python -m bench.probes.replay_ab --artifact LABEL=DIR/FAMILY --artifact LABEL=DIR/FAMILY [--stage S]
                                     [--rounds 5] [--replays 100] --out OUT

Each artifact is loaded with the runtime (CUDA graphs captured at load); each bucket's static inputs hold random
codes within the manifest's ranges (never all zeros; the same codes for every artifact). Per round and bucket, in
turn for each artifact: the bench's timing (bench.common.time_fn: `replays` replays of the runtime's own graph,
bench.codec_stages._runner_replay, each between CUDA events with no synchronisation between them, the median) → µs
per replay. (The committed results/nvidia-h200/probes/window_attention_ab/replay/ were made by b1f247b's version:
the mean of 100 replays between one pair of events.) Writes OUT/replay_ab.json: every round's figure and
per artifact and bucket the median over the rounds. An LM step stage (graphs captured per cache on first use) runs
one step per bucket on a cache of its own first, its rows at position `--context` or the cache's last (the inputs
random as above, the cache filled at random), and its graph of that cache is what is replayed: the same token every
replay."""

from __future__ import annotations

import argparse
import json
import statistics
import zlib
from pathlib import Path
from typing import Any

import torch


def _fill(runner, entry, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for spec, buf in zip(entry.inputs, runner.graph.inputs):
        if buf.dtype.is_floating_point:
            buf.copy_(torch.randn(buf.shape, generator=g))
        else:
            high = min(spec.range["high"]) if spec.range else 2
            buf.copy_(torch.randint(0, high, buf.shape, generator=g))


def _lm_step_replays(stage, context: int, seed: int) -> dict[str, Any]:
    """Per bucket of an LM step stage: the replay of its graph over a cache of its own, captured by one step at
    `context` (bench.variants.lm_serving_call: the serving API, as `bench profile` calls it)."""
    from bench.decode_stages import _graph_of
    from bench.variants import lm_serving_call

    md = stage.entry.metadata
    replays = {}
    for b in stage.entry.buckets:
        runner = stage._runners[b.key]
        g = torch.Generator().manual_seed(seed + zlib.crc32(b.key.encode()))
        position = min(context, stage.new_cache(b.sizes["batch"]).max_len - 1)  # the bench's: the last slot
        xs = []
        for spec, shape in zip(stage.entry.inputs, runner.shapes):
            if spec.name == md["position_input"]:
                xs.append(torch.full(shape, position, dtype=spec.torch_dtype))
            elif spec.torch_dtype.is_floating_point:
                xs.append(torch.randn(shape, generator=g).to(spec.torch_dtype))
            else:
                high = min(spec.range["high"]) if spec.range else 2
                xs.append(torch.randint(0, high, shape, generator=g).to(spec.torch_dtype))
        xs = [x.to(stage.device) for x in xs]
        run, cache, _ = lm_serving_call(stage, b.sizes, xs)
        run(xs)  # captures the graph of (bucket, cache)
        replays[b.key] = (_graph_of(stage, cache).replay, cache)
    return replays


def main() -> None:
    from bench.codec_stages import _runner_replay
    from bench.common import time_fn
    from bench.probes.coldstart_warmups import _artifacts
    from ttsaot.runtime import load

    ap = argparse.ArgumentParser()
    ap.add_argument("--artifact", action="append", required=True, metavar="LABEL=DIR")
    ap.add_argument("--stage", default=None, help="default: the manifest's first stage")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--context", type=int, default=512, help="an LM step's rows' position, at most the cache's last")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    dev = torch.device("cuda")
    stages, lm_replays = {}, {}
    for label, path in _artifacts(a.artifact).items():
        bundle = load(path, device="cuda")
        stages[label] = bundle[a.stage or next(iter(bundle))]
        if stages[label].entry.kind == "lm_step":
            lm_replays[label] = _lm_step_replays(stages[label], a.context, seed=1234)
    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "artifacts": a.artifact,
        "rounds": [],
        "median_us": {},
    }
    for r in range(a.rounds):
        row: dict[str, dict[str, float]] = {}
        for label, stage in stages.items():
            for key, runner in stage._runners.items():
                if label in lm_replays:
                    replay = lm_replays[label][key][0]
                else:
                    replay = _runner_replay(stage, key)
                    if replay is None:
                        continue
                    _fill(runner, stage.entry, seed=zlib.crc32(key.encode()))
                row.setdefault(label, {})[key] = time_fn(replay, dev, warmup=1, reps=a.replays)["ms"] * 1e3
        print(f"round {r}: " + json.dumps({k: {b: round(v, 1) for b, v in d.items()} for k, d in row.items()}))
        res["rounds"].append(row)
    for label in stages:
        keys = res["rounds"][0].get(label, {})
        res["median_us"][label] = {k: statistics.median(rd[label][k] for rd in res["rounds"]) for k in keys}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "replay_ab.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res["median_us"], indent=1))


if __name__ == "__main__":
    main()
