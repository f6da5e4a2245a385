"""`python -m bench codec-stages --out DIR`: the codec stages built with the ttsaot conv kernels against the same
stages built on Inductor's code, in ONE process (issue 15).

Per task (a stage at one numerics choice; `--stages` picks a subset, the order below is the priority under
`--budget`):
- `code2wav` (Qwen3-TTS 12 Hz, its default bf16; `code2wav:fp32` for the fp32 build, convs tf32x3), B=1,4 × 50
  frames; `dac_decoder:<bf16|tf32|fp32>` (Fish S2 Pro, `--dac-decoder-precision`), B=1,4 × 29 frames;
  `dac_encoder` (one 10 s clip, fp32, convs tf32x3: the codes must equal exact fp32's); `vae_decoder` (VoxCPM2,
  fp32 by policy, convs tf32x3), B=1 × a 36-frame window.
- Two builds from the same random weights (preset full on CUDA) into a temp dir, `kernels="ttsaot"` and
  `kernels="inductor"`, only the measured buckets; both loaded with the runtime (CUDA graphs).
- Correctness per bucket, against the faithful module in exact fp32 (TF32 off) on the same inputs: relative error
  and SNR dB of the wave (decoders), the fraction of equal codes (encoder); `meets` applies the stage's criterion
  (issue 15: bf16 ≥ 35 dB, TF32 ≤ 1e-3, fp32 ≤ 1e-4, encoder codes 100% equal).
- Median time per call: each artifact's captured graph replayed (`replay_ms`) and through `stage(x)` (`call_ms`:
  + the input copy and the output clone); `eager`: the stage module as the inductor build compiles it (passes
  applied, compute dtype) with the precision's TF32 setting, plus `eager_tf32` for fp32 stages (cuDNN and matmul
  TF32 on); `eager_default`: the faithful module itself (the upstream structure, weight-norm parametrisations and
  all, proven against the upstream packages in tests/oracle/) in fp32 with PyTorch's default flags (cuDNN
  convolutions in TF32, matmuls in fp32): what a user of the upstream code runs, the issue's "upstream eager"
  column, measured for every task whatever its precision; `compile_graph`: torch.compile(mode=--compile-mode) of
  that module replayed in a manual CUDA graph (runtime.graphs.StaticGraph).
- Memory: device memory the loaded stage holds beyond its weights (graphs, pools, static buffers) for the buckets
  built here (not the stage's whole default plan), and its graph capture time.

Each task's record is written to `<out>/codec_stages.json` as soon as it is done (a time-out keeps the finished
ones); a step that fails is recorded with its error, never fatal. `--budget` is a hard limit: every build and
compile runs in a time box ending at it, and what does not fit is recorded skipped (with the reason). On CPU
(`--device cpu --preset tiny`, the smoke test) the same code runs without graphs or compile."""

from __future__ import annotations

import argparse
import copy
import gc
import math
import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ttsaot.builder.families.fish_s2_pro.stages import DECODER_PRECISIONS
from ttsaot.builder.parallel_compile import default_jobs
from ttsaot.builder.passes.numerics import snr_db

from .common import (
    BudgetExceeded,
    device_info,
    git_commit,
    kept_precision_flags,
    now_iso,
    rel_err,
    set_tf32,
    short_error,
    time_box,
    time_fn,
    write_json,
)

# (task, family, stage, options besides preset/seed/kernels, criterion)
TASK_ORDER = (
    "code2wav",
    "dac_decoder:bf16",
    "dac_encoder",
    "vae_decoder",
    "dac_decoder:tf32",
    "dac_decoder:fp32",
    "code2wav:fp32",
)
# the criteria per precision, as the Fish decoder option defines them; encoders: codes equal
CRITERIA = {**{name: p.criterion for name, p in DECODER_PRECISIONS.items()}, "codes": {"code_match_min": 1.0}}


@dataclass
class Task:
    name: str
    family: str
    stage: str
    options: dict[str, Any]
    precision: str  # bf16 | tf32 | fp32 (what the eager baselines run and the criterion)
    criterion: dict[str, float] = field(default_factory=dict)


