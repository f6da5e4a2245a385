from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """HF/Qwen/MiniCPM RMSNorm: variance in fp32, normalised value cast back to the input dtype, then × weight."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


class LayerScale(nn.Module):
    """Per-channel residual scale (checkpoint name `scale`)."""

    def __init__(self, dim: int, init: float = 0.01) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x
