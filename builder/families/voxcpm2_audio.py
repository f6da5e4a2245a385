"""VoxCPM2 patch generation and audio: `locdit`, `local_encoder`, `vae_decoder` (STAGES.md §3.1–3.3).

Per LM step the reference generates one latent patch [B,64,4] by flow matching (UnifiedCFM + LocDiT V2:
Euler from t=1 to 0 on a sway-warped grid, zero-init first step, classifier-free guidance with CFG-zero*, the
estimator run on a doubled batch), then re-encodes it with the local encoder into the next LM input embedding.

Stage boundaries (what the runtime replays per decode step):
* `locdit`: (lm_hidden [B,2048] after FSQ, residual_hidden [B,2048], cond [B,64,4] = previous patch,
  noise [B,64,4] ~ N(0,1)) → patch [B,64,4]. The `lm_to_dit_proj` / `res_to_dit_proj` projections and the
  concat into mu live INSIDE this stage, so the whole patch generation is one graph and the LM steps stay
  DiT-agnostic.
  The whole CFM solve is unrolled (n_timesteps − 1 estimator calls for the default single zero-init step).
* `local_encoder`: patch [B,1,4,64] → next input embedding [B,2048] (special token + 4 patch tokens,
  bidirectional, token 0 → enc_to_lm_proj).
* `vae_decoder` (voxcpm2_vae.py): latents [B,64,F] → wave [B,1,F·1920], fp32.

Float I/O is float32 at the stage boundary whatever the compute dtype (cast inside the graph); values that
come from a bf16 stage are exactly representable, so nothing is lost between stages.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ...runtime.artifact import sha256_of
from ..buckets import BucketPlan, batch_sizes, frame_sizes
from ..checkpoint import KeyRules, load_strict, read_safetensors_selected
from ..layers import RMSNorm, SwiGLU, apply_rope_neox, rope_table
from ..layers.attention import Attention
from ..passes import bake_snake, bake_weight_norm, fuse_projections
from ..stage_spec import StageSpec
from . import voxcpm2_vae as vae

FAMILY = "voxcpm2"
STAGE_NAMES = ("locdit", "local_encoder", "vae_decoder")
DEFAULT_TIMESTEPS = 10          # generate(inference_timesteps=10) in the reference API; not in config.json
DEFAULT_CFG = 2.0               # generate(cfg_value=2.0); config.json's inference_cfg_rate overrides


# ------------------------------------------------------------------------------------------------ config
@dataclass(frozen=True)
class TransformerConfig:
    """A MiniCPM-4 stack as the local encoder / LocDiT instantiate it (a copy of lm_config with hidden, FFN,
    heads, layers and kv_channels replaced; kv heads, norms, rope and mup flags inherited)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_factors: tuple[float, ...] | None = None   # LongRoPE factors in use (short or long), [head_dim/2]
    rope_scaling: float = 1.0                        # LongRoPE attention scaling of cos/sin
    use_mup: bool = False
    scale_depth: float = 1.0


@dataclass(frozen=True)
class AudioConfig:
    lm_hidden_size: int = 2048
    patch_size: int = 4
    feat_dim: int = 64
    encoder: TransformerConfig = field(default_factory=lambda: _minicpm(1024, 4096, 16, 12))
    dit: TransformerConfig = field(default_factory=lambda: _minicpm(1024, 4096, 16, 12))
    dit_mean_mode: bool = False
    inference_cfg_rate: float = DEFAULT_CFG
    vae: vae.VAEConfig = field(default_factory=vae.VAEConfig)

    def to_json(self) -> dict:
        d = asdict(self)
        d["vae"] = self.vae.to_json()
        return json.loads(json.dumps(d))


def _minicpm(hidden: int, ffn: int, heads: int, layers: int, kv_heads: int = 2, head_dim: int = 128,
             factors: tuple[float, ...] | None = None) -> TransformerConfig:
    return TransformerConfig(hidden, ffn, heads, kv_heads, layers, head_dim, rope_factors=factors)


