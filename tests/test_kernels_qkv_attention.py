"""`ttsaot::qkv_attention`: the fused qkv projection + whole-cache attention kernel (interpreter on CPU, compiled on
a GPU) against the two ops it fuses: the SAME bits as skinny_linear's kernel then decode_attention's at the same
projection config (the qkv row is rounded and re-read exactly as between the two launches), the cache written at
each row's position and nowhere else, the arrival counters returned zeroed, every kv head's attention run by the
last of its programs whatever BLOCK_N (1-16 columns per program), one and two rows, the GQA ratios, RoPE forms, q/k
norm, bias; the op's checks; one node under torch.export, lowered to aten for CPU builds; the step module's
routing (`fits`, the switch). `gpu`: the predictors' real shapes through the op as AOTI bakes it."""

from __future__ import annotations

import pytest
import torch

from ttsaot.builder.kernels import lower_for_cpu
from ttsaot.builder.kernels.decode_attention import decode_attention_reference, launch_decode_attention
from ttsaot.builder.kernels.qkv_attention import (
    ENV_SWITCH,
    enabled,
    fits,
    launch_qkv_attention,
    qkv_attention,
    qkv_attention_reference,
)
from ttsaot.builder.kernels.skinny_linear import launch_skinny_linear, skinny_linear_reference
from ttsaot.builder.layers.rope import rope_table, rope_table_interleaved

from .conftest import rel_err
from .kernel_fixtures import DEVICE, ON_GPU, require_kernel_runtime

QKV_ATTN = torch.ops.ttsaot.qkv_attention.default


@pytest.fixture(autouse=True)
def _kernel_runtime():
    require_kernel_runtime()


