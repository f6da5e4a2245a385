"""`ttsaot::qkv_attention`: a decode layer's fused qkv projection and its attention over a short static cache, in
one launch.

    qkv_attention(x [B, D], weight [(Hq + 2·Hkv)·hd, D], bias?, norm_weight? [D], norm_eps: float,
                  positions [B] int, k_cache!, v_cache! [L, B, Hkv, S, hd], layer: int, scale: float, cos?, sin?,
                  rope_interleaved: bool, q_norm? [hd], k_norm? [hd], qk_eps: float, workspace! [≥ B·Hkv] int32)
        -> o [B, Hq·hd]

= decode_attention(skinny_linear(x, weight, bias, norm_weight, norm_eps), positions, k_cache, v_cache, layer, scale,
cos, sin, rope_interleaved, q_norm, k_norm, qk_eps, workspace): the same math, rounded where those two round (the
qkv row is rounded to x's dtype before the attention reads it), so the fused and the two-op forms agree exactly
where their kernels run the same configs. The caches are written in place at each row's position; the workspace
(the step's decode_attention tickets) is returned zeroed.

Where it runs (`fits`, decided per bucket at trace time): rows ≤ skinny_linear.GEMV_MAX_M (the GEMV form) and a
cache of at most decode_attention.MIN_CHUNK positions (the whole-cache form, one program per kv head): the codebook
predictors' steps. The kernel (qkv_attention_triton.py) removes the attention's own launch and its wait for the
projection's whole grid. `TTSAOT_QKV_ATTENTION=1` at build time turns it on (a package-key switch,
package_cache.KERNEL_SWITCHES): off by default until the GPU A/B (bench/plans/stage_ab_h100.sh, variant `fused`)
has timed it in the stages.

Export and lowering as decode_attention's: one node (`mutates_args={"k_cache", "v_cache", "workspace"}`); CPU
builds and ONNX exports lower it with `decompositions.lower_for_cpu`, whose trace of the body takes the aten
reference below.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from .common import HAVE_TRITON, cdiv, next_power_of_2, no_wrap
from .decode_attention import (
    MIN_CHUNK,
    attention_workspace,
    check_heads,
    decode_attention_reference,
    head_meta,
    whole_block,
)
from .decompositions import register_reference
from .pdl import kernels_wait
from .skinny_linear import GEMV_MAX_M, norm_block, skinny_linear_reference
from .skinny_linear import _check as check_projection

OP_NAME = "ttsaot::qkv_attention"
ENV_SWITCH = "TTSAOT_QKV_ATTENTION"  # =1 at build time: the predictors' steps take the fused op
METADATA_KEY = "ttsaot_qkv_attention"  # "1" / "0" in each package's metadata: whether it was traced with the switch
MUTATED = {"k_cache", "v_cache", "workspace"}


def enabled() -> bool:
    """Whether step modules may take the fused op (ENV_SWITCH, read at trace time; off by default)."""
    return os.environ.get(ENV_SWITCH, "0") == "1"


def fits(x: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether a step with these hidden rows x [B, D] and caches [L, B, Hkv, S, hd] is one the fused kernel runs:
    the GEMV form's rows and the whole-cache form's cache. Shapes are static per bucket."""
    rows, cache_len = x.shape[0], k_cache.shape[3]
    return isinstance(rows, int) and isinstance(cache_len, int) and rows <= GEMV_MAX_M and cache_len <= MIN_CHUNK


def qkv_attention_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    norm_eps: float,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    layer: int,
    scale: float,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    rope_interleaved: bool = False,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    qk_eps: float = 1e-6,
    workspace: torch.Tensor | None = None,
) -> torch.Tensor:
    """The op in aten: the two ops' references, one after the other (the caches written in place)."""
    qkv = skinny_linear_reference(x, weight, bias, norm_weight, norm_eps)
    return decode_attention_reference(
        qkv, positions, k_cache, v_cache, layer, scale, cos, sin, rope_interleaved, q_norm, k_norm, qk_eps, workspace
    )


def _check(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    layer: int,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    rope_interleaved: bool,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    workspace: torch.Tensor | None,
) -> None:
    torch._check(x.dim() == 2, lambda: f"qkv_attention: x must be [B, D], got {tuple(x.shape)}")
    check_projection(x, weight, bias, norm_weight, False, None, op="qkv_attention")
    check_heads(
        "qkv_attention",
        (x.shape[0], weight.shape[0]),
        x.dtype,
        x.is_cuda,
        positions,
        k_cache,
        v_cache,
        layer,
        cos,
        sin,
        rope_interleaved,
        q_norm,
        k_norm,
        workspace,
    )


