"""`ttsaot::decode_attention`: one layer's attention for one decode step over the runtime-owned static KV cache.

    decode_attention(qkv [B, (Hq + 2·Hkv)·hd], positions [B] int, k_cache!, v_cache! [L, B, Hkv, S, hd],
                     layer: int, scale: float, cos? , sin?, rope_interleaved = False, q_norm? [hd], k_norm? [hd],
                     norm_eps = 1e-6) -> o [B, Hq·hd]

`qkv` is the fused projection output (rows q ∣ k ∣ v, heads contiguous, as `fuse_projections` builds it). Per row b
with p = positions[b] (clamped to [0, S-1]: slot S-1 is the runtime's scratch slot, so an idle row still stays
inside the cache):
1. q/k heads: RMSNorm per head with q_norm / k_norm (Qwen; project rounding, see common.rms_norm), then RoPE at
   position p: the rotation in fp32 with fp32 tables, cast back to the compute dtype (VoxCPM2's `_rope`, Fish's
   interleaved rope). Tables: NeoX rotate-half cos/sin [≥ S, hd] (layers.rope.rope_table), or with
   rope_interleaved GPT-J pairs [≥ S, hd/2] (rope_table_interleaved). None = no RoPE (VoxCPM2's residual LM);
2. k, v written in place at k_cache/v_cache[layer, b, :, p];
3. each query head attends over its kv head's keys at positions 0..p (GQA: query head j uses kv head j // (Hq/Hkv),
   as repeat_interleave would): scores q·k in fp32 × scale, softmax in fp32, probabilities rounded to the compute
   dtype, then · v accumulated in fp32 and rounded once.
Unlike the eager step (which rounds q·scale and the scores to bf16 before the softmax), the scores stay fp32.
qkv may be fp32 over bf16 caches (what the builder's fp32 parity run of a bf16 stage feeds a step module): k/v are
rounded to the caches' dtype as they are written, as the eager steps do; the op then runs its aten reference.

Mutation, export and lowering: the op declares `mutates_args={"k_cache", "v_cache"}`; `torch.export` keeps it as
ONE node (on CUDA, AOTInductor traces the body into the Triton kernels and re-inplaces the functionalized write,
which `python -m bench kernels` checks on the GPU). CPU builds must lower it with
`decompositions.lower_for_cpu` (a table entry cannot lower a mutating op); the body's CPU branch is the aten
reference below (an in-place index_put_ into the caches, which AOTI keeps in place).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..layers.rope import apply_rope_interleaved, apply_rope_neox
from .common import HAVE_TRITON, cdiv, multiprocessor_count, next_power_of_2, rms_norm

OP_NAME = "ttsaot::decode_attention"
MIN_SPLIT = 64  # fewest cache positions per program
MAX_PROGRAMS_PER_SM = 8  # split size doubles until B·Hkv·splits fits in this many programs per SM
COMBINE_CHUNK = 16


def _heads(qkv: torch.Tensor, k_cache: torch.Tensor) -> tuple[int, int, int]:
    hkv, hd = k_cache.shape[2], k_cache.shape[4]
    return qkv.shape[1] // hd - 2 * hkv, hkv, hd


def decode_attention_reference(
    qkv: torch.Tensor,
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
    norm_eps: float = 1e-6,
) -> torch.Tensor:
    """The op in aten (writes the caches in place, like the kernel)."""
    hq, hkv, hd = _heads(qkv, k_cache)
    B, S, dt = qkv.shape[0], k_cache.shape[3], qkv.dtype
    pos = positions.clamp(0, S - 1)
    q, k, v = qkv.view(B, hq + 2 * hkv, hd).split((hq, hkv, hkv), dim=1)
    if q_norm is not None:
        q, k = rms_norm(q, q_norm, norm_eps), rms_norm(k, k_norm, norm_eps)
    if cos is not None:
        rope = apply_rope_interleaved if rope_interleaved else apply_rope_neox
        c, s = cos[pos][:, None], sin[pos][:, None]
        q, k = rope(q.float(), c, s).to(dt), rope(k.float(), c, s).to(dt)
    dev = qkv.device
    idx = (
        torch.full((1, 1), layer, dtype=torch.long, device=dev),
        torch.arange(B, device=dev)[:, None],
        torch.arange(hkv, device=dev)[None, :],
        pos[:, None],
    )
    k_cache.index_put_(idx, k.to(k_cache.dtype))
    v_cache.index_put_(idx, v.to(v_cache.dtype))
    acc = torch.promote_types(dt, torch.float32)  # float64 only in the builder's float64 pass-parity re-check
    kc, vc = k_cache[layer].to(acc), v_cache[layer].to(acc)  # [B, Hkv, S, hd]
    qg = q.reshape(B, hkv, hq // hkv, hd).to(acc)
    scores = torch.matmul(qg, kc.transpose(-1, -2)) * scale  # [B, Hkv, G, S]
    visible = torch.arange(S, device=dev)[None, :] <= pos[:, None]
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    probs = scores.softmax(-1).to(dt).to(acc)
    return torch.matmul(probs, vc).to(dt).reshape(B, hq * hd)


def supports_head_dim(hd: int) -> bool:
    """The kernel's tl.dot tiles need a power-of-2 head dim of at least 16."""
    return hd >= 16 and hd & (hd - 1) == 0


