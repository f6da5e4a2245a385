"""`python -m bench profile FAMILY/STAGE`: where one stage's call spends its time, per bucket (issue 14 item 1).

The stage's artifact is built (or reused) through the bench's artifact cache (bench/artifacts.py `build_or_reuse`, the
cache `bench run` and `bench build` share; `--kernels` is part of its key), loaded with the runtime (CUDA graphs on
CUDA) and called through its public API, as `bench run` times it (LM stages through `step`/`prefill` with a
runtime-owned cache: bench/variants.py `TtsaotVariant`). Per bucket it records:

- `call_ms`: the median of individually timed calls (on CUDA one call = the input copies + one graph replay);
- under torch.profiler, `calls` more calls: the device kernels (and memcpy/memset) per call, their summed time,
  and the gap = call_ms − that sum (launch latency, host work and idle time between kernels);
- kernels per layer = kernels per call / the layer passes of one call (bench/specs.py `layer_passes`);
- the top kernels by total time (count and µs per call, share of the kernel time);
- on CUDA, the `own` times: each kernel's span less what overlaps earlier activities of the call (programmatic
  dependent launch starts a kernel while its predecessor drains, so spans overlap and their sum passes the call),
  per kernel name (`own_us_per_call`), per kernel name and launch shape (`by_launch`: in a decode stage one row
  per role, e.g. each projection of a layer, with the median own µs of one launch) and in all (`own_ms`: the
  device's busy time within a call);
- on CUDA, the `timeline`: one call's kernels and copies in launch order, each with its median µs over the
  profiled calls (layer by layer where the per-name table sums a conv stack's GEMMs into one row) and each kernel's
  launch shape from the profiler's trace (grid, block, shared memory, registers: the tile an autotuned package
  baked);
- bytes = the stored weights (read once) + the call's inputs and outputs, the floor module's count
  (bench/floor.py), and the GB/s that makes over the kernel time and over the call, next to the copy bandwidth
  measured in the same process. A looped stage reads its transformer stack once per pass: `loop_floor_ms` /
  `x_loop_floor` count those bytes (bench/floor.py `loop_weight_bytes`), the honest floor of such a stage.

On CPU (fp32 unless --dtype, as `bench run`) there is no graph, and the profiler sees the aten ops of the call (the
runtime's input handling, the package's extern calls), not the package's generated C++ kernels: the "kernels" are
those ops (self time) and the gap holds the generated code's time (a smoke test of the harness, never a published
figure). Results: `<out>/<family>__<stage>__<kernels>.json` and a `.txt` table beside it."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from . import RESULTS_SCHEMA
from .common import REPO, as_tuple, device_info, git_commit, now_iso, sync, tensor_bytes, time_fn, write_json

MARK = "bench::profiled_call"  # record_function label around each profiled call (not a kernel)
COPY_KINDS = ("memcpy", "memset")
TIMELINE_LINES = 300  # longer timelines (a looped transformer's ~1,000 kernels) stay in the JSON only
LAUNCH_LINES = 10  # rows of the by-launch-shape table in the text


def add_parser(sub) -> None:
    p = sub.add_parser("profile", help="kernels per call / per layer, top kernels, GB/s and the launch gap of a stage")
    p.add_argument("target", metavar="FAMILY/STAGE[:DTYPE]", help="e.g. voxcpm2/base_lm_step")
    p.add_argument(
        "--axis",
        action="append",
        default=None,
        metavar="NAME=SIZES",
        help="bucket sizes of an axis, e.g. --axis batch=1,16 (default: the bench's buckets)",
    )
    p.add_argument(
        "--kernels",
        default="auto",
        choices=("auto", "ttsaot", "inductor"),
        help="the build's kernel choice (auto = ttsaot on CUDA, inductor on CPU)",
    )
    p.add_argument("--device", default=None)
    p.add_argument("--preset", default=None, help="full (default on CUDA) or tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calls", type=int, default=None, help="profiled calls per bucket (default 20; CPU 3)")
    p.add_argument("--reps", type=int, default=None, help="timed calls per bucket (default 50; CPU 5)")
    p.add_argument("--top", type=int, default=15, help="kernels listed per bucket")
    p.add_argument(
        "--no-graphs",
        dest="graphs",
        action="store_false",
        help="CUDA: load with cuda_graphs=False (the kernels launched one by one, as without graphs)",
    )
    p.add_argument("--cache-dir", default=str(REPO / "bench" / ".cache"))
    p.add_argument("--out", default=None, help="folder (default bench/results/<device>/profiles)")


def main(a) -> int:
    from .common import short_error
    from .prebuild import parse_target
    from .specs import parse_axes

    family, stage, dtype = parse_target(a.target)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        res = profile_stage(
            family,
            stage,
            device=device,
            preset=a.preset,
            dtype=dtype,
            axes=parse_axes(a.axis),
            kernels=a.kernels,
            seed=a.seed,
            calls=a.calls,
            reps=a.reps,
            top=a.top,
            cache=Path(a.cache_dir),
            graphs=a.graphs,
        )
    except (KeyError, ValueError) as e:  # unknown family/stage/axis, bad options: a usage error
        print(f"bench profile: {short_error(e)}", file=sys.stderr)
        return 2
    out = Path(a.out) if a.out else REPO / "bench" / "results" / res["device"]["slug"] / "profiles"
    path = write_profile(res, out)
    print(render(res))
    print(f"→ {path}")
    return 0


def profile_stage(
    family: str,
    stage: str,
    *,
    device: torch.device,
    preset: str | None = None,
    dtype: str | None = None,
    axes: dict[str, tuple[int, ...]] | None = None,
    kernels: str = "auto",
    seed: int = 0,
    calls: int | None = None,
    reps: int | None = None,
    top: int = 15,
    cache: Path = REPO / "bench" / ".cache",
    graphs: bool = True,
) -> dict[str, Any]:
    """Build or reuse the stage's artifact, then profile every bucket of the bench plan (see the module doc)."""

    from .artifacts import build_or_reuse
    from .floor import copy_bandwidth, loop_weight_bytes
    from .specs import layer_passes, make_spec
    from .stage import key_of, make_bucket_inputs
    from .variants import TtsaotVariant, VariantContext

    torch.set_grad_enabled(False)
    cuda = device.type == "cuda"
    if cuda:
        if "CXX" not in os.environ and Path("/usr/bin/g++").exists():
            os.environ["CXX"] = "/usr/bin/g++"  # before any compile (see bench/gpu_all.sh)
        if device.index is None:
            device = torch.device("cuda", 0)
    preset = preset or ("full" if cuda else "tiny")
    calls = calls or (20 if cuda else 3)
    reps = reps or (50 if cuda else 5)
    asked_dtype = dtype
    if not cuda and dtype is None:
        dtype = "fp32"  # as `bench run` on CPU: bf16 takes slow reference paths there (CPU runs are smoke tests)
    spec, desc = make_spec(
        family, stage, preset, seed=seed, axes=axes, dtype=dtype, kernels=kernels, device=device.type
    )
    res: dict[str, Any] = {
        "schema": RESULTS_SCHEMA,
        "kind": "profile",
        "asked_dtype": asked_dtype,
        "started": now_iso(),
        "git_commit": git_commit(),
        "device": device_info(device),
        "stage": desc,
        "kernels": spec.kernels_on(device),
        "settings": {"calls": calls, "reps": reps, "graphs": cuda and graphs, "top": top},
    }
    t0 = time.time()
    artifact, info = build_or_reuse(spec, desc, device, cache, verify=False)
    res["build"] = {**info, "path": str(artifact), "wall_s": round(time.time() - t0, 2)}
    res["copy"] = copy_bandwidth(device)

    ctx = VariantContext(
        family=family,
        stage=stage,
        spec=spec,
        device=device,
        original=None,
        rewritten=None,
        artifact=artifact,
        artifact_error=None,
    )
    variant = TtsaotVariant(ctx, graphs=cuda and graphs)
    variant.setup()
    entry = variant.stage.entry
    res["manifest_kernels"] = entry.kernels
    named_bytes = {
        name: torch.empty(0, dtype=_dtype(w.dtype)).element_size() * _numel(w.shape)
        for name, w in entry.constants.items()
    }
    weight_bytes = sum(named_bytes.values())
    res["weight_bytes"] = weight_bytes
    res["layers"] = layer_passes(family, stage, entry)
    if res["layers"]:
        res["layers"]["loop"] = loop_weight_bytes(named_bytes, res["layers"]["passes"])
    res["buckets"] = {}
    try:
        for i, sizes in enumerate(spec.plan.buckets()):
            xs = make_bucket_inputs(spec, sizes, seed * 1000 + i, device)
            fn = variant.prepare(sizes, xs)
            out = fn(xs)  # first call: captures the graph (CUDA) / loads lazily
            sync(device)
            io = tensor_bytes(xs) + tensor_bytes(as_tuple(out))
            res["buckets"][key_of(sizes)] = profile_bucket(
                fn, xs, device, calls, reps, top, weight_bytes + io, res["copy"]["gb_per_s"], res["layers"]
            )
            res["buckets"][key_of(sizes)].update(sizes=sizes, api=getattr(variant, "api", None), io_bytes=io)
            sampling = sampling_rows(spec.input_names, xs)
            if sampling:
                res["buckets"][key_of(sizes)]["sampling"] = sampling
            del out
    finally:
        variant.close()
    res["status"] = "ok"
    res["finished"] = now_iso()
    return res