def _longrope(lm: dict, head_dim: int) -> tuple[tuple[float, ...] | None, float]:
    """MiniCPMLongRoPE: long factors if max_position_embeddings > original, else short; cos/sin scaled by
    sqrt(1 + log(max/orig) / log(orig))."""
    rs = lm.get("rope_scaling")
    if not rs:
        return None, 1.0
    max_pos = lm["max_position_embeddings"]
    orig = rs["original_max_position_embeddings"]
    factors = rs["long_factor"] if max_pos > orig else rs["short_factor"]
    if len(factors) != head_dim // 2:
        raise ValueError(f"rope_scaling factors have {len(factors)} entries, head_dim/2 = {head_dim // 2}")
    return tuple(float(f) for f in factors), math.sqrt(1 + math.log(max_pos / orig) / math.log(orig))


def _sub_config(lm: dict, sub: dict) -> TransformerConfig:
    heads = sub.get("num_heads", 16)
    hidden = sub.get("hidden_dim", 1024)
    head_dim = sub.get("kv_channels") or hidden // heads
    factors, scaling = _longrope(lm, head_dim)
    return TransformerConfig(
        hidden_size=hidden, intermediate_size=sub.get("ffn_dim", 4096), num_attention_heads=heads,
        num_key_value_heads=lm["num_key_value_heads"], num_hidden_layers=sub.get("num_layers", 4),
        head_dim=head_dim, rms_norm_eps=lm["rms_norm_eps"], rope_theta=lm.get("rope_theta", 10000.0),
        rope_factors=factors, rope_scaling=scaling, use_mup=lm.get("use_mup", True),
        scale_depth=lm.get("scale_depth", 1.0))


def config_from_dict(d: dict) -> AudioConfig:
    lm = d["lm_config"]
    if lm.get("no_rope"):
        raise ValueError("lm_config.no_rope=True would drop rope from the local encoder / LocDiT: "
                         "unsupported")
    dit = d.get("dit_config", {})
    cfm = dit.get("cfm_config", {})
    if cfm.get("solver", "euler") != "euler":
        raise ValueError(f"cfm solver {cfm['solver']!r} is not supported (euler only)")
    return AudioConfig(
        lm_hidden_size=lm["hidden_size"], patch_size=d.get("patch_size", 4), feat_dim=d.get("feat_dim", 64),
        encoder=_sub_config(lm, d.get("encoder_config", {})), dit=_sub_config(lm, dit),
        dit_mean_mode=dit.get("dit_mean_mode", False),
        inference_cfg_rate=float(cfm.get("inference_cfg_rate", 1.0)),
        vae=vae.VAEConfig.from_json(d.get("audio_vae_config") or {}))


def config_from_checkpoint(path: str | Path) -> AudioConfig:
    p = Path(path) / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: VoxCPM2 config.json not found")
    return config_from_dict(json.loads(p.read_text()))


# The audio sections of config.json per preset. The LM part (kv heads, norms, LongRoPE factors, which the
# local encoder and the DiT inherit) comes from voxcpm2_lm's preset of the same name, so one tiny config.json
# serves the whole family.
AUDIO_SECTIONS: dict[str, dict] = {
    "full": {
        "patch_size": 4, "feat_dim": 64,
        "encoder_config": {"hidden_dim": 1024, "ffn_dim": 4096, "num_heads": 16, "num_layers": 12,
                           "kv_channels": 128},
        "dit_config": {"hidden_dim": 1024, "ffn_dim": 4096, "num_heads": 16, "num_layers": 12,
                       "kv_channels": 128, "dit_mean_mode": False,
                       "cfm_config": {"solver": "euler", "inference_cfg_rate": 2.0}},
        "audio_vae_config": vae.VAE_PRESETS["full"].to_json(),
    },
    # Same topology (GQA 4:2 with kv_channels ≠ hidden/heads, LongRoPE factors, 2 mu tokens, 11-token DiT
    # sequence, doubled-batch CFG, depthwise VAE with sr conditioning), small widths.
    "tiny": {
        "patch_size": 4, "feat_dim": 16,
        "encoder_config": {"hidden_dim": 64, "ffn_dim": 128, "num_heads": 4, "num_layers": 2,
                           "kv_channels": 32},
        "dit_config": {"hidden_dim": 64, "ffn_dim": 128, "num_heads": 4, "num_layers": 2, "kv_channels": 32,
                       "dit_mean_mode": False, "cfm_config": {"solver": "euler", "inference_cfg_rate": 2.0}},
        "audio_vae_config": vae.VAE_PRESETS["tiny"].to_json(),
    },
}


