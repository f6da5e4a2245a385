"""Qwen3-TTS 12 Hz configs: `code2wav` (speech tokenizer v2 decoder, `speech_tokenizer/config.json`
`decoder_config`) and `code_predictor` (`config.json` `talker_config.code_predictor_config`), named presets and
the readers of the real config files. Facts: shared/reference/STAGES.md §2.2–2.3."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAMPLE_RATE = 24000
TOKENIZER_DIR = "speech_tokenizer"  # the codec's folder inside a Qwen3-TTS checkpoint


@dataclass(frozen=True)
class Code2WavConfig:
    """`decoder_config` of speech_tokenizer/config.json (names as there)."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    latent_dim: int = 1024
    decoder_dim: int = 1536
    hidden_size: int = 512
    intermediate_size: int = 1024
    head_dim: int = 64
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    num_hidden_layers: int = 8
    sliding_window: int = 72
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8000
    layer_scale_initial_scale: float = 0.01
    num_quantizers: int = 16
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    attention_bias: bool = False
    hidden_act: str = "silu"

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)

    @property
    def receptive_field_frames(self) -> int:
        """Frames of left context after which a chunk's output no longer depends on earlier codes: pre_conv (2) +
        the sliding-window attention stack + the conv tail (≈10 frames, STAGES.md §2.2), rounded up."""
        return 2 + self.num_hidden_layers * (self.sliding_window - 1) + 12

    @classmethod
    def from_json(cls, d: dict) -> Code2WavConfig:
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in known}
        if "head_dim" not in d and "hidden_size" in d and "num_attention_heads" in d:
            kw["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        if kw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"code2wav: hidden_act {kw['hidden_act']!r} is not supported (silu only)")
        return cls(**kw)


CODE2WAV_PRESETS: dict[str, Code2WavConfig] = {
    "full": Code2WavConfig(),
    # Same topology (16 codebooks, 8→2 layers, 4 decoder blocks, 29 SnakeBeta), small widths: CPU tests and demo.
    "tiny": Code2WavConfig(
        codebook_size=64,
        codebook_dim=32,
        latent_dim=32,
        decoder_dim=64,
        hidden_size=32,
        intermediate_size=64,
        head_dim=8,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_hidden_layers=2,
        sliding_window=8,
        max_position_embeddings=1024,
        upsample_rates=(2, 2, 2, 2),
        upsampling_ratios=(2, 2),
    ),
}


@dataclass(frozen=True)
class CodePredictorConfig:
    """`talker_config.code_predictor_config` (HF names) plus the two talker sizes it depends on."""

    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 5
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    vocab_size: int = 2048
    num_code_groups: int = 16
    talker_hidden_size: int = 1024  # 0.6B: 1024 (no projection); 1.7B: 2048
    talker_vocab_size: int = 3072

    @property
    def has_projection(self) -> bool:
        return self.talker_hidden_size != self.hidden_size

    @classmethod
    def from_json(cls, d: dict) -> CodePredictorConfig:
        talker = d.get("talker_config", d)
        cp = talker.get("code_predictor_config")
        if cp is None:
            raise ValueError("config.json has no talker_config.code_predictor_config")
        known = set(cls.__dataclass_fields__)
        kw: dict[str, Any] = {k: v for k, v in cp.items() if k in known and not k.startswith("talker_")}
        if "head_dim" not in cp:
            kw["head_dim"] = cp["hidden_size"] // cp["num_attention_heads"]
        if cp.get("hidden_act", "silu") != "silu":
            raise ValueError(f"code_predictor: hidden_act {cp['hidden_act']!r} is not supported (silu only)")
        if cp.get("rope_scaling") or cp.get("use_sliding_window"):
            raise ValueError("code_predictor: rope_scaling / sliding window are not the Qwen3-TTS predictor")
        kw["talker_hidden_size"] = talker["hidden_size"]
        kw["talker_vocab_size"] = talker.get("vocab_size", 3072)
        return cls(**kw)


CODE_PREDICTOR_PRESETS: dict[str, CodePredictorConfig] = {
    "0.6B": CodePredictorConfig(talker_hidden_size=1024),
    "1.7B": CodePredictorConfig(talker_hidden_size=2048),
    # Same topology (16 code groups, GQA 2:1, q/k norm, projection from a wider talker), small widths and one
    # layer: the 15 unrolled steps make AOTI compile time scale with the layer count (CPU CI budget).
    "tiny": CodePredictorConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=64,
        talker_hidden_size=48,
        talker_vocab_size=96,
    ),
}


# ------------------------------------------------------------------------------------------ config files
def tokenizer_dir(path: str | Path) -> Path:
    """The speech tokenizer folder of a checkpoint (`<dir>/speech_tokenizer`), or `path` itself when it is one."""
    p = Path(path)
    return p / TOKENIZER_DIR if (p / TOKENIZER_DIR).is_dir() else p


def code2wav_config_from_checkpoint(path: str | Path) -> Code2WavConfig:
    cfg_path = tokenizer_dir(path) / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path}: speech_tokenizer/config.json not found")
    d = json.loads(cfg_path.read_text())
    return Code2WavConfig.from_json(d.get("decoder_config", d))


def has_code_predictor(path: str | Path) -> bool:
    """True for a main Qwen3-TTS checkpoint dir (config.json with a talker), False for a speech tokenizer dir."""
    p = Path(path) / "config.json"
    try:
        return p.is_file() and "talker_config" in json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return False


def code_predictor_config_from_checkpoint(path: str | Path) -> CodePredictorConfig:
    p = Path(path) / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: config.json (model_type qwen3_tts) not found")
    return CodePredictorConfig.from_json(json.loads(p.read_text()))
