"""Qwen3-TTS 12 Hz `code_predictor` (MTP, `talker.code_predictor`): codes 1..15 of a frame in one program.

talker hidden [B,Ht] + code0 [B] + noise → codes [B,16] (code 0 as given; codes 1..15 sampled on device with
builder/predictor.py). Facts: shared/reference/STAGES.md §2.3.

Row 0 of the predictor input is proj(talker hidden), row 1 proj(talker.codec_embedding(code0)); step s reads
lm_head[s−1] at row s and appends proj(codec_embedding[s−1](code_s)). The reference re-prefills a 17-row buffer
per step and samples on the host; here the 16 positions are unrolled with an explicit KV cache and the sampler
traced in: one package (one CUDA graph) per batch bucket does a whole frame. The talker's own `codec_embedding`
row for code0 is looked up inside (its 2048 code rows only: code0 ≥ 2048, a special token such as EOS, yields
an all-zero row as in vLLM-Omni's talker_mtp). Optional second output (`code_predictor_with_embedding`): the
summed embedding talker_emb(code0) + Σ_s codec_embedding[s−1](code_s) [B,Ht] for the next talker step (the
caller adds the text-side embedding)."""

from __future__ import annotations

import torch
from torch import nn

from ...layers.norms import RMSNorm
from ...layers.rope import rope_table
from ...layers.transformer import DecoderBlock
from ...predictor import Pick, head_logits, traced_sampler, unrolled_frame
from .config import CodePredictorConfig


class _Inner(nn.Module):
    """`talker.code_predictor.model`."""

    def __init__(self, cfg: CodePredictorConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderBlock(
                cfg.hidden_size,
                cfg.num_attention_heads,
                cfg.num_key_value_heads,
                cfg.head_dim,
                cfg.intermediate_size,
                cfg.rms_norm_eps,
                qk_norm=True,
                rope_style="neox",
            )
            for _ in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.vocab_size, cfg.talker_hidden_size) for _ in range(cfg.num_code_groups - 1)
        )


class CodePredictor(nn.Module):
    """forward(hidden, code0, noise, temperature, top_k, top_p) → codes [B,16] (, next_embed [B,Ht])."""

    LOGIT_HEADS = ("lm_head",)  # predictor.use_predictor_kernels

    def __init__(self, cfg: CodePredictorConfig, with_embedding: bool = False) -> None:
        super().__init__()
        self.cfg, self.with_embedding = cfg, with_embedding
        self.sampler_kernel = False  # each draw one ttsaot::sample_tokens (set by predictor.use_sampler_kernel)
        self.model = _Inner(cfg)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(cfg.num_code_groups - 1)
        )
        self.small_to_mtp_projection = (
            nn.Linear(cfg.talker_hidden_size, cfg.hidden_size, bias=True) if cfg.has_projection else nn.Identity()
        )
        # `talker.model.codec_embedding`: the talker's table, for the code0 row.
        self.talker_codec_embedding = nn.Embedding(cfg.talker_vocab_size, cfg.talker_hidden_size)
        cos, sin = rope_table(cfg.head_dim, cfg.num_code_groups, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def decode(
        self, hidden: torch.Tensor, code0: torch.Tensor, pick: Pick, collect_embedding: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor | None]:
        """`pick(step, logits [B,V]) → code [B]`. Returns codes [B,16] (invalid code0 rows zeroed), the logits
        of every step and, if asked, the summed talker-side embedding."""
        cfg = self.cfg
        last = cfg.num_code_groups - 1
        dt = self.model.norm.weight.dtype
        valid = (code0 >= 0) & (code0 < cfg.vocab_size)
        emb0 = self.talker_codec_embedding(code0.clamp(0, cfg.vocab_size - 1))
        x = self.small_to_mtp_projection(torch.stack((hidden.to(dt), emb0), dim=1))  # rows 0, 1
        summed = [emb0] if collect_embedding else None

        def logits_at(step: int, h: torch.Tensor) -> torch.Tensor:
            return head_logits(self.model.norm, self.lm_head[step - 1], h)

        def feed(step: int, code: torch.Tensor) -> torch.Tensor | None:
            if step < last or collect_embedding:
                e = self.model.codec_embedding[step - 1](code)
                if summed is not None:
                    summed[0] = summed[0] + e
                if step < last:
                    return self.small_to_mtp_projection(e)[:, None]
            return None

        codes, all_logits = unrolled_frame(
            self.model.layers, self.rope_cos, self.rope_sin, x, last, logits_at, feed, pick
        )
        out = torch.where(valid[:, None], torch.stack([code0, *codes], dim=1), torch.zeros_like(code0)[:, None])
        total = None
        if summed is not None:
            total = torch.where(valid[:, None], summed[0], torch.zeros_like(summed[0]))
        return out, all_logits, total

    def forward(self, hidden, code0, noise, temperature, top_k, top_p):
        pick = traced_sampler(noise, temperature, top_k, top_p, kernel=self.sampler_kernel)
        codes, _, summed = self.decode(hidden, code0, pick, collect_embedding=self.with_embedding)
        if not self.with_embedding:
            return codes
        return codes, summed.float()


def prune_code_predictor(m: CodePredictor) -> dict:
    """Drop what is never read: talker codec-embedding rows ≥ 2048 (special tokens: such rows are zeroed) and,
    without the embedding output, the last codec_embedding table (code 15's embedding is never fed back)."""
    cfg, dropped = m.cfg, {}
    if m.talker_codec_embedding.num_embeddings > cfg.vocab_size:
        W = m.talker_codec_embedding.weight.detach()
        dropped["talker_codec_embedding"] = (W.shape[0] - cfg.vocab_size) * W.shape[1]
        m.talker_codec_embedding = nn.Embedding.from_pretrained(W[: cfg.vocab_size].clone(), freeze=False)
    tables = m.model.codec_embedding
    if not m.with_embedding and len(tables) == cfg.num_code_groups - 1:
        dropped[f"model.codec_embedding.{len(tables) - 1}"] = tables[-1].weight.numel()
        m.model.codec_embedding = nn.ModuleList(list(tables)[:-1])
    return {"pass": "prune_code_predictor", "dropped": dropped}
