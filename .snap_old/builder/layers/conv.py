"""Causal 1-D convolutions (left padding only), so right zero-padding to a bucket never changes earlier outputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CausalConv1d(nn.Module):
    """Conv1d with (k-1)·dilation - (stride-1) left padding; checkpoint names under `.conv`.

    Output length is ceil(T / stride): the reference pads the right edge up to a whole number of strides."""

    def __init__(
        self, cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1, groups: int = 1, bias: bool = True
    ) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, groups=groups, bias=bias)
        self.stride = stride
        self.effective_kernel = (kernel - 1) * dilation + 1
        self.left_pad = self.effective_kernel - stride

    def _right_pad(self, length: int) -> int:
        # Smallest right pad making the strided windows cover the input (integer form of the reference's ceil).
        n_windows = -(-(length - self.effective_kernel + self.left_pad) // self.stride) + 1
        ideal = (n_windows - 1) * self.stride + (self.effective_kernel - self.left_pad)
        return ideal - length

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (self.left_pad, self._right_pad(x.shape[-1]))))


class CausalConvTranspose1d(nn.Module):
    """ConvTranspose1d with the (kernel - stride) tail trimmed on the right: exactly T·stride outputs."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, bias: bool = True) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride, bias=bias)
        self.trim = kernel - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., : y.shape[-1] - self.trim] if self.trim > 0 else y


class ConvNeXtBlock(nn.Module):
    """Causal depthwise k7 → LayerNorm(1e-6) → Linear ×4 → GELU → Linear → ×gamma → +skip (channels-first io)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dwconv(x).transpose(1, 2)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)
