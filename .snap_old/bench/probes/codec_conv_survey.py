"""GPU probe (issue 15 groundwork): where a codec decode's convolution time goes, per layer and per algorithm
choice, before any codec kernel is written. Also the cuBLAS baseline of the decode-step GEMV shapes (issue 14).

Run on the GPU machine from the repo root: `python bench/probes/codec_conv_survey.py --out $OUT/survey.json`.
Eager modules of the full configs (random weights, rewritten by the stages' own passes, as the builder exports
them); every figure is a median of CUDA-event-timed repetitions after warm-up, on random non-zero inputs."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ttsaot.runtime.graphs import StaticGraph  # noqa: E402


def timed(fn, reps: int = 5, iters: int = 20) -> float:
    """Median ms per call over `reps` repetitions of `iters` back-to-back calls (after warm-up)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / iters)
    return statistics.median(out)


def graph_timed(fn, reps: int = 7) -> float:
    """Median ms of one CUDA-graph replay of fn (launch gaps removed)."""
    g = StaticGraph(lambda _inputs: fn(), [], device=torch.device("cuda"))
    return timed(g.replay, reps=reps, iters=10)


def copy_gbps(nbytes: int) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), iters=20)
    return 2 * nbytes / ms / 1e6


PRESET = "full"
DEVICE = "cuda"


def stage_module(family: str, stage: str, dtype: str | None, axes: dict):
    from bench.specs import make_spec
    from ttsaot.builder.passes import cast_to_compute_dtype

    spec, _ = make_spec(family, stage, PRESET, axes=axes, dtype=dtype)
    m = spec.make_module().eval()
    for p in spec.passes:
        p(m)
    m = cast_to_compute_dtype(m, spec.dtype).to(DEVICE).eval()
    return spec, m


