"""VoxCPM2 (`voxcpm2`): LM decode steps and prefills, the patch generator and encoder, the AudioVAE decoder."""

from ...family import Family
from .options import VoxCPM2Options

FAMILY = Family(
    name="voxcpm2",
    presets=("tiny", "full"),
    Options=VoxCPM2Options,
    stages=(
        "base_lm_prefill",
        "base_lm_step",
        "residual_lm_prefill",
        "residual_lm_step",
        "locdit",
        "local_encoder",
        "vae_decoder",
    ),
    package=__name__,
)
