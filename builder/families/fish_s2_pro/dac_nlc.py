"""The Fish DAC stages on the ttsaot conv kernels (kernels=ttsaot builds): one channels-last ([B, T, C]) layout
from the first conv to the last, no transpose between layers.

- `dac_decoder`: codes → per-codebook gather + out_proj (1×1 convs as linears on rows) → post_module transformer
  (on [B, T, C]: `WindowLimitedTransformer.channels_last`) → 2 × (transposed conv, `KernelConvNeXt`) → the decoder
  (conv k7, 4 × [Snake, transposed conv, 3 residual units], Snake, conv k7 → 1, tanh), all ONE `fuse_conv_chain`
  whose every conv carries the following snake, the unit's residual add and the next unit's skip in its
  epilogue, ending in the [B, 1, T] wave (a view of [B, T, 1]) in fp32.
- `dac_encoder`: the [1, 1, T] clip (one copy to [1, T, 1] rows, free for one channel) → the encoder (conv k7,
  4 × [3 residual units, Snake, strided conv, the block's transformer if any], Snake, conv k3) → 2 × (strided conv,
  `KernelConvNeXt`) → pre_module, one chain; the quantizers then run as in the faithful module on the latent's
  [B, D, T] view (after the last conv: the codes are computed by the same ops as the reference).

The `channels_last_*` kernel passes move the baked modules into these bodies, which the stage modules then run
instead of their faithful forwards."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...kernels.conv_modules import KernelConvNeXt, Opaque, Residual, fuse_conv_chain, linears_on_conv_kernel
from ...passes.conv import install_channels_last
from .dac import DAC, DecoderBlock, EncoderBlock, ResidualUnit, VectorQuantize, WindowLimitedTransformer

DAC_PARTS = ("encoder", "quantizer", "decoder")  # what a channels-last body takes over (those the stage has)


class VQDecodeNLC(nn.Module):
    """VectorQuantize.decode_code → out_proj on rows: codes [B, F] → [B, F, D] (the 1×1 conv as a linear)."""

    def __init__(self, vq: VectorQuantize) -> None:
        super().__init__()
        conv = vq.out_proj
        self.codebook = vq.codebook
        self.out_proj = nn.Linear(conv.in_channels, conv.out_channels, bias=conv.bias is not None)
        self.out_proj.weight = nn.Parameter(conv.weight.detach()[:, :, 0].contiguous(), requires_grad=False)
        if conv.bias is not None:
            self.out_proj.bias = nn.Parameter(conv.bias.detach().clone(), requires_grad=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.out_proj(F.embedding(idx, self.codebook.weight))


def _decode_sum(vqs: nn.ModuleList, codes: torch.Tensor) -> torch.Tensor:
    z: Any = 0.0  # the reference's accumulation order (ResidualVectorQuantize)
    for i, vq in enumerate(vqs):
        z = z + vq(codes[:, i])
    return z


def _unit(u: ResidualUnit) -> Residual:
    return Residual(list(u.block))


def _nlc(t: WindowLimitedTransformer) -> Opaque:
    t.channels_last = True
    return Opaque(t, "NLC")


def decoder_items(dac: DAC) -> list[Any]:
    """post_module → … → the decoder's tanh, in the order DAC.decode runs them."""
    q = dac.quantizer
    items: list[Any] = [_nlc(q.post_module)]
    for up, convnext in q.upsample:
        items += [up, Opaque(KernelConvNeXt(convnext), "NLC")]
    for layer in dac.decoder.model:
        if isinstance(layer, DecoderBlock):
            snake, up, *units = layer.block
            items += [snake, up, *(_unit(u) for u in units)]
        else:
            items.append(layer)  # convs, the head's Snake and Tanh
    return items


