"""Module → module rewrites applied before export. Each returns a small report for the manifest."""

from .bake import bake_snake
from .cast import cast_to_compute_dtype
from .fuse import fuse_projections
from .prune import count_parameters, prune_submodules

__all__ = ["bake_snake", "cast_to_compute_dtype", "count_parameters", "fuse_projections", "prune_submodules"]
