"""One stage, measured in one process (`python -m bench _stage ...`, spawned by `python -m bench run`).

The JSON result is rewritten after every step, so a crash or a kill by the parent's timeout still leaves
everything measured up to that point."""

from __future__ import annotations

import copy
import gc
import json
import math
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ttsaot.runtime.dtypes import torch_dtype

from . import RESULTS_SCHEMA
from .artifacts import build_or_reuse, same_program_as_auto
from .common import (
    BudgetExceeded,
    Skipped,
    as_tuple,
    cuda_device,
    device_info,
    git_commit,
    now_iso,
    rel_err,
    short_error,
    sync,
    time_box,
    time_fn,
    write_json,
)
from .floor import count_flops, floor_for, measure_hardware
from .specs import make_spec
from .variants import COMPILED, TTSAOT, VARIANT_KERNELS, VariantContext, applies, make_variant

MIB = 2**20


# ------------------------------------------------------------------------------------------- memory
def mem_snapshot(device: torch.device) -> dict[str, int] | None:
    if device.type != "cuda":
        return None
    gc.collect()
    torch.cuda.synchronize(device)
    return {"alloc": torch.cuda.memory_allocated(device), "reserved": torch.cuda.memory_reserved(device)}


def mem_reset(device: torch.device) -> dict[str, int] | None:
    if device.type != "cuda":
        return None
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    return mem_snapshot(device)


def mem_delta(base: dict | None, device: torch.device, when: str) -> dict[str, Any]:
    if base is None:
        return {"note": "not measured on CPU"}
    now = mem_snapshot(device)
    return {
        f"{when}_alloc_mib": round((now["alloc"] - base["alloc"]) / MIB, 2),
        f"{when}_reserved_mib": round((now["reserved"] - base["reserved"]) / MIB, 2),
        "peak_alloc_mib": round((torch.cuda.max_memory_allocated(device) - base["alloc"]) / MIB, 2),
        "peak_reserved_mib": round((torch.cuda.max_memory_reserved(device) - base["reserved"]) / MIB, 2),
    }


# ------------------------------------------------------------------------------------------- helpers
def state_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def out_bytes(spec, outputs) -> int:
    total = 0
    for desc, o in zip(spec.outputs, as_tuple(outputs)):
        total += o.numel() * torch_dtype(str(desc.get("dtype", "float32"))).itemsize
    return total


def make_bucket_inputs(spec, sizes: dict[str, int], seed: int, device: torch.device) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    named = spec.make_inputs(sizes, g)
    xs = []
    for n in spec.input_names:
        x = named[n]
        # Data inputs must be random; a per-row parameter (one value per row, e.g. top_k = 0 meaning "off") may
        # legitimately be zero everywhere.
        per_row_param = x.dim() <= 1 and x.numel() <= sizes.get("batch", x.numel())
        if x.numel() and not per_row_param and not bool((x != 0).any()):
            raise RuntimeError(f"make_inputs returned an all-zero {n!r} for {sizes}: random inputs are required")
        xs.append(x.to(device))
    return xs


def parity(out, ref) -> float | None:
    errs = []
    for o, r in zip(as_tuple(out), as_tuple(ref)):
        if not o.is_floating_point():
            errs.append(float((o.to(r.device) != r).float().mean()))
            continue
        if tuple(o.shape) != tuple(r.shape):
            return None
        errs.append(rel_err(o.float(), r.float()))
    return max(errs) if errs else None


def key_of(sizes: dict[str, int]) -> str:
    from ttsaot.builder.buckets import BucketPlan

    return BucketPlan.key(sizes)


def primary_sizes(spec) -> dict[str, int]:
    """Batch at its smallest, every other axis at its largest: one request at the streaming window."""
    return {a: (min(s) if a == "batch" else max(s)) for a, s in spec.plan.axes.items()}