# A codebook predictor's per-row sampling inputs: how much of the sampler's work the timed rows asked for (a row
# without top-k or top-p skips that threshold's search, kernels/sample_triton.py).
SAMPLING_INPUTS = ("temperature", "top_k", "top_p")


def sampling_rows(names: list[str], xs: list[torch.Tensor]) -> dict[str, list] | None:
    """The timed rows' sampling parameters by input name (None for a stage without them)."""
    rows = {n: x.tolist() for n, x in zip(names, xs) if n in SAMPLING_INPUTS}
    return rows or None


def profile_bucket(
    fn,
    xs: list[torch.Tensor],
    device: torch.device,
    calls: int,
    reps: int,
    top: int,
    nbytes: int,
    copy_gbps: float,
    layers: dict[str, Any] | None,
) -> dict[str, Any]:
    """Time `fn(xs)`, then profile `calls` calls of it; the per-call kernel table and its totals."""
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = device.type == "cuda"
    timing = time_fn(lambda: fn(xs), device, warmup=3, reps=reps)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(calls):
            with record_function(MARK):
                fn(xs)
        sync(device)
    rows = kernel_rows(prof.key_averages(), cuda, calls)
    kernels = [r for r in rows if r["class"] == "kernel"]
    timeline = kernel_timeline(trace_device_events(prof), calls) if cuda else None
    kernel_us = sum(r["us_per_call"] for r in rows)
    b: dict[str, Any] = {
        "call_ms": timing["ms"],
        "call_p10_ms": timing["p10_ms"],
        "call_p90_ms": timing["p90_ms"],
        "kernels_per_call": round(sum(r["per_call"] for r in kernels), 2),
        "copies_per_call": round(sum(r["per_call"] for r in rows if r["class"] != "kernel"), 2),
        "kernel_ms": kernel_us / 1e3,
        "gap_ms": timing["ms"] - kernel_us / 1e3,
        "bytes": nbytes,
        "floor_ms": nbytes / (copy_gbps * 1e9) * 1e3,
    }
    if kernel_us > 0:
        b["gb_per_s_over_kernels"] = nbytes / (kernel_us * 1e-6) / 1e9
    b["gb_per_s_over_call"] = nbytes / (timing["ms"] * 1e-3) / 1e9
    b["x_floor"] = timing["ms"] / b["floor_ms"] if b["floor_ms"] else None
    if layers and layers.get("passes"):
        b["kernels_per_layer"] = round(b["kernels_per_call"] / layers["passes"], 2)
    add_loop_floor(b, layers, copy_gbps)
    if not kernels and cuda:
        b["note"] = "the profiler recorded no kernels (on a graph replay: CUPTI did not trace it; try --no-graphs)"
    for r in rows:
        r["share"] = round(r["us_per_call"] / kernel_us, 4) if kernel_us else None
    if timeline is not None:
        # the device's busy time within a call: its activities' spans with their overlaps counted once
        own = own_per_name(timeline)
        b["own_ms"] = sum(own.values()) / 1e3
        for r in rows:
            if r["name"] in own:
                r["own_us_per_call"] = round(own[r["name"]], 3)
    b["top"] = rows[:top]
    b["distinct_kernels"] = len(kernels)
    if timeline is not None:
        b["by_launch"] = own_per_launch(timeline)
        b["timeline"] = timeline
    return b


