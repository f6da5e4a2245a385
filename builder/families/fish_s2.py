"""Fish Speech S2 Pro (`fish-s2-pro`): `fast_ar` (codebook predictor), `dac_decoder`, `dac_encoder`.

This module only assembles the family: options, presets and the stage list. The stages live beside it:
`fish_dac.py` (DAC codec, STAGES.md §1.4) and `fish_fast_ar.py` (Fast AR, §1.3)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..buckets import StreamingConfig
from ..stage_spec import StageSpec

FAMILY = "fish-s2-pro"
STAGE_NAMES = ("fast_ar", "dac_decoder", "dac_encoder")
PRESETS = ("tiny", "full")
# vLLM-Omni connector defaults: first chunks of 4 frames (whole history as context) until 25, then 25 + 25 context.
STREAMING_DEFAULTS = StreamingConfig(chunk_frames=25, left_context_frames=25, first_chunk_frames=4,
                                     nonstreaming_chunk_frames=0)


@dataclass
class FishS2Options:
    preset: str = "tiny"
    checkpoint: str | None = None                 # HF dir with codec.pth (+ model safetensors for fast_ar)
    seed: int = 0
    dtype: torch.dtype | None = None              # None = stage default (DAC decoder fp32, fast_ar bf16)
    max_batch: int = 4
    batch_buckets: tuple[int, ...] | None = None
    frame_buckets: tuple[int, ...] | None = None
    pow2_frames: bool = True
    streaming: StreamingConfig = field(default_factory=lambda: STREAMING_DEFAULTS)
    encoder_seconds: tuple[float, ...] = (5.0, 10.0, 15.0, 30.0)   # dac_encoder length buckets
    fast_ar_with_embedding: bool = False          # also output the next slow-AR input embedding (talker_mtp)


def stages(opts: FishS2Options) -> list[StageSpec]:
    from . import fish_dac, fish_fast_ar

    return [fish_fast_ar.fast_ar_stage(opts), fish_dac.dac_decoder_stage(opts), fish_dac.dac_encoder_stage(opts)]


def options_from_cli(**kw) -> FishS2Options:
    o = FishS2Options()
    return replace(o, **{k: v for k, v in kw.items() if k in o.__dataclass_fields__ and v is not None})