def _case(B, D, hq, hkv, hd, S, L, dtype, rope, qk_norm, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = (hq + 2 * hkv) * hd
    pos = torch.randint(0, S, (B,), generator=g)
    pos[0] = S - 1 if seed % 2 else 0  # the scratch slot / the first position
    t = {
        "x": torch.randn(B, D, generator=g).to(dtype),
        "weight": (torch.randn(n, D, generator=g) * D**-0.5).to(dtype),
        "bias": (torch.randn(n, generator=g) * 0.1).to(dtype) if bias else None,
        "norm_weight": (torch.rand(D, generator=g) + 0.5).to(dtype),
        "positions": pos,
        "k_cache": torch.randn(L, B, hkv, S, hd, generator=g).to(dtype),
        "v_cache": torch.randn(L, B, hkv, S, hd, generator=g).to(dtype),
        "cos": None,
        "sin": None,
        "q_norm": None,
        "k_norm": None,
    }
    if rope == "neox":
        t["cos"], t["sin"] = rope_table(hd, S + 3, 10000.0)
    elif rope == "interleaved":
        t["cos"], t["sin"] = rope_table_interleaved(hd, S, 1e6, round_to=torch.bfloat16)
    if qk_norm:
        t["q_norm"] = (torch.rand(hd, generator=g) + 0.5).to(dtype)
        t["k_norm"] = (torch.rand(hd, generator=g) + 0.5).to(dtype)
    return {k: v.to(DEVICE) if v is not None else None for k, v in t.items()}


def _attention_args(t: dict) -> dict:
    return {k: t[k] for k in ("positions", "k_cache", "v_cache", "cos", "sin", "q_norm", "k_norm")}


# (B, D, Hq, Hkv, hd, S, L, config): GQA 2 over 1 row with 8-column programs (4 per head of 16: 8 per kv head with
# its q heads), MHA over 2 rows with 16-column programs, GQA 4 with 2-column programs over a 64-wide head (192 per kv
# head, the one kv head), a PRELOAD config (the whole K range one tile), and GQA 4 over two kv heads (12 programs
# each). The interpreter runs a program at a time (~35 ms each here): the 2-column case had two kv heads (384
# programs, 27 of the test's 31 s per form); its kv head keeps its 192 arrivals, and GQA 4's head mapping over
# two kv heads is the last case's.
CASES = [
    (1, 48, 4, 2, 16, 10, 2, {"BLOCK_N": 8, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1}),
    (2, 40, 2, 2, 16, 7, 3, {"BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 2, "num_stages": 1}),
    (1, 32, 4, 1, 64, 17, 1, {"BLOCK_N": 2, "BLOCK_K": 32, "num_warps": 1, "num_stages": 1}),
    (1, 64, 4, 2, 16, 16, 2, {"BLOCK_N": 8, "BLOCK_K": 64, "num_warps": 4, "num_stages": 1, "PRELOAD": True}),
    (2, 24, 8, 2, 16, 9, 2, {"BLOCK_N": 8, "BLOCK_K": 16, "num_warps": 2, "num_stages": 1}),
]
# (rope, q/k norm, bias, dtype): every form in bf16, the fp32 path (exact fp32 dots) with the most steps
VARIANTS = [
    ("neox", True, False, torch.bfloat16),
    ("interleaved", False, True, torch.bfloat16),
    (None, False, False, torch.bfloat16),
    ("neox", True, True, torch.float32),
]


@pytest.mark.parametrize(
    "rope,qk_norm,bias,dtype", VARIANTS, ids=["neox-qknorm", "interleaved-bias", "plain", "neox-qknorm-bias-fp32"]
)
def test_fused_kernel_equals_the_two_kernels_bit_for_bit(rope, qk_norm, bias, dtype):
    for i, (B, D, hq, hkv, hd, S, L, config) in enumerate(CASES):
        t = _case(B, D, hq, hkv, hd, S, L, dtype, rope, qk_norm, bias, seed=i)
        two = {k: t[k].clone() for k in ("k_cache", "v_cache")}
        ref = {k: v.clone() for k, v in two.items()}
        kc0 = t["k_cache"].clone()
        args = dict(layer=L - 1, scale=hd**-0.5, rope_interleaved=rope == "interleaved", qk_eps=1e-6)
        ws = torch.zeros(B * hkv + 1, dtype=torch.int32, device=DEVICE)
        proj = (t["x"], t["weight"], t["bias"], t["norm_weight"], 1e-5)
        o = launch_qkv_attention(*proj, **_attention_args(t), **args, workspace=ws, config=config)
        assert not ws.any(), "counters not returned zeroed"

        # the two ops' kernels at the same projection config
        qkv = launch_skinny_linear(*proj, config={"PRELOAD": False, **config})
        two_args = {**_attention_args(t), **two}
        o_two = launch_decode_attention(
            qkv, **two_args, layer=L - 1, scale=hd**-0.5, rope_interleaved=rope == "interleaved", norm_eps=1e-6,
            config={"num_warps": 4},
        )  # fmt: skip
        assert torch.equal(o, o_two), (i, B, hq, hkv)
        assert torch.equal(t["k_cache"], two["k_cache"]) and torch.equal(t["v_cache"], two["v_cache"])

        o_ref = qkv_attention_reference(*proj, **{**_attention_args(t), **ref}, **args)
        tol = 1e-5 if dtype == torch.float32 else 3e-2
        assert rel_err(o.cpu().float(), o_ref.cpu().float()) < tol
        written = torch.zeros(L, B, hkv, S, dtype=torch.bool)
        written[L - 1, torch.arange(B), :, t["positions"].cpu()] = True
        assert torch.equal(t["k_cache"].cpu()[~written], kc0.cpu()[~written]), "wrote outside this step's slots"


def test_reference_is_the_two_references():
    t = _case(2, 32, 4, 2, 16, 9, 2, torch.float32, "neox", True, True)
    a = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in _attention_args(t).items()}
    b = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in _attention_args(t).items()}
    proj = (t["x"], t["weight"], t["bias"], t["norm_weight"], 1e-5)
    o = qkv_attention_reference(*proj, **a, layer=1, scale=0.25, qk_eps=1e-6)
    qkv = skinny_linear_reference(*proj)
    assert torch.equal(o, decode_attention_reference(qkv, **b, layer=1, scale=0.25, norm_eps=1e-6))
    assert torch.equal(a["k_cache"], b["k_cache"])


def test_op_errors_are_clear():
    t = _case(1, 32, 4, 2, 16, 9, 2, torch.float32, "neox", True, False)
    proj = (t["x"], t["weight"], None, t["norm_weight"], 1e-5)
    att = _attention_args(t)
    with pytest.raises(RuntimeError, match="qkv_attention: x must be"):
        qkv_attention(t["x"][0], *proj[1:], **att, layer=0, scale=0.25)
    with pytest.raises(RuntimeError, match="qkv_attention: x .* does not end in K"):
        qkv_attention(t["x"][:, :16], *proj[1:], **att, layer=0, scale=0.25)
    with pytest.raises(RuntimeError, match="qkv_attention: layer 2 outside"):
        qkv_attention(*proj, **att, layer=2, scale=0.25)
    with pytest.raises(RuntimeError, match="qkv_attention: qkv rows must be"):
        qkv_attention(*(t["x"], t["weight"][:-8], None, t["norm_weight"], 1e-5), **att, layer=0, scale=0.25)
    with pytest.raises(RuntimeError, match="qkv_attention: q/k norm weights"):
        qkv_attention(*proj, **{**att, "q_norm": att["q_norm"][:8]}, layer=0, scale=0.25)


def test_export_one_node_lowered_for_cpu_to_the_reference():
    class Step(torch.nn.Module):
        def __init__(self, t):
            super().__init__()
            self.t = t

        def forward(self, x, positions, k_cache, v_cache):
            t = self.t
            o = qkv_attention(
                x, t["weight"], t["bias"], t["norm_weight"], 1e-5, positions, k_cache, v_cache, 1, 0.25,
                t["cos"], t["sin"], False, t["q_norm"], t["k_norm"], 1e-6,
            )  # fmt: skip
            return o * 2

    t = _case(1, 32, 4, 2, 16, 9, 2, torch.float32, "neox", True, True)
    t = {k: v.cpu() if v is not None else None for k, v in t.items()}
    inputs = (t["x"], t["positions"], t["k_cache"].clone(), t["v_cache"].clone())
    ep = torch.export.export(Step(t), inputs)
    fused = [n for n in ep.graph.nodes if "qkv_attention" in str(n.target)]
    assert len(fused) == 1, ep.graph
    lowered = lower_for_cpu(ep)
    assert not any("ttsaot" in str(n.target) for n in lowered.graph.nodes)
    kc, vc = t["k_cache"].clone(), t["v_cache"].clone()
    got = lowered.module()(t["x"], t["positions"], kc, vc)
    kr, vr = t["k_cache"].clone(), t["v_cache"].clone()
    want = qkv_attention_reference(
        t["x"], t["weight"], t["bias"], t["norm_weight"], 1e-5, t["positions"], kr, vr, 1, 0.25, t["cos"], t["sin"],
        False, t["q_norm"], t["k_norm"], 1e-6,
    ) * 2  # fmt: skip
    assert torch.equal(got, want) and torch.equal(kc, kr) and torch.equal(vc, vr)


def test_fits_and_the_switch(monkeypatch):
    x1, x4 = torch.zeros(1, 8), torch.zeros(4, 8)
    short, long = torch.zeros(2, 1, 2, 17, 16), torch.zeros(2, 1, 2, 65, 16)
    assert fits(x1, short) and not fits(x1, long) and not fits(x4, short)
    monkeypatch.delenv(ENV_SWITCH, raising=False)
    assert not enabled()
    monkeypatch.setenv(ENV_SWITCH, "1")
    assert enabled()


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["qwen_code_predictor", "fish_fast_ar"])
@pytest.mark.parametrize("B", [1, 2])
def test_gpu_predictor_shapes_through_the_op(name, B):
    D, hq, hkv, hd, S, rope, qk_norm = {
        "qwen_code_predictor": (1024, 16, 8, 128, 16, "neox", True),
        "fish_fast_ar": (2560, 32, 8, 128, 10, "interleaved", False),
    }[name]
    t = _case(B, D, hq, hkv, hd, S, 2, torch.bfloat16, rope, qk_norm, False)
    for key in ("cos", "sin"):
        t[key] = t[key].to(torch.bfloat16)
    ref = {k: t[k].clone() for k in ("k_cache", "v_cache")}
    proj = (t["x"], t["weight"], t["bias"], t["norm_weight"], 1e-6)
    ws = torch.zeros(B * hkv, dtype=torch.int32, device=DEVICE)
    args = dict(layer=1, scale=hd**-0.5, rope_interleaved=rope == "interleaved", qk_eps=1e-6)
    o = QKV_ATTN(*proj, t["positions"], t["k_cache"], t["v_cache"], args["layer"], args["scale"], t["cos"], t["sin"],
                 args["rope_interleaved"], t["q_norm"], t["k_norm"], 1e-6, ws)  # fmt: skip
    want = qkv_attention_reference(*proj, **{**_attention_args(t), **ref}, **args)
    assert rel_err(o.float(), want.float()) < 1e-2 and not ws.any()
    assert rel_err(t["k_cache"].float(), ref["k_cache"].float()) < 1e-2


