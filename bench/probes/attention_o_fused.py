"""Probe (issue 14): the LocDiT layer's bidirectional attention computed inside its o_proj, one launch instead of two.

The LocDiT's b1 call runs 108 layer passes of qkv → `sequence_attention` (4.48 µs a launch on the H200, one program
per (sequence, head) over 11 tokens) → o_proj (+ residual, the next RMSNorm in its split-K second pass); the
profile at 237c7e7 puts the attention at 12 % of the call (bench/results/nvidia-h200/probes/norm_out_ab/). Here
`ttsaot::sequence_attention_o`'s kernel (builder/kernels/sequence_attention_o_triton.py) computes each o_proj
program's K range of heads itself: for each head of its range, the attention of all rows of the bucket at once (both
CFG sequences in one [BLOCK_M, BLOCK_M] score tile, block-diagonal by sequence, NeoX RoPE in fp32 as
`sequence_attention` does, probabilities rounded to the compute dtype, the head's output rounded once), then that
head's [BLOCK_M, head_dim] × W[:, head]ᵀ on the tensor cores.
Every column tile recomputes its heads' attention (N_OUT / BLOCK_N times the work, a few KFLOP each), which is the
price of dropping the launch, the attention's programmatic-launch wait and o's round trip through L2.

Variants: heads split SPLIT ways (fp32 partials, then the same second pass as the op: `norm_out_epilogue_kernel`,
y and the next RMSNorm) × BLOCK_N × warps; the baseline is the stage's chain (`launch_sequence_attention` + the o_proj
`skinny_linear_norm_out` at its plan). Each variant is checked against the baseline's outputs, then timed as a
chain of CHAIN layer passes (qkv, attention, o_proj) in one CUDA graph, weights rotated past L2, every launch with
programmatic dependent launch where the kernels wait for it.

    python -m bench.probes.attention_o_fused OUT.json [cuda|cpu]   (cpu: a smoke run under TRITON_INTERPRET=1)

The probe runs the ops' own launchers, at each swept config instead of `sequence_attention_o.plan`'s, every launch
with the programmatic-launch attribute the packages' launches carry."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch

# the LocDiT at b1: 2 sequences (CFG) of 11 tokens, hidden 1024, 16 q heads / 2 kv heads of 128; (a tiny smoke shape)
SHAPES = {
    "locdit": dict(N=2, T=11, D=1024, hq=16, hkv=2, hd=128),
    "smoke": dict(N=2, T=5, D=64, hq=4, hkv=2, hd=16),
}


def _sweep(name: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """A swept choice, narrowed by the environment (e.g. ATTENTION_O_SPLITS=4,8,16) where a call has little time."""
    value = os.environ.get(f"ATTENTION_O_{name}", "")
    return tuple(int(v) for v in value.split(",")) if value else default


SPLITS = _sweep("SPLITS", (1, 2, 4, 8, 16))
BLOCK_NS = _sweep("BLOCK_NS", (16, 32, 64))
WARPS = _sweep("WARPS", (4, 8))  # sm_90 at the LocDiT shape: 255 registers and spills for 2+ heads a program
CHAIN = 32


def _pdl_wrap(pdl: bool, dev: torch.device):
    """The launchers' `wrap`: every launch with the programmatic-launch attribute (as the packages' launch helper
    adds it, pdl.py) when asked and on CUDA; plain launches otherwise."""
    if not (pdl and dev.type == "cuda"):
        return lambda kernel: kernel

    def wrap(kernel):
        class Launch:
            def __getitem__(self, grid):
                return lambda *args, **kwargs: kernel[grid](*args, **kwargs, launch_pdl=True)

        return Launch()

    return wrap


def launch_attention_o(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    w_o: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    hq: int,
    hkv: int,
    scale: float,
    split: int,
    block_n: int,
    pdl: bool,
    num_warps: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, RMSNorm(y)) for y = residual + o_proj(attention(qkv)): the op's launcher at (split, block_n, warps)."""
    from ttsaot.builder.kernels.sequence_attention_o import launch_sequence_attention_o

    return launch_sequence_attention_o(
        qkv, cos, sin, hq, hkv, scale, w_o, None, residual, 1.0, norm_weight, 1e-6,
        config=(split, block_n, num_warps), wrap=_pdl_wrap(pdl, qkv.device),
    )  # fmt: skip


def _sequence_attention(qkv, cos, sin, hq, hkv, scale, pdl: bool) -> torch.Tensor:
    """launch_sequence_attention with the programmatic-launch attribute when asked."""
    from ttsaot.builder.kernels.sequence_attention import launch_sequence_attention

    return launch_sequence_attention(qkv, cos, sin, hq, hkv, scale, wrap=_pdl_wrap(pdl, qkv.device))


