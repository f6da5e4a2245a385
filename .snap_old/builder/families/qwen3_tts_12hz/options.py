"""Build options of `qwen3-tts-12hz` (torch-free: the CLI reads the flags declared here before importing torch)."""

from __future__ import annotations

from dataclasses import dataclass

from ...buckets import StreamingCodecOptions, StreamingConfig
from ...options import flag, flag_group, one_of, switch

# vLLM-Omni's Qwen3-TTS streaming: chunks of 25 frames with 25 frames of left context; long one-shot requests are
# decoded in chunks of 300 frames.
STREAMING_DEFAULTS = StreamingConfig(
    chunk_frames=25, left_context_frames=25, first_chunk_frames=0, nonstreaming_chunk_frames=300
)
TALKER_SIZES = ("0.6B", "1.7B")


@dataclass
class Qwen3TTSOptions(StreamingCodecOptions):
    """dtype None = bf16 for both stages (numerics policy); fp32 selectable."""

    streaming: StreamingConfig = flag_group(lambda: STREAMING_DEFAULTS)
    talker_size: str = flag(
        "0.6B", parse=one_of(*TALKER_SIZES), help="code_predictor config of --preset full (the talker it serves)."
    )
    code_predictor_with_embedding: bool = switch(
        False,
        name="--with-embedding",
        help="code_predictor also outputs the summed codec embedding for the next talker step.",
    )
