"""`ttsaot::window_attention`: causal sliding-window attention (flash form) for the codecs' transformers.

    window_attention(q [B, T, H, D], k [B, T, H, D], v [B, T, H, D], window: int, scale: float, precision: str)
        -> o [B, T, H·D]

Key j is visible to query i iff i − window < j ≤ i (`layers.attention.sliding_window_causal_mask`); softmax(q·kᵀ ·
scale) · v per head. q, k, v may be strided views (the split of a fused qkv projection) with unit stride along D;
the output is laid out for the output projection ([B, T, H·D], heads contiguous), so the head transposes of the
eager path disappear with the attention mask it builds.

Why a kernel: the Fish DAC encoder's exact fp32 body (tf32x3 everywhere else) ran its 12 attentions in PyTorch's
fp32 memory-efficient kernel on the FMA units with a dense [T, T] mask: 4 × 152 µs at 864 tokens and 8 × 33 µs at
the quantizer's window, 0.87 ms of the 10 s clip's 16.2 ms call, plus two mask kernels per layer (H100 profile,
bench/results/nvidia-h100/profiles/fish-s2-pro__dac_encoder__ttsaot.*). Here a program owns BLOCK_M queries of one
head and visits only the key blocks its window reaches, with the products on the tensor cores.

Precision (fp32 inputs): `precision` is the tl.dot mode of both products: "tf32x3" (three TF32 products with error
compensation, ≈ fp32: what the exact codec bodies run everywhere), "tf32" or "ieee" (FMA). 16-bit inputs multiply
natively with fp32 accumulation and round the probabilities to their dtype before · v, as flash kernels do. The
softmax runs online in fp32 (exp2 of log2e-scaled scores). The CPU path, CPU builds and ONNX exports run the aten
reference below, which is the eager module's own SDPA call."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.attention import sliding_window_causal_mask
from .common import HAVE_TRITON, cdiv, no_wrap
from .conv1d import PRECISIONS
from .decompositions import register_cpu_decomposition

OP_NAME = "ttsaot::window_attention"
HEAD_DIMS = (16, 32, 64, 128)  # tl.dot's minimum, up to what one program's q/acc tiles hold in registers


def supported(head_dim: int) -> bool:
    """Whether the Triton kernel takes this head size (otherwise the op runs its aten reference)."""
    return head_dim in HEAD_DIMS


def sdpa_scale(head_dim: int) -> float:
    """SDPA's default scale, computed as it computes it (1 / sqrt(D), not D ** -0.5: they can differ by an ulp)."""
    return 1.0 / math.sqrt(head_dim)


def window_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, scale: float, precision: str
) -> torch.Tensor:
    """The op in aten: the eager transformers' SDPA with the sliding-window mask (precision is the kernel's)."""
    B, T, H, D = q.shape
    mask = sliding_window_causal_mask(T, window, q.device)
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale
    )
    return o.transpose(1, 2).reshape(B, T, H * D)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, precision: str) -> None:
    torch._check(
        q.dim() == 4 and k.shape == q.shape and v.shape == q.shape,
        lambda: f"window_attention: q, k, v must be [B, T, H, D] alike, got {q.shape}, {k.shape}, {v.shape}",
    )
    torch._check(
        q.dtype == k.dtype == v.dtype
        and (q.dtype in (torch.float32, torch.bfloat16, torch.float16) or (q.dtype == torch.float64 and not q.is_cuda)),
        lambda: f"window_attention: q, k, v must share a float dtype, got {q.dtype}, {k.dtype}, {v.dtype}",
    )
    torch._check(window >= 1, lambda: f"window_attention: window must be >= 1, got {window}")
    torch._check(precision in PRECISIONS, lambda: f"window_attention: precision must be one of {PRECISIONS}")


