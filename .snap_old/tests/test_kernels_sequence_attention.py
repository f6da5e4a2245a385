"""`ttsaot::sequence_attention`: the Triton kernel (interpreter on CPU, compiled on a GPU) against the aten reference
and against the eager MiniCPM path it replaces (fp32 RoPE → SDPA with repeated kv heads): GQA ratios 1/2/8, head
dims 16/32/128, T = 1, 5, 11 (VoxCPM2's local encoder / LocDiT), 16 and 17 (padding to 32), no RoPE, N not a power of
two; one node under torch.export and the CPU lowering; errors. The `gpu` tests: LocDiT's real shapes in bf16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ttsaot.builder.kernels import CPU_DECOMPOSITIONS, lower_for_cpu
from ttsaot.builder.kernels.sequence_attention import (
    launch_sequence_attention,
    sequence_attention,
    sequence_attention_reference,
    supported,
)
from ttsaot.builder.layers.rope import apply_rope_neox, rope_table

from .conftest import rel_err
from .kernel_fixtures import DEVICE, ON_GPU, require_kernel_runtime

SA = torch.ops.ttsaot.sequence_attention.default


@pytest.fixture(autouse=True)
def _kernel_runtime():
    require_kernel_runtime()


def _case(N, T, hq, hkv, hd, dtype, rope=True, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(N, T, (hq + 2 * hkv) * hd, generator=g).to(dtype).to(device)
    cos = sin = None
    if rope:
        factors = 1.0 + torch.rand(hd // 2, generator=g) * 0.5  # LongRoPE-style per-frequency factors
        cos, sin = rope_table(hd, T + 3, 10000.0, scale_factors=factors)  # tables may be longer than T
        cos, sin = cos.to(device), sin.to(device)
    return qkv, cos, sin


def _eager(qkv, cos, sin, hq, hkv):
    """VoxCPM2's MiniCPM attention as the eager module computes it (fp32 RoPE, repeat_interleave, SDPA)."""
    N, T, _ = qkv.shape
    hd = qkv.shape[-1] // (hq + 2 * hkv)
    q, k, v = qkv.view(N, T, hq + 2 * hkv, hd).transpose(1, 2).split((hq, hkv, hkv), dim=1)
    if cos is not None:
        q = apply_rope_neox(q.float(), cos[:T], sin[:T]).to(qkv.dtype)
        k = apply_rope_neox(k.float(), cos[:T], sin[:T]).to(qkv.dtype)
    k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, scale=hd**-0.5)
    return o.transpose(1, 2).reshape(N, T, hq * hd)


CONFIGS = [(3, 11, 4, 2, 32), (2, 5, 6, 3, 16), (1, 1, 2, 1, 16), (5, 16, 8, 1, 16), (2, 17, 4, 4, 32)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rope", [True, False], ids=["neox", "norope"])
def test_kernel_matches_reference_and_the_eager_attention(rope, dtype):
    for i, (N, T, hq, hkv, hd) in enumerate(CONFIGS):
        qkv, cos, sin = _case(N, T, hq, hkv, hd, dtype, rope, seed=i)
        o = launch_sequence_attention(qkv, cos, sin, hq, hkv, hd**-0.5)
        ref = sequence_attention_reference(qkv, cos, sin, hq, hkv, hd**-0.5)
        assert o.shape == (N, T, hq * hd) and o.dtype == dtype
        tol = 1e-5 if dtype == torch.float32 else (1e-2 if ON_GPU else 3e-2)  # CPU: truncating casts
        assert rel_err(o.cpu().float(), ref.cpu().float()) < tol, (N, T, hq, hkv, hd)
        eager = _eager(qkv.cpu(), *(t.cpu() if t is not None else None for t in (cos, sin)), hq, hkv)
        assert rel_err(ref.cpu().float(), eager.float()) < (1e-5 if dtype == torch.float32 else 1e-2)


def test_reference_equals_the_eager_attention_in_fp64():
    """Exact math check of the reference (no rounding to speak of): fp64 scores and probabilities."""
    qkv, cos, sin = _case(3, 11, 16, 2, 128, torch.float64, device="cpu")
    ref = sequence_attention_reference(qkv, cos.double(), sin.double(), 16, 2, 128**-0.5)
    assert rel_err(ref, _eager(qkv, cos.double(), sin.double(), 16, 2)) < 1e-12


def test_op_dispatch_and_support_gate():
    assert supported(11, 128) and supported(64, 16) and not supported(65, 128) and not supported(11, 12)
    qkv, cos, sin = _case(2, 5, 4, 2, 12, torch.float32, device="cpu")  # head_dim 12: the reference everywhere
    assert torch.equal(
        sequence_attention(qkv, cos, sin, 4, 2, 0.3), sequence_attention_reference(qkv, cos, sin, 4, 2, 0.3)
    )
    assert SA in CPU_DECOMPOSITIONS


def test_shape_and_table_errors():
    qkv, cos, sin = _case(2, 5, 4, 2, 16, torch.float32, device="cpu")
    with pytest.raises(RuntimeError, match="give cos and sin together"):
        sequence_attention(qkv, cos, None, 4, 2, 0.25)
    with pytest.raises(RuntimeError, match="rope tables must be contiguous fp32"):
        sequence_attention(qkv, cos[:4], sin[:4], 4, 2, 0.25)  # shorter than T
    with pytest.raises(RuntimeError, match="rope tables must be contiguous fp32"):
        sequence_attention(qkv, cos.double(), sin.double(), 4, 2, 0.25)  # fp64 tables only for a fp64 qkv
    with pytest.raises(RuntimeError, match="is not"):
        sequence_attention(qkv[..., :-1], cos, sin, 4, 2, 0.25)
    with pytest.raises(RuntimeError, match="multiple"):
        sequence_attention(qkv, cos, sin, 3, 2, 0.25)


class _Block(torch.nn.Module):
    def __init__(self, hq=4, hkv=2, hd=16, T=5):
        super().__init__()
        cos, sin = rope_table(hd, T, 10000.0)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)
        self.hq, self.hkv, self.hd = hq, hkv, hd

    def forward(self, qkv):
        return sequence_attention(qkv, self.cos, self.sin, self.hq, self.hkv, self.hd**-0.5) * 2


def test_export_keeps_one_node_and_cpu_lowering_is_the_reference():
    m = _Block()
    qkv = torch.randn(3, 5, 8 * 16)
    ep = torch.export.export(m, (qkv,), strict=False)
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count(SA) == 1
    lowered = lower_for_cpu(ep)
    assert not any("ttsaot" in str(n.target) for n in lowered.graph.nodes if n.op == "call_function")
    assert torch.allclose(lowered.module()(qkv), m(qkv), atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("N,T", [(2, 11), (32, 11), (1, 5), (16, 5)])  # LocDiT B=1/16 (CFG doubles), encoder B=1/16
def test_gpu_locdit_shapes_bf16(N, T):
    qkv, cos, sin = _case(N, T, 16, 2, 128, torch.bfloat16, seed=N)
    o = sequence_attention(qkv, cos, sin, 16, 2, 128**-0.5)
    ref = sequence_attention_reference(qkv, cos, sin, 16, 2, 128**-0.5)
    assert rel_err(o.float(), ref.float()) < 1e-2
    assert rel_err(o.float(), _eager(qkv, cos, sin, 16, 2).float()) < 1e-2
    assert torch.equal(o, sequence_attention(qkv, cos, sin, 16, 2, 128**-0.5))  # deterministic
