"""Custom ops used by exported stages. Importing this package registers them all (and completes
`CPU_DECOMPOSITIONS`, the aten lowering table of CPU builds and the ONNX exporter)."""

from . import conv1d
from .decode_attention import decode_attention, decode_attention_reference
from .decompositions import CPU_DECOMPOSITIONS, lower_for_cpu
from .qkv_attention import qkv_attention, qkv_attention_reference
from .sample import sample_tokens
from .sequence_attention import sequence_attention, sequence_attention_reference
from .sequence_attention_o import sequence_attention_o, sequence_attention_o_reference
from .skinny_linear import (
    skinny_linear,
    skinny_linear_norm_out,
    skinny_linear_norm_out_reference,
    skinny_linear_reference,
)
from .snake_beta import snake_beta, snake_beta_nlc, snake_beta_nlc_reference, snake_beta_reference
from .window_attention import window_attention, window_attention_reference

__all__ = [
    "CPU_DECOMPOSITIONS",
    "conv1d",
    "decode_attention",
    "decode_attention_reference",
    "lower_for_cpu",
    "qkv_attention",
    "qkv_attention_reference",
    "sample_tokens",
    "sequence_attention",
    "sequence_attention_reference",
    "sequence_attention_o",
    "sequence_attention_o_reference",
    "skinny_linear",
    "skinny_linear_norm_out",
    "skinny_linear_norm_out_reference",
    "skinny_linear_reference",
    "snake_beta",
    "snake_beta_nlc",
    "snake_beta_nlc_reference",
    "snake_beta_reference",
    "window_attention",
    "window_attention_reference",
]
