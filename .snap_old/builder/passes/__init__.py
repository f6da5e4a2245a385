"""Module → module rewrites applied before export. Each returns a small report for the manifest."""

from .bake import bake_snake
from .cast import cast_to_compute_dtype
from .conv import depthwise_conv_as_shifts
from .fuse import fuse_projections
from .prune import count_parameters, prune_submodules
from .weight_norm import bake_weight_norm, legacy_weight_norm_to_new, weight_norm

__all__ = [
    "bake_snake",
    "bake_weight_norm",
    "cast_to_compute_dtype",
    "count_parameters",
    "depthwise_conv_as_shifts",
    "fuse_projections",
    "legacy_weight_norm_to_new",
    "prune_submodules",
    "weight_norm",
]
