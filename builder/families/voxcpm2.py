"""VoxCPM2 (`voxcpm2`): LM decode steps and prefills (`voxcpm2_lm.py`, STAGES.md §3, issue "decode steps") and
patch generation + audio (`voxcpm2_audio.py`: locdit, local_encoder, vae_decoder). This module assembles them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..buckets import StreamingConfig
from ..stage_spec import StageSpec

FAMILY = "voxcpm2"
PRESETS = ("tiny", "full")
# The VAE is decoded every 3 LM steps = 12 new latent frames; left context must cover its ~20-frame receptive field.
STREAMING_DEFAULTS = StreamingConfig(chunk_frames=12, left_context_frames=24, first_chunk_frames=0,
                                     nonstreaming_chunk_frames=0)


@dataclass
class VoxCPM2Options:
    preset: str = "tiny"
    checkpoint: str | None = None          # dir with config.json, model.safetensors, audiovae.safetensors|.pth
    seed: int = 0
    dtype: torch.dtype | None = None       # None = stage default (LM/DiT/encoder bf16, VAE fp32)
    max_batch: int = 4
    batch_buckets: tuple[int, ...] | None = None
    frame_buckets: tuple[int, ...] | None = None
    pow2_frames: bool = True
    streaming: StreamingConfig = field(default_factory=lambda: STREAMING_DEFAULTS)
    max_len: int = 4096                    # static KV cache length
    prefill_buckets: tuple[int, ...] = (64, 128, 256, 512)
    cfg_rate: float | None = None          # None = checkpoint config (inference_cfg_rate)
    n_timesteps: int | None = None         # None = checkpoint config


def _parts():
    from . import voxcpm2_audio, voxcpm2_lm

    return voxcpm2_lm, voxcpm2_audio


def stages(opts: VoxCPM2Options) -> list[StageSpec]:
    lm, audio = _parts()
    return lm.lm_stages(opts) + audio.audio_stages(opts)


def __getattr__(name: str):
    if name == "STAGE_NAMES":
        lm, audio = _parts()
        return tuple(lm.STAGE_NAMES) + tuple(audio.STAGE_NAMES)
    raise AttributeError(name)


def options_from_cli(**kw) -> VoxCPM2Options:
    o = VoxCPM2Options()
    return replace(o, **{k: v for k, v in kw.items() if k in o.__dataclass_fields__ and v is not None})
