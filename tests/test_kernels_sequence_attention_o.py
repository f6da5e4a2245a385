"""`ttsaot::sequence_attention_o`: a layer's bidirectional attention inside its o_proj (one launch), then o_proj's
residual output and its next RMSNorm from the second pass. Against the two ops' aten references (what the op is by
definition): several sequences in one block-diagonal score tile, padded rows, head ranges split 1-4 ways, bias,
residual scale, RoPE or none, GQA; one node under torch.export, CPU lowering to aten; the trace-time rule on fake
CUDA tensors. The GPU tests at the end (the LocDiT's shape in bf16)."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ttsaot.builder.kernels import CPU_DECOMPOSITIONS, lower_for_cpu
from ttsaot.builder.kernels.sequence_attention import sequence_attention
from ttsaot.builder.kernels.sequence_attention_o import (
    ENV,
    fits,
    launch_sequence_attention_o,
    sequence_attention_o,
    sequence_attention_o_reference,
)
from ttsaot.builder.kernels.skinny_linear import NORM_OUT_ENV, skinny_linear_norm_out
from ttsaot.builder.layers.rope import rope_table

from .conftest import rel_err
from .kernel_fixtures import DEVICE, ON_GPU, require_kernel_runtime

OP = torch.ops.ttsaot.sequence_attention_o.default
DM = importlib.import_module("ttsaot.builder.kernels.decode_modules")


def _case(N, T, D, hq, hkv, hd, dtype, *, bias, rope=True, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    cos, sin = rope_table(hd, T + 3, 10000.0)  # tables longer than T, as the modules' are
    t = {
        "qkv": torch.randn(N, T, (hq + 2 * hkv) * hd, generator=g),
        "weight": torch.randn(D, hq * hd, generator=g) / (hq * hd) ** 0.5,
        "bias": torch.randn(D, generator=g) if bias else None,
        "residual": torch.randn(N, T, D, generator=g),
        "g": torch.rand(D, generator=g) + 0.5,
    }
    t = {k: None if v is None else v.to(dtype).to(device) for k, v in t.items()}
    t["cos"], t["sin"] = (c.to(device) if rope else None for c in (cos, sin))
    return t


def _args(t, hq, hkv, hd, residual_scale=1.0, eps=1e-6):
    return (t["qkv"], t["cos"], t["sin"], hq, hkv, hd**-0.5, t["weight"], t["bias"], t["residual"], residual_scale,
            t["g"], eps)  # fmt: skip


@pytest.fixture(autouse=True)
def _kernel_runtime():
    require_kernel_runtime()


# (N, T, D, Hq, Hkv, hd): the LocDiT's CFG pair of 11-token sequences at a small width (22 rows in a 32-row tile),
# three 5-token sequences (15 rows, 2 q heads per kv head), one 16-token sequence (a full tile, MHA)
SHAPES = [(2, 11, 40, 4, 2, 16), (3, 5, 48, 4, 2, 16), (1, 16, 24, 2, 2, 32)]


@pytest.mark.skipif(ON_GPU, reason="fp32 under the interpreter; the GPU tests below")
@pytest.mark.parametrize("bias,rope", [(False, True), (True, True), (False, False)], ids=["rope", "bias", "norope"])
@pytest.mark.parametrize(
    "N,T,D,hq,hkv,hd,split", [(*shape, split) for shape in SHAPES for split in (1, 2, 4) if shape[3] % split == 0]
)
def test_kernel_is_the_attention_then_the_residual_projection(N, T, D, hq, hkv, hd, split, bias, rope):
    """fp32 on the kernel (the interpreter): y and its next RMSNorm as the two ops' references give them, with the
    heads split 1, 2 and 4 ways where they divide; only o_proj's fp32 sums over K run in another order."""
    t = _case(N, T, D, hq, hkv, hd, torch.float32, bias=bias, rope=rope, seed=split)
    args = _args(t, hq, hkv, hd, residual_scale=0.7, eps=1e-5)
    y, yn = launch_sequence_attention_o(*args, config=(split, 16, 4))
    ref_y, ref_yn = sequence_attention_o_reference(*args)
    assert rel_err(y, ref_y) < 1e-5 and rel_err(yn, ref_yn) < 1e-5
    # the same as the chain of ops the layer ran before (attention, then o_proj with the norm hand-over)
    o = sequence_attention(t["qkv"], t["cos"], t["sin"], hq, hkv, hd**-0.5)
    chain = skinny_linear_norm_out(o, t["weight"], t["bias"], t["residual"], 0.7, t["g"], 1e-5)
    assert rel_err(y, chain[0]) < 1e-5 and rel_err(yn, chain[1]) < 1e-5


