"""Build options of `fish-s2-pro` (torch-free: the CLI reads the flags declared here before importing torch)."""

from __future__ import annotations

from dataclasses import dataclass

from ...buckets import StreamingCodecOptions, StreamingConfig
from ...options import flag, flag_group, positive_floats, switch

# vLLM-Omni connector defaults: first chunks of 4 frames (whole history as context) until 25, then 25 + 25 context.
STREAMING_DEFAULTS = StreamingConfig(chunk_frames=25, left_context_frames=25, first_chunk_frames=4,
                                     nonstreaming_chunk_frames=0)


@dataclass
class FishS2Options(StreamingCodecOptions):
    """dtype None = each stage's default: fast_ar bf16, dac_decoder fp32, dac_encoder fp32 always (policy)."""

    streaming: StreamingConfig = flag_group(lambda: STREAMING_DEFAULTS)
    encoder_seconds: tuple[float, ...] = flag((5.0, 10.0, 15.0, 30.0), parse=positive_floats, metavar="S,S",
                                              help="dac_encoder length buckets in seconds of reference audio.")
    fast_ar_with_embedding: bool = switch(False, name="--with-embedding",
                                          help="fast_ar also outputs the next slow-AR input embedding.")
