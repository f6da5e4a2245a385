"""`ttsaot::window_attention`: the Triton kernel (interpreter on CPU, compiled on a GPU) against the aten reference,
which is the eager window-limited transformer's SDPA call with its sliding-window mask: windows shorter than,
equal to and longer than T, T not a multiple of the tiles, heads 16/32/64/128, strided q/k/v views of one fused
projection, fp32 in each precision and bf16; one node under torch.export, the CPU lowering, errors; the Fish DAC
attention module's kernel path. The `gpu` tests: the DAC encoder's real shapes (864 tokens, window 512, 16 × 64)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ttsaot.builder.kernels import CPU_DECOMPOSITIONS, lower_for_cpu
from ttsaot.builder.kernels.window_attention import (
    KernelWindowAttention,
    launch_window_attention,
    sdpa_scale,
    supported,
    window_attention_reference,
)
from ttsaot.builder.layers.attention import sliding_window_causal_mask

from .conftest import rel_err
from .kernel_fixtures import DEVICE, ON_GPU, require_kernel_runtime

WA = torch.ops.ttsaot.window_attention.default


@pytest.fixture(autouse=True)
def _kernel_runtime():
    require_kernel_runtime()


def _qkv(B, T, H, D, dtype, seed=0, device=DEVICE):
    """q, k, v as the DAC attention has them: views of one fused [B, T, 3·H·D] projection (row stride 3·H·D)."""
    g = torch.Generator().manual_seed(seed)
    fused = torch.randn(B, T, 3 * H * D, generator=g).to(dtype).to(device)
    return tuple(t.view(B, T, H, D) for t in fused.split(H * D, dim=-1))


def _eager(q, k, v, window):
    """The eager module's path: [B, H, T, D], SDPA with the bool mask at its default scale, back to [B, T, H·D]."""
    B, T, H, D = q.shape
    mask = sliding_window_causal_mask(T, window, q.device)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    return o.transpose(1, 2).contiguous().view(B, T, H * D)


# (B, T, H, D, window): window < T, window ≥ T, one token, T not a multiple of 64, a window shorter than a tile
CASES = [(1, 100, 2, 64, 40), (2, 70, 3, 32, 128), (1, 1, 1, 16, 4), (1, 130, 2, 16, 7), (2, 65, 1, 128, 64)]


@pytest.mark.parametrize("precision", ["ieee", "tf32x3", "tf32"])
def test_fp32_kernel_matches_the_eager_attention(precision):
    for i, (B, T, H, D, window) in enumerate(CASES):
        q, k, v = _qkv(B, T, H, D, torch.float32, seed=i)
        o = launch_window_attention(q, k, v, window, sdpa_scale(D), precision)
        assert o.shape == (B, T, H * D) and o.dtype == torch.float32 and o.is_contiguous()
        ref = _eager(*(t.cpu() for t in (q, k, v)), window)
        tol = 2e-3 if precision == "tf32" else 1e-5
        assert rel_err(o.cpu(), ref) < tol, (precision, B, T, H, D, window)


def test_bf16_kernel_matches_the_reference():
    for i, (B, T, H, D, window) in enumerate(CASES[:3]):
        q, k, v = _qkv(B, T, H, D, torch.bfloat16, seed=i)
        o = launch_window_attention(q, k, v, window, sdpa_scale(D), "tf32x3")  # 16-bit: precision has no say
        assert o.dtype == torch.bfloat16
        ref = _eager(*(t.cpu().float() for t in (q, k, v)), window)
        assert rel_err(o.cpu().float(), ref) < (1e-2 if ON_GPU else 3e-2)  # CPU: truncating casts


def test_reference_is_the_eager_attention_and_the_window_matters():
    q, k, v = _qkv(2, 37, 3, 16, torch.float64, device="cpu")
    ref = window_attention_reference(q, k, v, 5, sdpa_scale(16), "tf32x3")
    assert rel_err(ref, _eager(q, k, v, 5)) < 1e-12
    assert rel_err(ref, _eager(q, k, v, 37)) > 1e-3  # a longer window is a different attention
    # query 0 sees only key 0: its output is v[:, 0]
    assert torch.allclose(ref[:, 0], v[:, 0].reshape(2, -1))


def test_op_is_one_export_node_and_lowers_for_cpu():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.att = KernelWindowAttention(16, 32, "tf32x3")

        def forward(self, fused):
            q, k, v = (t.view(1, 24, 2, 32) for t in fused.split(64, dim=-1))
            return self.att(q, k, v)

    fused = torch.randn(1, 24, 192)
    ep = torch.export.export(M(), (fused,))
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count(WA) == 1
    assert WA in CPU_DECOMPOSITIONS
    lowered = lower_for_cpu(ep)
    assert WA not in [n.target for n in lowered.graph.nodes]
    assert rel_err(lowered.module()(fused), M()(fused)) < 1e-6


def test_op_dispatch_support_and_errors():
    assert supported(64) and supported(16) and not supported(48) and not supported(8)
    q, k, v = _qkv(1, 9, 2, 48, torch.float32, device="cpu")  # head 48: the reference, any device
    assert rel_err(WA(q, k, v, 4, sdpa_scale(48), "tf32x3"), _eager(q, k, v, 4)) < 1e-6
    with pytest.raises(RuntimeError, match="window must be >= 1"):
        WA(q, k, v, 0, 0.1, "ieee")
    with pytest.raises(RuntimeError, match="precision must be one of"):
        WA(q, k, v, 4, 0.1, "fp8")
    with pytest.raises(RuntimeError, match=r"\[B, T, H, D\] alike"):
        WA(q, k[:, :8], v, 4, 0.1, "ieee")
    with pytest.raises(RuntimeError, match="share a float dtype"):
        WA(q, k.double(), v, 4, 0.1, "ieee")
    with pytest.raises(ValueError, match="precision must be one of"):
        KernelWindowAttention(4, 16, "bf16")


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs CUDA")
def test_gpu_dac_encoder_shapes():
    """864 tokens (a 10 s clip at the encoder's last block), window 512, 16 heads of 64, and the quantizer's
    window 128 at 216 tokens: tf32x3 at fp32 accuracy, through the op (the kernel path on CUDA)."""
    for T, window in ((864, 512), (216, 128)):
        q, k, v = _qkv(1, T, 16, 64, torch.float32, seed=T)
        o = WA(q, k, v, window, sdpa_scale(64), "tf32x3")
        ref = _eager(*(t.double() for t in (q, k, v)), window)
        assert rel_err(o.double(), ref) < 2e-6, T


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs CUDA")
def test_gpu_bf16_codec_decoder_shapes():
    """The bf16 decoders' transformers, which run on the op since it replaced their cuDNN SDPA: Fish's post-quantizer
    (16 × 64, window 128) at 16-200 tokens and B = 4, Qwen's pre-transformer (16 × 64, window 72) at 50 and 150
    tokens. The kernel's error against fp64 is no worse than PyTorch's own bf16 SDPA at the same inputs (× 1.5)."""
    for B, T, window in ((1, 16, 128), (1, 50, 128), (1, 128, 128), (1, 200, 128), (4, 50, 128), (1, 50, 72),
                         (2, 150, 72)):  # fmt: skip
        q, k, v = _qkv(B, T, 16, 64, torch.bfloat16, seed=T + window)
        o = WA(q, k, v, window, sdpa_scale(64), "ieee")
        ref = _eager(*(t.double() for t in (q, k, v)), window)
        sdpa = _eager(q, k, v, window)
        assert rel_err(o.double(), ref) <= 1.5 * rel_err(sdpa.double(), ref) + 1e-4, (B, T, window)
