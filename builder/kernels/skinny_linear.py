"""`ttsaot::skinny_linear`: y = epilogue(prologue(x) @ Wᵀ) for the few-row GEMMs of decode steps and short
re-prefills (M = batch ≤ 16, or batch × positions ≤ a few hundred), where reading W once is the whole cost.

    skinny_linear(x [..., K], weight [N, K], bias [N]? = None, norm_weight [K]? = None, norm_eps = 1e-6,
                  gated = False, residual [..., N_out]? = None, residual_scale = 1.0,
                  workspace int32 [≥ tiles]? = None) -> y [..., N_out]

W is in nn.Linear layout (row-major [N, K]) in x's dtype (bf16 or fp32); products accumulate in fp32; y has
x's dtype. N_out = N/2 when gated, else N. Each step below rounds to x's dtype exactly where the eager modules
(layers.norms.RMSNorm, nn.Linear, layers.mlp.SwiGLU, the families' residual adds) round, so a layer built from this
op computes the eager layer's function up to the order of the fp32 accumulation:

1. prologue, if norm_weight: x̂ = round(norm_weight · round(x · rsqrt(mean(x²) + eps)))   (mean over K in fp32);
2. z = round(x̂ @ Wᵀ + bias)                        (F.linear: fp32 accumulate, bias added before the rounding);
3. gated: gate = z[..., :N/2], up = z[..., N/2:] (rows [0, N/2) and [N/2, N) of a fused gate_up weight);
   z = round(round(silu(gate)) · up)               (F.silu(gate) * up, each eager op rounding once);
4. residual: y = round(residual + round(z · residual_scale))   (`residual + branch * scale`; with scale 1.0 the
   inner rounding is exact, i.e. `residual + branch`).

The Triton kernels (skinny_linear_triton.py) implement this on CUDA; the aten reference below is the same math and
is what CPU builds and the ONNX exporter use (decompositions.py). One op serves every stage: M ≤ 2 takes the GEMV
(FMA) form, larger M a tensor-core tile of 16/32/64 rows; split-K is used where N alone is too narrow to keep the
GPU streaming, its partials added in split order (deterministic).

`workspace` (optional): a ZEROED int32 buffer (`skinny_linear_workspace`), returned zeroed. With it a split-K call
adds its partials in the same launch (the last program of each output tile to arrive, counted there); without it a
second (epilogue) kernel does. A stage allocates one per call and passes it to every projection, as the steps do
with decode_attention's workspace: a zero fill per op call breaks the programmatic-launch chain of the 1-row
packages (H100 LocDiT b1: 5.62 vs 4.92 ms with one fill per split call, bench/results/nvidia-h100/probes/
skinny_split_k_ab/), one per stage call need not. A call with a workspace is the op
`ttsaot::skinny_linear_with_workspace` (same function, `mutates_args={"workspace"}`), lowered for CPU by
`decompositions.lower_for_cpu` (its aten branch leaves the workspace untouched); stages make one on CUDA only, so
CPU builds and ONNX exports keep the functional `ttsaot::skinny_linear`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .common import HAVE_TRITON, cdiv, multiprocessor_count, next_power_of_2, rms_norm
from .decompositions import register_cpu_decomposition
from .pdl import kernels_wait

OP_NAME = "ttsaot::skinny_linear"
WORKSPACE_OP_NAME = "ttsaot::skinny_linear_with_workspace"
# M up to this takes the FMA (GEMV) form by default, larger M the tensor-core tile: the FMA accumulator holds
# BLOCK_M·BLOCK_N·BLOCK_K fp32 values (200+ registers per thread at M = 4 with the GEMV configs).
GEMV_MAX_M = 2
# Above this many rows the op is plain aten (cuBLAS + Inductor's fused epilogue), decided at trace time from the
# bucket's static shape: the tile form falls behind cuBLAS there (H100, bench/results/nvidia-h100/
# kernels_phase1.json: 1.4-3.2x torch at M = 11..20, but 0.46-0.9x at the Fish fast_ar's M = 44 / 176).
MAX_KERNEL_ROWS = 32
MIN_SPLIT_K_CHUNK = 1024  # split-K never gives a program less than this much of K (with the epilogue kernel)
# ... nor this much when the partials are added in the same launch. Not for calls with the RMSNorm prologue: each
# range's programs recompute their rows' RMS over all of K, and the normed LocDiT projections (K = 1024) were
# fastest unsplit in that sweep (qkv 8.2 us unsplit vs 8.8 at 2 ranges).
FUSED_MIN_SPLIT_K_CHUNK = 512
SPLIT_K_ALIGN = 512  # split boundaries are multiples of the largest BLOCK_K of the autotuned configs
MIN_BLOCK_N = {False: 2, True: 16}  # smallest BLOCK_N of the GEMV / tile configs (skinny_linear_triton.py)


def skinny_linear_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    gated: bool = False,
    residual: torch.Tensor | None = None,
    residual_scale: float = 1.0,
) -> torch.Tensor:
    """The op in aten: the eager modules' own calls, in their order."""
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, norm_eps)
    y = F.linear(x, weight, bias)
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    if residual is not None:
        y = residual + (y if residual_scale == 1.0 else y * residual_scale)
    return y


