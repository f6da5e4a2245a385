"""Session fixtures for the Fish S2 Pro DAC stages: ONE build of both stages (3 compiles) from a tiny random
`codec.pth` written in the real layout, shared by the artifact tests and the upstream-oracle tests (import the
fixtures into a test module by assigning them: `fish_dac_tiny = fish_fixtures.fish_dac_tiny`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import built_artifact

SEED = 7
DECODER_BATCH = (2,)
DECODER_FRAMES = (8, 16)
ENCODER_SECONDS = (1.0,)        # one bucket: 45056 samples = 22 frames


def _streaming():
    from ttsaot.builder.buckets import StreamingConfig

    # first chunks of 4 frames with the whole history, then 8 new + 8 context: every window fits a bucket
    return StreamingConfig(chunk_frames=8, left_context_frames=8, first_chunk_frames=4,
                           nonstreaming_chunk_frames=0)


def tiny_codec():
    from ttsaot.builder.families import fish_dac as fd

    return fd.init_random(fd.DAC(fd.PRESETS["tiny"]), seed=SEED)


def _write_ckpt(root: Path) -> Path:
    from ttsaot.builder.families import fish_dac as fd

    ckpt = root / "s2-pro-tiny"
    fd.write_codec_pth(tiny_codec(), ckpt / "codec.pth")
    return ckpt


@pytest.fixture(scope="session")
def fish_dac_ckpt() -> Path:
    return built_artifact("fish-dac-ckpt", _write_ckpt)


@pytest.fixture(scope="session")
def fish_dac_tiny(fish_dac_ckpt) -> Path:
    """Both stages built from the tiny codec.pth: checkpoint loading and preset detection are on the path."""
    from dataclasses import replace

    import torch

    from ttsaot.builder.build import build_family
    from ttsaot.builder.families import fish_dac as fd
    from ttsaot.builder.families.fish_s2 import FishS2Options

    def build(root: Path) -> Path:
        opts = FishS2Options(preset="tiny", checkpoint=str(fish_dac_ckpt), dtype=torch.float32,
                             batch_buckets=DECODER_BATCH, frame_buckets=DECODER_FRAMES,
                             streaming=_streaming(), encoder_seconds=ENCODER_SECONDS)
        specs = [fd.dac_decoder_stage(opts), fd.dac_encoder_stage(replace(opts, dtype=None))]
        return build_family(fd.FAMILY, specs, root, "cpu").path

    return built_artifact("fish-dac-tiny", build)
