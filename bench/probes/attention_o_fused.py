"""Probe (issue 14): the LocDiT layer's bidirectional attention computed inside its o_proj, one launch instead of two.

The LocDiT's b1 call runs 108 layer passes of qkv → `sequence_attention` (4.48 µs a launch on the H200, one program
per (sequence, head) over 11 tokens) → o_proj (+ residual, the next RMSNorm in its split-K second pass); the
profile at 237c7e7 puts the attention at 12 % of the call (bench/results/nvidia-h200/probes/norm_out_ab/). Here a
probe kernel, `attention_o_kernel`, computes each o_proj program's K range of heads itself: for each head of its
range, the attention of all rows of the bucket at once (both CFG sequences in one [BLOCK_M, BLOCK_M] score tile,
block-diagonal by sequence, NeoX RoPE in fp32 as `sequence_attention` does, probabilities rounded to the compute
dtype, the head's output rounded once), then that head's [BLOCK_M, head_dim] × W[:, head]ᵀ on the tensor cores.
Every column tile recomputes its heads' attention (N_OUT / BLOCK_N times the work, a few KFLOP each), which is the
price of dropping the launch, the attention's programmatic-launch wait and o's round trip through L2.

Variants: heads split SPLIT ways (fp32 partials, then the same second pass as the op: `norm_out_epilogue_kernel`,
y and the next RMSNorm) × BLOCK_N × warps; the baseline is the stage's chain (`launch_sequence_attention` + the o_proj
`skinny_linear_norm_out` at its plan). Each variant is checked against the baseline's outputs, then timed as a
chain of CHAIN layer passes (qkv, attention, o_proj) in one CUDA graph, weights rotated past L2, every launch with
programmatic dependent launch where the kernels wait for it.

    python -m bench.probes.attention_o_fused OUT.json [cuda|cpu]   (cpu: a smoke run under TRITON_INTERPRET=1)

Not part of the kernel layer: if it wins, it becomes an op (an o_proj prologue of `skinny_linear`'s tile form)."""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
import triton
import triton.language as tl

from ttsaot.builder.kernels.decode_attention_triton import _norm_rope
from ttsaot.builder.kernels.pdl_triton import grid_dependency_wait
from ttsaot.builder.kernels.skinny_linear_triton import _epilogue, _mma

LOG2E = 1.4426950408889634
# the LocDiT at b1: 2 sequences (CFG) of 11 tokens, hidden 1024, 16 q heads / 2 kv heads of 128; (a tiny smoke shape)
SHAPES = {
    "locdit": dict(N=2, T=11, D=1024, hq=16, hkv=2, hd=128),
    "smoke": dict(N=2, T=5, D=64, hq=4, hkv=2, hd=16),
}
SPLITS = (1, 2, 4, 8, 16)
BLOCK_NS = (16, 32, 64)
WARPS = (4, 8)  # an sm_90 compile at the LocDiT shape: 255 registers and spills for 2+ heads a program at either
CHAIN = 32


@triton.jit
def attention_o_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    w_ptr,
    r_ptr,
    y_ptr,
    part_ptr,
    M,
    T,
    QKV_ROW,
    N_OUT,
    K,
    scale_log2,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PER_SPLIT: tl.constexpr,
    SPLIT: tl.constexpr,
    ROPE: tl.constexpr,
    FP32_DOT: tl.constexpr,
    PDL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Grid (cdiv(N_OUT, BLOCK_N), SPLIT): o_proj columns × head ranges. SPLIT == 1: y = r + o @ Wᵀ; else fp32
    partials [SPLIT, M, N_OUT] for the second pass."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    token = grid_dependency_wait(PDL, True)
    dt = qkv_ptr.dtype.element_ty
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    seq = offs_m // T
    pos = (offs_m % T)[:, None]
    same = (seq[:, None] == seq[None, :]) & m_mask[None, :]  # a token attends to its own sequence's tokens
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N_OUT
    rows = offs_m * QKV_ROW + token
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for i in range(HEADS_PER_SPLIT):
        h = pid_k * HEADS_PER_SPLIT + i
        kvh = h // (HQ // HKV)
        q = _norm_rope(qkv_ptr, rows + h * HEAD_DIM, offs_d, m_mask, qkv_ptr, cos_ptr, sin_ptr, pos, 0.0, False, ROPE,
                       HEAD_DIM, "")  # fmt: skip
        k = _norm_rope(qkv_ptr, rows + (HQ + kvh) * HEAD_DIM, offs_d, m_mask, qkv_ptr, cos_ptr, sin_ptr, pos, 0.0,
                       False, ROPE, HEAD_DIM, "")  # fmt: skip
        v_rows = rows + (HQ + HKV + kvh) * HEAD_DIM
        v = tl.load(qkv_ptr + v_rows[:, None] + offs_d[None, :], mask=m_mask[:, None], other=0.0)
        if FP32_DOT:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(same, s * scale_log2, float("-inf"))
        mx = tl.max(s, axis=1)
        mx = tl.where(mx == float("-inf"), 0.0, mx)  # padded rows: no key at all
        p = tl.where(same, tl.exp2(s - mx[:, None]), 0.0)
        den = tl.sum(p, axis=1)
        p = (p / tl.where(den > 0, den, 1.0)[:, None]).to(dt)
        if FP32_DOT:
            o = tl.dot(p.to(tl.float32), v.to(tl.float32), input_precision="ieee")
        else:
            o = tl.dot(p, v)
        # the head's W columns after the attention (loaded first, they held registers the attention spilled)
        w = tl.load(
            w_ptr + offs_n.to(tl.int64)[:, None] * K + (h * HEAD_DIM + offs_d)[None, :], mask=n_mask[:, None], other=0.0
        )
        acc = _mma(o.to(dt), w, acc, FP32_DOT)
    if SPLIT > 1:
        part = part_ptr + (pid_k * M + offs_m)[:, None] * N_OUT + offs_n[None, :]
        tl.store(part, acc, mask=m_mask[:, None] & n_mask[None, :])
    else:
        _epilogue(acc, acc, offs_m, offs_n, m_mask, n_mask, r_ptr, r_ptr + token, y_ptr, N_OUT, 1.0, False, False,
                  True)  # fmt: skip


