"""VoxCPM2 `base_lm_step` built twice from the same random weights, `--kernels ttsaot` and `--kernels inductor`,
served by the runtime (CUDA graphs), checked against each other and timed against eager, torch.compile and the
byte floor, in ONE process (one command, ~4 minutes on an H100):

    CXX=/usr/bin/g++ python -m bench decode-stages --out $OUT            # GPU: preset full, bf16
    python -m bench decode-stages --device cpu --preset tiny --out /tmp/x  # CPU smoke run (no figures)

Per batch bucket (default 1 and 16), every row at position max_len - 1 (context = max_len, the smallest cache the
build offers by default: --max-len 512):
- `check`: outputs (hidden, lm_hidden, stop_logits) and the step's KV slot after one step, ttsaot artifact vs
  inductor artifact and each vs the eager bf16 module, as ‖a − b‖/‖b‖, against the stage tolerance (manifest), and
  `<kind>_wrote_slot_in_place`: the runtime's cache tensor holds the new slot and nothing else changed (a package
  that copied the cache instead of re-inplacing the functionalized write would leave it unchanged);
- `ttsaot` / `inductor`: median replay of the runtime's CUDA graph of the step (`replay_ms`) and of a whole
  `stage.step()` call with its host work (`step_ms`); `x_floor` = replay / floor;
- `eager` (plain calls), `eager_graph` and `compile_graph` (torch.compile(mode=--compile-mode) of the same bf16
  module, replayed through runtime.graphs.StaticGraph; `compile_s` = its first call);
- `floor_ms` = (stage weight bytes + KV bytes read: positions 0..max_len-1 of every layer's k and v) / the copy
  bandwidth measured at the start of the run (`copy`, 1 GiB D2D, bytes read + written).
`--layers N` builds the full-size model with N of its 28 base-LM layers (default 8 on CUDA, to fit the time box;
the figures per layer and the ratios to the floor carry over to 28); the JSON records the layer count. Sections
that would start after `--budget` seconds are recorded as skipped; the JSON is rewritten after each section, so a
killed run keeps what it measured. Written to <out>/<device-slug>/decode_stages.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ttsaot.runtime.graphs import StaticGraph

from . import RESULTS_SCHEMA
from .common import device_info, git_commit, now_iso, rel_err, short_error, sync, time_fn, write_json

STAGE = "base_lm_step"
KINDS = ("ttsaot", "inductor")
DEFAULT_LAYERS_CUDA = 8


@contextlib.contextmanager
def _preset_layers(preset: str, layers: int | None) -> Iterator[None]:
    """The named LM preset with its base LM cut to `layers` layers (same dims), for this block only."""
    from ttsaot.builder.families.voxcpm2.config import LM_PRESETS

    saved = LM_PRESETS[preset]
    if layers is not None:
        LM_PRESETS[preset] = replace(saved, lm=replace(saved.lm, num_hidden_layers=layers))
    try:
        yield
    finally:
        LM_PRESETS[preset] = saved


def _options(a: argparse.Namespace, kernels: str):
    from ttsaot.builder.families.voxcpm2.options import VoxCPM2Options

    return VoxCPM2Options(preset=a.preset, dtype=torch.bfloat16, batch_buckets=tuple(a.batches),
                          max_len=a.max_len, seed=a.seed, kernels=kernels)


def _graph_ms(fn: Callable[[], Any], reps: int, device: torch.device) -> float:
    """Median of `reps` timed replays of a StaticGraph around fn (CPU: plain calls)."""
    if device.type != "cuda":
        return time_fn(fn, device, 1, reps)["ms"]
    g = StaticGraph(lambda _inputs: fn(), [], device=device)
    return time_fn(g.replay, device, 3, reps)["ms"]


def _replay_ms(stage, cache, reps: int, device: torch.device) -> float | None:
    """The runtime's own graph of this (bucket, cache), replayed alone: the step without its host work."""
    graphs = [g for (_, cid), g in stage._graphs.items() if cid == id(cache) and g.captured]
    if not graphs:
        return None
    return time_fn(graphs[0].replay, device, 3, reps)["ms"]


