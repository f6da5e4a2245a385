"""`ttsaot::decode_layer`: the persistent one-launch layer (interpreter on CPU, phase by phase; compiled on a GPU,
one launch with grid barriers) against the five ops it fuses (up to the order of fp32 sums: its phases sum each
weight slice chunk by chunk) and the aten reference; the slice plan; the cache written in place and nowhere else,
the workspace left zeroed, one node under torch.export and the CPU lowering; `gpu` tests: real predictor shapes,
the persistent launch replayed in a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from ttsaot.builder.kernels import lower_for_cpu
from ttsaot.builder.kernels.decode_attention import attention_workspace, launch_decode_attention
from ttsaot.builder.kernels.decode_layer import (
    decode_layer,
    decode_layer_reference,
    launch_decode_layer,
    slice_plan,
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


# Interpreter slices: 3 programs, chunks of ≤ 128 weight elements (16 columns of K = 48 / 40 / 64: several chunks
# per phase, the last part-masked), and one chunk per phase (WHOLE).
SMALL = {"TILE": 128, "num_warps": 4}
WHOLE = {"TILE": 1 << 14, "num_warps": 4}
GEMV = {"BLOCK_N": 8, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1}


def _five_ops(t):
    """The five kernel-layer ops (decode_modules.py's step, launched directly; on CPU with interpreter tiles)."""
    lin = {} if ON_GPU else {"config": GEMV, "split_k": 1}
    qkv = launch_skinny_linear(t["x"], t["qkv_weight"], t["qkv_bias"], t["input_norm"], t["norm_eps"], **lin)
    o = launch_decode_attention(
        qkv, t["positions"], t["k_cache"], t["v_cache"], t["layer"], t["scale"], t["cos"], t["sin"],
        t["rope_interleaved"], t["q_norm"], t["k_norm"], t["qk_eps"], num_splits=1, block_s=16,
        config=None if ON_GPU else {"num_warps": 4},
    )  # fmt: skip
    x1 = launch_skinny_linear(o, t["o_weight"], t["o_bias"], residual=t["x"], residual_scale=t["residual_scale"], **lin)
    h = launch_skinny_linear(x1, t["gate_up_weight"], t["gate_up_bias"], t["post_norm"], t["norm_eps"], gated=True,
                             **lin)  # fmt: skip
    return launch_skinny_linear(h, t["down_weight"], t["down_bias"], residual=x1, residual_scale=t["residual_scale"],
                                **lin)  # fmt: skip


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
    tol = 1e-5 if dtype == torch.float32 else (2e-2 if ON_GPU else 4e-2)  # CPU interpreter: truncating casts
    for got, want in ((y, y5), (y, y_ref), (t["k_cache"], five["k_cache"]), (t["v_cache"], five["v_cache"])):
        assert rel_err(got.cpu().float(), want.cpu().float()) < tol
    written = torch.zeros(kc0.shape[:4], dtype=torch.bool)
    written[L - 1, torch.arange(B), :, t["positions"].cpu()] = True
    assert torch.equal(t["k_cache"].cpu()[~written], kc0.cpu()[~written]), "wrote outside this step's slots"
    assert not t["workspace"].any()


@pytest.mark.parametrize("case", CASES, ids=["qwen-b1", "fish-b2-bias", "mha-norope-b2"])
def test_chunked_slices_equal_whole_slices(case):
    """A slice held as several register chunks sums what one chunk sums (fp32: up to the order of the sums), and the
    gate/up chunk requested early changes nothing."""
    B, D, hq, hkv, hd, inter, S, L, rope, qk_norm, bias = case
    t = _layer(B, D, hq, hkv, hd, inter, S, L, torch.float32, rope, qk_norm, bias)
    whole = _clone(t)
    y = launch_decode_layer(*t.values(), programs=3, config=None if ON_GPU else SMALL)
    y_whole = launch_decode_layer(*whole.values(), programs=3, config={**WHOLE, "EARLY": True})
    assert rel_err(y, y_whole) < 1e-5 and rel_err(t["k_cache"], whole["k_cache"]) < 1e-5


@pytest.mark.parametrize(
    "n, k, programs, tile", [(4096, 1024, 132, 1 << 15), (1024, 3072, 132, 1 << 15), (3072, 1024, 132, 1 << 14),
                             (6144, 2560, 132, 1 << 15), (128, 48, 3, 128), (7, 5, 4, 64)]
)  # fmt: skip
def test_slice_plan_covers_every_row_and_column(n, k, programs, tile):
    rows, kc, chunks = slice_plan(n, k, programs, tile)
    assert rows & (rows - 1) == 0 and kc & (kc - 1) == 0 and kc >= min(16, k)
    assert -(-n // rows) <= programs and rows * programs >= n  # every row in some program's slice
    assert chunks * kc >= k > (chunks - 1) * kc  # every column in exactly one chunk, no empty chunk
    assert rows * kc <= tile or kc == 16 or kc >= k  # the chunk budget, unless K or the floor of 16 decides


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
    """One launch with grid barriers, equal to the five ops up to bf16 rounding of differently ordered fp32 sums and
    to the reference; replayed in a CUDA graph 20 times over different positions (the workspace must come back
    zeroed every time, or the next replay would hang)."""
    _, B, D, hq, hkv, hd, inter, S, rope, qk_norm = case
    t = _layer(B, D, hq, hkv, hd, inter, S, 5, torch.bfloat16, rope, qk_norm, False)
    five, ref = _clone(t), _clone(t)
    y = launch_decode_layer(*t.values())
    assert rel_err(y.float(), _five_ops(five).float()) < 1e-2
    assert rel_err(y.float(), decode_layer_reference(*ref.values()).float()) < 2e-2
    assert rel_err(t["k_cache"].float(), five["k_cache"].float()) < 1e-2 and not t["workspace"].any()
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
