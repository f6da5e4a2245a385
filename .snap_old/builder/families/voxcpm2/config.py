"""VoxCPM2 configs, all read from one `config.json` (VoxCPMConfig layout): the LMs (`lm_config` + top-level fields),
the local encoder and LocDiT (`encoder_config`, `dit_config`, inheriting kv heads, norms and LongRoPE from
`lm_config`) and the AudioVAE decoder (`audio_vae_config`); named presets. Facts: shared/reference/STAGES.md §3;
upstream `voxcpm/modules/minicpm4/config.py`, `voxcpm/model/voxcpm2.py`."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

DEFAULT_TIMESTEPS = 10  # generate(inference_timesteps=10) in the reference API; not in config.json
DEFAULT_CFG = 2.0  # generate(cfg_value=2.0); config.json's inference_cfg_rate overrides


# -------------------------------------------------------------------------------------------------- LMs
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
    use_mup: bool = True  # upstream's default (voxcpm MiniCPM4Config); VoxCPM2 sets false
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
        d["rope_scaling"] = {
            "type": self.rope_type,
            "short_factor": list(self.rope_short_factor),
            "long_factor": list(self.rope_long_factor),
            "original_max_position_embeddings": self.rope_original_max_position_embeddings,
        }
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
        return replace(
            self.lm, num_hidden_layers=self.residual_lm_num_layers, vocab_size=0, no_rope=self.residual_lm_no_rope
        )

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
LM_PRESETS: dict[str, VoxCPM2LMConfig] = {
    "full": VoxCPM2LMConfig(
        lm=MiniCPM4Config(rope_short_factor=_FULL_FACTORS, rope_long_factor=_FULL_FACTORS, use_mup=False)
    ),
    # Same topology (GQA 4/2, kv_channels ≠ hidden/heads, LongRoPE short factors, residual without RoPE).
    "tiny": VoxCPM2LMConfig(
        lm=MiniCPM4Config(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            kv_channels=32,
            vocab_size=128,
            max_position_embeddings=4096,
            rope_original_max_position_embeddings=4096,
            rope_short_factor=_factors(16, 2),
            rope_long_factor=_factors(16, 3),
            use_mup=False,
        ),
        residual_lm_num_layers=2,
        scalar_quantization_latent_dim=16,
        max_length=256,
    ),
}


# ------------------------------------------------------------------------------------------- AudioVAE
@dataclass(frozen=True)
class VAEConfig:
    """`audio_vae_config` of config.json (AudioVAEConfigV2 names); decode-side fields only matter here."""

    encoder_dim: int = 128
    encoder_rates: tuple[int, ...] = (2, 5, 8, 8)
    latent_dim: int = 64
    decoder_dim: int = 2048
    decoder_rates: tuple[int, ...] = (8, 6, 5, 2, 2, 2)
    depthwise: bool = True
    sample_rate: int = 16000
    out_sample_rate: int = 48000
    use_noise_block: bool = False
    sr_bin_boundaries: tuple[int, ...] | None = (20000, 30000, 40000)
    cond_type: str = "scale_bias"
    cond_dim: int = 128
    cond_out_layer: bool = False

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.decoder_rates)

    @classmethod
    def from_json(cls, d: dict) -> VAEConfig:
        known = set(cls.__dataclass_fields__)
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in known}
        cfg = cls(**kw)
        if cfg.use_noise_block:
            raise ValueError("vae_decoder: use_noise_block=True draws noise inside the decoder: unsupported")
        if cfg.sr_bin_boundaries is not None and (
            cfg.cond_type not in ("scale_bias", "scale_bias_init") or cfg.cond_out_layer
        ):
            raise ValueError(
                f"vae_decoder: sample-rate conditioning {cfg.cond_type!r} (out_layer="
                f"{cfg.cond_out_layer}) is not supported (scale_bias only)"
            )
        return cfg

    def to_json(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}


VAE_PRESETS: dict[str, VAEConfig] = {
    "full": VAEConfig(),
    # Same topology (depthwise, 6 → 4 upsampling blocks, sr conditioning, 29 snakes), small widths and rates.
    "tiny": VAEConfig(encoder_dim=8, encoder_rates=(2, 2), latent_dim=16, decoder_dim=64, decoder_rates=(8, 6, 2, 2)),
}


# ------------------------------------------------------------------------------- local encoder, LocDiT
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
    rope_factors: tuple[float, ...] | None = None  # LongRoPE factors in use (short or long), [head_dim/2]
    rope_scaling: float = 1.0  # LongRoPE attention scaling of cos/sin
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
    vae: VAEConfig = field(default_factory=VAEConfig)

    def to_json(self) -> dict:
        d = asdict(self)
        d["vae"] = self.vae.to_json()
        return json.loads(json.dumps(d))


def _minicpm(
    hidden: int,
    ffn: int,
    heads: int,
    layers: int,
    kv_heads: int = 2,
    head_dim: int = 128,
    factors: tuple[float, ...] | None = None,
) -> TransformerConfig:
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
        hidden_size=hidden,
        intermediate_size=sub.get("ffn_dim", 4096),
        num_attention_heads=heads,
        num_key_value_heads=lm["num_key_value_heads"],
        num_hidden_layers=sub.get("num_layers", 4),
        head_dim=head_dim,
        rms_norm_eps=lm["rms_norm_eps"],
        rope_theta=lm.get("rope_theta", 10000.0),
        rope_factors=factors,
        rope_scaling=scaling,
        use_mup=lm.get("use_mup", MiniCPM4Config.use_mup),
        scale_depth=lm.get("scale_depth", 1.0),
    )


def audio_config_from_dict(d: dict) -> AudioConfig:
    lm = d["lm_config"]
    if lm.get("no_rope"):
        raise ValueError("lm_config.no_rope=True would drop rope from the local encoder / LocDiT: unsupported")
    dit = d.get("dit_config", {})
    cfm = dit.get("cfm_config", {})
    if cfm.get("solver", "euler") != "euler":
        raise ValueError(f"cfm solver {cfm['solver']!r} is not supported (euler only)")
    return AudioConfig(
        lm_hidden_size=lm["hidden_size"],
        patch_size=d.get("patch_size", 4),
        feat_dim=d.get("feat_dim", 64),
        encoder=_sub_config(lm, d.get("encoder_config", {})),
        dit=_sub_config(lm, dit),
        dit_mean_mode=dit.get("dit_mean_mode", False),
        inference_cfg_rate=float(cfm.get("inference_cfg_rate", 1.0)),
        vae=VAEConfig.from_json(d.get("audio_vae_config") or {}),
    )


# The audio sections of config.json per preset. The LM part (kv heads, norms, LongRoPE factors, which the
# local encoder and the DiT inherit) comes from the LM preset of the same name, so one tiny config.json
# serves the whole family.
AUDIO_SECTIONS: dict[str, dict] = {
    "full": {
        "patch_size": 4,
        "feat_dim": 64,
        "encoder_config": {"hidden_dim": 1024, "ffn_dim": 4096, "num_heads": 16, "num_layers": 12, "kv_channels": 128},
        "dit_config": {
            "hidden_dim": 1024,
            "ffn_dim": 4096,
            "num_heads": 16,
            "num_layers": 12,
            "kv_channels": 128,
            "dit_mean_mode": False,
            "cfm_config": {"solver": "euler", "inference_cfg_rate": 2.0},
        },
        "audio_vae_config": VAE_PRESETS["full"].to_json(),
    },
    # Same topology (GQA 4:2 with kv_channels ≠ hidden/heads, LongRoPE factors, 2 mu tokens, 11-token DiT
    # sequence, doubled-batch CFG, depthwise VAE with sr conditioning), small widths.
    "tiny": {
        "patch_size": 4,
        "feat_dim": 16,
        "encoder_config": {"hidden_dim": 64, "ffn_dim": 128, "num_heads": 4, "num_layers": 2, "kv_channels": 32},
        "dit_config": {
            "hidden_dim": 64,
            "ffn_dim": 128,
            "num_heads": 4,
            "num_layers": 2,
            "kv_channels": 32,
            "dit_mean_mode": False,
            "cfm_config": {"solver": "euler", "inference_cfg_rate": 2.0},
        },
        "audio_vae_config": VAE_PRESETS["tiny"].to_json(),
    },
}


def preset_config_dict(name: str) -> dict:
    """The full config.json (real VoxCPMConfig layout) of a preset: the LM preset's part + AUDIO_SECTIONS."""
    d = LM_PRESETS[name].to_json()
    d.update(json.loads(json.dumps(AUDIO_SECTIONS[name])))
    return d


