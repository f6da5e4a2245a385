"""`ttsaot::decode_layer`: the persistent one-launch decoder layer (interpreter on CPU, compiled on a GPU) against
its aten reference (= the per-op references composed): GEMV and tensor-core forms, one and several context
splits, GQA, RoPE / q-k norm, positions at 0 and at the scratch slot, residual scale, few programs (items
queued) and many (idle programs), the caches written only at this step's slots, the counters returned to zero,
one node under torch.export and the CPU lowering. The `gpu` tests at the end: VoxCPM2's real layer shapes."""

from __future__ import annotations

import pytest
import torch

from ttsaot.builder.kernels import lower_for_cpu
from ttsaot.builder.kernels.decode_attention import launch_decode_attention
from ttsaot.builder.kernels.decode_layer import (
    decode_layer,
    decode_layer_reference,
    kernel_eligible,
    launch_decode_layer,
    new_counters,
)
from ttsaot.builder.kernels.skinny_linear import launch_skinny_linear
from ttsaot.builder.layers.rope import rope_table, rope_table_interleaved

from .conftest import rel_err
from .kernel_fixtures import DEVICE, ON_GPU, require_kernel_runtime


@pytest.fixture(autouse=True)
def _kernel_runtime():
    require_kernel_runtime()


def _layer(B, D, hq, hkv, hd, inter, S, L, dtype, rope, qk_norm, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)

    def w(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s / shape[-1] ** 0.5).to(dtype)

    pos = torch.randint(0, S, (B,), generator=g)
    pos[0], pos[-1] = 0, S - 1  # first position, and an idle row on the scratch slot
    t = {
        "x": torch.randn(B, D, generator=g).to(dtype),
        "positions": pos,
        "k_cache": torch.randn(L, B, hkv, S, hd, generator=g).to(dtype),
        "v_cache": torch.randn(L, B, hkv, S, hd, generator=g).to(dtype),
        "cos": None,
        "sin": None,
        "ln1": (torch.rand(D, generator=g) + 0.5).to(dtype),
        "w_qkv": w((hq + 2 * hkv) * hd, D, s=4.0),
        "q_norm": None,
        "k_norm": None,
        "w_o": w(D, hq * hd),
        "ln2": (torch.rand(D, generator=g) + 0.5).to(dtype),
        "w_gate_up": w(2 * inter, D, s=2.0),
        "w_down": w(D, inter),
    }
    if rope == "neox":
        t["cos"], t["sin"] = rope_table(hd, S + 3, 10000.0)
    elif rope == "interleaved":
        t["cos"], t["sin"] = rope_table_interleaved(hd, S, 1e6, round_to=torch.bfloat16)
    if qk_norm:
        t["q_norm"] = (torch.rand(hd, generator=g) + 0.5).to(dtype)
        t["k_norm"] = (torch.rand(hd, generator=g) + 0.5).to(dtype)
    t = {k: v.to(DEVICE) if v is not None else None for k, v in t.items()}
    t["counters"] = new_counters(t["x"])
    args = dict(layer=L - 1, norm_eps=1e-6, qk_eps=1e-6, residual_scale=scale, rope_interleaved=rope == "interleaved")
    return t, args


