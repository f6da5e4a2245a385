"""Rotary position tables and their two layouts.

Tables are computed at build time in fp32 and stored as buffers, so the exported graph only slices them; the
serving process never builds them.
"""

from __future__ import annotations

import torch


def rope_table(
    head_dim: int, max_positions: int, theta: float, scale_factors: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [max_positions, head_dim] in the NeoX (rotate-half) layout: freqs repeated twice.

    `scale_factors` ([head_dim/2]) divides the inverse frequencies (LongRoPE short factors)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scale_factors is not None:
        inv_freq = inv_freq / scale_factors.float()
    pos = torch.arange(max_positions, dtype=torch.int64).float()
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., T, D]; cos/sin broadcastable [T, D] already in the dtype the reference computes in."""
    return x * cos + _rotate_half(x) * sin


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GPT-J / complex-pair layout: pairs (x[2i], x[2i+1]) rotate by angle i. cos/sin are [T, D/2]."""
    xr = x.unflatten(-1, (-1, 2))
    x0, x1 = xr[..., 0], xr[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1)
    return out.flatten(-2)


def rope_table_interleaved(
    head_dim: int, max_positions: int, theta: float, round_to: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [max_positions, head_dim/2] for `apply_rope_interleaved` (one angle per pair).

    `round_to=torch.bfloat16` rounds the fp32 tables to bf16 precision (kept as fp32 values): vLLM-Omni does this
    for every Fish rope cache ("fp32 RoPE causes logit divergence"), and it makes a later bf16 cast lossless."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.int64).float(), inv_freq)
    cos, sin = freqs.cos(), freqs.sin()
    if round_to is not None:
        cos, sin = cos.to(round_to).float(), sin.to(round_to).float()
    return cos, sin
