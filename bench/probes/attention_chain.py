"""Where a predictor layer's attention time goes: `python -m bench.probes.attention_chain OUT.json`.

The H200 profiles put `ttsaot::decode_attention` at 6.2-6.7 µs of its own per layer in the Qwen code_predictor
(a third of the layer; 3.5 in Fish fast_ar) where its bytes take < 0.1 µs. This probe times, at batch 1 on the
predictors' shapes, every kernel launched with programmatic dependent launch as the stages' packages launch them
(`launch_pdl`), each chain captured in one CUDA graph of back-to-back layers (weights rotated past L2):

- `layer/*`: qkv (RMSNorm prologue) → attention → o (+ residual), the projections at the one-row rule's config;
  `layer/no_attention`: qkv → o with o reading a fixed buffer, so `marginal` = what the attention adds to a layer;
- `alone/*`: the attention alone, launch after launch;
- per variant: warps 1/2/4/8, and the shape's q/k RMSNorm and RoPE switched off one at a time (what each stage
  of the kernel's chain costs);
- `fused`: `ttsaot::qkv_attention` (the projection and the attention in one launch) → o, its output checked equal
  to the two kernels'.

The predictors' attention runs its whole-cache form at the cache sizes of the stages (T0 + steps - 1 positions), at
a position in the middle of the cache. The VoxCPM2 LM steps' (`voxcpm2_*`, a 512-token context: the bench's
`base_lm_step` / `residual_lm_step` bucket) runs the split form at the cache's last position, and its variants are
the split plans (`SPLIT_PLANS`: the launcher's plan is 9 splits of 64 positions at B = 1 on 132 SMs, each merged by
the last split through the step's ticket workspace) × the configs the autotuner chose from before the rule
(`SPLIT_CONFIGS`; decode_attention_triton.SPLIT_WARPS / SPLIT_STAGES now): which is the fastest inside a layer's
chain, where the profiles put the attention at ~7 µs of its own per layer. (The `/unrolled` variants of the committed
H200 results, bench/results/nvidia-h200/probes/lm_split_norm_cost/, are the merge every variant runs since.)

    python -m bench.probes.attention_chain OUT.json [cuda|cpu] [SHAPE ...]   (cpu: under TRITON_INTERPRET=1)"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

SHAPES: dict[str, dict[str, Any]] = {
    # D, heads, kv heads, head dim, q/k norm, rope form, cache positions
    "qwen_code_predictor": dict(D=1024, hq=16, hkv=8, hd=128, qk_norm=True, rope="neox", S=16),
    "fish_fast_ar": dict(D=2560, hq=32, hkv=8, hd=128, qk_norm=False, rope="interleaved", S=10),
    # VoxCPM2's LMs (MiniCPM4: NeoX RoPE in the base LM, none in the residual LM): 513 cache slots, the last token
    "voxcpm2_base_lm": dict(D=2048, hq=16, hkv=2, hd=128, qk_norm=False, rope="neox", S=513, pos=511),
    "voxcpm2_residual_lm": dict(D=2048, hq=16, hkv=2, hd=128, qk_norm=False, rope="none", S=513, pos=511),
}
# (splits, positions per loop step, fewest positions per split): the launcher's plan for the LM shapes is (9, 64, 64)
SPLIT_PLANS = ((1, 64, 64), (2, 64, 64), (3, 64, 64), (5, 64, 64), (9, 64, 64), (16, 32, 32))
SPLIT_CONFIGS = ((4, 2), (4, 3), (8, 2))  # (warps, stages): the autotuner's former candidates
WARPS = (1, 2, 4, 8)
CHAIN = 32  # layers per graph


def _config(K: int, N: int, norm: bool, sms: int) -> dict:
    from ttsaot.builder.kernels.skinny_linear_triton import one_row_config

    c = one_row_config(K, norm, False, N, sms)
    return {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages, "launch_pdl": True}


def run_shape(name: str, s: dict, dev: torch.device, reps: int) -> dict:
    import bench.kernels as kb
    from ttsaot.builder.kernels.decode_attention import decode_attention_reference, launch_decode_attention
    from ttsaot.builder.kernels.skinny_linear import launch_skinny_linear
    from ttsaot.builder.layers.rope import rope_table, rope_table_interleaved

    g = torch.Generator(device=dev).manual_seed(7)
    dt = torch.bfloat16
    D, hq, hkv, hd, S = s["D"], s["hq"], s["hkv"], s["hd"], s["S"]
    n_qkv = (hq + 2 * hkv) * hd
    per_layer = (n_qkv * D + D * hq * hd) * 2
    n_sets = kb._sets_for(per_layer, dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 132
    w_qkv = [torch.randn(n_qkv, D, generator=g, device=dev).to(dt) * 0.03 for _ in range(n_sets)]
    w_o = [torch.randn(D, hq * hd, generator=g, device=dev).to(dt) * 0.03 for _ in range(n_sets)]
    norm = torch.rand(D, generator=g, device=dev).to(dt) + 0.5
    qn = torch.rand(hd, generator=g, device=dev).to(dt) + 0.5
    kn = torch.rand(hd, generator=g, device=dev).to(dt) + 0.5
    table = rope_table_interleaved if s["rope"] == "interleaved" else rope_table
    cos, sin = (t.to(dev).to(dt) for t in table(hd, S, 10000.0)) if s["rope"] != "none" else (None, None)
    kc = torch.randn(n_sets, 1, hkv, S, hd, generator=g, device=dev).to(dt)
    vc = torch.randn(n_sets, 1, hkv, S, hd, generator=g, device=dev).to(dt)
    x0 = torch.randn(1, D, generator=g, device=dev).to(dt)
    pos = torch.full((1,), s.get("pos", S // 2), dtype=torch.long, device=dev)
    ws = torch.zeros(hkv, dtype=torch.int32, device=dev)  # the step's ticket workspace (split form), zero after each
    fixed_o = torch.randn(1, hq * hd, generator=g, device=dev).to(dt)
    cq, co = _config(D, n_qkv, True, sms), _config(hq * hd, D, False, sms)

    def attn_kw(v: dict) -> dict:
        return dict(
            cos=None if v.get("no_rope") else cos,
            sin=None if v.get("no_rope") else sin,
            rope_interleaved=s["rope"] == "interleaved",
            q_norm=None if v.get("no_norm") or not s["qk_norm"] else qn,
            k_norm=None if v.get("no_norm") or not s["qk_norm"] else kn,
            config={"num_warps": v["warps"], "num_stages": v.get("stages", 1), "launch_pdl": True},
            **(
                {"num_splits": v["splits"], "block_s": v["block_s"], "min_chunk": v["min_chunk"]}
                if "splits" in v
                else {}
            ),
            **({"workspace": ws} if v.get("splits", 1) > 1 else {}),
        )

    out: dict[str, Any] = {"shape": s, "weight_sets": n_sets, "qkv_config": cq, "o_config": co, "cases": {}}
    # correctness of each attention variant against the reference, once
    qkv = launch_skinny_linear(x0, w_qkv[0], norm_weight=norm, config=cq)
    split = S > 64  # the LM shapes: the split form
    if split:
        variants = [
            {"warps": w, "stages": st, "splits": n, "block_s": bs, "min_chunk": mc}
            for n, bs, mc in SPLIT_PLANS
            for w, st in SPLIT_CONFIGS
        ]
    else:
        variants = [{"warps": w} for w in WARPS]
        variants += [{"warps": 4, "no_norm": True}] if s["qk_norm"] else []
        variants += [{"warps": 4, "no_rope": True}, {"warps": 1, "no_rope": True, "no_norm": True}]
    for v in variants:
        key = f"w{v['warps']}" + ("/no_norm" if v.get("no_norm") else "") + ("/no_rope" if v.get("no_rope") else "")
        if split:
            key = f"splits{v['splits']}x{v['block_s']}/w{v['warps']}s{v['stages']}"
        kw = attn_kw(v)
        k1, v1, k2, v2 = kc[:1].clone(), vc[:1].clone(), kc[:1].clone(), vc[:1].clone()
        got = launch_decode_attention(qkv, pos, k1, v1, 0, hd**-0.5, **kw)
        ref = decode_attention_reference(
            qkv, pos, k2, v2, 0, hd**-0.5, *[kw[k] for k in ("cos", "sin", "rope_interleaved", "q_norm", "k_norm")]
        )
        case: dict[str, Any] = {"rel_err_vs_reference": kb.rel_err(got.float(), ref.float())}
        if split:
            case["workspace_zero_after"] = not bool(ws.any())

        def layer(i: int, kw=kw) -> None:
            q = launch_skinny_linear(x0, w_qkv[i], norm_weight=norm, config=cq)
            o = launch_decode_attention(q, pos, kc, vc, i, hd**-0.5, **kw)
            launch_skinny_linear(o, w_o[i], residual=x0, config=co)

        rot = [i % n_sets for i in range(CHAIN if dev.type == "cuda" else 1)]
        case["layer_us"] = kb.graph_ms([lambda i=i: layer(i) for i in rot], reps, dev) * 1e3
        alone = [lambda i=i, kw=kw: launch_decode_attention(qkv, pos, kc, vc, i, hd**-0.5, **kw) for i in rot]
        case["alone_us"] = kb.graph_ms(alone, reps, dev) * 1e3
        out["cases"][key] = case
        print(name, key, {k: round(x, 3) if isinstance(x, float) else x for k, x in case.items()}, flush=True)

    if not split:  # (qkv_attention fuses the whole-cache form only)
        out["fused"] = _fused(name, s, dev, reps, w_qkv, w_o, norm, pos, kc, vc, x0, cq, co, attn_kw, n_sets)

    def no_attention(i: int) -> None:
        launch_skinny_linear(x0, w_qkv[i], norm_weight=norm, config=cq)
        launch_skinny_linear(fixed_o, w_o[i], residual=x0, config=co)

    rot = [i % n_sets for i in range(CHAIN if dev.type == "cuda" else 1)]
    out["no_attention_us"] = kb.graph_ms([lambda i=i: no_attention(i) for i in rot], reps, dev) * 1e3
    qkv_alone = [lambda i=i: launch_skinny_linear(x0, w_qkv[i], norm_weight=norm, config=cq) for i in rot]
    out["qkv_alone_us"] = kb.graph_ms(qkv_alone, reps, dev) * 1e3
    for case in out["cases"].values():
        case["marginal_us"] = case["layer_us"] - out["no_attention_us"]
    print(name, "no attention", round(out["no_attention_us"], 3), "qkv", round(out["qkv_alone_us"], 3), flush=True)
    return out


def _fused(name, s, dev, reps, w_qkv, w_o, norm, pos, kc, vc, x0, cq, co, attn_kw, n_sets) -> dict:
    """The fused projection + attention (ttsaot::qkv_attention) at the same projection config, then o."""
    import bench.kernels as kb
    from ttsaot.builder.kernels.decode_attention import launch_decode_attention
    from ttsaot.builder.kernels.qkv_attention import launch_qkv_attention
    from ttsaot.builder.kernels.skinny_linear import launch_skinny_linear

    hd, hkv = s["hd"], s["hkv"]

    kw = attn_kw({"warps": 4})
    fused_kw = {k: kw[k] for k in ("cos", "sin", "rope_interleaved", "q_norm", "k_norm")}
    ws = torch.zeros(hkv, dtype=torch.int32, device=dev)
    k1, v1, k2, v2 = kc[:1].clone(), vc[:1].clone(), kc[:1].clone(), vc[:1].clone()
    got = launch_qkv_attention(
        x0, w_qkv[0], None, norm, 1e-6, pos, k1, v1, 0, hd**-0.5, **fused_kw, workspace=ws, config=cq
    )
    two = launch_decode_attention(
        launch_skinny_linear(x0, w_qkv[0], norm_weight=norm, config=cq), pos, k2, v2, 0, hd**-0.5, **kw
    )

    def fused_layer(i: int) -> None:
        o = launch_qkv_attention(
            x0, w_qkv[i], None, norm, 1e-6, pos, kc, vc, i, hd**-0.5, **fused_kw, workspace=ws, config=cq
        )
        launch_skinny_linear(o, w_o[i], residual=x0, config=co)

    fused_rot = [i % n_sets for i in range(CHAIN if dev.type == "cuda" else 1)]
    fused = {
        "equal_to_two_kernels": bool(torch.equal(got, two)),
        "workspace_zero_after": not bool(ws.any()),
        "layer_us": kb.graph_ms([lambda i=i: fused_layer(i) for i in fused_rot], reps, dev) * 1e3,
    }
    print(name, "fused", fused, flush=True)
    return fused


def main(argv: list[str]) -> int:
    from bench.common import device_info

    dev = torch.device(argv[1] if len(argv) > 1 else "cuda")  # cpu: a smoke run under TRITON_INTERPRET=1
    torch.set_grad_enabled(False)
    res: dict = {"device": device_info(dev), "shapes": {}}
    for name, s in SHAPES.items():
        if len(argv) > 2 and name not in argv[2:]:
            continue
        try:
            res["shapes"][name] = run_shape(name, s, dev, reps=50 if dev.type == "cuda" else 1)
        except Exception as e:  # noqa: BLE001 - recorded, the next shape still runs
            res["shapes"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(name, res["shapes"][name], flush=True)
        json.dump(res, open(argv[0], "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