# ------------------------------------------------------------------------------------------ streaming
def chunk_schedule(total: int, chunk: int, first: int) -> list[int]:
    """Chunk lengths of new frames: `first`-frame chunks until `chunk` frames have been sent (the last one cut
    so the total lands on `chunk`), then `chunk`-frame chunks; the tail is shorter."""
    sizes, done = [], 0
    if first:
        while done < min(chunk, total):
            n = min(first, chunk - done, total - done)
            sizes.append(n)
            done += n
    while done < total:
        n = min(chunk, total - done)
        sizes.append(n)
        done += n
    return sizes


def stream_generic(call, codes: torch.Tensor, sizes: list[int], ctx: int, spf: int):
    """Same semantics as CodecDecoderStage.stream, for the eager/compiled callables: each chunk of new frames
    is decoded with up to `ctx` previous frames, whose samples are dropped."""
    history = None
    start = 0
    for n in sizes:
        new = codes[..., start : start + n]
        start += n
        window = new if history is None else torch.cat([history, new], dim=-1)
        used = window.shape[-1] - n
        wav = as_tuple(call([window]))[0]
        yield wav[..., used * spf :].clone()  # what a server sends must outlive the next call (graph outputs)
        history = window[..., window.shape[-1] - min(ctx, window.shape[-1]) :] if ctx else None