@pytest.mark.skipif(ON_GPU, reason="the interpreter's bf16; the GPU tests below")
def test_bf16_kernel_rounds_like_the_reference():
    t = _case(2, 11, 64, 4, 2, 16, torch.bfloat16, bias=False, seed=3)
    args = _args(t, 4, 2, 16)
    y, yn = launch_sequence_attention_o(*args, config=(4, 16, 4))
    ref_y, ref_yn = sequence_attention_o_reference(*args)
    tol = 3e-2  # the interpreter's truncating casts
    assert rel_err(y.float(), ref_y.float()) < tol and rel_err(yn.float(), ref_yn.float()) < tol


def test_sequences_do_not_see_each_other():
    """The score tile holds every sequence's tokens: changing one sequence's qkv leaves the others' outputs as
    they were (the block-diagonal mask; without it this fails)."""
    if ON_GPU:
        pytest.skip("interpreter-sized case")
    t = _case(2, 5, 32, 2, 2, 16, torch.float32, bias=False, seed=7)
    args = list(_args(t, 2, 2, 16))
    y0, _ = launch_sequence_attention_o(*args, config=(2, 16, 4))
    qkv = t["qkv"].clone()
    qkv[1] += 3.0
    args[0] = qkv
    y1, _ = launch_sequence_attention_o(*args, config=(2, 16, 4))
    assert torch.equal(y0[0], y1[0]) and not torch.allclose(y0[1], y1[1])


def test_op_on_cpu_is_the_reference_and_checks_its_operands():
    t = _case(2, 3, 16, 2, 1, 16, torch.float32, bias=True, device="cpu")
    args = _args(t, 2, 1, 16)
    y, yn = sequence_attention_o(*args)
    ref = sequence_attention_o_reference(*args)
    assert torch.equal(y, ref[0]) and torch.equal(yn, ref[1])
    bad_w = list(args)
    bad_w[6] = t["weight"][:, :16]
    with pytest.raises(RuntimeError, match=r"weight must be \[D, 32\]"):
        sequence_attention_o(*bad_w)
    bad_r = list(args)
    bad_r[8] = t["residual"][:, :2]
    with pytest.raises(RuntimeError, match="residual must be"):
        sequence_attention_o(*bad_r)
    bad_g = list(args)
    bad_g[10] = t["g"][:8]
    with pytest.raises(RuntimeError, match=r"out_norm_weight must be \[16\]"):
        sequence_attention_o(*bad_g)


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.o = torch.nn.Linear(32, 16, bias=False)
        self.g = torch.nn.Parameter(torch.rand(16) + 0.5)
        cos, sin = rope_table(16, 8, 10000.0)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, qkv, x):
        y, yn = sequence_attention_o(qkv, self.cos, self.sin, 2, 1, 0.25, self.o.weight, None, x, 1.0, self.g, 1e-6)
        return y + yn


def test_export_keeps_one_node_and_cpu_lowers_to_aten():
    m, qkv, x = _Layer(), torch.randn(2, 5, 64), torch.randn(2, 5, 16)
    with torch.no_grad():
        ep = torch.export.export(m, (qkv, x), strict=False)
        ops = [n.target for n in ep.graph.nodes if n.op == "call_function"]
        assert ops.count(OP) == 1
        for lowered in (
            ep.run_decompositions({**torch.export.default_decompositions(), **CPU_DECOMPOSITIONS}),
            lower_for_cpu(ep),
        ):
            targets = {str(n.target) for n in lowered.graph.nodes if n.op == "call_function"}
            assert not any("ttsaot" in t for t in targets)
            torch.testing.assert_close(lowered.module()(qkv, x), m(qkv, x))


