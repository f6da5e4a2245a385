"""Fish S2 Pro `fast_ar`: the 4-layer codebook predictor, the whole per-frame loop in one exported program.

slow-AR hidden [B,D] (post-norm) + semantic token id [B] + noise → codes [B,10] (code0 = clamp(tok − 151678,
0, 4095), codes 1..9 sampled on device with builder/predictor.py). Facts: shared/reference/STAGES.md §1.1–1.3.

The reference replays a one-position graph 10× and samples on the host in between; here positions 0..9 are
unrolled with an explicit KV cache (positions 0 and 1 in one causal pass, then one position per step), the
sampler is traced in, and one package (one CUDA graph) per batch bucket does a whole frame.

Optional second output (`fast_ar_with_embedding`, the talker_mtp contract of §1.2): the next slow-AR input
embedding, `(token_embed + Σ_i codebook_embeddings[code_i + 4096·i]) / √11` for semantic tokens and
`token_embed` otherwise. The 400 MiB text embedding table stays with the slow AR: the caller passes the plain
embedding of the token (`token_embed`, as vLLM-Omni's `preprocess` does); the stage carries only the pruned
codebook table (book 0: 4096 rows, books 1..9: the 1024 rows residual codes can reach)."""

from __future__ import annotations

import math

import torch
from torch import nn

from ...layers.norms import RMSNorm
from ...layers.rope import rope_table_interleaved
from ...layers.transformer import DecoderBlock
from ...predictor import Pick, head_logits, traced_sampler, unrolled_frame
from .config import FastARConfig


class FastAR(nn.Module):
    """forward(hidden, token, noise, temperature, top_k, top_p[, token_embed]) → codes [B,10] (, embed [B,D])."""

    LOGIT_HEADS = ("output",)  # predictor.use_predictor_kernels

    def __init__(self, cfg: FastARConfig, with_embedding: bool = False) -> None:
        super().__init__()
        self.cfg, self.with_embedding = cfg, with_embedding
        self.sampler_kernel = False  # each draw one ttsaot::sample_tokens (set by predictor.use_sampler_kernel)
        self.layers = nn.ModuleList(
            DecoderBlock(
                cfg.dim,
                cfg.n_head,
                cfg.n_local_heads,
                cfg.head_dim,
                cfg.intermediate_size,
                cfg.rms_norm_eps,
                qk_norm=False,
                rope_style="interleaved",
                fused_qkv=True,
            )
            for _ in range(cfg.n_layer)
        )
        self.norm = RMSNorm(cfg.dim, cfg.rms_norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        if with_embedding:
            self.codebook_embeddings = nn.Embedding(cfg.num_codebooks * cfg.codebook_size, cfg.dim)
            self.register_buffer(
                "codebook_offsets", torch.arange(cfg.num_codebooks) * cfg.codebook_size, persistent=False
            )
        cos, sin = rope_table_interleaved(cfg.head_dim, cfg.max_seq_len, cfg.rope_base, round_to=torch.bfloat16)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def decode(self, hidden: torch.Tensor, token: torch.Tensor, pick: Pick) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The per-frame loop; `pick(step, logits [B,R]) → code [B]` chooses each residual code. Returns codes
        [B,nc] and the residual logits of every step (fp32 eager reference for tests). A token outside the
        semantic range gives code 0 = the nearest semantic code (upstream's clamp; the runtime refuses only ids
        outside the text vocabulary)."""
        cfg = self.cfg
        last = cfg.num_codebooks - 1
        dt = self.norm.weight.dtype
        code0 = (token - cfg.semantic_start_token_id).clamp(0, cfg.vocab_size - 1)
        x = torch.stack((hidden.to(dt), self.embeddings(code0)), dim=1)  # positions 0, 1

        def logits_at(step: int, h: torch.Tensor) -> torch.Tensor:
            return head_logits(self.norm, self.output, h)[:, : cfg.residual_codebook_size]

        def feed(step: int, code: torch.Tensor) -> torch.Tensor | None:
            return self.embeddings(code)[:, None] if step < last else None

        codes, all_logits = unrolled_frame(self.layers, self.rope_cos, self.rope_sin, x, last, logits_at, feed, pick)
        return torch.stack([code0, *codes], dim=1), all_logits

    def next_input_embedding(self, token: torch.Tensor, codes: torch.Tensor, token_embed: torch.Tensor) -> torch.Tensor:
        dt = self.norm.weight.dtype
        plain = token_embed.to(dt)
        summed = self.codebook_embeddings(codes + self.codebook_offsets[None, :]).sum(dim=1)
        mixed = (plain + summed) / math.sqrt(self.cfg.num_codebooks + 1)
        start = self.cfg.semantic_start_token_id
        is_semantic = (token >= start) & (token < start + self.cfg.vocab_size)
        return torch.where(is_semantic[:, None], mixed, plain).float()

    def forward(self, hidden, token, noise, temperature, top_k, top_p, token_embed=None):
        pick = traced_sampler(noise, temperature, top_k, top_p, kernel=self.sampler_kernel)
        codes, _ = self.decode(hidden, token, pick)
        if not self.with_embedding:
            return codes
        return codes, self.next_input_embedding(token, codes, token_embed)


def prune_fast_ar(m: FastAR) -> dict:
    """Drop what is never read: output-head rows ≥ 1024 (only residual codes are predicted) and, with the
    embedding output, codebook-table rows ≥ 1024 of books 1..9. Offsets are rewritten to the packed table."""
    cfg = m.cfg
    R, dropped = cfg.residual_codebook_size, {}
    if m.output.out_features > R:
        dropped["output"] = (m.output.out_features - R) * cfg.dim
        head = nn.Linear(cfg.dim, R, bias=False)
        with torch.no_grad():
            head.weight.copy_(m.output.weight[:R])
        m.output = head
    if m.with_embedding and m.codebook_embeddings.num_embeddings == cfg.num_codebooks * cfg.codebook_size:
        W = m.codebook_embeddings.weight.detach()
        rows = [W[: cfg.codebook_size]] + [
            W[i * cfg.codebook_size : i * cfg.codebook_size + R] for i in range(1, cfg.num_codebooks)
        ]
        packed = torch.cat(rows)
        dropped["codebook_embeddings"] = (W.shape[0] - packed.shape[0]) * cfg.dim
        m.codebook_embeddings = nn.Embedding.from_pretrained(packed.clone(), freeze=False)
        m.codebook_offsets = torch.tensor([0] + [cfg.codebook_size + (i - 1) * R for i in range(1, cfg.num_codebooks)])
    return {"pass": "prune_fast_ar", "dropped": dropped}
