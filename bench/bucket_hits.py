"""`python -m bench bucket-hits`: which buckets of each codec stage's DEFAULT plan a streaming service hits, and
how much of each call is padding.

The requests go through the runtime's own serving paths on CPU: `Batcher.open_stream()` sessions (what the
service in examples/serve runs for every codec stream; concurrent streams share stage calls) and `Batcher.submit`
of whole utterances (one-shot decode, `CodecDecoderStage.decode_chunked` past the largest bucket). Each package call
(`Stage._run_bucket`) is recorded with the sizes it was asked for and mapped to the bucket the default plan would
pick, by the runtime's own rule (`Stage.pick_bucket`, smallest covering bucket).

The tiny artifacts hold ONE package per stage, at the default plan's largest batch and largest frame bucket: every
size the serving code asks for depends on the plan only through those two maxima (chunking past the largest
frame bucket, the batcher's row limit and its covering check), so the recorded sizes are the ones the default
plan's artifact sees, without compiling its 12–18 packages per stage on CPU.

Workload (seeded): utterance lengths log-normal around 6 s (1–40 s), turned into frames at the FULL preset's
frame rate; each family's default streaming config (chunk, left context, first chunks); streams at concurrency
1, 2, 4 and 8 in lock-step rounds (a stream that ends is replaced by the next at once), and one-shot requests at
concurrency 1 and 4 (codec decoders with a one-shot path; VoxCPM2's VAE is only ever streamed by its decode
loop)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from .common import REPO, git_commit, now_iso, write_json

CODEC_STAGES = {"qwen3-tts-12hz": "code2wav", "fish-s2-pro": "dac_decoder", "voxcpm2": "vae_decoder"}
ONE_SHOT = {"code2wav": True, "dac_decoder": True, "vae_decoder": False}
# VoxCPM2 emits latents in patches of 4 frames (3 steps = the 12-frame chunk): utterances are whole patches.
FRAME_MULTIPLE = {"vae_decoder": 4}
STREAM_CONCURRENCY = (1, 2, 4, 8)
ONE_SHOT_CONCURRENCY = (1, 4)
MEDIAN_S, SIGMA, MIN_S, MAX_S = 6.0, 0.6, 1.0, 40.0
# Long enough that a lock-step round is one batch however loaded the machine; a full round never waits at all.
MAX_WAIT_S = 0.2


def add_parser(sub) -> None:
    p = sub.add_parser("bucket-hits", help="per-bucket hits and padding of the codec stages' default plans (CPU)")
    p.add_argument(
        "--families", type=lambda v: [x.strip() for x in v.split(",") if x.strip()], default=list(CODEC_STAGES)
    )
    p.add_argument("--utterances", type=int, default=24, help="utterances per scenario")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--work",
        default=str(REPO / "bench" / ".cache" / "bucket_hits"),
        help="where the one-package tiny artifacts are built (reused when present)",
    )
    p.add_argument("--result", default=str(REPO / "bench" / "results" / "cpu" / "bucket_hits.json"))


def default_plan(family: str, stage: str, preset: str) -> tuple[list[dict[str, int]], dict[str, Any]]:
    """The stage's default bucket plan and metadata, from the family's own recipe with default options."""
    from ttsaot.builder.families import get_family

    fam = get_family(family)
    (spec,) = fam.specs(fam.options(preset=preset), [stage])
    return spec.plan.buckets(), dict(spec.metadata)


def build_one_package(family: str, stage: str, plan: list[dict[str, int]], out: Path) -> Path:
    art = out / family
    if (art / "manifest.json").is_file():
        return art
    cmd = [
        sys.executable,
        "-m",
        "ttsaot.builder.cli",
        "build",
        family,
        "--random-weights",
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--stages",
        stage,
        "--out",
        str(out),
        "--no-verify",
        "--batch-buckets",
        str(max(b["batch"] for b in plan)),
        "--frame-buckets",
        str(max(b["frames"] for b in plan)),
        "--max-batch-frames",
        "0",  # the one package IS the largest batch at the largest window, which a default plan may leave out
    ]
    subprocess.run(cmd, check=True, cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)))
    return art


def utterance_frames(n: int, frame_rate: float, multiple: int, rng) -> list[int]:
    secs = [min(MAX_S, max(MIN_S, rng.lognormvariate(math.log(MEDIAN_S), SIGMA))) for _ in range(n)]
    return [max(multiple, multiple * round(s * frame_rate / multiple)) for s in secs]


def chunk_plan(frames: int, streaming: dict[str, int]) -> list[int]:
    """New frames per chunk as the stream produces them: first chunks of `first_chunk_frames` until the total
    reaches `chunk_frames` (whole history as context), then `chunk_frames` each, the tail last."""
    chunk, first = streaming["chunk_frames"], streaming.get("first_chunk_frames", 0)
    out, total = [], 0
    while first and total < min(chunk, frames):
        out.append(min(first, chunk - total, frames - total))
        total += out[-1]
    while total < frames:
        out.append(min(chunk, frames - total))
        total += out[-1]
    return out


class Recorder:
    """Records every package call of a stage: the sizes asked for."""

    def __init__(self, stage) -> None:
        self.calls: list[dict[str, int]] = []
        run = stage._run_bucket

        def recording(named, sizes, *pending):
            self.calls.append(dict(sizes))
            return run(named, sizes, *pending)

        stage._run_bucket = recording


def drive_streams(stage, utterances: list[int], concurrency: int, streaming: dict[str, int], rng) -> None:
    import torch

    from ttsaot.runtime.batching import Batcher, BatcherConfig

    k, high = _code_shape(stage)
    with Batcher(stage, BatcherConfig(max_wait_s=MAX_WAIT_S)) as batcher:
        queue = list(utterances)
        active: list[list] = []  # [session, chunk sizes, next chunk]: a stream that ends is replaced at once
        while queue or active:
            while queue and len(active) < concurrency:
                active.append([batcher.open_stream(), chunk_plan(queue.pop(0), streaming), 0])
            futs = [s.submit(_codes(stage, k, plan[i], high, rng, torch)) for s, plan, i in active]
            for f in futs:
                f.result()
            for slot in active:
                slot[2] += 1
                if slot[2] == len(slot[1]):
                    slot[0].close()  # an ended stream no longer holds a batch open
            active = [slot for slot in active if slot[2] < len(slot[1])]


def drive_one_shot(stage, utterances: list[int], concurrency: int, rng) -> None:
    import torch

    from ttsaot.runtime.batching import Batcher, BatcherConfig

    k, high = _code_shape(stage)
    with Batcher(stage, BatcherConfig(max_wait_s=MAX_WAIT_S)) as batcher:
        for start in range(0, len(utterances), concurrency):
            group = utterances[start : start + concurrency]
            futs = [batcher.submit(_codes(stage, k, f, high, rng, torch)) for f in group]
            for f in futs:
                f.result()


def _code_shape(stage) -> tuple[int, int]:
    """(codebooks or latent channels, an exclusive bound every code index accepts)."""
    spec = stage.entry.inputs[0]
    return int(spec.shape[1]), (min(int(h) for h in spec.range["high"]) if spec.range else 2)


def _codes(stage, k: int, frames: int, high: int, rng, torch):
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    if stage.entry.inputs[0].dtype.startswith("float"):
        return torch.randn(1, k, frames, generator=g)
    return torch.randint(0, high, (1, k, frames), generator=g, dtype=torch.int64)


def _calls_on_plan(rule, sizes: dict[str, int]) -> list[dict[str, int]]:
    """The package calls the runtime makes for one call on the plan (`Stage._run`): the call itself where a bucket
    covers it, else its rows in the largest batch the plan compiled at its size (a batch × frames cap)."""
    from ttsaot.runtime.stage import Stage

    if "batch" not in sizes or Stage.pick_bucket(rule, sizes) is not None:
        return [sizes]
    step = Stage._largest_batch_at(rule, sizes)
    return [{**sizes, "batch": min(step, sizes["batch"] - s)} for s in range(0, sizes["batch"], step)]


def tally(calls: list[dict[str, int]], plan: list[dict[str, int]]) -> dict[str, Any]:
    """Per default-plan bucket: calls, and padding (bucket rows × frames not asked for) as a share of its work."""
    from ttsaot.builder.buckets import BucketPlan
    from ttsaot.runtime.artifact import BucketEntry
    from ttsaot.runtime.stage import Stage

    entries = [BucketEntry(key=BucketPlan.key(b), sizes=b, file="", sha256="", bytes=0) for b in plan]
    rule = SimpleNamespace(name="plan", entry=SimpleNamespace(buckets=entries), _axes=list(plan[0]))
    per: dict[str, dict[str, int]] = {e.key: {"calls": 0, "work": 0, "useful": 0} for e in entries}
    for sizes in (part for asked in calls for part in _calls_on_plan(rule, asked)):
        b = Stage.pick_bucket(rule, sizes)  # the runtime's choice, on the default plan's buckets
        cell = per[b.key]
        cell["calls"] += 1
        cell["work"] += math.prod(b.sizes.values())
        cell["useful"] += math.prod(sizes[a] for a in b.sizes)
    work = sum(c["work"] for c in per.values())
    useful = sum(c["useful"] for c in per.values())
    return {
        "buckets": {
            k: {**c, "padding": round(1 - c["useful"] / c["work"], 3) if c["work"] else None} for k, c in per.items()
        },
        "calls": len(calls),
        "padding": round(1 - useful / work, 3) if work else None,
        "buckets_hit": sum(1 for c in per.values() if c["calls"]),
        "packages": len(plan),
    }


def alternatives(calls: list[dict[str, int]], plan: list[dict[str, int]], metadata: dict) -> dict[str, Any]:
    """The same calls against smaller plans: only the streaming windows (`--no-pow2`), and only the buckets hit."""
    from ttsaot.builder.buckets import StreamingConfig, frame_sizes

    st = StreamingConfig(**metadata["streaming"])
    batches = sorted({b["batch"] for b in plan})
    windows = frame_sizes(st, pow2=False)
    no_pow2 = [{"batch": b, "frames": f} for b in batches for f in windows]
    hit = tally(calls, plan)
    used = [b for b in plan if hit["buckets"][f"b{b['batch']}_f{b['frames']}"]["calls"]]
    out = {}
    for name, alt in (("no_pow2", no_pow2), ("hit_only", used)):
        t = tally(calls, alt)
        out[name] = {
            "packages": len(alt),
            "frames": sorted({b["frames"] for b in alt}),
            "padding": t["padding"],
            "calls": t["calls"],
        }
    return out


def measure_family(family: str, a, rng) -> dict[str, Any]:
    import torch

    from ttsaot.runtime import load

    stage_name = CODEC_STAGES[family]
    plan, meta = default_plan(family, stage_name, "full")
    tiny_plan, _ = default_plan(family, stage_name, "tiny")
    art = build_one_package(family, stage_name, plan, Path(a.work))
    torch.set_num_threads(1)
    stage = load(str(art), device="cpu", stages=[stage_name])[stage_name]
    streaming = dict(stage.metadata["streaming"])
    frame_rate = meta["sample_rate"] / meta["samples_per_frame"]
    rec = {
        "stage": stage_name,
        "default_plan": {
            "packages": len(plan),
            "batch": sorted({b["batch"] for b in plan}),
            "frames": sorted({b["frames"] for b in plan}),
            "same_for_tiny": tiny_plan == plan,
        },
        "streaming": streaming,
        "frame_rate_hz": round(frame_rate, 3),
        "scenarios": {},
    }
    scenarios = [(f"stream_c{c}", "stream", c) for c in STREAM_CONCURRENCY]
    if ONE_SHOT[stage_name]:
        scenarios += [(f"one_shot_c{c}", "one_shot", c) for c in ONE_SHOT_CONCURRENCY]
    all_calls: list[dict[str, int]] = []
    for name, mode, c in scenarios:
        utt = utterance_frames(a.utterances, frame_rate, FRAME_MULTIPLE.get(stage_name, 1), rng)
        r = Recorder(stage)
        t0 = time.time()
        if mode == "stream":
            drive_streams(stage, utt, c, streaming, rng)
        else:
            drive_one_shot(stage, utt, c, rng)
        del stage._run_bucket  # back to the class's method
        rec["scenarios"][name] = {
            "utterances": len(utt),
            "frames_total": sum(utt),
            "seconds": round(time.time() - t0, 1),
            **tally(r.calls, plan),
        }
        all_calls += r.calls
        print(f"[bench bucket-hits] {family}/{stage_name} {name}: {len(r.calls)} calls", file=sys.stderr, flush=True)
    rec["all"] = tally(all_calls, plan)
    rec["alternatives"] = alternatives(all_calls, plan, meta)
    return rec


def main(a) -> int:
    import random

    import torch

    from .common import device_info

    res: dict[str, Any] = {
        "kind": "bucket_hits",
        "schema": 1,
        "device": device_info(torch.device("cpu")),
        "git_commit": git_commit(),
        "started": now_iso(),
        "seed": a.seed,
        "command": "python -m bench bucket-hits",
        "workload": {
            "utterance_seconds": f"log-normal, median {MEDIAN_S}, sigma {SIGMA}, clipped to [{MIN_S}, {MAX_S}]",
            "utterances_per_scenario": a.utterances,
            "stream_concurrency": list(STREAM_CONCURRENCY),
            "one_shot_concurrency": list(ONE_SHOT_CONCURRENCY),
        },
        "notes": [__doc__.split("\n\n")[2].replace("\n", " ")],
        "families": {},
    }
    path = Path(a.result)
    for fam in a.families:
        res["families"][fam] = measure_family(fam, a, random.Random(f"{a.seed}/{fam}"))
        write_json(path, res)
    print(summary(res))
    print(f"→ {path}")
    return 0


def summary(res: dict) -> str:
    lines = []
    for fam, f in res["families"].items():
        al = f["all"]
        lines.append(
            f"{fam}/{f['stage']}: default plan {al['packages']} packages, {al['buckets_hit']} hit over "
            f"{al['calls']} calls, padding {al['padding']:.1%}; windows only "
            f"{f['alternatives']['no_pow2']['packages']} packages → padding "
            f"{f['alternatives']['no_pow2']['padding']:.1%}"
        )
        hits = {k: c["calls"] for k, c in al["buckets"].items() if c["calls"]}
        lines.append("  hits: " + ", ".join(f"{k}={n}" for k, n in sorted(hits.items(), key=lambda kv: -kv[1])))
    return "\n".join(lines)
