"""Upstream implementations with OUR random weights, where they run without their serving engine.

Upstream code is never vendored: it is imported from the installed package (one module at a time, without the
package __init__, which pulls audio and hub stacks). Where it is not importable the bench records
"unavailable: <reason>" instead of failing.

Each UPSTREAM entry takes our faithful fp32 stage module and returns an upstream nn.Module holding the same
weights whose forward takes the stage inputs in the StageSpec's order and returns the stage outputs. Where the
upstream call has another signature, a thin adapter module does only the argument plumbing (dtype casts of the
fp32 stage inputs, a lengths tensor, picking an output); everything timed inside it is upstream code.

The constructors (`fish_dac_upstream`, `voxcpm_*`) are shared with the oracle tests (tests/oracle/), which load
real-format checkpoints into them: one implementation of "how upstream is built"."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from .common import Skipped, short_error


def import_module_alone(dotted: str):
    """Import `a.b.c` with its parent packages stubbed (real __path__, no __init__ executed)."""
    top = dotted.split(".")[0]
    if top in sys.modules and getattr(sys.modules[top], "__path__", None):   # already stubbed by an earlier call
        root = Path(list(sys.modules[top].__path__)[0])
    else:
        spec = importlib.util.find_spec(top)
        if spec is None or not spec.submodule_search_locations:
            raise Skipped(f"unavailable: upstream package {top!r} is not installed")
        root = Path(list(spec.submodule_search_locations)[0])
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        name = ".".join(parts[:i])
        if name in sys.modules:
            continue
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(root.joinpath(*parts[1:i]))]
        sys.modules[name] = pkg
    try:
        return importlib.import_module(dotted)
    except Exception as e:  # noqa: BLE001
        raise Skipped(f"unavailable: import {dotted} failed ({short_error(e)})") from e


# ------------------------------------------------------------------------------------------------ weights
def load_our_weights(up: nn.Module, ours: nn.Module, unread: str | None = None) -> None:
    """Load `ours`' state into `up` under upstream's names. Names are the same except where upstream keeps
    legacy weight norm (`weight_g`/`weight_v`) and we the parametrization (`original0`/`original1`).
    `unread` (regex) names upstream tensors that may stay as upstream initialised them: buffers the forward
    never reads from the state (e.g. rope tables upstream rebuilds itself). Anything else missing, and any
    tensor of ours left over, is an error: the two modules must hold the same weights."""
    from ttsaot.builder.passes.weight_norm import legacy_weight_norm_to_new

    src = ours.state_dict()
    mapped: dict[str, torch.Tensor] = {}
    # our name → upstream's: the checkpoint loader's own legacy→parametrization key mapping
    for name, key in legacy_weight_norm_to_new({k: k for k in up.state_dict()}).items():
        if name in src:
            mapped[key] = src.pop(name)
    missing = [k for k in up.state_dict() if k not in mapped and not (unread and re.fullmatch(unread, k))]
    if missing or src:
        raise Skipped(f"unavailable: weights do not map onto upstream (missing {missing[:3]}, "
                      f"ours left over {list(src)[:3]})")
    up.load_state_dict(mapped, strict=False)


# --------------------------------------------------------------------------------- qwen3-tts code2wav
def _qwen_code2wav(ours: nn.Module) -> nn.Module:
    """qwen-tts Qwen3TTSTokenizerV2Decoder with our faithful module's weights (same key names; upstream also
    has the encode-only `input_proj` convs, which decoding never reads)."""
    cfg_mod = import_module_alone("qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2")
    model_mod = import_module_alone("qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2")
    d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(ours.cfg).items()}
    cfg = cfg_mod.Qwen3TTSTokenizerV2DecoderConfig(**d)
    cfg._attn_implementation = "sdpa"
    up = model_mod.Qwen3TTSTokenizerV2Decoder(cfg).eval()
    missing, unexpected = up.load_state_dict(ours.state_dict(), strict=False)
    bad_missing = [k for k in missing if ".input_proj." not in k]
    if unexpected or bad_missing:
        raise Skipped(
            f"unavailable: weights do not map onto upstream (missing {bad_missing[:3]}, "
            f"unexpected {list(unexpected)[:3]})"
        )
    return up


# ------------------------------------------------------------------------------------ fish-s2-pro DAC
# vLLM-Omni 0.30.0 vendors fish-speech's `modded_dac` + `rvq` trimmed to inference (same parameter tree, same
# math) and, unlike `fish_speech.models.dac`, needs torch only.
FISH_DAC_PKG = "vllm_omni.model_executor.models.fish_speech.dac_modules"
# The WindowLimitedTransformers' rope table and causal mask: rebuilt by upstream's constructor; ours never
# stores them (fish_dac.IGNORED_BUFFERS).
_FISH_UNREAD = r".*\.(freqs_cis|causal_mask)"


def fish_dac_upstream(cfg) -> nn.Module:
    """vLLM-Omni's DAC built as its `dac_utils.build_dac_codec` builds it, with the sizes of our DACConfig
    `cfg` (uninitialised weights, eval mode)."""
    codec = import_module_alone(f"{FISH_DAC_PKG}.codec")
    rvq = import_module_alone(f"{FISH_DAC_PKG}.rvq")
    tr = import_module_alone(f"{FISH_DAC_PKG}.transformer")
    common = dict(n_local_heads=-1, rope_base=cfg.rope_base, norm_eps=cfg.norm_eps, dropout_rate=0.0,
                  attn_dropout_rate=0.0, channels_first=True)
    q_args = tr.ModelArgs(block_size=cfg.quantizer_block_size, n_layer=cfg.quantizer_layers,
                          n_head=cfg.quantizer_heads, dim=cfg.latent_dim,
                          intermediate_size=cfg.quantizer_intermediate, head_dim=cfg.quantizer_head_dim,
                          **common)

    def quantizer_transformer():
        return tr.WindowLimitedTransformer(causal=True, window_size=cfg.quantizer_window,
                                           input_dim=cfg.latent_dim, config=q_args)

    quantizer = rvq.DownsampleResidualVectorQuantize(
        input_dim=cfg.latent_dim, n_codebooks=cfg.n_codebooks, codebook_size=cfg.codebook_size,
        codebook_dim=cfg.codebook_dim, quantizer_dropout=0.0, downsample_factor=list(cfg.downsample_factor),
        post_module=quantizer_transformer(), pre_module=quantizer_transformer(),
        semantic_codebook_size=cfg.semantic_codebook_size)

    def encoder_transformer_config(**kw):
        return tr.ModelArgs(**{"block_size": cfg.encoder_block_size, "head_dim": cfg.transformer_head_dim,
                               **common, **kw})

    return codec.DAC(
        encoder_dim=cfg.encoder_dim, encoder_rates=list(cfg.encoder_rates), decoder_dim=cfg.decoder_dim,
        decoder_rates=list(cfg.decoder_rates), quantizer=quantizer, sample_rate=cfg.sample_rate, causal=True,
        encoder_transformer_layers=list(cfg.encoder_transformer_layers),
        decoder_transformer_layers=[4, 0, 0, 0],          # as upstream: built, never registered
        transformer_general_config=encoder_transformer_config).eval()


def _fish_dac_with_our_weights(ours: nn.Module) -> nn.Module:
    up = fish_dac_upstream(ours.cfg)
    load_our_weights(up, ours, unread=_FISH_UNREAD)
    return up


def _memoised(build: Callable) -> Callable:
    """A mask builder `(max_length, x_lens=None)` that keeps one mask per length when x_lens is None."""
    cache: dict[int, torch.Tensor] = {}

    def cached(max_length: int, x_lens: torch.Tensor | None = None) -> torch.Tensor:
        if x_lens is not None:
            return build(max_length, x_lens)
        if int(max_length) not in cache:
            cache[int(max_length)] = build(max_length, None)
        return cache[int(max_length)]

    return cached


class FishDACDecode(nn.Module):
    """codes [B,10,F] → wav [B,1,F·2048]: `codec.decode(codes, feature_lengths)[0]`, the call of vLLM-Omni's
    FishSpeechDACDecoder, on the codec prepared as that class loads it: weight norm baked (torch's
    remove_parametrizations), each transformer's attention masks memoised per length (calling upstream's own
    mask builders), the encode-only modules dropped."""

    def __init__(self, codec: nn.Module) -> None:
        super().__init__()
        from torch.nn.utils.parametrize import remove_parametrizations

        for module in codec.modules():
            for name in list(getattr(module, "parametrizations", None) or {}):
                remove_parametrizations(module, name, leave_parametrized=True)
            if hasattr(module, "make_mask") and hasattr(module, "make_window_limited_mask"):
                module.make_mask = _memoised(module.make_mask)
                module.make_window_limited_mask = _memoised(module.make_window_limited_mask)
        codec.encoder = None
        codec.quantizer.pre_module = None
        codec.quantizer.downsample = None
        self.codec = codec

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        lengths = torch.full((codes.shape[0],), codes.shape[-1], dtype=torch.long, device=codes.device)
        return self.codec.decode(codes, lengths)[0]


class FishDACEncode(nn.Module):
    """audio [1,1,T] → codes [1,10,⌈T/2048⌉]: `codec.encode(audio, lengths)[0]`, the call of vLLM-Omni's
    `encode_reference_audio_codes`, on the codec as its `_load_dac_codec` loads it (weight norm kept, the
    decoder dropped). Upstream's encode runs the whole quantizer forward (post_module and upsample included)."""

    def __init__(self, codec: nn.Module) -> None:
        super().__init__()
        codec.decoder = None
        self.codec = codec

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        lengths = torch.full((audio.shape[0],), audio.shape[-1], dtype=torch.long, device=audio.device)
        return self.codec.encode(audio, lengths)[0]


