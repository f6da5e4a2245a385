"""SnakeBeta as the checkpoint stores it, and its baked form that calls `ttsaot::snake_beta`."""

from __future__ import annotations

import torch
from torch import nn

from ..kernels import snake_beta  # noqa: F401  (registers torch.ops.ttsaot.snake_beta)

SNAKE_EPS = 1e-9


class SnakeBeta(nn.Module):
    """y = x + 1/(exp(beta)+eps) · sin²(exp(alpha)·x); alpha, beta [C] log-scale (Qwen3-TTS / BigVGAN-v2).

    This eager form is the reference and recomputes exp() per call; `passes.bake.bake_snake` swaps it for
    BakedSnakeBeta before export."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = torch.exp(self.alpha)[None, :, None]
        beta = torch.exp(self.beta)[None, :, None]
        return x + (1.0 / (beta + SNAKE_EPS)) * torch.pow(torch.sin(x * alpha), 2)


class Snake1d(nn.Module):
    """DAC-lineage Snake with a LINEAR alpha [1,C,1] (Fish DAC, VoxCPM2 AudioVAE): x + (α + 1e-9)⁻¹ · sin²(α·x).

    The same function as SnakeBeta with alpha = α and inv_beta = 1/(α + eps), so it bakes to the same op."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (self.alpha + SNAKE_EPS).reciprocal() * torch.sin(self.alpha * x).pow(2)


class BakedSnakeBeta(nn.Module):
    """exp(alpha) and 1/(exp(beta)+eps) precomputed once, kept in fp32 whatever the compute dtype
    (`keep_fp32` is honoured by passes.cast.cast_to_compute_dtype)."""

    keep_fp32 = True

    def __init__(self, alpha_exp: torch.Tensor, inv_beta: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("alpha", alpha_exp.detach().float().contiguous())
        self.register_buffer("inv_beta", inv_beta.detach().float().contiguous())

    @classmethod
    def from_log_scale(cls, log_alpha: torch.Tensor, log_beta: torch.Tensor) -> BakedSnakeBeta:
        a = torch.exp(log_alpha.detach().double())
        ib = 1.0 / (torch.exp(log_beta.detach().double()) + SNAKE_EPS)
        return cls(a.float(), ib.float())

    @classmethod
    def from_linear(cls, alpha: torch.Tensor) -> BakedSnakeBeta:
        a = alpha.detach().flatten().float()
        return cls(a, (a + SNAKE_EPS).reciprocal())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.ttsaot.snake_beta(x, self.alpha, self.inv_beta)
