"""`ttsaot::decode_layer`: one pre-norm decoder layer's decode step (one token per row) as ONE op and, on CUDA,
one persistent Triton launch (decode_layer_triton.py) instead of six kernels.

    decode_layer(x [B, D], positions [B] int, k_cache!, v_cache! [L, B, Hkv, S, hd], counters! [16] int32,
                 layer: int, cos?, sin?, ln1 [D], w_qkv [(Hq + 2·Hkv)·hd, D], q_norm? [hd], k_norm? [hd],
                 w_o [D, Hq·hd], ln2 [D], w_gate_up [2·I, D], w_down [D, I], norm_eps, qk_eps,
                 residual_scale = 1.0, rope_interleaved = False) -> y [B, D]

It is, by definition, exactly the composition the kernel layer already runs for a layer
(decode_modules.KernelAttention.decode_step then KernelSwiGLU.decode_step):

    qkv = skinny_linear(x, w_qkv, norm_weight=ln1)
    o   = decode_attention(qkv, positions, k_cache, v_cache, layer, hd^-0.5, cos, sin, rope_interleaved, q_norm,
                           k_norm, qk_eps)
    h   = skinny_linear(o, w_o, residual=x, residual_scale)
    a   = skinny_linear(h, w_gate_up, norm_weight=ln2, gated=True)
    y   = skinny_linear(a, w_down, residual=h, residual_scale)

with the same rounding points (skinny_linear.py, decode_attention.py), so the aten reference below is that
composition of the two ops' references, and the kernel differs from it only in fp32 summation order. No biases
(every family's decoder projections are bias-free; a layer with biases keeps the per-op path).

`counters`: a ZEROED int32 buffer of ≥ 16 entries, returned zeroed (the kernel's work tickets and phase counts;
decode_layer_triton.py). A step allocates one (`new_counters`) and passes it to every layer. The reference path
does not touch it.

Mutation, export and lowering as decode_attention: mutates_args = (k_cache, v_cache, counters); ONE node under
torch.export; CPU builds and ONNX exports lower it with decompositions.lower_for_cpu (the body's aten branch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .common import HAVE_TRITON, multiprocessor_count, next_power_of_2
from .decode_attention import BLOCK_S, MIN_CHUNK, decode_attention_reference, plan_num_splits
from .skinny_linear import skinny_linear_reference

OP_NAME = "ttsaot::decode_layer"
N_COUNTERS = 16
MAX_ROWS = 16  # rows (batch) the kernel takes; the caller keeps the per-op path above
GEMV_MAX_M = 2  # FMA form up to this many rows, tensor cores above (as skinny_linear)
PROGRAMS_PER_SM = 4  # persistent programs per SM when a config does not say (the autotuned configs do)
MUTATED = {"k_cache", "v_cache", "counters"}


def new_counters(like: torch.Tensor) -> torch.Tensor:
    """The zeroed counter buffer a step passes to every decode_layer call."""
    return torch.zeros(N_COUNTERS, dtype=torch.int32, device=like.device)


def decode_layer_reference(
    x: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    counters: torch.Tensor,
    layer: int,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    ln1: torch.Tensor,
    w_qkv: torch.Tensor,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    w_o: torch.Tensor,
    ln2: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    norm_eps: float = 1e-6,
    qk_eps: float = 1e-6,
    residual_scale: float = 1.0,
    rope_interleaved: bool = False,
) -> torch.Tensor:
    """The op in aten: the per-op references in the per-op order (writes the caches in place; counters untouched)."""
    hd = k_cache.shape[4]
    qkv = skinny_linear_reference(x, w_qkv, None, ln1, norm_eps)
    o = decode_attention_reference(
        qkv, positions, k_cache, v_cache, layer, hd**-0.5, cos, sin, rope_interleaved, q_norm, k_norm, qk_eps
    )
    h = skinny_linear_reference(o, w_o, residual=x, residual_scale=residual_scale)
    a = skinny_linear_reference(h, w_gate_up, None, ln2, norm_eps, gated=True)
    return skinny_linear_reference(a, w_down, residual=h, residual_scale=residual_scale)


def _check(
    x: torch.Tensor,
    k_cache: torch.Tensor,
    counters: torch.Tensor,
    w_qkv: torch.Tensor,
    w_o: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
) -> None:
    torch._check(x.dim() == 2, lambda: f"decode_layer: x must be [B, D], got {tuple(x.shape)}")
    B, D = x.shape
    torch._check(
        k_cache.dim() == 5 and k_cache.shape[1] == B, lambda: "decode_layer: caches must be [L, B, Hkv, S, hd]"
    )
    hkv, hd = k_cache.shape[2], k_cache.shape[4]
    torch._check(
        w_qkv.dim() == 2 and w_qkv.shape[1] == D and w_qkv.shape[0] % hd == 0 and w_qkv.shape[0] // hd > 2 * hkv,
        lambda: f"decode_layer: w_qkv must be [(Hq + 2·{hkv})·{hd}, {D}], got {tuple(w_qkv.shape)}",
    )
    hq = w_qkv.shape[0] // hd - 2 * hkv
    torch._check(
        tuple(w_o.shape) == (D, hq * hd), lambda: f"decode_layer: w_o must be [{D}, {hq * hd}], got {tuple(w_o.shape)}"
    )
    torch._check(
        w_gate_up.dim() == 2 and w_gate_up.shape[1] == D and w_gate_up.shape[0] % 2 == 0,
        lambda: f"decode_layer: w_gate_up must be [2·I, {D}], got {tuple(w_gate_up.shape)}",
    )
    inter = w_gate_up.shape[0] // 2
    torch._check(
        tuple(w_down.shape) == (D, inter),
        lambda: f"decode_layer: w_down must be [{D}, {inter}], got {tuple(w_down.shape)}",
    )
    torch._check(
        all(w.dtype == x.dtype and w.is_contiguous() for w in (w_qkv, w_o, w_gate_up, w_down)),
        lambda: "decode_layer: weights must be contiguous and in x's dtype",
    )
    torch._check(
        counters.dtype == torch.int32 and counters.is_contiguous() and counters.numel() >= N_COUNTERS,
        lambda: f"decode_layer: counters must be a contiguous int32 buffer of ≥ {N_COUNTERS} entries",
    )


def kernel_eligible(x: torch.Tensor, k_cache: torch.Tensor, w_qkv: torch.Tensor) -> bool:
    """Whether the persistent kernel takes this call on CUDA (decided at trace time from static shapes): bf16,
    ≤ MAX_ROWS rows, caches in x's dtype, power-of-2 head_dim ≥ 16 and query heads per kv head ≤ 16."""
    hkv, hd = k_cache.shape[2], k_cache.shape[4]
    hq = w_qkv.shape[0] // hd - 2 * hkv
    rows = x.shape[0]
    return (
        x.dtype == torch.bfloat16
        and k_cache.dtype == x.dtype
        and isinstance(rows, int)
        and rows <= MAX_ROWS
        and hd >= 16
        and hd & (hd - 1) == 0
        and hq % hkv == 0
        and hq // hkv <= 16
    )


