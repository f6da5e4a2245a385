"""VoxCPM2 in the bench: buckets, the upstream `voxcpm` modules (constructors shared with the oracle tests), the
looped floors, and the whole decode loop (`python -m bench voxcpm-loop`, bench/families/voxcpm2_loop.py)."""

from __future__ import annotations

import sys
import types

import torch
from torch import nn

from ..upstream import import_module_alone, linear_like, load_our_weights, param_dtype
from . import BenchFamily, Buckets, Upstream


def voxcpm_module(name: str) -> types.ModuleType:
    """`voxcpm.modules.<name>` of voxcpm 2.0.3. The stubbed `voxcpm.modules.minicpm4` package skips its
    __init__, which is what exports MiniCPMModel / MiniCPM4Config to `from ..minicpm4 import ...` in the DiT
    and local-encoder modules: those two names are set on it first."""
    cfg = import_module_alone("voxcpm.modules.minicpm4.config")
    model = import_module_alone("voxcpm.modules.minicpm4.model")
    pkg = sys.modules["voxcpm.modules.minicpm4"]
    pkg.MiniCPM4Config, pkg.MiniCPMModel = cfg.MiniCPM4Config, model.MiniCPMModel
    return import_module_alone(f"voxcpm.modules.{name}")


def _voxcpm_sub_config(lm_cfg, sub: dict):
    """What VoxCPM2Model.__init__ does for the local encoder / DiT configs: a deep copy of lm_config with the
    sub-module's sizes and no vocabulary."""
    c = lm_cfg.model_copy(deep=True)
    c.hidden_size, c.intermediate_size = sub["hidden_dim"], sub["ffn_dim"]
    c.num_attention_heads, c.num_hidden_layers = sub["num_heads"], sub["num_layers"]
    c.kv_channels, c.vocab_size = sub["kv_channels"], 0
    return c


def voxcpm_local_encoder(conf: dict) -> nn.Module:
    """VoxCPMLocEnc (`feat_encoder`) for a config.json dict, uninitialised."""
    lm_cfg = voxcpm_module("minicpm4.config").MiniCPM4Config(**conf["lm_config"])
    enc = voxcpm_module("locenc.local_encoder")
    return enc.VoxCPMLocEnc(_voxcpm_sub_config(lm_cfg, conf["encoder_config"]), input_dim=conf["feat_dim"])


def voxcpm_cfm(conf: dict) -> nn.Module:
    """UnifiedCFM with its VoxCPMLocDiT (V2) estimator (`feat_decoder`) for a config.json dict, uninitialised."""
    lm_cfg = voxcpm_module("minicpm4.config").MiniCPM4Config(**conf["lm_config"])
    cfm, dit = voxcpm_module("locdit.unified_cfm"), conf["dit_config"]
    est = voxcpm_module("locdit.local_dit_v2").VoxCPMLocDiT(
        _voxcpm_sub_config(lm_cfg, dit), in_channels=conf["feat_dim"]
    )
    return cfm.UnifiedCFM(conf["feat_dim"], cfm.CfmConfig(**dit["cfm_config"]), est, mean_mode=dit["dit_mean_mode"])


def voxcpm_audio_vae(vae_config: dict) -> nn.Module:
    """AudioVAE (V2) for config.json's `audio_vae_config`, uninitialised."""
    vae = voxcpm_module("audiovae.audio_vae_v2")
    return vae.AudioVAE(vae.AudioVAEConfig(**vae_config))


def voxcpm_minicpm(lm_config: dict, state: dict[str, torch.Tensor]) -> nn.Module:
    """MiniCPMModel for an `lm_config` dict, loaded strictly from `state` (MiniCPMModel's own names). Without
    `embed_tokens.weight` in `state` it is built with vocab_size 0 (an Identity embedding, as upstream does for
    the residual LM): a decode step never reads the table, which upstream would otherwise allocate."""
    cfg = voxcpm_module("minicpm4.config").MiniCPM4Config(**lm_config)
    if "embed_tokens.weight" not in state:
        cfg.vocab_size = 0
    lm = voxcpm_module("minicpm4.model").MiniCPMModel(cfg)
    lm.load_state_dict(state, strict=True)
    return lm.eval()


def voxcpm_fsq(hidden: int, latent: int, scale: int) -> nn.Module:
    """ScalarQuantizationLayer as VoxCPM2Model builds `fsq_layer`, uninitialised."""
    return voxcpm_module("layers.scalar_quantization_layer").ScalarQuantizationLayer(hidden, hidden, latent, scale)


