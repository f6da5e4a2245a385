"""Build options of `fish-s2-pro` (torch-free: the CLI reads the flags declared here before importing torch)."""

from __future__ import annotations

from dataclasses import dataclass

from ...buckets import StreamingCodecOptions, StreamingConfig
from ...options import flag, flag_group, one_of, positive_floats, switch

# vLLM-Omni connector defaults: first chunks of 4 frames (whole history as context) until 25, then 25 + 25 context.
STREAMING_DEFAULTS = StreamingConfig(
    chunk_frames=25, left_context_frames=25, first_chunk_frames=4, nonstreaming_chunk_frames=0
)

# The dac_decoder's numerics (issue 15): the target default is the faster of TF32 (≤ 1e-3 relative error vs exact
# fp32) and bf16 (≥ 35 dB SNR vs fp32), never slower than the upstream eager path; until the GPU has measured both
# on the full decoder (`python -m bench codec-stages` prints each precision's time and error per bucket) the default
# stays exact fp32, the artifacts' behaviour so far. Known so far: on CPU (the kernels' rounding points, random
# weights) bf16 gives 37.7 dB on the tiny preset and 38.2 dB on the full decoder (29 frames); on an H100 the TF32
# conv stack measured 1.07e-3 (fused kernels) / 0.98e-3 (cuDNN) on random weights
# (bench/results/nvidia-h100/conv_kernels.json), at the limit. Flipping the default is this one constant.
DAC_DECODER_PRECISION = "fp32"
DAC_DECODER_PRECISIONS = ("bf16", "tf32", "fp32")


@dataclass
class FishS2Options(StreamingCodecOptions):
    """dtype None = each stage's default: fast_ar bf16, dac_encoder fp32 always (policy). The dac_decoder's
    numerics are `dac_decoder_precision` (None = DAC_DECODER_PRECISION); `--dtype`, when given, must agree with
    it (float32 ↔ fp32/tf32, bfloat16 ↔ bf16) and picks bf16 or exact fp32 when the precision is not given."""

    streaming: StreamingConfig = flag_group(lambda: STREAMING_DEFAULTS)
    encoder_seconds: tuple[float, ...] = flag(
        (5.0, 10.0, 15.0, 30.0),
        parse=positive_floats,
        metavar="S,S",
        help="dac_encoder length buckets in seconds of reference audio.",
    )
    fast_ar_with_embedding: bool = switch(
        False, name="--with-embedding", help="fast_ar also outputs the next slow-AR input embedding."
    )
    dac_decoder_precision: str | None = flag(
        None,
        parse=one_of(*DAC_DECODER_PRECISIONS),
        metavar="P",
        help=f"dac_decoder numerics: bf16 (≥ 35 dB SNR vs fp32), tf32 (≤ 1e-3 relative error) or fp32 (exact; "
        f"tf32x3 on the conv kernels) [default: {DAC_DECODER_PRECISION}].",
    )
