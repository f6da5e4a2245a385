"""`ttsaot::snake_beta` and its channels-last form `ttsaot::snake_beta_nlc`: numerics, one node under torch.export,
CPU decomposition, Triton kernels (interpreter)."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from ttsaot.builder.kernels.snake_beta import (
    CPU_DECOMPOSITIONS,
    HAVE_TRITON,
    snake_beta_nlc_reference,
    snake_beta_reference,
)
from ttsaot.builder.layers import BakedSnakeBeta, SnakeBeta


def _module_pair(C=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    eager = SnakeBeta(C)
    with torch.no_grad():
        eager.alpha.copy_(torch.randn(C, generator=g) * 0.5)
        eager.beta.copy_(torch.randn(C, generator=g) * 0.5)
    return eager, BakedSnakeBeta.from_log_scale(eager.alpha, eager.beta)


def test_baked_op_matches_eager_formula():
    eager, baked = _module_pair()
    x = torch.randn(3, 6, 257) * 4
    torch.testing.assert_close(baked(x), eager(x), rtol=1e-5, atol=1e-5)


def test_op_keeps_fp32_scalars_and_input_dtype():
    _, baked = _module_pair()
    x = torch.randn(2, 6, 50).bfloat16()
    y = baked(x)
    assert y.dtype == torch.bfloat16 and baked.alpha.dtype == torch.float32
    ref = snake_beta_reference(x, baked.alpha, baked.inv_beta)
    assert torch.equal(y, ref)


def test_export_keeps_one_node_and_cpu_decomposes_to_aten():
    _, baked = _module_pair()
    x = torch.randn(1, 6, 32)
    ep = torch.export.export(baked, (x,), strict=False)
    ops = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert ops.count(torch.ops.ttsaot.snake_beta.default) == 1
    table = torch.export.default_decompositions()
    table.update(CPU_DECOMPOSITIONS)
    dec = ep.run_decompositions(table)
    targets = {str(n.target) for n in dec.graph.nodes if n.op == "call_function"}
    assert not any("ttsaot" in t for t in targets)
    assert any("sin" in t for t in targets)
    torch.testing.assert_close(dec.module()(x), baked(x))


def test_nlc_op_is_the_transposed_snake_and_exports_as_one_node():
    _, baked = _module_pair()
    x = torch.randn(2, 6, 40) * 3
    xn = x.transpose(1, 2).contiguous()
    y = torch.ops.ttsaot.snake_beta_nlc(xn, baked.alpha, baked.inv_beta)
    assert y.shape == (2, 40, 6) and torch.equal(y, snake_beta_nlc_reference(xn, baked.alpha, baked.inv_beta))
    torch.testing.assert_close(y, baked(x).transpose(1, 2), rtol=0, atol=0)
    yb = torch.ops.ttsaot.snake_beta_nlc(xn.bfloat16(), baked.alpha, baked.inv_beta)
    assert yb.dtype == torch.bfloat16 and torch.equal(yb, baked(x.bfloat16()).transpose(1, 2))

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.ttsaot.snake_beta_nlc(x, baked.alpha, baked.inv_beta)

    ep = torch.export.export(M(), (xn,), strict=False)
    ops = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert ops.count(torch.ops.ttsaot.snake_beta_nlc.default) == 1
    table = torch.export.default_decompositions()
    table.update(CPU_DECOMPOSITIONS)
    dec = ep.run_decompositions(table)
    assert not any("ttsaot" in str(n.target) for n in dec.graph.nodes if n.op == "call_function")
    torch.testing.assert_close(dec.module()(xn), y)
    with pytest.raises(RuntimeError, match="alpha must be"):
        torch.ops.ttsaot.snake_beta_nlc(x, baked.alpha, baked.inv_beta)  # NCL given: C is the last dim


def test_shape_errors():
    _, baked = _module_pair()
    with pytest.raises(RuntimeError, match="x \\[B,C,T\\]"):
        torch.ops.ttsaot.snake_beta(torch.randn(6, 10), baked.alpha, baked.inv_beta)
    with pytest.raises(RuntimeError, match="alpha must be"):
        torch.ops.ttsaot.snake_beta(torch.randn(1, 5, 10), baked.alpha, baked.inv_beta)


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
def test_triton_kernel_under_interpreter():
    # TRITON_INTERPRET must be set before triton is imported: run in a child process.
    code = textwrap.dedent("""
        import torch
        from ttsaot.builder.kernels.snake_beta import (launch_snake_beta_kernel, launch_snake_beta_nlc_kernel,
                                                       snake_beta_nlc_reference, snake_beta_reference)
        torch.manual_seed(0)
        for dtype, tol in ((torch.float32, 2e-6), (torch.bfloat16, 1e-2)):
            for T in (1, 1000, 2500):          # tails shorter than, equal-ish to, and beyond one block
                x = (torch.randn(2, 3, T) * 3).to(dtype)
                a, ib = torch.rand(3) + 0.5, torch.rand(3)
                y = launch_snake_beta_kernel(x, a, ib, block=1024)
                r = snake_beta_reference(x, a, ib)
                assert y.dtype == dtype and y.shape == x.shape
                err = ((y.double() - r.double()).norm() / r.double().norm()).item()
                assert err < tol, (dtype, T, err)
                # channels-last: row and channel tails (C = 19 over 8-channel tiles)
                xn = (torch.randn(2, T, 19) * 3).to(dtype)
                a, ib = torch.rand(19) + 0.5, torch.rand(19)
                y = launch_snake_beta_nlc_kernel(xn, a, ib, block=(64, 8))
                r = snake_beta_nlc_reference(xn, a, ib)
                assert y.dtype == dtype and y.shape == xn.shape
                err = ((y.double() - r.double()).norm() / r.double().norm()).item()
                assert err < tol, ("nlc", dtype, T, err)
        print("ok")
    """)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")