class VoxCPMLocDiTPatch(nn.Module):
    """(lm_hidden, residual_hidden, cond, noise) → patch: what VoxCPM2Model._inference does per patch, mu =
    cat(lm_to_dit_proj(lm_hidden), res_to_dit_proj(residual_hidden)), then UnifiedCFM's Euler solve
    (`solve_euler`: every estimator call, CFG-zero*). UnifiedCFM.forward draws the start noise itself with
    torch.randn; the stage takes it as its `noise` input, so the adapter calls solve_euler with it and the
    sway-warped time grid forward would build (two elementwise ops on n+1 values)."""

    def __init__(
        self,
        cfm: nn.Module,
        lm_to_dit_proj: nn.Linear,
        res_to_dit_proj: nn.Linear,
        n_timesteps: int,
        cfg_value: float,
        sway_sampling_coef: float = 1.0,
    ) -> None:
        super().__init__()
        self.cfm, self.lm_to_dit_proj, self.res_to_dit_proj = cfm, lm_to_dit_proj, res_to_dit_proj
        self.n_timesteps, self.cfg_value, self.sway = n_timesteps, cfg_value, sway_sampling_coef

    def forward(self, lm_hidden, residual_hidden, cond, noise):
        dt = param_dtype(self)
        mu = torch.cat((self.lm_to_dit_proj(lm_hidden.to(dt)), self.res_to_dit_proj(residual_hidden.to(dt))), -1)
        t_span = torch.linspace(1, 0, self.n_timesteps + 1, device=mu.device, dtype=mu.dtype)
        t_span = t_span + self.sway * (torch.cos(torch.pi / 2 * t_span) - 1 + t_span)
        return self.cfm.solve_euler(
            x=noise.to(dt), t_span=t_span, mu=mu, cond=cond.to(dt), cfg_value=self.cfg_value, use_cfg_zero_star=True
        ).float()


class VoxCPMLocalEncoderEmbed(nn.Module):
    """patch [B,1,P,D] → next LM input [B,H]: `enc_to_lm_proj(feat_encoder(patch))[:, 0]` as in
    VoxCPM2Model._inference."""

    def __init__(self, feat_encoder: nn.Module, enc_to_lm_proj: nn.Linear) -> None:
        super().__init__()
        self.feat_encoder, self.enc_to_lm_proj = feat_encoder, enc_to_lm_proj

    def forward(self, patch):
        return self.enc_to_lm_proj(self.feat_encoder(patch.to(param_dtype(self))))[:, 0].float()


class VoxCPMVAEDecode(nn.Module):
    """latents [B,64,F] → wav: `AudioVAE.decode(latents)` (upstream's weight norm hooks and sample-rate
    conditioning included; the encoder, which decoding never reads, is dropped)."""

    def __init__(self, vae: nn.Module) -> None:
        super().__init__()
        vae.encoder = None
        self.vae = vae

    def forward(self, latents):
        return self.vae.decode(latents)