def _out_features(weight: torch.Tensor, gated: bool) -> int:
    return weight.shape[0] // 2 if gated else weight.shape[0]


def _check(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    gated: bool,
    residual: torch.Tensor | None,
    workspace: torch.Tensor | None = None,
) -> None:
    torch._check(weight.dim() == 2, lambda: f"skinny_linear: weight must be [N, K], got {tuple(weight.shape)}")
    torch._check(
        x.dim() >= 1 and x.shape[-1] == weight.shape[1],
        lambda: f"skinny_linear: x {tuple(x.shape)} does not end in K = {weight.shape[1]}",
    )
    torch._check(
        # float64: the aten reference only (the builder's float64 pass-parity re-check), never a Triton launch
        (x.dtype in (torch.float32, torch.bfloat16) or (x.dtype == torch.float64 and x.device.type != "cuda"))
        and weight.dtype == x.dtype,
        lambda: f"skinny_linear: x and weight must share a float dtype, got {x.dtype} / {weight.dtype}",
    )
    torch._check(
        weight.stride(1) == 1 and weight.stride(0) == weight.shape[1],
        lambda: "skinny_linear: weight must be contiguous (nn.Linear layout)",
    )
    torch._check(
        not gated or weight.shape[0] % 2 == 0, lambda: "skinny_linear: gated needs an even N (gate rows then up rows)"
    )
    n = weight.shape[0]
    torch._check(
        bias is None or (bias.shape == (n,) and bias.dtype == x.dtype),
        lambda: f"skinny_linear: bias must be [{n}] in {x.dtype}",
    )
    torch._check(
        norm_weight is None or (norm_weight.shape == (x.shape[-1],) and norm_weight.dtype == x.dtype),
        lambda: f"skinny_linear: norm_weight must be [{x.shape[-1]}] in {x.dtype}",
    )
    out_shape = (*x.shape[:-1], _out_features(weight, gated))
    torch._check(
        residual is None or (tuple(residual.shape) == out_shape and residual.dtype == x.dtype),
        lambda: f"skinny_linear: residual must be {list(out_shape)} in {x.dtype}",
    )
    torch._check(
        workspace is None or (workspace.dtype == torch.int32 and workspace.dim() == 1 and workspace.is_contiguous()),
        lambda: "skinny_linear: the workspace must be a contiguous 1-D int32 tensor (skinny_linear_workspace)",
    )