def preset_config_dict(name: str) -> dict:
    """The full config.json (real VoxCPMConfig layout) of a preset: the LM preset's part + AUDIO_SECTIONS."""
    from . import voxcpm2_lm

    d = voxcpm2_lm.PRESETS[name].to_json()
    d.update(json.loads(json.dumps(AUDIO_SECTIONS[name])))
    return d


PRESETS: dict[str, AudioConfig] = {n: config_from_dict(preset_config_dict(n)) for n in AUDIO_SECTIONS}


def preset_config_json(cfg: AudioConfig) -> dict:
    """A config.json in the real VoxCPMConfig layout for `cfg`: the preset's own when `cfg` is a preset, else
    synthesized (LM fields the audio stages do not read get placeholder values)."""
    for name, preset in PRESETS.items():
        if preset == cfg:
            return preset_config_dict(name)
    enc, dit = cfg.encoder, cfg.dit
    factors = list(enc.rope_factors) if enc.rope_factors else [1.0] * (enc.head_dim // 2)
    return {
        "architecture": "voxcpm2",
        "lm_config": {
            "bos_token_id": 1, "eos_token_id": 2, "hidden_size": cfg.lm_hidden_size,
            "intermediate_size": 3 * cfg.lm_hidden_size, "max_position_embeddings": 32768,
            "num_attention_heads": enc.num_attention_heads, "num_hidden_layers": 2,
            "num_key_value_heads": enc.num_key_value_heads, "rms_norm_eps": enc.rms_norm_eps,
            "rope_scaling": {"type": "longrope", "long_factor": factors, "short_factor": factors,
                             "original_max_position_embeddings": 32768},
            "vocab_size": 256, "use_mup": enc.use_mup, "scale_emb": 12, "dim_model_base": 256,
            "scale_depth": enc.scale_depth, "rope_theta": enc.rope_theta, "kv_channels": enc.head_dim,
        },
        "patch_size": cfg.patch_size, "feat_dim": cfg.feat_dim, "residual_lm_num_layers": 1,
        "residual_lm_no_rope": True, "scalar_quantization_latent_dim": 32, "scalar_quantization_scale": 9,
        "encoder_config": {"hidden_dim": enc.hidden_size, "ffn_dim": enc.intermediate_size,
                           "num_heads": enc.num_attention_heads, "num_layers": enc.num_hidden_layers,
                           "kv_channels": enc.head_dim},
        "dit_config": {"hidden_dim": dit.hidden_size, "ffn_dim": dit.intermediate_size,
                       "num_heads": dit.num_attention_heads, "num_layers": dit.num_hidden_layers,
                       "kv_channels": dit.head_dim, "dit_mean_mode": cfg.dit_mean_mode,
                       "cfm_config": {"sigma_min": 1e-6, "solver": "euler", "t_scheduler": "log-norm",
                                      "inference_cfg_rate": cfg.inference_cfg_rate}},
        "audio_vae_config": cfg.vae.to_json(),
        "max_length": 8192, "device": "cuda", "dtype": "bfloat16",
    }


# --------------------------------------------------------------------------------------------- modules
class MiniCPMLayer(nn.Module):
    """Pre-norm: RMSNorm → GQA attention (rope on q,k in fp32) → residual; RMSNorm → SwiGLU → residual."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = Attention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim)
        self.mlp = SwiGLU(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        # use_mup=false in VoxCPM2: plain residual adds
        self.residual_scale = c.scale_depth / math.sqrt(c.num_hidden_layers) if c.use_mup else None

    def _res(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return x + h * self.residual_scale if self.residual_scale is not None else x + h

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.self_attn.project_qkv(self.input_layernorm(x))
        dt = q.dtype
        q = apply_rope_neox(q.float(), cos, sin).to(dt)
        k = apply_rope_neox(k.float(), cos, sin).to(dt)
        x = self._res(x, self.self_attn.attend(q, k, v, None))
        return self._res(x, self.mlp(self.post_attention_layernorm(x)))


class BidirectionalMiniCPM(nn.Module):
    """MiniCPMModel with vocab_size 0 run with is_causal=False (names: layers.N.*, norm.weight)."""

    def __init__(self, c: TransformerConfig, max_tokens: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(MiniCPMLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        factors = torch.tensor(c.rope_factors) if c.rope_factors is not None else None
        cos, sin = rope_table(c.head_dim, max_tokens, c.rope_theta, scale_factors=factors)
        # fp32 tables whatever the compute dtype (the reference applies rope in fp32)
        self.register_buffer("rope_cos", cos * c.rope_scaling, persistent=False)
        self.register_buffer("rope_sin", sin * c.rope_scaling, persistent=False)
        self.rope_cos_keep_fp32 = self.rope_sin_keep_fp32 = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class LocalEncoder(nn.Module):
    """`feat_encoder`: [B,T,P,D] → [B,T,H] (learned special token prepended per patch, token 0 kept)."""

    def __init__(self, c: TransformerConfig, feat_dim: int, patch_size: int) -> None:
        super().__init__()
        self.special_token = nn.Parameter(torch.zeros(1, 1, 1, c.hidden_size))
        self.in_proj = nn.Linear(feat_dim, c.hidden_size)
        self.encoder = BidirectionalMiniCPM(c, patch_size + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, P, _ = x.shape
        h = self.in_proj(x)
        h = torch.cat([self.special_token.expand(B, T, 1, -1), h], dim=2).reshape(B * T, P + 1, -1)
        return self.encoder(h)[:, 0, :].reshape(B, T, -1)


class LocalEncoderStage(nn.Module):
    """patch [B,1,P,D] (float32) → next LM input embedding [B,H_lm] (float32)."""

    def __init__(self, cfg: AudioConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.feat_encoder = LocalEncoder(cfg.encoder, cfg.feat_dim, cfg.patch_size)
        self.enc_to_lm_proj = nn.Linear(cfg.encoder.hidden_size, cfg.lm_hidden_size)

    def forward(self, patch: torch.Tensor) -> torch.Tensor:
        x = patch.to(self.enc_to_lm_proj.weight.dtype)
        return self.enc_to_lm_proj(self.feat_encoder(x)[:, 0, :]).float()


class TimestepEmbedding(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(dim, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


def sinusoidal_embedding(t: torch.Tensor, dim: int, scale: float = 1000.0) -> torch.Tensor:
    """SinusoidalPosEmb, in t's dtype (bf16 in serving) like the reference: [sin | cos] of scale·t·freqs."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, dtype=t.dtype, device=t.device) * -(math.log(10000) / (half - 1)))
    e = scale * t.unsqueeze(1) * freqs.unsqueeze(0)
    return torch.cat((e.sin(), e.cos()), dim=-1)


class LocDiT(nn.Module):
    """LocDiT V2 estimator (`feat_decoder.estimator`): [mu₁..mu_k, t, cond×P, x×P] → velocity of x."""

    def __init__(self, c: TransformerConfig, feat_dim: int, patch_size: int, mu_tokens: int) -> None:
        super().__init__()
        self.hidden = c.hidden_size
        self.in_proj = nn.Linear(feat_dim, c.hidden_size)
        self.cond_proj = nn.Linear(feat_dim, c.hidden_size)
        self.out_proj = nn.Linear(c.hidden_size, feat_dim)
        self.time_mlp = TimestepEmbedding(c.hidden_size)
        self.delta_time_mlp = TimestepEmbedding(c.hidden_size)
        self.decoder = BidirectionalMiniCPM(c, mu_tokens + 1 + 2 * patch_size)

    def forward(self, x: torch.Tensor, mu: torch.Tensor, t: torch.Tensor, cond: torch.Tensor,
                dt: torch.Tensor) -> torch.Tensor:
        """x, cond [N,C,P]; mu [N, k·H]; t, dt [N] → [N,C,P]."""
        h = self.in_proj(x.transpose(1, 2))
        c = self.cond_proj(cond.transpose(1, 2))
        te = self.time_mlp(sinusoidal_embedding(t, self.hidden).to(h.dtype))
        te = te + self.delta_time_mlp(sinusoidal_embedding(dt, self.hidden).to(h.dtype))
        mu = mu.view(h.shape[0], -1, h.shape[-1])
        seq = torch.cat([mu, te.unsqueeze(1), c, h], dim=1)
        out = self.decoder(seq)[:, mu.shape[1] + 1 + c.shape[1]:, :]
        return self.out_proj(out).transpose(1, 2)


def euler_schedule(n_timesteps: int, dtype: torch.dtype,
                   sway: float = 1.0) -> list[tuple[float, float, bool]]:
    """(t, dt, zero_step) per Euler step, computed exactly as UnifiedCFM does in the model dtype: the grid
    u + sway·(cos(πu/2) − 1 + u) on u = linspace(1, 0, n+1), t advanced by t ← t − dt and
    dt ← t − grid[k+1] (0-dim tensors of `dtype`, so bf16 rounding matches), and the first
    max(1, ⌊0.04·(n+1)⌋) steps zero-init."""
    grid = torch.linspace(1, 0, n_timesteps + 1, dtype=dtype, device="cpu")   # also under a meta-device init
    grid = grid + sway * (torch.cos(torch.pi / 2 * grid) - 1 + grid)
    t, dt = grid[0], grid[0] - grid[1]
    zero_steps = max(1, int((n_timesteps + 1) * 0.04))
    out = []
    for step in range(1, n_timesteps + 1):
        out.append((float(t), float(dt), step <= zero_steps))
        t = t - dt
        if step < n_timesteps:
            dt = t - grid[step + 1]
    return out


class CFM(nn.Module):
    """UnifiedCFM inference (`feat_decoder`): Euler solve with CFG-zero*, the estimator on a doubled batch
    (conditional rows first, unconditional rows with mu = 0)."""

    def __init__(self, cfg: AudioConfig, n_timesteps: int, cfg_rate: float) -> None:
        super().__init__()
        # mu = cat[lm_to_dit, res_to_dit] = 2 tokens of the DiT width
        self.estimator = LocDiT(cfg.dit, cfg.feat_dim, cfg.patch_size, mu_tokens=2)
        self.n_timesteps, self.cfg_rate, self.mean_mode = n_timesteps, float(cfg_rate), cfg.dit_mean_mode
        # Computed here, on real tensors: computed inside forward, a bf16 export would trace the grid with fake
        # tensors and float(t) would become an unbacked symbol (seen on torch 2.11: GuardOnDataDependentSymNode).
        self._schedules: dict[torch.dtype, list] = {
            dt: euler_schedule(n_timesteps, dt) for dt in (torch.float32, torch.bfloat16, torch.float16)}

    def schedule(self, dtype: torch.dtype) -> list[tuple[float, float, bool]]:
        return self._schedules[dtype]

    def forward(self, mu: torch.Tensor, cond: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        B = x.shape[0]
        mu2 = torch.cat([mu, torch.zeros_like(mu)], dim=0)
        cond2 = torch.cat([cond, cond], dim=0)
        for t, dt, zero_step in self.schedule(x.dtype):
            if zero_step:
                continue                       # velocity 0: x − dt·0 = x
            t_in = torch.full((2 * B,), t, dtype=x.dtype, device=x.device)
            # dt input is the step size in mean mode, zeros otherwise (the reference's "not used now")
            dt_in = torch.full((2 * B,), dt if self.mean_mode else 0.0, dtype=x.dtype, device=x.device)
            v = self.estimator(torch.cat([x, x], dim=0), mu2, t_in, cond2, dt_in)
            v_c, v_u = v[:B], v[B:]
            pos, neg = v_c.reshape(B, -1), v_u.reshape(B, -1)
            s = (pos * neg).sum(dim=1, keepdim=True) / ((neg**2).sum(dim=1, keepdim=True) + 1e-8)
            s = s.view(B, 1, 1)
            v = v_u * s + self.cfg_rate * (v_c - v_u * s)
            x = x - dt * v
        return x


class LocDiTStage(nn.Module):
    """(lm_hidden, residual_hidden, cond, noise) → patch [B,C,P] (all float32 at the boundary)."""

    def __init__(self, cfg: AudioConfig, n_timesteps: int = DEFAULT_TIMESTEPS,
                 cfg_rate: float | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.feat_decoder = CFM(cfg, n_timesteps, cfg.inference_cfg_rate if cfg_rate is None else cfg_rate)
        self.lm_to_dit_proj = nn.Linear(cfg.lm_hidden_size, cfg.dit.hidden_size)
        self.res_to_dit_proj = nn.Linear(cfg.lm_hidden_size, cfg.dit.hidden_size)

    def forward(self, lm_hidden: torch.Tensor, residual_hidden: torch.Tensor, cond: torch.Tensor,
                noise: torch.Tensor) -> torch.Tensor:
        dtype = self.lm_to_dit_proj.weight.dtype
        mu = torch.cat([self.lm_to_dit_proj(lm_hidden.to(dtype)),
                        self.res_to_dit_proj(residual_hidden.to(dtype))], dim=-1)
        return self.feat_decoder(mu, cond.to(dtype), noise.to(dtype)).float()


# ------------------------------------------------------------------------------------------ checkpoint
# model.safetensors holds every VoxCPM2 part; each stage loads its own prefixes and ignores the others.
_ALL_PREFIXES = ("base_lm.", "residual_lm.", "feat_encoder.", "feat_decoder.", "fsq_layer.",
                 "enc_to_lm_proj.", "lm_to_dit_proj.", "res_to_dit_proj.", "fusion_concat_proj.",
                 "stop_proj.", "stop_head.")
STAGE_PREFIXES = {
    "locdit": ("feat_decoder.", "lm_to_dit_proj.", "res_to_dit_proj."),
    "local_encoder": ("feat_encoder.", "enc_to_lm_proj."),
}


def stage_rules(stage: str) -> KeyRules:
    own = STAGE_PREFIXES[stage]
    return KeyRules(prefix="", ignore_prefixes=tuple(p for p in _ALL_PREFIXES if p not in own))


def load_stage_module(stage: str, ckpt_dir: str | Path, module: nn.Module) -> dict:
    """Strictly load `module` from <ckpt_dir>/model.safetensors (bf16 tensors upcast to the fp32 module)."""
    st = Path(ckpt_dir) / "model.safetensors"
    if not st.is_file():
        raise FileNotFoundError(f"{st}: VoxCPM2 model.safetensors not found")
    tensors, report = read_safetensors_selected(st, stage_rules(stage))
    load_strict(module, tensors, report["unknown"], source=str(st))
    report.update(path=str(st), sha256=sha256_of(st))
    return report


def init_random(module: nn.Module, seed: int = 0) -> nn.Module:
    """Deterministic random weights with realistic scales for the transformer stages."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("special_token"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() == 1 and ("norm" in name):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    return module.eval()


def write_checkpoint(out_dir: str | Path, cfg: AudioConfig, locdit: LocDiTStage, encoder: LocalEncoderStage,
                     vae_decoder: vae.AudioVAEDecoder, extra: dict[str, torch.Tensor] | None = None,
                     vae_extra: dict[str, torch.Tensor] | None = None, dtype: torch.dtype = torch.float32,
                     vae_format: str = "safetensors", config_json: dict | None = None) -> Path:
    """config.json + model.safetensors (+ `extra` tensors of the other parts, e.g. the LMs) + audiovae.* in
    the real layout. The real model.safetensors is bf16: pass dtype=torch.bfloat16 to mimic it."""
    from safetensors.torch import save_file

    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(dtype).contiguous() for m in (locdit, encoder) for k, v in m.state_dict().items()}
    if extra is None:   # a few tensors of the other parts, so loading must ignore them by name
        extra = {"stop_head.weight": torch.zeros(2, cfg.lm_hidden_size),
                 "base_lm.norm.weight": torch.ones(cfg.lm_hidden_size)}
    sd.update({k: v.contiguous() for k, v in extra.items()})
    save_file(sd, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(config_json or preset_config_json(cfg), indent=2))
    vae.write_vae_checkpoint(vae_decoder, d, vae_extra, fmt=vae_format)
    return d


# ------------------------------------------------------------------------------------------- stage specs
def _config(opts) -> AudioConfig:
    return config_from_checkpoint(opts.checkpoint) if opts.checkpoint else PRESETS[opts.preset]


def _report_random(report: dict, seed: int) -> None:
    report.update({"random_weights": True, "seed": seed})


def locdit_stage(opts) -> StageSpec:
    cfg = _config(opts)
    n_steps = opts.n_timesteps or DEFAULT_TIMESTEPS
    cfg_rate = cfg.inference_cfg_rate if opts.cfg_rate is None else float(opts.cfg_rate)
    if n_steps < 2:
        raise ValueError("locdit: n_timesteps must be >= 2 (the first Euler step is zero-init)")
    report: dict = {}

    def make_module() -> nn.Module:
        m = LocDiTStage(cfg, n_steps, cfg_rate)
        if opts.checkpoint:
            report.update(load_stage_module("locdit", opts.checkpoint, m))
            return m.eval()
        _report_random(report, opts.seed)
        return init_random(m, opts.seed + 1)

    C, P, H = cfg.feat_dim, cfg.patch_size, cfg.lm_hidden_size

    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        B = sizes["batch"]
        return {"lm_hidden": torch.randn(B, H, generator=g),
                "residual_hidden": torch.randn(B, H, generator=g),
                "cond": torch.randn(B, C, P, generator=g), "noise": torch.randn(B, C, P, generator=g)}

    dtype = opts.dtype or torch.bfloat16
    plan = BucketPlan({"batch": batch_sizes(opts.max_batch, opts.batch_buckets)})
    estimator_calls = sum(1 for *_, z in euler_schedule(n_steps, dtype) if not z)
    return StageSpec(
        family=FAMILY, name="locdit", kind="generic", make_module=make_module, passes=[fuse_projections],
        plan=plan, make_inputs=make_inputs,
        inputs=[{"name": "lm_hidden", "dtype": "float32", "shape": ["batch", H]},
                {"name": "residual_hidden", "dtype": "float32", "shape": ["batch", H]},
                {"name": "cond", "dtype": "float32", "shape": ["batch", C, P]},
                {"name": "noise", "dtype": "float32", "shape": ["batch", C, P]}],
        outputs=[{"name": "patch", "dtype": "float32", "shape": ["batch", C, P]}],
        dtype=dtype,
        # fp32: kernel-order noise. bf16 vs the fp32 reference (whose time grid is fp32; the bf16 grid is what
        # the reference serves with): measured 1.6e-2..3.9e-2 on tiny random weights over seeds and batches.
        tolerance=1e-4 if dtype == torch.float32 else 8e-2,
        metadata={"n_timesteps": n_steps, "cfg_rate": cfg_rate, "estimator_calls": estimator_calls,
                  "cfg_zero_star": True, "noise": "standard normal [B, feat_dim, patch_size], caller-drawn",
                  "projections_inside": ["lm_to_dit_proj", "res_to_dit_proj"]},
        config=cfg.to_json(), checkpoint_report=report,
        golden_sizes=[],
    )


def local_encoder_stage(opts) -> StageSpec:
    cfg = _config(opts)
    report: dict = {}

    def make_module() -> nn.Module:
        m = LocalEncoderStage(cfg)
        if opts.checkpoint:
            report.update(load_stage_module("local_encoder", opts.checkpoint, m))
            return m.eval()
        _report_random(report, opts.seed)
        return init_random(m, opts.seed + 2)

    C, P, H = cfg.feat_dim, cfg.patch_size, cfg.lm_hidden_size

    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        return {"patch": torch.randn(sizes["batch"], 1, P, C, generator=g)}

    dtype = opts.dtype or torch.bfloat16
    return StageSpec(
        family=FAMILY, name="local_encoder", kind="generic", make_module=make_module,
        passes=[fuse_projections],
        plan=BucketPlan({"batch": batch_sizes(opts.max_batch, opts.batch_buckets)}), make_inputs=make_inputs,
        inputs=[{"name": "patch", "dtype": "float32", "shape": ["batch", 1, P, C]}],
        outputs=[{"name": "embed", "dtype": "float32", "shape": ["batch", H]}],
        dtype=dtype, tolerance=1e-4 if dtype == torch.float32 else 3e-2,
        config=cfg.to_json(), checkpoint_report=report,
    )


def vae_decoder_stage(opts) -> StageSpec:
    cfg = _config(opts).vae
    report: dict = {}

    def make_module() -> nn.Module:
        if opts.checkpoint:
            m, rep = vae.load_vae_decoder(opts.checkpoint, cfg)
            report.update(rep)
            return m
        _report_random(report, opts.seed)
        return vae.init_random_vae(vae.AudioVAEDecoder(cfg), opts.seed + 3)

    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        return {"latents": torch.randn(sizes["batch"], cfg.latent_dim, sizes["frames"], generator=g)}

    streaming = opts.streaming
    rf = vae.receptive_field_frames(cfg)
    frames = frame_sizes(streaming, pow2=opts.pow2_frames, explicit=opts.frame_buckets)
    plan = BucketPlan({"batch": batch_sizes(opts.max_batch, opts.batch_buckets), "frames": frames})
    spf = cfg.samples_per_frame
    return StageSpec(
        family=FAMILY, name="vae_decoder", kind="codec_decoder", make_module=make_module,
        passes=[bake_weight_norm, bake_snake, vae.bake_sample_rate],
        plan=plan, make_inputs=make_inputs,
        inputs=[{"name": "latents", "dtype": "float32", "shape": ["batch", cfg.latent_dim, "frames"],
                 "pad": 0}],
        outputs=[{"name": "wav", "dtype": "float32", "shape": ["batch", 1, ["frames", spf]]}],
        dtype=torch.float32, fp32_only=True,
        tolerance=1e-4,   # fp32: kernel-order noise only
        metadata={"sample_rate": cfg.out_sample_rate, "samples_per_frame": spf,
                  "streaming": asdict(streaming),
                  "receptive_field_frames": rf,
                  "streaming_exact": streaming.left_context_frames >= rf},
        config=cfg.to_json(), checkpoint_report=report,
        golden_sizes=[{"batch": 1, "frames": max(1, frames[0] - 3)}],
    )


def audio_stages(opts) -> list[StageSpec]:
    """The VAE is fp32 whatever `opts.dtype` (numerics policy); locdit/local_encoder use opts.dtype (bf16)."""
    return [locdit_stage(opts), local_encoder_stage(opts), vae_decoder_stage(opts)]


