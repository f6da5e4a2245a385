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

import json
import math
import zlib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...runtime.artifact import sha256_of
from ..buckets import BucketPlan, batch_sizes
from ..checkpoint import KeyRules, load_strict, read_safetensors_selected
from ..layers import RMSNorm, SwiGLU, apply_rope_neox, rope_table
from ..layers.attention import Attention
from ..passes import fuse_projections
from ..stage_spec import StageSpec

FAMILY = "voxcpm2"
STAGE_NAMES = ("base_lm_prefill", "base_lm_step", "residual_lm_prefill", "residual_lm_step")


# ------------------------------------------------------------------------------------------------ config
@dataclass(frozen=True)
class MiniCPM4Config:
    """`lm_config` of VoxCPM2's config.json (names as there; rope_scaling flattened)."""

    hidden_size: int = 2048
    intermediate_size: int = 6144
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 2
    kv_channels: int | None = 128
    vocab_size: int = 73448
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    rope_type: str = "longrope"
    rope_short_factor: tuple[float, ...] = ()
    rope_long_factor: tuple[float, ...] = ()
    rope_original_max_position_embeddings: int = 32768
    use_mup: bool = False
    scale_emb: float = 12.0
    dim_model_base: int = 256
    scale_depth: float = 1.4
    no_rope: bool = False
    bos_token_id: int = 1
    eos_token_id: int = 2

    @property
    def head_dim(self) -> int:
        return self.kv_channels if self.kv_channels else self.hidden_size // self.num_attention_heads

    def rope_factors(self) -> tuple[torch.Tensor, float]:
        """(ext factors [head_dim/2], cos/sin scale) exactly as MiniCPMLongRoPE picks them: long factors only if
        max_position_embeddings > original; scale sqrt(1 + ln(max/orig)/ln(orig)) (1.0 in VoxCPM2)."""
        long = self.max_position_embeddings > self.rope_original_max_position_embeddings
        factors = self.rope_long_factor if long else self.rope_short_factor
        if len(factors) != self.head_dim // 2:
            raise ValueError(f"rope factors have {len(factors)} entries, head_dim/2 = {self.head_dim // 2}")
        scale = self.max_position_embeddings / self.rope_original_max_position_embeddings
        mscale = math.sqrt(1 + math.log(scale) / math.log(self.rope_original_max_position_embeddings))
        return torch.tensor(factors, dtype=torch.float32), mscale

    @classmethod
    def from_json(cls, d: dict) -> MiniCPM4Config:
        known = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {k: v for k, v in d.items() if k in known}
        rs = d.get("rope_scaling") or {}
        if rs:
            kw["rope_type"] = rs.get("type", rs.get("rope_type", "longrope"))
            kw["rope_short_factor"] = tuple(float(x) for x in rs["short_factor"])
            kw["rope_long_factor"] = tuple(float(x) for x in rs["long_factor"])
            kw["rope_original_max_position_embeddings"] = int(rs["original_max_position_embeddings"])
        if kw.get("rope_type", "longrope") != "longrope":
            raise ValueError(f"lm_config.rope_scaling.type {kw['rope_type']!r} is not supported (longrope only)")
        return cls(**kw)

    def to_json(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if not k.startswith("rope_") or k == "rope_theta"}
        d["rope_scaling"] = {"type": self.rope_type, "short_factor": list(self.rope_short_factor),
                             "long_factor": list(self.rope_long_factor),
                             "original_max_position_embeddings": self.rope_original_max_position_embeddings}
        return d


@dataclass(frozen=True)
class VoxCPM2LMConfig:
    """The LM part of VoxCPM2's config.json: `lm_config` + the top-level fields the LMs use."""

    lm: MiniCPM4Config = field(default_factory=MiniCPM4Config)
    residual_lm_num_layers: int = 8
    residual_lm_no_rope: bool = True
    scalar_quantization_latent_dim: int = 512
    scalar_quantization_scale: int = 9
    max_length: int = 8192

    @property
    def residual(self) -> MiniCPM4Config:
        """VoxCPM2Model: deep copy of lm_config with 8 layers, vocab 0 (no embedding), no_rope from the config."""
        return replace(self.lm, num_hidden_layers=self.residual_lm_num_layers, vocab_size=0,
                       no_rope=self.residual_lm_no_rope)

    @classmethod
    def from_json(cls, d: dict) -> VoxCPM2LMConfig:
        top = {f.name for f in fields(cls)} - {"lm"}
        return cls(lm=MiniCPM4Config.from_json(d["lm_config"]), **{k: d[k] for k in top if k in d})

    def to_json(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "lm"}
        d["lm_config"] = self.lm.to_json()
        return d