def plan_split_k(m: int, n_out: int, k: int, multiprocessors: int, use_dot: bool, fused: bool = False) -> int:
    """How many K ranges. With the epilogue kernel (a second launch) only when the column tiles (nominal BLOCK_N 8
    for the GEMV form, 16 for tensor cores) × row tiles leave more than a quarter of the SMs idle; doubled while
    that holds and each range keeps at least MIN_SPLIT_K_CHUNK of K. `fused` (the partials added in the same
    launch, a workspace given): doubled while the programs number fewer than two per SM and each range keeps
    FUSED_MIN_SPLIT_K_CHUNK (H100 sweep at the LocDiT rows, M = 22: o_proj best at 4 ranges, down at 4-8)."""
    tiles = cdiv(n_out, 16 if use_dot else 8) * (cdiv(m, _block_m(m, use_dot)))
    split = 1
    if fused:
        while tiles * split < 2 * multiprocessors and k // (2 * split) >= FUSED_MIN_SPLIT_K_CHUNK and split < 8:
            split *= 2
        return split
    while 4 * tiles * split < 3 * multiprocessors and k // (2 * split) >= MIN_SPLIT_K_CHUNK and split < 8:
        split *= 2
    return split


def _block_m(m: int, use_dot: bool) -> int:
    return (16 if m <= 16 else 32 if m <= 32 else 64) if use_dot else next_power_of_2(m)


def _identity(kernel: Any) -> Any:
    return kernel


def kernel_rows(x: torch.Tensor) -> bool:
    """Whether a call with this x runs the Triton kernels (else its aten reference): rows ≤ MAX_KERNEL_ROWS. Shapes
    are static per bucket, so each bucket's package bakes one choice; a symbolic row count keeps the kernels."""
    rows = x.numel() // max(x.shape[-1], 1) if x.dim() else 1
    return not isinstance(rows, int) or rows <= MAX_KERNEL_ROWS


def workspace_counters(rows: int, n_out: int) -> int:
    """Counters a fused split-K call over `rows` rows and `n_out` outputs may use: one per output tile at the
    smallest BLOCK_N of the form `rows` takes (MIN_BLOCK_N; the launcher checks the count it needs)."""
    use_dot = rows > GEMV_MAX_M
    return cdiv(rows, _block_m(rows, use_dot)) * cdiv(n_out, MIN_BLOCK_N[use_dot])


def skinny_linear_workspace(x: torch.Tensor, rows: int, max_out_features: int) -> torch.Tensor | None:
    """A zeroed workspace for every skinny_linear of one stage call over `rows` rows whose outputs are at most
    `max_out_features` wide (the ops leave it zeroed, so one serves them all); None off CUDA or when `rows` exceed
    MAX_KERNEL_ROWS (those calls run aten). `x`: any tensor on the stage's device."""
    if x.device.type != "cuda" or (isinstance(rows, int) and rows > MAX_KERNEL_ROWS):
        return None  # the op runs its aten reference
    if isinstance(rows, int):
        count = workspace_counters(rows, max_out_features)
    else:  # symbolic (a dynamic package): the most counters any row count the kernels take may use
        count = max(workspace_counters(r, max_out_features) for r in (GEMV_MAX_M, MAX_KERNEL_ROWS))
    return torch.zeros(count, dtype=torch.int32, device=x.device)


