"""Probe (issue 14): the persistent one-launch decoder layer (`ttsaot::decode_layer`, grid barriers) against the
five per-op kernels it replaces, at the codebook predictors' real layer shapes, in CUDA graphs of several distinct
layers (their weights together exceed L2), beside a copy of 1 GiB in the same process.

    python -m bench.probes.decode_layer_persistent --out DIR [--reps 200]

Per shape and rows: µs per layer pass of each variant (graph replay median / layers), × the layer's byte floor
(weights + the cache positions read, at the measured copy bandwidth), the compiled kernel's registers / spills /
shared memory (whether two programs fit one SM), and a check that every variant equals the five ops bit for bit.
The five ops here are direct Triton launches (no programmatic-launch attribute, which only AOTInductor packages
get: pdl.py), so they are the per-op path WITHOUT the PDL overlap; the stage A/B (`bench run`) has both with it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

SHAPES = {  # D, Hq, Hkv, hd, I, cache positions, RoPE, q/k norm, layers in the graph
    "qwen_code_predictor": (1024, 16, 8, 128, 3072, 17, "neox", True, 5),
    "fish_fast_ar": (2560, 32, 8, 128, 9728, 10, "interleaved", False, 4),
}


def _weights(D, hq, hkv, hd, inter, qk_norm, g, dev) -> dict:
    def w(*shape):
        return (torch.randn(*shape, generator=g, device=dev) * shape[-1] ** -0.5).bfloat16()

    return {
        "input_norm": (torch.rand(D, generator=g, device=dev) + 0.5).bfloat16(),
        "qkv_weight": w((hq + 2 * hkv) * hd, D),
        "o_weight": w(D, hq * hd),
        "post_norm": (torch.rand(D, generator=g, device=dev) + 0.5).bfloat16(),
        "gate_up_weight": w(2 * inter, D),
        "down_weight": w(D, inter),
        "q_norm": (torch.rand(hd, generator=g, device=dev) + 0.5).bfloat16() if qk_norm else None,
        "k_norm": (torch.rand(hd, generator=g, device=dev) + 0.5).bfloat16() if qk_norm else None,
    }


def _args(x, pos, kc, vc, i, ws, w, cos, sin, interleaved, hd) -> tuple:
    return (x, pos, kc, vc, i, ws, w["input_norm"], w["qkv_weight"], w["o_weight"], w["post_norm"],
            w["gate_up_weight"], w["down_weight"], None, None, None, None, w["q_norm"], w["k_norm"], cos, sin,
            interleaved, hd**-0.5, 1e-6, 1e-6, 1.0)  # fmt: skip


class _Capture:
    """A `wrap` for the launcher that keeps the compiled kernel of the last launch (registers, spills, shared)."""

    def __init__(self) -> None:
        self.compiled: Any = None

    def __call__(self, kernel):
        probe = self

        class _Grid:
            def __getitem__(self, grid):
                def run(*a, **kw):
                    probe.compiled = kernel[grid](*a, **kw)
                    return probe.compiled

                return run

        return _Grid()


def bench_shape(name: str, B: int, peak_gbps: float, reps: int, dev: torch.device) -> dict:
    from bench.kernels import graph_ms
    from ttsaot.builder.kernels.decode_attention import attention_workspace, launch_decode_attention
    from ttsaot.builder.kernels.decode_layer import launch_decode_layer
    from ttsaot.builder.kernels.skinny_linear import launch_skinny_linear
    from ttsaot.builder.layers.rope import rope_table, rope_table_interleaved

    D, hq, hkv, hd, inter, S, rope, qk_norm, L = SHAPES[name]
    g = torch.Generator(device=dev).manual_seed(B)
    layers = [_weights(D, hq, hkv, hd, inter, qk_norm, g, dev) for _ in range(L)]
    table = (
        rope_table_interleaved(hd, S, 1e6, round_to=torch.bfloat16) if rope == "interleaved" else rope_table(hd, S, 1e6)
    )
    cos, sin = (t.to(dev, torch.bfloat16).contiguous() for t in table)
    interleaved = rope == "interleaved"
    x0 = torch.randn(B, D, generator=g, device=dev).bfloat16()
    pos = torch.full((B,), S // 2, dtype=torch.long, device=dev)
    kc0 = torch.randn(L, B, hkv, S, hd, generator=g, device=dev).bfloat16()
    vc0 = torch.randn(L, B, hkv, S, hd, generator=g, device=dev).bfloat16()
    ws = attention_workspace(x0, kc0)
    cap = _Capture()

    def persistent(programs):
        def run(x, kc, vc):
            for i, w in enumerate(layers):
                x = launch_decode_layer(*_args(x, pos, kc, vc, i, ws, w, cos, sin, interleaved, hd),
                                        programs=programs, wrap=cap)  # fmt: skip
            return x

        return run

    def five(x, kc, vc):
        for i, w in enumerate(layers):
            qkv = launch_skinny_linear(x, w["qkv_weight"], None, w["input_norm"], 1e-6)
            o = launch_decode_attention(qkv, pos, kc, vc, i, hd**-0.5, cos, sin, interleaved, w["q_norm"],
                                        w["k_norm"], 1e-6, ws)  # fmt: skip
            x1 = launch_skinny_linear(o, w["o_weight"], residual=x)
            h = launch_skinny_linear(x1, w["gate_up_weight"], None, w["post_norm"], 1e-6, gated=True)
            x = launch_skinny_linear(h, w["down_weight"], residual=x1)
        return x

    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    w_bytes = sum(t.numel() * t.element_size() for t in layers[0].values() if t is not None)
    kv_bytes = B * hkv * (S // 2 + 1) * hd * 2 * 2
    floor_us = (w_bytes + kv_bytes) / (peak_gbps * 1e9) * 1e6
    res: dict[str, Any] = {"shape": name, "B": B, "layers_in_graph": L, "weight_bytes_per_layer": w_bytes,
                           "floor_us_per_layer": floor_us, "sms": sms}  # fmt: skip
    want_kc, want_vc = kc0.clone(), vc0.clone()
    with torch.no_grad():
        want = five(x0, want_kc, want_vc)
        variants: dict[str, Any] = {"five_ops": five, "persistent_1x": persistent(sms)}
        got_kc, got_vc = kc0.clone(), vc0.clone()
        got = persistent(sms)(x0, got_kc, got_vc)
        torch.cuda.synchronize()
        ck = cap.compiled
        meta = {"n_regs": getattr(ck, "n_regs", None), "n_spills": getattr(ck, "n_spills", None),
                "shared": getattr(getattr(ck, "metadata", None), "shared", None)}  # fmt: skip
        res["kernel"] = meta
        res["equal_to_five_ops"] = bool(
            torch.equal(got, want) and torch.equal(got_kc, want_kc) and torch.equal(got_vc, want_vc)
        )
        res["workspace_zero"] = not bool(ws.any())
        # Two programs per SM only where two surely fit (8 warps × registers, shared): a grid barrier over programs
        # that cannot all be resident never returns.
        if meta["n_regs"] is not None and meta["n_regs"] * 256 * 2 <= 65536 and (meta["shared"] or 0) * 2 <= 200_000:
            variants["persistent_2x"] = persistent(2 * sms)
        for vname, fn in variants.items():
            kc, vc = kc0.clone(), vc0.clone()
            us = graph_ms([lambda fn=fn, kc=kc, vc=vc: fn(x0, kc, vc)], reps, dev) * 1e3 / L
            res[vname] = {"us_per_layer": us, "x_floor": us / floor_us, "gb_per_s": w_bytes / (us * 1e-6) / 1e9}
        res["workspace_zero_after"] = not bool(ws.any())
    return res


def main() -> None:
    from bench.kernels import _peak_copy

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    dev = torch.device("cuda")
    t0 = time.time()
    peak = _peak_copy(args.reps, dev)
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "copy": peak,
                           "cases": []}  # fmt: skip
    print(f"copy {peak['gb_per_s']:.0f} GB/s", flush=True)
    for name, B in (("qwen_code_predictor", 1), ("qwen_code_predictor", 2), ("fish_fast_ar", 1)):
        try:
            r = bench_shape(name, B, peak["gb_per_s"], args.reps, dev)
        except Exception as e:  # noqa: BLE001 - record and go on to the next shape
            r = {"shape": name, "B": B, "error": f"{type(e).__name__}: {str(e)[:400]}"}
        out["cases"].append(r)
        print(json.dumps(r), flush=True)
    out["seconds"] = time.time() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "decode_layer_persistent.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