def make_tasks(
    names: list[str],
    batches: tuple[int, ...],
    code2wav_frames: tuple[int, ...],
    dac_frames: tuple[int, ...],
    encoder_seconds: float,
    vae_frames: int = 36,
) -> list[Task]:
    """The tasks named (any of TASK_ORDER), in priority order."""
    unknown = [n for n in names if n not in TASK_ORDER]
    if unknown:
        raise ValueError(f"unknown codec-stages task {unknown[0]!r} (have: {', '.join(TASK_ORDER)})")
    out = []
    for name in (n for n in TASK_ORDER if n in names):
        stage, _, prec = name.partition(":")
        if stage == "code2wav":
            dtype = torch.float32 if prec == "fp32" else None  # None: the stage default (bf16)
            opts = {"batch_buckets": batches, "frame_buckets": tuple(code2wav_frames), "dtype": dtype}
            p = prec or "bf16"
            out.append(Task(name, "qwen3-tts-12hz", "code2wav", opts, p, CRITERIA[p]))
        elif stage == "dac_decoder":
            opts = {"batch_buckets": batches, "frame_buckets": tuple(dac_frames), "dac_decoder_precision": prec}
            out.append(Task(name, "fish-s2-pro", "dac_decoder", opts, prec, CRITERIA[prec]))
        elif stage == "vae_decoder":
            opts = {"batch_buckets": (1,), "frame_buckets": (vae_frames,)}
            out.append(Task(name, "voxcpm2", "vae_decoder", opts, "fp32", CRITERIA["fp32"]))
        else:
            opts = {"encoder_seconds": (encoder_seconds,)}
            out.append(Task(name, "fish-s2-pro", "dac_encoder", opts, "fp32", CRITERIA["codes"]))
    return out


# ------------------------------------------------------------------------------------------ helpers
def _set_pytorch_defaults() -> None:
    """PyTorch's own defaults: cuDNN convolutions may use TF32, matmuls stay fp32."""
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = False


def _replay_ms(fn: Callable[[], Any], device: torch.device, reps: int) -> float:
    return round(time_fn(fn, device, warmup=3, reps=reps)["ms"], 4)


def compare(out: torch.Tensor, ref: torch.Tensor, criterion: dict[str, float]) -> dict[str, Any]:
    """Error of one output against the fp32 reference, and whether it meets the criterion."""
    if not ref.is_floating_point():
        match = float((out.cpu() == ref.cpu()).float().mean())
        return {
            "code_match": match,
            "codes_differing": int((out.cpu() != ref.cpu()).sum()),
            "meets": match >= criterion.get("code_match_min", 1.0),
        }
    rel = rel_err(out.float().cpu(), ref.float().cpu())
    snr = snr_db(rel)
    meets = snr >= criterion.get("snr_db_min", -math.inf) and rel <= criterion.get("rel_error_max", math.inf)
    return {
        "rel_error": float(f"{rel:.4g}"),
        "snr_db": round(snr, 2) if math.isfinite(snr) else None,
        "meets": bool(meets),
    }


def _build(
    task: Task,
    kernels: str,
    preset: str,
    seed: int,
    device: torch.device,
    root: Path,
    jobs: int = 1,
    package_cache: str | None = None,
):
    """The stage's artifact under root; package_cache: the builder's per-package cache (`--package-cache`, e.g.
    the one `bench build --package-cache` filled for `bench profile` in the same device call)."""
    from ttsaot.builder.build import build_family
    from ttsaot.builder.families import get_family

    fam = get_family(task.family)
    opts = fam.options(preset=preset, seed=seed, kernels=kernels, device=device.type, **task.options)
    specs = fam.specs(opts, [task.stage])
    t0 = time.perf_counter()
    # the bench checks every output itself, against exact fp32, in this process
    res = build_family(
        fam.name,
        specs,
        root / f"{task.name.replace(':', '_')}-{kernels}",
        device,
        seed=seed,
        preset=preset,
        verify_in_subprocess=False,
        jobs=jobs,
        cache_dir=package_cache,
    )
    return specs[0], res.path, time.perf_counter() - t0


def _load(path: Path, stage: str, device: torch.device):
    from ttsaot.runtime import load

    if device.type == "cuda":
        # the reference modules freed before this load sit cached in the allocator; graph capture empties that cache,
        # which made the load's device delta negative: start from an empty cache
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        free0 = torch.cuda.mem_get_info(device)[0]
        alloc0 = torch.cuda.memory_allocated(device)
    t0 = time.perf_counter()
    bundle = load(path, device=device, stages=[stage])
    st = bundle[stage]
    mem: dict[str, Any] = {"load_s": round(time.perf_counter() - t0, 3), **st.load_stats}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        weights = st.weight_bytes
        used = free0 - torch.cuda.mem_get_info(device)[0]
        mem.update(
            weights_bytes=weights,
            device_bytes_used=used,
            beyond_weights_bytes=used - weights,
            allocator_bytes=torch.cuda.memory_allocated(device) - alloc0,
        )
    return bundle, st, mem


