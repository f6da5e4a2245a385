"""Multi-head / grouped-query self-attention with checkpoint names q_proj/k_proj/v_proj/o_proj.

`fuse_projections()` (passes.fuse) replaces q/k/v by one `qkv_proj` built once at build time; the separate
weights are deleted so the artifact never carries both."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .mlp import fuse_linears
from .norms import RMSNorm


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, bias: bool = False,
                 qk_norm_eps: float | None = None, fused_qkv: bool = False) -> None:
        """fused_qkv: the checkpoint already stores one [q;k;v] matrix (Fish `wqkv`): build `qkv_proj` only and
        load it directly (rows q ∣ k ∣ v, contiguous, not per-head interleaved)."""
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.qkv_proj: nn.Linear | None = None
        if fused_qkv:
            self.qkv_proj = nn.Linear(dim, (n_heads + 2 * n_kv_heads) * head_dim, bias=bias)
        else:
            self.q_proj = nn.Linear(dim, n_heads * head_dim, bias=bias)
            self.k_proj = nn.Linear(dim, n_kv_heads * head_dim, bias=bias)
            self.v_proj = nn.Linear(dim, n_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * head_dim, dim, bias=bias)
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def fuse_projections(self) -> None:
        if self.qkv_proj is not None:
            return
        self.qkv_proj = fuse_linears([self.q_proj, self.k_proj, self.v_proj])
        del self.q_proj, self.k_proj, self.v_proj

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B,T,D] → q [B,H,T,hd], k/v [B,Hkv,T,hd] (q/k norm applied, no rope)."""
        B, T, _ = x.shape
        q_width, kv_width = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj(x).split((q_width, kv_width, kv_width), dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(B, T, self.n_heads, self.head_dim)
        k = k.view(B, T, self.n_kv_heads, self.head_dim)
        v = v.view(B, T, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor | None, is_causal: bool = False) -> torch.Tensor:
        """SDPA with GQA expansion; returns [B,T,H·hd] after o_proj."""
        if self.n_kv_heads != self.n_heads:
            rep = self.n_heads // self.n_kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                           scale=self.head_dim**-0.5)
        B, _, T, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


def sliding_window_causal_mask(length: int, window: int, device: torch.device) -> torch.Tensor:
    """Bool [T,T]: key j visible to query i iff i - window < j <= i (window keys including itself).

    Built from iota inside the graph (shapes are static per bucket), so nothing is copied host→device."""
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    return (j <= i) & (j > i - window)