def _fish_dac_decoder(ours: nn.Module) -> nn.Module:
    return FishDACDecode(_fish_dac_with_our_weights(ours))


def _fish_dac_encoder(ours: nn.Module) -> nn.Module:
    return FishDACEncode(_fish_dac_with_our_weights(ours))


# ---------------------------------------------------------------------------------------------- voxcpm2
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
    est = voxcpm_module("locdit.local_dit_v2").VoxCPMLocDiT(_voxcpm_sub_config(lm_cfg, dit),
                                                            in_channels=conf["feat_dim"])
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


def _linear_like(ours: nn.Linear) -> nn.Linear:
    """VoxCPM2Model's plain projections (`nn.Linear` there) with our weights."""
    lin = nn.Linear(ours.in_features, ours.out_features, bias=ours.bias is not None)
    lin.load_state_dict(ours.state_dict(), strict=True)
    return lin


def _param_dtype(m: nn.Module) -> torch.dtype:
    return next(p for p in m.parameters() if p.is_floating_point()).dtype


class VoxCPMLocDiTPatch(nn.Module):
    """(lm_hidden, residual_hidden, cond, noise) → patch: what VoxCPM2Model._inference does per patch, mu =
    cat(lm_to_dit_proj(lm_hidden), res_to_dit_proj(residual_hidden)), then UnifiedCFM's Euler solve
    (`solve_euler`: every estimator call, CFG-zero*). UnifiedCFM.forward draws the start noise itself with
    torch.randn; the stage takes it as its `noise` input, so the adapter calls solve_euler with it and the
    sway-warped time grid forward would build (two elementwise ops on n+1 values)."""

    def __init__(self, cfm: nn.Module, lm_to_dit_proj: nn.Linear, res_to_dit_proj: nn.Linear,
                 n_timesteps: int, cfg_value: float, sway_sampling_coef: float = 1.0) -> None:
        super().__init__()
        self.cfm, self.lm_to_dit_proj, self.res_to_dit_proj = cfm, lm_to_dit_proj, res_to_dit_proj
        self.n_timesteps, self.cfg_value, self.sway = n_timesteps, cfg_value, sway_sampling_coef

    def forward(self, lm_hidden, residual_hidden, cond, noise):
        dt = _param_dtype(self)
        mu = torch.cat((self.lm_to_dit_proj(lm_hidden.to(dt)), self.res_to_dit_proj(residual_hidden.to(dt))), -1)
        t_span = torch.linspace(1, 0, self.n_timesteps + 1, device=mu.device, dtype=mu.dtype)
        t_span = t_span + self.sway * (torch.cos(torch.pi / 2 * t_span) - 1 + t_span)
        return self.cfm.solve_euler(x=noise.to(dt), t_span=t_span, mu=mu, cond=cond.to(dt),
                                    cfg_value=self.cfg_value, use_cfg_zero_star=True).float()


