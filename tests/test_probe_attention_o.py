"""bench/probes/attention_o_fused.py's probe kernel (the LocDiT attention inside its o_proj) under the interpreter:
y = residual + o_proj(sequence attention) and its RMSNorm, against the aten references, with head ranges split
1, 2 and 4 ways, both CFG sequences in one tile (block-diagonal by sequence) and padded rows. What the GPU call times
must first be the stage's function."""

from __future__ import annotations

import pytest
import torch

from ttsaot.builder.kernels.common import rms_norm
from ttsaot.builder.kernels.sequence_attention import sequence_attention_reference
from ttsaot.builder.layers.rope import rope_table

from .conftest import rel_err
from .kernel_fixtures import ON_GPU, require_kernel_runtime


@pytest.mark.skipif(ON_GPU, reason="the interpreter's smoke shape; the GPU call runs the probe itself")
@pytest.mark.parametrize("split", [1, 2, 4])
def test_attention_inside_o_proj_is_the_two_ops(split):
    require_kernel_runtime()
    from bench.probes.attention_o_fused import launch_attention_o

    g = torch.Generator().manual_seed(split)
    N, T, D, hq, hkv, hd = 3, 5, 48, 4, 2, 16  # 15 rows in a 16-row tile; 3 sequences, 2 q heads per kv head
    qkv = torch.randn(N, T, (hq + 2 * hkv) * hd, generator=g)
    w_o = torch.randn(D, hq * hd, generator=g) * 0.1
    x = torch.randn(N, T, D, generator=g)
    norm = torch.rand(D, generator=g) + 0.5
    cos, sin = rope_table(hd, T, 10000.0)
    y, yn = launch_attention_o(qkv, cos, sin, w_o, x, norm, hq, hkv, hd**-0.5, split, 16, False)
    want = x + sequence_attention_reference(qkv, cos, sin, hq, hkv, hd**-0.5) @ w_o.T
    assert rel_err(y, want) < 1e-5
    assert rel_err(yn, rms_norm(want, norm, 1e-6)) < 1e-5
