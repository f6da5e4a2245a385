"""`ttsaot::decode_attention`: one layer's attention for one decode step over the runtime-owned static KV cache.

    decode_attention(qkv [B, (Hq + 2·Hkv)·hd], positions [B] int, k_cache!, v_cache! [L, B, Hkv, S, hd],
                     layer: int, scale: float, cos? , sin?, rope_interleaved = False, q_norm? [hd], k_norm? [hd],
                     norm_eps = 1e-6, workspace!? [≥ B·Hkv] int32, cache_settled = False) -> o [B, Hq·hd]

`qkv` is the fused projection output (rows q ∣ k ∣ v, heads contiguous, as `fuse_projections` builds it; rows may be
strided, e.g. one position of a [B, T, ·] tensor). Per row b with p = positions[b] (clamped to [0, S-1]: slot S-1
is the runtime's scratch slot, so an idle row still stays inside the cache):
1. q/k heads: RMSNorm per head with q_norm / k_norm (Qwen; project rounding, see common.rms_norm), then RoPE at
   position p: the rotation in fp32 with the tables' values (fp32, or bf16/fp16 widened exactly: a predictor
   passes its compute-dtype buffers as they are, which the graph then need not convert per layer), cast back to
   the compute dtype (VoxCPM2's `_rope`, Fish's interleaved rope). Tables: NeoX rotate-half cos/sin [≥ S, hd]
   (layers.rope.rope_table), or with rope_interleaved GPT-J pairs [≥ S, hd/2] (rope_table_interleaved). None = no
   RoPE (VoxCPM2's residual LM);
2. k, v written in place at k_cache/v_cache[layer, b, :, p];
3. each query head attends over its kv head's keys at positions 0..p (GQA: query head j uses kv head j // (Hq/Hkv),
   as repeat_interleave would): scores q·k in fp32 × scale, softmax in fp32, probabilities rounded to the compute
   dtype, then · v accumulated in fp32 and rounded once.
Unlike the eager step (which rounds q·scale and the scores to bf16 before the softmax), the scores stay fp32.
qkv may be fp32 over bf16 caches (what the builder's fp32 parity run of a bf16 stage feeds a step module): k/v are
rounded to the caches' dtype as they are written, as the eager steps do; the op then runs its aten reference.
head_dim: any power of 2 (the kernel pads lanes to 16 for tl.dot); `supports_head_dim` is the stricter gate the
step modules route by.

`workspace` (optional): a ZEROED int32 buffer of ≥ B·Hkv entries, returned zeroed. The kernel's context splits
meet there (the last split of a (row, kv head) merges the partials: one launch, no combine kernel); a step module
can allocate one per step and pass it to every layer. Without it the op zeroes a buffer of its own per call.

`cache_settled`: the caller's promise that every cache slot before each row's position was written before the call's
stage began (a stage of one decode step per call: the VoxCPM2 LM steps), never by an earlier kernel of the same
stage call (the predictors' frame loops write and zero theirs in the graph). Then the split form loads each split's
first cache block before its PDL wait, while the kernel before it (the qkv projection) drains: under the
programmatic launch an earlier kernel of the chain may still be running, so without the promise every cache read
waits. Numerics are the same either way.

Mutation, export and lowering: the op declares `mutates_args={"k_cache", "v_cache", "workspace"}`; `torch.export`
keeps it as ONE node (on CUDA, AOTInductor traces the body into the Triton kernel and re-inplaces the
functionalized writes, which `python -m bench kernels` checks on the GPU). CPU builds and ONNX exports must lower
it with `decompositions.lower_for_cpu` (a table entry cannot lower a mutating op); the body's CPU branch is the
aten reference below (an in-place index_put_ into the caches, which AOTI keeps in place; the workspace, unchanged
by the kernel, is not touched).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from ..layers.rope import apply_rope_interleaved, apply_rope_neox
from .common import HAVE_TRITON, cdiv, multiprocessor_count, next_power_of_2, no_wrap, rms_norm
from .decompositions import register_reference
from .pdl import kernels_wait

OP_NAME = "ttsaot::decode_attention"
# Split plan (per bucket, from B·Hkv and the GPU's SM count; the split SIZE follows each row's position at run time).
# Phase 1 (bench/results/nvidia-h100/probes/kernels_phase1/, fixed 64-position splits + a combine launch): ctx 512 took
# 6.2-6.5 us at B=1 (bytes: 0.2 us) and 13.5 us at B=16, i.e. launch/latency-bound; the combine is now done by the
# last split in the same launch, and a short context runs as one program.
# NUM_SPLITS ≈ this many programs per SM over the B·Hkv (row, kv head) pairs. 2, not 1: H100, VoxCPM2 base-LM heads
# (bench/results/nvidia-h100/probes/swap_ab_step/attention_splits.txt), B = 16 took 10.34 µs at 8 splits against
# 10.96 at 4 (ctx 512) and 20.10 against 23.54 (ctx 2048); B = 1 and 4 were best at 16 splits, which both give.
SPLIT_PROGRAMS_PER_SM = 2
MAX_SPLITS = 16  # the last split merges ≤ this many partials
MIN_CHUNK = 64  # fewest positions per split: shorter contexts run in one program
BLOCK_S = 64  # cache positions per loop step (a whole number of them per split)
ROPE_TABLE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # float64: the CPU reference only
# TTSAOT_WHOLE_ATTENTION_WARPS=1|2|4|8 at build time: the whole-cache form (the predictors' caches) launches at that
# many warps instead of WHOLE_WARPS_BY_ROPE's. A package-key switch (package_cache), for A/Bs.
# The whole-cache form's warps by the step's RoPE form: a rule, not the autotuner, whose timing of a ~3 µs kernel
# alone picked 1, 2 and 4 warps for the code predictor's 80 identical launches in one H200 build (in-chain own
# 5.3, 7.0 and 6.1 µs a launch). H200, b1, the stages' calls (bench/results/nvidia-h200/probes/attention_chain/):
# NeoX RoPE + q/k norm (Qwen code predictor) at 1 warp: 1,769.3 and 1,766.3 µs in two builds against 1,881.5
# autotuned (alone 2.76 µs at 1 warp, 3.50 at 4, 3.07 at 8). Interleaved RoPE (Fish fast_ar) at 8: the graph
# replays of two verified builds alternating in one process (bench/results/nvidia-h200/probes/whole_warps_fast_ar/),
# every launch at 8 warps 2,633.1 µs against every launch at 4 2,651.3, 7 rounds of 7 each lower at 8 (the calls,
# timed in separate processes with the host's ±100 µs, had ranked 4 first in one session and 8 in the next).
WHOLE_WARPS_BY_ROPE = (1, 1, 8)  # by the kernels' ROPE constant: none, NeoX, interleaved
WHOLE_WARPS_ENV = "TTSAOT_WHOLE_ATTENTION_WARPS"
# TTSAOT_ATTENTION_EARLY_BLOCK=0 at build time: no split loads its first cache block before the PDL wait, even where
# the caller says the cache is settled (`cache_settled`). A package-key switch (package_cache), for A/Bs. H100, b1
# graph replays (bench/results/nvidia-h100/probes/attention_early_block/): base_lm_step 1,155.3 µs with the early
# block against 1,174.5 without, residual_lm_step 335.2 against 339.5.
EARLY_BLOCK_ENV = "TTSAOT_ATTENTION_EARLY_BLOCK"


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
    workspace: torch.Tensor | None = None,
    cache_settled: bool = False,
) -> torch.Tensor:
    """The op in aten (writes the caches in place, like the kernel; the workspace is left as it is, as the kernel
    leaves it; `cache_settled` only moves the kernel's loads)."""
    hq, hkv, hd = _heads(qkv, k_cache)
    B, S, dt = qkv.shape[0], k_cache.shape[3], qkv.dtype
    pos = positions.clamp(0, S - 1)
    q, k, v = qkv.reshape(B, hq + 2 * hkv, hd).split((hq, hkv, hkv), dim=1)
    if q_norm is not None:
        q, k = rms_norm(q, q_norm, norm_eps), rms_norm(k, k_norm, norm_eps)
    if cos is not None:
        rope = apply_rope_interleaved if rope_interleaved else apply_rope_neox
        wide = torch.promote_types(cos.dtype, torch.float32)  # the rotation runs in fp32 whatever the tables' dtype
        c, s = cos[pos][:, None].to(wide), sin[pos][:, None].to(wide)
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
    """Head dims the step modules hand to the kernel: powers of 2 of at least 16, the sizes verified on the GPU. The
    op itself takes any power of 2 (`_check`; lanes padded to 16, interpreter-tested): widening this gate moves the
    tiny presets' predictors onto the kernels."""
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
    workspace: torch.Tensor | None,
) -> None:
    torch._check(
        qkv.dim() == 2 and qkv.stride(1) == 1,
        lambda: f"decode_attention: qkv must be [B, (Hq + 2·Hkv)·hd] with contiguous rows, got {tuple(qkv.shape)}",
    )
    check_heads(
        "decode_attention",
        (qkv.shape[0], qkv.shape[1]),
        qkv.dtype,
        qkv.is_cuda,
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


def check_heads(
    op: str,
    qkv_shape: tuple[int, int],
    dtype: torch.dtype,
    on_cuda: bool,
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
    """The attention half of an op's checks, from the fused qkv rows' shape [B, width] and dtype (they may exist
    only inside a kernel: qkv_attention's); errors named after `op`."""
    torch._check(k_cache.dim() == 5, lambda: f"{op}: caches must be [L, B, Hkv, S, hd], got {tuple(k_cache.shape)}")
    torch._check(
        v_cache.shape == k_cache.shape and v_cache.dtype == k_cache.dtype,
        lambda: f"{op}: k_cache and v_cache differ in shape or dtype",
    )
    torch._check(k_cache.is_contiguous() and v_cache.is_contiguous(), lambda: f"{op}: caches must be contiguous")
    L, B, hkv, S, hd = k_cache.shape
    torch._check(hd >= 2 and hd & (hd - 1) == 0, lambda: f"{op}: head_dim {hd} is not a power of 2")
    rows, width = qkv_shape
    torch._check(
        rows == B and width % hd == 0,
        lambda: f"{op}: qkv rows must be [B={B}, (Hq + 2·Hkv)·{hd}], got {tuple(qkv_shape)}",
    )
    hq = width // hd - 2 * hkv
    torch._check(hq > 0 and hq % hkv == 0, lambda: f"{op}: {hq} query heads for {hkv} kv heads")
    torch._check(
        # float64: the aten reference only (the builder's float64 pass-parity re-check), never a Triton launch
        (k_cache.dtype in (torch.float32, torch.bfloat16) or (k_cache.dtype == torch.float64 and not on_cuda))
        and (dtype == k_cache.dtype or dtype == torch.float32),
        lambda: f"{op}: qkv {dtype} and caches {k_cache.dtype} must share a float dtype (or qkv fp32)",
    )
    torch._check(
        positions.shape == (B,) and positions.dtype in (torch.int64, torch.int32),
        lambda: f"{op}: positions must be [{B}] int64/int32",
    )
    torch._check(0 <= layer < L, lambda: f"{op}: layer {layer} outside the cache's {L} layers")
    torch._check((cos is None) == (sin is None), lambda: f"{op}: give cos and sin together")
    if cos is not None:
        width = hd // 2 if rope_interleaved else hd
        for t in (cos, sin):
            torch._check(
                t.dim() == 2
                and t.shape[0] >= S
                and t.shape[1] == width
                and (t.dtype in ROPE_TABLE_DTYPES or (t.dtype == torch.float64 and not on_cuda))
                and t.is_contiguous(),
                lambda t=t: (
                    f"{op}: rope tables must be contiguous fp32/bf16/fp16 [≥ {S}, {width}], "
                    f"got {tuple(t.shape)} {t.dtype}"
                ),
            )
    torch._check((q_norm is None) == (k_norm is None), lambda: f"{op}: give q_norm and k_norm together")
    if q_norm is not None:
        for t in (q_norm, k_norm):
            torch._check(
                t.shape == (hd,) and t.dtype == dtype,
                lambda: f"{op}: q/k norm weights must be [{hd}] in {dtype}",
            )
    if workspace is not None:
        torch._check(
            workspace.dtype == torch.int32 and workspace.is_contiguous() and workspace.numel() >= B * hkv,
            lambda: (
                f"{op}: workspace must be a contiguous int32 buffer of ≥ {B * hkv} entries, "
                f"got {tuple(workspace.shape)} {workspace.dtype}"
            ),
        )


def plan_num_splits(rows: int, cache_len: int, multiprocessors: int) -> int:
    """Programs per (row, kv head): enough that the B·Hkv pairs fill about SPLIT_PROGRAMS_PER_SM programs per SM,
    at most MAX_SPLITS, and no more than the cache holds MIN_CHUNK blocks. Which of them work, and on how many
    positions each, follows the row's position at run time (decode_attention_triton.py)."""
    splits = max(1, SPLIT_PROGRAMS_PER_SM * multiprocessors // max(rows, 1))
    return max(1, min(splits, MAX_SPLITS, cdiv(cache_len, MIN_CHUNK)))


def whole_warps(rope: int) -> int:
    """The whole-cache form's warps for a step with this RoPE form (the kernels' ROPE constant, `head_meta`'s):
    WHOLE_WARPS_ENV's (read at trace time) where set, else WHOLE_WARPS_BY_ROPE's."""
    value = os.environ.get(WHOLE_WARPS_ENV, "").strip()
    if not value:
        return WHOLE_WARPS_BY_ROPE[rope]
    if value not in ("1", "2", "4", "8"):
        raise ValueError(f"{WHOLE_WARPS_ENV}={value!r}: expected 1, 2, 4 or 8 (warps of the whole-cache attention)")
    return int(value)


def early_block(cache_settled: bool) -> bool:
    """Whether the split form loads its first cache block before the PDL wait: where the caller says the cache is
    settled, unless EARLY_BLOCK_ENV (read at trace time) is 0."""
    return cache_settled and os.environ.get(EARLY_BLOCK_ENV, "").strip() != "0"


def whole_block(cache_len: int) -> int:
    """The whole-cache form's tile: the cache's positions rounded up to a power of 2, at least 16 (tl.dot's)."""
    return max(16, next_power_of_2(cache_len))


def head_meta(
    qkv: torch.Tensor,
    hq: int,
    hkv: int,
    hd: int,
    cos: torch.Tensor | None,
    rope_interleaved: bool,
    q_norm: torch.Tensor | None,
) -> dict[str, Any]:
    """The attention kernels' head constants (decode_attention_kernel's, qkv_attention_kernel's) for a step whose
    fused qkv rows have qkv's dtype and device: lanes padded to 16 for tl.dot (D_PAD, G_PAD), the RoPE form, exact
    fp32 dots for fp32 rows and off the GPU (the interpreter)."""
    from . import decode_attention_triton as kernels

    rope = kernels.ROPE_NONE if cos is None else kernels.ROPE_INTERLEAVED if rope_interleaved else kernels.ROPE_NEOX
    return dict(
        HQ=hq,
        HKV=hkv,
        HEAD_DIM=hd,
        D_PAD=max(16, hd),
        G_PAD=max(16, next_power_of_2(hq // hkv)),
        ROPE=rope,
        QK_NORM=q_norm is not None,
        FP32_DOT=qkv.dtype == torch.float32 or qkv.device.type != "cuda",
    )


def attention_workspace(rows: torch.Tensor, k_cache: torch.Tensor) -> torch.Tensor:
    """A zeroed workspace for a step's decode_attention calls: one int32 ticket per (row, kv head); every call
    leaves it zeroed, so one per step serves all its layers. `rows`: any [B, ...] tensor of the step."""
    return torch.zeros(rows.shape[0] * k_cache.shape[2], dtype=torch.int32, device=rows.device)


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
    workspace: torch.Tensor | None = None,
    cache_settled: bool = False,
    *,
    wrap: Callable[[Any], Any] = no_wrap,
    num_splits: int | None = None,
    min_chunk: int | None = None,
    block_s: int | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """Run the Triton kernel (CUDA, or CPU under TRITON_INTERPRET=1). `num_splits` / `min_chunk` / `block_s`
    override the plan; `config` ({"num_warps", "num_stages"}) overrides the forms' rules (interpreter tests, bench
    sweeps)."""
    from . import decode_attention_triton as kernels

    hq, hkv, hd = _heads(qkv, k_cache)
    B, S = qkv.shape[0], k_cache.shape[3]
    if num_splits is None:
        num_splits = plan_num_splits(B * hkv, S, multiprocessor_count(qkv.device))
    block_s = block_s or BLOCK_S
    min_chunk = max(min_chunk or MIN_CHUNK, block_s)
    # One split over a cache of at most block_s positions: the whole-cache form, its tile the cache rounded up.
    whole = num_splits == 1 and S <= block_s
    if whole:
        block_s = whole_block(S)
    d_pad = max(16, hd)
    o = qkv.new_empty((B, hq * hd))
    if num_splits > 1:
        part_o = qkv.new_empty((B * hq * num_splits * d_pad,), dtype=torch.float32)
        part_ml = qkv.new_empty((B * hq * num_splits * 2,), dtype=torch.float32)
        ws = workspace if workspace is not None else attention_workspace(qkv, k_cache)
    else:
        # Never touched with one split. Read-only dummies: an argument aliasing a written one (o) would confuse the
        # functionalization of the kernel's writes under AOTInductor. qkv, not positions: AOTInductor fixes every
        # user-kernel argument's strides, which COPIES an input it has not realized into a new buffer per argument
        # per call, and a step's positions often are such an input (a `torch.full`): as three dummies they cost
        # three fill kernels per layer (H100 profiles of the predictors; bench/probes/functional_copies.py).
        # qkv is a kernel's output, a realized buffer.
        part_o = part_ml = ws = qkv
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
        ws,
        layer,
        S,
        qkv.stride(0),
        B * hkv * S,
        float(norm_eps),
        float(scale) * kernels.LOG2E,
    )
    meta = dict(
        head_meta(qkv, hq, hkv, hd, cos, rope_interleaved, q_norm),
        NUM_SPLITS=num_splits,
        MIN_CHUNK=min_chunk,
        BLOCK_S=block_s,
        PDL=kernels_wait(qkv.device),
        WHOLE=whole,
        EARLY_BLOCK=not whole and early_block(cache_settled),
    )
    grid = (B * hkv, num_splits)
    if config is not None:
        wrap(kernels.decode_attention_kernel)[grid](*args, **meta, **config)
    elif whole:
        wrap(kernels.decode_attention_whole[whole_warps(meta["ROPE"])])[grid](*args, **meta)
    else:
        wrap(kernels.decode_attention_split[kernels.split_warps(hd)])[grid](*args, **meta)
    return o


if HAVE_TRITON:

    @torch.library.triton_op(OP_NAME, mutates_args={"k_cache", "v_cache", "workspace"})
    def _decode_attention_op(
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
        workspace: torch.Tensor | None = None,
        cache_settled: bool = False,
    ) -> torch.Tensor:
        _check(qkv, positions, k_cache, v_cache, layer, cos, sin, rope_interleaved, q_norm, k_norm, workspace)
        if qkv.device.type != "cuda" or qkv.dtype != k_cache.dtype:
            # Also what a CPU compile / ONNX export traces (lower_for_cpu): aten ops, the cache write an in-place
            # index_put_, the workspace untouched.
            # fp32 qkv over 16-bit caches: the builder's fp32 parity run of a bf16 stage (never a compiled bucket).
            return decode_attention_reference(
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
                workspace,
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
            workspace,
            cache_settled,
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
        workspace=None,
        cache_settled=False,
    ):
        _check(qkv, positions, k_cache, v_cache, layer, cos, sin, rope_interleaved, q_norm, k_norm, workspace)
        return decode_attention_reference(
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
            workspace,
        )

    _LIB = torch.library.Library("ttsaot", "FRAGMENT")
    _LIB.define(
        "decode_attention"
        + torch.library.infer_schema(decode_attention_reference, mutates_args={"k_cache", "v_cache", "workspace"})
    )
    _LIB.impl("decode_attention", _checked_reference, "CompositeImplicitAutograd")

    _decode_attention_op = torch.ops.ttsaot.decode_attention

register_reference(torch.ops.ttsaot.decode_attention.default, decode_attention_reference)


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
    workspace: torch.Tensor | None = None,
    cache_settled: bool = False,
) -> torch.Tensor:
    """The op with every argument passed and a workspace always given (a zeroed one of B·Hkv entries when None):
    torch 2.11's version bump of a mutating custom op indexes the positional arguments by the schema's mutated
    positions, so an omitted mutated argument raised IndexError (H100 run, torch 2.11)."""
    if workspace is None:
        workspace = attention_workspace(qkv, k_cache)
    return _decode_attention_op(
        qkv, positions, k_cache, v_cache, layer, scale, cos, sin, rope_interleaved, q_norm, k_norm, norm_eps,
        workspace, cache_settled,
    )  # fmt: skip
