"""A VoxCPM2 decode step (`--stage base_lm_step`, the default, or `residual_lm_step`) built twice from the same random
weights, `--kernels ttsaot` and `--kernels inductor`, served by the runtime (CUDA graphs), checked against each other
and timed against eager, torch.compile and the byte floor, in ONE process (one command, ~4 minutes on an H100):

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
- `profile` (CUDA) per artifact: the runtime graph's replay under torch.profiler (bench/profile.py's
  profile_bucket): kernels per call and per layer, the top kernels, kernel-time sum vs replay (the gap);
- `floor_ms` = (stage weight bytes + KV bytes read: positions 0..max_len-1 of every layer's k and v) / the copy
  bandwidth measured at the start of the run (`copy`, 1 GiB D2D, bytes read + written).
`--layers N` builds the full-size model with N of the stage's LM layers (base LM: default 8 of its 28 on CUDA, to fit
the time box; the figures per layer and the ratios to the floor carry over to 28; residual LM: all 8); the JSON
records the layer count. Sections
that would start after `--budget` seconds are recorded as skipped; the JSON is rewritten after each section, so a
killed run keeps what it measured. Written to <out>/<device-slug>/decode_stages.json (base_lm_step) or
decode_stages_<stage>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ttsaot.runtime.graphs import StaticGraph

from . import RESULTS_SCHEMA
from .common import device_info, git_commit, now_iso, rel_err, short_error, sync, time_fn, write_json

KINDS = ("ttsaot", "inductor")
# --pdl-ab: the ttsaot artifact built again without programmatic dependent launch (TTSAOT_PDL=0,
# builder/kernels/pdl.py), measured beside it in the same process.
NOPDL = "ttsaot_nopdl"


def _kinds(a: argparse.Namespace) -> tuple[str, ...]:
    return KINDS + ((NOPDL,) if getattr(a, "pdl_ab", False) else ())


@contextlib.contextmanager
def _build_env(kind: str) -> Iterator[None]:
    """TTSAOT_PDL=0 while the no-PDL variant builds (its compile workers inherit it; the package key includes it)."""
    if kind != NOPDL:
        yield
        return
    saved = os.environ.get("TTSAOT_PDL")
    os.environ["TTSAOT_PDL"] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TTSAOT_PDL", None)
        else:
            os.environ["TTSAOT_PDL"] = saved


DEFAULT_LAYERS_CUDA = 8  # base LM layers built on CUDA by default (of 28)


@dataclass(frozen=True)
class StepStage:
    """What differs between the two VoxCPM2 decode steps: which LM config they run (and the preset field that sets
    its layer count) and the host inputs before positions/k/v (hidden-size vectors per row)."""

    name: str
    layers_field: str  # VoxCPM2LMConfig field cut by --layers ("lm" = lm.num_hidden_layers)
    host_inputs: tuple[str, ...]  # [B, hidden] float inputs, in call order

    def lm(self, cfg):
        return cfg.lm if self.layers_field == "lm" else cfg.residual

    def cut(self, cfg, layers: int):
        if self.layers_field == "lm":
            return replace(cfg, lm=replace(cfg.lm, num_hidden_layers=layers))
        return replace(cfg, **{self.layers_field: layers})


STEP_STAGES = {
    s.name: s
    for s in (
        StepStage("base_lm_step", "lm", ("embeds",)),
        StepStage("residual_lm_step", "residual_lm_num_layers", ("lm_hidden", "feat_embed")),
    )
}


@contextlib.contextmanager
def _preset_layers(preset: str, step: StepStage, layers: int | None) -> Iterator[None]:
    """The named LM preset with the stage's LM cut to `layers` layers (same dims), for this block only."""
    from ttsaot.builder.families.voxcpm2.config import LM_PRESETS

    saved = LM_PRESETS[preset]
    if layers is not None:
        LM_PRESETS[preset] = step.cut(saved, layers)
    try:
        yield
    finally:
        LM_PRESETS[preset] = saved


