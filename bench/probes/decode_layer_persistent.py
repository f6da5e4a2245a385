"""Probe (issue 14): the persistent one-launch decoder layer (`ttsaot::decode_layer`, grid barriers) against the
five per-op kernels it replaces, at the codebook predictors' real layer shapes, in CUDA graphs of several distinct
layers (their weights together exceed L2), beside a copy of 1 GiB in the same process.

    python -m bench.probes.decode_layer_persistent --out DIR [--reps 200]

Per shape and rows: µs per layer pass of each variant (graph replay median / layers), × the layer's byte floor
(weights + the cache positions read, at the measured copy bandwidth), the compiled kernel's registers / spills,
and its relative error against the five ops (output, caches). Variants: the five ops as direct Triton launches,
without and with Triton's `launch_pdl` (the programmatic-launch attribute AOTInductor packages get through
pdl.py); the persistent kernel at each config of CONFIGS (register chunk size, warps, early gate/up request),
plain or with the attribute.
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


class _Launch:
    """A `wrap` for the launchers: adds Triton's `launch_pdl` option where asked (the programmatic-launch attribute
    AOTInductor packages get through pdl.py) and keeps the compiled kernel of the last launch (registers, ...)."""

    def __init__(self, pdl: bool) -> None:
        self.pdl = pdl
        self.compiled: Any = None

    def __call__(self, kernel):
        probe = self

        class _Grid:
            def __getitem__(self, grid):
                def run(*a, **kw):
                    if probe.pdl:
                        kw["launch_pdl"] = True
                    probe.compiled = kernel[grid](*a, **kw)
                    return probe.compiled

                return run

        return _Grid()


# Configs of the persistent kernel (decode_layer.slice_plan / kernel_config): weight elements per register chunk
# (TILE: 32 K holds the Qwen predictor's whole slice of every phase in one chunk), warps, and EARLY (the gate/up
# chunk requested before the first barrier). The designs before (git history; probes/decode_layer_barrier/)
# streamed 16 KB tiles one ahead after each barrier and did not beat the five ops with launch_pdl.
CONFIGS = {
    "tile32k_w16": {"TILE": 1 << 15, "num_warps": 16},
    "tile32k_w16_early": {"TILE": 1 << 15, "num_warps": 16, "EARLY": True},
    "tile16k_w16": {"TILE": 1 << 14, "num_warps": 16},
    "tile16k_w8": {"TILE": 1 << 14, "num_warps": 8},
    "tile8k_w8": {"TILE": 1 << 13, "num_warps": 8},
}


def bench_shape(name: str, B: int, peak_gbps: float, reps: int, dev: torch.device) -> dict:
    from bench.kernels import graph_ms
    from ttsaot.builder.kernels.decode_attention import attention_workspace, launch_decode_attention
    from ttsaot.builder.kernels.decode_layer import kernel_config, launch_decode_layer
    from ttsaot.builder.kernels.skinny_linear import launch_skinny_linear
    from ttsaot.builder.layers.rope import rope_table, rope_table_interleaved
    from ttsaot.runtime.metrics import rel_error as rel_err

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
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    base = kernel_config(D, hq * hd, inter, B)

    def persistent(programs, config, launch):
        def run(x, kc, vc):
            for i, w in enumerate(layers):
                x = launch_decode_layer(*_args(x, pos, kc, vc, i, ws, w, cos, sin, interleaved, hd),
                                        programs=programs, wrap=launch, config=config)  # fmt: skip
            return x

        return run

    def five(launch):
        def run(x, kc, vc):
            for i, w in enumerate(layers):
                qkv = launch_skinny_linear(x, w["qkv_weight"], None, w["input_norm"], 1e-6, wrap=launch)
                o = launch_decode_attention(qkv, pos, kc, vc, i, hd**-0.5, cos, sin, interleaved, w["q_norm"],
                                            w["k_norm"], 1e-6, ws, wrap=launch)  # fmt: skip
                x1 = launch_skinny_linear(o, w["o_weight"], residual=x, wrap=launch)
                h = launch_skinny_linear(x1, w["gate_up_weight"], None, w["post_norm"], 1e-6, gated=True, wrap=launch)
                x = launch_skinny_linear(h, w["down_weight"], residual=x1, wrap=launch)
            return x

        return run

    w_bytes = sum(t.numel() * t.element_size() for t in layers[0].values() if t is not None)
    kv_bytes = B * hkv * (S // 2 + 1) * hd * 2 * 2
    floor_us = (w_bytes + kv_bytes) / (peak_gbps * 1e9) * 1e6
    res: dict[str, Any] = {"shape": name, "B": B, "layers_in_graph": L, "weight_bytes_per_layer": w_bytes,
                           "floor_us_per_layer": floor_us, "sms": sms, "variants": {}}  # fmt: skip
    with torch.no_grad():
        want_kc, want_vc = kc0.clone(), vc0.clone()
        want = five(_Launch(False))(x0, want_kc, want_vc)
        variants: dict[str, Any] = {"five_ops": five(_Launch(False)), "five_ops_pdl": five(_Launch(True))}
        for cname, c in CONFIGS.items():
            for pdl in (False, True):
                cfg = dict(base, **c)
                launch = _Launch(pdl)
                kc, vc = kc0.clone(), vc0.clone()
                try:
                    got = persistent(sms, cfg, launch)(x0, kc, vc)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - a config that does not compile: recorded
                    res["variants"][cname] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                    break
                ck = launch.compiled
                meta = {"n_regs": getattr(ck, "n_regs", None), "n_spills": getattr(ck, "n_spills", None),
                        "rel_err_vs_five_ops": rel_err(got.float(), want.float()),
                        "cache_rel_err_vs_five_ops": max(rel_err(kc.float(), want_kc.float()),
                                                         rel_err(vc.float(), want_vc.float())),
                        "workspace_zero": not bool(ws.any())}  # fmt: skip
                variants[f"persistent_{cname}{'_pdl' if pdl else ''}"] = (persistent(sms, cfg, launch), meta)
        for vname, v in variants.items():
            fn, meta = v if isinstance(v, tuple) else (v, {})
            kc, vc = kc0.clone(), vc0.clone()
            try:
                us = graph_ms([lambda fn=fn, kc=kc, vc=vc: fn(x0, kc, vc)], reps, dev) * 1e3 / L
            except Exception as e:  # noqa: BLE001
                res["variants"][vname] = {"error": f"{type(e).__name__}: {str(e)[:300]}", **meta}
                continue
            res["variants"][vname] = {"us_per_layer": us, "x_floor": us / floor_us,
                                      "gb_per_s": w_bytes / (us * 1e-6) / 1e9, **meta}  # fmt: skip
            print(f"  {name} B={B} {vname}: {us:.2f} us/layer ({us / floor_us:.2f}x floor) {meta}", flush=True)
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
        if "error" in r:
            print(json.dumps(r), flush=True)
    out["seconds"] = time.time() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "decode_layer_persistent.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