def _factors(n: int, seed: int) -> tuple[float, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(float(x) for x in (1.0 + torch.rand(n, generator=g) * 0.5).tolist())


# The real short/long factors are checkpoint data (config.json); the `full` preset uses plausible values of the
# same shape (64 entries, long = short in VoxCPM2) so random-weight builds have the real topology.
_FULL_FACTORS = _factors(64, 1)
PRESETS: dict[str, VoxCPM2LMConfig] = {
    "full": VoxCPM2LMConfig(lm=MiniCPM4Config(rope_short_factor=_FULL_FACTORS, rope_long_factor=_FULL_FACTORS)),
    # Same topology (GQA 4/2, kv_channels ≠ hidden/heads, LongRoPE short factors, residual without RoPE).
    "tiny": VoxCPM2LMConfig(
        lm=MiniCPM4Config(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                          num_key_value_heads=2, kv_channels=32, vocab_size=128, max_position_embeddings=4096,
                          rope_original_max_position_embeddings=4096, rope_short_factor=_factors(16, 2),
                          rope_long_factor=_factors(16, 3)),
        residual_lm_num_layers=2, scalar_quantization_latent_dim=16, max_length=256),
}


# ----------------------------------------------------------------------------------------------- modules
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
        self.self_attn = Attention(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                                   cfg.head_dim)
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

    def forward_seq(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                    causal: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B,T,D] over a whole sequence (positions 0..T-1) → (x, k, v) with k/v [B,kvh,T,hd] after RoPE."""
        q, k, v = self.self_attn.project_qkv(self.input_layernorm(x))
        if cos is not None:
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        return self._mlp(self._add(x, self._out(o))), k, v

    def forward_step(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                     layer: int, positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     ) -> torch.Tensor:
        """x [B,D], positions [B]: write this token's k/v at (layer, row, :, positions[row]) of the caches, then
        attend over the row's keys at positions ≤ positions[row]."""
        a = self.self_attn
        B = x.shape[0]
        q, k, v = a.project_qkv(self.input_layernorm(x)[:, None])             # q [B,H,1,hd], k/v [B,kvh,1,hd]
        if cos is not None:
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        dev = x.device
        rows = torch.arange(B, device=dev)[:, None]
        heads = torch.arange(a.n_kv_heads, device=dev)[None, :]
        idx = (torch.full((1, 1), layer, dtype=torch.long, device=dev), rows, heads, positions[:, None])
        k_cache.index_put_(idx, k[:, :, 0].to(k_cache.dtype))
        v_cache.index_put_(idx, v[:, :, 0].to(v_cache.dtype))
        kc, vc = k_cache[layer].to(q.dtype), v_cache[layer].to(q.dtype)      # [B,kvh,S,hd], contiguous views
        # GQA without expanding the cache: the `rep` query heads of one kv head are its query rows. Explicit
        # attention (softmax in fp32) instead of SDPA: the math SDPA lowering scales K by √scale, which
        # materialises a scaled copy of the layer's whole K cache every step; here only q is scaled and the
        # caches are read in place (bmm on a transposed view).
        rep = a.n_heads // a.n_kv_heads
        qg = q.view(B, a.n_kv_heads, rep, a.head_dim) * a.head_dim**-0.5
        visible = torch.arange(kc.shape[2], device=dev)[None, :] <= positions[:, None]    # [B,S]
        scores = torch.matmul(qg, kc.transpose(-1, -2)).float()                         # [B,kvh,rep,S]
        scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
        o = torch.matmul(scores.softmax(-1).to(vc.dtype), vc)                            # [B,kvh,rep,hd]
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

    def forward_seq(self, x: torch.Tensor, causal: bool = True
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

    def forward_step(self, x: torch.Tensor, positions: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor) -> torch.Tensor:
        """MiniCPMModel.forward_step with a position per row: x [B,D] → norm(h) [B,D]; caches written in place."""
        cos = sin = None
        if self.rope is not None:
            cos, sin = self.rope.cos[positions][:, None, None, :], self.rope.sin[positions][:, None, None, :]
        for i, layer in enumerate(self.layers):
            x = layer.forward_step(x, cos, sin, i, positions, k_cache, v_cache)
        return self.norm(x)

    def prefill(self, x: torch.Tensor, lengths: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                ) -> torch.Tensor:
        """forward_seq on a right-padded batch, then k/v of token t < lengths[row] written at (layer, row, :, t);
        tokens at or past a row's length go to the scratch slot (the cache's last position)."""
        h, kv = self.forward_seq(x)
        B, T = x.shape[:2]
        dev = x.device
        scratch = k_cache.shape[3] - 1
        t = torch.arange(T, device=dev)[None, :]
        pos = torch.where(t < lengths[:, None], t, torch.full_like(t, scratch))       # [B,T]
        rows = torch.arange(B, device=dev)[:, None, None]
        heads = torch.arange(k_cache.shape[2], device=dev)[None, :, None]
        for i, (k, v) in enumerate(kv):
            idx = (torch.full((1, 1, 1), i, dtype=torch.long, device=dev), rows, heads, pos[:, None, :])
            k_cache.index_put_(idx, k.to(k_cache.dtype))
            v_cache.index_put_(idx, v.to(v_cache.dtype))
        return h


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
        x = self.fusion_concat_proj(torch.cat((lm_hidden.to(dt), feat_mask.to(dt)[..., None] * feat_embed.to(dt)),
                                              dim=-1))
        return self.residual_lm.prefill(x, lengths, k_cache, v_cache).float()


STAGE_MODULES: dict[str, type[nn.Module]] = {
    "base_lm_prefill": BaseLMPrefill, "base_lm_step": BaseLMStep,
    "residual_lm_prefill": ResidualLMPrefill, "residual_lm_step": ResidualLMStep,
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


# ------------------------------------------------------------------------------------------ checkpoint
LM_PREFIXES = ("base_lm.", "residual_lm.", "fsq_layer.", "fusion_concat_proj.", "stop_proj.", "stop_head.")
# model.safetensors parts that belong to the audio stages (voxcpm2_audio.py): never read here.
AUDIO_PREFIXES = ("feat_encoder.", "feat_decoder.", "enc_to_lm_proj.", "lm_to_dit_proj.", "res_to_dit_proj.",
                  "audio_vae.")


def key_rules(stage: str) -> KeyRules:
    """What each stage reads from model.safetensors: its own parts load; `base_lm.embed_tokens` is dropped
    (counted as pruned) by the step; every other part is ignored. Anything unknown is an error."""
    own = {"base_lm_prefill": ("base_lm.", "fsq_layer."),
           "base_lm_step": ("base_lm.", "fsq_layer.", "stop_proj.", "stop_head."),
           "residual_lm_prefill": ("residual_lm.", "fusion_concat_proj."),
           "residual_lm_step": ("residual_lm.", "fusion_concat_proj."),
           "all": LM_PREFIXES}[stage]
    drop = (r"base_lm\.embed_tokens\.weight",) if stage == "base_lm_step" else ()
    ignore = tuple(p for p in LM_PREFIXES if p not in own) + AUDIO_PREFIXES
    return KeyRules(prefix="", ignore_prefixes=ignore, drop_patterns=drop)


def config_from_checkpoint(path: str | Path) -> VoxCPM2LMConfig:
    p = Path(path) / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: VoxCPM2 config.json not found")
    return VoxCPM2LMConfig.from_json(json.loads(p.read_text()))


def load_stage_module(stage: str, path: str | Path, cfg: VoxCPM2LMConfig, max_len: int) -> tuple[nn.Module, dict]:
    st = Path(path) / "model.safetensors"
    if not st.is_file():
        raise FileNotFoundError(f"{st}: VoxCPM2 model.safetensors not found")
    module = STAGE_MODULES[stage](cfg, max_len) if stage != "all" else VoxCPM2LM(cfg, max_len)
    tensors, report = read_safetensors_selected(st, key_rules(stage))
    load_strict(module, tensors, report["unknown"], source=str(st))
    report.update({"path": str(st), "sha256": sha256_of(st)})
    return module.eval(), report


def init_random(module: nn.Module, seed: int = 0) -> nn.Module:
    """Deterministic random weights keyed by checkpoint NAME (not order), so every stage module built with the
    same seed holds the same tensor for the same name (base_lm_step and base_lm_prefill share base_lm.*)."""
    with torch.no_grad():
        for name, p in module.state_dict().items():
            g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
            leaf = name.rsplit(".", 1)[-1]
            if "norm" in name and p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif leaf == "bias":
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    return module.eval()


def write_checkpoint(model: VoxCPM2LM, out_dir: str | Path, extra: dict[str, torch.Tensor] | None = None) -> Path:
    """Write <out>/model.safetensors (LM tensors under their real names, + `extra`) and <out>/config.json
    (`lm_config` and the LM's top-level fields). Both are MERGED into existing files, so the audio stages'
    writer can add its parts before or after this one."""
    from safetensors.torch import load_file, save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    st = out / "model.safetensors"
    tensors = load_file(str(st)) if st.is_file() else {}
    tensors.update({k: v.detach().contiguous() for k, v in model.state_dict().items()})
    tensors.update({k: v.contiguous() for k, v in (extra or {}).items()})
    save_file(tensors, str(st))
    cp = out / "config.json"
    cfg = json.loads(cp.read_text()) if cp.is_file() else {"architecture": "voxcpm2"}
    cfg.update(model.cfg.to_json())
    cp.write_text(json.dumps(cfg, indent=2))
    return out


# ------------------------------------------------------------------------------------------- stage spec
def _lm_cfg(opts) -> VoxCPM2LMConfig:
    return config_from_checkpoint(opts.checkpoint) if opts.checkpoint else PRESETS[opts.preset]


def cache_shape(cfg: MiniCPM4Config, batch: int | str, max_len: int) -> list:
    return [cfg.num_hidden_layers, batch, cfg.num_key_value_heads, max_len + 1, cfg.head_dim]


# fp32: kernel-order noise only (measured ≤ 5e-7 through the tiny CPU artifacts). bf16, measured eager bf16 vs
# fp32 on CPU (random weights, tiny and a 6-layer/512-wide config, 3 seeds): hidden ≤ 1.3e-2 and residual ≤ 1.2e-2,
# but fsq's round(tanh(x)·9)/9 is discontinuous: bf16 noise (≈ 9·2⁻⁸ before rounding) flips a few % of the latent
# levels, so lm_hidden reaches 5.6e-2 and the 2-wide stop logits 1.24e-1 (upstream in bf16 does the same);
# prefill mixes fsq at audio positions (≤ 2.5e-2).
BF16_TOLERANCE = {"base_lm_step": 0.25, "base_lm_prefill": 0.1, "residual_lm_step": 5e-2, "residual_lm_prefill": 5e-2}


def lm_stage(name: str, opts, cfg: VoxCPM2LMConfig | None = None) -> StageSpec:
    cfg = cfg or _lm_cfg(opts)
    max_len = int(opts.max_len)
    is_base = name.startswith("base")
    is_step = name.endswith("_step")
    mcfg = cfg.lm if is_base else cfg.residual
    if max_len < 1 or max_len > mcfg.max_position_embeddings:
        raise ValueError(f"max_len {max_len} must be in [1, max_position_embeddings={mcfg.max_position_embeddings}]")
    dtype = opts.dtype or torch.bfloat16
    cdt = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    H = mcfg.hidden_size
    batches = batch_sizes(opts.max_batch, opts.batch_buckets)
    tokens = tuple(sorted(set(opts.prefill_buckets)))
    if not is_step and tokens[-1] > max_len:
        raise ValueError(f"prefill bucket {tokens[-1]} exceeds max_len {max_len}")
    report: dict = {}

    def make_module() -> nn.Module:
        if opts.checkpoint:
            m, rep = load_stage_module(name, opts.checkpoint, cfg, max_len)
            report.update(rep)
            return m
        report.update({"random_weights": True, "seed": opts.seed})
        return init_random(STAGE_MODULES[name](cfg, max_len), opts.seed)

    cache_in = [{"name": n, "dtype": cdt, "shape": cache_shape(mcfg, "batch", max_len), "pad": 0}
                for n in ("k_cache", "v_cache")]
    f32 = "float32"
    if is_step:
        plan = BucketPlan({"batch": batches})
        rows = [{"name": "embeds", "dtype": f32, "shape": ["batch", H], "pad": 0}] if is_base else [
            {"name": "lm_hidden", "dtype": f32, "shape": ["batch", H], "pad": 0},
            {"name": "feat_embed", "dtype": f32, "shape": ["batch", H], "pad": 0}]
        # positions may name the scratch slot (max_len) for idle rows
        inputs = rows + [{"name": "positions", "dtype": "int64", "shape": ["batch"], "pad": max_len,
                          "range": {"dim": 0, "low": 0, "high": [max_len + 1]}}] + cache_in
        outputs = ([{"name": "hidden", "dtype": f32, "shape": ["batch", H]},
                    {"name": "lm_hidden", "dtype": f32, "shape": ["batch", H]},
                    {"name": "stop_logits", "dtype": f32, "shape": ["batch", 2]}] if is_base else
                   [{"name": "hidden", "dtype": f32, "shape": ["batch", H]}])
        meta = {"position_input": "positions"}
    else:
        plan = BucketPlan({"batch": batches, "tokens": tokens})
        bt, bth = ["batch", "tokens"], ["batch", "tokens", H]
        rows = ([{"name": "text_tokens", "dtype": "int64", "shape": bt, "pad": 0,
                  "range": {"dim": 0, "low": 0, "high": [cfg.lm.vocab_size]}},
                 {"name": "text_mask", "dtype": f32, "shape": bt, "pad": 0},
                 {"name": "feat_embed", "dtype": f32, "shape": bth, "pad": 0},
                 {"name": "feat_mask", "dtype": f32, "shape": bt, "pad": 0}] if is_base else
                [{"name": "lm_hidden", "dtype": f32, "shape": bth, "pad": 0},
                 {"name": "feat_embed", "dtype": f32, "shape": bth, "pad": 0},
                 {"name": "feat_mask", "dtype": f32, "shape": bt, "pad": 0}])
        inputs = rows + [{"name": "lengths", "dtype": "int64", "shape": ["batch"], "pad": 0}] + cache_in
        outputs = [{"name": "lm_hidden" if is_base else "hidden", "dtype": f32, "shape": bth}]
        meta = {"length_input": "lengths"}
    cshape = cache_shape(mcfg, 1, max_len)

    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        B = sizes["batch"]
        caches = {n: torch.randn([*cshape[:1], B, *cshape[2:]], generator=g).to(dtype) for n in ("k_cache", "v_cache")}
        if is_step:
            pos = torch.randint(0, max_len, (B,), generator=g)
            x = {"embeds": torch.randn(B, H, generator=g)} if is_base else {
                "lm_hidden": torch.randn(B, H, generator=g), "feat_embed": torch.randn(B, H, generator=g)}
            return {**x, "positions": pos, **caches}
        T = sizes["tokens"]
        lengths = torch.randint(1, T + 1, (B,), generator=g)
        lengths[0] = T
        fm = (torch.rand(B, T, generator=g) < 0.5).float()
        x = {"feat_embed": torch.randn(B, T, H, generator=g), "feat_mask": fm}
        if is_base:
            x = {"text_tokens": torch.randint(0, cfg.lm.vocab_size, (B, T), generator=g), "text_mask": 1.0 - fm, **x}
        else:
            x = {"lm_hidden": torch.randn(B, T, H, generator=g), **x}
        return {**x, "lengths": lengths, **caches}

    golden = [{"batch": batches[0]}] if is_step else [{"batch": batches[0], "tokens": tokens[0]}]
    return StageSpec(
        family=FAMILY, name=name, kind="lm_step" if is_step else "lm_prefill", make_module=make_module,
        passes=[fuse_projections], plan=plan, make_inputs=make_inputs, inputs=inputs, outputs=outputs,
        dtype=dtype,
        tolerance=1e-4 if dtype == torch.float32 else BF16_TOLERANCE[name],
        metadata={"lm": "base_lm" if is_base else "residual_lm", "max_len": max_len, "scratch_position": max_len,
                  "cache_inputs": ["k_cache", "v_cache"], "cache_shape": cache_shape(mcfg, "batch", max_len),
                  "cache_dtype": cdt, "hidden_size": H, **meta},
        config=cfg.to_json(), checkpoint_report=report, golden_sizes=golden, golden_buckets=False,
    )


def lm_stages(opts) -> list[StageSpec]:
    cfg = _lm_cfg(opts)
    return [lm_stage(n, opts, cfg) for n in STAGE_NAMES]