class _FusedStep(torch.nn.Module):
    """Two layers as a predictor step traces them with the switch: the fused op, then o_proj + residual."""

    def __init__(self, D=256, hq=4, hkv=2, hd=64, S=16):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        n = (hq + 2 * hkv) * hd
        self.norm = torch.nn.Parameter(torch.rand(2, D, generator=g) + 0.5)
        self.wqkv = torch.nn.Parameter(torch.randn(2, n, D, generator=g) / D**0.5)
        self.wo = torch.nn.Parameter(torch.randn(2, D, hq * hd, generator=g) / (hq * hd) ** 0.5)
        self.qn = torch.nn.Parameter(torch.rand(2, hd, generator=g) + 0.5)
        cos, sin = rope_table(hd, S, 10000.0)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.scale = hd**-0.5

    def forward(self, x, positions, k_cache, v_cache, workspace):
        from ttsaot.builder.kernels.skinny_linear import skinny_linear

        for i in range(2):
            o = qkv_attention(
                x, self.wqkv[i], None, self.norm[i], 1e-5, positions, k_cache, v_cache, i, self.scale, self.cos,
                self.sin, False, self.qn[i], self.qn[i], 1e-6, workspace,
            )  # fmt: skip
            x = skinny_linear(o, self.wo[i], residual=x)
        return x


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
def test_gpu_aoti_package_of_a_fused_step(tmp_path):
    """AOTInductor compiles the fused op (its pruned configs, the cache and counter mutations) into a package that
    computes the step's eager function and writes the caller's caches, leaving the counters zeroed."""
    from torch._inductor import aoti_compile_and_package, aoti_load_package

    def inputs():
        g = torch.Generator().manual_seed(4)
        return (
            torch.randn(1, 256, generator=g).cuda(),
            torch.tensor([9]).cuda(),
            torch.randn(2, 1, 2, 16, 64, generator=g).cuda(),
            torch.randn(2, 1, 2, 16, 64, generator=g).cuda(),
            torch.zeros(2, dtype=torch.int32).cuda(),
        )

    m = _FusedStep().cuda()
    with torch.no_grad():
        ep = torch.export.export(m, inputs(), strict=False)
        assert sum(n.target == QKV_ATTN for n in ep.graph.nodes) == 2
        path = aoti_compile_and_package(ep, package_path=str(tmp_path / "fused.pt2"))
    runner = aoti_load_package(path, run_single_threaded=True)
    got_args, want_args = inputs(), inputs()
    with torch.no_grad():
        got = runner(*got_args)
        want = m(*want_args)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_args[2], want_args[2], rtol=1e-4, atol=1e-4)
    assert not got_args[4].any() and not want_args[4].any()
