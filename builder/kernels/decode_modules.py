"""Transformer blocks on the kernel layer: what a family's kernel pass puts in place of a layer's `Attention`,
`SwiGLU` and plain `nn.Linear` projections (StageSpec.kernel_passes). Decode steps (one token per row):

- `KernelAttention.decode_step(x, norm, ...)`: x + scale·o_proj(decode_attention(qkv_proj(norm(x)))) as three ops:
  skinny_linear (RMSNorm prologue) → decode_attention (q/k norm, RoPE, in-place cache write at each row's position,
  GQA over the cache) → skinny_linear (o_proj + residual epilogue); with TTSAOT_QKV_ATTENTION=1 at build time, a
  step of ≤ 2 rows over a cache of ≤ 64 positions (the predictors') fuses the first two into `qkv_attention`;
- `KernelSwiGLU.decode_step(x, norm, ...)`: x + scale·down(silu(gate)·up) (norm(x)) as two ops: skinny_linear
  (RMSNorm prologue, fused gate_up, SiLU·mul epilogue) → skinny_linear (down + residual epilogue).

Short bidirectional sequences (VoxCPM2's LocDiT and local encoder, M = rows × tokens):

- `KernelAttention.sequence(x, norm, cos, sin)`: skinny_linear (RMSNorm prologue) → sequence_attention (NeoX
  RoPE + the T × T bidirectional attention of every head in one launch; decode_attention is one query per row
  over a runtime-owned cache it writes in place) → skinny_linear (o_proj + residual epilogue);
- `KernelSwiGLU.decode_step` takes x [..., D] (skinny_linear flattens the leading dims into rows); its `sequence`
  form, like `KernelAttention.sequence`, takes the block's input already normalised and returns the output's next
  RMSNorm where the projection computes it (`residual_projection`: skinny_linear_norm_out where K is split);
- `KernelLinear`: any other projection (the stages' in/out projections, timestep MLPs); `normed(x, norm)` with
  a preceding RMSNorm as its prologue (the predictors' output heads).

skinny_linear runs its Triton kernels up to MAX_KERNEL_ROWS rows and aten above (decided per bucket at trace
time), so a bucket whose rows × tokens exceed it keeps cuBLAS with the same graph structure.

They hold the SAME child modules as the blocks they replace (qkv_proj, o_proj, q_norm/k_norm; gate_up_proj,
down_proj), so parameter names, hence the artifact's constant names and the weights a prefill and a step stage
share, do not change. Both need the fused projections (`passes.fuse_projections`, which every LM stage runs first).
Numerics: each op rounds where the eager modules round (skinny_linear.py, decode_attention.py); the one known
difference is the attention's fp32 scores (decode_attention.py), within every stage tolerance.
"""

from __future__ import annotations

import torch
from torch import nn

from ..layers.attention import Attention
from ..layers.mlp import SwiGLU
from ..layers.norms import RMSNorm
from .decode_attention import decode_attention
from .qkv_attention import enabled as fused_enabled
from .qkv_attention import fits as fused_fits
from .qkv_attention import qkv_attention
from .sequence_attention import sequence_attention
from .sequence_attention_o import enabled as attention_o_enabled
from .sequence_attention_o import fits as attention_o_fits
from .sequence_attention_o import sequence_attention_o
from .skinny_linear import norm_out_enabled, norm_out_pays, skinny_linear, skinny_linear_norm_out


