"""Fish Speech S2 Pro (`fish-s2-pro`): `fast_ar` (codebook predictor), `dac_decoder`, `dac_encoder`."""

from ...family import Family
from .options import FishS2Options

FAMILY = Family(
    name="fish-s2-pro",
    presets=("tiny", "full"),
    Options=FishS2Options,
    stages=("fast_ar", "dac_decoder", "dac_encoder"),
    package=__name__,
)
