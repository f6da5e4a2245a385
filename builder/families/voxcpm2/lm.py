"""VoxCPM2 language models (`voxcpm2`): per-token decode steps and prompt prefills of the 28-layer MiniCPM4
`base_lm` and the 8-layer no-RoPE `residual_lm`, with static KV caches passed in and updated in place.

Facts: shared/reference/STAGES.md §3 (dataflow §3.3); upstream `voxcpm/modules/minicpm4/model.py` and
`voxcpm/model/voxcpm2.py` (`_inference`). Four stages:

* `base_lm_prefill`  text_tokens, text_mask, feat_embed, feat_mask [B,T(,H)], lengths [B], k/v cache
                     → lm_hidden [B,T,H] = fsq(h)·feat_mask + h·text_mask (the residual LM's input, and at
                     `lengths-1` the first decode step's lm_hidden). Owns `base_lm.embed_tokens` (prefill only).
* `base_lm_step`     embeds [B,H] (previous patch's enc_to_lm output), positions [B], k/v cache
                     → hidden h [B,H], lm_hidden = fsq(h) [B,H], stop_logits [B,2] = stop_head(silu(stop_proj(
                     lm_hidden))): one replay gives everything the host needs. No embedding table.
* `residual_lm_prefill` lm_hidden, feat_embed [B,T,H], feat_mask [B,T], lengths, k/v cache → hidden [B,T,H]
                     (input fusion_concat_proj(cat[lm_hidden, feat_mask·feat_embed])).
* `residual_lm_step` lm_hidden, feat_embed [B,H], positions [B], k/v cache → hidden [B,H]
                     (input fusion_concat_proj(cat[lm_hidden, feat_embed])).

KV cache contract (runtime-owned, `runtime/lm.py` KVCache): k_cache and v_cache are separate inputs of shape
[layers, B, kv_heads, max_len + 1, head_dim] in the compute dtype, written in place with `index_put_` on the
input itself (AOTI keeps user-input mutation in place: no cache copy per step). Slot `max_len` is a scratch
slot: a row stepped with position `max_len`, or a prefill token at or past its row's length, writes there and
nothing else, so padded / idle rows of a bucket never disturb live rows; the attention masks of real rows
(key position ≤ query position < max_len) never read it. The same cache tensors serve the prefill and the step
stage of one LM (same shape per batch bucket).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...kernels.decode_attention import attention_workspace
from ...kernels.decode_modules import KernelAttention, KernelLinear, KernelSwiGLU
from ...layers import RMSNorm, SwiGLU, apply_rope_neox, rope_table
from ...layers.attention import Attention
from .config import MiniCPM4Config, VoxCPM2LMConfig


class RopeTable(nn.Module):
    """cos/sin [positions, head_dim] of MiniCPMLongRoPE, fp32 whatever the compute dtype (q and k are rotated
    in fp32 as the reference does). Derived from the config: non-persistent, never in the checkpoint."""

    keep_fp32 = True

    def __init__(self, cfg: MiniCPM4Config, positions: int) -> None:
        super().__init__()
        factors, mscale = cfg.rope_factors()
        cos, sin = rope_table(cfg.head_dim, positions, cfg.rope_theta, scale_factors=factors)
        self.register_buffer("cos", (cos * mscale).contiguous(), persistent=False)
        self.register_buffer("sin", (sin * mscale).contiguous(), persistent=False)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return apply_rope_neox(x.float(), cos, sin).to(x.dtype)


class MiniCPMLayer(nn.Module):
    """Pre-norm decoder layer; checkpoint names self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj,
    input_layernorm, post_attention_layernorm."""

    def __init__(self, cfg: MiniCPM4Config) -> None:
        super().__init__()
        self.self_attn = Attention(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.branch_scale = cfg.scale_depth / math.sqrt(cfg.num_hidden_layers) if cfg.use_mup else None

    def _add(self, residual: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        return residual + (branch if self.branch_scale is None else branch * self.branch_scale)

    def _out(self, o: torch.Tensor) -> torch.Tensor:
        """o [B,H,T,hd] → o_proj([B,T,H·hd])."""
        a = self.self_attn
        B, _, T, _ = o.shape
        return a.o_proj(o.transpose(1, 2).reshape(B, T, a.n_heads * a.head_dim))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self._add(x, self.mlp(self.post_attention_layernorm(x)))

    def forward_seq(
        self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, causal: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B,T,D] over a whole sequence (positions 0..T-1) → (x, k, v) with k/v [B,kvh,T,hd] after RoPE."""
        q, k, v = self.self_attn.project_qkv(self.input_layernorm(x))
        if cos is not None:
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        return self._mlp(self._add(x, self._out(o))), k, v

    def forward_step(
        self,
        x: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        layer: int,
        positions: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        workspace: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [B,D], positions [B]: write this token's k/v at (layer, row, :, positions[row]) of the caches, then
        attend over the row's keys at positions ≤ positions[row]. On the kernel layer (`use_decode_kernels`),
        cos/sin are the whole RoPE tables."""
        if isinstance(self.self_attn, KernelAttention):
            scale = 1.0 if self.branch_scale is None else self.branch_scale
            # (MiniCPMModel.forward_step: one step per stage call, the cache slots it reads written by earlier calls)
            x = self.self_attn.decode_step(
                x, self.input_layernorm, positions, k_cache, v_cache, layer, cos, sin, scale, workspace, True
            )
            return self.mlp.decode_step(x, self.post_attention_layernorm, scale)
        a = self.self_attn
        B = x.shape[0]
        q, k, v = a.project_qkv(self.input_layernorm(x)[:, None])  # q [B,H,1,hd], k/v [B,kvh,1,hd]
        if cos is not None:
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        dev = x.device
        rows = torch.arange(B, device=dev)[:, None]
        heads = torch.arange(a.n_kv_heads, device=dev)[None, :]
        idx = (torch.full((1, 1), layer, dtype=torch.long, device=dev), rows, heads, positions[:, None])
        k_cache.index_put_(idx, k[:, :, 0].to(k_cache.dtype))
        v_cache.index_put_(idx, v[:, :, 0].to(v_cache.dtype))
        kc, vc = k_cache[layer].to(q.dtype), v_cache[layer].to(q.dtype)  # [B,kvh,S,hd], contiguous views
        # GQA without expanding the cache: the `rep` query heads of one kv head are its query rows. Explicit
        # attention (softmax in fp32) instead of SDPA: the math SDPA lowering scales K by √scale, which
        # materialises a scaled copy of the layer's whole K cache every step; here only q is scaled and the
        # caches are read in place (bmm on a transposed view).
        rep = a.n_heads // a.n_kv_heads
        qg = q.view(B, a.n_kv_heads, rep, a.head_dim) * a.head_dim**-0.5
        visible = torch.arange(kc.shape[2], device=dev)[None, :] <= positions[:, None]  # [B,S]
        # softmax in fp32 (float64 in the builder's float64 pass-parity re-check)
        scores = torch.matmul(qg, kc.transpose(-1, -2)).to(torch.promote_types(q.dtype, torch.float32))
        scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
        o = torch.matmul(scores.softmax(-1).to(vc.dtype), vc)  # [B,kvh,rep,hd]
        o = a.o_proj(o.reshape(B, a.n_heads * a.head_dim))
        return self._mlp(self._add(x, o))


class MiniCPM4(nn.Module):
    """`base_lm` / `residual_lm` (MiniCPMModel). `embed_tokens` exists only where the stage embeds tokens;
    `rope_positions` sizes the RoPE table (max_len + 1 for the scratch slot)."""

    def __init__(self, cfg: MiniCPM4Config, rope_positions: int, with_embedding: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        if with_embedding:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(MiniCPMLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = None if cfg.no_rope else RopeTable(cfg, rope_positions)

    def forward_seq(
        self, x: torch.Tensor, causal: bool = True
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """MiniCPMModel.forward: x [B,T,D] → (norm(h) [B,T,D], per-layer (k, v))."""
        T = x.shape[1]
        cos = sin = None
        if self.rope is not None:
            if T > self.rope.cos.shape[0]:
                raise ValueError(f"sequence of {T} exceeds the RoPE table ({self.rope.cos.shape[0]} positions)")
            cos, sin = self.rope.cos[:T], self.rope.sin[:T]
        kv = []
        for layer in self.layers:
            x, k, v = layer.forward_seq(x, cos, sin, causal)
            kv.append((k, v))
        return self.norm(x), kv

    def forward_step(
        self, x: torch.Tensor, positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """MiniCPMModel.forward_step with a position per row: x [B,D] → norm(h) [B,D]; caches written in place."""
        cos = sin = None
        if self.rope is not None and self.uses_kernels:
            cos, sin = self.rope.cos, self.rope.sin
        elif self.rope is not None:
            cos, sin = self.rope.cos[positions][:, None, None, :], self.rope.sin[positions][:, None, None, :]
        # one zeroed split-merge workspace per step for every layer's decode_attention (each call leaves it zeroed)
        workspace = attention_workspace(x, k_cache) if self.uses_kernels else None
        for i, layer in enumerate(self.layers):
            x = layer.forward_step(x, cos, sin, i, positions, k_cache, v_cache, workspace)
        return self.norm(x)

    @property
    def uses_kernels(self) -> bool:
        return isinstance(self.layers[0].self_attn, KernelAttention)

    def prefill(
        self,
        x: torch.Tensor,
        lengths: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        """forward_seq on a right-padded batch, then k/v of token t < lengths[row] written at (layer, row, :, t);
        tokens at or past a row's length go to the scratch slot (the cache's last position)."""
        h, kv = self.forward_seq(x)
        B, T = x.shape[:2]
        dev = x.device
        scratch = k_cache.shape[3] - 1
        t = torch.arange(T, device=dev)[None, :]
        pos = torch.where(t < lengths[:, None], t, torch.full_like(t, scratch))  # [B,T]
        rows = torch.arange(B, device=dev)[:, None, None]
        heads = torch.arange(k_cache.shape[2], device=dev)[None, :, None]
        for i, (k, v) in enumerate(kv):
            idx = (torch.full((1, 1, 1), i, dtype=torch.long, device=dev), rows, heads, pos[:, None, :])
            k_cache.index_put_(idx, k.to(k_cache.dtype))
            v_cache.index_put_(idx, v.to(v_cache.dtype))
        return h


def use_decode_kernels(module: nn.Module) -> dict:
    """Kernel pass of the step stages (StageSpec.kernel_passes): every MiniCPM4 decoder layer's attention and MLP
    blocks become kernel-layer blocks holding the same weights (builder/kernels/decode_modules.py). Only
    `forward_step` uses them: the pass is for step stages only.

    The step's other Linears (the base step's FSQ in/out projections, stop_proj and stop_head; the residual step's
    fusion_concat_proj) become KernelLinears too, under the same parameter names. Inductor left them to cuBLAS:
    in the H100 profiles at 1d24e0d (bench/results/nvidia-h100/profiles/voxcpm2__*_lm_step__ttsaot.txt, b1) five
    cuBLAS launches took ~19 µs of the base step's tail (three GEMMs of 5.1-5.7 µs each for 2-8 MB of weights,
    where the layers' 2048 × 2048 o_proj on skinny_linear took 2.2 µs in the chain), and the residual step's
    fusion_concat_proj 11.4 µs (a split-K GEMM and its reduce) for 16.8 MB; a cuBLAS kernel also takes no part in
    the programmatic launch chain of the kernels around it."""
    layers = linears = 0
    for sub in module.modules():
        if isinstance(sub, MiniCPM4) and not sub.uses_kernels:
            for layer in sub.layers:
                layer.self_attn = KernelAttention(layer.self_attn)
                layer.mlp = KernelSwiGLU(layer.mlp)
                layers += 1
    # outside the LMs only: their blocks are the kernel blocks above
    in_lm = {id(m) for lm in module.modules() if isinstance(lm, MiniCPM4) for m in lm.modules()}
    for parent in [m for m in module.modules() if id(m) not in in_lm]:
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, KernelLinear(child))
                linears += 1
    return {
        "pass": "use_decode_kernels",
        "layers": layers,
        "linears": linears,
        "ops": ["ttsaot::skinny_linear", "ttsaot::decode_attention"],
    }


class ScalarQuantizationLayer(nn.Module):
    """fsq_layer (eval): out_proj(round(tanh(in_proj(h))·scale)/scale)."""

    def __init__(self, dim: int, latent: int, scale: int) -> None:
        super().__init__()
        self.in_proj = nn.Linear(dim, latent)
        self.out_proj = nn.Linear(latent, dim)
        self.scale = scale

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.round(torch.tanh(self.in_proj(h)) * self.scale) / self.scale)


def _compute_dtype(m: nn.Module) -> torch.dtype:
    return next(p for p in m.parameters() if p.is_floating_point()).dtype


class BaseLMStep(nn.Module):
    """embeds [B,H] f32, positions [B] i64, k/v cache → (hidden, lm_hidden = fsq(hidden), stop_logits) f32."""

    def __init__(self, cfg: VoxCPM2LMConfig, max_len: int) -> None:
        super().__init__()
        H = cfg.lm.hidden_size
        self.base_lm = MiniCPM4(cfg.lm, max_len + 1)
        self.fsq_layer = ScalarQuantizationLayer(H, cfg.scalar_quantization_latent_dim, cfg.scalar_quantization_scale)
        self.stop_proj = nn.Linear(H, H)
        self.stop_head = nn.Linear(H, 2, bias=False)

    def forward(self, embeds, positions, k_cache, v_cache):
        h = self.base_lm.forward_step(embeds.to(_compute_dtype(self)), positions, k_cache, v_cache)
        lm_h = self.fsq_layer(h)
        stop = self.stop_head(F.silu(self.stop_proj(lm_h)))
        return h.float(), lm_h.float(), stop.float()


class ResidualLMStep(nn.Module):
    """lm_hidden, feat_embed [B,H] f32, positions [B], k/v cache → hidden [B,H] f32."""

    def __init__(self, cfg: VoxCPM2LMConfig, max_len: int) -> None:
        super().__init__()
        H = cfg.lm.hidden_size
        self.residual_lm = MiniCPM4(cfg.residual, max_len + 1)
        self.fusion_concat_proj = nn.Linear(2 * H, H)

    def forward(self, lm_hidden, feat_embed, positions, k_cache, v_cache):
        dt = _compute_dtype(self)
        x = self.fusion_concat_proj(torch.cat((lm_hidden.to(dt), feat_embed.to(dt)), dim=-1))
        return self.residual_lm.forward_step(x, positions, k_cache, v_cache).float()


class BaseLMPrefill(nn.Module):
    """text_tokens [B,T] i64, text_mask [B,T], feat_embed [B,T,H], feat_mask [B,T] f32, lengths [B], k/v cache
    → lm_hidden [B,T,H] f32 = fsq(h)·feat_mask + h·text_mask (VoxCPM2Model._inference prefill)."""

    def __init__(self, cfg: VoxCPM2LMConfig, max_len: int) -> None:
        super().__init__()
        H = cfg.lm.hidden_size
        self.base_lm = MiniCPM4(cfg.lm, max_len + 1, with_embedding=True)
        self.fsq_layer = ScalarQuantizationLayer(H, cfg.scalar_quantization_latent_dim, cfg.scalar_quantization_scale)
        self.scale_emb = cfg.lm.scale_emb if cfg.lm.use_mup else 1.0

    def forward(self, text_tokens, text_mask, feat_embed, feat_mask, lengths, k_cache, v_cache):
        dt = _compute_dtype(self)
        tm, fm = text_mask.to(dt)[..., None], feat_mask.to(dt)[..., None]
        text = self.base_lm.embed_tokens(text_tokens)
        if self.scale_emb != 1.0:
            text = text * self.scale_emb
        x = tm * text + fm * feat_embed.to(dt)
        h = self.base_lm.prefill(x, lengths, k_cache, v_cache)
        return (self.fsq_layer(h) * fm + h * tm).float()


class ResidualLMPrefill(nn.Module):
    """lm_hidden, feat_embed [B,T,H], feat_mask [B,T] f32, lengths [B], k/v cache → hidden [B,T,H] f32."""

    def __init__(self, cfg: VoxCPM2LMConfig, max_len: int) -> None:
        super().__init__()
        H = cfg.lm.hidden_size
        self.residual_lm = MiniCPM4(cfg.residual, max_len + 1)
        self.fusion_concat_proj = nn.Linear(2 * H, H)

    def forward(self, lm_hidden, feat_embed, feat_mask, lengths, k_cache, v_cache):
        dt = _compute_dtype(self)
        x = self.fusion_concat_proj(
            torch.cat((lm_hidden.to(dt), feat_mask.to(dt)[..., None] * feat_embed.to(dt)), dim=-1)
        )
        return self.residual_lm.prefill(x, lengths, k_cache, v_cache).float()


STAGE_MODULES: dict[str, type[nn.Module]] = {
    "base_lm_prefill": BaseLMPrefill,
    "base_lm_step": BaseLMStep,
    "residual_lm_prefill": ResidualLMPrefill,
    "residual_lm_step": ResidualLMStep,
}


class VoxCPM2LM(nn.Module):
    """Every LM-side tensor of model.safetensors, under its checkpoint name (tests, checkpoint writer)."""

    def __init__(self, cfg: VoxCPM2LMConfig, max_len: int = 64) -> None:
        super().__init__()
        H = cfg.lm.hidden_size
        self.cfg = cfg
        self.base_lm = MiniCPM4(cfg.lm, max_len + 1, with_embedding=True)
        self.residual_lm = MiniCPM4(cfg.residual, max_len + 1)
        self.fsq_layer = ScalarQuantizationLayer(H, cfg.scalar_quantization_latent_dim, cfg.scalar_quantization_scale)
        self.fusion_concat_proj = nn.Linear(2 * H, H)
        self.stop_proj = nn.Linear(H, H)
        self.stop_head = nn.Linear(H, 2, bias=False)
