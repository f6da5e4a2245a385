"""`ttsaot::conv1d`, `conv_transpose1d`, `dwconv1d` (+ `_dual`) on channels-last activations: aten references against
the eager (NCL) causal conv modules, the polyphase identity, epilogue rounding order, input checks, tile pruning,
export (one node per op) and CPU decomposition; the Triton kernels under TRITON_INTERPRET=1 in a child process (the
flag must be set before triton is imported)."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from ttsaot.builder.kernels.conv1d import (
    CPU_DECOMPOSITIONS,
    MAX_TUNED_CONFIGS,
    ConvBakeError,
    ConvKernelConfig,
    bake_conv1d,
    bake_conv_transpose1d,
    bake_dwconv1d,
    conv1d_dual_reference,
    conv1d_reference,
    conv_transpose1d_reference,
    dwconv1d_reference,
    estimate_us,
    gemm_kernel_configs,
    prune_gemm_configs,
    round_to_tf32,
    unbake_conv_transpose1d,
)
from ttsaot.builder.kernels.snake_beta import CPU_DECOMPOSITIONS as SNAKE_DECOMPOSITIONS
from ttsaot.builder.kernels.snake_beta import HAVE_TRITON
from ttsaot.builder.layers import BakedSnakeBeta
from ttsaot.builder.layers.conv import CausalConv1d, CausalConvTranspose1d
from ttsaot.builder.passes.conv import ShiftDepthwiseConv1d

from .conftest import computed_once


class LeftPadConv1d(nn.Conv1d):
    """A Conv1d subclass carrying `left_pad` (VoxCPM2's form: stride 1, no right pad)."""

    def __init__(self, *args, left_pad: int = 0, **kw) -> None:
        super().__init__(*args, **kw)
        self.left_pad = left_pad

    def forward(self, x):
        return super().forward(nn.functional.pad(x, (self.left_pad, 0)))


def _randomize(m: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return m.eval()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _nlc(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2).contiguous()


# (Cin, Cout, K, stride, dilation, T): odd channels, Cin = 1, Cout = 1, dilations 1/3/9, strides with K = 2s and
# K = s, odd lengths, lengths far below the receptive field (55 samples for k7 d9), channel counts that are and are
# not multiples of the reduction block (a tap's channels in one or several steps, with a masked tail).
GEOMETRIES = [
    (5, 7, 7, 1, 1, 40),
    (1, 9, 7, 1, 1, 33),
    (6, 1, 7, 1, 9, 20),
    (5, 6, 7, 1, 3, 3),
    (8, 12, 4, 2, 1, 31),
    (3, 5, 8, 4, 1, 37),
    (4, 4, 2, 2, 1, 9),
    (20, 40, 1, 1, 1, 50),
    (7, 3, 16, 8, 1, 5),
    (18, 10, 3, 1, 1, 1),
    (32, 24, 7, 1, 3, 45),
    (32, 20, 7, 1, 9, 70),
    (48, 16, 8, 4, 1, 29),
]


@pytest.mark.parametrize("cin,cout,k,s,d,T", GEOMETRIES)
@pytest.mark.parametrize("B", [1, 3])
def test_conv1d_reference_is_the_causal_conv(cin, cout, k, s, d, T, B):
    conv = _randomize(CausalConv1d(cin, cout, k, stride=s, dilation=d))
    x = torch.randn(B, cin, T)
    w, b, m = bake_conv1d(conv)
    assert w.shape == (cout, k, cin) and w.is_contiguous()
    eager = conv(x)
    assert m.out_len(T) == eager.shape[-1]
    y = conv1d_reference(_nlc(x), w, b, None, None, None, None, None, s, d, m.left_pad, "none", None, "ieee")
    # channels-last in and out; fp32 sums in another order (permuted weight views): ≲ 1e-6 relative
    assert y.shape == (B, m.out_len(T), cout) and y.is_contiguous()
    assert _rel(y, eager.transpose(1, 2)) < 1e-6
    torch.testing.assert_close(y, eager.transpose(1, 2), rtol=1e-5, atol=1e-5)


def test_conv1d_bake_layout_and_vox_style_conv():
    conv = _randomize(LeftPadConv1d(6, 4, 7, dilation=3, left_pad=18))
    w, b, m = bake_conv1d(conv)
    assert w.shape == (4, 7, 6) and m.left_pad == 18 and m.stride == 1
    assert torch.equal(w, conv.weight.permute(0, 2, 1))
    x = torch.randn(2, 6, 25)
    y = conv1d_reference(_nlc(x), w, b, None, None, None, None, None, 1, 3, 18, "none", None, "ieee")
    torch.testing.assert_close(y, conv(x).transpose(1, 2), rtol=1e-5, atol=1e-6)
    strided = _randomize(CausalConv1d(3, 5, 8, stride=4))
    w, _, m = bake_conv1d(strided)
    assert w.shape == (5, 8, 3) and m.stride == 4 and torch.equal(w, strided.conv.weight.permute(0, 2, 1))


@pytest.mark.parametrize(
    "cin,cout,k,s,T",
    [
        (5, 7, 4, 2, 9),
        (3, 6, 2, 2, 7),
        (6, 5, 10, 5, 11),
        (4, 3, 6, 3, 1),
        (7, 9, 16, 8, 3),
        (3, 4, 5, 2, 6),
        (4, 4, 3, 3, 5),
    ],
)
def test_conv_transpose1d_reference_and_bake(cin, cout, k, s, T):
    m = _randomize(CausalConvTranspose1d(cin, cout, k, s))
    w, b, stride = bake_conv_transpose1d(m)
    M = -(-k // s)
    assert stride == s and w.shape == (s, cout, M, cin)
    padded = nn.functional.pad(m.conv.weight, (0, M * s - k))
    assert torch.equal(unbake_conv_transpose1d(w), padded)
    x = torch.randn(2, cin, T)
    y = conv_transpose1d_reference(_nlc(x), w, b, None, None, None, None, None, "none", None, "ieee")
    assert y.shape == (2, T * s, cout)
    torch.testing.assert_close(y, m(x).transpose(1, 2), rtol=1e-5, atol=1e-6)
    # the polyphase GEMM's claim: row t of the stride-1 conv with s·Cout channels (n = p·Cout + co) is output
    # rows t·s .. t·s + s − 1, i.e. the [B, T, s·Cout] result IS [B, T·s, Cout]
    poly = conv1d_reference(
        _nlc(x),
        w.reshape(s * cout, M, cin),
        None if b is None else b.repeat(s),
        None,
        None,
        None,
        None,
        None,
        1,
        1,
        M - 1,
        "none",
        None,
        "ieee",
    )
    torch.testing.assert_close(poly.reshape(2, T * s, cout), y, rtol=1e-5, atol=1e-6)


def test_dwconv1d_reference_and_bake():
    x = torch.randn(2, 6, 30)
    for d in (1, 3, 9):
        conv = _randomize(CausalConv1d(6, 6, 7, dilation=d, groups=6), seed=d)
        for m in (conv, ShiftDepthwiseConv1d(conv)):
            w, b, dil, left = bake_dwconv1d(m)
            assert w.shape == (7, 6) and dil == d and left == 6 * d
            y = dwconv1d_reference(_nlc(x), w, b, None, None, None, None, None, dil, left, "none", None)
            torch.testing.assert_close(y, conv(x).transpose(1, 2), rtol=1e-5, atol=1e-6)


def test_epilogue_follows_the_eager_chain_in_bf16():
    """conv → + residual → snake → clamp → float, each rounded to bf16 as the eager modules round."""
    conv = _randomize(CausalConv1d(16, 12, 7, dilation=3))
    snake = BakedSnakeBeta(torch.rand(12) + 0.5, torch.rand(12))
    x, res = torch.randn(2, 16, 64), torch.randn(2, 12, 64)
    w, b, m = bake_conv1d(conv)
    xb, wb, bb, rb = x.bfloat16(), w.bfloat16(), b.bfloat16(), res.bfloat16()
    pre, out = conv1d_dual_reference(
        _nlc(xb), wb, bb, _nlc(rb), None, None, snake.alpha, snake.inv_beta, 1, 3, 18, "snake", None, "ieee"
    )
    with torch.no_grad():
        conv_b = conv.to(torch.bfloat16)
        eager_pre = rb + conv_b(xb)
        eager = snake(eager_pre)
    eager_pre, eager = eager_pre.transpose(1, 2), eager.transpose(1, 2)
    assert pre.dtype == out.dtype == torch.bfloat16
    # the eager bf16 conv sums in another order: equal almost everywhere, one bf16 step at most elsewhere
    assert (pre == eager_pre).float().mean() > 0.98 and _rel(pre, eager_pre) < 4e-3
    assert (out == eager).float().mean() > 0.98 and _rel(out, eager) < 4e-3
    clamp = conv1d_reference(
        _nlc(xb), wb, bb, _nlc(rb), None, None, None, None, 1, 3, 18, "clamp", torch.float32, "ieee"
    )
    assert clamp.dtype == torch.float32 and torch.equal(clamp, pre.clamp(-1, 1).float())
    sc, sh = torch.rand(12) + 0.5, torch.randn(12)
    aff = conv1d_reference(_nlc(xb), wb, bb, None, sc, sh, None, None, 1, 3, 18, "tanh", None, "ieee")
    conv_only = conv1d_reference(_nlc(xb), wb, bb, None, None, None, None, None, 1, 3, 18, "none", None, "ieee")
    expect = torch.tanh(((conv_only.float() * sc).bfloat16().float() + sh).bfloat16().float()).bfloat16()
    assert torch.equal(aff, expect)


def test_op_input_checks():
    w = torch.randn(4, 7, 6)
    x = torch.randn(1, 20, 6)
    ops = torch.ops.ttsaot
    args = (None, None, None, None, None, None, 1, 1, 6)
    with pytest.raises(RuntimeError, match="input channels"):
        ops.conv1d(torch.randn(1, 20, 5), w, *args, "none", None, "ieee")
    with pytest.raises(RuntimeError, match="input channels"):  # an NCL tensor given where [B,T,C] is due
        ops.conv1d(x.transpose(1, 2), w, *args, "none", None, "ieee")
    with pytest.raises(RuntimeError, match="weight dtype"):
        ops.conv1d(x.bfloat16(), w, *args, "none", None, "ieee")
    with pytest.raises(RuntimeError, match="act must be"):
        ops.conv1d(x, w, *args, "relu", None, "ieee")
    with pytest.raises(RuntimeError, match="precision must be"):
        ops.conv1d(x, w, *args, "none", None, "tf16")
    with pytest.raises(RuntimeError, match="needs alpha and inv_beta"):
        ops.conv1d(x, w, *args, "snake", None, "ieee")
    with pytest.raises(RuntimeError, match="residual must have the output shape"):
        ops.conv1d(x, w, None, torch.randn(1, 4, 20), None, None, None, None, 1, 1, 6, "none", None, "ieee")
    with pytest.raises(RuntimeError, match="stride, dilation"):
        ops.conv1d(x, w, *args[:6], 0, 1, 6, "none", None, "ieee")
    with pytest.raises(RuntimeError, match="baked weight"):
        ops.conv_transpose1d(x, w, None, None, None, None, None, None, "none", None, "ieee")
    with pytest.raises(RuntimeError, match="weight \\[K,C\\]"):
        ops.dwconv1d(x, torch.randn(6, 7), None, None, None, None, None, None, 1, 6, "none", None)


def test_bake_rejects_what_the_kernels_do_not_compute():
    with pytest.raises(ConvBakeError, match="bake_dwconv1d"):
        bake_conv1d(CausalConv1d(4, 4, 7, groups=4))
    with pytest.raises(ConvBakeError, match="left_pad"):
        bake_conv1d(nn.Conv1d(4, 4, 3))
    with pytest.raises(ConvBakeError, match="must not pad"):
        bake_conv1d(LeftPadConv1d(4, 4, 3, padding=1, left_pad=1))
    with pytest.raises(ConvBakeError, match="trim"):
        bake_conv_transpose1d(nn.ConvTranspose1d(4, 4, 4, stride=2))
    with pytest.raises(ConvBakeError, match="groups must equal"):
        bake_dwconv1d(CausalConv1d(4, 8, 3, groups=4))


def test_round_to_tf32_is_round_to_nearest_even():
    one_ulp = 2.0**-10
    x = torch.tensor(
        [
            1.0,
            1.0 + one_ulp * 0.49,
            1.0 + one_ulp * 0.51,
            1.0 + one_ulp * 0.5,
            1.0 + one_ulp * 1.5,
            -3.0 - 3 * one_ulp * 0.51,
            0.0,
            float("inf"),
        ]
    )
    want = torch.tensor([1.0, 1.0, 1.0 + one_ulp, 1.0, 1.0 + 2 * one_ulp, -3.0 - 2 * one_ulp, 0.0, float("inf")])
    assert torch.equal(round_to_tf32(x), want)
    r = torch.randn(10000) * 100
    t = round_to_tf32(r)
    assert torch.equal(round_to_tf32(t), t)  # TF32 values are fixed points
    rel = ((t - r).abs() / r.abs()).max().item()
    assert 2.0**-13 < rel <= 2.0**-11  # half a TF32 ulp at most, and it rounds
    assert abs(((t - r) / r).mean().item()) < 2e-5  # unbiased (truncation: −2.4e-4)


def test_tile_pruning_keeps_few_fitting_configs():
    """The autotuning space per shape: ≤ MAX_TUNED_CONFIGS tiles, none much larger than the problem, narrow
    tiles only for a narrow output, no fp32 tile beyond the register budget; wide tiles for the long layers."""
    for dtype, elem in ((torch.bfloat16, 2), (torch.float32, 4)):
        cfgs = gemm_kernel_configs(dtype)
        assert {c.block_r * elem for c in cfgs} == {128}  # 128-byte rows per reduction step
        for B, tout, n, cin, k in [
            (1, 96000, 1, 96, 7),
            (1, 200, 1536, 1024, 7),
            (4, 32000, 192, 192, 7),
            (1, 29, 1024, 8, 1),
            (1, 1600, 6144, 1536, 2),
            (1, 442368, 64, 1, 7),
        ]:
            for prec in ("ieee",) if elem == 2 else ("ieee", "tf32", "tf32x3"):
                kept = prune_gemm_configs(cfgs, batch=B, tout=tout, n=n, cin=cin, ksize=k, elem=elem, precision=prec)
                assert 1 <= len(kept) <= MAX_TUNED_CONFIGS, (tout, n, kept)
                for c in kept:
                    assert c.block_n <= max(16, 1 << (n - 1).bit_length()) and c.block_t <= max(64, 2 * tout)
                    assert (c.block_n == 16) == (n <= 16)
                    if elem == 4:
                        assert c.block_t * c.block_n <= 128 * 128
                    if prec == "tf32x3":
                        assert max(c.block_t, c.block_n) <= 128
    long = prune_gemm_configs(gemm_kernel_configs(torch.bfloat16), batch=1, tout=32000, n=192, cin=192, ksize=7, elem=2)
    assert max(c.block_t * c.block_n for c in long) >= 128 * 128
    assert estimate_us(
        ConvKernelConfig(128, 128, 64), batch=1, tout=32000, n=192, cin=192, ksize=7, elem=2
    ) < estimate_us(ConvKernelConfig(64, 64, 64), batch=1, tout=32000, n=192, cin=192, ksize=7, elem=2)


def test_thin_inputs_reduce_over_taps_and_channels_jointly():
    from ttsaot.builder.kernels.conv1d import JOINT_REDUCTION_MAX_CIN, joint_reduction, max_split, reduction_steps

    assert reduction_steps(7, 1, 32) == 1  # the DAC encoder's first conv: 7 (tap, channel) pairs in one step
    assert reduction_steps(7, 15, 32) == 4 and reduction_steps(7, 16, 32) == 7 and reduction_steps(7, 64, 32) == 14
    assert joint_reduction(JOINT_REDUCTION_MAX_CIN - 1) and not joint_reduction(JOINT_REDUCTION_MAX_CIN)
    assert max_split(batch=1, tout=442368, n=64, cin=1, ksize=7, block_r=32) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_one_step_reductions_run_without_a_pipeline(dtype):
    """A tile whose programs reduce in one step gets its 1-stage variant (measured 3.7x faster on the DAC
    encoder's first conv), every other shape only the pipelined tiles; each tile appears once either way."""
    from ttsaot.builder.kernels.conv1d import one_step

    cfgs = gemm_kernel_configs(dtype)
    elem = 4 if dtype == torch.float32 else 2
    assert len({c.name for c in cfgs}) == len(cfgs)
    for B, tout, n, cin, k, one in [
        (1, 442368, 64, 1, 7, True),  # DAC encoder's first conv: 7 (tap, channel) pairs
        (1, 69120, 64, 5, 7, dtype == torch.bfloat16),  # 35 pairs: one 64-wide step in bf16, two 32-wide in fp32
        (1, 8640, 256, 32, 1, True),  # 1×1 over 32 channels
        (1, 69120, 1, 32, 7, False),  # VAE head: 7 steps
        (4, 32000, 192, 192, 7, False),
    ]:
        kept = prune_gemm_configs(cfgs, batch=B, tout=tout, n=n, cin=cin, ksize=k, elem=elem, precision="ieee")
        assert kept and all((c.num_stages == 1) == one for c in kept), (tout, n, cin, k, kept)
        assert all(one_step(c, cin=cin, ksize=k) == one for c in kept)
        assert len({(c.block_t, c.block_n, c.split_k) for c in kept}) == len(kept)


def test_fp32_short_grids_measure_split_k_candidates():
    """fp32 operands on a short grid (VoxCPM2's 1×1 convs at 288 rows, its first transposed conv at 36): two whole
    tiles and the two largest split-Ks of the best one, each within a few programs per SM; long grids and 16-bit
    operands keep the estimate's ranking."""
    from ttsaot.builder.kernels.conv1d import (
        SHORT_GRID_MIN_SPLIT_STEPS,
        SHORT_GRID_PROGRAMS_PER_SM,
        TUNED_CONFIGS,
        reduction_steps,
    )

    f32 = gemm_kernel_configs(torch.float32)
    for tout, n, cin, k in [(288, 1024, 1024, 1), (36, 8 * 1024, 2048, 2), (288, 6 * 512, 1024, 2)]:
        kept = prune_gemm_configs(f32, batch=1, tout=tout, n=n, cin=cin, ksize=k, elem=4, precision="tf32x3")
        whole, split = [c for c in kept if c.split_k == 1], [c for c in kept if c.split_k > 1]
        assert len(whole) == 2 and 1 <= len(split) <= 2 and len(kept) <= MAX_TUNED_CONFIGS
        top = whole[0]
        programs = -(-tout // top.block_t) * -(-n // top.block_n)
        for c in split:
            assert (c.block_t, c.block_n) == (top.block_t, top.block_n)
            assert c.split_k * programs <= SHORT_GRID_PROGRAMS_PER_SM * 132
            assert reduction_steps(k, cin, c.block_r) >= SHORT_GRID_MIN_SPLIT_STEPS * c.split_k
    # 1,728 rows of 512 channels: 16 steps, too few to split (measured slower in the graph)
    few = prune_gemm_configs(f32, batch=1, tout=1728, n=512, cin=512, ksize=1, elem=4, precision="tf32x3")
    assert all(c.split_k == 1 for c in few)
    # a tiny grid (the DAC quantizer's in_proj: 216 rows, 1024 → 8, 4 programs of 32 steps): deep splits measured
    tiny = prune_gemm_configs(f32, batch=1, tout=216, n=8, cin=1024, ksize=1, elem=4, precision="tf32x3")
    assert max(c.split_k for c in tiny) == 8 and all(32 // c.split_k >= 4 for c in tiny)
    long = prune_gemm_configs(f32, batch=1, tout=8640, n=256, cin=256, ksize=1, elem=4, precision="tf32x3")
    assert all(c.split_k == 1 for c in long) and len(long) == TUNED_CONFIGS
    bf16 = prune_gemm_configs(gemm_kernel_configs(torch.bfloat16), batch=1, tout=288, n=1024, cin=1024, ksize=1, elem=2)
    assert len(bf16) <= TUNED_CONFIGS


class _AllOps(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1, self.b1, self.m1 = bake_conv1d(_randomize(CausalConv1d(6, 8, 7, dilation=3)))
        self.wt, self.bt, _ = bake_conv_transpose1d(_randomize(CausalConvTranspose1d(8, 4, 4, 2)))
        self.wd, self.bd, self.dil, self.left = bake_dwconv1d(_randomize(CausalConv1d(4, 4, 7, groups=4)))
        self.a, self.ib = torch.rand(8) + 0.5, torch.rand(8)
        self.w2 = torch.randn(8, 1, 8) * 0.3

    def forward(self, x):
        ops = torch.ops.ttsaot
        pre, h = ops.conv1d_dual(
            x, self.w1, self.b1, None, None, None, self.a, self.ib, 1, 3, 18, "snake", None, "ieee"
        )
        h = ops.conv1d(h, self.w2, None, pre, None, None, None, None, 1, 1, 0, "none", None, "ieee")
        u = ops.conv_transpose1d(h, self.wt, self.bt, None, None, None, None, None, "none", None, "ieee")
        pre_t, u2 = ops.conv_transpose1d_dual(h, self.wt, self.bt, None, None, None, None, None, "tanh", None, "ieee")
        d = ops.dwconv1d(
            u + u2 + pre_t, self.wd, self.bd, None, None, None, None, None, self.dil, self.left, "clamp", torch.float32
        )
        return d


def test_export_keeps_one_node_per_op_and_cpu_decomposes_to_aten():
    m = _AllOps()
    x = torch.randn(2, 24, 6)
    eager = m(x)
    assert eager.shape == (2, 48, 4) and eager.dtype == torch.float32
    ep = torch.export.export(m, (x,), strict=False)
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    for name in ("conv1d", "conv1d_dual", "conv_transpose1d", "conv_transpose1d_dual", "dwconv1d"):
        assert targets.count(getattr(torch.ops.ttsaot, name).default) == 1, name
    table = torch.export.default_decompositions()
    table.update(SNAKE_DECOMPOSITIONS)
    table.update(CPU_DECOMPOSITIONS)
    dec = ep.run_decompositions(table)
    names = {str(n.target) for n in dec.graph.nodes if n.op == "call_function"}
    assert not any("ttsaot" in t for t in names) and any("convolution" in t for t in names)
    torch.testing.assert_close(dec.module()(x), eager)


# ------------------------------------------------------------------------------------------ Triton interpreter
_HARNESS = textwrap.dedent("""
    import torch
    from torch import nn
    from ttsaot.builder.kernels import conv1d as K
    from ttsaot.builder.layers.conv import CausalConv1d, CausalConvTranspose1d

    torch.manual_seed(0)
    # small tiles (several time and channel tiles, partial program groups), wider ones (masked channel tails), and
    # split-K over 3 programs per tile (uneven ranges, some empty for short reductions)
    CFGS = [K.ConvKernelConfig(16, 16, 16, 4, 2, group_t=2), K.ConvKernelConfig(32, 64, 32, 4, 1, group_t=3),
            K.ConvKernelConfig(16, 32, 16, 4, 2, group_t=2, split_k=3)]

    def rel(a, b):
        a, b = a.double(), b.double()
        return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()

    def poisoned(shape, dtype):
        return torch.full(shape, float("nan"), dtype=dtype)

    FAILURES = {}

    def check(got, ref, dtype, what):
        try:
            _check(got, ref, dtype, what)
        except AssertionError as e:
            FAILURES.setdefault(GROUP, []).append(repr(e)[:300])

    def _check(got, ref, dtype, what):
        assert got.shape == ref.shape and got.dtype == ref.dtype, (what, got.shape, ref.shape, got.dtype)
        assert not got.isnan().any(), ("unwritten output elements", what)
        e = rel(got, ref)
        if dtype == torch.float32:
            assert e < 1e-6, (what, e)
        else:   # fp32 sums in another order: equal almost everywhere, one 16-bit step at most elsewhere
            same = (got == ref).float().mean().item()
            assert same > 0.97 and e < 4e-3, (what, e, same)

    def tf32_operands(args, prec):
        # The reference's inputs for the kernel's "tf32": both GEMM operands rounded to the nearest TF32 value
        # (the interpreter multiplies them exactly, as the tensor cores multiply TF32 values); the other
        # precisions see exact fp32 here (the interpreter ignores input_precision: tf32x3 is measured on the GPU).
        if prec != "tf32" or args[0].dtype != torch.float32:
            return args
        return (K.round_to_tf32(args[0]), K.round_to_tf32(args[1]), *args[2:])

    EPILOGUES = [  # (use bias, residual, affine, act, dual, out_dtype)
        (True, False, False, "none", False, None), (True, True, False, "snake", True, None),
        (False, False, True, "tanh", False, None), (True, True, False, "clamp", False, torch.float32),
        (True, False, False, "snake", False, None)]

    def epilogue(i, cout, T_out, B, dtype):
        use_b, use_r, use_aff, act, dual, odt = EPILOGUES[i % len(EPILOGUES)]
        # a non-contiguous [B, T, C] residual (the launch makes every operand contiguous)
        res = torch.randn(B, cout, T_out).to(dtype).transpose(1, 2) if use_r else None
        sc, sh = (torch.rand(cout) + 0.5, torch.randn(cout)) if use_aff else (None, None)
        a, ib = (torch.rand(cout) + 0.5, torch.rand(cout)) if act == "snake" else (None, None)
        return use_b, res, sc, sh, a, ib, act, dual, odt
""")


GROUPS = {
    "conv1d[float32]": ("conv1d", "float32"),
    "conv1d[bfloat16]": ("conv1d", "bfloat16"),
    "conv1d[float16]": ("conv1d", "float16"),
    "conv_transpose1d[float32]": ("conv_transpose1d", "float32"),
    "conv_transpose1d[bfloat16]": ("conv_transpose1d", "bfloat16"),
    "split_scratch": ("split_scratch", None),
    "dwconv1d": ("dwconv1d", None),
}

_CASES = {
    # The interpreter multiplies fp32 dot operands exactly whatever input_precision says: "tf32" is checked here
    # for its in-kernel operand rounding, tf32x3 for compiling and dispatching (its error is measured on the GPU).
    "conv1d": f"""
    geoms = {GEOMETRIES!r}
    i = 0
    for gi, (cin, cout, k, s, d, T) in enumerate(geoms if dtype != torch.float16 else geoms[:4]):
        for B in ((1, 3)[gi % 2],):
            w, b, m = K.bake_conv1d(CausalConv1d(cin, cout, k, stride=s, dilation=d))
            x, w, b = torch.randn(B, T, cin).to(dtype), w.to(dtype), b.to(dtype)
            Tout = m.out_len(T)
            use_b, res, sc, sh, a, ib, act, dual, odt = epilogue(i, cout, Tout, B, dtype)
            prec = ("ieee", "tf32", "tf32x3")[i % 3]
            args = (x, w, b if use_b else None, res, sc, sh, a, ib, s, d, m.left_pad, act, odt, prec)
            ref_pre, ref = K.conv1d_dual_reference(*tf32_operands(args, prec))
            out = poisoned(ref.shape, ref.dtype)
            pre = poisoned(ref_pre.shape, dtype) if dual else None
            got_pre, got = K.conv1d_forward(*args, dual, config=CFGS[i % 3], out=out, pre=pre)
            what = (cin, cout, k, s, d, T, B, act, prec)
            check(got, ref, dtype, what)
            if dual:
                check(got_pre, ref_pre, dtype, what)
            i += 1
    """,
    "conv_transpose1d": """
    i = 0
    for gi, (cin, cout, k, s, T) in enumerate([(5, 7, 4, 2, 9), (3, 6, 2, 2, 7), (6, 5, 10, 5, 11), (4, 3, 6, 3, 1),
                                               (7, 9, 16, 8, 3), (3, 4, 5, 2, 6), (1, 1, 4, 2, 5), (20, 33, 8, 4, 13),
                                               (32, 16, 4, 2, 9), (64, 20, 10, 5, 6)]):
        for B in ((1, 3)[gi % 2],):
            w, b, _ = K.bake_conv_transpose1d(CausalConvTranspose1d(cin, cout, k, s))
            x, w, b = torch.randn(B, T, cin).to(dtype), w.to(dtype), b.to(dtype)
            use_b, res, sc, sh, a, ib, act, dual, odt = epilogue(i, cout, T * s, B, dtype)
            prec = ("tf32x3", "tf32", "ieee")[i % 3]
            args = (x, w, b if use_b else None, res, sc, sh, a, ib, act, odt, prec)
            ref_pre, ref = K.conv_transpose1d_dual_reference(*tf32_operands(args, prec))
            out = poisoned(ref.shape, ref.dtype)
            pre = poisoned(ref_pre.shape, dtype) if dual else None
            got_pre, got = K.conv_transpose1d_forward(*args, dual, config=CFGS[i % 3], out=out, pre=pre)
            check(got, ref, dtype, (cin, cout, k, s, T, B, act))
            if dual:
                check(got_pre, ref_pre, dtype, (cin, cout, k, s, T, B, act))
            i += 1
    """,
    "split_scratch": """
    # split-K launches reusing one workspace and counter buffer (the autotuner's repeated launches, graph
    # replays): the last program of each tile resets its counter, so every launch reduces all its partials
    cfg = K.ConvKernelConfig(16, 16, 16, 4, 2, group_t=2, split_k=4)
    w, b, m = K.bake_conv1d(CausalConv1d(40, 24, 7, dilation=3))
    ws = torch.full((4 * 2 * 50 * 24,), float("nan"))
    cnt = torch.zeros(2 * 4 * 2, dtype=torch.int32)
    for rep in range(3):
        x = torch.randn(2, 50, 40)
        args = (x, w, b, None, None, None, None, None, 1, 3, 18, "none", None, "ieee")
        ref = K.conv1d_reference(*args)
        got, _ = K.launch_conv_gemm(x, w, b, None, None, None, None, None, cout=24, tout=50, stride=1, dilation=3,
                                    pad=18, act="none", write_pre=False, out_dtype=None, precision="ieee",
                                    config=cfg, out=poisoned(ref.shape, ref.dtype), scratch=(ws, cnt))
        check(got, ref, torch.float32, ("split scratch", rep))
        check(cnt.float(), torch.zeros(cnt.shape), torch.float32, ("counters reset", rep))
    """,
    "dwconv1d": """
    i = 0
    for dtype in (torch.float32, torch.bfloat16):
        for C, d, T, B in [(5, 1, 20, 1), (3, 9, 30, 2), (17, 3, 300, 1), (4, 9, 3, 3)]:
            w, b, dil, left = K.bake_dwconv1d(CausalConv1d(C, C, 7, dilation=d, groups=C))
            x, w, b = torch.randn(B, T, C).to(dtype), w.to(dtype), b.to(dtype)
            use_b, res, sc, sh, a, ib, act, _, odt = epilogue(i, C, T, B, dtype)
            args = (x, w, b if use_b else None, res, sc, sh, a, ib, dil, left, act, odt)
            ref = K.dwconv1d_reference(*args)
            got = K.dwconv1d_forward(*args, config=K.DwKernelConfig(64, 8, 4), out=poisoned(ref.shape, ref.dtype))
            check(got, ref, dtype, (C, d, T, B, act))
            i += 1
    """,
}


@pytest.fixture(scope="session")
def interpreted() -> dict:
    """Every kernel case in ONE child process (interpreter start-up dominates on a loaded machine), once per run
    (tests/conftest.py `computed_once`: the parametrized tests below may run on both xdist workers); returns
    {group: [failure, ...]} for the groups that ran to the end."""
    return computed_once("conv1d-interpreted", _run_interpreted)


def _run_interpreted() -> dict:
    body = ["import json"]
    for group, (case, dtype) in GROUPS.items():
        body.append(f"GROUP = {group!r}")
        if dtype:
            body.append(f"dtype = torch.{dtype}")
        body.append(textwrap.dedent(_CASES[case]))
        body.append(f"print('GROUP', json.dumps([{group!r}, FAILURES.get({group!r}, [])]), flush=True)")
    code = _HARNESS + "\n".join(body)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    done = {}
    for line in proc.stdout.splitlines():
        if line.startswith("GROUP "):
            g, failures = json.loads(line[6:])
            done[g] = failures
    done["_stderr"] = proc.stderr[-3000:]
    return done


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
@pytest.mark.parametrize("group", list(GROUPS))
def test_kernel_under_interpreter(interpreted, group):
    assert group in interpreted, f"the interpreter run stopped before {group}: {interpreted['_stderr']}"
    assert interpreted[group] == [], interpreted[group]


def _sm90_ptx(dtype: str, precision: str, tile: tuple[int, int, int, int, int], joint: bool = False) -> str:
    """The GEMM kernel compiled for sm_90 without a GPU (Triton's own ptxas), with a fused snake + residual +
    `pre` epilogue and 16-divisible channel counts, as the codec layers are specialised."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ttsaot.builder.kernels import conv1d as K

    bt, bn, br, warps, stages = tile
    names = [
        "x_ptr",
        "w_ptr",
        "bias_ptr",
        "res_ptr",
        "scale_ptr",
        "shift_ptr",
        "alpha_ptr",
        "ib_ptr",
        "out_ptr",
        "pre_ptr",
        "ws_ptr",
        "cnt_ptr",
        "B",
        "T",
        "CIN",
        "TOUT",
        "N",
        "COUT",
        "KSIZE",
        "DIL",
        "STRIDE",
        "PAD",
    ]
    sig = {n: ("i32" if n.isupper() else f"*{dtype}") for n in names}
    sig.update(alpha_ptr="*fp32", ib_ptr="*fp32", ws_ptr="*fp32", cnt_ptr="*i32")
    cons = dict(
        HAS_PHASES=False,
        JOINT_R=joint,
        HAS_BIAS=True,
        HAS_RES=True,
        HAS_AFFINE=False,
        ACT=1,
        WRITE_PRE=True,
        PRECISION=precision,
        UPCAST_DOT=False,
        FAST_SIN=dtype != "fp32",
        GPU_MATH=True,
        EMULATE_RNE=False,
        BLOCK_T=bt,
        BLOCK_N=bn,
        BLOCK_R=br,
        GROUP_T=8,
        SPLIT_K=1,
    )
    sig.update({k: "constexpr" for k in cons})
    div16 = [names.index(n) for n in names if n.endswith("_ptr") or n in ("CIN", "N", "COUT")]
    attrs = {(i,): [["tt.divisibility", 16]] for i in div16}
    src = ASTSource(fn=K._conv_gemm_jit, signature=sig, constexprs=cons, attrs=attrs)
    return triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages}
    ).asm["ptx"]


_PTX_CASES = [
    ("bf16", "ieee", (128, 128, 64, 8, 4), False, "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"),
    ("fp32", "tf32", (128, 128, 32, 8, 3), False, "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32"),
    ("fp32", "tf32x3", (64, 64, 32, 4, 4), False, "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32"),
    # a thin input (the DAC encoder's 1-channel wave): (tap, channel) pairs reduced jointly
    ("fp32", "tf32x3", (64, 64, 32, 4, 4), True, "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32"),
]


@pytest.fixture(scope="session")
def hopper_ptx() -> dict:
    """The sm_90 PTX of every `_PTX_CASES` kernel, compiled in ONE child process without TRITON_INTERPRET (which
    the suite sets, and under which Triton compiles nothing), once per run (`computed_once`); {} when Triton's
    NVIDIA backend is missing."""
    return computed_once("conv1d-hopper-ptx", _compile_hopper_ptx)


def _compile_hopper_ptx() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        return _compile_hopper_ptx_into(Path(tmp) / "ptx.json")


def _compile_hopper_ptx_into(out: Path) -> dict:
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        try:
            from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
        except Exception:
            json.dump({{}}, open({str(out)!r}, "w")); raise SystemExit(0)
        from tests.test_kernels_conv1d import _PTX_CASES, _sm90_ptx
        json.dump({{"|".join(map(str, c[:4])): _sm90_ptx(*c[:4]) for c in _PTX_CASES}}, open({str(out)!r}, "w"))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
@pytest.mark.parametrize("dtype,precision,tile,joint,mma", _PTX_CASES)
def test_channels_last_gemm_gets_hopper_tensor_cores(hopper_ptx, dtype, precision, tile, joint, mma):
    """On sm_90 the NLC kernel's dot is a wgmma (TF32 for fp32's "tf32"/"tf32x3") fed by 16-byte cp.async loads
    of the time-shifted input rows (a thin input's (tap, channel) gather excepted), and its output tile leaves in
    16-byte stores."""
    if not hopper_ptx:
        pytest.skip("needs Triton's NVIDIA backend (no GPU needed)")
    ptx = hopper_ptx["|".join(map(str, (dtype, precision, tile, joint)))]
    assert mma in ptx
    if not joint:
        assert "cp.async.cg.shared.global" in ptx and ", 0x10," in ptx
    assert "st.global.v4.b32" in ptx


_SYMBOLIC_EXPORT = textwrap.dedent("""
    import sys
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.export import Dim
    from ttsaot.builder.kernels.conv1d import ConvMeta
    from ttsaot.builder.kernels.conv_modules import KernelConv1d, KernelConvTranspose1d, KernelDwConv1d, SnakeNLC

    dtype, precision = getattr(torch, sys.argv[1]), sys.argv[2]
    with FakeTensorMode():
        cu = {"device": "cuda", "dtype": dtype}
        conv = KernelConv1d(torch.empty(48, 7, 32, **cu), torch.empty(48, **cu), ConvMeta(32, 48, 7, 1, 3, 18),
                            precision=precision)
        dw = KernelDwConv1d(torch.empty(7, 48, **cu), torch.empty(48, **cu), 1, 6)
        up = KernelConvTranspose1d(torch.empty(2, 16, 2, 48, **cu), torch.empty(16, **cu), precision=precision)
        snake = SnakeNLC(torch.empty(16, device="cuda"), torch.empty(16, device="cuda"))
        x = torch.empty(4, 300, 32, **cu)
    dims = ({0: Dim("batch", min=1, max=4), 1: Dim("frames", min=8, max=325)},)
    body = torch.nn.Sequential(conv, dw, up, snake)
    ep = torch.export.export(body, (x,), dynamic_shapes=dims, strict=False)
    print("RANGES", sorted((int(r.lower), int(r.upper)) for r in ep.range_constraints.values()))
""")


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
@pytest.mark.parametrize("dtype,precision", [("float32", "tf32x3"), ("bfloat16", "ieee")])
def test_cuda_export_keeps_batch_and_frames_symbolic(dtype, precision):
    """A dynamic-shape export of the CUDA ops (fake CUDA tensors: no GPU needed) keeps batch and frames symbolic:
    the launch-time tile pruning and split-K bound read size hints (`size_hint`) instead of guarding on the
    sizes, which specialised both axes to the example's values (seen on the H100 exporting code2wav). In a child
    process without TRITON_INTERPRET: the interpreter runs the autotuner itself instead of tracing the launch."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _SYMBOLIC_EXPORT, dtype, precision], env=env, capture_output=True, text=True, timeout=300
    )
    ranges = [line for line in proc.stdout.splitlines() if line.startswith("RANGES")]
    assert ranges == ["RANGES [(1, 4), (8, 325)]"], proc.stderr[-2000:]