def _runner_replay(st, key: str) -> Callable[[], Any] | None:
    """The bucket's captured graph (the runtime's own), or None without graphs."""
    runner = st._runners[key]
    return runner.graph.replay if runner.graph is not None else None


# ------------------------------------------------------------------------------------------ one task
def run_task(
    task: Task,
    preset: str,
    seed: int,
    device: torch.device,
    root: Path,
    reps: int,
    variants: set[str],
    compile_mode: str,
    deadline: float,
    log: Callable[[str], None],
    jobs: int = 1,
    package_cache: str | None = None,
) -> dict[str, Any]:
    from ttsaot.builder.passes.cast import cast_to_compute_dtype
    from ttsaot.runtime.graphs import StaticGraph

    rec: dict[str, Any] = {
        "task": task.name,
        "family": task.family,
        "stage": task.stage,
        "precision": task.precision,
        "criterion": task.criterion,
        "builds": {},
        "buckets": {},
    }
    with time_box(deadline - time.perf_counter(), f"{task.name}: the ttsaot build"):
        spec, path, secs = _build(task, "ttsaot", preset, seed, device, root, jobs, package_cache)
    rec["builds"]["ttsaot"] = {"seconds": round(secs, 1), "path": str(path)}
    log(f"{task.name}: ttsaot build {secs:.0f} s")
    original = spec.make_module().eval()
    staged = copy.deepcopy(original)
    for p in spec.passes:
        if getattr(p, "__name__", "") != "measure_numerics":  # a measurement, not a rewrite
            p(staged)
    staged = cast_to_compute_dtype(staged, spec.dtype).to(device).eval()
    original = original.to(device)
    buckets = spec.plan.buckets()
    inputs = {}
    for i, sizes in enumerate(buckets):
        ex = spec.make_inputs(sizes, torch.Generator().manual_seed(seed * 1000 + i))
        inputs[_key(sizes)] = [ex[n].to(device) for n in spec.input_names]
    refs = {}
    set_tf32(False)
    with torch.no_grad():
        for k, args in inputs.items():
            refs[k] = _first(original(*args))
    if "eager" in variants:
        _set_pytorch_defaults()
        for k, args in inputs.items():
            with torch.no_grad():
                out = _first(original(*args))
                row = compare(out, refs[k], task.criterion)
                row["ms"] = _replay_ms(lambda args=args, m=original: m(*args), device, reps)
            rec["buckets"].setdefault(k, {})["eager_default"] = row
        set_tf32(False)
    del original

    kernels_list = ["ttsaot"] + (["inductor"] if "inductor" in variants else [])
    for kernels in kernels_list:
        if kernels == "inductor":
            try:
                if time.perf_counter() > deadline:
                    raise BudgetExceeded("no time left in --budget")
                with time_box(deadline - time.perf_counter(), f"{task.name}: the inductor build"):
                    _, ipath, secs = _build(task, "inductor", preset, seed, device, root, jobs, package_cache)
            except Exception as e:  # the ttsaot results stay; the comparison is marked
                rec["builds"]["inductor"] = {"skipped" if _out_of_budget(e) else "error": short_error(e)}
                log(f"{task.name}: inductor build: {short_error(e)}")
                continue
            rec["builds"]["inductor"] = {"seconds": round(secs, 1), "path": str(ipath)}
            log(f"{task.name}: inductor build {secs:.0f} s")
            path = ipath
        bundle, st, mem = _load(path, task.stage, device)
        rec["builds"][kernels].update(
            manifest_kernels=st.entry.kernels, memory=mem, numerics=st.entry.metadata.get("numerics")
        )
        for k, args in inputs.items():
            b = rec["buckets"].setdefault(k, {})
            with torch.no_grad():
                out = _first(st(*args))
            row = compare(out, refs[k], task.criterion)
            row["call_ms"] = _replay_ms(lambda st=st, args=args: st(*args), device, reps)
            replay = _runner_replay(st, k)
            if replay is not None:
                row["replay_ms"] = _replay_ms(replay, device, reps)
            b[kernels] = row
        del bundle, st, replay
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the next load's memory delta starts from here

    tf32 = task.precision == "tf32"
    eager_modes = [("eager", tf32)] + ([("eager_tf32", True)] if spec.dtype == torch.float32 and not tf32 else [])
    for name, on in eager_modes:
        if name.split("_")[0] not in variants:
            continue
        set_tf32(on)
        for k, args in inputs.items():
            with torch.no_grad():
                out = _first(staged(*args))
                row = compare(out, refs[k], task.criterion)
                row["ms"] = _replay_ms(lambda args=args: staged(*args), device, reps)
            rec["buckets"][k][name] = row
    if "compile" in variants and device.type == "cuda":
        set_tf32(tf32)
        compiled = torch.compile(staged, mode=compile_mode)
        for k, args in inputs.items():
            t0 = time.perf_counter()
            try:
                if t0 > deadline:
                    raise BudgetExceeded("no time left in --budget")
                with time_box(deadline - t0, f"{task.name}: torch.compile"), torch.no_grad():
                    g = StaticGraph(lambda xs: compiled(*xs), [a.clone() for a in args], device)
            except Exception as e:
                rec["buckets"][k]["compile_graph"] = {"skipped" if _out_of_budget(e) else "error": short_error(e)}
                log(f"{task.name}/{k}: torch.compile: {short_error(e)}")
                continue
            row = compare(_first(g.replay()), refs[k], task.criterion)
            row.update(
                ms=_replay_ms(g.replay, device, reps),
                compile_and_capture_s=round(time.perf_counter() - t0, 1),
                mode=compile_mode,
            )
            rec["buckets"][k]["compile_graph"] = row
            del g
        del compiled
    set_tf32(False)
    for b in rec["buckets"].values():
        base = b.get("compile_graph", {}).get("ms")
        mine = (b.get("ttsaot") or {}).get("replay_ms") or (b.get("ttsaot") or {}).get("call_ms")
        if base and mine:
            b["ttsaot_speedup_vs_compile_graph"] = round(base / mine, 3)
        ind = (b.get("inductor") or {}).get("replay_ms") or (b.get("inductor") or {}).get("call_ms")
        if ind and mine:
            b["ttsaot_speedup_vs_inductor"] = round(ind / mine, 3)
        default = (b.get("eager_default") or {}).get("ms")
        if default and mine:
            b["ttsaot_speedup_vs_eager_default"] = round(default / mine, 3)
    return rec


