"""Session fixtures for the Fish S2 Pro DAC stages: ONE build of both stages (3 compiles) from a tiny random
`codec.pth` written in the real layout, shared by the artifact tests and the upstream-oracle tests (import the
fixtures into a test module by assigning them: `fish_dac_tiny = fish_fixtures.fish_dac_tiny`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .conftest import built_artifact

SEED = 7
DECODER_BATCH = (2,)
DECODER_FRAMES = (8, 16)
ENCODER_SECONDS = (1.0,)  # one bucket: 45056 samples = 22 frames


def _streaming():
    from ttsaot.builder.buckets import StreamingConfig

    # first chunks of 4 frames with the whole history, then 8 new + 8 context: every window fits a bucket
    return StreamingConfig(chunk_frames=8, left_context_frames=8, first_chunk_frames=4, nonstreaming_chunk_frames=0)


def tiny_codec():
    from ttsaot.builder.families.fish_s2_pro.checkpoint import init_random_dac
    from ttsaot.builder.families.fish_s2_pro.config import DAC_PRESETS
    from ttsaot.builder.families.fish_s2_pro.dac import DAC

    return init_random_dac(DAC(DAC_PRESETS["tiny"]), seed=SEED)


def _write_ckpt(root: Path) -> Path:
    """The real layout of the codec alone: a folder holding only codec.pth (no config.json, no LLM weights)."""
    from ttsaot.builder.families.fish_s2_pro.checkpoint import write_codec_pth

    ckpt = root / "s2-pro-tiny"
    write_codec_pth(tiny_codec(), ckpt / "codec.pth")
    return ckpt


@pytest.fixture(scope="session")
def fish_dac_ckpt() -> Path:
    return built_artifact("fish-dac-ckpt", _write_ckpt)


@pytest.fixture(scope="session")
def fish_dac_tiny(fish_dac_ckpt) -> Path:
    """Both stages built from the tiny codec.pth, the way the CLI sets them up (`FAMILY.specs` without --stages: the
    folder holds only the codec, so only the DAC stages are set up; config inference from the tensors is on the
    path)."""
    import torch

    from ttsaot.builder.build import build_family
    from ttsaot.builder.families.fish_s2_pro import FAMILY as FISH

    def build(root: Path) -> Path:
        opts = FISH.options(
            preset="tiny",
            checkpoint=str(fish_dac_ckpt),
            batch_buckets=DECODER_BATCH,
            frame_buckets=DECODER_FRAMES,
            streaming=_streaming(),
            encoder_seconds=ENCODER_SECONDS,
        )
        specs = FISH.specs(opts)
        assert [s.name for s in specs] == ["dac_decoder", "dac_encoder"]
        assert specs[0].dtype == specs[1].dtype == torch.float32  # the stages' own defaults
        # through the run's package cache, as the CLI builds (tests/conftest.py): test_tf32.py's CLI build of the
        # same codec and plan reuses these packages instead of compiling three more
        return build_family(FISH.name, specs, root, "cpu", cache_dir=os.environ["TTSAOT_CACHE_DIR"]).path

    return built_artifact("fish-dac-tiny", build)