def _per_op_kernels(
    x,
    positions,
    k_cache,
    v_cache,
    counters,
    layer,
    cos,
    sin,
    ln1,
    w_qkv,
    q_norm,
    k_norm,
    w_o,
    ln2,
    w_gate_up,
    w_down,
    norm_eps,
    qk_eps,
    residual_scale,
    rope_interleaved,
):
    """The layer as the per-op kernels run it (five launches): what the one-launch kernel must reproduce, rounding
    for rounding, wherever the kernels run (the interpreter truncates where the GPU rounds to nearest)."""
    lin = {"config": {"BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4, "num_stages": 1}}
    hd = k_cache.shape[4]
    qkv = launch_skinny_linear(x, w_qkv, None, ln1, norm_eps, **lin)
    o = launch_decode_attention(
        qkv,
        positions,
        k_cache,
        v_cache,
        layer,
        hd**-0.5,
        cos,
        sin,
        rope_interleaved,
        q_norm,
        k_norm,
        qk_eps,
        config={"num_warps": 4},
    )
    h = launch_skinny_linear(o, w_o, residual=x, residual_scale=residual_scale, **lin)
    a = launch_skinny_linear(h, w_gate_up, None, ln2, norm_eps, gated=True, **lin)
    return launch_skinny_linear(a, w_down, residual=h, residual_scale=residual_scale, **lin)


def _run_both(t, args, **launch):
    """(kernel output, reference, the reference's caches, the caches before). The reference is the aten
    composition in fp32 and on a GPU; under the interpreter, bf16 is held to the per-op kernels (same casts)."""
    kc0, vc0 = t["k_cache"].clone(), t["v_cache"].clone()
    ref_t = {**t, "k_cache": kc0.clone(), "v_cache": vc0.clone()}
    y = launch_decode_layer(**t, **args, **launch)
    if t["x"].dtype == torch.bfloat16 and not ON_GPU:
        ref = _per_op_kernels(**ref_t, **args)
    else:
        ref = decode_layer_reference(**ref_t, **args)
    return y, ref, ref_t, kc0, vc0


# (B, D, Hq, Hkv, hd, I, S, L, splits, programs): the GEMV form (B = 1, 2) and the tensor-core form (B = 3, 5), one
# split and several (the merge phase; 8-position chunks, so rows near the cache end use every split and rows near 0
# leave some empty), fewer programs than items (queued) and more (idle), GQA 2 / 1 / 4.
CONFIGS = [
    (1, 64, 4, 2, 16, 96, 40, 2, 3, 3),
    (2, 32, 2, 2, 16, 48, 20, 1, 1, 64),
    (3, 64, 8, 2, 16, 80, 33, 2, 4, 5),
    (5, 32, 4, 1, 16, 40, 18, 2, 2, 2),
]
VARIANTS = [("neox", False, 1.0), ("interleaved", True, 0.5), (None, False, 1.4)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rope,qk_norm,scale", VARIANTS, ids=["neox", "interleaved-qknorm-scaled", "norope-scaled"])
def test_kernel_matches_reference(rope, qk_norm, scale, dtype):
    for i, (B, D, hq, hkv, hd, inter, S, L, splits, programs) in enumerate(CONFIGS):
        t, args = _layer(B, D, hq, hkv, hd, inter, S, L, dtype, rope, qk_norm, scale, seed=i)
        cfg = {"BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4, "num_stages": 1}
        split_plan = dict(num_splits=splits, min_chunk=8, block_s=8)
        y, ref, ref_t, kc0, vc0 = _run_both(t, args, config=cfg, programs=programs, **split_plan)
        assert y.shape == (B, D) and y.dtype == dtype
        # summation order only; in bf16 an order change flips an intermediate's last bit now and then (one bf16
        # ulp is 2^-8 relative), which a wrong head, position or phase order would exceed by orders of magnitude
        tol = 1e-5 if dtype == torch.float32 else 1.5e-2
        assert rel_err(y.cpu().float(), ref.cpu().float()) < tol, (i, B, splits, programs)
        written = torch.zeros(L, B, hkv, S, dtype=torch.bool)
        written[L - 1, torch.arange(B), :, t["positions"].cpu()] = True
        for new, old, want in ((t["k_cache"], kc0, ref_t["k_cache"]), (t["v_cache"], vc0, ref_t["v_cache"])):
            assert torch.equal(new.cpu()[~written], old.cpu()[~written]), "wrote outside this step's slots"
            assert rel_err(new.cpu()[written].float(), want.cpu()[written].float()) < tol
        assert not t["counters"].any(), "counters must be returned to zero"


def test_repeated_calls_reuse_the_counters_and_agree():
    """The counters one call leaves are what the next starts from (a step passes one buffer to every layer)."""
    t, args = _layer(3, 32, 4, 2, 16, 40, 24, 1, torch.float32, "neox", False, seed=7)
    cfg = {"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1}
    outs = []
    for programs in (1, 4, 1):
        tt = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
        outs.append(
            launch_decode_layer(**tt, **args, config=cfg, programs=programs, num_splits=3, min_chunk=8, block_s=8)
        )
        assert not t["counters"].any()
    assert torch.equal(outs[0], outs[2])
    assert rel_err(outs[1].cpu(), outs[0].cpu()) < 1e-6


def test_eligibility():
    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    kc = torch.zeros(1, 4, 2, 16, 16, dtype=torch.bfloat16)
    w = torch.zeros(8 * 16, 64, dtype=torch.bfloat16)
    assert kernel_eligible(x, kc, w)
    assert not kernel_eligible(x.float(), kc.float(), w.float())  # fp32: the per-op path
    assert not kernel_eligible(torch.zeros(17, 64, dtype=torch.bfloat16), kc, w)  # > MAX_ROWS


def test_one_node_under_export_and_cpu_lowering():
    class Layer(torch.nn.Module):
        def __init__(self, t):
            super().__init__()
            self.t = t

        def forward(self, x, positions, k_cache, v_cache):
            t = {k: v for k, v in self.t.items() if k not in ("x", "positions", "k_cache", "v_cache", "counters")}
            c = new_counters(x)
            return decode_layer(x, positions, k_cache, v_cache, c, 0, **t, norm_eps=1e-6, qk_eps=1e-6)

    t, _ = _layer(2, 32, 4, 2, 16, 40, 12, 1, torch.float32, "neox", True)
    t = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in t.items()}
    m = Layer(t)
    inputs = (t["x"], t["positions"], t["k_cache"].clone(), t["v_cache"].clone())
    ep = torch.export.export(m, inputs)
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert sum("decode_layer" in s for s in targets) == 1, targets
    low = lower_for_cpu(ep)
    assert not any("ttsaot" in str(n.target) for n in low.graph.nodes if n.op == "call_function")
    kc, vc = t["k_cache"].clone(), t["v_cache"].clone()
    y = low.module()(t["x"], t["positions"], kc, vc)
    ref_kc, ref_vc = t["k_cache"].clone(), t["v_cache"].clone()
    tt = {k: v for k, v in t.items() if k not in ("x", "positions", "k_cache", "v_cache", "counters")}
    ref = decode_layer_reference(
        t["x"], t["positions"], ref_kc, ref_vc, t["counters"], 0, **tt, norm_eps=1e-6, qk_eps=1e-6
    )
    assert rel_err(y, ref) < 1e-6
    assert torch.equal(kc, ref_kc) and torch.equal(vc, ref_vc)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
@pytest.mark.parametrize("B", [1, 2, 5, 16])
def test_gpu_voxcpm2_layer_shapes(B):
    """VoxCPM2's base LM layer (D 2048, 16 heads over 2 kv heads of 128, I 6144) over a 512-slot cache, autotuned
    launch, against the reference on the same GPU (bf16: different summation order only)."""
    t, args = _layer(B, 2048, 16, 2, 128, 6144, 512, 2, torch.bfloat16, "neox", False, scale=0.3, seed=B)
    y, ref, ref_t, kc0, _ = _run_both(t, args)
    assert rel_err(y.float(), ref.float()) < 1e-2
    assert not t["counters"].any()
    assert rel_err(t["k_cache"].float(), ref_t["k_cache"].float()) < 1e-2
