"""`ttsaot::decode_layer`: one pre-norm decoder layer's decode step (attention block, then SwiGLU block) as ONE op
and, on CUDA, one persistent kernel launch (decode_layer_triton.py) instead of five.

    decode_layer(x [B, D], positions [B] int, k_cache!, v_cache! [L, B, Hkv, S, hd], layer: int, workspace! [≥ 2]
                 int32 zeroed, input_norm [D], qkv_weight [(Hq + 2·Hkv)·hd, D], o_weight [D, Hq·hd],
                 post_norm [D], gate_up_weight [2·I, D], down_weight [D, I], qkv_bias?, o_bias?, gate_up_bias?,
                 down_bias?, q_norm? [hd], k_norm? [hd], cos?, sin?, rope_interleaved = False, scale = hd^-0.5,
                 norm_eps = 1e-6, qk_eps = 1e-6, residual_scale = 1.0) -> y [B, D]

is, by definition, the composition of the kernel layer's five ops (decode_modules.py):

    qkv = skinny_linear(x, qkv_weight, qkv_bias, input_norm, norm_eps)
    o   = decode_attention(qkv, positions, k_cache, v_cache, layer, scale, cos, sin, rope_interleaved,
                           q_norm, k_norm, qk_eps)                       (k/v written at each row's position)
    x1  = skinny_linear(o, o_weight, o_bias, residual=x, residual_scale=residual_scale)
    h   = skinny_linear(x1, gate_up_weight, gate_up_bias, post_norm, norm_eps, gated=True)
    y   = skinny_linear(h, down_weight, down_bias, residual=x1, residual_scale=residual_scale)

with the same rounding points (each phase calls those ops' prologue, epilogue and attention device functions), so a
stage built on it computes what the five-op layer computes, up to the order of fp32 accumulation. The kernel takes
B ≤ MAX_ROWS (products on the FMA units) and no context split (`supports` decides; the predictors' caches hold one
frame); the step modules keep the five ops elsewhere. Each program holds its slice of every weight in registers,
requested before the barrier that precedes its phase (decode_layer_triton.py).

`workspace`: a zeroed int32 buffer of ≥ 2 entries, left zeroed (the grid barrier's counters); one per step serves
every layer, and `decode_attention.attention_workspace` is one. Mutation, export and CPU lowering as for
`decode_attention` (one node under torch.export; CPU builds and ONNX exports lower it with
`decompositions.lower_for_cpu`, whose trace of this body takes the aten reference).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from .common import HAVE_TRITON, cdiv, multiprocessor_count, next_power_of_2, no_wrap
from .decode_attention import decode_attention_reference
from .pdl import kernels_wait
from .skinny_linear import GEMV_MAX_M, norm_block, skinny_linear_reference

OP_NAME = "ttsaot::decode_layer"
MAX_ROWS = GEMV_MAX_M  # the phases multiply on the FMA units, as skinny_linear's GEMV form does (≤ 2 rows)
MAX_CACHE = 256  # longest cache the one-program-per-(row, kv head) attention phase is meant for (no split)
BARRIER_SLOTS = 2  # int32 counters the kernel's grid barrier uses in the workspace
TILE = 32 * 1024  # weight elements per program per register chunk (slice_plan)
NUM_WARPS = 16
EARLY = False  # request the gate/up chunk before the first barrier (decode_layer_triton.py)
MUTATED = {"k_cache", "v_cache", "workspace"}
# TTSAOT_DECODE_LAYER=0 at build time: the step modules keep the five ops (the A/B of bench/plans/stage_ab_h100.sh,
# variant `fiveops`); part of every package key (package_cache.KERNEL_SWITCHES).
ENV_SWITCH = "TTSAOT_DECODE_LAYER"


def supports(x: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether a step of this shape takes the fused op (decided per bucket at trace time; static shapes)."""
    on = os.environ.get(ENV_SWITCH, "1") != "0"
    return on and x.dim() == 2 and x.shape[0] <= MAX_ROWS and k_cache.shape[3] <= MAX_CACHE


