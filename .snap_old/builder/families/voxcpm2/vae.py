"""VoxCPM2 AudioVAE V2 decoder (`vae_decoder` stage): latents [B,64,F] → wave [B,1,F·1920] at 48 kHz, fp32.

Facts: shared/reference/STAGES.md §3.2. The module tree mirrors `audiovae.safetensors` (`decoder.*`): the
causal convs ARE Conv1d / ConvTranspose1d subclasses there (weights directly on them, not under `.conv`),
with LEGACY weight norm (`weight_g`/`weight_v`). We build new-style weight norm and rename the keys on load
(passes.weight_norm), then bake: weight norm → plain weights, Snake (linear alpha) → `ttsaot::snake_beta`, the
sample-rate conditioning (48 kHz bin, a constant) → one per-channel affine per block.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...layers.snake import Snake1d
from ...passes.prune import count_parameters
from ...passes.weight_norm import weight_norm
from .config import VAEConfig


class CausalConv1d(nn.Conv1d):
    """Conv1d with `(kernel-1)·dilation` zeros on the left (stride 1 in the decoder)."""

    def __init__(self, *args, left_pad: int = 0, **kw) -> None:
        super().__init__(*args, **kw)
        self.left_pad = left_pad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.left_pad, 0)) if self.left_pad else x)


class CausalConvTranspose1d(nn.ConvTranspose1d):
    """ConvTranspose1d(k=2r, stride r) with the r-sample tail trimmed: exactly T·r outputs."""

    def __init__(self, *args, trim: int = 0, **kw) -> None:
        super().__init__(*args, **kw)
        self.trim = trim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return y[..., : y.shape[-1] - self.trim]


def _wn_conv(cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1) -> nn.Module:
    return weight_norm(
        CausalConv1d(cin, cout, kernel, dilation=dilation, groups=groups, left_pad=(kernel - 1) * dilation)
    )


class CausalResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int, groups: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(dim), _wn_conv(dim, dim, 7, dilation, groups), Snake1d(dim), _wn_conv(dim, dim, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class CausalDecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int, groups: int) -> None:
        super().__init__()
        # reference trim = 2·ceil(r/2) − r%2 = r for every r
        up = weight_norm(CausalConvTranspose1d(cin, cout, 2 * rate, stride=rate, trim=rate))
        units = (CausalResidualUnit(cout, d, groups) for d in (1, 3, 9))
        self.block = nn.Sequential(Snake1d(cin), up, *units)
        self.input_channels = cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class SampleRateCondition(nn.Module):
    """x · scale_embed[bin] + bias_embed[bin] (cond_type scale_bias), bin = bucketize(sr, boundaries)."""

    def __init__(self, dim: int, buckets: int) -> None:
        super().__init__()
        self.scale_embed = nn.Embedding(buckets, dim)
        self.bias_embed = nn.Embedding(buckets, dim)

    def forward(self, x: torch.Tensor, sr_bin: torch.Tensor) -> torch.Tensor:
        return x * self.scale_embed(sr_bin).unsqueeze(-1) + self.bias_embed(sr_bin).unsqueeze(-1)


class ChannelAffine(nn.Module):
    """The baked sample-rate conditioning: x · scale + bias with [1,C,1] constants."""

    def __init__(self, scale: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("scale", scale.detach().reshape(1, -1, 1).contiguous())
        self.register_buffer("bias", bias.detach().reshape(1, -1, 1).contiguous())

    def forward(self, x: torch.Tensor, sr_bin: torch.Tensor | None = None) -> torch.Tensor:
        return x * self.scale + self.bias


class CausalDecoder(nn.Module):
    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        c0, ch = cfg.latent_dim, cfg.decoder_dim
        if cfg.depthwise:
            layers: list[nn.Module] = [_wn_conv(c0, c0, 7, groups=c0), _wn_conv(c0, ch, 1)]
        else:
            layers = [_wn_conv(c0, ch, 7)]
        for i, rate in enumerate(cfg.decoder_rates):
            cout = ch // 2 ** (i + 1)
            layers.append(CausalDecoderBlock(ch // 2**i, cout, rate, groups=cout if cfg.depthwise else 1))
        out = ch // 2 ** len(cfg.decoder_rates)
        layers += [Snake1d(out), _wn_conv(out, 1, 7), nn.Tanh()]
        self.model = nn.ModuleList(layers)
        self.out_sample_rate = cfg.out_sample_rate
        if cfg.sr_bin_boundaries is not None:
            self.register_buffer("sr_bin_boundaries", torch.tensor(cfg.sr_bin_boundaries, dtype=torch.int32))
            n = len(cfg.sr_bin_boundaries) + 1
            self.sr_cond_model = nn.ModuleList(
                SampleRateCondition(m.input_channels, n) if isinstance(m, CausalDecoderBlock) else None for m in layers
            )
        else:
            self.sr_bin_boundaries = None
            self.sr_cond_model = None

    def sr_bin(self, x: torch.Tensor) -> torch.Tensor | None:
        """bucketize(out_sample_rate) in-graph, as the reference does for its default 48 kHz request."""
        if self.sr_bin_boundaries is None:
            return None
        sr = torch.full((x.shape[0],), self.out_sample_rate, dtype=torch.int32, device=x.device)
        return torch.bucketize(sr, self.sr_bin_boundaries)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sr_bin = self.sr_bin(x)
        for i, layer in enumerate(self.model):
            if self.sr_cond_model is not None and self.sr_cond_model[i] is not None:
                x = self.sr_cond_model[i](x, sr_bin)
            x = layer(x)
        return x


class AudioVAEDecoder(nn.Module):
    """The stage module: `decoder.*` of audiovae.safetensors. latents [B,64,F] fp32 → wav [B,1,F·spf] fp32."""

    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.decoder = CausalDecoder(cfg)
        # kernels=ttsaot builds: the same math channels-last on the conv kernels (vae_nlc.py), set by the stage's
        # kernel pass, which moves the decoder's modules into it
        self.channels_last: nn.Module | None = None

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        return self.decoder(latents) if self.channels_last is None else self.channels_last(latents)


# ------------------------------------------------------------------------------------------ receptive field
def receptive_field_frames(cfg: VAEConfig) -> int:
    """Latent frames of left context after which the first sample of a frame no longer depends on earlier
    latents: trace the earliest input index each op reads, from output sample F·spf back to the latents.
    Causal conv with left pad p: n → n − p; transposed conv k=2r, stride r: n → ⌊n/r⌋ − 1; residual adds keep
    the branch's reach. Later samples of the chunk reach less far, so this bounds the whole chunk."""
    ops: list[tuple[str, int]] = [("conv", 6)] + ([("conv", 0)] if cfg.depthwise else [])
    for r in cfg.decoder_rates:
        ops.append(("up", r))
        ops += [("conv", 6 * d) for d in (1, 3, 9)]
    ops.append(("conv", 6))
    frame = 10_000
    n = frame * cfg.samples_per_frame
    for kind, v in reversed(ops):
        n = n - v if kind == "conv" else n // v - 1
    return frame - n


# ------------------------------------------------------------------------------------------------ passes
def bake_sample_rate(module: nn.Module) -> dict[str, Any]:
    """The decoder always serves the configured output rate: fold its conditioning bin into constants."""
    dec = module.decoder
    if dec.sr_cond_model is None:
        return {"pass": "bake_sample_rate", "replaced": 0}
    before = count_parameters(module)["params"]
    b = int(torch.bucketize(torch.tensor([dec.out_sample_rate], dtype=torch.int32), dec.sr_bin_boundaries))
    n = 0
    for i, c in enumerate(dec.sr_cond_model):
        if isinstance(c, SampleRateCondition):
            dec.sr_cond_model[i] = ChannelAffine(c.scale_embed.weight[b], c.bias_embed.weight[b])
            n += 1
    dec.sr_bin_boundaries = None  # a None buffer: gone from the state dict, sr_bin() returns None
    return {
        "pass": "bake_sample_rate",
        "sample_rate": dec.out_sample_rate,
        "bin": b,
        "replaced": n,
        "folded": {"sample-rate embeddings (one bin kept, as an affine)": before - count_parameters(module)["params"]},
    }