class VoxCPMLocalEncoderEmbed(nn.Module):
    """patch [B,1,P,D] → next LM input [B,H]: `enc_to_lm_proj(feat_encoder(patch))[:, 0]` as in
    VoxCPM2Model._inference."""

    def __init__(self, feat_encoder: nn.Module, enc_to_lm_proj: nn.Linear) -> None:
        super().__init__()
        self.feat_encoder, self.enc_to_lm_proj = feat_encoder, enc_to_lm_proj

    def forward(self, patch):
        return self.enc_to_lm_proj(self.feat_encoder(patch.to(_param_dtype(self))))[:, 0].float()


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
        self.lm.setup_cache(batch, slots, k_cache.device, _param_dtype(self))
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
        h = self.step(embeds.to(_param_dtype(self)), positions, k_cache, v_cache)
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
        dt = _param_dtype(self)
        x = self.fusion_concat_proj(torch.cat((lm_hidden.to(dt), feat_embed.to(dt)), dim=-1))
        return self.step(x, positions, k_cache, v_cache).float()


def _voxcpm_audio_conf(ours: nn.Module) -> dict:
    from ttsaot.builder.families.voxcpm2.config import preset_config_json

    return preset_config_json(ours.cfg)


def _voxcpm_locdit(ours: nn.Module) -> nn.Module:
    cfm = voxcpm_cfm(_voxcpm_audio_conf(ours))
    cfm.estimator.load_state_dict(ours.feat_decoder.estimator.state_dict(), strict=True)
    fd = ours.feat_decoder
    return VoxCPMLocDiTPatch(cfm, _linear_like(ours.lm_to_dit_proj), _linear_like(ours.res_to_dit_proj),
                             fd.n_timesteps, fd.cfg_rate)