def _options(a: argparse.Namespace, kernels: str):
    from ttsaot.builder.families.voxcpm2.options import VoxCPM2Options

    return VoxCPM2Options(
        preset=a.preset,
        dtype=torch.bfloat16,
        batch_buckets=tuple(a.batches),
        max_len=a.max_len,
        seed=a.seed,
        kernels=kernels,
    )


def _graph_ms(fn: Callable[[], Any], reps: int, device: torch.device) -> float:
    """Median of `reps` timed replays of a StaticGraph around fn (CPU: plain calls)."""
    if device.type != "cuda":
        return time_fn(fn, device, 1, reps)["ms"]
    g = StaticGraph(lambda _inputs: fn(), [], device=device)
    return time_fn(g.replay, device, 3, reps)["ms"]


def _graph_of(stage, cache):
    """The runtime's own captured graph of this (bucket, cache), or None."""
    graphs = [g for (_, cid), g in stage._graphs.items() if cid == id(cache) and g.captured]
    return graphs[0] if graphs else None


def _replay_ms(stage, cache, reps: int, device: torch.device) -> float | None:
    """The runtime's own graph of this (bucket, cache), replayed alone: the step without its host work."""
    g = _graph_of(stage, cache)
    return None if g is None else time_fn(g.replay, device, 3, reps)["ms"]


def _profile(stage, cache, device: torch.device, reps: int, nbytes: int, copy_gbps: float, layers: int) -> dict:
    """The graph replay under torch.profiler (kernels per call / per layer, top kernels, kernel sum vs replay)."""
    from .profile import profile_bucket

    g = _graph_of(stage, cache)
    if g is None:
        return {"skipped": "no captured graph"}
    try:
        return profile_bucket(
            lambda _xs: g.replay(),
            [],
            device,
            calls=20,
            reps=reps,
            top=12,
            nbytes=nbytes,
            copy_gbps=copy_gbps,
            layers={"passes": layers},
        )
    except Exception as e:  # noqa: BLE001 - a profiler failure must not lose the timings
        return {"error": short_error(e)}


def _as_list(out) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else list(out)