def launch_skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    gated: bool = False,
    residual: torch.Tensor | None = None,
    residual_scale: float = 1.0,
    workspace: torch.Tensor | None = None,
    *,
    wrap: Callable[[Any], Any] = _identity,
    config: dict | None = None,
    split_k: int | None = None,
    use_dot: bool | None = None,
) -> torch.Tensor:
    """Run the Triton kernels (CUDA, or CPU under TRITON_INTERPRET=1). `config` ({"BLOCK_N", "BLOCK_K",
    "num_warps", "num_stages"}) skips autotuning (the interpreter tests and the bench's sweeps use it); `split_k`
    and `use_dot` override the plan. `workspace` (zeroed, left zeroed: module docstring): a split-K call with it
    adds its partials in the same kernel, without it in a second (epilogue) kernel."""
    from . import skinny_linear_triton as kernels

    k = weight.shape[1]
    n_out = _out_features(weight, gated)
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    y = x.new_empty((*x.shape[:-1], n_out))
    r2 = residual.reshape(-1, n_out).contiguous() if residual is not None else x2
    if use_dot is None:
        use_dot = m > GEMV_MAX_M
    block_m = _block_m(m, use_dot)
    if split_k is None:
        fused = workspace is not None and norm_weight is None
        split_k = plan_split_k(m, n_out, k, multiprocessor_count(x.device), use_dot, fused)
    align = config["BLOCK_K"] if config else SPLIT_K_ALIGN
    k_split = cdiv(cdiv(k, split_k), align) * align
    split_k = cdiv(k, k_split)
    part = x2.new_empty((split_k, m, weight.shape[0]), dtype=torch.float32) if split_k > 1 else x2
    fused_reduce = split_k > 1 and workspace is not None
    if fused_reduce:
        configs = kernels.GEMM_CONFIGS if use_dot else kernels.GEMV_CONFIGS
        block_n = config["BLOCK_N"] if config else min(c.kwargs["BLOCK_N"] for c in configs)
        tiles = cdiv(m, block_m) * cdiv(n_out, block_n)
        torch._check(
            workspace.dtype == torch.int32 and workspace.numel() >= tiles and workspace.device == x.device,
            lambda: f"skinny_linear: the workspace must hold ≥ {tiles} int32 counters on {x.device}",
        )
    flags = dict(
        HAS_NORM=norm_weight is not None, HAS_BIAS=bias is not None, GATED=gated, HAS_RESIDUAL=residual is not None
    )
    args = (
        x2,
        weight,
        bias if bias is not None else x2,
        norm_weight if norm_weight is not None else x2,
        r2,
        y,
        part,
        workspace if fused_reduce else part,
        m,
        n_out,
        k,
        k_split,
        float(norm_eps),
        float(residual_scale),
    )
    meta = dict(
        flags,
        SPLIT_K=split_k,
        FUSED_REDUCE=fused_reduce,
        USE_DOT=use_dot,
        BLOCK_M=block_m,
        FP32_DOT=x.dtype == torch.float32 or x.device.type != "cuda",
        PDL=kernels_wait(x.device),
    )  # off-GPU = the interpreter

    def grid(meta):
        return (cdiv(m, meta["BLOCK_M"]), cdiv(n_out, meta["BLOCK_N"]), split_k)

    if config is None:
        kernel = kernels.skinny_gemm_autotuned if use_dot else kernels.skinny_gemv_autotuned
        wrap(kernel)[grid](*args, **meta)
    else:
        wrap(kernels.skinny_linear_kernel)[grid](*args, **meta, **config)
    if split_k > 1 and not fused_reduce:
        # The norm was applied in the first pass: the epilogue kernel takes the epilogue flags only.
        epilogue = {k: v for k, v in flags.items() if k != "HAS_NORM"}
        bm = min(16, next_power_of_2(m))
        wrap(kernels.split_k_epilogue_kernel)[(cdiv(n_out, 128), cdiv(m, bm))](
            part,
            args[2],
            r2,
            y,
            m,
            n_out,
            float(residual_scale),
            **epilogue,
            SPLIT_K=split_k,
            PDL=meta["PDL"],
            BLOCK_M=bm,
            BLOCK_N=128,
        )
    return y


def _run(x, weight, bias, norm_weight, norm_eps, gated, residual, residual_scale, workspace):
    """Both ops' body: the Triton kernels on CUDA up to MAX_KERNEL_ROWS rows, else the aten reference. The
    reference is also what a CPU compile traces (fake tensors: plain aten ops that Inductor's C++ backend fuses, the
    workspace untouched), and what CUDA runs above MAX_KERNEL_ROWS (cuBLAS + Inductor's fused epilogue is faster)."""
    _check(x, weight, bias, norm_weight, gated, residual, workspace)
    if x.device.type != "cuda" or not kernel_rows(x):
        return skinny_linear_reference(x, weight, bias, norm_weight, norm_eps, gated, residual, residual_scale)
    return launch_skinny_linear(
        x,
        weight,
        bias,
        norm_weight,
        norm_eps,
        gated,
        residual,
        residual_scale,
        workspace,
        wrap=torch.library.wrap_triton,
    )


