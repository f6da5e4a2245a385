"""`vae_decoder` on the ttsaot conv kernels (kernels=ttsaot builds): the latents turned to rows once, then one
channels-last ([B, T, C]) `fuse_conv_chain` to the wave, no transpose between layers.

The chain: (depthwise k7 → 1×1 when the config is depthwise, else conv k7) → per decoder block the baked
sample-rate conditioning as `Affine` (fused into the epilogue of the conv before it), Snake, the transposed conv,
3 residual units (Snake → conv k7 (depthwise in the depthwise config) → Snake → conv k1 → +skip) → Snake, conv
k7 → 1, tanh, ending in the [B, 1, T] wave (a view of [B, T, 1]). The stage is fp32 by policy: its convs run
tf32x3 (three TF32 products with error compensation, ≈ fp32 accuracy on the tensor cores).

`channels_last_vae_decoder` is the stage's kernel pass: it moves the baked modules into a `VAEDecoderNLC` that the
stage module then runs instead of its faithful forward."""

from __future__ import annotations

from typing import Any

from torch import nn

from ...kernels.conv_modules import Affine, Residual, fuse_conv_chain
from ...passes.conv import install_channels_last
from .vae import AudioVAEDecoder, CausalDecoderBlock, CausalResidualUnit, ChannelAffine


def chain_items(m: AudioVAEDecoder) -> list[Any]:
    """The decoder's layers in the order its forward runs them, conditioning included (baked first)."""
    dec = m.decoder
    items: list[Any] = []
    for i, layer in enumerate(dec.model):
        cond = dec.sr_cond_model[i] if dec.sr_cond_model is not None else None
        if cond is not None:
            if not isinstance(cond, ChannelAffine):
                raise ValueError("vae_decoder kernels: bake the sample-rate conditioning first (bake_sample_rate)")
            items.append(Affine(cond.scale.flatten(), cond.bias.flatten()))
        if isinstance(layer, CausalDecoderBlock):
            snake, up, *units = layer.block
            items += [snake, up]
            for u in units:
                if not isinstance(u, CausalResidualUnit):
                    raise ValueError(f"vae_decoder kernels: unexpected {type(u).__name__} in a decoder block")
                items.append(Residual(list(u.block)))
        else:
            items.append(layer)  # the input convs, the head's Snake, conv and Tanh
    return items


class VAEDecoderNLC(nn.Module):
    """latents [B, 64, F] → wav [B, 1, F·spf] fp32 (see the module docstring)."""

    def __init__(self, m: AudioVAEDecoder, precision: str) -> None:
        super().__init__()
        self.chain = fuse_conv_chain(chain_items(m), input_layout="NCL", output_layout="NCL", precision=precision)

    def forward(self, latents):
        return self.chain(latents)


def channels_last_vae_decoder(m: AudioVAEDecoder, precision: str = "tf32x3") -> dict[str, Any]:
    """Kernel pass of `vae_decoder` (after weight-norm, snake and sample-rate baking)."""
    return install_channels_last(m, lambda: VAEDecoderNLC(m, precision), ("decoder",), precision)
