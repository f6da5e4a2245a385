"""`code2wav` on the ttsaot conv kernels (kernels=ttsaot builds): one channels-last ([B, T, C]) layout from the
codebook gather to the wave, no transpose between layers.

The faithful module transposes around the pre-transformer and inside every ConvNeXt block, and each cuDNN conv
adds NCHW↔NHWC conversions of its own (280 transposes per 50-frame call, 17% of its H200 profile). Here:
- the quantizer gathers the baked codebook table into [B, F, d] and projects with the two 1×1 output
  projections as linears (the faithful conv1d(1×1) on [B, d, F] computes the same sums);
- pre_conv → pre_transformer (it takes [B, T, C] already; its attention cores on `ttsaot::window_attention`) →
  two (transposed conv, ConvNeXt) upsampling stages (`KernelConvNeXt`) → the decoder (conv k7, 4 × [SnakeBeta,
  transposed conv, 3 residual units], SnakeBeta, conv k7 → 1, clamp) are ONE `fuse_conv_chain`: every conv
  carries the snake that follows it, the residual add that closes its unit and the skip the next unit needs in its
  epilogue; the chain ends in the [B, 1, T] wave (a view of the [B, T, 1] rows) in fp32 (the stage's
  `clamp(-1, 1).float()`).

`channels_last_code2wav` is the stage's kernel pass: it moves the baked modules into a `Code2WavNLC` that the
stage module then runs instead of its faithful forward."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...kernels.conv_modules import KernelConvNeXt, Opaque, Residual, fuse_conv_chain
from ...kernels.window_attention import install_window_kernels
from ...passes.conv import install_channels_last
from .code2wav import Code2Wav, DecoderBlock, QuantizerDecoder


class QuantizerNLC(nn.Module):
    """The baked QuantizerDecoder on rows: codes [B, 16, F] → [B, F, codebook_dim]."""

    def __init__(self, q: QuantizerDecoder) -> None:
        super().__init__()
        if not q.baked:
            raise ValueError("code2wav kernels: bake the codebooks first (the stage's bake_codebooks pass)")
        self.register_buffer("table", q.table)
        self.register_buffer("offsets", q.offsets, persistent=False)
        self.first_proj = nn.Parameter(
            q.rvq_first.output_proj.weight.detach()[:, :, 0].contiguous(), requires_grad=False
        )
        self.rest_proj = nn.Parameter(q.rvq_rest.output_proj.weight.detach()[:, :, 0].contiguous(), requires_grad=False)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        emb = F.embedding(codes + self.offsets[None, :, None], self.table)  # [B, 16, F, d]
        return F.linear(emb[:, 0], self.first_proj) + F.linear(emb[:, 1:].sum(1), self.rest_proj)


def decoder_block_items(block: DecoderBlock) -> list[Any]:
    """[SnakeBeta, CausalConvTranspose1d, ResidualUnit × 3] as chain items."""
    snake, up, *units = block.block
    return [snake, up, *(Residual([u.act1, u.conv1, u.act2, u.conv2]) for u in units)]


def chain_items(m: Code2Wav) -> list[Any]:
    """pre_conv → … → the decoder head's clamp, in the order the faithful forward runs them."""
    items: list[Any] = [m.pre_conv, Opaque(m.pre_transformer, "NLC")]
    for up, convnext in m.upsample:
        items += [up, Opaque(KernelConvNeXt(convnext), "NLC")]
    for layer in m.decoder:
        items += decoder_block_items(layer) if isinstance(layer, DecoderBlock) else [layer]
    return [*items, "clamp"]


def _kernel_attention(m: Code2Wav, precision: str) -> int:
    """The pre-transformer's attention cores on `ttsaot::window_attention` (`install_window_kernels`: bf16 SDPA
    would run cuDNN's attention, which sets itself up per shape in each package's first call); a checkpoint with
    grouped k/v heads keeps SDPA (the op takes as many k/v heads as query heads)."""
    attn = m.pre_transformer.layers[0].self_attn
    if attn.n_kv_heads != attn.n_heads:
        return 0
    layers = m.pre_transformer.layers
    return install_window_kernels(layers, m.cfg.sliding_window, attn.head_dim, precision, attn.head_dim**-0.5)


class Code2WavNLC(nn.Module):
    """codes [B, 16, F] → wav [B, 1, F·spf] fp32, channels-last throughout (see the module docstring)."""

    def __init__(self, m: Code2Wav, precision: str) -> None:
        super().__init__()
        self.quantizer = QuantizerNLC(m.quantizer)
        self.chain = fuse_conv_chain(
            chain_items(m), input_layout="NLC", output_layout="NCL", out_dtype=torch.float32, precision=precision
        )
        self.kernel_attentions = _kernel_attention(m, precision)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.chain(self.quantizer(codes))


def channels_last_code2wav(m: Code2Wav, precision: str = "tf32x3") -> dict[str, Any]:
    """Kernel pass: run `m` through `Code2WavNLC`. `precision` is the fp32 GEMM mode of the convs (bf16 stages
    multiply on the tensor cores whatever it says). The faithful submodules move into the new body (none is
    kept twice); the parameter count changes by nothing but the layout of the same tensors."""
    return install_channels_last(
        m,
        lambda: Code2WavNLC(m, precision),
        ("quantizer", "pre_conv", "pre_transformer", "upsample", "decoder"),
        precision,
    )