def launch_qkv_attention(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    norm_eps: float,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    layer: int,
    scale: float,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    rope_interleaved: bool = False,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    qk_eps: float = 1e-6,
    workspace: torch.Tensor | None = None,
    *,
    wrap: Callable[[Any], Any] = no_wrap,
    config: dict | None = None,
) -> torch.Tensor:
    """Run the Triton kernel (CUDA, or CPU under TRITON_INTERPRET=1) on a step that `fits`. `config`
    ({"BLOCK_N", "BLOCK_K", "num_warps", "num_stages"}[, "PRELOAD"]) skips the configs' choice (interpreter tests,
    bench sweeps); BLOCK_N must divide the head dim."""
    from . import decode_attention_triton as attention
    from . import qkv_attention_triton as kernels

    hkv, S, hd = k_cache.shape[2], k_cache.shape[3], k_cache.shape[4]
    n_out, k = weight.shape
    hq = n_out // hd - 2 * hkv
    m = x.shape[0]
    torch._check(fits(x, k_cache), lambda: f"qkv_attention: {m} rows / {S} positions do not fit the fused kernel")
    x2 = x.contiguous()
    qkv = x2.new_empty((m, n_out))
    o = x2.new_empty((m, hq * hd))
    ws = workspace if workspace is not None else attention_workspace(x2, k_cache)
    args = (
        x2,
        weight,
        bias if bias is not None else x2,
        norm_weight if norm_weight is not None else x2,
        qkv,
        positions,
        k_cache,
        v_cache,
        # read-only dummies: x, as skinny_linear's (decode_attention.py says why not an output or the positions)
        cos if cos is not None else x2,
        sin if sin is not None else x2,
        q_norm if q_norm is not None else x2,
        k_norm if k_norm is not None else x2,
        o,
        ws,
        layer,
        m,
        n_out,
        k,
        k,
        S,
        m * hkv * S,
        float(norm_eps),
        float(qk_eps),
        float(scale) * attention.LOG2E,
    )
    meta = dict(
        head_meta(x2, hq, hkv, hd, cos, rope_interleaved, q_norm),
        HAS_NORM=norm_weight is not None,
        HAS_BIAS=bias is not None,
        PDL=kernels_wait(x.device),
        NORM_BLOCK=norm_block(k, m, False),
        NORM_CHUNKS=0,
        BLOCK_M=next_power_of_2(m),
        BLOCK_S=whole_block(S),
    )

    def grid(meta):
        return (1, cdiv(n_out, meta["BLOCK_N"]), 1)

    if config is None:
        wrap(kernels.qkv_attention_autotuned)[grid](*args, **meta)
    else:
        torch._check(hd % config["BLOCK_N"] == 0, lambda: "qkv_attention: BLOCK_N must divide the head dim")
        wrap(kernels.qkv_attention_kernel)[grid](*args, **{**meta, "PRELOAD": False, **config})
    return o


if HAVE_TRITON:

    @torch.library.triton_op(OP_NAME, mutates_args=MUTATED)
    def _qkv_attention_op(
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        norm_weight: torch.Tensor | None,
        norm_eps: float,
        positions: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        layer: int,
        scale: float,
        cos: torch.Tensor | None = None,
        sin: torch.Tensor | None = None,
        rope_interleaved: bool = False,
        q_norm: torch.Tensor | None = None,
        k_norm: torch.Tensor | None = None,
        qk_eps: float = 1e-6,
        workspace: torch.Tensor | None = None,
    ) -> torch.Tensor:
        _check(
            x, weight, bias, norm_weight, positions, k_cache, v_cache, layer, cos, sin, rope_interleaved, q_norm,
            k_norm, workspace,
        )  # fmt: skip
        args = (x, weight, bias, norm_weight, norm_eps, positions, k_cache, v_cache, layer, scale, cos, sin)
        rest = (rope_interleaved, q_norm, k_norm, qk_eps, workspace)
        if x.device.type != "cuda" or x.dtype != k_cache.dtype:
            # CPU compiles / ONNX exports (lower_for_cpu) and the builder's fp32 parity run of a bf16 stage
            return qkv_attention_reference(*args, *rest)
        return launch_qkv_attention(*args, *rest, wrap=torch.library.wrap_triton)

else:
    # Without Triton (CPU-only installs): a CompositeImplicitAutograd op, as decode_attention's.
    def _checked_reference(
        x,
        weight,
        bias,
        norm_weight,
        norm_eps,
        positions,
        k_cache,
        v_cache,
        layer,
        scale,
        cos=None,
        sin=None,
        rope_interleaved=False,
        q_norm=None,
        k_norm=None,
        qk_eps=1e-6,
        workspace=None,
    ):
        _check(
            x, weight, bias, norm_weight, positions, k_cache, v_cache, layer, cos, sin, rope_interleaved, q_norm,
            k_norm, workspace,
        )  # fmt: skip
        return qkv_attention_reference(
            x, weight, bias, norm_weight, norm_eps, positions, k_cache, v_cache, layer, scale, cos, sin,
            rope_interleaved, q_norm, k_norm, qk_eps, workspace,
        )  # fmt: skip

    _LIB = torch.library.Library("ttsaot", "FRAGMENT")
    _LIB.define("qkv_attention" + torch.library.infer_schema(qkv_attention_reference, mutates_args=MUTATED))
    _LIB.impl("qkv_attention", _checked_reference, "CompositeImplicitAutograd")

    _qkv_attention_op = torch.ops.ttsaot.qkv_attention

register_reference(torch.ops.ttsaot.qkv_attention.default, qkv_attention_reference)


def qkv_attention(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    norm_eps: float,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    layer: int,
    scale: float,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    rope_interleaved: bool = False,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    qk_eps: float = 1e-6,
    workspace: torch.Tensor | None = None,
) -> torch.Tensor:
    """The op with every argument passed and a workspace always given (decode_attention's wrapper says why)."""
    if workspace is None:
        workspace = attention_workspace(x, k_cache)
    return _qkv_attention_op(
        x, weight, bias, norm_weight, norm_eps, positions, k_cache, v_cache, layer, scale, cos, sin, rope_interleaved,
        q_norm, k_norm, qk_eps, workspace,
    )  # fmt: skip