def decode_layer_reference(
    x: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    layer: int,
    workspace: torch.Tensor,
    input_norm: torch.Tensor,
    qkv_weight: torch.Tensor,
    o_weight: torch.Tensor,
    post_norm: torch.Tensor,
    gate_up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    qkv_bias: torch.Tensor | None = None,
    o_bias: torch.Tensor | None = None,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    rope_interleaved: bool = False,
    scale: float = 1.0,
    norm_eps: float = 1e-6,
    qk_eps: float = 1e-6,
    residual_scale: float = 1.0,
) -> torch.Tensor:
    """The op in aten: the five ops' references in order (the caches written in place; the workspace untouched)."""
    qkv = skinny_linear_reference(x, qkv_weight, qkv_bias, input_norm, norm_eps)
    o = decode_attention_reference(
        qkv, positions, k_cache, v_cache, layer, scale, cos, sin, rope_interleaved, q_norm, k_norm, qk_eps
    )
    x1 = skinny_linear_reference(o, o_weight, o_bias, residual=x, residual_scale=residual_scale)
    h = skinny_linear_reference(x1, gate_up_weight, gate_up_bias, post_norm, norm_eps, gated=True)
    return skinny_linear_reference(h, down_weight, down_bias, residual=x1, residual_scale=residual_scale)


def _check(x, positions, k_cache, v_cache, layer, workspace, input_norm, qkv_weight, o_weight, post_norm,
           gate_up_weight, down_weight, q_norm, k_norm, cos, sin, rope_interleaved) -> None:  # fmt: skip
    torch._check(x.dim() == 2, lambda: f"decode_layer: x must be [B, D], got {tuple(x.shape)}")
    torch._check(k_cache.dim() == 5, lambda: f"decode_layer: caches must be [L, B, Hkv, S, hd], got {k_cache.shape}")
    B, D = x.shape
    hkv, hd = k_cache.shape[2], k_cache.shape[4]
    nqkv = qkv_weight.shape[0]
    hq = nqkv // hd - 2 * hkv
    torch._check(
        qkv_weight.shape == (nqkv, D) and nqkv % hd == 0 and hq > 0 and hq % hkv == 0,
        lambda: f"decode_layer: qkv_weight {tuple(qkv_weight.shape)} is not [(Hq + 2·{hkv})·{hd}, {D}]",
    )
    torch._check(
        o_weight.shape == (D, hq * hd), lambda: f"decode_layer: o_weight must be [{D}, {hq * hd}], got {o_weight.shape}"
    )
    inter = gate_up_weight.shape[0] // 2
    torch._check(
        gate_up_weight.shape == (2 * inter, D) and down_weight.shape == (D, inter),
        lambda: (
            f"decode_layer: gate_up_weight {tuple(gate_up_weight.shape)} / down_weight {tuple(down_weight.shape)} "
            f"are not [2·I, {D}] / [{D}, I]"
        ),
    )
    torch._check(
        input_norm.shape == (D,) and post_norm.shape == (D,),
        lambda: f"decode_layer: the norm weights must be [{D}]",
    )
    for w in (qkv_weight, o_weight, gate_up_weight, down_weight, input_norm, post_norm):
        torch._check(
            w.dtype == x.dtype and w.is_contiguous(),
            lambda w=w: f"decode_layer: weights must be contiguous {x.dtype}, got {w.dtype}",
        )
    torch._check(
        workspace.dtype == torch.int32 and workspace.is_contiguous() and workspace.numel() >= BARRIER_SLOTS,
        lambda: f"decode_layer: workspace must be a contiguous int32 buffer of ≥ {BARRIER_SLOTS} entries",
    )
    # decode_attention's own checks cover the caches, positions, layer, tables and q/k norms
    from .decode_attention import _check as check_attention

    qkv = x.new_empty((B, nqkv))
    check_attention(qkv, positions, k_cache, v_cache, layer, cos, sin, rope_interleaved, q_norm, k_norm, None)


