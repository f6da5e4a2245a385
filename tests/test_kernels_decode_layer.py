"""`ttsaot::decode_layer`: the persistent one-launch layer (interpreter on CPU, phase by phase; compiled on a GPU,
one launch with grid barriers) against the five ops it fuses (bit for bit: each phase calls their device
functions with the same tiles) and the aten reference; the cache written in place and nowhere else, the workspace
left zeroed, one node under torch.export and the CPU lowering; `gpu` tests: real predictor shapes, the persistent
launch replayed in a CUDA graph, and an AOTI package."""

from __future__ import annotations

import pytest
import torch

from ttsaot.builder.kernels import lower_for_cpu
from ttsaot.builder.kernels.decode_attention import attention_workspace, launch_decode_attention
from ttsaot.builder.kernels.decode_layer import (
    decode_layer,
    decode_layer_reference,
    kernel_config,
    launch_decode_layer,
    supports,
)
from ttsaot.builder.kernels.skinny_linear import launch_skinny_linear
from ttsaot.builder.layers.rope import rope_table, rope_table_interleaved

from .conftest import rel_err
from .kernel_fixtures import DEVICE, ON_GPU, require_kernel_runtime


@pytest.fixture(autouse=True)
def _kernel_runtime():
    require_kernel_runtime()


