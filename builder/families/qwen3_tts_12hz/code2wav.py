"""Qwen3-TTS 12 Hz `code2wav`: the speech tokenizer v2 decoder, codes [B,16,F] int64 → wav [B,1,F·1920] float32
at 24 kHz. Facts: shared/reference/STAGES.md §2.2. The module tree mirrors `speech_tokenizer/model.safetensors`
under the `decoder.` prefix (checkpoint.py maps it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...layers import (
    CausalConv1d,
    CausalConvTranspose1d,
    ConvNeXtBlock,
    LayerScale,
    RMSNorm,
    SnakeBeta,
    SwiGLU,
    apply_rope_neox,
    rope_table,
)
from ...layers.attention import Attention, sliding_window_causal_mask
from .config import Code2WavConfig

# cluster_usage is a count; the reference clamps it before dividing (an unused code would divide by zero).
MIN_CLUSTER_USAGE = 1e-5


class EuclideanCodebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def table(self) -> torch.Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=MIN_CLUSTER_USAGE)[:, None]


class _VQLayer(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = EuclideanCodebook(size, dim)


class _VQStack(nn.Module):
    def __init__(self, n: int, size: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_VQLayer(size, dim) for _ in range(n))


class RVQGroup(nn.Module):
    """`rvq_first` / `rvq_rest`: Σ codebook lookups → bias-free 1×1 conv output_proj (input_proj is encode-only)."""

    def __init__(self, n: int, size: int, dim: int, out_dim: int) -> None:
        super().__init__()
        self.vq = _VQStack(n, size, dim)
        self.output_proj = nn.Conv1d(dim, out_dim, 1, bias=False)


class QuantizerDecoder(nn.Module):
    """SplitResidualVectorQuantizer.decode with the codebook tables precomputable (`bake_codebooks`)."""

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.num_quantizers, self.codebook_size = cfg.num_quantizers, cfg.codebook_size
        self.rvq_first = RVQGroup(1, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = RVQGroup(cfg.num_quantizers - 1, cfg.codebook_size, dim, cfg.codebook_dim)
        self.register_buffer("offsets", torch.arange(cfg.num_quantizers) * cfg.codebook_size, persistent=False)
        self.baked = False

    def bake_codebooks(self) -> int:
        """embedding_sum / clamp(cluster_usage) for all 16 books, once, in fp32, as one flat [16·N, d] table:
        the decode becomes a single gather. Returns the parameters folded away (the usage counts)."""
        books = [layer._codebook for g in (self.rvq_first, self.rvq_rest) for layer in g.vq.layers]
        before = sum(p.numel() for b in books for p in b.parameters())
        self.register_buffer("table", torch.cat([b.table() for b in books]).detach().contiguous())
        for g in (self.rvq_first, self.rvq_rest):
            del g.vq
        self.baked = True
        return before - self.table.numel()

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        if self.baked:
            emb = F.embedding(codes + self.offsets[None, :, None], self.table)  # [B,16,F,d]
            first = emb[:, 0].transpose(1, 2)
            rest = emb[:, 1:].sum(1).transpose(1, 2)
        else:
            first = F.embedding(codes[:, 0], self.rvq_first.vq.layers[0]._codebook.table()).transpose(1, 2)
            rest = 0
            for k, layer in enumerate(self.rvq_rest.vq.layers):
                rest = rest + F.embedding(codes[:, k + 1], layer._codebook.table()).transpose(1, 2)
        return self.rvq_first.output_proj(first) + self.rvq_rest.output_proj(rest)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.self_attn = Attention(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, bias=cfg.attention_bias
        )
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        # the channels-last kernel body (code2wav_nlc) puts the attention core on `ttsaot::window_attention`, which
        # takes [B, T, H, D] and the window instead of the mask
        self.window_kernel: nn.Module | None = None

    def forward(self, x, cos, sin, mask):
        q, k, v = self.self_attn.project_qkv(self.input_layernorm(x))
        q, k = apply_rope_neox(q, cos, sin), apply_rope_neox(k, cos, sin)
        if self.window_kernel is not None:
            o = self.self_attn.o_proj(self.window_kernel(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)))
        else:
            o = self.self_attn.attend(q, k, v, mask)
        x = x + self.self_attn_layer_scale(o)
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class PreTransformer(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.window = cfg.sliding_window
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        cos, sin = rope_table(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)
        # Non-persistent: derived from the config, not checkpoint tensors.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        h = self.input_proj(x)
        # HF computes the tables in fp32 and casts them to the activation dtype before applying.
        cos, sin = self.rope_cos[:T].to(h.dtype), self.rope_sin[:T].to(h.dtype)
        mask = sliding_window_causal_mask(T, self.window, h.device)
        for layer in self.layers:
            h = layer(h, cos, sin, mask)
        return self.output_proj(self.norm(h))


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x):
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int) -> None:
        super().__init__()
        self.block = nn.ModuleList(
            [
                SnakeBeta(cin),
                CausalConvTranspose1d(cin, cout, 2 * rate, rate),
                *(ResidualUnit(cout, d) for d in (1, 3, 9)),
            ]
        )

    def forward(self, x):
        for m in self.block:
            x = m(x)
        return x


class Code2Wav(nn.Module):
    """Qwen3TTSTokenizerV2Decoder: codes [B,16,F] → wav [B,1,F·spf], clamped to [-1,1], returned as fp32."""

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.quantizer = QuantizerDecoder(cfg)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = PreTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalConvTranspose1d(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXtBlock(cfg.latent_dim)])
            for r in cfg.upsampling_ratios
        )
        dec: list[nn.Module] = [CausalConv1d(cfg.latent_dim, cfg.decoder_dim, 7)]
        for i, rate in enumerate(cfg.upsample_rates):
            dec.append(DecoderBlock(cfg.decoder_dim // 2**i, cfg.decoder_dim // 2 ** (i + 1), rate))
        out_dim = cfg.decoder_dim // 2 ** len(cfg.upsample_rates)
        dec += [SnakeBeta(out_dim), CausalConv1d(out_dim, 1, 7)]
        self.decoder = nn.ModuleList(dec)
        # kernels=ttsaot builds: the same math channels-last on the conv kernels (code2wav_nlc.py), set by the
        # stage's kernel pass, which moves the modules above into it
        self.channels_last: nn.Module | None = None

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        if self.channels_last is not None:
            return self.channels_last(codes)
        h = self.quantizer(codes)
        h = self.pre_transformer(self.pre_conv(h).transpose(1, 2)).transpose(1, 2)
        for pair in self.upsample:
            for m in pair:
                h = m(h)
        for m in self.decoder:
            h = m(h)
        return h.clamp(-1.0, 1.0).float()
