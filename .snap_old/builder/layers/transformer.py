"""A pre-norm GQA decoder block (Qwen3 / Llama layout) with an explicit, functional KV cache.

HF names: `self_attn.{q,k,v,o}_proj` (or an already fused `self_attn.qkv_proj`), optional `self_attn.{q,k}_norm`,
`mlp.{gate,up,down}_proj`, `input_layernorm`, `post_attention_layernorm`. Families whose checkpoints use other
names (Fish: `attention.wqkv`, `feed_forward.w1/w2/w3`, `attention_norm`, `ffn_norm`) map them with a rename
table next to their module.

The cache is passed in and returned (k, v of all positions so far), never stored on the module: an unrolled
autoregressive loop inside one exported `forward` stays a pure function of its inputs."""

from __future__ import annotations

import torch
from torch import nn

from .attention import Attention
from .mlp import SwiGLU
from .norms import RMSNorm
from .rope import apply_rope_interleaved, apply_rope_neox

KV = tuple[torch.Tensor, torch.Tensor]
ROPE_STYLES = ("neox", "interleaved")


class DecoderBlock(nn.Module):
    def __init__(
        self,
        dim: int,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        ffn_dim: int,
        eps: float,
        qk_norm: bool,
        rope_style: str,
        fused_qkv: bool = False,
    ) -> None:
        super().__init__()
        if rope_style not in ROPE_STYLES:
            raise ValueError(f"rope_style {rope_style!r} not in {ROPE_STYLES}")
        self.rope_style = rope_style
        self.self_attn = Attention(
            dim, n_heads, n_kv_heads, head_dim, qk_norm_eps=eps if qk_norm else None, fused_qkv=fused_qkv
        )
        self.mlp = SwiGLU(dim, ffn_dim)
        self.input_layernorm = RMSNorm(dim, eps)
        self.post_attention_layernorm = RMSNorm(dim, eps)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.rope_style == "neox":
            # HF: fp32-computed tables cast to the activation dtype, rotation in that dtype.
            return apply_rope_neox(x, cos.to(x.dtype), sin.to(x.dtype))
        # Fish: rotation in fp32 (tables already rounded to bf16 precision), cast back.
        return apply_rope_interleaved(x.float(), cos.float(), sin.float()).to(x.dtype)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past: KV | None = None
    ) -> tuple[torch.Tensor, KV]:
        """x [B,T,D] at positions P..P+T-1 (cos/sin already sliced to them); past = k, v [B,Hkv,P,hd] or None.

        Causal: with no past the T positions attend causally; with a past, T must be 1 (one new position sees
        every cached one and itself, no mask needed)."""
        q, k, v = self.self_attn.project_qkv(self.input_layernorm(x))
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        if past is not None:
            if x.shape[1] != 1:
                raise ValueError("DecoderBlock: with a KV cache, decode one position at a time")
            k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
        x = x + self.self_attn.attend(q, k, v, None, is_causal=past is None and x.shape[1] > 1)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, (k, v)