def _out_of_budget(e: BaseException) -> bool:
    """A time box that fired, possibly inside a build (which re-raises it wrapped in its own errors)."""
    return isinstance(e, BudgetExceeded) or "BudgetExceeded" in str(e)


def _first(out):
    return out[0] if isinstance(out, tuple | list) else out


def _key(sizes: dict[str, int]) -> str:
    from ttsaot.builder.buckets import BucketPlan

    return BucketPlan.key(sizes)


# ------------------------------------------------------------------------------------------ driver
def run(a: argparse.Namespace) -> dict[str, Any]:
    with kept_precision_flags():
        return _run(a)


def _run(a: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", 0)
        if Path("/usr/bin/g++").exists():
            os.environ.setdefault("CXX", "/usr/bin/g++")  # AOTI's compiler on the GPU machine
    preset = a.preset or ("full" if device.type == "cuda" else "tiny")
    variants = (
        set(a.variants)
        if a.variants
        else ({"inductor", "eager", "compile"} if device.type == "cuda" else {"inductor", "eager"})
    )
    tasks = make_tasks(a.stages, tuple(a.batches), a.code2wav_frames, a.dac_frames, a.encoder_seconds, a.vae_frames)
    out = Path(a.out) / "codec_stages.json"
    jobs = a.jobs or default_jobs()
    start = time.perf_counter()
    deadline = start + a.budget
    res: dict[str, Any] = {
        "schema": "codec_stages/1",
        "when": now_iso(),
        "commit": git_commit(),
        "device": device_info(device),
        "preset": preset,
        "seed": a.seed,
        "variants": sorted(variants),
        "compile_mode": a.compile_mode,
        "budget_s": a.budget,
        "jobs": jobs,
        "torch": torch.__version__,
        "tasks": [],
    }

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f}s] {msg}", flush=True)

    root = Path(tempfile.mkdtemp(prefix="ttsaot_codec_stages_"))
    try:
        for task in tasks:
            if time.perf_counter() > deadline:
                res["tasks"].append({"task": task.name, "status": "skipped", "reason": "budget"})
                continue
            t0 = time.perf_counter()
            try:
                rec = run_task(
                    task,
                    preset,
                    a.seed,
                    device,
                    root,
                    a.reps,
                    variants,
                    a.compile_mode,
                    deadline,
                    log,
                    jobs,
                    a.package_cache,
                )
                rec["status"] = "ok"
            except Exception as e:  # recorded, never fatal: the other tasks still run
                if _out_of_budget(e):
                    rec = {"task": task.name, "status": "skipped", "reason": short_error(e)}
                else:
                    rec = {
                        "task": task.name,
                        "status": "error",
                        "error": short_error(e),
                        "traceback": traceback.format_exc()[-3000:],
                    }
                log(f"{task.name}: {rec['status']}: {short_error(e)}")
            rec["seconds"] = round(time.perf_counter() - t0, 1)
            res["tasks"].append(rec)
            res["seconds"] = round(time.perf_counter() - start, 1)
            write_json(out, res)
            set_tf32(False)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    res["seconds"] = round(time.perf_counter() - start, 1)
    write_json(out, res)
    res["path"] = str(out)
    return res