def run(a: argparse.Namespace, progress: Callable[[dict], None] | None = None) -> dict[str, Any]:
    from ttsaot.builder.build import build_family
    from ttsaot.builder.families.voxcpm2 import FAMILY as VOX
    from ttsaot.builder.families.voxcpm2.config import LM_PRESETS
    from ttsaot.builder.passes import cast_to_compute_dtype
    from ttsaot.runtime import load
    from ttsaot.runtime.dtypes import torch_dtype

    from .kernels import _peak_copy

    dev = torch.device(a.device)
    torch.set_grad_enabled(False)
    t_start = time.time()
    res: dict[str, Any] = {"schema": RESULTS_SCHEMA, "kind": "decode_stages", "started": now_iso(),
                           "git_commit": git_commit(), "device": device_info(dev), "stage": f"voxcpm2/{STAGE}",
                           "sections": {}}

    def left() -> float:
        return a.budget - (time.time() - t_start)

    def save() -> None:
        res["seconds"] = round(time.time() - t_start, 1)
        if progress:
            progress(res)

    reps = a.reps if dev.type == "cuda" else 3
    res["sections"]["copy"] = peak = _peak_copy(reps, dev)
    work = Path(tempfile.mkdtemp(prefix="bench-decode-stages-", dir=a.work))
    model_layers = LM_PRESETS[a.preset].lm.num_hidden_layers
    try:
        with _preset_layers(a.preset, a.layers):
            cfg = LM_PRESETS[a.preset]
            specs = {k: VOX.specs(_options(a, k), [STAGE])[0] for k in KINDS}
            res["config"] = {"preset": a.preset, "dtype": "bf16", "batch_buckets": a.batches, "max_len": a.max_len,
                             "position": a.max_len - 1, "context": a.max_len,
                             "layers": cfg.lm.num_hidden_layers, "model_layers": model_layers,
                             "hidden": cfg.lm.hidden_size, "kv_heads": cfg.lm.num_key_value_heads,
                             "head_dim": cfg.lm.head_dim, "seed": a.seed, "compile_mode": a.compile_mode,
                             "reps": reps, "budget_s": a.budget}
            # ------------------------------------------------------------------ builds (same seed, same weights)
            built: dict[str, Path] = {}
            for k in KINDS:
                t0 = time.time()
                try:
                    built[k] = build_family(VOX.name, [specs[k]], work / k, dev, seed=a.seed,
                                            verify_in_subprocess=False).path
                    res["sections"][f"build_{k}"] = {"seconds": round(time.time() - t0, 1)}
                except Exception as e:  # noqa: BLE001
                    res["sections"][f"build_{k}"] = {"error": short_error(e), "seconds": round(time.time() - t0, 1)}
                save()
            if not built:
                res["status"] = "error: no build"
                return res
            # A failed build is recorded above; the other one is still measured (with eager and compile).
            bundles = {k: load(built[k], device=dev) for k in KINDS if k in built}
            stages = {k: b[STAGE] for k, b in bundles.items()}
            entry = next(iter(stages.values())).entry
            res["kernels_recorded"] = {k: st.entry.kernels for k, st in stages.items()}
            weight_bytes = sum(torch.empty(0, dtype=torch_dtype(w.dtype)).element_size() * _numel(w.shape)
                               for w in entry.constants.values())
            # ------------------------------------------------------------------------------ eager module
            module = specs["inductor"].make_module().eval()
            for p in specs["inductor"].passes:
                p(module)
            module = cast_to_compute_dtype(module, torch.bfloat16).to(dev).eval()
            compiled = None
            mcfg = cfg.lm
            for B in a.batches:
                key = f"B={B}"
                if left() <= 0:
                    res["sections"][key] = {"skipped": "time budget used up"}
                    continue
                res["sections"][key] = out = _bench_bucket(
                    a, B, dev, stages, module, mcfg, weight_bytes, peak["gb_per_s"], entry.tolerance, reps)
                save()
                if a.compile and dev.type == "cuda":
                    if left() <= 0:
                        out["compile_graph"] = {"skipped": "time budget used up"}
                        continue
                    try:
                        if compiled is None:
                            compiled = torch.compile(module, mode=a.compile_mode, dynamic=False)
                        out["compile_graph"] = _bench_eager(compiled, B, dev, mcfg, a.max_len, reps, graph=True)
                        out["compile_graph"]["x_floor"] = out["compile_graph"]["ms"] / out["floor_ms"]
                        if "ttsaot" in out:
                            out["ttsaot_speedup_vs_compile_graph"] = (out["compile_graph"]["ms"]
                                                                      / out["ttsaot"]["replay_ms"])
                    except Exception as e:  # noqa: BLE001
                        out["compile_graph"] = {"error": short_error(e)}
                    save()
            res["status"] = "ok" if all(
                res["sections"].get(f"B={B}", {}).get("check", {}).get("agree") for B in a.batches) else "check failed"
            return res
    finally:
        shutil.rmtree(work, ignore_errors=True)
        res["seconds"] = round(time.time() - t_start, 1)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _inputs(B: int, dev: torch.device, mcfg, max_len: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(B)
    shape = [mcfg.num_hidden_layers, B, mcfg.num_key_value_heads, max_len + 1, mcfg.head_dim]
    return {"embeds": torch.randn(B, mcfg.hidden_size, generator=g).to(dev),
            "positions": torch.full((B,), max_len - 1, dtype=torch.long, device=dev),
            "k": (torch.randn(shape, generator=g) * 0.5).to(dev, torch.bfloat16),
            "v": torch.randn(shape, generator=g).to(dev, torch.bfloat16)}


def _bench_eager(fn, B: int, dev: torch.device, mcfg, max_len: int, reps: int, graph: bool) -> dict:
    t = _inputs(B, dev, mcfg, max_len)
    t0 = time.time()
    fn(t["embeds"], t["positions"], t["k"], t["v"])
    sync(dev)
    first_s = time.time() - t0

    def call():
        return fn(t["embeds"], t["positions"], t["k"], t["v"])

    ms = _graph_ms(call, reps, dev) if graph else time_fn(call, dev, 3, reps)["ms"]
    return {"ms": ms, "first_call_s" if not graph else "compile_s": round(first_s, 2)}


def _bench_bucket(a, B: int, dev: torch.device, stages: dict, module, mcfg, weight_bytes: int, peak_gbps: float,
                  tolerance: float, reps: int) -> dict:
    t = _inputs(B, dev, mcfg, a.max_len)
    kv_bytes = 2 * mcfg.num_hidden_layers * B * mcfg.num_key_value_heads * a.max_len * mcfg.head_dim * 2
    floor_ms = (weight_bytes + kv_bytes) / (peak_gbps * 1e9) * 1e3
    out: dict[str, Any] = {"B": B, "weight_bytes": weight_bytes, "kv_bytes_read": kv_bytes, "floor_ms": floor_ms}
    # -------------------------------------------------------------------------------------------- check
    results, caches = {}, {}
    for k, st in stages.items():
        cache = st.new_cache(B)
        cache.k.copy_(t["k"])
        cache.v.copy_(t["v"])
        cache.positions[:] = a.max_len - 1
        results[k] = [o.float() for o in st.step(t["embeds"], cache=cache)]
        caches[k] = cache
    ek, ev = t["k"].clone(), t["v"].clone()
    eager = [o.float() for o in module(t["embeds"], t["positions"], ek, ev)]
    names = [o.name for o in next(iter(stages.values())).entry.outputs]
    pos = a.max_len - 1
    check: dict[str, Any] = {"tolerance": tolerance}
    refs = {**results, "eager": eager}
    ref_caches = {**{k: (c.k, c.v) for k, c in caches.items()}, "eager": (ek, ev)}
    for kind, other in (("ttsaot", "inductor"), ("ttsaot", "eager"), ("inductor", "eager")):
        if kind not in results or other not in refs:
            continue
        for n, got, want in zip(names, results[kind], refs[other]):
            check[f"{n}_{kind}_vs_{other}"] = rel_err(got, want)
        # This step's slot (position max_len - 1 of every layer / row / kv head), and everything else untouched:
        # a copy of the cache inside the package instead of an in-place write would leave the slot as it was.
        for c, got, want in zip("kv", (caches[kind].k, caches[kind].v), ref_caches[other]):
            check[f"{c}_slot_{kind}_vs_{other}"] = rel_err(got[:, :, :, pos].float(), want[:, :, :, pos].float())
    for kind, c in caches.items():
        check[f"{kind}_wrote_slot_in_place"] = bool(
            not torch.equal(c.k[:, :, :, pos], t["k"][:, :, :, pos])
            and torch.equal(c.k[:, :, :, :pos], t["k"][:, :, :, :pos]))
    check["agree"] = len(results) == len(KINDS) and all(
        v <= tolerance for n, v in check.items() if n.endswith(("_vs_inductor", "_vs_eager"))) and all(
        v for n, v in check.items() if n.endswith("_in_place"))
    out["check"] = check
    # --------------------------------------------------------------------------------------------- time
    for k, st in stages.items():
        cache = caches[k]

        def step(st=st, cache=cache):
            cache.positions[:] = a.max_len - 1
            return st.step(t["embeds"], cache=cache)

        replay = _replay_ms(st, cache, reps, dev)
        step_ms = time_fn(step, dev, 3, reps)["ms"]
        out[k] = {"replay_ms": replay, "step_ms": step_ms,
                  "x_floor": (replay if replay is not None else step_ms) / floor_ms}
        st.release(cache)
    out["eager"] = _bench_eager(module, B, dev, mcfg, a.max_len, reps, graph=False)
    if dev.type == "cuda":
        out["eager_graph"] = _bench_eager(module, B, dev, mcfg, a.max_len, reps, graph=True)
        out["eager_graph"].pop("compile_s", None)
    ms = {k: out[k]["replay_ms"] or out[k]["step_ms"] for k in stages}
    if len(ms) == len(KINDS):
        out["ttsaot_speedup_vs_inductor"] = ms["inductor"] / ms["ttsaot"]
    return out


def summary(res: dict) -> str:
    lines = [f"decode-stages {res.get('stage')} on {res['device'].get('name', res['device']['type'])}: "
             f"{res.get('status')} ({res.get('seconds')} s)"]
    for key, s in res.get("sections", {}).items():
        if not key.startswith("B="):
            continue
        if "floor_ms" not in s:
            lines.append(f"  {key}: {s}")
            continue

        def ms(kind: str, s=s) -> str:
            v = s.get(kind, {})
            t = v.get("replay_ms") or v.get("step_ms") or v.get("ms")
            return "-" if t is None else f"{t:.4f} ms ({t / s['floor_ms']:.2f}x)"

        lines.append(f"  {key}: floor {s['floor_ms']:.4f} ms; ttsaot {ms('ttsaot')}, inductor {ms('inductor')}, "
                     f"eager {ms('eager')}, eager+graph {ms('eager_graph')}, compile+graph {ms('compile_graph')}; "
                     f"agree={s['check']['agree']}")
    return "\n".join(lines)


def add_parser(sub) -> None:
    p = sub.add_parser("decode-stages", help="VoxCPM2 base_lm_step: --kernels ttsaot vs inductor artifacts, eager, "
                                             "torch.compile, byte floor")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu (smoke run)")
    p.add_argument("--preset", default=None, help="full (default on CUDA) or tiny (default on CPU)")
    p.add_argument("--batches", type=lambda v: [int(x) for x in v.split(",") if x.strip()], default=[1, 16])
    p.add_argument("--max-len", type=int, default=None, help="KV cache length (default 512; tiny: 32)")
    p.add_argument("--layers", type=int, default=None,
                   help=f"base-LM layers built (default {DEFAULT_LAYERS_CUDA} for preset full, all for tiny)")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--budget", type=float, default=200.0, help="seconds; later buckets/sections are skipped")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile")
    p.add_argument("--compile-mode", default="max-autotune-no-cudagraphs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default=None, help="folder for the temporary artifacts (default: the temp dir)")
    p.add_argument("--result", default=None)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))


def main(a: argparse.Namespace) -> int:
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    a.preset = a.preset or ("full" if a.device.startswith("cuda") else "tiny")
    a.max_len = a.max_len or (512 if a.preset == "full" else 32)
    if a.layers is None and a.preset == "full":
        a.layers = DEFAULT_LAYERS_CUDA
    if a.device.startswith("cuda") and "CXX" not in os.environ and Path("/usr/bin/g++").exists():
        os.environ["CXX"] = "/usr/bin/g++"      # AOTI packages built with another compiler segfault on load
    slug = device_info(torch.device(a.device))["slug"]
    path = Path(a.result) if a.result else Path(a.out) / slug / "decode_stages.json"
    res = run(a, progress=lambda r: write_json(path, r))
    write_json(path, res)
    print(summary(res))
    print(f"→ {path}")
    return 0 if res.get("status") == "ok" else 1

