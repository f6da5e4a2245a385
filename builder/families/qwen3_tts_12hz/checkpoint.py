"""Qwen3-TTS 12 Hz checkpoints: which tensors each stage loads (strict: anything unknown is an error), random
weights for the presets, and writers of test checkpoints in the real layout.

A Qwen3-TTS checkpoint folder (e.g. Qwen/Qwen3-TTS-12Hz-0.6B-Base) holds `config.json` + `model.safetensors`
(talker, code predictor, speaker encoder) and `speech_tokenizer/{config.json, model.safetensors}` (the codec)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import torch

from ....runtime.artifact import sha256_of
from ...checkpoint import KeyRules, fan_in_fill, fill_by_name, load_strict, read_safetensors_selected
from .code2wav import Code2Wav
from .code_predictor import CodePredictor
from .config import (
    SAMPLE_RATE,
    TOKENIZER_DIR,
    Code2WavConfig,
    CodePredictorConfig,
    code2wav_config_from_checkpoint,
    tokenizer_dir,
)

# ---------------------------------------------------------------------------------------------- code2wav
# speech_tokenizer/model.safetensors: `decoder.*` is this module; `encoder.*` (Mimi) is never read; the two
# quantizer input projections serve encoding only and are dropped (counted as pruned).
CODE2WAV_RULES = KeyRules(
    prefix="decoder.",
    ignore_prefixes=("encoder.",),
    drop_patterns=(r"decoder\.quantizer\.rvq_(first|rest)\.input_proj\.weight",),
)


def load_code2wav(path: str | Path, cfg: Code2WavConfig | None = None) -> tuple[Code2Wav, dict]:
    tok = tokenizer_dir(path)
    cfg = cfg or code2wav_config_from_checkpoint(tok)
    st = tok / "model.safetensors"
    if not st.is_file():
        raise FileNotFoundError(f"{st}: speech_tokenizer/model.safetensors not found")
    tensors, report = read_safetensors_selected(st, CODE2WAV_RULES)
    model = Code2Wav(cfg)
    load_strict(model, tensors, report["unknown"], source=str(st))
    report["sha256"] = sha256_of(st)
    report["path"] = str(st)
    return model.eval(), report


def init_random_code2wav(model: Code2Wav, seed: int = 0) -> Code2Wav:
    """Deterministic random weights with realistic scales (codebooks non-zero, snake log-params spread), so
    the tiny preset produces audio-range signals rather than zeros or saturated clamps. Keyed by parameter name
    (`fill_by_name`)."""
    out_conv = f"decoder.{len(model.decoder) - 1}."

    def fill(name: str, p: torch.Tensor, g: torch.Generator) -> None:
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "embedding_sum":
            p.normal_(0.0, 1.0, generator=g)
        elif leaf == "cluster_usage":
            p.uniform_(0.5, 2.0, generator=g)
        elif leaf in ("alpha", "beta"):
            p.normal_(0.0, 0.3, generator=g)
        elif leaf in ("scale", "gamma"):
            p.normal_(0.3, 0.1, generator=g)
        else:
            # Residual branches and the output conv start small, as trained vocoders are: otherwise 29
            # residual snakes grow the signal ~3x per block and the clamp saturates everything.
            fan_in_fill(name, p, g, gain=0.1 if (".conv2." in name or name.startswith(out_conv)) else 1.0)

    fill_by_name(dict(model.named_parameters()), fill, seed)
    return model.eval()


def write_code2wav_checkpoint(model: Code2Wav, out_dir: str | Path, seed: int = 0) -> Path:
    """Save `model` in the real layout: <out>/speech_tokenizer/{config.json, model.safetensors} with
    `decoder.*` plus the encode-only input projections and a token `encoder.*` tensor (both never read)."""
    from safetensors.torch import save_file

    tok = Path(out_dir) / TOKENIZER_DIR
    tok.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg
    g = torch.Generator().manual_seed(seed + 1)
    sd = {f"decoder.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}
    for grp in ("rvq_first", "rvq_rest"):
        sd[f"decoder.quantizer.{grp}.input_proj.weight"] = torch.randn(
            cfg.codebook_dim // 2, cfg.codebook_dim, 1, generator=g
        )
    sd["encoder.encoder.layers.0.conv.weight"] = torch.randn(4, 1, 7, generator=g)
    save_file(sd, str(tok / "model.safetensors"))
    dcfg = asdict(cfg)
    dcfg = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dcfg.items()}
    (tok / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen3_tts_tokenizer_12hz",
                "input_sample_rate": SAMPLE_RATE,
                "output_sample_rate": SAMPLE_RATE,
                "decode_upsample_rate": cfg.samples_per_frame,
                "encoder_valid_num_quantizers": cfg.num_quantizers,
                "decoder_config": dcfg,
            },
            indent=2,
        )
    )
    return tok


# ---------------------------------------------------------------------------------------- code_predictor
# model.safetensors: `talker.code_predictor.*` is this module (HF names); the talker's codec_embedding gives the
# code0 row; the rest of the talker and the speaker encoder are other stages (never read).
CODE_PREDICTOR_RULES = KeyRules(
    prefix="talker.code_predictor.",
    ignore_prefixes=(
        "talker.model.layers.",
        "talker.model.norm.",
        "talker.model.text_embedding.",
        "talker.model.rotary_emb.",
        "talker.text_projection.",
        "talker.codec_head.",
        "speaker_encoder.",
    ),
    rename={"talker.model.codec_embedding.weight": "talker_codec_embedding.weight"},
)


def load_code_predictor(path: str | Path, cfg: CodePredictorConfig, with_embedding: bool) -> tuple[CodePredictor, dict]:
    st = Path(path) / "model.safetensors"
    if not st.is_file():
        raise FileNotFoundError(f"{st}: model.safetensors (talker.*) not found")
    tensors, report = read_safetensors_selected(st, CODE_PREDICTOR_RULES)
    model = CodePredictor(cfg, with_embedding)
    load_strict(model, tensors, report.pop("unknown"), source=str(st))
    report.update(sha256=sha256_of(st), path=str(st))
    return model.eval(), report


def init_random_code_predictor(model: CodePredictor, seed: int = 0) -> CodePredictor:
    """Deterministic random weights, keyed by parameter name (`fill_by_name`); lm heads scaled so logits spread
    over a few units (peaked distributions)."""

    def fill(name: str, p: torch.Tensor, g: torch.Generator) -> None:
        if name.endswith("bias"):
            p.normal_(0.0, 0.02, generator=g)
        elif p.dim() == 1:
            p.normal_(1.0, 0.1, generator=g)
        elif "embedding" in name:
            p.normal_(0.0, 1.0, generator=g)
        else:
            gain = 4.0 if name.startswith("lm_head") else 1.0
            p.normal_(0.0, gain / math.sqrt(p.shape[1]), generator=g)

    fill_by_name(dict(model.named_parameters()), fill, seed)
    return model.eval()


def write_code_predictor_checkpoint(model: CodePredictor, out_dir: str | Path) -> Path:
    """Save in the real layout: <out>/config.json (talker_config.code_predictor_config) and model.safetensors
    with `talker.code_predictor.*`, `talker.model.codec_embedding.weight` and a token talker/speaker tensor."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg
    sd = {
        (
            "talker.model.codec_embedding.weight"
            if k == "talker_codec_embedding.weight"
            else f"talker.code_predictor.{k}"
        ): v.detach().contiguous()
        for k, v in model.state_dict().items()
    }
    sd["talker.model.norm.weight"] = torch.ones(cfg.talker_hidden_size)
    sd["speaker_encoder.fc.weight"] = torch.zeros(4, 4)
    save_file(sd, str(out / "model.safetensors"))
    cp = {k: v for k, v in asdict(cfg).items() if not k.startswith("talker_")}
    cp.update(hidden_act="silu", max_position_embeddings=65536, attention_bias=False, use_sliding_window=False)
    (out / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen3_tts",
                "tokenizer_type": "qwen3_tts_tokenizer_12hz",
                "talker_config": {
                    "hidden_size": cfg.talker_hidden_size,
                    "vocab_size": cfg.talker_vocab_size,
                    "num_code_groups": cfg.num_code_groups,
                    "code_predictor_config": cp,
                },
            },
            indent=2,
        )
    )
    return out