def add_loop_floor(b: dict[str, Any], layers: dict[str, Any] | None, copy_gbps: float) -> None:
    """A looped stage's honest floor (its stack's weights read once per pass, bench/floor.py `loop_weight_bytes`):
    `loop_floor_ms` and `x_loop_floor` beside the weights-once `floor_ms` of bucket record `b`."""
    loop = (layers or {}).get("loop")
    if not loop or not copy_gbps:
        return
    b["loop_bytes"] = b["bytes"] + loop["layer_weight_bytes"] * (loop["repeats"] - 1)
    b["loop_floor_ms"] = b["loop_bytes"] / (copy_gbps * 1e9) * 1e3
    b["x_loop_floor"] = b["call_ms"] / b["loop_floor_ms"]


TRACE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# A kernel's launch shape in the profiler's trace (kineto's args) → its key in the timeline: the grid and block
# give the tile (grid = output tiles × splits) and warps an autotuned package baked, shared memory its pipeline depth.
LAUNCH_ARGS = {"grid": "grid", "block": "block", "shared memory": "smem", "registers per thread": "regs"}


def trace_device_events(prof) -> list[tuple[str, float, float, dict[str, Any]]]:
    """(name, start µs, duration µs, launch) of the device activities (kernels, copies) in the profiler's trace, the
    per-call marker (a GPU annotation, not a kernel) left out; `launch`: a kernel's grid, block, shared memory and
    registers (LAUNCH_ARGS), empty for copies."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    return trace_events(trace)


def trace_events(trace: dict[str, Any]) -> list[tuple[str, float, float, dict[str, Any]]]:
    """trace_device_events on an exported chrome trace (a dict)."""
    out = []
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or e.get("cat") not in TRACE_CATEGORIES or e.get("name") == MARK:
            continue
        args = e.get("args") or {}
        launch = {key: args[name] for name, key in LAUNCH_ARGS.items() if name in args}
        out.append((e["name"], float(e["ts"]), float(e.get("dur", 0.0)), launch))
    return out


def own_times(call: list[tuple]) -> list[float]:
    """Each activity's µs not overlapped by an earlier one of the same call (activities in start order): the time it
    adds to the call. Under programmatic dependent launch a kernel starts while its predecessor drains and waits on
    the GPU, so its span (`us`) counts its predecessor's tail too, and the spans sum past the call (a negative gap)."""
    out, latest = [], float("-inf")
    for _, start, dur, *_ in call:
        end = start + dur
        out.append(max(0.0, end - max(start, latest)))
        latest = max(latest, end)
    return out


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def kernel_timeline(events: list[tuple], calls: int) -> list[dict[str, Any]] | None:
    """One call's device activities in launch order, each with its median duration over the profiled calls (`us`),
    its median time not overlapped by earlier activities (`own_us`, `own_times`) and the first call's launch shape,
    when the events carry one: where a call's time goes layer by layer (the per-name table sums a conv stack's 26
    GEMMs into one row) and which tile each kernel runs. None when the calls did not launch the same sequence (then
    positions cannot be matched across calls)."""
    ordered = sorted(events, key=lambda e: e[1])
    if not ordered or calls < 1 or len(ordered) % calls:
        return None
    n = len(ordered) // calls
    per_call = [ordered[i * n : (i + 1) * n] for i in range(calls)]
    if any([e[0] for e in c] != [e[0] for e in per_call[0]] for c in per_call[1:]):
        return None
    owns = [own_times(c) for c in per_call]
    out = []
    for k in range(n):
        first = per_call[0][k]
        out.append(
            {
                "name": first[0],
                "us": round(_median([c[k][2] for c in per_call]), 2),
                "own_us": round(_median([o[k] for o in owns]), 2),
                **(first[3] if len(first) > 3 else {}),
            }
        )
    return out


