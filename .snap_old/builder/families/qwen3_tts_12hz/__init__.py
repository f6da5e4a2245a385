"""Qwen3-TTS 12 Hz (`qwen3-tts-12hz`): `code2wav` (speech tokenizer decoder) and `code_predictor` (MTP)."""

from ...family import Family
from .options import Qwen3TTSOptions

FAMILY = Family(
    name="qwen3-tts-12hz",
    presets=("tiny", "full"),
    Options=Qwen3TTSOptions,
    stages=("code2wav", "code_predictor"),
    package=__name__,
)
