"""Qwen3-TTS 12 Hz in the bench: buckets, the upstream `qwen_tts` decoder, the code predictor's per-step loop."""

from __future__ import annotations

from dataclasses import asdict

import torch
import torch.nn.functional as F
from torch import nn

from ..predictor_loops import StepAdapter
from ..upstream import import_module_alone
from . import BenchFamily, Buckets, Upstream

# One 50-frame decode at B=1 and B=4 with streaming chunk 25 / left context 25 (full); a single small bucket whose
# streaming window fits it (tiny, CPU smoke).
CODEC_DECODER = {
    "full": Buckets(axes={"batch": (1, 4), "frames": (25, 50)}),
    "tiny": Buckets(
        axes={"batch": (1,), "frames": (16,)},
        streaming={
            "chunk_frames": 8,
            "left_context_frames": 8,
            "first_chunk_frames": 0,
            "nonstreaming_chunk_frames": 0,
        },
    ),
}


def code2wav_upstream(ours: nn.Module) -> nn.Module:
    """qwen-tts Qwen3TTSTokenizerV2Decoder with our faithful module's weights (same key names; upstream also
    has the encode-only `input_proj` convs, which decoding never reads)."""
    from ..common import Skipped

    cfg_mod = import_module_alone("qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2")
    model_mod = import_module_alone("qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2")
    d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(ours.cfg).items()}
    cfg = cfg_mod.Qwen3TTSTokenizerV2DecoderConfig(**d)
    cfg._attn_implementation = "sdpa"
    up = model_mod.Qwen3TTSTokenizerV2Decoder(cfg).eval()
    missing, unexpected = up.load_state_dict(ours.state_dict(), strict=False)
    bad_missing = [k for k in missing if ".input_proj." not in k]
    if unexpected or bad_missing:
        raise Skipped(
            f"unavailable: weights do not map onto upstream (missing {bad_missing[:3]}, "
            f"unexpected {list(unexpected)[:3]})"
        )
    return up


class CodePredictorSteps(StepAdapter):
    """Mirrors `CodePredictor.decode` / `CodePredictor.forward`."""

    first_input = "code0"

    def __init__(self, m: nn.Module) -> None:
        self.m, self.cfg = m, m.cfg
        self.layers, self.rope_cos, self.rope_sin = m.model.layers, m.rope_cos, m.rope_sin
        self.n_steps = m.cfg.num_code_groups - 1

    def norm_weight(self) -> torch.Tensor:
        return self.m.model.norm.weight

    def code0(self, code0):
        return code0

    def _emb0(self, code0: torch.Tensor) -> torch.Tensor:
        return self.m.talker_codec_embedding(code0.clamp(0, self.cfg.vocab_size - 1))

    def prefix(self, hidden, code0):
        return self.m.small_to_mtp_projection(torch.stack((hidden.to(self.dtype), self._emb0(code0)), dim=1))

    def embed_weights(self, step):
        return (self.m.model.codec_embedding[step - 2].weight,)

    def head_weights(self, step):
        return (self.m.lm_head[step - 1].weight,)

    def embed(self, code, table):
        return self.m.small_to_mtp_projection(F.embedding(code, table))[:, None]

    def head(self, h, weight):
        return F.linear(self.m.model.norm(h), weight)

    def outputs(self, named, codes):
        code0 = named["code0"]
        valid = (code0 >= 0) & (code0 < self.cfg.vocab_size)
        out = torch.where(valid[:, None], torch.stack(codes, dim=1), torch.zeros_like(code0)[:, None])
        if not self.m.with_embedding:
            return out
        # Same left fold, in the module dtype, as decode(collect_embedding=True).
        summed = self._emb0(code0)
        for step in range(1, self.n_steps + 1):
            summed = summed + self.m.model.codec_embedding[step - 1](codes[step])
        return out, torch.where(valid[:, None], summed, torch.zeros_like(summed)).float()


BENCH = BenchFamily(
    buckets={
        "code2wav": CODEC_DECODER,
        "code_predictor": {"full": Buckets(axes={"batch": (1, 8)})},
    },
    upstream={"code2wav": Upstream("qwen_tts Qwen3TTSTokenizerV2Decoder", code2wav_upstream)},
    step_loops={"code_predictor": CodePredictorSteps},
    layers={
        "code_predictor": lambda e: (
            e.config["num_hidden_layers"] * e.metadata["sampled_codebooks"],
            "num_hidden_layers × sampled codebook steps",
        )
    },
)