def _check(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    layer: int,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    rope_interleaved: bool,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
) -> None:
    torch._check(
        k_cache.dim() == 5, lambda: f"decode_attention: caches must be [L, B, Hkv, S, hd], got {tuple(k_cache.shape)}"
    )
    torch._check(
        v_cache.shape == k_cache.shape and v_cache.dtype == k_cache.dtype,
        lambda: "decode_attention: k_cache and v_cache differ in shape or dtype",
    )
    torch._check(
        k_cache.is_contiguous() and v_cache.is_contiguous(), lambda: "decode_attention: caches must be contiguous"
    )
    L, B, hkv, S, hd = k_cache.shape
    torch._check(supports_head_dim(hd), lambda: f"decode_attention: head_dim {hd} is not a power of 2 ≥ 16")
    torch._check(
        qkv.dim() == 2 and qkv.shape[0] == B and qkv.shape[1] % hd == 0 and qkv.stride(1) == 1,
        lambda: (
            f"decode_attention: qkv must be [B={B}, (Hq + 2·Hkv)·{hd}] with contiguous rows, got {tuple(qkv.shape)}"
        ),
    )
    hq = qkv.shape[1] // hd - 2 * hkv
    torch._check(hq > 0 and hq % hkv == 0, lambda: f"decode_attention: {hq} query heads for {hkv} kv heads")
    torch._check(
        # float64: the aten reference only (the builder's float64 pass-parity re-check), never a Triton launch
        (k_cache.dtype in (torch.float32, torch.bfloat16) or (k_cache.dtype == torch.float64 and not qkv.is_cuda))
        and (qkv.dtype == k_cache.dtype or qkv.dtype == torch.float32),
        lambda: f"decode_attention: qkv {qkv.dtype} and caches {k_cache.dtype} must share a float dtype (or qkv fp32)",
    )
    torch._check(
        positions.shape == (B,) and positions.dtype in (torch.int64, torch.int32),
        lambda: f"decode_attention: positions must be [{B}] int64/int32",
    )
    torch._check(0 <= layer < L, lambda: f"decode_attention: layer {layer} outside the cache's {L} layers")
    torch._check((cos is None) == (sin is None), lambda: "decode_attention: give cos and sin together")
    if cos is not None:
        width = hd // 2 if rope_interleaved else hd
        for t in (cos, sin):
            torch._check(
                t.dim() == 2
                and t.shape[0] >= S
                and t.shape[1] == width
                and (t.dtype == torch.float32 or (t.dtype == torch.float64 and not qkv.is_cuda))
                and t.is_contiguous(),
                lambda t=t: (
                    f"decode_attention: rope tables must be contiguous fp32 [≥ {S}, {width}], "
                    f"got {tuple(t.shape)} {t.dtype}"
                ),
            )
    torch._check((q_norm is None) == (k_norm is None), lambda: "decode_attention: give q_norm and k_norm together")
    if q_norm is not None:
        for t in (q_norm, k_norm):
            torch._check(
                t.shape == (hd,) and t.dtype == qkv.dtype,
                lambda: f"decode_attention: q/k norm weights must be [{hd}] in {qkv.dtype}",
            )


def plan_split_size(cache_len: int, rows: int, multiprocessors: int) -> int:
    """Cache positions per program: MIN_SPLIT, doubled while B·Hkv·splits exceeds MAX_PROGRAMS_PER_SM per SM.
    Programs whose split starts past their row's position exit at once, so short contexts in a long cache cost
    little, and long ones spread over the whole GPU."""
    size = MIN_SPLIT
    while rows * cdiv(cache_len, size) > MAX_PROGRAMS_PER_SM * multiprocessors:
        size *= 2
    return size


def _identity(kernel: Any) -> Any:
    return kernel