class VoxCPMLMStep(nn.Module):
    """One decode step through upstream's MiniCPMModel.forward_step and its own StaticKVCache.

    The stage's k/v cache inputs ([layers,B,kv_heads,S,head_dim] each) are loaded into upstream's cache with
    its `fill_caches` (the call VoxCPM2Model makes after prefill) only when the step is called with other cache
    tensors than last time: in the bench that is once per bucket, never per timed call. Upstream then writes
    the step's k/v into its own cache, as in serving. Upstream decodes a batch in lockstep, one position for
    every row (`torch.tensor([kv_cache.step()])`): the adapter passes row 0's position, so rows at other
    positions are not comparable with the stage (same work: upstream attends over the whole cache under a
    mask). Its cache has the stage's S = max_len + 1 slots; VoxCPM2 itself allocates config.max_length."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm
        self._bound: tuple[torch.Tensor, torch.Tensor] | None = None

    @torch.compiler.disable
    def use_caches(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        if self._bound is not None and self._bound[0] is k_cache and self._bound[1] is v_cache:
            return
        layers, batch, _, slots, _ = k_cache.shape
        # in the model's dtype, as VoxCPM2Model sets it up (the stage's caches are in the compute dtype too)
        self.lm.setup_cache(batch, slots, k_cache.device, param_dtype(self))
        self.lm.kv_cache.fill_caches([(k_cache[i], v_cache[i]) for i in range(layers)])
        self._bound = (k_cache, v_cache)

    def step(self, x: torch.Tensor, positions: torch.Tensor, k_cache, v_cache) -> torch.Tensor:
        self.use_caches(k_cache, v_cache)
        return self.lm.forward_step(x, positions[:1])


class VoxCPMBaseLMStep(VoxCPMLMStep):
    """(embeds, positions, k, v) → (hidden, lm_hidden = fsq_layer(hidden), stop_logits =
    stop_head(stop_actn(stop_proj(lm_hidden)))), as VoxCPM2Model._inference computes them per step."""

    def __init__(self, lm: nn.Module, fsq_layer: nn.Module, stop_proj: nn.Linear, stop_head: nn.Linear) -> None:
        super().__init__(lm)
        self.fsq_layer, self.stop_proj, self.stop_head = fsq_layer, stop_proj, stop_head
        self.stop_actn = nn.SiLU()

    def forward(self, embeds, positions, k_cache, v_cache):
        h = self.step(embeds.to(param_dtype(self)), positions, k_cache, v_cache)
        lm_h = self.fsq_layer(h)
        stop = self.stop_head(self.stop_actn(self.stop_proj(lm_h)))
        return h.float(), lm_h.float(), stop.float()


class VoxCPMResidualLMStep(VoxCPMLMStep):
    """(lm_hidden, feat_embed, positions, k, v) → residual_lm.forward_step(fusion_concat_proj(cat(lm_hidden,
    feat_embed))), as VoxCPM2Model._inference computes it per step."""

    def __init__(self, lm: nn.Module, fusion_concat_proj: nn.Linear) -> None:
        super().__init__(lm)
        self.fusion_concat_proj = fusion_concat_proj

    def forward(self, lm_hidden, feat_embed, positions, k_cache, v_cache):
        dt = param_dtype(self)
        x = self.fusion_concat_proj(torch.cat((lm_hidden.to(dt), feat_embed.to(dt)), dim=-1))
        return self.step(x, positions, k_cache, v_cache).float()


def _voxcpm_audio_conf(ours: nn.Module) -> dict:
    from ttsaot.builder.families.voxcpm2.config import preset_config_json

    return preset_config_json(ours.cfg)


def _voxcpm_locdit(ours: nn.Module) -> nn.Module:
    cfm = voxcpm_cfm(_voxcpm_audio_conf(ours))
    cfm.estimator.load_state_dict(ours.feat_decoder.estimator.state_dict(), strict=True)
    fd = ours.feat_decoder
    return VoxCPMLocDiTPatch(
        cfm, linear_like(ours.lm_to_dit_proj), linear_like(ours.res_to_dit_proj), fd.n_timesteps, fd.cfg_rate
    )


def _voxcpm_local_encoder(ours: nn.Module) -> nn.Module:
    enc = voxcpm_local_encoder(_voxcpm_audio_conf(ours))
    enc.load_state_dict(ours.feat_encoder.state_dict(), strict=True)
    return VoxCPMLocalEncoderEmbed(enc, linear_like(ours.enc_to_lm_proj))


def _voxcpm_vae_decoder(ours: nn.Module) -> nn.Module:
    up = VoxCPMVAEDecode(voxcpm_audio_vae(ours.cfg.to_json()))  # encoder dropped: load the decoder only
    load_our_weights(up.vae, ours)
    return up


def _voxcpm_base_lm_step(ours: nn.Module) -> nn.Module:
    lm = voxcpm_minicpm(ours.base_lm.cfg.to_json(), ours.base_lm.state_dict())
    fsq = ours.fsq_layer
    up_fsq = voxcpm_fsq(fsq.in_proj.in_features, fsq.in_proj.out_features, fsq.scale)
    up_fsq.load_state_dict(fsq.state_dict(), strict=True)
    return VoxCPMBaseLMStep(lm, up_fsq, linear_like(ours.stop_proj), linear_like(ours.stop_head))


def _voxcpm_residual_lm_step(ours: nn.Module) -> nn.Module:
    lm = voxcpm_minicpm(ours.residual_lm.cfg.to_json(), ours.residual_lm.state_dict())
    return VoxCPMResidualLMStep(lm, linear_like(ours.fusion_concat_proj))


LM_CTX = {"max_len": 512}  # the issue evidence: decode steps and prefills over a 512-token cache

BENCH = BenchFamily(
    buckets={
        "base_lm_step": {"full": Buckets(axes={"batch": (1, 16)}, options=LM_CTX)},
        "residual_lm_step": {"full": Buckets(axes={"batch": (1, 16)}, options=LM_CTX)},
        "base_lm_prefill": {"full": Buckets(axes={"batch": (1, 4), "tokens": (64, 256)}, options=LM_CTX)},
        "residual_lm_prefill": {"full": Buckets(axes={"batch": (1, 4), "tokens": (64, 256)}, options=LM_CTX)},
        "locdit": {"full": Buckets(axes={"batch": (1, 16)})},
        "local_encoder": {"full": Buckets(axes={"batch": (1, 16)})},
        "vae_decoder": {"full": Buckets(axes={"batch": (1,), "frames": (36,)})},  # 12 new + 24 context frames
    },
    upstream={
        "locdit": Upstream("voxcpm UnifiedCFM.solve_euler + VoxCPMLocDiT (V2)", _voxcpm_locdit),
        "local_encoder": Upstream("voxcpm VoxCPMLocEnc + enc_to_lm_proj", _voxcpm_local_encoder),
        "vae_decoder": Upstream("voxcpm AudioVAE (V2).decode", _voxcpm_vae_decoder),
        "base_lm_step": Upstream(
            "voxcpm MiniCPMModel.forward_step (StaticKVCache) + fsq + stop head", _voxcpm_base_lm_step
        ),
        "residual_lm_step": Upstream(
            "voxcpm MiniCPMModel.forward_step (StaticKVCache) after fusion_concat_proj", _voxcpm_residual_lm_step
        ),
    },
    layers={
        "locdit": lambda e: (
            e.config["dit"]["num_hidden_layers"] * e.metadata["estimator_calls"],
            "DiT layers × estimator calls",
        ),
        "local_encoder": lambda e: (e.config["encoder"]["num_hidden_layers"], "encoder layers"),
    },
    commands={"voxcpm-loop": "bench.families.voxcpm2_loop"},
    report_sections={"decode_loop": "bench.families.voxcpm2_report:decode_loop_section"},
)