def _layer(B, D, hq, hkv, hd, inter, S, L, dtype, rope, qk_norm, bias, seed=0):
    """Arguments of one decode_layer call (positional order of the schema, as a dict)."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape, scale=None):
        return (torch.randn(*shape, generator=g) * (scale or shape[-1] ** -0.5)).to(dtype)

    pos = torch.randint(1, S - 1, (B,), generator=g)
    pos[0] = 0 if B > 1 else S - 1  # the first position, and the last slot
    if B > 1:
        pos[-1] = S - 1
    nqkv = (hq + 2 * hkv) * hd
    t = {
        "x": torch.randn(B, D, generator=g).to(dtype),
        "positions": pos,
        "k_cache": torch.randn(L, B, hkv, S, hd, generator=g).to(dtype),
        "v_cache": torch.randn(L, B, hkv, S, hd, generator=g).to(dtype),
        "layer": L - 1,
        "workspace": torch.zeros(3, dtype=torch.int32),
        "input_norm": (torch.rand(D, generator=g) + 0.5).to(dtype),
        "qkv_weight": w(nqkv, D),
        "o_weight": w(D, hq * hd),
        "post_norm": (torch.rand(D, generator=g) + 0.5).to(dtype),
        "gate_up_weight": w(2 * inter, D),
        "down_weight": w(D, inter),
        "qkv_bias": w(nqkv, scale=0.1) if bias else None,
        "o_bias": w(D, scale=0.1) if bias else None,
        "gate_up_bias": w(2 * inter, scale=0.1) if bias else None,
        "down_bias": w(D, scale=0.1) if bias else None,
        "q_norm": (torch.rand(hd, generator=g) + 0.5).to(dtype) if qk_norm else None,
        "k_norm": (torch.rand(hd, generator=g) + 0.5).to(dtype) if qk_norm else None,
        "cos": None,
        "sin": None,
        "rope_interleaved": rope == "interleaved",
        "scale": hd**-0.5,
        "norm_eps": 1e-6,
        "qk_eps": 1e-5,
        "residual_scale": 0.75 if bias else 1.0,
    }
    if rope == "neox":
        t["cos"], t["sin"] = (r.to(dtype) for r in rope_table(hd, S + 3, 10000.0))  # compute-dtype tables
    elif rope == "interleaved":
        t["cos"], t["sin"] = rope_table_interleaved(hd, S, 1e6, round_to=dtype)
    return {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in t.items()}


def _clone(t):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in t.items()}


# Interpreter tiles: BLOCK_N 8 and BLOCK_K 32 over K = 48 / 40 / 96 (part-masked last steps), 3 programs (several
# column tiles and (row, kv head) pairs each).
SMALL = {"BLOCK_N": 8, "BK_D": 32, "BK_O": 32, "BK_GU": 32, "BK_DOWN": 32, "num_warps": 4}


def _five_ops(t):
    """The five kernel-layer ops with the same tiles (decode_modules.py's step, launched directly)."""
    c = (
        SMALL
        if not ON_GPU
        else kernel_config(t["x"].shape[1], t["o_weight"].shape[1], t["down_weight"].shape[1], t["x"].shape[0])
    )
    lin = dict(config={"BLOCK_N": c["BLOCK_N"], "num_warps": c["num_warps"], "num_stages": 1}, split_k=1)

    def cfg(bk):
        return {**lin, "config": {**lin["config"], "BLOCK_K": bk}}

    qkv = launch_skinny_linear(t["x"], t["qkv_weight"], t["qkv_bias"], t["input_norm"], t["norm_eps"], **cfg(c["BK_D"]))
    o = launch_decode_attention(
        qkv, t["positions"], t["k_cache"], t["v_cache"], t["layer"], t["scale"], t["cos"], t["sin"],
        t["rope_interleaved"], t["q_norm"], t["k_norm"], t["qk_eps"], num_splits=1, block_s=16,
        config={"num_warps": c["num_warps"]},
    )  # fmt: skip
    x1 = launch_skinny_linear(
        o, t["o_weight"], t["o_bias"], residual=t["x"], residual_scale=t["residual_scale"], **cfg(c["BK_O"])
    )
    h = launch_skinny_linear(
        x1, t["gate_up_weight"], t["gate_up_bias"], t["post_norm"], t["norm_eps"], gated=True, **cfg(c["BK_GU"])
    )
    return launch_skinny_linear(
        h, t["down_weight"], t["down_bias"], residual=x1, residual_scale=t["residual_scale"], **cfg(c["BK_DOWN"])
    )


# (B, D, Hq, Hkv, hd, I, S, L, rope, q/k norm, biases)
CASES = [
    (1, 48, 4, 2, 16, 40, 9, 2, "neox", True, False),  # Qwen code_predictor's form (q/k norm, NeoX)
    (2, 48, 2, 1, 32, 96, 7, 1, "interleaved", False, True),  # Fish fast_ar's form (interleaved), biases, scale
    (2, 40, 4, 4, 16, 40, 5, 2, None, False, False),  # MHA, no RoPE
]


@pytest.mark.parametrize("case", CASES, ids=["qwen-b1", "fish-b2-bias", "mha-norope-b2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_layer_equals_its_five_ops_and_the_reference(case, dtype):
    B, D, hq, hkv, hd, inter, S, L, rope, qk_norm, bias = case
    t = _layer(B, D, hq, hkv, hd, inter, S, L, dtype, rope, qk_norm, bias)
    five, ref = _clone(t), _clone(t)
    kc0 = t["k_cache"].clone()
    y = launch_decode_layer(*t.values(), programs=3, config=None if ON_GPU else SMALL)
    y5 = _five_ops(five)
    y_ref = decode_layer_reference(*ref.values())
    assert y.shape == (B, D) and y.dtype == dtype
    assert torch.equal(y, y5), "the fused layer differs from its five ops"
    assert torch.equal(t["k_cache"], five["k_cache"]) and torch.equal(t["v_cache"], five["v_cache"])
    tol = 1e-5 if dtype == torch.float32 else (2e-2 if ON_GPU else 4e-2)  # CPU interpreter: truncating casts
    assert rel_err(y.cpu().float(), y_ref.cpu().float()) < tol
    written = torch.zeros(kc0.shape[:4], dtype=torch.bool)
    written[L - 1, torch.arange(B), :, t["positions"].cpu()] = True
    assert torch.equal(t["k_cache"].cpu()[~written], kc0.cpu()[~written]), "wrote outside this step's slots"
    assert not t["workspace"].any()


@pytest.mark.parametrize("case", CASES[:2], ids=["qwen-b1", "fish-b2-bias"])
def test_tile_form_matches_the_reference(case):
    """USE_DOT: the column phases on skinny_linear's tensor-core tile form (16 padded rows)."""
    B, D, hq, hkv, hd, inter, S, L, rope, qk_norm, bias = case
    t = _layer(B, D, hq, hkv, hd, inter, S, L, torch.float32, rope, qk_norm, bias)
    ref = _clone(t)
    cfg = None if ON_GPU else {**SMALL, "BLOCK_N": 16}
    y = launch_decode_layer(*t.values(), programs=3, config={**(cfg or {}), "USE_DOT": True})
    assert rel_err(y, decode_layer_reference(*ref.values())) < 1e-5
    assert rel_err(t["k_cache"], ref["k_cache"]) < 1e-5 and not t["workspace"].any()


def test_supports_rows_and_short_caches_only():
    x1, x3 = torch.zeros(2, 8), torch.zeros(3, 8)
    short, long = torch.zeros(1, 2, 1, 32, 16), torch.zeros(1, 2, 1, 4096, 16)
    assert supports(x1, short) and not supports(x3, short) and not supports(x1, long)


def test_shape_errors_are_clear():
    t = _layer(1, 48, 4, 2, 16, 40, 9, 2, torch.float32, "neox", True, False)
    bad = {**t, "o_weight": t["o_weight"][:, :-1].contiguous()}
    with pytest.raises(RuntimeError, match="o_weight must be"):
        decode_layer(*bad.values())
    bad = {**t, "workspace": torch.zeros(1, dtype=torch.int32, device=DEVICE)}
    with pytest.raises(RuntimeError, match="workspace must be"):
        decode_layer(*bad.values())


class _Step(torch.nn.Module):
    """Two layers of one step over the cache inputs, the rest of the arguments fixed."""

    def __init__(self, t):
        super().__init__()
        self.t = t

    def forward(self, x, positions, k_cache, v_cache):
        ws = attention_workspace(x, k_cache)
        args = {**self.t, "x": x, "positions": positions, "k_cache": k_cache, "v_cache": v_cache, "workspace": ws}
        h = decode_layer(*args.values())
        return decode_layer(*{**args, "x": h, "layer": 0}.values())


def test_export_one_node_per_layer_and_cpu_lowering_matches():
    t = _layer(1, 48, 4, 2, 16, 40, 9, 2, torch.float32, "neox", True, False)
    t = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in t.items()}
    step = _Step(t)  # (dict order = the schema's; forward replaces the step's inputs)
    inputs = (t["x"], t["positions"], t["k_cache"].clone(), t["v_cache"].clone())
    ep = torch.export.export(step, inputs)
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert sum("decode_layer" in s for s in targets) == 2, targets
    lowered = lower_for_cpu(ep)
    assert not any("ttsaot" in str(n.target) for n in lowered.graph.nodes)
    caches = (t["k_cache"].clone(), t["v_cache"].clone())
    want = step(t["x"], t["positions"], *caches)
    ran = (t["k_cache"].clone(), t["v_cache"].clone())
    got = lowered.module()(t["x"], t["positions"], *ran)
    # (decomposed aten may order fp32 sums differently from the eager ops)
    assert rel_err(got, want) < 1e-5 and rel_err(ran[0], caches[0]) < 1e-5 and rel_err(ran[1], caches[1]) < 1e-5


# Real predictor layer shapes: (B, D, Hq, Hkv, hd, I, S, rope, q/k norm)
REAL = [
    ("qwen_code_predictor", 1, 1024, 16, 8, 128, 3072, 17, "neox", True),
    ("qwen_code_predictor", 2, 1024, 16, 8, 128, 3072, 17, "neox", True),
    ("fish_fast_ar", 1, 2560, 32, 8, 128, 9728, 10, "interleaved", False),
]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", REAL, ids=[f"{c[0]}-b{c[1]}" for c in REAL])
def test_gpu_persistent_launch_real_shapes_in_a_graph(case):
    """One launch with grid barriers, equal to the five ops bit for bit; replayed in a CUDA graph 20 times over
    different positions (the workspace must come back zeroed every time, or the next replay would hang)."""
    _, B, D, hq, hkv, hd, inter, S, rope, qk_norm = case
    t = _layer(B, D, hq, hkv, hd, inter, S, 5, torch.bfloat16, rope, qk_norm, False)
    five = _clone(t)
    y = launch_decode_layer(*t.values())
    assert torch.equal(y, _five_ops(five))
    assert torch.equal(t["k_cache"], five["k_cache"]) and not t["workspace"].any()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = launch_decode_layer(*t.values())
    for p in range(20):
        t["positions"].fill_(p % S)
        graph.replay()
    torch.cuda.synchronize()
    assert not t["workspace"].any() and torch.isfinite(out.float()).all()


def test_strided_rows_are_read_as_rows():
    """A frame's first positions reach the op as x[:, t] of a [B, T, D] tensor (rows strided by T·D)."""
    t = _layer(2, 48, 2, 1, 32, 96, 7, 1, torch.float32, "interleaved", False, True)
    wide = torch.randn(2, 3, 48, device=DEVICE)
    strided = {**t, "x": wide[:, 1]}
    dense = {**_clone(t), "x": wide[:, 1].contiguous()}
    y = launch_decode_layer(*strided.values(), programs=3, config=None if ON_GPU else SMALL)
    assert torch.equal(y, launch_decode_layer(*dense.values(), programs=3, config=None if ON_GPU else SMALL))
