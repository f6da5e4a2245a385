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
    def __init__(
        self,
        dim: int,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        bias: bool = False,
        qk_norm_eps: float | None = None,
        fused_qkv: bool = False,
    ) -> None:
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
        if self.qkv_proj is not None:
            return split_heads(self, self.qkv_proj(x))
        return to_heads(self, self.q_proj(x), self.k_proj(x), self.v_proj(x))

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool = False
    ) -> torch.Tensor:
        """SDPA with GQA expansion; returns [B,T,H·hd] after o_proj."""
        return self.o_proj(sdpa_gqa(q, k, v, mask, is_causal, self.head_dim**-0.5))


def split_heads(attn: Attention | nn.Module, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused projection's output [B,T,(H+2·Hkv)·hd] (rows q ∣ k ∣ v) → q, k, v in heads (`to_heads`). `attn`:
    anything with Attention's head counts and q/k norms (the kernel layer's KernelAttention too)."""
    q_width, kv_width = attn.n_heads * attn.head_dim, attn.n_kv_heads * attn.head_dim
    return to_heads(attn, *qkv.split((q_width, kv_width, kv_width), dim=-1))


def to_heads(
    attn: Attention | nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [B,T,H·hd], k/v [B,T,Hkv·hd] → q [B,H,T,hd], k/v [B,Hkv,T,hd], q/k norm applied (no rope)."""
    B, T, _ = q.shape
    q = q.view(B, T, attn.n_heads, attn.head_dim)
    k = k.view(B, T, attn.n_kv_heads, attn.head_dim)
    v = v.view(B, T, attn.n_kv_heads, attn.head_dim)
    if attn.q_norm is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def sdpa_gqa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool, scale: float
) -> torch.Tensor:
    """SDPA over q [B,H,T,hd], k/v [B,Hkv,S,hd] (kv heads repeated to H) → [B,T,H·hd], before o_proj."""
    n_heads, n_kv_heads = q.shape[1], k.shape[1]
    if n_kv_heads != n_heads:
        rep = n_heads // n_kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)
    B, _, T, hd = o.shape
    return o.transpose(1, 2).reshape(B, T, n_heads * hd)


def sliding_window_causal_mask(length: int, window: int, device: torch.device) -> torch.Tensor:
    """Bool [T,T]: key j visible to query i iff i - window < j <= i (window keys including itself).

    Built from iota inside the graph (shapes are static per bucket), so nothing is copied host→device."""
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    return (j <= i) & (j > i - window)