def launch_attention_o(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    w_o: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    hq: int,
    hkv: int,
    T: int,
    scale: float,
    split: int,
    block_n: int,
    pdl: bool,
    num_warps: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, RMSNorm(y)) for y = residual + o_proj(attention(qkv)): the probe kernel, then the op's second pass."""
    from ttsaot.builder.kernels import skinny_linear_triton as S
    from ttsaot.builder.kernels.common import cdiv, next_power_of_2
    from ttsaot.builder.kernels.pdl import kernels_wait

    qkv2 = qkv.reshape(-1, qkv.shape[-1])
    M, n_out, K = qkv2.shape[0], w_o.shape[0], w_o.shape[1]
    hd = K // hq
    r2 = residual.reshape(M, n_out)
    y = r2.new_empty((M, n_out))
    yn = torch.empty_like(y)
    part = qkv2.new_empty((split, M, n_out), dtype=torch.float32) if split > 1 else qkv2
    wait = kernels_wait(qkv.device)
    launch = {"launch_pdl": True} if pdl and qkv.device.type == "cuda" else {}
    attention_o_kernel[(cdiv(n_out, block_n), split)](
        qkv2, cos, sin, w_o, r2, y, part, M, T, qkv2.shape[1], n_out, K, float(scale) * LOG2E,
        HQ=hq, HKV=hkv, HEAD_DIM=hd, HEADS_PER_SPLIT=hq // split, SPLIT=split, ROPE=1,
        FP32_DOT=qkv.dtype == torch.float32 or qkv.device.type != "cuda", PDL=wait,
        BLOCK_M=max(16, next_power_of_2(M)), BLOCK_N=block_n, num_warps=num_warps, num_stages=2, **launch,
    )  # fmt: skip
    S.norm_out_epilogue_kernel[(M,)](
        part, r2, r2, norm_weight, y, yn, M, n_out, 1.0, 1e-6,
        HAS_BIAS=False, HAS_RESIDUAL=True, SPLIT_K=split if split > 1 else 0, PDL=wait, BLOCK_M=1,
        BLOCK_N=next_power_of_2(n_out), **launch,
    )  # fmt: skip
    return y.reshape(residual.shape), yn.reshape(residual.shape)


def _sequence_attention(qkv, cos, sin, hq, hkv, scale, pdl: bool) -> torch.Tensor:
    """launch_sequence_attention with the programmatic-launch attribute when asked."""
    from ttsaot.builder.kernels import sequence_attention_triton as A
    from ttsaot.builder.kernels.common import next_power_of_2
    from ttsaot.builder.kernels.pdl import kernels_wait

    N, T, width = qkv.shape
    hd = width // (hq + 2 * hkv)
    o = qkv.new_empty((N, T, hq * hd))
    launch = {"launch_pdl": True} if pdl and qkv.device.type == "cuda" else {}
    A.sequence_attention_kernel[(N, hq)](
        qkv, cos, sin, o, T, width, float(scale) * LOG2E, HQ=hq, HKV=hkv, HEAD_DIM=hd,
        T_PAD=max(16, next_power_of_2(T)), ROPE=1, FP32_DOT=qkv.dtype == torch.float32 or qkv.device.type != "cuda",
        PDL=kernels_wait(qkv.device), **launch,
    )  # fmt: skip
    return o


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
    if cuda:
        cq["launch_pdl"] = co["launch_pdl"] = True

    def qkv_of(i: int) -> torch.Tensor:
        return launch_skinny_linear(x, w_qkv[i], norm_weight=g1, config=cq)

    def baseline(i: int, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        o = _sequence_attention(qkv, cos, sin, hq, hkv, scale, True)
        split = 2 if K >= 2048 else 1  # the plan's at 22 rows (skinny_linear.plan_split_k), 1 for the smoke shape
        return launch_skinny_linear(o, w_o[i], residual=x, config=co, split_k=split, out_norm_weight=g2)

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
                y, yn = launch_attention_o(qkv0, cos, sin, w_o[0], x, g2, hq, hkv, T, scale, split, bn, True, warps)
                case = {"rel_err_y": kb.rel_err(y.float(), want_y.float()),
                        "rel_err_yn": kb.rel_err(yn.float(), want_yn.float())}  # fmt: skip
                calls = [
                    lambda i=i, sp=split, b=bn, w=warps: launch_attention_o(
                        qkv_of(i), cos, sin, w_o[i], x, g2, hq, hkv, T, scale, sp, b, True, w
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
