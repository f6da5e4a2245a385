"""`ttsaot::sequence_attention`: bidirectional attention over short sequences, RoPE included, in one launch.

    sequence_attention(qkv [N, T, (Hq + 2·Hkv)·hd], cos? [≥ T, hd] fp32, sin? [≥ T, hd] fp32, n_heads: int,
                       n_kv_heads: int, scale: float) -> o [N, T, Hq·hd]

`qkv` is the fused projection output of N sequences of T tokens (rows q ∣ k ∣ v, heads contiguous, as
`fuse_projections` builds it). Per sequence and query head j (kv head j // (Hq/Hkv), as repeat_interleave would):
q and k rotated by NeoX RoPE at positions 0..T-1 in fp32 with the fp32 tables, cast back to the compute dtype (the
eager `_rope` of VoxCPM2's MiniCPM layers); scores q·kᵀ in fp32 × scale over all T keys (no mask), softmax in fp32,
probabilities rounded to the compute dtype, · v accumulated in fp32, rounded once. None tables = no RoPE. The output
is laid out for o_proj ([N, T, Hq·hd], heads contiguous).

Why a kernel: VoxCPM2's LocDiT runs 9 estimator calls × 12 layers of this on 11 tokens per call, and its H100
profile (bench/results/nvidia-h100/profiles/voxcpm2__locdit__ttsaot.*) spent 10% of the call in cuDNN's SDPA and
another 9% in four Inductor kernels around it per layer (the rotation, the head transposes and the GQA expansion)
plus a memset: six launches of microseconds each where the work is a few KiB. One program per (sequence, query head)
does all of it.

The kernel runs for T ≤ MAX_TOKENS and power-of-2 head dims ≥ 16 (`supported`) on CUDA; elsewhere, and in CPU
builds / ONNX exports (the decomposition table), the op is its aten reference below. Functional (no mutation):
`torch.export` keeps it as one node."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..layers.rope import apply_rope_neox
from .common import HAVE_TRITON, next_power_of_2, no_wrap
from .decompositions import register_cpu_decomposition
from .pdl import kernels_wait

OP_NAME = "ttsaot::sequence_attention"
MAX_TOKENS = 64  # T_PAD × head_dim tiles of q, k, v and the T_PAD² scores stay in registers up to here


def supported(tokens: int, head_dim: int) -> bool:
    """Whether the Triton kernel takes these sizes (otherwise the op runs its aten reference)."""
    return 1 <= tokens <= MAX_TOKENS and head_dim >= 16 and head_dim & (head_dim - 1) == 0


def _heads(qkv: torch.Tensor, n_heads: int, n_kv_heads: int) -> int:
    return qkv.shape[-1] // (n_heads + 2 * n_kv_heads)


def sequence_attention_reference(
    qkv: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    n_heads: int,
    n_kv_heads: int,
    scale: float,
) -> torch.Tensor:
    """The op in aten."""
    N, T, _ = qkv.shape
    hd, dt = _heads(qkv, n_heads, n_kv_heads), qkv.dtype
    q, k, v = (
        qkv.reshape(N, T, n_heads + 2 * n_kv_heads, hd).transpose(1, 2).split((n_heads, n_kv_heads, n_kv_heads), dim=1)
    )  # [N, heads, T, hd]
    if cos is not None:
        c, s = cos[:T], sin[:T]
        q, k = apply_rope_neox(q.float(), c, s).to(dt), apply_rope_neox(k.float(), c, s).to(dt)
    acc = torch.promote_types(dt, torch.float32)  # float64 only in the builder's float64 pass-parity re-check
    group = n_heads // n_kv_heads
    k, v = k.repeat_interleave(group, dim=1).to(acc), v.repeat_interleave(group, dim=1).to(acc)
    probs = (torch.matmul(q.to(acc), k.transpose(-1, -2)) * scale).softmax(-1).to(dt).to(acc)
    return torch.matmul(probs, v).to(dt).transpose(1, 2).reshape(N, T, n_heads * hd)


def _check(qkv, cos, sin, n_heads: int, n_kv_heads: int) -> None:
    torch._check(
        qkv.dim() == 3 and n_heads > 0 and n_kv_heads > 0 and n_heads % n_kv_heads == 0,
        lambda: (
            f"sequence_attention: qkv must be [N, T, W] with Hq a multiple of Hkv, got {tuple(qkv.shape)}, "
            f"{n_heads}/{n_kv_heads} heads"
        ),
    )
    torch._check(
        qkv.shape[-1] % (n_heads + 2 * n_kv_heads) == 0,
        lambda: f"sequence_attention: width {qkv.shape[-1]} is not (Hq + 2·Hkv)·hd for {n_heads}/{n_kv_heads} heads",
    )
    torch._check(
        qkv.dtype in (torch.float32, torch.bfloat16, torch.float16) or (qkv.dtype == torch.float64 and not qkv.is_cuda),
        lambda: f"sequence_attention: unsupported dtype {qkv.dtype}",
    )
    torch._check((cos is None) == (sin is None), lambda: "sequence_attention: give cos and sin together")
    if cos is not None:
        hd, T = _heads(qkv, n_heads, n_kv_heads), qkv.shape[1]
        for t in (cos, sin):
            torch._check(
                t.dim() == 2
                and t.shape[0] >= T
                and t.shape[1] == hd
                and (t.dtype == torch.float32 or t.dtype == qkv.dtype == torch.float64)
                and t.is_contiguous(),
                lambda t=t: (
                    f"sequence_attention: rope tables must be contiguous fp32 [≥ {T}, {hd}], "
                    f"got {tuple(t.shape)} {t.dtype}"
                ),
            )


def launch_sequence_attention(
    qkv: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    n_heads: int,
    n_kv_heads: int,
    scale: float,
    *,
    wrap: Callable[[Any], Any] = no_wrap,
) -> torch.Tensor:
    """Run the Triton kernel (CUDA, or CPU under TRITON_INTERPRET=1) on sizes `supported` allows."""
    from . import sequence_attention_triton as kernels

    N, T, _ = qkv.shape
    hd = _heads(qkv, n_heads, n_kv_heads)
    qkv = qkv.contiguous()
    o = qkv.new_empty((N, T, n_heads * hd))
    wrap(kernels.sequence_attention_kernel)[(N, n_heads)](
        qkv,
        cos if cos is not None else qkv,
        sin if sin is not None else qkv,
        o,
        T,
        qkv.shape[-1],
        float(scale) * kernels.LOG2E,
        HQ=n_heads,
        HKV=n_kv_heads,
        HEAD_DIM=hd,
        T_PAD=max(16, next_power_of_2(T)),
        ROPE=0 if cos is None else 1,
        FP32_DOT=qkv.dtype == torch.float32 or qkv.device.type != "cuda",  # off-GPU = the interpreter
        PDL=kernels_wait(qkv.device),
        num_warps=4,
        num_stages=1,
    )
    return o


if HAVE_TRITON:

    @torch.library.triton_op(OP_NAME, mutates_args=())
    def sequence_attention(
        qkv: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        n_heads: int,
        n_kv_heads: int,
        scale: float,
    ) -> torch.Tensor:
        _check(qkv, cos, sin, n_heads, n_kv_heads)
        kernel = (
            qkv.device.type == "cuda"
            and qkv.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and supported(qkv.shape[1], _heads(qkv, n_heads, n_kv_heads))
        )
        if not kernel:  # also what a CPU compile traces: aten ops
            return sequence_attention_reference(qkv, cos, sin, n_heads, n_kv_heads, scale)
        return launch_sequence_attention(qkv, cos, sin, n_heads, n_kv_heads, scale, wrap=torch.library.wrap_triton)

else:

    @torch.library.custom_op(OP_NAME, mutates_args=())
    def sequence_attention(
        qkv: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        n_heads: int,
        n_kv_heads: int,
        scale: float,
    ) -> torch.Tensor:
        _check(qkv, cos, sin, n_heads, n_kv_heads)
        return sequence_attention_reference(qkv, cos, sin, n_heads, n_kv_heads, scale)

    @sequence_attention.register_fake
    def _(qkv, cos, sin, n_heads, n_kv_heads, scale):
        _check(qkv, cos, sin, n_heads, n_kv_heads)
        return qkv.new_empty((*qkv.shape[:2], n_heads * _heads(qkv, n_heads, n_kv_heads)))


register_cpu_decomposition(torch.ops.ttsaot.sequence_attention.default, sequence_attention_reference)