def _with_workspace(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    norm_eps: float,
    gated: bool,
    residual: torch.Tensor | None,
    residual_scale: float,
    workspace: torch.Tensor,
) -> torch.Tensor:
    """`ttsaot::skinny_linear_with_workspace`: the op plus the workspace it mutates (its schema's source)."""
    return _run(x, weight, bias, norm_weight, norm_eps, gated, residual, residual_scale, workspace)


if HAVE_TRITON:

    @torch.library.triton_op(OP_NAME, mutates_args=())
    def _skinny_linear_op(
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        norm_weight: torch.Tensor | None = None,
        norm_eps: float = 1e-6,
        gated: bool = False,
        residual: torch.Tensor | None = None,
        residual_scale: float = 1.0,
    ) -> torch.Tensor:
        return _run(x, weight, bias, norm_weight, norm_eps, gated, residual, residual_scale, None)

    _workspace_op = torch.library.triton_op(WORKSPACE_OP_NAME, _with_workspace, mutates_args={"workspace"})

else:

    @torch.library.custom_op(OP_NAME, mutates_args=())
    def _skinny_linear_op(
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        norm_weight: torch.Tensor | None = None,
        norm_eps: float = 1e-6,
        gated: bool = False,
        residual: torch.Tensor | None = None,
        residual_scale: float = 1.0,
    ) -> torch.Tensor:
        _check(x, weight, bias, norm_weight, gated, residual)
        return skinny_linear_reference(x, weight, bias, norm_weight, norm_eps, gated, residual, residual_scale)

    @_skinny_linear_op.register_fake
    def _(x, weight, bias=None, norm_weight=None, norm_eps=1e-6, gated=False, residual=None, residual_scale=1.0):
        _check(x, weight, bias, norm_weight, gated, residual)
        return x.new_empty((*x.shape[:-1], _out_features(weight, gated)))

    # A CompositeImplicitAutograd op (decode_attention.py says why a plain mutating custom_op would not do):
    # torch.export keeps it as one node, `run_decompositions` inlines it into aten ops.
    _LIB = torch.library.Library("ttsaot", "FRAGMENT")
    _LIB.define(
        WORKSPACE_OP_NAME.split("::")[1] + torch.library.infer_schema(_with_workspace, mutates_args={"workspace"})
    )
    _LIB.impl(WORKSPACE_OP_NAME.split("::")[1], _with_workspace, "CompositeImplicitAutograd")
    _workspace_op = torch.ops.ttsaot.skinny_linear_with_workspace


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    gated: bool = False,
    residual: torch.Tensor | None = None,
    residual_scale: float = 1.0,
    workspace: torch.Tensor | None = None,
) -> torch.Tensor:
    """The op: `ttsaot::skinny_linear` (functional) without a workspace, `ttsaot::skinny_linear_with_workspace`
    (declares the workspace mutated, every argument passed positionally: torch 2.11's version bump of a mutating
    op indexes them by the schema's positions, decode_attention.py) with one. Two registrations of one function so
    that every graph without a workspace (CPU builds, ONNX exports, the decode steps) keeps a functional node that a
    decomposition table lowers."""
    if workspace is None:
        return _skinny_linear_op(x, weight, bias, norm_weight, norm_eps, gated, residual, residual_scale)
    return _workspace_op(x, weight, bias, norm_weight, norm_eps, gated, residual, residual_scale, workspace)


register_cpu_decomposition(torch.ops.ttsaot.skinny_linear.default, skinny_linear_reference)