def slice_plan(n: int, k: int, programs: int, tile: int) -> tuple[int, int, int]:
    """(ROWS, KC, CHUNKS) of a column phase with n output rows over K = k: each program owns ROWS contiguous rows
    (the next power of 2 of n / programs, so cdiv(n, ROWS) ≤ programs slices), held as CHUNKS register chunks of
    [ROWS, KC] along K, KC a power of 2 with ROWS · KC ≤ `tile` elements where K allows (at least 16)."""
    rows = next_power_of_2(cdiv(n, programs))
    kc = min(next_power_of_2(k), max(16, tile // rows))
    return rows, kc, cdiv(k, kc)


def kernel_config(d: int, heads_dim: int, inter: int, rows: int) -> dict:
    """Launch settings by rule: a weight chunk of up to TILE elements per program (32 K: one chunk per phase at the
    Qwen predictor's sizes), 16 warps (the slices spread over 512 threads' registers), the gate/up chunk requested
    at its own barrier (EARLY off)."""
    return {"TILE": TILE, "num_warps": NUM_WARPS, "EARLY": EARLY}


def launch_decode_layer(
    x: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    layer: int,
    workspace: torch.Tensor,
    input_norm: torch.Tensor,
    qkv_weight: torch.Tensor,
    o_weight: torch.Tensor,
    post_norm: torch.Tensor,
    gate_up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    qkv_bias: torch.Tensor | None = None,
    o_bias: torch.Tensor | None = None,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    rope_interleaved: bool = False,
    scale: float = 1.0,
    norm_eps: float = 1e-6,
    qk_eps: float = 1e-6,
    residual_scale: float = 1.0,
    *,
    wrap: Callable[[Any], Any] = no_wrap,
    programs: int | None = None,
    phased: bool | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """Run the Triton kernel (CUDA, or CPU under TRITON_INTERPRET=1). `programs`: the grid (default one per SM);
    `phased`: five launches of one phase each instead of one persistent launch (the default off-GPU, where the
    interpreter cannot run a grid barrier); `config` overrides `kernel_config` (the interpreter tests' small
    tiles)."""
    from . import decode_attention_triton as attention_kernels
    from . import decode_layer_triton as kernels

    B, D = x.shape
    x = x.contiguous()  # the phases address rows as [B, D] (a frame's first positions are strided slices)
    hkv, S, hd = k_cache.shape[2], k_cache.shape[3], k_cache.shape[4]
    hq = qkv_weight.shape[0] // hd - 2 * hkv
    inter = gate_up_weight.shape[0] // 2
    qkv = x.new_empty((B, qkv_weight.shape[0]))
    attn = x.new_empty((B, hq * hd))
    x1 = x.new_empty((B, D))
    h = x.new_empty((B, inter))
    y = x.new_empty((B, D))
    if programs is None:
        programs = multiprocessor_count(x.device)
    if phased is None:
        phased = x.device.type != "cuda"
    rope = (
        attention_kernels.ROPE_NONE
        if cos is None
        else attention_kernels.ROPE_INTERLEAVED
        if rope_interleaved
        else attention_kernels.ROPE_NEOX
    )
    some = qkv  # read-only dummy for absent optional tensors (a kernel output: see decode_attention's dummies)
    args = (
        x,
        positions,
        k_cache,
        v_cache,
        workspace,
        input_norm,
        qkv_weight,
        qkv_bias if qkv_bias is not None else some,
        q_norm if q_norm is not None else some,
        k_norm if k_norm is not None else some,
        cos if cos is not None else some,
        sin if sin is not None else some,
        o_weight,
        o_bias if o_bias is not None else some,
        post_norm,
        gate_up_weight,
        gate_up_bias if gate_up_bias is not None else some,
        down_weight,
        down_bias if down_bias is not None else some,
        qkv,
        attn,
        x1,
        h,
        y,
        layer,
        B,
        S,
        B * hkv * S,
        float(norm_eps),
        float(qk_eps),
        float(scale) * attention_kernels.LOG2E,
        float(residual_scale),
    )
    cfg = dict(kernel_config(D, hq * hd, inter, B), **(config or {}))
    tile = cfg.pop("TILE")
    plans = {
        "QKV": slice_plan(qkv_weight.shape[0], D, programs, tile),
        "O": slice_plan(D, hq * hd, programs, tile),
        "GU": slice_plan(inter, D, programs, tile),
        "DN": slice_plan(D, inter, programs, tile),
    }
    meta = dict(
        D=D,
        INTER=inter,
        HQ=hq,
        HKV=hkv,
        HEAD_DIM=hd,
        D_PAD=max(16, hd),
        G_PAD=max(16, next_power_of_2(hq // hkv)),
        ROPE=rope,
        QK_NORM=q_norm is not None,
        HAS_QKV_BIAS=qkv_bias is not None,
        HAS_O_BIAS=o_bias is not None,
        HAS_GU_BIAS=gate_up_bias is not None,
        HAS_DOWN_BIAS=down_bias is not None,
        PDL=kernels_wait(x.device) and not phased,
        FP32_DOT=x.dtype == torch.float32 or x.device.type != "cuda",
        BLOCK_M=next_power_of_2(B),
        NORM_BLOCK=norm_block(D, B, False),
        BLOCK_S=16,
        num_stages=1,
    )
    for name, (rows, kc, chunks) in plans.items():
        meta.update({f"ROWS_{name}": rows, f"KC_{name}": kc, f"CH_{name}": chunks})
    meta.update(cfg)  # num_warps, EARLY (a test's or the probe's config may override them)
    for phase in range(5) if phased else (-1,):
        wrap(kernels.decode_layer_kernel)[(programs,)](*args, PHASE=phase, **meta)
    return y


def _decode_layer(
    x: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    layer: int,
    workspace: torch.Tensor,
    input_norm: torch.Tensor,
    qkv_weight: torch.Tensor,
    o_weight: torch.Tensor,
    post_norm: torch.Tensor,
    gate_up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    qkv_bias: torch.Tensor | None = None,
    o_bias: torch.Tensor | None = None,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    rope_interleaved: bool = False,
    scale: float = 1.0,
    norm_eps: float = 1e-6,
    qk_eps: float = 1e-6,
    residual_scale: float = 1.0,
) -> torch.Tensor:
    args = (x, positions, k_cache, v_cache, layer, workspace, input_norm, qkv_weight, o_weight, post_norm,
            gate_up_weight, down_weight, qkv_bias, o_bias, gate_up_bias, down_bias, q_norm, k_norm, cos, sin,
            rope_interleaved, scale, norm_eps, qk_eps, residual_scale)  # fmt: skip
    _check(*args[:12], q_norm, k_norm, cos, sin, rope_interleaved)
    if not HAVE_TRITON or x.device.type != "cuda" or x.dtype != k_cache.dtype or not supports(x, k_cache):
        # Also what a CPU compile / ONNX export traces (lower_for_cpu): the aten reference, the cache write an
        # in-place index_put_; fp32 x over 16-bit caches: the builder's fp32 parity run of a bf16 stage.
        return decode_layer_reference(*args)
    return launch_decode_layer(*args, wrap=torch.library.wrap_triton)


# One body either way: a triton_op where Triton is installed (one export node whose CUDA lowering is the kernel);
# without it a CompositeImplicitAutograd op (still one export node, inlined into aten by `run_decompositions`: a
# plain mutating custom_op would survive as auto_functionalized, a proxy-executor call at serve time).
if HAVE_TRITON:
    _decode_layer_op = torch.library.triton_op(OP_NAME, _decode_layer, mutates_args=MUTATED)
else:
    _LIB = torch.library.Library("ttsaot", "FRAGMENT")
    _LIB.define("decode_layer" + torch.library.infer_schema(_decode_layer, mutates_args=MUTATED))
    _LIB.impl("decode_layer", _decode_layer, "CompositeImplicitAutograd")
    _decode_layer_op = torch.ops.ttsaot.decode_layer

# Callers pass every argument positionally, in the schema's order (torch 2.11's version bump of a mutating custom op
# indexes the positional arguments by the schema's mutated positions: decode_attention.decode_attention).
decode_layer = _decode_layer_op