def _voxcpm_local_encoder(ours: nn.Module) -> nn.Module:
    enc = voxcpm_local_encoder(_voxcpm_audio_conf(ours))
    enc.load_state_dict(ours.feat_encoder.state_dict(), strict=True)
    return VoxCPMLocalEncoderEmbed(enc, _linear_like(ours.enc_to_lm_proj))


def _voxcpm_vae_decoder(ours: nn.Module) -> nn.Module:
    up = VoxCPMVAEDecode(voxcpm_audio_vae(ours.cfg.to_json()))     # encoder dropped: load the decoder only
    load_our_weights(up.vae, ours)
    return up


def _voxcpm_base_lm_step(ours: nn.Module) -> nn.Module:
    lm = voxcpm_minicpm(ours.base_lm.cfg.to_json(), ours.base_lm.state_dict())
    fsq = ours.fsq_layer
    up_fsq = voxcpm_fsq(fsq.in_proj.in_features, fsq.in_proj.out_features, fsq.scale)
    up_fsq.load_state_dict(fsq.state_dict(), strict=True)
    return VoxCPMBaseLMStep(lm, up_fsq, _linear_like(ours.stop_proj), _linear_like(ours.stop_head))


def _voxcpm_residual_lm_step(ours: nn.Module) -> nn.Module:
    lm = voxcpm_minicpm(ours.residual_lm.cfg.to_json(), ours.residual_lm.state_dict())
    return VoxCPMResidualLMStep(lm, _linear_like(ours.fusion_concat_proj))


# (family, stage) → builder(our faithful fp32 module) → upstream nn.Module with the same weights, same forward
# signature (inputs in the StageSpec's order).
UPSTREAM: dict[tuple[str, str], tuple[str, Callable[[nn.Module], nn.Module]]] = {
    ("qwen3-tts-12hz", "code2wav"): ("qwen_tts Qwen3TTSTokenizerV2Decoder", _qwen_code2wav),
    ("fish-s2-pro", "dac_decoder"): ("vllm_omni fish_speech DAC.decode (weight norm baked, as served)",
                                     _fish_dac_decoder),
    ("fish-s2-pro", "dac_encoder"): ("vllm_omni fish_speech DAC.encode", _fish_dac_encoder),
    ("voxcpm2", "locdit"): ("voxcpm UnifiedCFM.solve_euler + VoxCPMLocDiT (V2)", _voxcpm_locdit),
    ("voxcpm2", "local_encoder"): ("voxcpm VoxCPMLocEnc + enc_to_lm_proj", _voxcpm_local_encoder),
    ("voxcpm2", "vae_decoder"): ("voxcpm AudioVAE (V2).decode", _voxcpm_vae_decoder),
    ("voxcpm2", "base_lm_step"): ("voxcpm MiniCPMModel.forward_step (StaticKVCache) + fsq + stop head",
                                  _voxcpm_base_lm_step),
    ("voxcpm2", "residual_lm_step"): ("voxcpm MiniCPMModel.forward_step (StaticKVCache) after "
                                      "fusion_concat_proj", _voxcpm_residual_lm_step),
}


def upstream_module(family: str, stage: str, ours: nn.Module) -> tuple[str, nn.Module]:
    entry = UPSTREAM.get((family, stage))
    if entry is None:
        raise Skipped("unavailable: no standalone upstream module for this stage is wired into the bench")
    name, build = entry
    try:
        return name, build(ours).eval()
    except Skipped:
        raise
    except Exception as e:  # noqa: BLE001
        raise Skipped(f"unavailable: building {name} failed ({short_error(e)})") from e
