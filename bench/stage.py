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
            raise RuntimeError(
                f"make_inputs returned an all-zero {n!r} for {sizes}: random inputs are required"
            )
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
        raise Skipped(
            f"chunk {chunk} + left context {ctx} exceeds the largest measured bucket ({max_frames})"
        )
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
        res["cold_start"][mode] = measure(
            mode, setup, res, a.device, a.coldstart_budget, a.coldstart_compile_mode
        )
        print(
            f"[bench] {a.family}/{a.stage} cold start {mode}: {res['cold_start'][mode].get('first_output_s')}"
            f" s {res['cold_start'][mode].get('reason', '')}",
            file=sys.stderr,
            flush=True,
        )
        save()


# --------------------------------------------------------------------------------------------- worker
def run_stage(a) -> dict:
    torch.set_grad_enabled(False)
    device = cuda_device(a.device)   # before any compile: the compiler AOTI builds use on CUDA
    out_path = Path(a.result)
    warmup, reps = (3, 10) if a.quick else (10, 50)
    res: dict[str, Any] = {
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

    def save():
        write_json(out_path, res)

    t_all = time.time()
    save()
    res["hardware"] = measure_hardware(device, quick=a.quick)
    save()

    axes = json.loads(a.axes) if a.axes else None
    spec, desc = make_spec(a.family, a.stage, a.preset, seed=a.seed, axes=axes, dtype=a.dtype)
    res["stage"] = {
        **desc,
        "inputs": spec.inputs,
        "outputs": spec.outputs,
        "metadata": spec.metadata,
        "tolerance": spec.tolerance,
    }
    if spec.kind == "codebook_predictor":
        res["notes"].append(
            "codebook_predictor: the plain stage call is timed; `generate()` is that call plus "
            "drawing the noise and building the per-row sampling tensors"
        )
    if spec.kind in ("lm_step", "lm_prefill"):
        res["notes"].append(
            f"{spec.kind}: ttsaot variants are timed through the serving API (`step`/`prefill` "
            "with a runtime-owned KVCache, graphs per cache on CUDA); eager/compile variants "
            "call the module with the cache tensors as inputs (written in place)"
        )
    save()

    from ttsaot.builder.passes import count_parameters

    t0 = time.time()
    original = spec.make_module().eval()
    res["make_module_s"] = round(time.time() - t0, 2)
    rewritten = copy.deepcopy(original)
    pass_reports = [p(rewritten) for p in spec.passes]
    from ttsaot.builder.passes import cast_to_compute_dtype

    cast = cast_to_compute_dtype(copy.deepcopy(rewritten), spec.dtype)
    res["params"] = {
        "faithful_fp32": count_parameters(original),
        "after_passes_fp32": count_parameters(rewritten),
        "after_passes_compute_dtype": count_parameters(cast),
        "pass_reports": pass_reports,
    }
    weight_bytes = state_bytes(cast)
    del cast

    buckets = spec.plan.buckets()
    inputs = {
        key_of(s): make_bucket_inputs(spec, s, a.seed * 1000 + i, device) for i, s in enumerate(buckets)
    }

    # fp32 reference of the faithful module on the same device (TF32 off), and the floor of each bucket.
    refs, floors = {}, {}
    prev = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    ref_mod = copy.deepcopy(original).to(device)
    for s in buckets:
        k = key_of(s)
        refs[k] = tuple(o.detach() for o in as_tuple(ref_mod(*inputs[k])))
    del ref_mod
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev
    for s in buckets:
        k = key_of(s)
        fl = count_flops(original, [x.cpu() for x in inputs[k]])
        io = sum(x.numel() * x.element_size() for x in inputs[k]) + out_bytes(spec, refs[k])
        floors[k] = {
            **floor_for(fl["flops"], weight_bytes, io, res["hardware"]),
            "flops_method": fl["method"],
        }
        if fl.get("errors"):
            floors[k]["flops_errors"] = fl["errors"]
    res["buckets"] = [{"key": key_of(s), "sizes": s} for s in buckets]
    res["floor"] = floors
    save()

    # the artifacts: kernels as resolved (auto) for ttsaot_graph/_nograph, and each other choice a variant asks for
    built: dict[str, tuple[Path | None, str | None]] = {}
    for kernels in dict.fromkeys(VARIANT_KERNELS[v] for v in a.variants if v in TTSAOT):
        key = "build" if kernels == "auto" else f"build_{kernels}"
        why = same_program_as_auto(spec, kernels, device)
        if why:
            built[kernels] = (None, why)
            res[key] = {"kernels": kernels, "skipped": why}
            continue
        try:
            k_spec, k_desc = (spec, desc) if kernels == "auto" else make_spec(
                a.family, a.stage, a.preset, seed=a.seed, axes=axes, dtype=a.dtype, kernels=kernels)
            with time_box(a.build_budget, f"artifact build (kernels={kernels})"):
                path, info = build_or_reuse(k_spec, k_desc, device, Path(a.cache_dir), a.verify_build)
            built[kernels] = (path, None)
            res[key] = {**info, "kernels": kernels, "path": str(path)}
        except Exception as e:  # noqa: BLE001
            built[kernels] = (None, short_error(e))
            res[key] = {"kernels": kernels, "error": built[kernels][1]}
            traceback.print_exc()
        save()
    artifact, artifact_error = built.pop("auto", (None, "not built: no variant asked for it"))

    ctx = VariantContext(
        family=a.family,
        stage=a.stage,
        spec=spec,
        device=device,
        original=original,
        rewritten=rewritten,
        artifact=artifact,
        artifact_error=artifact_error,
        compile_mode=a.compile_mode,
        other_artifacts=built,
    )
    prim = primary_sizes(spec)
    batchable = "batch" in spec.plan.axes
    for name in [v for v in a.variants if applies(v, spec)]:
        if name in COMPILED:  # cold starts before the expensive compiles, so a budget cut spares them
            run_cold_starts(res, a, artifact, spec, prim, save)
        rec: dict[str, Any] = {"status": "running"}
        res["variants"][name] = rec
        save()
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
                rec["kernels"] = v.built_kernels   # the manifest's StageEntry.kernels
            rec["memory"] = mem_delta(base, device, "after_setup")
            wb = v.weight_bytes()
            if wb is not None:
                rec["weight_mib"] = round(wb / MIB, 2)
            rec["buckets"] = {}
            for s in buckets:
                k = key_of(s)
                t0 = time.time()
                left = (deadline - time.time()) if deadline else None
                if left is not None and left <= 0:
                    raise BudgetExceeded(f"{name} exceeded its {budget:.0f} s budget before bucket {k}")
                with time_box(left, f"{name} prepare {k}"):
                    fn = v.prepare(s, inputs[k])
                    out = fn(inputs[k])
                sync(device)
                b: dict[str, Any] = {"prepare_s": round(time.time() - t0, 3)}
                b["rel_err_vs_fp32"] = parity(out, refs[k])
                if name.startswith("upstream") and spec.kind == "lm_step" and s.get("batch", 1) > 1:
                    # upstream steps a batch in lockstep (one position for all rows) while the bench's rows sit at
                    # random positions: same work (it attends over the whole cache under a mask), other numbers
                    b["rel_err_vs_fp32"] = None
                    b["parity_note"] = "upstream decodes rows in lockstep (row 0's position): not comparable"
                del out
                b.update(time_fn(lambda fn=fn, xs=inputs[k]: fn(xs), device, warmup, reps))
                if floors[k]["ms"] > 0:
                    b["x_floor"] = b["ms"] / floors[k]["ms"]
                if name == "ttsaot_graph":
                    v.stage.validate_inputs = False
                    b["ms_without_input_validation"] = time_fn(
                        lambda fn=fn, xs=inputs[k]: fn(xs), device, warmup, reps
                    )["ms"]
                    v.stage.validate_inputs = True
                rec["buckets"][k] = b
                save()
            rec["memory"].update(mem_delta(base, device, "after_buckets"))
            if getattr(v, "api", None):
                rec["api"] = v.api
            if name in a.stream_variants and spec.kind == "codec_decoder":
                try:
                    left = (deadline - time.time()) if deadline else None
                    if left is not None and left <= 0:
                        raise BudgetExceeded(
                            f"{name}: its {budget:.0f} s budget was used up before streaming"
                        )
                    with time_box(left, f"{name} streaming"):
                        rec["streaming"] = measure_streaming(
                            v, spec, device, a.stream_seconds, 2 if a.quick else 5, a.seed
                        )
                except Skipped as e:
                    rec["streaming"] = {"skipped": str(e)}
                except Exception as e:  # noqa: BLE001
                    rec["streaming"] = {"error": short_error(e)}
                    traceback.print_exc()
                save()
            if name in a.throughput_variants and batchable:
                left = (deadline - time.time()) if deadline else None
                try:
                    if left is not None and left <= 0:
                        raise BudgetExceeded(
                            f"{name}: its {budget:.0f} s budget was used up before throughput"
                        )
                    rec["throughput"] = []
                    with time_box(left, f"{name} throughput"):
                        measure_throughput(
                            v,
                            spec,
                            device,
                            a.throughput_batches,
                            warmup,
                            max(5, reps // 2),
                            a.seed,
                            prim,
                            rec["throughput"],
                        )
                except Skipped as e:
                    rec["throughput_skipped"] = str(e)
                save()
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
        save()

    run_cold_starts(res, a, artifact, spec, prim, save)
    res["status"] = "ok"
    res["seconds"] = round(time.time() - t_all, 1)
    res["finished"] = now_iso()
    save()
    return res
