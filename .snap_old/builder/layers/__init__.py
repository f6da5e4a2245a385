"""Shared building blocks. Each family module composes these; checkpoint names live in the family modules."""

from .conv import CausalConv1d, CausalConvTranspose1d, ConvNeXtBlock
from .mlp import SwiGLU
from .norms import LayerScale, RMSNorm
from .rope import apply_rope_interleaved, apply_rope_neox, rope_table
from .snake import BakedSnakeBeta, Snake1d, SnakeBeta

__all__ = [
    "BakedSnakeBeta",
    "CausalConv1d",
    "CausalConvTranspose1d",
    "ConvNeXtBlock",
    "LayerScale",
    "RMSNorm",
    "Snake1d",
    "SnakeBeta",
    "SwiGLU",
    "apply_rope_interleaved",
    "apply_rope_neox",
    "rope_table",
]
