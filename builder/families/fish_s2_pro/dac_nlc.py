"""The Fish DAC stages on the ttsaot conv kernels (kernels=ttsaot builds): one channels-last ([B, T, C]) layout
from the first conv to the last, no transpose between layers.

- `dac_decoder`: codes → per-codebook gather + out_proj (1×1 convs as linears on rows) → post_module transformer
  (on [B, T, C]: `WindowLimitedTransformer.channels_last`) → 2 × (transposed conv, `KernelConvNeXt`) → the decoder
  (conv k7, 4 × [Snake, transposed conv, 3 residual units], Snake, conv k7 → 1, tanh), all ONE `fuse_conv_chain`
  whose every conv carries the following snake, the unit's residual add and the next unit's skip in its
  epilogue, ending in the [B, 1, T] wave (a view of [B, T, 1]) in fp32.
- `dac_encoder`: the [1, 1, T] clip (one copy to [1, T, 1] rows, free for one channel) → the encoder (conv k7,
  4 × [3 residual units, Snake, strided conv, the block's transformer if any], Snake, conv k3) → 2 × (strided conv,
  `KernelConvNeXt`) → pre_module, one chain ending in the latent's rows [B, T, D]; the quantizers then run the
  reference's ops in its order on those rows (`RVQEncodeNLC`), their 1×1 projections as linears.
- Exact fp32 bodies ("tf32x3"): the transformers' and ConvNeXt blocks' linears on the conv kernel
  (`_exact_linears`). Every precision: each transformer layer's attention on `ttsaot::window_attention`
  (`_kernel_attention`).

The `channels_last_*` kernel passes move the baked modules into these bodies, which the stage modules then run
instead of their faithful forwards."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...kernels.conv_modules import (
    KernelConvNeXt,
    KernelLinear,
    Opaque,
    Residual,
    fuse_conv_chain,
    linears_on_conv_kernel,
)
from ...kernels.window_attention import install_window_kernels
from ...passes.conv import install_channels_last
from .dac import (
    DAC,
    DecoderBlock,
    EncoderBlock,
    ResidualUnit,
    ResidualVectorQuantize,
    VectorQuantize,
    WindowLimitedTransformer,
    nearest_code,
)

DAC_PARTS = ("encoder", "quantizer", "decoder")  # what a channels-last body takes over (those the stage has)


def _row_linear(conv: nn.Conv1d) -> nn.Linear:
    """A baked 1×1 Conv1d as the linear over rows [..., Cin] that computes the same."""
    lin = nn.Linear(conv.in_channels, conv.out_channels, bias=conv.bias is not None)
    lin.weight = nn.Parameter(conv.weight.detach()[:, :, 0].contiguous(), requires_grad=False)
    if conv.bias is not None:
        lin.bias = nn.Parameter(conv.bias.detach().clone(), requires_grad=False)
    return lin


class VQDecodeNLC(nn.Module):
    """VectorQuantize.decode_code → out_proj on rows: codes [B, F] → [B, F, D] (the 1×1 conv as a linear)."""

    def __init__(self, vq: VectorQuantize) -> None:
        super().__init__()
        self.codebook = vq.codebook
        self.out_proj = _row_linear(vq.out_proj)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.out_proj(F.embedding(idx, self.codebook.weight))


class RVQEncodeNLC(nn.Module):
    """ResidualVectorQuantize.encode on the latent's rows [B, T, D] → (Σ z_q [B, T, D], codes [B, n, T]): the same
    ops in the same order (in_proj, `nearest_code`, the straight-through form, out_proj, the residual update), with
    the 1×1 projections as linears over rows. Why: on the [B, D, T] view cuDNN ran each fp32 in_proj (1024 → 8
    channels, a few hundred frames) in ~33 µs, 10 per 10 s clip (H100 profile of dac_encoder); on the rows they are
    small GEMMs on the conv kernel in tf32x3 (≈ fp32, the codes must stay those of exact fp32)."""

    def __init__(self, rvq: ResidualVectorQuantize, precision: str) -> None:
        super().__init__()
        vqs = list(rvq.quantizers)

        def proj(conv: nn.Conv1d) -> nn.Module:  # exact bodies: on the conv kernel, as their other linears
            lin = _row_linear(conv)
            return KernelLinear(lin, precision) if precision == "tf32x3" else lin

        self.codebooks = nn.ModuleList(q.codebook for q in vqs)
        self.in_projs = nn.ModuleList(proj(q.in_proj) for q in vqs)
        # the last quantizer's out_proj only feeds Σ z_q: pruned in the encoder stage (ResidualVectorQuantize.encode)
        self.out_projs = nn.ModuleList(proj(q.out_proj) for q in vqs if hasattr(q, "out_proj"))

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z_q: Any = 0
        residual, codes = z, []
        for i, (in_proj, codebook) in enumerate(zip(self.in_projs, self.codebooks)):
            z_e = in_proj(residual)
            B, T, d = z_e.shape
            idx = nearest_code(z_e.reshape(B * T, d), codebook.weight).reshape(B, T)
            codes.append(idx)
            if i == len(self.out_projs):
                break
            zq_i = self.out_projs[i](z_e + (F.embedding(idx, codebook.weight) - z_e))
            z_q = z_q + zq_i
            residual = residual - zq_i
        return z_q, torch.stack(codes, dim=1)


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


def _kernel_attention(chain: nn.Module, precision: str) -> int:
    """Every window-limited transformer layer's attention on `ttsaot::window_attention`, at every precision: exact
    fp32 bodies because PyTorch's fp32 SDPA runs on the FMA units over a dense mask (0.87 ms of the 10 s encoder
    call, H100), bf16 ones because its bf16 SDPA is cuDNN's, which sets itself up per shape in each package's first
    call (`install_window_kernels`)."""
    n = 0
    for t in chain.modules():
        if isinstance(t, WindowLimitedTransformer):
            head_dim = t.layers[0].attention.head_dim
            n += install_window_kernels((layer.attention for layer in t.layers), t.window, head_dim, precision)
    return n


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
        self.kernel_attentions = _kernel_attention(self.chain, precision)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        semantic = codes[:, :1].clamp(max=self.semantic_size - 1)
        residual = codes[:, 1:].clamp(max=self.residual_size - 1)
        return self.chain(_decode_sum(self.semantic, semantic) + _decode_sum(self.residual, residual))


class DACEncoderNLC(nn.Module):
    """audio [1, 1, T] → codes [1, 10, ⌈T/2048⌉] (see the module docstring)."""

    def __init__(self, dac: DAC, precision: str) -> None:
        super().__init__()
        self.samples_per_frame = dac.cfg.samples_per_frame
        self.chain = fuse_conv_chain(encoder_items(dac), input_layout="NCL", output_layout="NLC", precision=precision)
        self.kernel_linears = _exact_linears(self.chain, precision)
        self.kernel_attentions = _kernel_attention(self.chain, precision)
        self.semantic_quantizer = RVQEncodeNLC(dac.quantizer.semantic_quantizer, precision)
        self.quantizer = RVQEncodeNLC(dac.quantizer.quantizer, precision)
        self.kernel_linears += sum(
            isinstance(m, KernelLinear) for q in (self.semantic_quantizer, self.quantizer) for m in q.modules()
        )

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        T = audio.shape[-1]
        spf = self.samples_per_frame
        z = self.chain(F.pad(audio, (0, -(-T // spf) * spf - T)))  # the latent's rows [B, T, D]
        semantic_z, semantic_codes = self.semantic_quantizer(z)
        _, codes = self.quantizer(z - semantic_z)
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
