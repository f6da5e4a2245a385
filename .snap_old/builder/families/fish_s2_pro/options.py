"""Build options of `fish-s2-pro` (torch-free: the CLI reads the flags declared here before importing torch)."""

from __future__ import annotations

from dataclasses import dataclass

from ...buckets import StreamingCodecOptions, StreamingConfig
from ...options import flag, flag_group, one_of, positive_floats, switch

# vLLM-Omni connector defaults: first chunks of 4 frames (whole history as context) until 25, then 25 + 25 context.
STREAMING_DEFAULTS = StreamingConfig(
    chunk_frames=25, left_context_frames=25, first_chunk_frames=4, nonstreaming_chunk_frames=0
)

# The dac_decoder's numerics (issue 15): the default is the faster of TF32 (≤ 1e-3 relative error vs exact fp32) and
# bf16 (≥ 35 dB SNR vs fp32) on the device built for, never slower than the upstream eager path. On an H100 (full
# decoder, ttsaot conv kernels, bench/results/nvidia-h100/codec_stages_dac_decoder_{bf16,tf32,fp32}_corners.json)
# bf16 took 0.76 / 1.97 / 1.01 / 5.29 ms at b1_f4 / b1_f50 / b4_f4 / b4_f50 with 39-40 dB SNR, TF32 1.57 / 4.96 /
# 2.52 / 14.9 ms, the faithful fp32 module under PyTorch's defaults 13.7 / 14.7 / 22.8 / 33.7 ms: bf16 on CUDA. On
# CPU the fp32 convolutions are the fast ones (no bf16 tensor cores), and exact: fp32 there.
DAC_DECODER_PRECISION_BY_DEVICE = {"cuda": "bf16", "cpu": "fp32"}
DAC_DECODER_PRECISIONS = ("bf16", "tf32", "fp32")


@dataclass
class FishS2Options(StreamingCodecOptions):
    """dtype None = each stage's default: fast_ar bf16, dac_encoder fp32 always (policy). The dac_decoder's
    numerics are `dac_decoder_precision` (None = DAC_DECODER_PRECISION_BY_DEVICE[device]); `--dtype`, when given,
    must agree with it (float32 ↔ fp32/tf32, bfloat16 ↔ bf16) and picks bf16 or exact fp32 when the precision is
    not given."""

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
        f"tf32x3 on the conv kernels) [default: {DAC_DECODER_PRECISION_BY_DEVICE['cuda']} on CUDA, "
        f"{DAC_DECODER_PRECISION_BY_DEVICE['cpu']} on CPU].",
    )