AUDIO_PRESETS: dict[str, AudioConfig] = {n: audio_config_from_dict(preset_config_dict(n)) for n in AUDIO_SECTIONS}


def preset_config_json(cfg: AudioConfig) -> dict:
    """A config.json in the real VoxCPMConfig layout for `cfg`: the preset's own when `cfg` is a preset, else
    synthesized (LM fields the audio stages do not read get placeholder values)."""
    for name, preset in AUDIO_PRESETS.items():
        if preset == cfg:
            return preset_config_dict(name)
    enc, dit = cfg.encoder, cfg.dit
    factors = list(enc.rope_factors) if enc.rope_factors else [1.0] * (enc.head_dim // 2)
    return {
        "architecture": "voxcpm2",
        "lm_config": {
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_size": cfg.lm_hidden_size,
            "intermediate_size": 3 * cfg.lm_hidden_size,
            "max_position_embeddings": 32768,
            "num_attention_heads": enc.num_attention_heads,
            "num_hidden_layers": 2,
            "num_key_value_heads": enc.num_key_value_heads,
            "rms_norm_eps": enc.rms_norm_eps,
            "rope_scaling": {
                "type": "longrope",
                "long_factor": factors,
                "short_factor": factors,
                "original_max_position_embeddings": 32768,
            },
            "vocab_size": 256,
            "use_mup": enc.use_mup,
            "scale_emb": 12,
            "dim_model_base": 256,
            "scale_depth": enc.scale_depth,
            "rope_theta": enc.rope_theta,
            "kv_channels": enc.head_dim,
        },
        "patch_size": cfg.patch_size,
        "feat_dim": cfg.feat_dim,
        "residual_lm_num_layers": 1,
        "residual_lm_no_rope": True,
        "scalar_quantization_latent_dim": 32,
        "scalar_quantization_scale": 9,
        "encoder_config": {
            "hidden_dim": enc.hidden_size,
            "ffn_dim": enc.intermediate_size,
            "num_heads": enc.num_attention_heads,
            "num_layers": enc.num_hidden_layers,
            "kv_channels": enc.head_dim,
        },
        "dit_config": {
            "hidden_dim": dit.hidden_size,
            "ffn_dim": dit.intermediate_size,
            "num_heads": dit.num_attention_heads,
            "num_layers": dit.num_hidden_layers,
            "kv_channels": dit.head_dim,
            "dit_mean_mode": cfg.dit_mean_mode,
            "cfm_config": {
                "sigma_min": 1e-6,
                "solver": "euler",
                "t_scheduler": "log-norm",
                "inference_cfg_rate": cfg.inference_cfg_rate,
            },
        },
        "audio_vae_config": cfg.vae.to_json(),
        "max_length": 8192,
        "device": "cuda",
        "dtype": "bfloat16",
    }


# ----------------------------------------------------------------------------------------- config.json
def _config_json(path: str | Path) -> dict:
    p = Path(path) / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: VoxCPM2 config.json not found")
    return json.loads(p.read_text())


def lm_config_from_checkpoint(path: str | Path) -> VoxCPM2LMConfig:
    return VoxCPM2LMConfig.from_json(_config_json(path))


def audio_config_from_checkpoint(path: str | Path) -> AudioConfig:
    return audio_config_from_dict(_config_json(path))