def launch_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    scale: float,
    precision: str,
    *,
    wrap: Callable[[Any], Any] = no_wrap,
) -> torch.Tensor:
    """Run the Triton kernel (CUDA, or CPU under TRITON_INTERPRET=1) on a head size `supported` allows."""
    from . import window_attention_triton as kernels

    B, T, H, D = q.shape
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    o = q.new_empty((B, T, H * D))
    on_gpu = q.device.type == "cuda"
    if on_gpu:
        kernel, tiles = kernels.window_attention_autotuned, {}
    else:
        kernel, tiles = kernels.window_attention_kernel, kernels.interpreter_tiles(D)

    def grid(meta):
        return (cdiv(T, meta["BLOCK_M"]), B * H)

    wrap(kernel)[grid](
        q,
        k,
        v,
        o,
        T,
        H,
        window,
        float(scale) * kernels.LOG2E,
        *q.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        HEAD_DIM=D,
        PRECISION=precision if q.dtype == torch.float32 else "ieee",
        # the interpreter multiplies 16-bit operands as raw integers: their exact fp32 products there
        FP32_DOT=q.dtype == torch.float32 or not on_gpu,
        **tiles,
    )
    return o


if HAVE_TRITON:

    @torch.library.triton_op(OP_NAME, mutates_args=())
    def window_attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, scale: float, precision: str
    ) -> torch.Tensor:
        _check(q, k, v, window, precision)
        kernel = q.device.type == "cuda" and q.dtype != torch.float64 and supported(q.shape[-1])
        if not kernel:  # also what a CPU compile traces: aten ops
            return window_attention_reference(q, k, v, window, scale, precision)
        return launch_window_attention(q, k, v, window, scale, precision, wrap=torch.library.wrap_triton)

else:

    @torch.library.custom_op(OP_NAME, mutates_args=())
    def window_attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, scale: float, precision: str
    ) -> torch.Tensor:
        _check(q, k, v, window, precision)
        return window_attention_reference(q, k, v, window, scale, precision)

    @window_attention.register_fake
    def _(q, k, v, window, scale, precision):
        _check(q, k, v, window, precision)
        return q.new_empty((*q.shape[:2], q.shape[2] * q.shape[3]))


register_cpu_decomposition(torch.ops.ttsaot.window_attention.default, window_attention_reference)


class KernelWindowAttention(nn.Module):
    """The attention core of a window-limited transformer layer on `ttsaot::window_attention`: (q, k, v) [B, T, H, D]
    after RoPE → [B, T, H·D], in place of transpose → SDPA(mask) → transpose. The precision is the stage body's fp32
    GEMM mode (the exact codec bodies: "tf32x3"; 16-bit bodies multiply natively whatever it says). `scale`: the
    module's own where it computes it differently from SDPA's default (`sdpa_scale`)."""

    def __init__(self, window: int, head_dim: int, precision: str, scale: float | None = None) -> None:
        super().__init__()
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        self.window, self.precision = int(window), precision
        self.scale = sdpa_scale(head_dim) if scale is None else float(scale)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.ops.ttsaot.window_attention(q, k, v, self.window, self.scale, self.precision)

    def extra_repr(self) -> str:
        return f"window={self.window}, precision={self.precision}"


def install_window_kernels(
    owners: Iterable[nn.Module], window: int, head_dim: int, precision: str, scale: float | None = None
) -> int:
    """Put the attention core of each owner (a module with a `window_kernel` hook, None = its SDPA path) on
    `ttsaot::window_attention`; returns how many. Every precision of a kernels=ttsaot codec body, bf16 included:
    PyTorch's masked bf16 SDPA runs cuDNN's attention on CUDA, which sets itself up per new shape in each
    package's first call (858.6 of a 902 ms first call on an H200, 50-140 ms of each DAC decoder bucket's warm-up
    at load: bench/results/nvidia-h200/probes/first_call_cost/), where this op is one Triton launch with nothing to
    set up that visits only the window's key blocks."""
    n = 0
    for owner in owners:
        owner.window_kernel = KernelWindowAttention(window, head_dim, precision, scale)
        n += 1
    return n