def measure_streaming(variant, spec, device, seconds: float, reps: int, seed: int) -> dict[str, Any]:
    md = spec.metadata
    sr, spf = int(md["sample_rate"]), int(md["samples_per_frame"])
    st = dict(md.get("streaming", {}))
    chunk, ctx, first = (
        int(st.get("chunk_frames", 25)),
        int(st.get("left_context_frames", 0)),
        int(st.get("first_chunk_frames", 0)),
    )
    max_frames = max(spec.plan.axes.get("frames", (0,)))
    if chunk + ctx > max_frames:
        raise Skipped(f"chunk {chunk} + left context {ctx} exceeds the largest measured bucket ({max_frames})")
    frames = math.ceil(seconds * sr / spf)
    (codes,) = make_bucket_inputs(spec, {"batch": 1, "frames": frames}, seed + 7, device)
    sizes = chunk_schedule(frames, chunk, first)
    if variant.name in TTSAOT:
        stage = variant.stage

        def chunks_iter():
            start = 0
            for n in sizes:
                yield codes[..., start : start + n]
                start += n

        def run_stream():
            return stage.stream(chunks_iter(), left_context_frames=ctx)
    else:
        cache: dict[int, Any] = {}

        def call(xs):
            w = xs[0].shape[-1]
            if w not in cache:
                cache[w] = variant.prepare({"batch": 1, "frames": w}, xs)
            return cache[w](xs)

        def run_stream():
            return stream_generic(call, codes, sizes, ctx, spf)

    ttfa, total, n_samples = [], [], 0
    for i in range(reps + 1):  # first pass = warm-up (captures, lazy loads), not counted
        sync(device)
        t0 = time.perf_counter()
        first_t = None
        n_samples = 0
        for piece in run_stream():
            if first_t is None:
                sync(device)
                first_t = time.perf_counter() - t0
            n_samples += piece.shape[-1]
        sync(device)
        if i:
            ttfa.append(first_t * 1e3)
            total.append(time.perf_counter() - t0)
    ttfa.sort()
    total.sort()
    audio_s = n_samples / sr
    med_total = total[len(total) // 2]
    return {
        "utterance_s": round(audio_s, 3),
        "frames": frames,
        "chunks": len(sizes),
        "chunk_frames": chunk,
        "left_context_frames": ctx,
        "first_chunk_frames": first,
        "ttfa_ms": ttfa[len(ttfa) // 2],
        "total_ms": med_total * 1e3,
        "rtf": med_total / audio_s,
        "x_realtime": audio_s / med_total,
        "reps": reps,
    }


def measure_throughput(
    variant,
    spec,
    device,
    batches: list[int],
    warmup: int,
    reps: int,
    seed: int,
    base: dict[str, int],
    rows: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Appends one row per batch to `rows` (kept when the variant's time box cuts the sweep short)."""
    md = spec.metadata
    for b in batches:
        sizes = {**base, "batch": b}
        row: dict[str, Any] = {"batch": b}
        try:
            xs = make_bucket_inputs(spec, sizes, seed + 100 + b, device)
            if variant.name in TTSAOT:
                bucket = variant.stage.pick_bucket(sizes)
                row["bucket"] = bucket.key if bucket is not None else "split over the largest batch bucket"
            fn = variant.prepare(sizes, xs)
            t = time_fn(lambda fn=fn, xs=xs: fn(xs), device, warmup, reps)
            row.update(ms=t["ms"], items_per_s=b / (t["ms"] * 1e-3))
            if "sample_rate" in md and "samples_per_frame" in md and "frames" in sizes:
                audio = b * sizes["frames"] * int(md["samples_per_frame"]) / int(md["sample_rate"])
                row["audio_s_per_s"] = audio / (t["ms"] * 1e-3)
        except Skipped:
            raise  # the variant's time box: stop the sweep here
        except torch.cuda.OutOfMemoryError as e:
            row["error"] = f"OOM: {short_error(e)}"
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001
            row["error"] = short_error(e)
        rows.append(row)
    return rows


def run_cold_starts(res: dict, a, artifact: Path | None, spec, prim: dict[str, int], save) -> None:
    """Fresh processes: ttsaot load → first output vs torch.compile → first output (bench/coldstart.py)."""
    if "cold_start" in res or not a.coldstart or artifact is None:
        return
    from .coldstart import measure

    # the children get their inputs from a file: the ttsaot child must not need the builder
    cs_inputs = Path(a.cache_dir) / res["build"]["cache_key"] / f"coldstart_{key_of(prim)}.pt"
    torch.save([x.cpu() for x in make_bucket_inputs(spec, prim, a.seed + 3, torch.device("cpu"))], cs_inputs)
    setup = {"artifact": str(artifact), "inputs": str(cs_inputs), "sizes": prim}
    res["coldstart_setup"] = setup
    res["cold_start"] = {}
    for mode in a.coldstart_modes:
        res["cold_start"][mode] = measure(mode, setup, res, a.device, a.coldstart_budget, a.coldstart_compile_mode)
        print(
            f"[bench] {a.family}/{a.stage} cold start {mode}: {res['cold_start'][mode].get('first_output_s')}"
            f" s {res['cold_start'][mode].get('reason', '')}",
            file=sys.stderr,
            flush=True,
        )
        save()


# --------------------------------------------------------------------------------------------- worker
@dataclass
class StageRun:
    """One stage's measurement in this process: the arguments, the result being written and what the phases
    share (the spec, its buckets, their inputs, fp32 references and floors)."""

    a: Any
    device: torch.device
    res: dict[str, Any]
    warmup: int
    reps: int
    spec: Any = None
    desc: dict[str, Any] = field(default_factory=dict)
    axes: dict[str, tuple[int, ...]] | None = None
    buckets: list[dict[str, int]] = field(default_factory=list)
    inputs: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    refs: dict[str, tuple[torch.Tensor, ...]] = field(default_factory=dict)
    floors: dict[str, dict[str, Any]] = field(default_factory=dict)

    def save(self) -> None:
        write_json(Path(self.a.result), self.res)


def run_stage(a) -> dict:
    """Measure one stage: describe it, its fp32 references and floors, build its artifacts, then each variant."""
    torch.set_grad_enabled(False)
    device = cuda_device(a.device)  # before any compile: the compiler AOTI builds use on CUDA
    warmup, reps = (3, 10) if a.quick else (10, 50)
    run = StageRun(a, device, _new_result(a, device, warmup, reps), warmup, reps)
    t_all = time.time()
    run.save()
    run.res["hardware"] = measure_hardware(device, quick=a.quick)
    run.save()
    _describe_stage(run)
    original, rewritten, weight_bytes = _stage_modules(run)
    _references_and_floors(run, original, weight_bytes)
    built = _build_artifacts(run)
    artifact, artifact_error = built.pop("auto", (None, "not built: no variant asked for it"))
    ctx = VariantContext(
        family=a.family,
        stage=a.stage,
        spec=run.spec,
        device=device,
        original=original,
        rewritten=rewritten,
        artifact=artifact,
        artifact_error=artifact_error,
        compile_mode=a.compile_mode,
        other_artifacts=built,
    )
    prim = primary_sizes(run.spec)
    for name in [v for v in a.variants if applies(v, run.spec)]:
        if name in COMPILED:  # cold starts before the expensive compiles, so a budget cut spares them
            run_cold_starts(run.res, a, artifact, run.spec, prim, run.save)
        _run_variant(run, name, ctx, prim)
    run_cold_starts(run.res, a, artifact, run.spec, prim, run.save)
    run.res.update(status="ok", seconds=round(time.time() - t_all, 1), finished=now_iso())
    run.save()
    return run.res


def _new_result(a, device: torch.device, warmup: int, reps: int) -> dict[str, Any]:
    return {
        "schema": RESULTS_SCHEMA,
        "status": "running",
        "started": now_iso(),
        "git_commit": git_commit(),
        "device": device_info(device),
        "settings": {
            "warmup": warmup,
            "reps": reps,
            "quick": a.quick,
            "compile_budget_s": a.compile_budget,
            "compile_mode": a.compile_mode,
        },
        "variants": {},
        "notes": [],
    }


def _describe_stage(run: StageRun) -> None:
    """The spec at the bench buckets (bench/specs.py) and what the JSON says about it."""
    a = run.a
    run.axes = json.loads(a.axes) if a.axes else None
    run.spec, run.desc = make_spec(
        a.family, a.stage, a.preset, seed=a.seed, axes=run.axes, dtype=a.dtype, device=run.device.type
    )
    spec = run.spec
    run.res["stage"] = {
        **run.desc,
        "inputs": spec.inputs,
        "outputs": spec.outputs,
        "metadata": spec.metadata,
        "tolerance": spec.tolerance,
    }
    if spec.kind == "codebook_predictor":
        run.res["notes"].append(
            "codebook_predictor: the plain stage call is timed; `generate()` is that call plus "
            "drawing the noise and building the per-row sampling tensors"
        )
    if spec.kind in ("lm_step", "lm_prefill"):
        run.res["notes"].append(
            f"{spec.kind}: ttsaot variants are timed through the serving API (`step`/`prefill` "
            "with a runtime-owned KVCache, graphs per cache on CUDA); eager/compile variants "
            "call the module with the cache tensors as inputs (written in place)"
        )
    run.save()


def _stage_modules(run: StageRun) -> tuple[torch.nn.Module, torch.nn.Module, int]:
    """(the faithful fp32 module, the module after the stage's passes, weight bytes in the compute dtype); the
    parameter counts go into the result."""
    from ttsaot.builder.build import prepare_modules
    from ttsaot.builder.passes import cast_to_compute_dtype, count_parameters

    spec = run.spec
    t0 = time.time()
    original, rewritten, pass_reports = prepare_modules(spec)  # the builder's own start (kernels="inductor")
    run.res["make_module_s"] = round(time.time() - t0, 2)  # the module and its passes
    cast = cast_to_compute_dtype(copy.deepcopy(rewritten), spec.dtype)
    run.res["params"] = {
        "faithful_fp32": count_parameters(original),
        "after_passes_fp32": count_parameters(rewritten),
        "after_passes_compute_dtype": count_parameters(cast),
        "pass_reports": pass_reports,
    }
    return original, rewritten, state_bytes(cast)


def _references_and_floors(run: StageRun, original: torch.nn.Module, weight_bytes: int) -> None:
    """Inputs of every bench bucket, the fp32 reference of the faithful module on the same device (TF32 off) and
    the hardware floor of each bucket."""
    spec, device, seed = run.spec, run.device, run.a.seed
    run.buckets = spec.plan.buckets()
    run.inputs = {key_of(s): make_bucket_inputs(spec, s, seed * 1000 + i, device) for i, s in enumerate(run.buckets)}
    prev = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    ref_mod = copy.deepcopy(original).to(device)
    for k, xs in run.inputs.items():
        run.refs[k] = tuple(o.detach() for o in as_tuple(ref_mod(*xs)))
    del ref_mod
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev
    for k, xs in run.inputs.items():
        fl = count_flops(original, [x.cpu() for x in xs])
        io = sum(x.numel() * x.element_size() for x in xs) + out_bytes(spec, run.refs[k])
        run.floors[k] = {**floor_for(fl["flops"], weight_bytes, io, run.res["hardware"]), "flops_method": fl["method"]}
        if fl.get("errors"):
            run.floors[k]["flops_errors"] = fl["errors"]
    run.res["buckets"] = [{"key": key_of(s), "sizes": s} for s in run.buckets]
    run.res["floor"] = run.floors
    run.save()


def _build_artifacts(run: StageRun) -> dict[str, tuple[Path | None, str | None]]:
    """kernels choice → (artifact, why not): `auto` for ttsaot_graph/_nograph and each other choice a variant asks
    for, built or reused through bench/artifacts.py."""
    a, spec, device, res = run.a, run.spec, run.device, run.res
    built: dict[str, tuple[Path | None, str | None]] = {}
    for kernels in dict.fromkeys(VARIANT_KERNELS[v] for v in a.variants if v in TTSAOT):
        key = "build" if kernels == "auto" else f"build_{kernels}"
        why = same_program_as_auto(spec, kernels, device)
        if why:
            built[kernels] = (None, why)
            res[key] = {"kernels": kernels, "skipped": why}
            continue
        try:
            k_spec, k_desc = (
                (spec, run.desc)
                if kernels == "auto"
                else make_spec(
                    a.family,
                    a.stage,
                    a.preset,
                    seed=a.seed,
                    axes=run.axes,
                    dtype=a.dtype,
                    kernels=kernels,
                    device=device.type,
                )
            )
            with time_box(a.build_budget, f"artifact build (kernels={kernels})"):
                path, info = build_or_reuse(k_spec, k_desc, device, Path(a.cache_dir), a.verify_build)
            built[kernels] = (path, None)
            res[key] = {**info, "kernels": kernels, "path": str(path)}
        except Exception as e:  # noqa: BLE001
            built[kernels] = (None, short_error(e))
            res[key] = {"kernels": kernels, "error": built[kernels][1]}
            traceback.print_exc()
        run.save()
    return built


def _run_variant(run: StageRun, name: str, ctx: VariantContext, prim: dict[str, int]) -> None:
    """One variant in its time box: setup, every bucket, then streaming and throughput where asked; whatever
    happens is recorded under res["variants"][name]."""
    a, device = run.a, run.device
    rec: dict[str, Any] = {"status": "running"}
    run.res["variants"][name] = rec
    run.save()
    v = None
    try:
        budget = a.compile_budget if name in COMPILED else a.variant_budget
        deadline = time.time() + budget if budget else None
        base = mem_reset(device)
        t0 = time.time()
        with time_box(budget, f"{name} setup"):
            v = make_variant(name, ctx)
            v.setup()
        rec["setup_s"] = round(time.time() - t0, 3)
        if hasattr(v, "upstream_name"):
            rec["upstream"] = v.upstream_name
        if hasattr(v, "built_kernels"):
            rec["kernels"] = v.built_kernels  # the manifest's StageEntry.kernels
        rec["memory"] = mem_delta(base, device, "after_setup")
        wb = v.weight_bytes()
        if wb is not None:
            rec["weight_mib"] = round(wb / MIB, 2)
        rec["buckets"] = {}
        for s in run.buckets:
            rec["buckets"][key_of(s)] = _measure_bucket(run, v, s, budget, deadline)
            run.save()
        rec["memory"].update(mem_delta(base, device, "after_buckets"))
        if getattr(v, "api", None):
            rec["api"] = v.api
        if name in a.stream_variants and run.spec.kind == "codec_decoder":
            _streaming(run, v, rec, budget, deadline)
        if name in a.throughput_variants and "batch" in run.spec.plan.axes:
            _throughput(run, v, rec, budget, deadline, prim)
        rec["status"] = "ok"
    except Skipped as e:
        rec.update(status="skipped", reason=str(e))
    except torch.cuda.OutOfMemoryError as e:
        rec.update(status="failed", reason=f"OOM: {short_error(e)}")
    except Exception as e:  # noqa: BLE001
        rec.update(status="failed", reason=short_error(e))
        traceback.print_exc()
    finally:
        if v is not None:
            try:
                v.close()
            except Exception:  # noqa: BLE001
                pass
        v = None
        mem_reset(device)
    print(
        f"[bench] {a.family}/{a.stage} {name}: {rec['status']} "
        f"{rec.get('reason', '') or {k: round(b['ms'], 3) for k, b in rec.get('buckets', {}).items()}}",
        file=sys.stderr,
        flush=True,
    )
    run.save()


def _left(budget: float | None, deadline: float | None, what: str) -> float | None:
    """Seconds left of the variant's budget before `what`, or None without a budget."""
    if deadline is None:
        return None
    left = deadline - time.time()
    if left <= 0:
        raise BudgetExceeded(f"{what}: its {budget:.0f} s budget was used up")
    return left


def _measure_bucket(
    run: StageRun, v, s: dict[str, int], budget: float | None, deadline: float | None
) -> dict[str, Any]:
    """Prepare the variant for one bucket, check its outputs against the fp32 reference, time it."""
    name, device, spec = v.name, run.device, run.spec
    k = key_of(s)
    xs = run.inputs[k]
    t0 = time.time()
    if deadline is not None and deadline - time.time() <= 0:
        raise BudgetExceeded(f"{name} exceeded its {budget:.0f} s budget before bucket {k}")
    with time_box((deadline - time.time()) if deadline else None, f"{name} prepare {k}"):
        fn = v.prepare(s, xs)
        out = fn(xs)
    sync(device)
    b: dict[str, Any] = {"prepare_s": round(time.time() - t0, 3)}
    b["rel_err_vs_fp32"] = parity(out, run.refs[k])
    if name.startswith("upstream") and spec.kind == "lm_step" and s.get("batch", 1) > 1:
        # upstream steps a batch in lockstep (one position for all rows) while the bench's rows sit at random
        # positions: same work (it attends over the whole cache under a mask), other numbers
        b["rel_err_vs_fp32"] = None
        b["parity_note"] = "upstream decodes rows in lockstep (row 0's position): not comparable"
    del out
    b.update(time_fn(lambda: fn(xs), device, run.warmup, run.reps))
    if run.floors[k]["ms"] > 0:
        b["x_floor"] = b["ms"] / run.floors[k]["ms"]
    if name == "ttsaot_graph":
        v.stage.validate_inputs = False
        b["ms_without_input_validation"] = time_fn(lambda: fn(xs), device, run.warmup, run.reps)["ms"]
        v.stage.validate_inputs = True
        # the same checks run eagerly, as before each bucket replayed them as one captured graph
        v.stage.capture_value_checks = False
        b["ms_eager_input_checks"] = time_fn(lambda: fn(xs), device, run.warmup, run.reps)["ms"]
        v.stage.capture_value_checks = True
    return b


def _streaming(run: StageRun, v, rec: dict[str, Any], budget: float | None, deadline: float | None) -> None:
    try:
        left = _left(budget, deadline, f"{v.name} before streaming")
        with time_box(left, f"{v.name} streaming"):
            rec["streaming"] = measure_streaming(
                v, run.spec, run.device, run.a.stream_seconds, 2 if run.a.quick else 5, run.a.seed
            )
    except Skipped as e:
        rec["streaming"] = {"skipped": str(e)}
    except Exception as e:  # noqa: BLE001
        rec["streaming"] = {"error": short_error(e)}
        traceback.print_exc()
    run.save()


def _throughput(
    run: StageRun, v, rec: dict[str, Any], budget: float | None, deadline: float | None, prim: dict[str, int]
) -> None:
    try:
        left = _left(budget, deadline, f"{v.name} before throughput")
        rec["throughput"] = []
        with time_box(left, f"{v.name} throughput"):
            measure_throughput(
                v,
                run.spec,
                run.device,
                run.a.throughput_batches,
                run.warmup,
                max(5, run.reps // 2),
                run.a.seed,
                prim,
                rec["throughput"],
            )
    except Skipped as e:
        rec["throughput_skipped"] = str(e)
    run.save()