def run(a: argparse.Namespace, progress: Callable[[dict], None] | None = None) -> dict[str, Any]:
    from ttsaot.builder.build import build_family, prepare_modules
    from ttsaot.builder.families.voxcpm2 import FAMILY as VOX
    from ttsaot.builder.families.voxcpm2.config import LM_PRESETS
    from ttsaot.builder.passes import cast_to_compute_dtype
    from ttsaot.runtime import load
    from ttsaot.runtime.dtypes import torch_dtype

    from .kernels import _peak_copy

    dev = torch.device(a.device)
    step = STEP_STAGES[a.stage]
    stage_name = step.name
    torch.set_grad_enabled(False)
    t_start = time.time()
    res: dict[str, Any] = {
        "schema": RESULTS_SCHEMA,
        "kind": "decode_stages",
        "started": now_iso(),
        "git_commit": git_commit(),
        "device": device_info(dev),
        "stage": f"voxcpm2/{stage_name}",
        "sections": {},
    }

    def left() -> float:
        return a.budget - (time.time() - t_start)

    def save() -> None:
        res["seconds"] = round(time.time() - t_start, 1)
        if progress:
            progress(res)

    reps = a.reps if dev.type == "cuda" else 3
    res["sections"]["copy"] = peak = _peak_copy(reps, dev)
    work = Path(tempfile.mkdtemp(prefix="bench-decode-stages-", dir=a.work))
    model_layers = step.lm(LM_PRESETS[a.preset]).num_hidden_layers
    try:
        with _preset_layers(a.preset, step, a.layers):
            cfg = LM_PRESETS[a.preset]
            mcfg = step.lm(cfg)
            kinds = _kinds(a)
            specs = {k: VOX.specs(_options(a, "ttsaot" if k == NOPDL else k), [stage_name])[0] for k in kinds}
            res["config"] = {
                "preset": a.preset,
                "dtype": "bf16",
                "batch_buckets": a.batches,
                "max_len": a.max_len,
                "position": a.max_len - 1,
                "context": a.max_len,
                "layers": mcfg.num_hidden_layers,
                "model_layers": model_layers,
                "hidden": mcfg.hidden_size,
                "kv_heads": mcfg.num_key_value_heads,
                "head_dim": mcfg.head_dim,
                "seed": a.seed,
                "compile_mode": a.compile_mode,
                "reps": reps,
                "budget_s": a.budget,
            }
            # ------------------------------------------------------------------ builds (same seed, same weights)
            built: dict[str, Path] = {}
            for k in kinds:
                t0 = time.time()
                try:
                    with _build_env(k):
                        built[k] = build_family(
                            VOX.name, [specs[k]], work / k, dev, seed=a.seed, verify_in_subprocess=False, jobs=a.jobs
                        ).path
                    res["sections"][f"build_{k}"] = {"seconds": round(time.time() - t0, 1), "jobs": a.jobs}
                except Exception as e:  # noqa: BLE001
                    res["sections"][f"build_{k}"] = {"error": short_error(e), "seconds": round(time.time() - t0, 1)}
                save()
            if not built:
                res["status"] = "error: no build"
                return res
            # A failed build is recorded above; the other one is still measured (with eager and compile).
            bundles = {k: load(built[k], device=dev) for k in kinds if k in built}
            stages = {k: b[stage_name] for k, b in bundles.items()}
            entry = next(iter(stages.values())).entry
            res["kernels_recorded"] = {k: st.entry.kernels for k, st in stages.items()}
            weight_bytes = sum(
                torch.empty(0, dtype=torch_dtype(w.dtype)).element_size() * _numel(w.shape)
                for w in entry.constants.values()
            )
            # ------------------------------------------------------------------------------ eager module
            _, module, _ = prepare_modules(specs["inductor"], "inductor")
            module = cast_to_compute_dtype(module, torch.bfloat16).to(dev).eval()
            compiled = None
            for B in a.batches:
                key = f"B={B}"
                if left() <= 0:
                    res["sections"][key] = {"skipped": "time budget used up"}
                    continue
                res["sections"][key] = out = _bench_bucket(
                    a, step, B, dev, stages, module, mcfg, weight_bytes, peak["gb_per_s"], entry.tolerance, reps
                )
                save()
                if a.compile and dev.type == "cuda":
                    if left() <= 0:
                        out["compile_graph"] = {"skipped": "time budget used up"}
                        continue
                    try:
                        if compiled is None:
                            compiled = torch.compile(module, mode=a.compile_mode, dynamic=False)
                        out["compile_graph"] = _bench_eager(compiled, step, B, dev, mcfg, a.max_len, reps, graph=True)
                        out["compile_graph"]["x_floor"] = out["compile_graph"]["ms"] / out["floor_ms"]
                        if "ttsaot" in out:
                            out["ttsaot_speedup_vs_compile_graph"] = (
                                out["compile_graph"]["ms"] / out["ttsaot"]["replay_ms"]
                            )
                    except Exception as e:  # noqa: BLE001
                        out["compile_graph"] = {"error": short_error(e)}
                    save()
            res["status"] = status(res)
            return res
    finally:
        shutil.rmtree(work, ignore_errors=True)
        res["seconds"] = round(time.time() - t_start, 1)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _inputs(step: StepStage, B: int, dev: torch.device, mcfg, max_len: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(B)
    shape = [mcfg.num_hidden_layers, B, mcfg.num_key_value_heads, max_len + 1, mcfg.head_dim]
    host = {n: torch.randn(B, mcfg.hidden_size, generator=g).to(dev) for n in step.host_inputs}
    return {
        **host,
        "positions": torch.full((B,), max_len - 1, dtype=torch.long, device=dev),
        "k": (torch.randn(shape, generator=g) * 0.5).to(dev, torch.bfloat16),
        "v": torch.randn(shape, generator=g).to(dev, torch.bfloat16),
    }


def _bench_eager(fn, step: StepStage, B: int, dev: torch.device, mcfg, max_len: int, reps: int, graph: bool) -> dict:
    t = _inputs(step, B, dev, mcfg, max_len)
    args = [t[n] for n in step.host_inputs] + [t["positions"], t["k"], t["v"]]
    t0 = time.time()
    fn(*args)
    sync(dev)
    first_s = time.time() - t0

    def call():
        return fn(*args)

    ms = _graph_ms(call, reps, dev) if graph else time_fn(call, dev, 3, reps)["ms"]
    return {"ms": ms, "first_call_s" if not graph else "compile_s": round(first_s, 2)}


def _bench_bucket(
    a,
    step: StepStage,
    B: int,
    dev: torch.device,
    stages: dict,
    module,
    mcfg,
    weight_bytes: int,
    peak_gbps: float,
    tolerance: float,
    reps: int,
) -> dict:
    t = _inputs(step, B, dev, mcfg, a.max_len)
    host = [t[n] for n in step.host_inputs]
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
        results[k] = [o.float() for o in _as_list(st.step(*host, cache=cache))]
        caches[k] = cache
    ek, ev = t["k"].clone(), t["v"].clone()
    eager = [o.float() for o in _as_list(module(*host, t["positions"], ek, ev))]
    names = [o.name for o in next(iter(stages.values())).entry.outputs]
    pos = a.max_len - 1
    check: dict[str, Any] = {"tolerance": tolerance}
    refs = {**results, "eager": eager}
    ref_caches = {**{k: (c.k, c.v) for k, c in caches.items()}, "eager": (ek, ev)}
    pairs = (("ttsaot", "inductor"), ("ttsaot", "eager"), ("inductor", "eager"), (NOPDL, "eager"), ("ttsaot", NOPDL))
    for kind, other in pairs:
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
            and torch.equal(c.k[:, :, :, :pos], t["k"][:, :, :, :pos])
        )
    check["agree"] = (
        set(KINDS) <= set(results)
        and all(v <= tolerance for n, v in check.items() if n.endswith(("_vs_inductor", "_vs_eager", "_vs_" + NOPDL)))
        and all(v for n, v in check.items() if n.endswith("_in_place"))
    )
    out["check"] = check
    # --------------------------------------------------------------------------------------------- time
    for k, st in stages.items():
        cache = caches[k]

        def step_call(st=st, cache=cache):
            cache.positions[:] = a.max_len - 1
            return st.step(*host, cache=cache)

        replay = _replay_ms(st, cache, reps, dev)
        step_ms = time_fn(step_call, dev, 3, reps)["ms"]
        out[k] = {
            "replay_ms": replay,
            "step_ms": step_ms,
            "x_floor": (replay if replay is not None else step_ms) / floor_ms,
        }
        if dev.type == "cuda" and a.profile:
            out[k]["profile"] = _profile(
                st, cache, dev, reps, weight_bytes + kv_bytes, peak_gbps, mcfg.num_hidden_layers
            )
        st.release(cache)
    out["eager"] = _bench_eager(module, step, B, dev, mcfg, a.max_len, reps, graph=False)
    if dev.type == "cuda":
        out["eager_graph"] = _bench_eager(module, step, B, dev, mcfg, a.max_len, reps, graph=True)
        out["eager_graph"].pop("compile_s", None)
    ms = {k: out[k]["replay_ms"] or out[k]["step_ms"] for k in stages}
    if set(KINDS) <= set(ms):
        out["ttsaot_speedup_vs_inductor"] = ms["inductor"] / ms["ttsaot"]
    if {"ttsaot", NOPDL} <= set(ms):
        out["pdl_speedup"] = ms[NOPDL] / ms["ttsaot"]
    return out


