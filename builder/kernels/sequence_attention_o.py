"""`ttsaot::sequence_attention_o`: a layer's bidirectional attention computed inside its o_proj, in one launch, and
o_proj's residual output with its next RMSNorm from the second pass.

    sequence_attention_o(qkv [N, T, (Hq + 2·Hkv)·hd], cos? [≥ T, hd] fp32, sin?, n_heads: int, n_kv_heads: int,
                         scale: float, weight [D, Hq·hd], bias? [D], residual [N, T, D], residual_scale: float,
                         out_norm_weight [D], out_norm_eps: float) -> (y [N, T, D], yn [N, T, D])

is, by definition (the aten reference below),

    o = sequence_attention(qkv, cos, sin, n_heads, n_kv_heads, scale)
    y, yn = skinny_linear_norm_out(o, weight, bias, residual, residual_scale, out_norm_weight, out_norm_eps)

with every rounding of those two ops (o per head in the compute dtype, y as F.linear + residual rounds, yn as the
tile form's RMSNorm prologue rounds); only the fp32 sums over o_proj's K run in another order (head by head).

Why (issue 14): VoxCPM2's LocDiT runs 108 layer passes per b1 call of qkv → sequence_attention (4.48 µs a launch on
the H200 for a few KiB of work) → o_proj (4.93 µs for 4 MiB of W, split in 2) → its second pass; the attention is a
dependency step of its own between two projections. Here each o_proj program computes its own heads' attention
from the qkv rows (sequence_attention_o_triton.py), so the layer has one launch and one wait fewer. (Figures: the
committed H200 profile, bench/results/nvidia-h200/profiles/voxcpm2__locdit__ttsaot.txt.) It does not pay, so layers
trace it only with ENV=1: on an H100 (bench/results/nvidia-h100/probes/attention_o_ab/) a LocDiT layer's qkv → op
took 17.02-22.81 µs over the probe's sweep (the plan's 17.46) against 15.65 for qkv → attention → o_proj, and the
stage's graph replays 3,829.7 µs with it against 3,828.3 without (5 alternating rounds of two verified builds).

The kernel runs on CUDA where `fits` holds (every row of the call in one tile: rows ≤ MAX_ROWS; power-of-2 head dims
16-128; Hq divisible by the plan's split) and the call's rows are at least skinny_linear.NORM_OUT_MIN_ROWS (below
that the layer keeps the chain, whose o_proj then needs no second pass); elsewhere, and in CPU builds / ONNX
exports, the op is its aten reference. Functional: `torch.export` keeps it as one node."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from .common import HAVE_TRITON, cdiv, next_power_of_2, no_wrap, size_hint
from .decompositions import register_cpu_decomposition
from .pdl import kernels_wait
from .sequence_attention import _check as _check_attention
from .sequence_attention import _heads, sequence_attention_reference
from .skinny_linear import (
    NORM_OUT_MIN_ROWS,
    _check_norm_out,
    launch_norm_out_pass,
    skinny_linear_norm_out_reference,
)

OP_NAME = "ttsaot::sequence_attention_o"
# TTSAOT_ATTENTION_O=1 at build time: the LocDiT layers trace this op where it fits; =0 (the default: the H100 A/B
# found no gain, above): they keep the attention → o_proj chain. A package-key switch (package_cache).
ENV = "TTSAOT_ATTENTION_O"
DEFAULT = "0"
METADATA_KEY = "ttsaot_attention_o"  # "1" / "0" in each package's metadata: whether it was traced with the switch on
MAX_ROWS = 32  # N·T rows in one [BLOCK_M, BLOCK_M] score tile and one BLOCK_M row tile of the product
MAX_HEAD_DIM = 128  # q, k, v [BLOCK_M, hd] and the W tile [BLOCK_N, hd] of one head stay in registers


def plan(n_heads: int) -> tuple[int, int, int]:
    """(head ranges SPLIT, BLOCK_N, warps): one head a program (an sm_90 compile of two or more heads a program at
    the LocDiT's shape took 255 registers and spilled; this one compiles without spills). BLOCK_N 64 and 4 warps: the
    H100 sweep of bench/probes/attention_o_fused.py (splits 8 / 16, BLOCK_N 32 / 64, 4 / 8 warps) had 4 warps at
    BLOCK_N 64 within 0.44 µs of its best (17.02 µs a layer at 8 head ranges) and 8 warps at BLOCK_N 32 the slowest
    (22.3-22.8); none reached the chain's 15.65."""
    return n_heads, 64, 4


def enabled() -> bool:
    """Whether layers may trace the op (ENV, read at trace time)."""
    return os.environ.get(ENV, DEFAULT) == "1"


def fits(qkv: torch.Tensor, n_heads: int, n_kv_heads: int) -> bool:
    """Whether the kernel takes this call (static per bucket: decided at trace time)."""
    rows = size_hint(qkv.shape[0] * qkv.shape[1])
    hd = _heads(qkv, n_heads, n_kv_heads)
    split = plan(n_heads)[0]
    return (
        qkv.device.type == "cuda"
        and qkv.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and NORM_OUT_MIN_ROWS <= rows <= MAX_ROWS
        and 16 <= hd <= MAX_HEAD_DIM
        and hd & (hd - 1) == 0
        and n_heads % split == 0
    )


def sequence_attention_o_reference(
    qkv: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    n_heads: int,
    n_kv_heads: int,
    scale: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    residual_scale: float,
    out_norm_weight: torch.Tensor,
    out_norm_eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op in aten: the two ops' references, one after the other."""
    o = sequence_attention_reference(qkv, cos, sin, n_heads, n_kv_heads, scale)
    return skinny_linear_norm_out_reference(o, weight, bias, residual, residual_scale, out_norm_weight, out_norm_eps)


def _check(qkv, cos, sin, n_heads, n_kv_heads, weight, bias, residual, out_norm_weight) -> None:
    _check_attention(qkv, cos, sin, n_heads, n_kv_heads)
    k = n_heads * _heads(qkv, n_heads, n_kv_heads)
    torch._check(
        weight.dim() == 2 and weight.shape[1] == k,
        lambda: f"sequence_attention_o: weight must be [D, {k}] (Hq·hd), got {tuple(weight.shape)}",
    )
    torch._check(
        residual.shape == (*qkv.shape[:2], weight.shape[0]),
        lambda: (
            f"sequence_attention_o: residual must be [{qkv.shape[0]}, {qkv.shape[1]}, {weight.shape[0]}], "
            f"got {tuple(residual.shape)}"
        ),
    )
    # o_proj's operand as a meta tensor (no memory): the rest are skinny_linear_norm_out's checks
    o = torch.empty((*qkv.shape[:2], k), dtype=qkv.dtype, device="meta")
    _check_norm_out(o, weight, bias, residual, out_norm_weight)


def launch_sequence_attention_o(
    qkv: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    n_heads: int,
    n_kv_heads: int,
    scale: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    residual_scale: float,
    out_norm_weight: torch.Tensor,
    out_norm_eps: float,
    *,
    wrap: Callable[[Any], Any] = no_wrap,
    config: tuple[int, int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the kernel and the second pass (CUDA, or CPU under TRITON_INTERPRET=1) on a call `fits` allows, at
    `config` ((SPLIT, BLOCK_N, warps): the bench's sweep and the interpreter tests) or the plan."""
    from . import sequence_attention_o_triton as kernels
    from .sequence_attention_triton import LOG2E

    N, T, width = qkv.shape
    m = N * T
    n_out, k = weight.shape
    split, block_n, warps = config or plan(n_heads)
    qkv2 = qkv.reshape(m, width).contiguous()
    r2 = residual.reshape(m, n_out).contiguous()
    y = r2.new_empty((m, n_out))
    part = qkv2.new_empty((split, m, n_out), dtype=torch.float32) if split > 1 else y
    has_bias = bias is not None
    wrap(kernels.sequence_attention_o_kernel)[(cdiv(n_out, block_n), split)](
        qkv2, cos if cos is not None else qkv2, sin if sin is not None else qkv2, weight, bias if has_bias else r2,
        r2, y, part, m, T, width, n_out, k, float(scale) * LOG2E, float(residual_scale),
        HQ=n_heads, HKV=n_kv_heads, HEAD_DIM=k // n_heads, HEADS_PER_SPLIT=n_heads // split, SPLIT=split,
        ROPE=0 if cos is None else 1, HAS_BIAS=has_bias,
        FP32_DOT=qkv.dtype == torch.float32 or qkv.device.type != "cuda",  # off-GPU = the interpreter
        PDL=kernels_wait(qkv.device), BLOCK_M=max(16, next_power_of_2(m)), BLOCK_N=block_n, num_warps=warps,
        num_stages=2,
    )  # fmt: skip
    yn = launch_norm_out_pass(part, bias, r2, residual_scale, out_norm_weight, out_norm_eps, y, split, wrap=wrap)
    return y.reshape(residual.shape), yn.reshape(residual.shape)


if HAVE_TRITON:

    @torch.library.triton_op(OP_NAME, mutates_args=())
    def sequence_attention_o(
        qkv: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        n_heads: int,
        n_kv_heads: int,
        scale: float,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        residual: torch.Tensor,
        residual_scale: float,
        out_norm_weight: torch.Tensor,
        out_norm_eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        args = (qkv, cos, sin, n_heads, n_kv_heads, scale, weight, bias, residual, residual_scale)
        _check(qkv, cos, sin, n_heads, n_kv_heads, weight, bias, residual, out_norm_weight)
        if not fits(qkv, n_heads, n_kv_heads):  # also what a CPU compile traces: aten ops
            return sequence_attention_o_reference(*args, out_norm_weight, out_norm_eps)
        return launch_sequence_attention_o(*args, out_norm_weight, out_norm_eps, wrap=torch.library.wrap_triton)

else:

    @torch.library.custom_op(OP_NAME, mutates_args=())
    def sequence_attention_o(
        qkv: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        n_heads: int,
        n_kv_heads: int,
        scale: float,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        residual: torch.Tensor,
        residual_scale: float,
        out_norm_weight: torch.Tensor,
        out_norm_eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check(qkv, cos, sin, n_heads, n_kv_heads, weight, bias, residual, out_norm_weight)
        args = (qkv, cos, sin, n_heads, n_kv_heads, scale, weight, bias, residual, residual_scale)
        return sequence_attention_o_reference(*args, out_norm_weight, out_norm_eps)

    @sequence_attention_o.register_fake
    def _(qkv, cos, sin, n_heads, n_kv_heads, scale, weight, bias, residual, residual_scale, out_norm_weight, eps):
        _check(qkv, cos, sin, n_heads, n_kv_heads, weight, bias, residual, out_norm_weight)
        return torch.empty_like(residual), torch.empty_like(residual)


register_cpu_decomposition(torch.ops.ttsaot.sequence_attention_o.default, sequence_attention_o_reference)
