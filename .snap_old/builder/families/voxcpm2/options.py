"""Build options of `voxcpm2` (torch-free: the CLI reads the flags declared here before importing torch)."""

from __future__ import annotations

from dataclasses import dataclass

from ...buckets import StreamingCodecOptions, StreamingConfig
from ...options import OptionsError, flag, flag_group, positive_float, positive_int, positive_ints

# The VAE is decoded every 3 LM steps = 12 new latent frames; left context must cover its ~20-frame receptive field.
STREAMING_DEFAULTS = StreamingConfig(
    chunk_frames=12, left_context_frames=24, first_chunk_frames=0, nonstreaming_chunk_frames=0
)
# The Euler solver's first step is zero-init: fewer than 2 steps would never call the estimator.
MIN_TIMESTEPS = 2


@dataclass
class VoxCPM2Options(StreamingCodecOptions):
    """dtype None = each stage's default: LMs, locdit and local_encoder bf16; vae_decoder fp32 always (policy)."""

    streaming: StreamingConfig = flag_group(lambda: STREAMING_DEFAULTS)
    max_len: int = flag(4096, parse=positive_int, help="LM stages: static KV cache length (tokens).")
    prefill_buckets: tuple[int, ...] = flag(
        (64, 128, 256, 512), parse=positive_ints, metavar="N,N", help="LM prefill prompt-length buckets."
    )
    cfg_rate: float | None = flag(
        None,
        parse=positive_float,
        metavar="X",
        help="locdit classifier-free guidance scale (default: config.json's, 2.0).",
    )
    n_timesteps: int | None = flag(
        None, parse=positive_int, help="locdit Euler steps, unrolled in the graph (default: 10)."
    )

    def validate(self) -> None:
        super().validate()
        if self.n_timesteps is not None and self.n_timesteps < MIN_TIMESTEPS:
            raise OptionsError(f"n_timesteps must be >= {MIN_TIMESTEPS} (the first Euler step is zero-init)")