def test_fits_the_locdit_rows_on_cuda_only():
    """Static per bucket, decided at trace time (fake CUDA tensors): the LocDiT's b1 call (2 × 11 rows, 16/2 heads of
    128) takes the kernel; the local encoder's 5 rows (below NORM_OUT_MIN_ROWS), the LocDiT's b2 (44 rows, more than
    one tile), a head dim of 256 or 12, and anything on CPU do not."""
    with FakeTensorMode():

        def ok(N, T, hq, hkv, hd, device="cuda", dtype=torch.bfloat16):
            return fits(torch.empty(N, T, (hq + 2 * hkv) * hd, device=device, dtype=dtype), hq, hkv)

        assert ok(2, 11, 16, 2, 128) and ok(1, 32, 16, 2, 128) and ok(2, 8, 4, 2, 16)
        assert not ok(1, 5, 16, 2, 128)  # the local encoder's b1: 5 rows
        assert not ok(4, 11, 16, 2, 128)  # 44 rows
        assert not ok(2, 11, 4, 2, 256) and not ok(2, 11, 4, 2, 12)
        assert not ok(2, 11, 16, 2, 128, device="cpu")
        assert not ok(2, 11, 16, 2, 128, dtype=torch.float64)


def test_the_layer_takes_it_where_it_fits(monkeypatch):
    """KernelAttention.sequence with a next norm and TTSAOT_ATTENTION_O=1: the fused op where `fits` holds (every
    attention and o_proj call becomes one), the chain where it does not, with TTSAOT_NORM_OUT=0 or without the
    switch (the default); the outputs equal the chain's."""
    from ttsaot.builder.kernels.decode_modules import KernelAttention
    from ttsaot.builder.layers import RMSNorm
    from ttsaot.builder.layers.attention import Attention

    torch.manual_seed(0)
    attn = KernelAttention(Attention(32, 2, 1, 16, fused_qkv=True))
    norm, nxt = RMSNorm(32, 1e-6), RMSNorm(32, 1e-6)
    with torch.no_grad():
        nxt.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, 32)
    cos, sin = rope_table(16, 8, 10000.0)
    fused: list = []

    def run(*args):
        fused.append(args[0].shape)
        return sequence_attention_o_reference(*args)

    monkeypatch.setattr(DM, "sequence_attention_o", run)
    monkeypatch.delenv(NORM_OUT_ENV, raising=False)
    monkeypatch.setenv(ENV, "1")
    with torch.no_grad():
        chain = attn.sequence(x, norm, cos, sin, 0.5, next_norm=nxt)
        assert not fused  # on CPU: no fit
        monkeypatch.setattr(DM, "attention_o_fits", lambda qkv, hq, hkv: True)
        y, yn = attn.sequence(x, norm, cos, sin, 0.5, next_norm=nxt)
        assert fused == [(2, 5, 16 * 4)]
        assert chain[1] is None  # on CPU the chain's o_proj hands no norm over: the next block computes it
        assert rel_err(y, chain[0]) < 1e-6 and rel_err(yn, nxt(chain[0])) < 1e-6
        attn.sequence(x, norm, cos, sin, 0.5)  # no next norm: the chain
        monkeypatch.setenv(NORM_OUT_ENV, "0")
        attn.sequence(x, norm, cos, sin, 0.5, next_norm=nxt)
        monkeypatch.delenv(NORM_OUT_ENV)
        monkeypatch.delenv(ENV)  # the default: off until a GPU A/B of the stage
        attn.sequence(x, norm, cos, sin, 0.5, next_norm=nxt)
        assert len(fused) == 1


# ------------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("N,T", [(2, 11), (1, 16), (2, 16)], ids=["locdit_b1", "one_sequence", "full_tile"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_gpu_locdit_shape(N, T, bias):
    """bf16 at the LocDiT's widths (hidden 1024, 16/2 heads of 128) through the op as a build traces it: within
    bf16 of the reference, a second call bit-equal; the plan's config and every other split the probe sweeps."""
    t = _case(N, T, 1024, 16, 2, 128, torch.bfloat16, bias=bias, seed=N * T)
    args = _args(t, 16, 2, 128)
    assert fits(t["qkv"], 16, 2)
    y, yn = sequence_attention_o(*args)
    ref_y, ref_yn = sequence_attention_o_reference(*args)
    assert rel_err(y.float(), ref_y.float()) < 1e-2 and rel_err(yn.float(), ref_yn.float()) < 1e-2
    again = sequence_attention_o(*args)
    assert torch.equal(again[0], y) and torch.equal(again[1], yn)
    for split in (1, 2, 4, 8):
        y2, yn2 = launch_sequence_attention_o(*args, config=(split, 32, 4))
        assert rel_err(y2.float(), ref_y.float()) < 1e-2 and rel_err(yn2.float(), ref_yn.float()) < 1e-2