def status(res: dict) -> str:
    """ "check failed" if a measured bucket disagrees, "incomplete" if one was skipped (time box), else "ok"."""
    buckets = [s for k, s in res.get("sections", {}).items() if k.startswith("B=")]
    if any("check" in s and not s["check"].get("agree") for s in buckets):
        return "check failed"
    if not buckets:
        return "incomplete: no bucket measured"
    if any("check" not in s for s in buckets):
        return (
            "incomplete: "
            + ", ".join(k for k, s in res.get("sections", {}).items() if k.startswith("B=") and "check" not in s)
            + " not measured"
        )
    return "ok"


def summary(res: dict) -> str:
    lines = [
        f"decode-stages {res.get('stage')} on {res['device'].get('name', res['device']['type'])}: "
        f"{status(res)} ({res.get('seconds')} s)"
    ]
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

        lines.append(
            f"  {key}: floor {s['floor_ms']:.4f} ms; ttsaot {ms('ttsaot')}, "
            + (f"ttsaot without PDL {ms(NOPDL)}, " if NOPDL in s else "")
            + f"inductor {ms('inductor')}, "
            f"eager {ms('eager')}, eager+graph {ms('eager_graph')}, compile+graph {ms('compile_graph')}; "
            f"agree={s['check']['agree']}"
        )
    return "\n".join(lines)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "decode-stages",
        help="VoxCPM2 decode step: --kernels ttsaot vs inductor artifacts, eager, torch.compile, byte floor",
    )
    p.add_argument("--stage", default="base_lm_step", choices=sorted(STEP_STAGES))
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu (smoke run)")
    p.add_argument("--preset", default=None, help="full (default on CUDA) or tiny (default on CPU)")
    p.add_argument("--batches", type=lambda v: [int(x) for x in v.split(",") if x.strip()], default=[1, 16])
    p.add_argument("--max-len", type=int, default=None, help="KV cache length (default 512; tiny: 32)")
    p.add_argument(
        "--layers",
        type=int,
        default=None,
        help=f"base-LM layers built (default {DEFAULT_LAYERS_CUDA} for preset full, all for tiny)",
    )
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--jobs", type=int, default=1, help="AOTI compile workers per build (build-artifacts --jobs)")
    p.add_argument("--budget", type=float, default=200.0, help="seconds; later buckets/sections are skipped")
    p.add_argument("--no-profile", dest="profile", action="store_false", help="skip the profiler pass (CUDA)")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile")
    p.add_argument(
        "--pdl-ab", action="store_true", help="also build and time the ttsaot artifact without programmatic launch"
    )
    p.add_argument("--compile-mode", default="max-autotune-no-cudagraphs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default=None, help="folder for the temporary artifacts (default: the temp dir)")
    p.add_argument("--result", default=None)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))


def main(a: argparse.Namespace) -> int:
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    a.preset = a.preset or ("full" if a.device.startswith("cuda") else "tiny")
    a.max_len = a.max_len or (512 if a.preset == "full" else 32)
    if a.layers is None and a.preset == "full" and a.stage == "base_lm_step":
        a.layers = DEFAULT_LAYERS_CUDA
    if a.device.startswith("cuda") and "CXX" not in os.environ and Path("/usr/bin/g++").exists():
        os.environ["CXX"] = "/usr/bin/g++"  # AOTI packages built with another compiler segfault on load
    slug = device_info(torch.device(a.device))["slug"]
    name = "decode_stages.json" if a.stage == "base_lm_step" else f"decode_stages_{a.stage}.json"
    path = Path(a.result) if a.result else Path(a.out) / slug / name
    res = run(a, progress=lambda r: write_json(path, r))
    write_json(path, res)
    print(summary(res))
    print(f"→ {path}")
    return 0 if res.get("status") == "ok" else 1
