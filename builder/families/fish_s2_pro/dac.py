"""Fish Speech S2 Pro DAC codec (`codec.pth`): faithful modules (config: config.py). Facts: STAGES.md §1.4.

The module tree mirrors the checkpoint exactly (541 entries for the full config), so `codec.pth` loads by
name: `encoder.block.*`, `quantizer.{downsample, pre_module, semantic_quantizer, quantizer, post_module,
upsample}.*`, `decoder.model.*`. Causal convs carry new-style weight norm under
`.conv.parametrizations.weight.*`; the VQ projections are weight-normed convs directly
(`in_proj.parametrizations.weight.*`; legacy `weight_g`/`weight_v` checkpoints are renamed on load). The math
follows the reference op by op (same operation order, fp32), so the eager module is bit-identical to the
upstream one on CPU; the two stage forwards are `DAC.encode` / `DAC.decode`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...layers import CausalConv1d, CausalConvTranspose1d, ConvNeXtBlock, RMSNorm, Snake1d, apply_rope_interleaved
from ...layers.attention import sliding_window_causal_mask
from ...layers.mlp import fuse_linears
from ...passes.weight_norm import weight_norm
from .config import DACConfig

# Initial LayerScale gain of the codec transformers (overwritten by the checkpoint).
LAYER_SCALE_INIT = 1e-2


def wn_causal_conv(cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1) -> CausalConv1d:
    m = CausalConv1d(cin, cout, kernel, stride=stride, dilation=dilation)
    weight_norm(m.conv)
    return m


def wn_causal_conv_transpose(cin: int, cout: int, kernel: int, stride: int) -> CausalConvTranspose1d:
    m = CausalConvTranspose1d(cin, cout, kernel, stride)
    weight_norm(m.conv)
    return m


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(dim), wn_causal_conv(dim, dim, 7, dilation=dilation), Snake1d(dim), wn_causal_conv(dim, dim, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)  # causal convs keep the length: no trim


def rope_tables(block_size: int, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Interleaved RoPE cos/sin [block_size, head_dim/2]: computed in fp32 exactly as the reference
    (`torch.polar`), rounded to bf16 as the reference stores its `freqs_cis`, kept as fp32 values (they are
    applied in fp32)."""
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    t = torch.arange(block_size, device=freqs.device)
    cis = torch.polar(torch.ones(block_size, head_dim // 2), torch.outer(t, freqs))
    return cis.real.to(torch.bfloat16).float(), cis.imag.to(torch.bfloat16).float()


class FeedForward(nn.Module):
    """w2(silu(w1 x) · w3 x); `fuse_projections()` (passes.fuse) merges w1|w3 into one matmul (build time)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w13: nn.Linear | None = None
        self.hidden = hidden

    def fuse_projections(self) -> None:
        if self.w13 is None:
            self.w13 = fuse_linears([self.w1, self.w3])
            del self.w1, self.w3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w13 is not None:
            a, b = self.w13(x).split(self.hidden, dim=-1)
        else:
            a, b = self.w1(x), self.w3(x)
        return self.w2(F.silu(a) * b)


class Attention(nn.Module):
    def __init__(self, dim: int, n_head: int, head_dim: int) -> None:
        super().__init__()
        self.wqkv = nn.Linear(dim, 3 * n_head * head_dim, bias=False)
        self.wo = nn.Linear(n_head * head_dim, dim, bias=False)
        self.n_head, self.head_dim = n_head, head_dim
        # the channels-last kernel bodies put the attention core on `ttsaot::window_attention`
        # (dac_nlc._kernel_attention), which takes [B, T, H, D] and the window instead of the mask
        self.window_kernel: nn.Module | None = None

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        w = self.n_head * self.head_dim
        q, k, v = self.wqkv(x).split([w, w, w], dim=-1)
        q = q.view(B, T, self.n_head, self.head_dim)
        k = k.view(B, T, self.n_head, self.head_dim)
        v = v.view(B, T, self.n_head, self.head_dim)
        # RoPE in fp32 on [B,T,H,hd] (tables [T,hd/2] broadcast over heads), cast back like the reference.
        c, s = cos[:, None, :], sin[:, None, :]
        q = apply_rope_interleaved(q.float(), c, s).type_as(q)
        k = apply_rope_interleaved(k.float(), c, s).type_as(k)
        if self.window_kernel is not None:
            return self.wo(self.window_kernel(q, k, v))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(y.transpose(1, 2).contiguous().view(B, T, w))


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), LAYER_SCALE_INIT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, n_head: int, head_dim: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.attention = Attention(dim, n_head, head_dim)
        self.feed_forward = FeedForward(dim, hidden)
        self.ffn_norm = RMSNorm(dim, eps)
        self.attention_norm = RMSNorm(dim, eps)
        self.attention_layer_scale = LayerScale(dim)
        self.ffn_layer_scale = LayerScale(dim)

    def forward(self, x, cos, sin, mask):
        h = x + self.attention_layer_scale(self.attention(self.attention_norm(x), cos, sin, mask))
        return h + self.ffn_layer_scale(self.feed_forward(self.ffn_norm(h)))


class WindowLimitedTransformer(nn.Module):
    """Causal window-limited transformer on channels-first [B,C,T] (on [B,T,C] once `channels_last` is set: the
    channels-last stage bodies of dac_nlc.py): key j visible to query i iff i − window < j ≤ i. The mask comes
    from iota inside the graph and the RoPE tables are build-time buffers (non-persistent: the checkpoint's
    `freqs_cis`/`causal_mask` buffers are never read)."""

    def __init__(
        self,
        dim: int,
        n_layer: int,
        n_head: int,
        head_dim: int,
        hidden: int,
        window: int,
        block_size: int,
        rope_base: float,
        eps: float,
    ) -> None:
        super().__init__()
        self.window, self.block_size = window, block_size
        self.layers = nn.ModuleList(TransformerBlock(dim, n_head, head_dim, hidden, eps) for _ in range(n_layer))
        self.norm = RMSNorm(dim, eps)
        cos, sin = rope_tables(block_size, head_dim, rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.rope_cos_keep_fp32 = self.rope_sin_keep_fp32 = True  # applied in fp32 whatever the dtype
        self.channels_last = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.channels_last:
            x = x.transpose(1, 2)
        T = x.shape[1]
        torch._check(T <= self.rope_cos.shape[0], lambda: "sequence longer than the transformer block_size")
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        mask = sliding_window_causal_mask(T, self.window, x.device)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        x = self.norm(x)
        return x if self.channels_last else x.transpose(1, 2)


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, stride: int, transformer: nn.Module | None) -> None:
        super().__init__()
        self.block = nn.Sequential(
            ResidualUnit(dim // 2, 1),
            ResidualUnit(dim // 2, 3),
            ResidualUnit(dim // 2, 9),
            Snake1d(dim // 2),
            wn_causal_conv(dim // 2, dim, 2 * stride, stride=stride),
            transformer if transformer is not None else nn.Identity(),
        )

    def forward(self, x):
        return self.block(x)


class Encoder(nn.Module):
    def __init__(self, cfg: DACConfig) -> None:
        super().__init__()
        d = cfg.encoder_dim
        blocks: list[nn.Module] = [wn_causal_conv(1, d, 7)]
        for stride, n_layer in zip(cfg.encoder_rates, cfg.encoder_transformer_layers):
            d *= 2
            tr = None
            if n_layer:
                hd = cfg.transformer_head_dim
                tr = WindowLimitedTransformer(
                    d,
                    n_layer,
                    d // hd,
                    hd,
                    d * 3,
                    cfg.encoder_window,
                    cfg.encoder_block_size,
                    cfg.rope_base,
                    cfg.norm_eps,
                )
            blocks.append(EncoderBlock(d, stride, tr))
        blocks += [Snake1d(d), wn_causal_conv(d, cfg.latent_dim, 3)]
        self.block = nn.Sequential(*blocks)

    def forward(self, x):
        return self.block(x)


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(cin),
            wn_causal_conv_transpose(cin, cout, 2 * stride, stride),
            ResidualUnit(cout, 1),
            ResidualUnit(cout, 3),
            ResidualUnit(cout, 9),
        )

    def forward(self, x):
        return self.block(x)


class Decoder(nn.Module):
    def __init__(self, cfg: DACConfig) -> None:
        super().__init__()
        c = cfg.decoder_dim
        layers: list[nn.Module] = [wn_causal_conv(cfg.latent_dim, c, 7)]
        for i, stride in enumerate(cfg.decoder_rates):
            layers.append(DecoderBlock(c // 2**i, c // 2 ** (i + 1), stride))
        out = c // 2 ** len(cfg.decoder_rates)
        layers += [Snake1d(out), wn_causal_conv(out, 1, 7), nn.Tanh()]
        self.model = nn.Sequential(*layers)

    def forward(self, x):
        return self.model(x)


class VectorQuantize(nn.Module):
    """Factorized, L2-normalised VQ: in_proj → nearest codebook entry by cosine → out_proj."""

    def __init__(self, input_dim: int, size: int, dim: int) -> None:
        super().__init__()
        self.in_proj = weight_norm(nn.Conv1d(input_dim, dim, 1))
        self.out_proj = weight_norm(nn.Conv1d(dim, input_dim, 1))
        self.codebook = nn.Embedding(size, dim)

    def decode_code(self, idx: torch.Tensor) -> torch.Tensor:
        return F.embedding(idx, self.codebook.weight).transpose(1, 2)

    def quantize(self, z: torch.Tensor, margins: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """z [B,D,T] → (z_q [B,dim,T] before out_proj, indices [B,T]); `margins` gets each choice's [B,T]
        `nearest_code` margin."""
        z_e = self.in_proj(z)
        B, d, T = z_e.shape
        idx = nearest_code(z_e.permute(0, 2, 1).reshape(B * T, d), self.codebook.weight, margins).reshape(B, T)
        if margins is not None:
            margins[-1] = margins[-1].reshape(B, T)
        z_q = self.decode_code(idx)
        return z_e + (z_q - z_e), idx  # the straight-through form, as computed in the reference


def nearest_code(rows: torch.Tensor, codebook: torch.Tensor, margins: list[torch.Tensor] | None = None) -> torch.Tensor:
    """The codebook index of each row [N, dim] by cosine; the reference's distance form (not a plain dot product)
    is kept so near-ties resolve identically. Shared by the faithful quantizer and the channels-last body.
    `margins` (golden cases): gets how decided each choice is, [N]: the distance from the second-nearest entry less
    the nearest one's (unit vectors: distances in [0, 4])."""
    enc = F.normalize(rows)
    cb = F.normalize(codebook)
    dist = enc.pow(2).sum(1, keepdim=True) - 2 * enc @ cb.t() + cb.pow(2).sum(1, keepdim=True).t()
    if margins is not None:
        if dist.shape[1] > 1:
            top = (-dist).topk(2, dim=1).values
            margins.append(top[:, 0] - top[:, 1])
        else:  # one entry: nothing to choose
            margins.append(torch.full_like(dist[:, 0], float("inf")))
    return (-dist).max(1)[1]


class ResidualVectorQuantize(nn.Module):
    def __init__(self, input_dim: int, n: int, size: int, dim: int) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(VectorQuantize(input_dim, size, dim) for _ in range(n))

    def encode(self, z: torch.Tensor, margins: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(Σ z_q_i, codes [B,n,T]). The last quantizer's out_proj only feeds Σ z_q, so it is skipped when it
        has been pruned (the encoder stage needs the codes only). `margins` gets each quantizer's [B,T] choice
        margins in code order (`nearest_code`)."""
        z_q, residual, codes = 0, z, []
        for i, q in enumerate(self.quantizers):
            zq_i, idx = q.quantize(residual, margins)
            codes.append(idx)
            if i == len(self.quantizers) - 1 and not hasattr(q, "out_proj"):
                break
            zq_i = q.out_proj(zq_i)
            z_q = z_q + zq_i
            residual = residual - zq_i
        return z_q, torch.stack(codes, dim=1)

    def from_codes(self, codes: torch.Tensor) -> torch.Tensor:
        z_q = 0.0
        for i, q in enumerate(self.quantizers):
            z_q = z_q + q.out_proj(q.decode_code(codes[:, i]))
        return z_q


class DownsampleResidualVectorQuantize(nn.Module):
    def __init__(self, cfg: DACConfig) -> None:
        super().__init__()
        d = cfg.latent_dim

        def transformer() -> WindowLimitedTransformer:
            return WindowLimitedTransformer(
                d,
                cfg.quantizer_layers,
                cfg.quantizer_heads,
                cfg.quantizer_head_dim,
                cfg.quantizer_intermediate,
                cfg.quantizer_window,
                cfg.quantizer_block_size,
                cfg.rope_base,
                cfg.norm_eps,
            )

        self.semantic_quantizer = ResidualVectorQuantize(d, 1, cfg.semantic_codebook_size, cfg.codebook_dim)
        self.quantizer = ResidualVectorQuantize(d, cfg.n_codebooks, cfg.codebook_size, cfg.codebook_dim)
        self.downsample = nn.Sequential(
            *[nn.Sequential(CausalConv1d(d, d, f, stride=f), ConvNeXtBlock(d)) for f in cfg.downsample_factor]
        )
        self.upsample = nn.Sequential(
            *[
                nn.Sequential(CausalConvTranspose1d(d, d, f, f), ConvNeXtBlock(d))
                for f in reversed(cfg.downsample_factor)
            ]
        )
        self.pre_module = transformer()
        self.post_module = transformer()
        self.semantic_size, self.residual_size = cfg.semantic_codebook_size, cfg.codebook_size


class DAC(nn.Module):
    """The whole codec. `encode`: audio [B,1,T] → codes [B,10,⌈T/2048⌉]; `decode`: codes → [B,1,F·2048]."""

    def __init__(self, cfg: DACConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.quantizer = DownsampleResidualVectorQuantize(cfg)
        self.decoder = Decoder(cfg)
        # kernels=ttsaot builds: the stage's math channels-last on the conv kernels (dac_nlc.py), set by the
        # stage's kernel pass, which moves the modules above into it
        self.channels_last: nn.Module | None = None

    def encode(self, audio: torch.Tensor, margins: list[torch.Tensor] | None = None) -> torch.Tensor:
        """`margins` (golden cases): gets each code's [B,T] choice margin, in the codes' order (`nearest_code`)."""
        T = audio.shape[-1]
        spf = self.cfg.samples_per_frame
        audio = F.pad(audio, (0, -(-T // spf) * spf - T))
        q = self.quantizer
        z = q.pre_module(q.downsample(self.encoder(audio)))
        semantic_z, semantic_codes = q.semantic_quantizer.encode(z, margins)
        _, codes = q.quantizer.encode(z - semantic_z, margins)
        return torch.cat([semantic_codes, codes], dim=1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        q = self.quantizer
        # The reference clamps (upper bound only); the runtime rejects out-of-range codes before this.
        semantic = codes[:, :1].clamp(max=q.semantic_size - 1)
        residual = codes[:, 1:].clamp(max=q.residual_size - 1)
        z = q.semantic_quantizer.from_codes(semantic) + q.quantizer.from_codes(residual)
        wav = self.decoder(q.upsample(q.post_module(z)))
        return wav.float()


class DACDecoder(DAC):
    """`dac_decoder` stage: forward = decode (codes [B,10,F] int64 → wave [B,1,F·2048] float32)."""

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.decode(codes) if self.channels_last is None else self.channels_last(codes)


class DACEncoder(DAC):
    """`dac_encoder` stage: forward = encode (audio [1,1,T] float32 → codes [1,10,⌈T/2048⌉] int64)."""

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        return self.encode(audio) if self.channels_last is None else self.channels_last(audio)