class KernelAttention(nn.Module):
    def __init__(self, attn: Attention, rope_interleaved: bool = False) -> None:
        super().__init__()
        if attn.qkv_proj is None:
            raise ValueError("KernelAttention needs the fused qkv_proj (run passes.fuse_projections first)")
        self.n_heads, self.n_kv_heads, self.head_dim = attn.n_heads, attn.n_kv_heads, attn.head_dim
        self.qkv_proj, self.o_proj = attn.qkv_proj, attn.o_proj
        self.q_norm, self.k_norm = attn.q_norm, attn.k_norm
        self.rope_interleaved = rope_interleaved

    def decode_step(
        self,
        x: torch.Tensor,
        norm: RMSNorm,
        positions: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        layer: int,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        residual_scale: float = 1.0,
        workspace: torch.Tensor | None = None,
        cache_settled: bool = False,
    ) -> torch.Tensor:
        """x [B, D] → x + residual_scale · attention branch; this token's k/v written at (layer, b, :, positions[b]).
        cos/sin: the WHOLE tables [≥ cache positions, hd], fp32 or the compute dtype (the op picks each row's
        position and rotates in fp32), or None.
        workspace: the step's zeroed split-merge tickets (`attention_workspace`), shared by every layer (the op
        leaves it zeroed); None = the op zeroes one per call (one more launch per layer).
        cache_settled: the stage runs one decode step per call, so no earlier kernel of it writes the cache slots
        this step reads (decode_attention's promise; not a frame loop's)."""
        qn = kn = None
        qk_eps = 1e-6
        if self.q_norm is not None:
            qn, kn, qk_eps = self.q_norm.weight, self.k_norm.weight, self.q_norm.eps
        attention = (positions, k_cache, v_cache, layer, self.head_dim**-0.5, cos, sin, self.rope_interleaved, qn, kn)
        if fused_enabled() and fused_fits(x, k_cache):
            # (TTSAOT_QKV_ATTENTION=1: the projection and a short cache's attention in one launch)
            w = self.qkv_proj
            o = qkv_attention(x, w.weight, w.bias, norm.weight, norm.eps, *attention, qk_eps, workspace)
        else:
            qkv = skinny_linear(x, self.qkv_proj.weight, self.qkv_proj.bias, norm.weight, norm.eps)
            o = decode_attention(qkv, *attention, qk_eps, workspace, cache_settled)
        return self.project_out(o, x, residual_scale)

    def sequence(
        self,
        x: torch.Tensor,
        norm: RMSNorm,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        residual_scale: float = 1.0,
        x_normed: torch.Tensor | None = None,
        next_norm: RMSNorm | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Sequence form, bidirectional: x [B,T,D] → (x + residual_scale · o_proj(attention(rope(q), rope(k), v)),
        next_norm of it or None) as three ops: skinny_linear (RMSNorm prologue) → sequence_attention (NeoX RoPE at
        positions 0..T-1 with the fp32 tables cos/sin [≥ T, hd], or None; GQA) → skinny_linear (o_proj + residual
        epilogue). `x_normed`: norm(x) already computed (by the projection before, `residual_projection`): qkv
        without its prologue. `next_norm`: the RMSNorm the next block applies to the output, computed with it where
        that pays (`residual_projection`); where `sequence_attention_o` fits the call (CUDA, 16-32 rows: the
        LocDiT's) and TTSAOT_ATTENTION_O=1 at build time, the attention and o_proj are that one op, its second pass
        writing the output and next_norm of it."""
        if self.q_norm is not None or self.rope_interleaved:
            raise ValueError("KernelAttention.sequence: q/k norms and interleaved RoPE are not supported")
        qkv = _normed_projection(self.qkv_proj, x, norm, x_normed)
        heads = (self.n_heads, self.n_kv_heads, self.head_dim**-0.5)
        fused = norm_out_enabled() and attention_o_enabled() and attention_o_fits(qkv, self.n_heads, self.n_kv_heads)
        if next_norm is not None and fused:
            # the attention inside o_proj, whose second pass also writes next_norm of the output
            w = self.o_proj
            return sequence_attention_o(
                qkv, cos, sin, *heads, w.weight, w.bias, x, residual_scale, next_norm.weight, next_norm.eps
            )
        o = sequence_attention(qkv, cos, sin, *heads)
        return residual_projection(self.o_proj, o, x, residual_scale, next_norm)

    def project_out(self, o: torch.Tensor, x: torch.Tensor, residual_scale: float) -> torch.Tensor:
        """x + residual_scale · o_proj(o): one skinny_linear with the residual epilogue."""
        return residual_projection(self.o_proj, o, x, residual_scale, None)[0]


def _normed_projection(
    proj: nn.Linear, x: torch.Tensor, norm: RMSNorm, x_normed: torch.Tensor | None, gated: bool = False
) -> torch.Tensor:
    """proj(norm(x)): the norm as the projection's prologue, or taken from `x_normed` where it was computed."""
    if x_normed is not None:
        return skinny_linear(x_normed, proj.weight, proj.bias, gated=gated)
    return skinny_linear(x, proj.weight, proj.bias, norm.weight, norm.eps, gated=gated)


def residual_projection(
    proj: nn.Linear, h: torch.Tensor, x: torch.Tensor, residual_scale: float, next_norm: RMSNorm | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(y, next_norm(y) or None) for y = x + residual_scale · proj(h): with `next_norm` and where it pays
    (skinny_linear.norm_out_pays: the projection's K split, its second pass launched anyway) one
    skinny_linear_norm_out, whose second pass also writes the RMSNorm of y's rows, so the next projection runs
    without its prologue; else one skinny_linear (and None: the next projection normalises)."""
    if next_norm is not None and norm_out_pays(h, proj.weight):
        return skinny_linear_norm_out(h, proj.weight, proj.bias, x, residual_scale, next_norm.weight, next_norm.eps)
    return skinny_linear(h, proj.weight, proj.bias, residual=x, residual_scale=residual_scale), None


class KernelSwiGLU(nn.Module):
    def __init__(self, mlp: SwiGLU) -> None:
        super().__init__()
        if mlp.gate_up_proj is None:
            raise ValueError("KernelSwiGLU needs the fused gate_up_proj (run passes.fuse_projections first)")
        self.gate_up_proj, self.down_proj, self.hidden = mlp.gate_up_proj, mlp.down_proj, mlp.hidden

    def decode_step(self, x: torch.Tensor, norm: RMSNorm, residual_scale: float = 1.0) -> torch.Tensor:
        """x [..., D] (a step's [B, D], a sequence's [B, T, D]) → x + residual_scale · down(silu(gate)·up)(norm(x))."""
        return self.sequence(x, norm, residual_scale)[0]

    def sequence(
        self,
        x: torch.Tensor,
        norm: RMSNorm,
        residual_scale: float = 1.0,
        x_normed: torch.Tensor | None = None,
        next_norm: RMSNorm | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """decode_step's block on x [..., D] with `KernelAttention.sequence`'s x_normed / next_norm: (the output,
        next_norm of it or None)."""
        h = _normed_projection(self.gate_up_proj, x, norm, x_normed, gated=True)
        return residual_projection(self.down_proj, h, x, residual_scale, next_norm)


class KernelLinear(nn.Module):
    """An nn.Linear on skinny_linear: y = x @ Wᵀ + b over x [..., K]. It holds the Linear's own `weight` and
    `bias` parameters, so the parameter names (and the artifact's constants) do not change."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.register_parameter("bias", linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return skinny_linear(x, self.weight, self.bias)

    def normed(self, x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        """self(norm(x)) as one op: the RMSNorm is skinny_linear's prologue (a predictor's output head)."""
        return skinny_linear(x, self.weight, self.bias, norm.weight, norm.eps)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