def conv_layers(m, spec, sizes):
    """(name, module, input shape) of every Conv1d/ConvTranspose1d met in one forward at `sizes`."""
    seen = []
    hooks = []
    for name, mod in m.named_modules():
        if isinstance(mod, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
            hooks.append(
                mod.register_forward_pre_hook(
                    lambda mod, args, name=name: seen.append((name, mod, tuple(args[0].shape)))
                )
            )
    g = torch.Generator().manual_seed(0)
    ins = spec.make_inputs(sizes, g)
    with torch.no_grad():
        m(*[ins[n].to(DEVICE) for n in spec.input_names])
    for h in hooks:
        h.remove()
    return seen, ins


def conv_fn(mod, x, layout: str):
    w, b = mod.weight, mod.bias
    tr = isinstance(mod, torch.nn.ConvTranspose1d)
    if layout == "ncl":
        if tr:
            return lambda: F.conv_transpose1d(
                x, w, b, mod.stride, mod.padding, mod.output_padding, mod.groups, mod.dilation
            )
        return lambda: F.conv1d(x, w, b, mod.stride, mod.padding, mod.dilation, mod.groups)
    x4 = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
    w4 = w.unsqueeze(2).contiguous(memory_format=torch.channels_last)
    if tr:
        return lambda: F.conv_transpose2d(
            x4,
            w4,
            b,
            (1, mod.stride[0]),
            (0, mod.padding[0]),
            (0, mod.output_padding[0]),
            mod.groups,
            (1, mod.dilation[0]),
        )
    return lambda: F.conv2d(x4, w4, b, (1, mod.stride[0]), (0, mod.padding[0]), (1, mod.dilation[0]), mod.groups)


def conv_flops(mod, shape) -> float:
    B, Cin, T = shape
    k = mod.kernel_size[0]
    Cout = mod.out_channels
    if isinstance(mod, torch.nn.ConvTranspose1d):
        return 2.0 * B * T * Cin * Cout * k / mod.groups
    Tout = (T + 2 * mod.padding[0] - mod.dilation[0] * (k - 1) - 1) // mod.stride[0] + 1
    return 2.0 * B * Tout * Cout * Cin * k / mod.groups


def survey(family, stage, dtype, sizes, tf32_variants):
    spec, m = stage_module(family, stage, dtype, {k: (v,) for k, v in (sizes or {}).items()})
    sizes = sizes or spec.plan.buckets()[0]
    layers, ins = conv_layers(m, spec, sizes)
    rows = []
    for name, mod, shape in layers:
        x = torch.randn(shape, device="cuda", dtype=mod.weight.dtype)
        row = {
            "layer": name,
            "type": type(mod).__name__,
            "in": list(shape),
            "out_channels": mod.out_channels,
            "kernel": mod.kernel_size[0],
            "stride": mod.stride[0],
            "dilation": mod.dilation[0],
            "groups": mod.groups,
            "gflop": conv_flops(mod, shape) / 1e9,
        }
        for tf32 in tf32_variants:
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
            for bench_flag in (False, True):
                torch.backends.cudnn.benchmark = bench_flag
                for layout in ("ncl", "nhwc"):
                    key = f"{layout}{'_bench' if bench_flag else ''}{'_tf32' if tf32 else ''}"
                    try:
                        row[key] = round(timed(conv_fn(mod, x, layout)), 4)
                    except Exception as e:  # noqa: BLE001
                        row[key] = f"error: {type(e).__name__}: {str(e)[:80]}"
        torch.backends.cudnn.benchmark = False
        rows.append(row)
    whole = {}
    args = [ins[n].cuda() for n in spec.input_names]
    for tf32 in tf32_variants:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
        for bench_flag in (False, True):
            torch.backends.cudnn.benchmark = bench_flag
            with torch.no_grad():
                whole[f"eager_graph{'_bench' if bench_flag else ''}{'_tf32' if tf32 else ''}"] = round(
                    graph_timed(lambda: m(*args)), 4
                )
    torch.backends.cudnn.benchmark = True
    prof_rows = []
    try:
        from torch.profiler import ProfilerActivity, profile

        with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                m(*args)
            torch.cuda.synchronize()
        for ev in sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[:20]:
            prof_rows.append(
                {
                    "kernel": ev.key[:120],
                    "calls_per_decode": ev.count / 3,
                    "ms_per_decode": round(ev.self_device_time_total / 3 / 1000, 4),
                }
            )
    except Exception as e:  # noqa: BLE001
        prof_rows.append({"error": str(e)[:200]})
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    return {
        "family": family,
        "stage": stage,
        "dtype": str(spec.dtype),
        "sizes": sizes,
        "convs": rows,
        "whole_module_ms": whole,
        "profile_bench_on": prof_rows,
    }


def gemv_baseline():
    """cuBLAS F.linear on the decode-step shapes vs a copy of the weight bytes (what the kernels must beat)."""
    shapes = {
        "vox_qkv": (2560, 2048),
        "vox_o": (2048, 2048),
        "vox_gate_up": (12288, 2048),
        "vox_down": (2048, 6144),
        "fish_qkv": (6144, 2560),
        "fish_gate_up": (19456, 2560),
        "fish_down": (2560, 9728),
        "qwen_cp_qkv": (4096, 1024),
        "qwen_cp_down": (1024, 3072),
    }
    out = []
    for name, (N, K) in shapes.items():
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        nbytes = w.numel() * 2
        cp = copy_gbps(nbytes)
        for M in (1, 4, 16, 64, 176):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            ms = graph_timed(lambda x=x, w=w: F.linear(x, w))
            gbps = nbytes / ms / 1e6
            out.append(
                {
                    "shape": name,
                    "N": N,
                    "K": K,
                    "M": M,
                    "ms": round(ms, 5),
                    "weight_gbps": round(gbps, 1),
                    "copy_gbps": round(cp, 1),
                    "pct_of_copy": round(100 * gbps / cp, 1),
                }
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "started": time.time(), "runs": []}
    path = Path(a.out)
    path.parent.mkdir(parents=True, exist_ok=True)

    def save():
        path.write_text(json.dumps(res, indent=1))

    try:
        res["gemv_baseline"] = gemv_baseline()
    except Exception as e:  # noqa: BLE001
        res["gemv_baseline"] = f"error {e}"
    save()
    plan = [
        ("qwen3-tts-12hz", "code2wav", None, {"batch": 1, "frames": 50}, (False,)),
        ("qwen3-tts-12hz", "code2wav", None, {"batch": 4, "frames": 50}, (False,)),
        ("fish-s2-pro", "dac_decoder", None, {"batch": 1, "frames": 29}, (False, True)),
        ("fish-s2-pro", "dac_decoder", None, {"batch": 4, "frames": 29}, (False, True)),
        ("fish-s2-pro", "dac_decoder", "bf16", {"batch": 4, "frames": 29}, (False,)),
        ("voxcpm2", "vae_decoder", None, {"batch": 1, "frames": 36}, (False, True)),
    ]
    for fam, st, dt, sizes, tf in plan:
        t0 = time.time()
        try:
            r = survey(fam, st, dt, sizes, tf)
        except Exception:  # noqa: BLE001
            import traceback

            r = {"family": fam, "stage": st, "error": traceback.format_exc()[-1500:]}
        r["seconds"] = round(time.time() - t0, 1)
        res["runs"].append(r)
        save()
        print(fam, st, dt, sizes, r.get("whole_module_ms", r.get("error")), flush=True)
    try:
        enc = survey("fish-s2-pro", "dac_encoder", None, None, (False,))
        res["runs"].append(enc)
    except Exception as e:  # noqa: BLE001
        res["runs"].append({"stage": "dac_encoder", "error": str(e)[:500]})
    save()


if __name__ == "__main__":
    main()