def launch_decode_attention(
    qkv: torch.Tensor,
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
    norm_eps: float = 1e-6,
    *,
    wrap: Callable[[Any], Any] = _identity,
    split_size: int | None = None,
    block_s: int | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """Run the Triton kernels (CUDA, or CPU under TRITON_INTERPRET=1). `split_size` / `block_s` override the plan;
    `config` ({"num_warps", "num_stages"}) skips autotuning (interpreter tests, bench sweeps)."""
    from . import decode_attention_triton as kernels

    hq, hkv, hd = _heads(qkv, k_cache)
    B, S = qkv.shape[0], k_cache.shape[3]
    if split_size is None:
        split_size = plan_split_size(S, B * hkv, multiprocessor_count(qkv.device))
    num_splits = cdiv(S, split_size)
    if block_s is None:
        block_s = min(64, max(16, next_power_of_2(split_size)))
    o = qkv.new_empty((B, hq * hd))
    if num_splits > 1:
        part_o = qkv.new_empty((B * hq * num_splits * hd,), dtype=torch.float32)
        part_ml = qkv.new_empty((B * hq * num_splits * 2,), dtype=torch.float32)
    else:
        # Never touched with one split. A read-only dummy: an argument aliasing a written one (o) would confuse the
        # functionalization of the kernel's writes under AOTInductor.
        part_o = part_ml = qkv
    rope = kernels.ROPE_NONE if cos is None else kernels.ROPE_INTERLEAVED if rope_interleaved else kernels.ROPE_NEOX
    args = (
        qkv,
        positions,
        k_cache,
        v_cache,
        cos if cos is not None else qkv,
        sin if sin is not None else qkv,
        q_norm if q_norm is not None else qkv,
        k_norm if k_norm is not None else qkv,
        o,
        part_o,
        part_ml,
        layer,
        S,
        qkv.stride(0),
        B * hkv * S,
        split_size,
        num_splits,
        float(norm_eps),
        float(scale) * kernels.LOG2E,
    )
    meta = dict(
        HQ=hq,
        HKV=hkv,
        HEAD_DIM=hd,
        G_PAD=max(16, next_power_of_2(hq // hkv)),
        ROPE=rope,
        QK_NORM=q_norm is not None,
        SINGLE_SPLIT=num_splits == 1,
        BLOCK_S=block_s,
        FP32_DOT=qkv.dtype == torch.float32 or qkv.device.type != "cuda",
    )  # off-GPU = the interpreter
    grid = (B * hkv, num_splits)
    if config is None:
        wrap(kernels.decode_attention_autotuned)[grid](*args, **meta)
    else:
        wrap(kernels.decode_attention_kernel)[grid](*args, **meta, **config)
    if num_splits > 1:
        wrap(kernels.combine_splits_kernel)[(B * hq,)](
            part_o, part_ml, positions, o, S, split_size, num_splits, HQ=hq, HEAD_DIM=hd, CHUNK=COMBINE_CHUNK
        )
    return o


if HAVE_TRITON:

    @torch.library.triton_op(OP_NAME, mutates_args={"k_cache", "v_cache"})
    def decode_attention(
        qkv: torch.Tensor,
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
        norm_eps: float = 1e-6,
    ) -> torch.Tensor:
        _check(qkv, positions, k_cache, v_cache, layer, cos, sin, rope_interleaved, q_norm, k_norm)
        if qkv.device.type != "cuda" or qkv.dtype != k_cache.dtype:
            # Also what a CPU compile traces (lower_for_cpu): aten ops, the cache write an in-place index_put_.
            # fp32 qkv over 16-bit caches: the builder's fp32 parity run of a bf16 stage (never a compiled bucket).
            return decode_attention_reference(
                qkv, positions, k_cache, v_cache, layer, scale, cos, sin, rope_interleaved, q_norm, k_norm, norm_eps
            )
        return launch_decode_attention(
            qkv,
            positions,
            k_cache,
            v_cache,
            layer,
            scale,
            cos,
            sin,
            rope_interleaved,
            q_norm,
            k_norm,
            norm_eps,
            wrap=torch.library.wrap_triton,
        )

else:
    # Without Triton (CPU-only installs): a CompositeImplicitAutograd op. torch.export still keeps it as one node,
    # and `run_decompositions` inlines it into aten ops with any table (a plain mutating custom_op would survive
    # as auto_functionalized, i.e. a proxy-executor call that needs the op at serve time).
    def _checked_reference(
        qkv,
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
        norm_eps=1e-6,
    ):
        _check(qkv, positions, k_cache, v_cache, layer, cos, sin, rope_interleaved, q_norm, k_norm)
        return decode_attention_reference(
            qkv, positions, k_cache, v_cache, layer, scale, cos, sin, rope_interleaved, q_norm, k_norm, norm_eps
        )

    _LIB = torch.library.Library("ttsaot", "FRAGMENT")
    _LIB.define(
        "decode_attention" + torch.library.infer_schema(decode_attention_reference, mutates_args={"k_cache", "v_cache"})
    )
    _LIB.impl("decode_attention", _checked_reference, "CompositeImplicitAutograd")

    def decode_attention(
        qkv,
        positions,
        k_cache,
        v_cache,
        layer,
        scale,
        cos=None,
        sin=None,  # type: ignore[misc]
        rope_interleaved=False,
        q_norm=None,
        k_norm=None,
        norm_eps=1e-6,
    ):
        return torch.ops.ttsaot.decode_attention(
            qkv, positions, k_cache, v_cache, layer, scale, cos, sin, rope_interleaved, q_norm, k_norm, norm_eps
        )
