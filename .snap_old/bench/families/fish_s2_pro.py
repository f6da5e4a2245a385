"""Fish Speech S2 Pro in the bench: buckets, vLLM-Omni's DAC (decode and encode) as the upstream comparator, the
Fast AR's per-step loop."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..predictor_loops import StepAdapter
from ..upstream import import_module_alone, load_our_weights
from . import BenchFamily, Buckets, Upstream
from .qwen3_tts_12hz import CODEC_DECODER

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
    common = dict(
        n_local_heads=-1,
        rope_base=cfg.rope_base,
        norm_eps=cfg.norm_eps,
        dropout_rate=0.0,
        attn_dropout_rate=0.0,
        channels_first=True,
    )
    q_args = tr.ModelArgs(
        block_size=cfg.quantizer_block_size,
        n_layer=cfg.quantizer_layers,
        n_head=cfg.quantizer_heads,
        dim=cfg.latent_dim,
        intermediate_size=cfg.quantizer_intermediate,
        head_dim=cfg.quantizer_head_dim,
        **common,
    )

    def quantizer_transformer():
        return tr.WindowLimitedTransformer(
            causal=True, window_size=cfg.quantizer_window, input_dim=cfg.latent_dim, config=q_args
        )

    quantizer = rvq.DownsampleResidualVectorQuantize(
        input_dim=cfg.latent_dim,
        n_codebooks=cfg.n_codebooks,
        codebook_size=cfg.codebook_size,
        codebook_dim=cfg.codebook_dim,
        quantizer_dropout=0.0,
        downsample_factor=list(cfg.downsample_factor),
        post_module=quantizer_transformer(),
        pre_module=quantizer_transformer(),
        semantic_codebook_size=cfg.semantic_codebook_size,
    )

    def encoder_transformer_config(**kw):
        return tr.ModelArgs(
            **{"block_size": cfg.encoder_block_size, "head_dim": cfg.transformer_head_dim, **common, **kw}
        )

    return codec.DAC(
        encoder_dim=cfg.encoder_dim,
        encoder_rates=list(cfg.encoder_rates),
        decoder_dim=cfg.decoder_dim,
        decoder_rates=list(cfg.decoder_rates),
        quantizer=quantizer,
        sample_rate=cfg.sample_rate,
        causal=True,
        encoder_transformer_layers=list(cfg.encoder_transformer_layers),
        decoder_transformer_layers=[4, 0, 0, 0],  # as upstream: built, never registered
        transformer_general_config=encoder_transformer_config,
    ).eval()


def dac_with_our_weights(ours: nn.Module) -> nn.Module:
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


class FastARSteps(StepAdapter):
    """Mirrors `FastAR.decode` / `FastAR.forward`."""

    first_input = "token"

    def __init__(self, m: nn.Module) -> None:
        self.m, self.cfg = m, m.cfg
        self.layers, self.rope_cos, self.rope_sin = m.layers, m.rope_cos, m.rope_sin
        self.n_steps = m.cfg.num_codebooks - 1

    def norm_weight(self) -> torch.Tensor:
        return self.m.norm.weight

    def code0(self, token):
        return (token - self.cfg.semantic_start_token_id).clamp(0, self.cfg.vocab_size - 1)

    def prefix(self, hidden, token):
        return torch.stack((hidden.to(self.dtype), self.m.embeddings(self.code0(token))), dim=1)

    def embed(self, code, *weights):
        return self.m.embeddings(code)[:, None]

    def head(self, h, *weights):
        return self.m.output(self.m.norm(h))[:, : self.cfg.residual_codebook_size]

    def outputs(self, named, codes):
        out = torch.stack(codes, dim=1)
        if not self.m.with_embedding:
            return out
        return out, self.m.next_input_embedding(named["token"], out, named["token_embed"])


BENCH = BenchFamily(
    buckets={
        # Fish streams a 4-frame first chunk, then 25 new frames with 25 of context: windows of 29 (4 + 25) and 50.
        "dac_decoder": {**CODEC_DECODER, "full": Buckets(axes={"batch": (1, 4), "frames": (29, 50)})},
        "fast_ar": {"full": Buckets(axes={"batch": (1, 8)})},
        "dac_encoder": {"full": Buckets(options={"encoder_seconds": (10.0,)})},  # a 10 s reference clip
    },
    upstream={
        "dac_decoder": Upstream(
            "vllm_omni fish_speech DAC.decode (weight norm baked, as served)",
            lambda ours: FishDACDecode(dac_with_our_weights(ours)),
        ),
        "dac_encoder": Upstream(
            "vllm_omni fish_speech DAC.encode", lambda ours: FishDACEncode(dac_with_our_weights(ours))
        ),
    },
    step_loops={"fast_ar": FastARSteps},
    layers={
        "fast_ar": lambda e: (e.config["n_layer"] * e.metadata["sampled_codebooks"], "n_layer × sampled codebook steps")
    },
)