def _identity(kernel: Any) -> Any:
    return kernel


def launch_decode_layer(
    x: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    counters: torch.Tensor,
    layer: int,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    ln1: torch.Tensor,
    w_qkv: torch.Tensor,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    w_o: torch.Tensor,
    ln2: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    norm_eps: float = 1e-6,
    qk_eps: float = 1e-6,
    residual_scale: float = 1.0,
    rope_interleaved: bool = False,
    *,
    wrap: Callable[[Any], Any] = _identity,
    config: dict | None = None,
    programs: int | None = None,
    num_splits: int | None = None,
    min_chunk: int | None = None,
    block_s: int | None = None,
) -> torch.Tensor:
    """Run the persistent kernel (CUDA, or CPU under TRITON_INTERPRET=1). `config` ({"BLOCK_N", "BLOCK_K",
    "num_warps", "num_stages", optional "PROGRAMS_PER_SM"}) skips autotuning; `programs`, `num_splits` /
    `min_chunk` / `block_s` override the grid and decode_attention's context-split plan (tests force few programs
    and many splits)."""
    from . import decode_attention_triton as attn_kernels
    from . import decode_layer_triton as kernels

    B, D = x.shape
    L, _, hkv, S, hd = k_cache.shape
    hq = w_qkv.shape[0] // hd - 2 * hkv
    inter = w_gate_up.shape[0] // 2
    if num_splits is None:
        num_splits = plan_num_splits(B * hkv, S, multiprocessor_count(x.device))
    block_s = block_s or BLOCK_S
    min_chunk = max(min_chunk or MIN_CHUNK, block_s)
    x = x.contiguous()
    qkv = x.new_empty((B, w_qkv.shape[0]))
    o = x.new_empty((B, hq * hd))
    h = x.new_empty((B, D))
    act = x.new_empty((B, inter))
    y = x.new_empty((B, D))
    part_o = x.new_empty((B * hq * num_splits * hd,), dtype=torch.float32)
    part_ml = x.new_empty((B * hq * num_splits * 2,), dtype=torch.float32)
    rope = (
        attn_kernels.ROPE_NONE
        if cos is None
        else attn_kernels.ROPE_INTERLEAVED
        if rope_interleaved
        else attn_kernels.ROPE_NEOX
    )
    use_dot = B > GEMV_MAX_M
    args = (
        x,
        positions,
        k_cache,
        v_cache,
        cos if cos is not None else x,
        sin if sin is not None else x,
        ln1,
        w_qkv,
        q_norm if q_norm is not None else ln1,
        k_norm if k_norm is not None else ln1,
        w_o,
        ln2,
        w_gate_up,
        w_down,
        qkv,
        part_o,
        part_ml,
        o,
        h,
        act,
        y,
        counters,
        layer,
        S,
        B * hkv * S,
        B,
        float(norm_eps),
        float(qk_eps),
        float(hd**-0.5) * attn_kernels.LOG2E,
        float(residual_scale),
    )
    meta = dict(
        D=D,
        INTER=inter,
        HQ=hq,
        HKV=hkv,
        HEAD_DIM=hd,
        G_PAD=max(16, next_power_of_2(hq // hkv)),
        ROPE=rope,
        QK_NORM=q_norm is not None,
        NUM_SPLITS=num_splits,
        MIN_CHUNK=min_chunk,
        BLOCK_S=block_s,
        USE_DOT=use_dot,
        FP32_DOT=x.dtype == torch.float32 or x.device.type != "cuda",  # off-GPU = the interpreter
        BLOCK_M=16 if use_dot else next_power_of_2(B),
    )
    sms = multiprocessor_count(x.device)

    def grid(meta: dict) -> tuple[int]:
        return (programs or meta["PROGRAMS_PER_SM"] * sms,)

    if config is None:
        wrap(kernels.decode_layer_autotuned)[grid](*args, **meta)
    else:
        config = {"PROGRAMS_PER_SM": PROGRAMS_PER_SM, **config}
        wrap(kernels.decode_layer_kernel)[grid](*args, **meta, **config)
    return y


if HAVE_TRITON:

    @torch.library.triton_op(OP_NAME, mutates_args=MUTATED)
    def decode_layer(
        x: torch.Tensor,
        positions: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        counters: torch.Tensor,
        layer: int,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        ln1: torch.Tensor,
        w_qkv: torch.Tensor,
        q_norm: torch.Tensor | None,
        k_norm: torch.Tensor | None,
        w_o: torch.Tensor,
        ln2: torch.Tensor,
        w_gate_up: torch.Tensor,
        w_down: torch.Tensor,
        norm_eps: float = 1e-6,
        qk_eps: float = 1e-6,
        residual_scale: float = 1.0,
        rope_interleaved: bool = False,
    ) -> torch.Tensor:
        _check(x, k_cache, counters, w_qkv, w_o, w_gate_up, w_down)
        args = (x, positions, k_cache, v_cache, counters, layer, cos, sin, ln1, w_qkv, q_norm, k_norm, w_o, ln2)
        rest = (w_gate_up, w_down, norm_eps, qk_eps, residual_scale, rope_interleaved)
        if x.device.type != "cuda" or not kernel_eligible(x, k_cache, w_qkv):
            return decode_layer_reference(*args, *rest)
        return launch_decode_layer(*args, *rest, wrap=torch.library.wrap_triton)

else:
    # Without Triton (CPU-only installs): a CompositeImplicitAutograd op, as decode_attention's (one node under
    # torch.export, inlined into aten ops by run_decompositions).
    def _checked_reference(*args: Any) -> torch.Tensor:
        x, _, k_cache, _, counters, _, _, _, _, w_qkv, _, _, w_o, _, w_gate_up, w_down = args[:16]
        _check(x, k_cache, counters, w_qkv, w_o, w_gate_up, w_down)
        return decode_layer_reference(*args)

    _LIB = torch.library.Library("ttsaot", "FRAGMENT")
    _LIB.define("decode_layer" + torch.library.infer_schema(decode_layer_reference, mutates_args=MUTATED))
    _LIB.impl("decode_layer", _checked_reference, "CompositeImplicitAutograd")

    def decode_layer(*args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.ops.ttsaot.decode_layer(*args, **kwargs)