def own_per_name(timeline: list[dict[str, Any]]) -> dict[str, float]:
    """The timeline's `own_us` summed per activity name: each kernel's time on the call's path, PDL overlap removed."""
    sums: dict[str, float] = {}
    for e in timeline:
        sums[e["name"]] = sums.get(e["name"], 0.0) + e["own_us"]
    return sums


def own_per_launch(timeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The timeline grouped by kernel name and launch shape, most own time first: in a decode stage each projection
    of a layer has its own grid, so a row is a role (qkv, o, gate_up, down, the head; attention, sampling), with
    its launches per call, the median own µs of one launch and their sum (what `own_per_name` adds up per name)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in timeline:
        groups.setdefault((e["name"], launch_text(e)), []).append(e)
    rows = [
        {
            "name": name,
            "launch": launch,
            "n": len(es),
            "own_us_median": _median([e["own_us"] for e in es]),
            "us_median": _median([e["us"] for e in es]),
            "own_us": round(sum(e["own_us"] for e in es), 2),
        }
        for (name, launch), es in groups.items()
    ]
    return sorted(rows, key=lambda r: -r["own_us"])


def launch_text(entry: dict[str, Any]) -> str:
    """A timeline entry's launch shape in a few characters: `grid 1×64×2 block 128 smem 98304`."""
    parts = []
    if entry.get("grid"):
        parts.append("grid " + "×".join(str(v) for v in entry["grid"]))
    if entry.get("block"):
        parts.append(f"block {entry['block'][0] * entry['block'][1] * entry['block'][2]}")
    if entry.get("smem") is not None:
        parts.append(f"smem {entry['smem']}")
    return " ".join(parts)


def kernel_rows(averages, cuda: bool, calls: int) -> list[dict[str, Any]]:
    """One row per distinct kernel name, by total time: the device activities on CUDA, the profiled ops (self
    time) on CPU; the per-call marker itself is left out."""
    from torch.autograd import DeviceType

    rows = []
    for e in averages:
        if e.key == MARK:
            continue
        if cuda:
            if e.device_type != DeviceType.CUDA:
                continue
            us = e.self_device_time_total
        else:
            us = e.self_cpu_time_total
        low = e.key.lower()
        rows.append(
            {
                "name": e.key,
                "class": "copy" if low.startswith(COPY_KINDS) else "kernel",
                "per_call": round(e.count / calls, 3),
                "us_per_call": round(us / calls, 3),
            }
        )
    rows.sort(key=lambda r: -r["us_per_call"])
    return rows


def _dtype(name: str) -> torch.dtype:
    from ttsaot.runtime.dtypes import torch_dtype

    return torch_dtype(name)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def write_profile(res: dict[str, Any], out: Path) -> Path:
    st = res["stage"]
    name = f"{st['family']}__{st['stage']}" + (f"__{res['asked_dtype']}" if res.get("asked_dtype") else "")
    graphs = "" if res["settings"]["graphs"] or res["device"]["type"] != "cuda" else "__nograph"
    path = out / f"{name}__{res['kernels']}{graphs}.json"
    write_json(path, res)
    path.with_suffix(".txt").write_text(render(res) + "\n")
    return path


def render(res: dict[str, Any]) -> str:
    """The short text table: one block per bucket."""
    st, dev = res["stage"], res["device"]
    lay = res.get("layers") or {}
    lines = [
        f"{st['family']}/{st['stage']} ({st['dtype']}, kernels={res['kernels']}, {dev['name']}, "
        f"graphs={res['settings']['graphs']}); copy {res['copy']['gb_per_s']:.0f} GB/s; weights "
        f"{res['weight_bytes'] / 2**20:.1f} MiB" + (f"; layer passes {lay['passes']} ({lay['how']})" if lay else "")
    ]
    for key, b in res["buckets"].items():
        per_layer = f", {b['kernels_per_layer']}/layer" if "kernels_per_layer" in b else ""
        lines.append(
            f"\n[{key}] call {b['call_ms'] * 1e3:.1f} µs = {b['x_floor']:.2f}× floor ({b['floor_ms'] * 1e3:.1f} µs)"
            + (
                f" = {b['x_loop_floor']:.2f}× the loop floor ({b['loop_floor_ms'] * 1e3:.1f} µs)"
                if "x_loop_floor" in b
                else ""
            )
            + f"; {b['kernels_per_call']:g} kernels/call{per_layer} + {b['copies_per_call']:g} copies; kernel sum "
            f"{b['kernel_ms'] * 1e3:.1f} µs, gap {b['gap_ms'] * 1e3:.1f} µs; "
            f"{b.get('gb_per_s_over_kernels', 0):.0f} GB/s over kernels, {b['gb_per_s_over_call']:.0f} over the call"
            + (f"; busy {b['own_ms'] * 1e3:.1f} µs (kernel spans, overlaps counted once)" if "own_ms" in b else "")
        )
        if b.get("note"):
            lines.append(f"  note: {b['note']}")
        if b.get("sampling"):
            lines.append("  sampling rows: " + ", ".join(f"{n} {v}" for n, v in b["sampling"].items()))
        lines.append(f"  {'µs/call':>9} {'own µs':>9} {'n/call':>7} {'share':>6}  kernel")
        for r in b["top"]:
            share = f"{r['share']:.0%}" if r["share"] is not None else "—"
            own = f"{r['own_us_per_call']:9.2f}" if "own_us_per_call" in r else f"{'—':>9}"
            lines.append(f"  {r['us_per_call']:9.2f} {own} {r['per_call']:7.3g} {share:>6}  {r['name'][:100]}")
        # (from the timeline where a profile predates `by_launch`)
        by_launch = b.get("by_launch") or (own_per_launch(b["timeline"]) if b.get("timeline") else None)
        if by_launch:
            lines.append(
                f"  by launch shape (top {LAUNCH_LINES}): {'n':>4} {'own µs each':>11} {'own µs':>9}  kernel  launch"
            )
            lines += [
                f"  {'':28}{r['n']:4d} {r['own_us_median']:11.2f} {r['own_us']:9.2f}  {r['name'][:60]}  {r['launch']}"
                for r in by_launch[:LAUNCH_LINES]
            ]
        if b.get("timeline") and len(b["timeline"]) > TIMELINE_LINES:
            lines.append(f"  one call in launch order: {len(b['timeline'])} activities, in the JSON's `timeline`")
        elif b.get("timeline"):
            lines.append("  one call in launch order (median µs over the profiled calls: span, not overlapped):")
            lines += [
                f"  {i:4d} {e['us']:9.2f} {e.get('own_us', e['us']):9.2f}  {e['name'][:80]}  {launch_text(e)}".rstrip()
                for i, e in enumerate(b["timeline"])
            ]
    return "\n".join(lines)
