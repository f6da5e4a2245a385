from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), with checkpoint names gate_proj/up_proj/down_proj.

    `fuse_projections()` (called by passes.fuse) replaces gate/up by one `gate_up_proj` so the step reads one
    weight matrix; the originals are deleted, so no weight is kept twice."""

    def __init__(self, dim: int, hidden: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)
        self.gate_up_proj: nn.Linear | None = None
        self.hidden = hidden

    def fuse_projections(self) -> None:
        if self.gate_up_proj is not None:
            return
        self.gate_up_proj = fuse_linears([self.gate_proj, self.up_proj])
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).split(self.hidden, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


def fuse_linears(linears: list[nn.Linear]) -> nn.Linear:
    """One Linear whose output rows are the concatenation of `linears`' rows (same input)."""
    w = torch.cat([lin.weight.detach() for lin in linears], dim=0)
    has_bias = linears[0].bias is not None
    fused = nn.Linear(w.shape[1], w.shape[0], bias=has_bias, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        fused.weight.copy_(w)
        if has_bias:
            fused.bias.copy_(torch.cat([lin.bias.detach() for lin in linears]))
    return fused