def run_shape(name: str, s: dict, dev: torch.device, reps: int) -> dict:
    import bench.kernels as kb
    from ttsaot.builder.kernels.skinny_linear import launch_skinny_linear
    from ttsaot.builder.layers.rope import rope_table

    cuda = dev.type == "cuda"
    g = torch.Generator(device=dev).manual_seed(11)
    dt = torch.bfloat16 if cuda else torch.float32  # the interpreter: fp32 (its 16-bit dots are not the GPU's)
    N, T, D, hq, hkv, hd = s["N"], s["T"], s["D"], s["hq"], s["hkv"], s["hd"]
    n_qkv, K = (hq + 2 * hkv) * hd, hq * hd
    n_sets = kb._sets_for((n_qkv * D + D * K) * 2, dev) if cuda else 1
    w_qkv = [(torch.randn(n_qkv, D, generator=g, device=dev) * D**-0.5).to(dt) for _ in range(n_sets)]
    w_o = [(torch.randn(D, K, generator=g, device=dev) * K**-0.5).to(dt) for _ in range(n_sets)]
    g1 = (torch.rand(D, generator=g, device=dev) + 0.5).to(dt)
    g2 = (torch.rand(D, generator=g, device=dev) + 0.5).to(dt)
    x = torch.randn(N, T, D, generator=g, device=dev).to(dt)
    cos, sin = (t.to(dev) for t in rope_table(hd, T, 10000.0))  # fp32 tables, as the LocDiT's
    scale = hd**-0.5
    cq = {"BLOCK_N": 32, "BLOCK_K": min(256, D), "num_warps": 4, "num_stages": 4 if cuda else 1}
    co = {"BLOCK_N": 16, "BLOCK_K": min(256, K), "num_warps": 4, "num_stages": 4 if cuda else 1}
    pdl = _pdl_wrap(True, dev)  # every launch of both forms with the attribute, as in the packages

    def qkv_of(i: int) -> torch.Tensor:
        return launch_skinny_linear(x, w_qkv[i], norm_weight=g1, config=cq, wrap=pdl)

    def baseline(i: int, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        o = _sequence_attention(qkv, cos, sin, hq, hkv, scale, True)
        split = 2 if K >= 2048 else 1  # the plan's at 22 rows (skinny_linear.plan_split_k), 1 for the smoke shape
        return launch_skinny_linear(o, w_o[i], residual=x, config=co, split_k=split, out_norm_weight=g2, wrap=pdl)

    qkv0 = qkv_of(0)
    want_y, want_yn = baseline(0, qkv0)
    out: dict[str, Any] = {"shape": s, "weight_sets": n_sets, "variants": {}}
    rot = [i % n_sets for i in range(CHAIN if cuda else 1)]
    out["baseline_layer_us"] = kb.graph_ms([lambda i=i: baseline(i, qkv_of(i)) for i in rot], reps, dev) * 1e3
    out["qkv_alone_us"] = kb.graph_ms([lambda i=i: qkv_of(i) for i in rot], reps, dev) * 1e3
    print(name, "baseline", round(out["baseline_layer_us"], 3), "qkv", round(out["qkv_alone_us"], 3), flush=True)
    for split in SPLITS:
        if hq % split:
            continue
        for bn, warps in [(b, w) for b in BLOCK_NS for w in WARPS] if cuda else [(16, 4)]:
            key = f"split{split}/bn{bn}/w{warps}"
            try:
                y, yn = launch_attention_o(qkv0, cos, sin, w_o[0], x, g2, hq, hkv, scale, split, bn, True, warps)
                case = {"rel_err_y": kb.rel_err(y.float(), want_y.float()),
                        "rel_err_yn": kb.rel_err(yn.float(), want_yn.float())}  # fmt: skip
                calls = [
                    lambda i=i, sp=split, b=bn, w=warps: launch_attention_o(
                        qkv_of(i), cos, sin, w_o[i], x, g2, hq, hkv, scale, sp, b, True, w
                    )
                    for i in rot
                ]
                case["layer_us"] = kb.graph_ms(calls, reps, dev) * 1e3
            except Exception as e:  # noqa: BLE001 - a variant the compiler refuses is a result too
                case = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            out["variants"][key] = case
            print(name, key, {k: round(v, 4) if isinstance(v, float) else v for k, v in case.items()}, flush=True)
    return out


def main(argv: list[str]) -> int:
    from bench.common import device_info

    dev = torch.device(argv[1] if len(argv) > 1 else "cuda")
    torch.set_grad_enabled(False)
    res: dict = {"device": device_info(dev), "shapes": {}}
    for name, s in SHAPES.items():
        if (name == "smoke") != (dev.type != "cuda"):
            continue
        res["shapes"][name] = run_shape(name, s, dev, reps=50 if dev.type == "cuda" else 1)
        json.dump(res, open(argv[0], "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