def summary_lines(res: dict[str, Any]) -> list[str]:
    cols = ("ttsaot", "inductor", "eager", "eager_tf32", "eager_default", "compile_graph")
    lines = [f"{'task/bucket':28s} " + " ".join(f"{c:>13s}" for c in cols) + "  error(ttsaot)"]
    for t in res["tasks"]:
        if t.get("status") != "ok":
            lines.append(f"{t['task']:28s} {t.get('status')}: {t.get('error') or t.get('reason')}")
            continue
        for k, b in t["buckets"].items():
            ms = []
            for c in cols:
                r = b.get(c) or {}
                v = r.get("replay_ms") or r.get("ms") or r.get("call_ms")
                ms.append(f"{v:13.3f}" if v else f"{'-':>13s}")
            r = b.get("ttsaot") or {}
            err = (
                f"codes {r['code_match']:.4f}"
                if "code_match" in r
                else f"rel {r.get('rel_error')} snr {r.get('snr_db')}"
            )
            lines.append(f"{t['task'] + '/' + k:28s} " + " ".join(ms) + f"  {err} meets={r.get('meets')}")
    lines.append(f"total {res.get('seconds')} s (ms: graph replay for the artifacts, per call for eager)")
    return lines


def _csv(v: str) -> list[str]:
    return [s.strip() for s in v.split(",") if s.strip()]


def _ints(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in _csv(v))


def add_parser(sub) -> None:
    p = sub.add_parser(
        "codec-stages",
        help="codec stages built with the ttsaot conv kernels vs Inductor, eager "
        "and torch.compile, correctness and time (issue 15)",
    )
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for codec_stages.json")
    p.add_argument(
        "--stages",
        type=_csv,
        default=list(TASK_ORDER[:5]),
        help=f"tasks, comma-separated, of: {', '.join(TASK_ORDER)} (default: the first five)",
    )
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--preset", default=None, help="full (default on CUDA) or tiny (default on CPU)")
    p.add_argument("--batches", type=_ints, default=(1, 4))
    p.add_argument("--code2wav-frames", type=_ints, default=(50,), help="comma-separated frame buckets")
    p.add_argument("--dac-frames", type=_ints, default=(29,), help="comma-separated frame buckets")
    p.add_argument("--encoder-seconds", type=float, default=10.0)
    p.add_argument("--vae-frames", type=int, default=36, help="the vae_decoder's window (B=1)")
    p.add_argument(
        "--variants",
        type=_csv,
        default=None,
        help="of inductor,eager,compile (default: all on CUDA; inductor,eager on CPU)",
    )
    p.add_argument("--compile-mode", default="max-autotune-no-cudagraphs")
    p.add_argument("--reps", type=int, default=20, help="timed calls per measurement (median)")
    p.add_argument(
        "--budget",
        type=float,
        default=200.0,
        help="seconds for all builds and compiles (each is time-boxed to it; the rest is recorded skipped)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=None, help="compile workers per build (default: what the host allows)")
    p.add_argument(
        "--package-cache",
        default=None,
        metavar="DIR",
        help="the builder's per-package cache to reuse packages from and add to (default: none, every package "
        "compiled)",
    )


def main(a: argparse.Namespace) -> int:
    res = run(a)
    print(f"→ {res['path']}")
    for line in summary_lines(res):
        print(line)
    return 0 if all(t.get("status") in ("ok", "skipped") for t in res["tasks"]) else 1


__all__ = ["TASK_ORDER", "Task", "add_parser", "compare", "main", "make_tasks", "run", "summary_lines"]