def encoder_items(dac: DAC) -> list[Any]:
    """encoder → downsample → pre_module, in the order DAC.encode runs them."""
    items: list[Any] = []
    for layer in dac.encoder.block:
        if not isinstance(layer, EncoderBlock):
            items.append(layer)
            continue
        for sub in layer.block:
            if isinstance(sub, ResidualUnit):
                items.append(_unit(sub))
            elif isinstance(sub, WindowLimitedTransformer):
                items.append(_nlc(sub))
            elif not isinstance(sub, nn.Identity):
                items.append(sub)  # the Snake and the strided conv
    q = dac.quantizer
    for down, convnext in q.downsample:
        items += [down, Opaque(KernelConvNeXt(convnext), "NLC")]
    return [*items, _nlc(q.pre_module)]


def _exact_linears(chain: nn.Module, precision: str) -> int:
    """Exact fp32 bodies ("tf32x3"): the transformers' and ConvNeXt blocks' linears on the conv kernel too
    (KernelLinear: cuBLAS would run them on FMA units with TF32 off); other precisions keep nn.Linear (bf16 and TF32
    linears are on cuBLAS's tensor cores already)."""
    return linears_on_conv_kernel(chain, precision) if precision == "tf32x3" else 0


class DACDecoderNLC(nn.Module):
    """codes [B, 10, F] → wave [B, 1, F·2048] fp32 (see the module docstring)."""

    def __init__(self, dac: DAC, precision: str) -> None:
        super().__init__()
        q = dac.quantizer
        self.semantic_size, self.residual_size = q.semantic_size, q.residual_size
        self.semantic = nn.ModuleList(VQDecodeNLC(v) for v in q.semantic_quantizer.quantizers)
        self.residual = nn.ModuleList(VQDecodeNLC(v) for v in q.quantizer.quantizers)
        self.chain = fuse_conv_chain(
            decoder_items(dac), input_layout="NLC", output_layout="NCL", out_dtype=torch.float32, precision=precision
        )
        self.kernel_linears = _exact_linears(self.chain, precision)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        semantic = codes[:, :1].clamp(max=self.semantic_size - 1)
        residual = codes[:, 1:].clamp(max=self.residual_size - 1)
        return self.chain(_decode_sum(self.semantic, semantic) + _decode_sum(self.residual, residual))


class DACEncoderNLC(nn.Module):
    """audio [1, 1, T] → codes [1, 10, ⌈T/2048⌉] (see the module docstring)."""

    def __init__(self, dac: DAC, precision: str) -> None:
        super().__init__()
        self.samples_per_frame = dac.cfg.samples_per_frame
        self.chain = fuse_conv_chain(encoder_items(dac), input_layout="NCL", output_layout="NCL", precision=precision)
        self.kernel_linears = _exact_linears(self.chain, precision)
        self.semantic_quantizer = dac.quantizer.semantic_quantizer
        self.quantizer = dac.quantizer.quantizer

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        T = audio.shape[-1]
        spf = self.samples_per_frame
        z = self.chain(F.pad(audio, (0, -(-T // spf) * spf - T)))
        semantic_z, semantic_codes = self.semantic_quantizer.encode(z)
        _, codes = self.quantizer.encode(z - semantic_z)
        return torch.cat([semantic_codes, codes], dim=1)


def channels_last_dac_decoder(m: DAC, precision: str) -> dict[str, Any]:
    """Kernel pass of `dac_decoder` (after pruning, weight-norm and snake baking). `precision`: the fp32 GEMM mode
    of the convs ("tf32" or "tf32x3"; bf16 stages multiply on the tensor cores whatever it says)."""
    return install_channels_last(m, lambda: DACDecoderNLC(m, precision), DAC_PARTS, precision)


def channels_last_dac_encoder(m: DAC, precision: str = "tf32x3") -> dict[str, Any]:
    """Kernel pass of `dac_encoder`: tf32x3 (three TF32 products with error compensation, ≈ fp32 accuracy on the
    tensor cores) keeps the codes those of exact fp32 (H100: 100% of a 10 s clip's codes, where cuDNN's TF32
    moved 0.6%; bench/results/nvidia-h100/conv_kernels.json) at 2.3× the exact convs' speed."""
    return install_channels_last(m, lambda: DACEncoderNLC(m, precision), DAC_PARTS, precision)
