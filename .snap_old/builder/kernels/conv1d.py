"""Codec convolutions as Triton implicit GEMMs on channels-last activations, with the bias/residual/affine/activation
epilogue fused into the single pass over each output tile.

Ops (each one node under torch.export, embedded in the AOTI package on CUDA, an exact aten reference on CPU):

- `ttsaot::conv1d`            causal (or any left-padded) Conv1d, groups = 1, any kernel/stride/dilation;
- `ttsaot::conv1d_dual`       the same, returning (pre, act): the residual stream and the next conv's input;
- `ttsaot::conv_transpose1d`  CausalConvTranspose1d (K zero-padded to a multiple of the stride, tail trimmed:
                              exactly T·stride outputs) as a polyphase GEMM;
- `ttsaot::conv_transpose1d_dual`;
- `ttsaot::dwconv1d`          depthwise causal conv (stride 1) with the same epilogue (VoxCPM2's residual units).

Layout. Every activation is channels-last, [B, T, C] contiguous ("NLC"): the input, the residual, both outputs.
A tap's time shift then moves whole rows, so each row of an input tile is one aligned run of channels whatever the
shift (the NCL form read time-shifted, unaligned runs: 35-45 % slower on an H100), the output tile [t, c] is stored
along channels, and a codec's conv stack needs no layout change between layers; its transformers and ConvNeXt
blocks are [B, T, C] already, and a 1-channel output [B, T, 1] is the [B, 1, T] wave as it is.

GEMM. out[b, t, n] = Σ_j Σ_ci x[b, t·stride + j·dilation − left_pad, ci] · W[n, j, ci] (zero outside [0, T)):
rows are output times, columns output channels, the reduction runs tap by tap over blocks of input channels (an
input of < 16 channels, such as a wave, over blocks of (tap, channel) pairs instead: `joint_reduction`).
Weights are baked once at build time (`bake_*`):
- conv1d:            [Cout, K, Cin]    (reduction-contiguous: the K-major B operand tensor-core MMA wants for fp32);
- conv_transpose1d:  [s, Cout, M, Cin] with M = ceil(K/s): out[b, t·s + p, co] = Σ_j Σ_ci W[p, co, j, ci] ·
                     x[b, t + j − (M − 1), ci], i.e. a causal stride-1 conv with M taps and s·Cout output channels
                     n = p·Cout + co whose row t is exactly the s output rows t·s .. t·s + s − 1 of [B, T·s, Cout];
- dwconv1d:          [K, C].

Epilogue, in this order, everything in fp32 registers, rounded to the compute dtype c (= x.dtype) exactly where
the eager module chain rounds, so a bf16 stage keeps its eager numerics up to the accumulation order:
  v = c(acc + bias) → v = c(v + residual) → v = c(c(v · scale) + shift) → pre = v
  → act: snake v + inv_beta·sin²(alpha·v) | tanh | clamp to [−1, 1] | none → c(·) → cast to out_dtype.
Per-channel vectors (bias, scale, shift, alpha, inv_beta) are [Cout]. SnakeBeta uses the math of
`ttsaot::snake_beta` (fast sin.approx for 16-bit outputs on CUDA). `_dual` ops also return `pre` (dtype c).

Precision (fp32 inputs only; 16-bit inputs always multiply on the tensor cores with fp32 accumulation):
`precision` = "ieee" (FMA, exact fp32 products), "tf32" (tensor cores, both operands rounded to the nearest TF32
value in the kernel, as cuDNN does: fed as they are, the tensor cores would truncate them, a bias that builds up
through a decoder stack — 1.2e-2 against cuDNN's 1.0e-3 over the Fish decoder on an H100), "tf32x3" (three TF32
products with error compensation, ~fp32 accuracy on tensor cores). The CPU reference is always exact fp32;
`round_to_tf32` is the operand rounding of "tf32" in aten ops (for tests).

Short inputs (a 50-frame bucket at B=1 gives a few dozen output tiles for 132 SMs) can split the reduction over
2-8 programs per tile (split-K): each stores an fp32 partial, the last to arrive sums them in a fixed order
(deterministic) and runs the epilogue. Such launches take a zeroed counter per tile and ≤ SPLIT_WS_BYTES of
workspace; shapes that may split pay that memset even when the autotuner keeps the unsplit tile.

Autotuning (CUDA; AOTInductor runs it once per bucket at build time and bakes the winner into the package): a short
list of tiles (`gemm_kernel_configs`), pruned per shape to `TUNED_CONFIGS` candidates by a roofline estimate of
their waves (`prune_gemm_configs`: the best unsplit tiles, and the best split one when it is estimated faster; an
fp32 short grid, where the estimate is known to be off, measures two whole tiles and two split-Ks), so that a stage
with ~30 distinct conv shapes benchmarks ≤ 3-4 candidates each. Build-time cost: each (epilogue
variant × chosen tile) compiles once per package (Triton, ~1-5 s on a 16-core host; tf32x3's large tiles the
slowest), each shape benchmarks its ≤ 3-4 candidates (~0.1 s each); the bench records a chain's first-call seconds
(compile + tuning of every layer) as `first_call_s`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from .common import size_hint
from .decompositions import CPU_DECOMPOSITIONS, register_cpu_decomposition
from .snake_beta import HAVE_TRITON, snake_beta_nlc_reference

OPS = ("conv1d", "conv1d_dual", "conv_transpose1d", "conv_transpose1d_dual", "dwconv1d")
ACTS = ("none", "snake", "tanh", "clamp")
PRECISIONS = ("ieee", "tf32", "tf32x3")
LAYOUT = "NLC"
_ACT_CODE = {a: i for i, a in enumerate(ACTS)}
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from .snake_beta import _fast_sin
    from .split_k_triton import last_to_arrive, reset_counter


class ConvBakeError(ValueError):
    """A module cannot be baked for the conv kernels (unsupported groups, stride, padding or trim)."""


# ------------------------------------------------------------------------------------------ geometry
def causal_out_len(T: int, kernel_size: int, stride: int, dilation: int, left_pad: int) -> int:
    """Output length of CausalConv1d (layers/conv.py): windows of the left-padded input, right-padded up to a
    whole number of strides (ceil(T / stride) for the usual left_pad = effective_kernel − stride)."""
    eff = (kernel_size - 1) * dilation + 1
    return -(-(T - eff + left_pad) // stride) + 1


def _right_pad(T: int, kernel_size: int, stride: int, dilation: int, left_pad: int) -> int:
    eff = (kernel_size - 1) * dilation + 1
    return (causal_out_len(T, kernel_size, stride, dilation, left_pad) - 1) * stride + eff - left_pad - T


# ------------------------------------------------------------------------------------------ references
def round_to_tf32(t: torch.Tensor) -> torch.Tensor:
    """fp32 → the nearest TF32 value (10-bit mantissa, ties to even), as fp32: the "tf32" operand rounding."""
    bits = t.float().contiguous().view(torch.int32)
    bits = (bits + 0xFFF + ((bits >> 13) & 1)) & -8192
    return bits.view(torch.float32)


def _finish(acc: torch.Tensor, residual, scale, shift, alpha, inv_beta, act: str, out_dtype, c) -> tuple:
    """The epilogue in aten ops on the fp32 conv result [B, T, C] (bias included), rounding to the compute dtype
    `c` where the kernel does; returns (pre, out), both contiguous."""
    v = acc.to(c)
    if residual is not None:
        v = (v.float() + residual.float()).to(c)
    if scale is not None:
        v = (v.float() * scale.float()).to(c)
        v = (v.float() + shift.float()).to(c)
    pre = v.contiguous()
    if act == "snake":
        y = snake_beta_nlc_reference(pre, alpha, inv_beta)
    elif act == "tanh":
        y = torch.tanh(pre.float()).to(c)
    elif act == "clamp":
        y = pre.clamp(-1.0, 1.0)
    else:
        y = pre
    return pre, y.to(out_dtype if out_dtype is not None else c).contiguous()


def _conv1d_ref_impl(
    x, weight, bias, residual, scale, shift, alpha, inv_beta, stride, dilation, left_pad, act, out_dtype
):
    K = weight.shape[1]
    T = x.shape[1]
    xp = F.pad(x.float().transpose(1, 2), (left_pad, _right_pad(T, K, stride, dilation, left_pad)))
    acc = F.conv1d(
        xp, weight.float().permute(0, 2, 1), None if bias is None else bias.float(), stride=stride, dilation=dilation
    )
    return _finish(acc.transpose(1, 2), residual, scale, shift, alpha, inv_beta, act, out_dtype, x.dtype)


def conv1d_reference(
    x,
    weight,
    bias,
    residual,
    scale,
    shift,
    alpha,
    inv_beta,
    stride: int,
    dilation: int,
    left_pad: int,
    act: str,
    out_dtype,
    precision: str,
):
    """Exact fp32 (products and sums) aten form of `ttsaot::conv1d`; also its CPU/ONNX decomposition."""
    return _conv1d_ref_impl(
        x, weight, bias, residual, scale, shift, alpha, inv_beta, stride, dilation, left_pad, act, out_dtype
    )[1]


def conv1d_dual_reference(
    x,
    weight,
    bias,
    residual,
    scale,
    shift,
    alpha,
    inv_beta,
    stride: int,
    dilation: int,
    left_pad: int,
    act: str,
    out_dtype,
    precision: str,
):
    return _conv1d_ref_impl(
        x, weight, bias, residual, scale, shift, alpha, inv_beta, stride, dilation, left_pad, act, out_dtype
    )


def unbake_conv_transpose1d(weight: torch.Tensor) -> torch.Tensor:
    """[s, Cout, M, Cin] → the ConvTranspose1d weight [Cin, Cout, M·s] (zero-padded taps included)."""
    s, Cout, M, Cin = weight.shape
    return weight.permute(3, 1, 2, 0).flip(2).reshape(Cin, Cout, M * s)


def _conv_transpose1d_ref_impl(x, weight, bias, residual, scale, shift, alpha, inv_beta, act, out_dtype):
    s = weight.shape[0]
    T = x.shape[1]
    acc = F.conv_transpose1d(
        x.float().transpose(1, 2),
        unbake_conv_transpose1d(weight).float(),
        None if bias is None else bias.float(),
        stride=s,
    )
    return _finish(acc[..., : T * s].transpose(1, 2), residual, scale, shift, alpha, inv_beta, act, out_dtype, x.dtype)


def conv_transpose1d_reference(
    x, weight, bias, residual, scale, shift, alpha, inv_beta, act: str, out_dtype, precision: str
):
    return _conv_transpose1d_ref_impl(x, weight, bias, residual, scale, shift, alpha, inv_beta, act, out_dtype)[1]


def conv_transpose1d_dual_reference(
    x, weight, bias, residual, scale, shift, alpha, inv_beta, act: str, out_dtype, precision: str
):
    return _conv_transpose1d_ref_impl(x, weight, bias, residual, scale, shift, alpha, inv_beta, act, out_dtype)


def dwconv1d_reference(
    x, weight, bias, residual, scale, shift, alpha, inv_beta, dilation: int, left_pad: int, act: str, out_dtype
):
    K, C = weight.shape
    T = x.shape[1]
    xp = F.pad(x.float().transpose(1, 2), (left_pad, _right_pad(T, K, 1, dilation, left_pad)))
    acc = F.conv1d(
        xp, weight.float().t().unsqueeze(1), None if bias is None else bias.float(), dilation=dilation, groups=C
    )
    return _finish(acc.transpose(1, 2), residual, scale, shift, alpha, inv_beta, act, out_dtype, x.dtype)[1]


# ------------------------------------------------------------------------------------------ checks
def _check_epilogue(
    x, cout: int, out_shape, bias, residual, scale, shift, alpha, inv_beta, act, out_dtype, precision
) -> None:
    # float64 off CUDA: the aten reference only (the builder's float64 pass-parity re-check)
    fp64 = (torch.float64,) if x.device.type != "cuda" else ()
    torch._check(x.dtype in _DTYPES + fp64, lambda: f"conv kernels take fp32/bf16/fp16 inputs, got {x.dtype}")
    torch._check(act in ACTS, lambda: f"act must be one of {ACTS}, got {act!r}")
    torch._check(precision in PRECISIONS, lambda: f"precision must be one of {PRECISIONS}, got {precision!r}")
    torch._check(out_dtype is None or out_dtype in _DTYPES + fp64, lambda: f"unsupported out_dtype {out_dtype}")
    if bias is not None:
        torch._check(tuple(bias.shape) == (cout,), lambda: f"bias must be [{cout}], got {tuple(bias.shape)}")
    if residual is not None:
        torch._check(
            tuple(residual.shape) == tuple(out_shape),
            lambda: f"residual must have the output shape {tuple(out_shape)} [B,T,C], got {tuple(residual.shape)}",
        )
        torch._check(residual.dtype == x.dtype, lambda: "residual must have the input's dtype")
    torch._check((scale is None) == (shift is None), lambda: "scale and shift come together")
    if scale is not None:
        torch._check(
            tuple(scale.shape) == (cout,) and tuple(shift.shape) == (cout,), lambda: f"scale and shift must be [{cout}]"
        )
    if act == "snake":
        torch._check(alpha is not None and inv_beta is not None, lambda: "act='snake' needs alpha and inv_beta")
        torch._check(
            tuple(alpha.shape) == (cout,) and tuple(inv_beta.shape) == (cout,),
            lambda: f"alpha and inv_beta must be [{cout}]",
        )


def _check_conv1d(x, weight, stride, dilation, left_pad) -> tuple[int, int, int]:
    torch._check(x.dim() == 3, lambda: f"conv1d expects channels-last x [B,T,Cin], got {tuple(x.shape)}")
    torch._check(weight.dim() == 3, lambda: "conv1d expects a baked weight [Cout,K,Cin]")
    torch._check(weight.dtype == x.dtype, lambda: f"weight dtype {weight.dtype} != input dtype {x.dtype}")
    torch._check(stride >= 1 and dilation >= 1 and left_pad >= 0, lambda: "stride, dilation ≥ 1 and left_pad ≥ 0")
    Cout, K, Cin = weight.shape
    torch._check(Cin == x.shape[2], lambda: f"weight expects {Cin} input channels, x [B,T,C] has {x.shape[2]}")
    tout = causal_out_len(x.shape[1], K, stride, dilation, left_pad)
    torch._check(tout >= 1, lambda: "input shorter than one output window")
    return Cout, K, tout


def _check_conv_transpose1d(x, weight) -> tuple[int, int, int, int]:
    torch._check(x.dim() == 3, lambda: f"conv_transpose1d expects channels-last x [B,T,Cin], got {tuple(x.shape)}")
    torch._check(weight.dim() == 4, lambda: "conv_transpose1d expects a baked weight [stride,Cout,M,Cin]")
    torch._check(weight.dtype == x.dtype, lambda: f"weight dtype {weight.dtype} != input dtype {x.dtype}")
    s, Cout, M, Cin = weight.shape
    torch._check(Cin == x.shape[2], lambda: f"weight expects {Cin} input channels, x [B,T,C] has {x.shape[2]}")
    return s, Cout, M, Cin


def _check_dwconv1d(x, weight, dilation, left_pad) -> int:
    torch._check(x.dim() == 3, lambda: f"dwconv1d expects channels-last x [B,T,C], got {tuple(x.shape)}")
    torch._check(weight.dim() == 2 and weight.shape[1] == x.shape[2], lambda: "dwconv1d expects a weight [K,C]")
    torch._check(weight.dtype == x.dtype, lambda: f"weight dtype {weight.dtype} != input dtype {x.dtype}")
    torch._check(dilation >= 1 and left_pad >= 0, lambda: "dilation ≥ 1 and left_pad ≥ 0")
    tout = causal_out_len(x.shape[1], weight.shape[0], 1, dilation, left_pad)
    torch._check(tout >= 1, lambda: "input shorter than one output window")
    return tout


# ------------------------------------------------------------------------------------------ tile configs
@dataclass(frozen=True)
class ConvKernelConfig:
    """One GEMM tile configuration. block_t: output times (MMA M), block_n: output channels (MMA N, phases
    included), block_r: input channels per reduction step; group_t: time tiles that run next to each other
    (one weight tile, L2-resident, for the group); split_k: programs per output tile, each reducing one range of
    the reduction (short inputs)."""

    block_t: int = 64
    block_n: int = 64
    block_r: int = 32
    num_warps: int = 4
    num_stages: int = 3
    group_t: int = 8
    split_k: int = 1

    def meta(self) -> dict[str, int]:
        return {
            "BLOCK_T": self.block_t,
            "BLOCK_N": self.block_n,
            "BLOCK_R": self.block_r,
            "GROUP_T": self.group_t,
            "SPLIT_K": self.split_k,
        }

    @property
    def name(self) -> str:
        split = f"k{self.split_k}" if self.split_k > 1 else ""
        return f"t{self.block_t}n{self.block_n}r{self.block_r}w{self.num_warps}s{self.num_stages}{split}"


@dataclass(frozen=True)
class DwKernelConfig:
    block_t: int = 64
    block_c: int = 128
    num_warps: int = 4

    def meta(self) -> dict[str, int]:
        return {"BLOCK_T": self.block_t, "BLOCK_C": self.block_c}

    @property
    def name(self) -> str:
        return f"t{self.block_t}c{self.block_c}w{self.num_warps}"


# (BLOCK_T, BLOCK_N, warps, stages for 16-bit, stages for fp32). wgmma-sized tiles up to 256 wide for the long
# codec layers (256×64: 96/192-channel layers without a quarter-empty channel tile), 64-row tiles for 50-frame
# buckets (few time tiles), 16/32-column tiles for the 1-channel head and the 32-64-channel VAE/encoder layers.
# The reduction block is 64 channels (128 B rows) for 16-bit operands, 32 (also 128 B) for fp32, whose stages
# take twice the shared memory.
GEMM_TILES = (
    (128, 128, 8, 4, 3),
    (128, 256, 8, 3, 3),
    (256, 128, 8, 3, 3),
    (64, 256, 8, 4, 3),
    (256, 64, 8, 3, 3),
    (128, 64, 4, 4, 4),
    (64, 128, 4, 4, 4),
    (64, 64, 4, 5, 4),
    (256, 32, 4, 4, 3),
    (256, 16, 4, 4, 3),
    (128, 16, 4, 4, 4),
    (64, 16, 4, 4, 4),
)
# fp32 tiles that compile without register spills on sm_90 (ptxas -v, epilogue with snake, residual and `pre`):
# none beyond 128×128 outputs, and no side beyond 128 for tf32x3 (its split operands hold more registers)
FP32_MAX_TILE = 128 * 128
TF32X3_MAX_SIDE = 128
TUNED_CONFIGS = 3
# fp32 short grids measure one more: the two best whole tiles and two split-Ks of the best (prune_gemm_configs)
MAX_TUNED_CONFIGS = TUNED_CONFIGS + 1
# a split-K candidate of an fp32 short grid launches at most this many programs per SM (several run at once)
SHORT_GRID_PROGRAMS_PER_SM = 4
SHORT_GRID_MIN_SPLIT_STEPS = 16
# ... unless the whole tile's grid is tiny: then splits down to max_split's 4 steps each are measured too (the DAC
# encoder's quantizer in_proj, 1024 → 8 channels over 216 rows: 4 programs of 32 steps, 17.4 µs each, 10 per clip;
# H100 profile in bench/results/nvidia-h100/probes/dac_encoder_attention/)
TINY_GRID_PROGRAMS = 8
# Split-K candidates for short inputs, and the most fp32 partial-sum workspace a launch may take for them.
SPLITS = (2, 4, 8)
SPLIT_WS_BYTES = 16 * 2**20
# Depthwise tiles of 2,048 and 4,096 outputs. Tiles of 8,192 were the only choice once and left the long
# 32-64-channel VAE layers (69,120 × 32) with ~2 programs of 4 warps per SM, too few loads in flight for a
# bandwidth-bound kernel (14-15 µs for 17.7 MB, ~40% of copy, H100 phase-1 layers); next to 2,048-output tiles
# the autotuner still picked them now and then (noise in its cold-L2 timing), and those layers then ran 17-19 µs
# in the graph where the 2,048-output tiles ran 6-9.5 µs (probes/codec_timeline, three builds).
DW_CONFIGS = (
    DwKernelConfig(16, 128, 4),
    DwKernelConfig(32, 64, 4),
    DwKernelConfig(64, 32, 4),
    DwKernelConfig(32, 128, 4),
    DwKernelConfig(64, 64, 4),
    DwKernelConfig(128, 32, 4),
)
_H100_SMS = 132


def gemm_kernel_configs(dtype: torch.dtype) -> list[ConvKernelConfig]:
    """The whole tile list for one operand dtype, each tile unsplit and split, and unsplit without a pipeline
    (for one-step reductions: prune_gemm_configs picks exactly one of the two per tile)."""
    wide = dtype != torch.float32
    tiles = [
        ConvKernelConfig(t, n, 64 if wide else 32, w, s16 if wide else s32, split_k=k)
        for k in (1, *SPLITS)
        for t, n, w, s16, s32 in GEMM_TILES
    ]
    return tiles + [replace(c, num_stages=1) for c in tiles if c.split_k == 1]


def one_step(c: ConvKernelConfig, *, cin: int, ksize: int) -> bool:
    """Whether each program of this tile reduces in a single step (a thin input's joint (tap, channel) block, a
    1×1 conv of ≤ BLOCK_R channels). Such a loop has nothing to pipeline, and its stages' shared memory only
    limits how many programs share an SM: the DAC encoder's first conv (1 → 64 channels, k7, 442,368 rows,
    fp32) ran 452 µs at 4 stages and 121 µs at 1 (64×64 tile; 128×64: 445 → 148 µs), where writing its two
    outputs takes 153 µs by copy (H100, bench/probes/thin_conv_stages.py,
    bench/results/nvidia-h100/probes/thin_conv_stages/)."""
    return math.ceil(reduction_steps(ksize, cin, c.block_r) / c.split_k) <= 1


# Inputs of fewer channels than this (a wave's 1 channel into the DAC encoder's first conv) reduce over taps and
# channels jointly: one step covers BLOCK_R (tap, channel) pairs instead of one tap's block of channels, of which
# a 1-channel input fills 1 of 32 (the 10 s clip's first conv: 7 steps of 1/32 work, 782 µs on an H100).
JOINT_REDUCTION_MAX_CIN = 16


def joint_reduction(cin: int) -> bool:
    return cin < JOINT_REDUCTION_MAX_CIN


def reduction_steps(ksize: int, cin: int, block_r: int) -> int:
    """Reduction steps of one output tile (the kernel's `steps`)."""
    if joint_reduction(cin):
        return math.ceil(ksize * cin / block_r)
    return ksize * math.ceil(cin / block_r)


def max_split(*, batch: int, tout: int, n: int, cin: int, ksize: int, block_r: int) -> int:
    """The largest split-K a launch of this shape may use: its fp32 partials fit SPLIT_WS_BYTES and every split
    keeps ≥ 4 reduction steps; 1 when none does."""
    steps = reduction_steps(ksize, cin, block_r)
    ok = [k for k in SPLITS if k * batch * tout * n * 4 <= SPLIT_WS_BYTES and steps // k >= 4]
    return max(ok, default=1)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def estimate_us(
    c: ConvKernelConfig,
    *,
    batch: int,
    tout: int,
    n: int,
    cin: int,
    ksize: int,
    elem: int,
    num_sms: int = _H100_SMS,
    precision: str = "ieee",
) -> float:
    """Roofline estimate of one launch on an H100-class part: waves of programs × the slower of a tile's MMA work
    and its operand traffic from L2 (each reduction step loads (block_t + block_n) × block_r operands); split-K
    adds the fp32 partials' round trip and the counters' reset. It only ranks candidates: the autotuner measures
    the survivors."""
    tiles = math.ceil(tout / c.block_t) * math.ceil(n / c.block_n)
    programs = batch * tiles * c.split_k
    steps = math.ceil(reduction_steps(ksize, cin, c.block_r) / c.split_k)
    # per-SM rates in FLOP/µs: dense MMA (bf16 989, TF32 495 TFLOP/s over 132 SMs; tf32x3 makes three products),
    # FMA for exact fp32 (67 TFLOP/s); L2 → SM ~80 GB/s (bytes/µs)
    rate = {"ieee": 0.5e6, "tf32": 3.75e6, "tf32x3": 1.25e6}[precision] if elem == 4 else 7.5e6
    mma = 2.0 * c.block_t * c.block_n * c.block_r / rate
    load = (c.block_t + c.block_n) * c.block_r * elem / 8.0e4
    waves = math.ceil(programs / num_sms)
    est = waves * steps * max(mma, load) + 2.0
    if c.split_k > 1:
        partial = c.block_t * c.block_n * 4 / 8.0e4
        est += waves * partial + c.split_k * partial + 2.0
    return est


def _fits_registers(c: ConvKernelConfig, elem: int, precision: str) -> bool:
    if elem == 2:
        return True
    if precision == "tf32x3" and max(c.block_t, c.block_n) > TF32X3_MAX_SIDE:
        return False
    return c.block_t * c.block_n <= FP32_MAX_TILE


def prune_gemm_configs(
    configs: list[ConvKernelConfig],
    *,
    batch: int,
    tout: int,
    n: int,
    cin: int,
    ksize: int,
    elem: int,
    precision: str = "ieee",
    num_sms: int = _H100_SMS,
    keep: int = TUNED_CONFIGS,
) -> list[ConvKernelConfig]:
    """The `keep` most promising tiles for one shape: none much larger than the problem (a 1-channel output, a
    50-frame input), none that spills registers for fp32, ranked by `estimate_us`."""
    fit = [
        c
        for c in configs
        if (c.num_stages == 1) == one_step(c, cin=cin, ksize=ksize)
        and c.block_n <= max(16, _pow2(n))
        and c.block_t <= max(64, _pow2(tout))
        and (c.block_n >= 32 or n <= 16)
        and _fits_registers(c, elem, precision)
    ]
    whole = [c for c in fit if c.split_k == 1] or [
        min((c for c in configs if c.split_k == 1 and c.num_stages > 1), key=lambda c: c.block_t * c.block_n)
    ]
    split_max = max_split(batch=batch, tout=tout, n=n, cin=cin, ksize=ksize, block_r=whole[0].block_r)
    split = [c for c in fit if 1 < c.split_k <= split_max]

    def est(c: ConvKernelConfig) -> float:
        return estimate_us(
            c, batch=batch, tout=tout, n=n, cin=cin, ksize=ksize, elem=elem, num_sms=num_sms, precision=precision
        )

    whole.sort(key=est)
    split.sort(key=est)
    if elem == 4 and keep > 1:
        top = whole[0]
        programs = batch * math.ceil(tout / top.block_t) * math.ceil(n / top.block_n)
        min_steps = SHORT_GRID_MIN_SPLIT_STEPS if programs > TINY_GRID_PROGRAMS else 4
        ks = sorted(
            (
                c
                for c in split
                if (c.block_t, c.block_n) == (top.block_t, top.block_n)
                and c.split_k * programs <= SHORT_GRID_PROGRAMS_PER_SM * num_sms
                and reduction_steps(ksize, cin, c.block_r) >= min_steps * c.split_k
            ),
            key=lambda c: -c.split_k,
        )
        if ks:
            # fp32 operands on a short grid: the estimate puts a tf32x3 reduction step at 0.2 µs where the H100
            # profile of vae_decoder measured ~1 µs (1×1 convs of 288 rows: 32 µs for 32 steps), and counts one
            # program per SM at a time where several fit; so it never offers a split. The measurement decides
            # between the two best whole tiles and the two largest split-Ks of the best one that keep ≥ 16 steps
            # each (H100 builds of bench/results/nvidia-h100/probes/codec_timeline: offered splits, the 1×1 convs
            # of 288 rows with 32 steps went 32 → 22 µs, those of 1,728 rows with 16 steps 24 → 31-37 µs: the
            # autotuner's L2-cold timing favours splits that a graph, whose inputs come hot from the layer
            # before, does not).
            return whole[:2] + ks[:2]
    if split and keep > 1 and est(split[0]) < est(whole[0]):
        # a short input: the best split next to the best unsplit tiles, the measurement decides
        return whole[: keep - 1] + split[:1]
    return whole[:keep]


def prune_dw_configs(configs: list[DwKernelConfig], channels: int) -> list[DwKernelConfig]:
    """The channel blocks that cover a row of ≤ 128 channels whole (one contiguous run), else 128 and 64, each at
    both tile sizes: ≤ 4 candidates per shape."""
    widths = {min(_pow2(channels), 128), max(32, min(_pow2(channels), 128) // 2)}
    return [c for c in configs if c.block_c in widths]


# ------------------------------------------------------------------------------------------ kernels
if HAVE_TRITON:

    @triton.jit
    def _round(v, CDT: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """fp32 → the nearest CDT value, kept in fp32 (the conv/residual/affine roundings of the eager chain).
        The interpreter's float32→bfloat16 cast truncates, so there round-to-nearest-even is done on the bits."""
        if EMULATE_RNE and CDT == tl.bfloat16:
            bits = v.to(tl.int32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
            return bits.to(tl.float32, bitcast=True)
        else:
            return v.to(CDT).to(tl.float32)

    @triton.jit
    def _rn_tf32(v):
        """fp32 → the nearest TF32 value, kept in fp32 (integer ops: the same code under the interpreter)."""
        bits = v.to(tl.int32, bitcast=True)
        bits = (bits + 0xFFF + ((bits >> 13) & 1)) & -8192
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _epilogue_store(
        v,
        ch,
        ch_ok,
        off,
        omask,
        res_ptr,
        scale_ptr,
        shift_ptr,
        alpha_ptr,
        ib_ptr,
        out_ptr,
        pre_ptr,
        CDT: tl.constexpr,
        HAS_RES: tl.constexpr,
        HAS_AFFINE: tl.constexpr,
        ACT: tl.constexpr,
        WRITE_PRE: tl.constexpr,
        FAST_SIN: tl.constexpr,
        GPU_MATH: tl.constexpr,
        EMULATE_RNE: tl.constexpr,
    ):
        # v: fp32 tile [times, channels] (bias added, rounded to CDT); ch: per-column channel; off: offsets of
        # the tile in the [T, C] rows of this sample (the pointers already point at the sample).
        if HAS_RES:
            r = tl.load(res_ptr + off, mask=omask, other=0.0).to(tl.float32)
            v = _round(v + r, CDT, EMULATE_RNE)
        if HAS_AFFINE:
            sc = tl.load(scale_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)
            sh = tl.load(shift_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)
            v = _round(v * sc[None, :], CDT, EMULATE_RNE)
            v = _round(v + sh[None, :], CDT, EMULATE_RNE)
        if WRITE_PRE:
            tl.store(pre_ptr + off, v.to(CDT), mask=omask)
        if ACT == 1:  # SnakeBeta, the math of ttsaot::snake_beta
            a = tl.load(alpha_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)
            ib = tl.load(ib_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)
            if FAST_SIN:
                s = _fast_sin(v * a[None, :])
            else:
                s = tl.sin(v * a[None, :])
            v = v + ib[None, :] * s * s
        elif ACT == 2:  # tanh
            if GPU_MATH:
                v = tl.extra.cuda.libdevice.tanh(v)
            else:
                # The interpreter has no libdevice: tanh from exp (abs. error ~1e-7, the CPU tests' tolerance).
                e = tl.exp(-2.0 * tl.abs(v))
                tv = (1.0 - e) / (1.0 + e)
                v = tl.where(v < 0, -tv, tv)
        elif ACT == 3:  # clamp to the audio range
            v = tl.minimum(tl.maximum(v, -1.0), 1.0)
        v = _round(v, CDT, EMULATE_RNE)
        tl.store(out_ptr + off, v.to(out_ptr.dtype.element_ty), mask=omask)

    @triton.jit
    def _gemm_epilogue(
        acc,
        b,
        t,
        n,
        bias_ptr,
        res_ptr,
        scale_ptr,
        shift_ptr,
        alpha_ptr,
        ib_ptr,
        out_ptr,
        pre_ptr,
        TOUT,
        N,
        COUT,
        CDT: tl.constexpr,
        HAS_PHASES: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        HAS_RES: tl.constexpr,
        HAS_AFFINE: tl.constexpr,
        ACT: tl.constexpr,
        WRITE_PRE: tl.constexpr,
        FAST_SIN: tl.constexpr,
        GPU_MATH: tl.constexpr,
        EMULATE_RNE: tl.constexpr,
    ):
        n_ok = n < N
        if HAS_PHASES:  # transposed conv: column n = p·COUT + co
            ch = n % COUT
        else:
            ch = n
        v = acc
        if HAS_BIAS:
            v = v + tl.load(bias_ptr + ch, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        v = _round(v, CDT, EMULATE_RNE)
        base = b * TOUT * N
        off = t[:, None] * N + n[None, :]
        omask = (t < TOUT)[:, None] & n_ok[None, :]
        _epilogue_store(
            v,
            ch,
            n_ok,
            off,
            omask,
            res_ptr + base,
            scale_ptr,
            shift_ptr,
            alpha_ptr,
            ib_ptr,
            out_ptr + base,
            pre_ptr + base,
            CDT,
            HAS_RES,
            HAS_AFFINE,
            ACT,
            WRITE_PRE,
            FAST_SIN,
            GPU_MATH,
            EMULATE_RNE,
        )

    # Shape arguments whose value (== 1) or divisibility (by 16) Triton would otherwise specialise on: one compiled
    # kernel per combination of B, T, dilations, strides... multiplies the compile time of a stage for nothing
    # (the channel counts CIN, N, COUT keep theirs: they decide the 16-byte accesses).
    _SHAPE_ARGS = ["B", "T", "TOUT", "KSIZE", "DIL", "STRIDE", "PAD"]

    @triton.jit(do_not_specialize=_SHAPE_ARGS)
    def _conv_gemm_jit(
        x_ptr,
        w_ptr,
        bias_ptr,
        res_ptr,
        scale_ptr,
        shift_ptr,
        alpha_ptr,
        ib_ptr,
        out_ptr,
        pre_ptr,
        ws_ptr,
        cnt_ptr,
        B,
        T,
        CIN,
        TOUT,
        N,
        COUT,
        KSIZE,
        DIL,
        STRIDE,
        PAD,
        HAS_PHASES: tl.constexpr,
        JOINT_R: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        HAS_RES: tl.constexpr,
        HAS_AFFINE: tl.constexpr,
        ACT: tl.constexpr,
        WRITE_PRE: tl.constexpr,
        PRECISION: tl.constexpr,
        UPCAST_DOT: tl.constexpr,
        FAST_SIN: tl.constexpr,
        GPU_MATH: tl.constexpr,
        EMULATE_RNE: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_R: tl.constexpr,
        GROUP_T: tl.constexpr,
        SPLIT_K: tl.constexpr,
    ):
        # out[t, n] = X[t, (j, ci)] @ W[n, (j, ci)]ᵀ, X gathered straight from the [T, CIN] rows of x: for one
        # reduction step (tap j, channels c0 .. c0 + BLOCK_R) every row of the X tile is one contiguous run of
        # x, shifted by whole rows, and the W tile is read along the reduction (K-major for the MMA).
        # SPLIT_K > 1 (short inputs: too few output tiles to fill the GPU): the reduction is cut into SPLIT_K
        # ranges, one program each; every program stores its fp32 partial in ws [SPLIT_K, B, TOUT, N], and the
        # last of a tile to arrive (counted in cnt, which it resets) sums the partials in split order —
        # deterministic whatever the arrival order — and runs the epilogue.
        pid = tl.program_id(0)
        b = tl.program_id(1).to(tl.int64)
        CDT: tl.constexpr = x_ptr.dtype.element_ty
        num_t = tl.cdiv(TOUT, BLOCK_T)
        num_n = tl.cdiv(N, BLOCK_N)
        tiles = num_t * num_n
        split = pid // tiles  # split outermost: programs in flight together share one reduction range
        tile = pid - split * tiles
        # grouped order: GROUP_T time tiles × every channel tile, time fastest, so programs in flight together
        # share their weight tiles and input rows in L2
        per_group = GROUP_T * num_n
        first_t = (tile // per_group) * GROUP_T
        group_len = tl.minimum(num_t - first_t, GROUP_T)
        pid_t = first_t + (tile % per_group) % group_len
        pid_n = (tile % per_group) // group_len

        t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n = tl.max_contiguous(tl.multiple_of(n, BLOCK_N), BLOCK_N)
        n_ok = n < N
        rr = tl.arange(0, BLOCK_R)
        x_b = x_ptr + b * T * CIN
        R = KSIZE * CIN
        ncb = tl.cdiv(CIN, BLOCK_R)
        if JOINT_R:  # thin input: steps over (tap, channel) pairs r = j·CIN + ci, W's own [K, CIN] order
            steps = tl.cdiv(R, BLOCK_R)
        else:
            steps = KSIZE * ncb
        per_split = tl.cdiv(steps, SPLIT_K)
        k_lo = split * per_split
        k_hi = tl.minimum(steps, k_lo + per_split)
        t_first = t * STRIDE - PAD
        w_rows = w_ptr + n[:, None] * R
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        for kk in tl.range(k_lo, k_hi):
            if JOINT_R:
                r = kk * BLOCK_R + rr
                r_ok = r < R
                jr = r // CIN
                ci = r - jr * CIN
                tin2 = t_first[:, None] + (jr * DIL)[None, :]
                xm = (tin2 >= 0) & (tin2 < T) & r_ok[None, :]
                xv = tl.load(x_b + tin2 * CIN + ci[None, :], mask=xm, other=0.0)
                wv = tl.load(w_rows + r[None, :], mask=n_ok[:, None] & r_ok[None, :], other=0.0)
            else:
                j = kk // ncb
                ci = (kk - j * ncb) * BLOCK_R + rr
                ci_ok = ci < CIN
                tin = t_first + j * DIL
                xm = ((tin >= 0) & (tin < T))[:, None] & ci_ok[None, :]
                xv = tl.load(x_b + tin[:, None] * CIN + ci[None, :], mask=xm, other=0.0)
                wv = tl.load(w_rows + (j * CIN + ci)[None, :], mask=n_ok[:, None] & ci_ok[None, :], other=0.0)
            if PRECISION == "tf32":
                xv = _rn_tf32(xv)
                wv = _rn_tf32(wv)
            if UPCAST_DOT:  # the interpreter multiplies 16-bit dot operands wrongly; upcasting is exact
                xv = xv.to(tl.float32)
                wv = wv.to(tl.float32)
            acc = tl.dot(xv, tl.trans(wv), acc, input_precision=PRECISION)

        if SPLIT_K == 1:
            _gemm_epilogue(
                acc,
                b,
                t,
                n,
                bias_ptr,
                res_ptr,
                scale_ptr,
                shift_ptr,
                alpha_ptr,
                ib_ptr,
                out_ptr,
                pre_ptr,
                TOUT,
                N,
                COUT,
                CDT,
                HAS_PHASES,
                HAS_BIAS,
                HAS_RES,
                HAS_AFFINE,
                ACT,
                WRITE_PRE,
                FAST_SIN,
                GPU_MATH,
                EMULATE_RNE,
            )
        else:
            ws_off = t[:, None] * N + n[None, :]
            wmask = (t < TOUT)[:, None] & n_ok[None, :]
            tl.store(ws_ptr + (split * B + b) * TOUT * N + ws_off, acc, mask=wmask)
            counter = cnt_ptr + b * tiles + tile
            if last_to_arrive(counter, SPLIT_K):
                total = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
                for s in tl.static_range(SPLIT_K):  # L2 reads (.cg): other SMs wrote them
                    total += tl.load(
                        ws_ptr + (s * B + b) * TOUT * N + ws_off, mask=wmask, other=0.0, cache_modifier=".cg"
                    )
                reset_counter(counter)
                _gemm_epilogue(
                    total,
                    b,
                    t,
                    n,
                    bias_ptr,
                    res_ptr,
                    scale_ptr,
                    shift_ptr,
                    alpha_ptr,
                    ib_ptr,
                    out_ptr,
                    pre_ptr,
                    TOUT,
                    N,
                    COUT,
                    CDT,
                    HAS_PHASES,
                    HAS_BIAS,
                    HAS_RES,
                    HAS_AFFINE,
                    ACT,
                    WRITE_PRE,
                    FAST_SIN,
                    GPU_MATH,
                    EMULATE_RNE,
                )

    @triton.jit(do_not_specialize=["B", "T", "TOUT", "KSIZE", "DIL", "PAD"])
    def _dwconv_jit(
        x_ptr,
        w_ptr,
        bias_ptr,
        res_ptr,
        scale_ptr,
        shift_ptr,
        alpha_ptr,
        ib_ptr,
        out_ptr,
        pre_ptr,
        B,
        T,
        C,
        TOUT,
        KSIZE,
        DIL,
        PAD,
        HAS_BIAS: tl.constexpr,
        HAS_RES: tl.constexpr,
        HAS_AFFINE: tl.constexpr,
        ACT: tl.constexpr,
        WRITE_PRE: tl.constexpr,
        FAST_SIN: tl.constexpr,
        GPU_MATH: tl.constexpr,
        EMULATE_RNE: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        # Bandwidth-bound: each tap re-reads the (L1-resident) row-shifted input tile; fp32 accumulation.
        pid_t = tl.program_id(0)
        pid_c = tl.program_id(1)
        b = tl.program_id(2).to(tl.int64)
        CDT: tl.constexpr = x_ptr.dtype.element_ty
        t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        c = tl.max_contiguous(tl.multiple_of(c, BLOCK_C), BLOCK_C)
        c_ok = c < C
        x_b = x_ptr + b * T * C
        acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
        for j in range(KSIZE):
            tin = t + (j * DIL - PAD)
            xm = ((tin >= 0) & (tin < T))[:, None] & c_ok[None, :]
            xv = tl.load(x_b + tin[:, None] * C + c[None, :], mask=xm, other=0.0).to(tl.float32)
            wj = tl.load(w_ptr + j * C + c, mask=c_ok, other=0.0).to(tl.float32)
            acc += xv * wj[None, :]
        v = acc
        if HAS_BIAS:
            v = v + tl.load(bias_ptr + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        v = _round(v, CDT, EMULATE_RNE)
        base = b * TOUT * C
        off = t[:, None] * C + c[None, :]
        omask = (t < TOUT)[:, None] & c_ok[None, :]
        _epilogue_store(
            v,
            c,
            c_ok,
            off,
            omask,
            res_ptr + base,
            scale_ptr,
            shift_ptr,
            alpha_ptr,
            ib_ptr,
            out_ptr + base,
            pre_ptr + base,
            CDT,
            HAS_RES,
            HAS_AFFINE,
            ACT,
            WRITE_PRE,
            FAST_SIN,
            GPU_MATH,
            EMULATE_RNE,
        )

    def _num_sms() -> int:
        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        return _H100_SMS

    def _prune_autotune(configs, named_args, **kwargs):
        by_cfg = {
            ConvKernelConfig(
                c.kwargs["BLOCK_T"],
                c.kwargs["BLOCK_N"],
                c.kwargs["BLOCK_R"],
                c.num_warps,
                c.num_stages,
                c.kwargs["GROUP_T"],
                c.kwargs["SPLIT_K"],
            ): c
            for c in configs
        }
        x = named_args["x_ptr"]
        prec = kwargs.get("PRECISION", named_args.get("PRECISION", "ieee"))
        kept = prune_gemm_configs(
            list(by_cfg),
            batch=size_hint(named_args["B"]),
            tout=size_hint(named_args["TOUT"]),
            n=size_hint(named_args["N"]),
            cin=size_hint(named_args["CIN"]),
            ksize=size_hint(named_args["KSIZE"]),
            elem=x.element_size(),
            precision=prec,
            num_sms=_num_sms(),
        )
        return [by_cfg[c] for c in kept]

    def _prune_dw_autotune(configs, named_args, **kwargs):
        by_cfg = {DwKernelConfig(c.kwargs["BLOCK_T"], c.kwargs["BLOCK_C"], c.num_warps): c for c in configs}
        return [by_cfg[c] for c in prune_dw_configs(list(by_cfg), size_hint(named_args["C"]))]

    def _triton_configs(dtype: torch.dtype) -> list:
        return [
            triton.Config(c.meta(), num_warps=c.num_warps, num_stages=c.num_stages) for c in gemm_kernel_configs(dtype)
        ]

    # B only sizes the grid (a row of programs per sample) but changes the best tile: it is part of the key.
    _AUTOTUNE_KEY = ["B", "T", "CIN", "TOUT", "N", "KSIZE", "DIL", "STRIDE", "PRECISION"]
    # Tuned per bucket at AOTI compile time on the compile GPU (one config baked into each package).
    _conv_gemm_16 = triton.autotune(
        configs=_triton_configs(torch.bfloat16),
        key=_AUTOTUNE_KEY,
        prune_configs_by={"early_config_prune": _prune_autotune},
    )(_conv_gemm_jit)
    _conv_gemm_32 = triton.autotune(
        configs=_triton_configs(torch.float32),
        key=_AUTOTUNE_KEY,
        prune_configs_by={"early_config_prune": _prune_autotune},
    )(_conv_gemm_jit)
    _dwconv_tuned = triton.autotune(
        configs=[triton.Config(c.meta(), num_warps=c.num_warps) for c in DW_CONFIGS],
        key=["B", "T", "C", "KSIZE", "DIL"],
        prune_configs_by={"early_config_prune": _prune_dw_autotune},
    )(_dwconv_jit)


def _flags(x: torch.Tensor, act: str) -> dict[str, Any]:
    cuda = x.device.type == "cuda"
    # Off CUDA these kernels only run under TRITON_INTERPRET (tests): no libdevice there, and its float32 →
    # bfloat16 cast truncates, so rounding to nearest even is emulated.
    return {
        "ACT": _ACT_CODE[act],
        "FAST_SIN": cuda and act == "snake" and x.dtype != torch.float32,
        "GPU_MATH": cuda,
        "EMULATE_RNE": not cuda,
    }


def _contiguous(*ts):
    # the kernels index every tensor as contiguous (no-ops under export for the tensors the chains pass)
    return tuple(None if t is None else t.contiguous() for t in ts)


def launch_conv_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    bias,
    residual,
    scale,
    shift,
    alpha,
    inv_beta,
    *,
    cout: int,
    tout: int,
    stride: int,
    dilation: int,
    pad: int,
    act: str,
    write_pre: bool,
    out_dtype,
    precision: str,
    wrap=lambda k: k,
    config: ConvKernelConfig | None = None,
    out: torch.Tensor | None = None,
    pre: torch.Tensor | None = None,
    scratch: tuple[torch.Tensor, torch.Tensor] | None = None,
):
    """Launch the implicit-GEMM kernel on x [B, T, Cin] with a baked weight viewed as [N, K, Cin] (N = phases ·
    cout); returns (out, pre or None), both [B, tout · phases, cout]. `config` skips autotuning (the interpreter
    tests use it: the autotuner's benchmark needs a GPU); `out`/`pre` are preallocated outputs (tests poison them
    to see that every element is written); `scratch` = (workspace, counters) of split-K launches given by the
    caller (tests: the counters must come back zeroed)."""
    x, w, bias, residual, scale, shift, alpha, inv_beta = _contiguous(
        x, w, bias, residual, scale, shift, alpha, inv_beta
    )
    B, T, Cin = x.shape
    N, ksize = w.shape[0], w.shape[1]
    phases = N // cout
    if out is None:
        out = torch.empty((B, tout * phases, cout), dtype=out_dtype or x.dtype, device=x.device)
    if pre is None and write_pre:
        pre = torch.empty((B, tout * phases, cout), dtype=x.dtype, device=x.device)
    # one check per bound: `a and b` of symbolic sizes would guard on each of them
    for fits in (Cin * T < 2**31, N * tout < 2**31, N * ksize * Cin < 2**31):
        torch._check(fits, lambda: "per-sample tensor too large")
    # split-K scratch: fp32 partials for the largest split this shape may be tuned to, and one arrival counter per
    # output tile (an upper bound for every tile size; zeroed here, reset by the kernel after use)
    block_r = config.block_r if config is not None else gemm_kernel_configs(x.dtype)[0].block_r
    splits = (
        config.split_k
        if config is not None
        else max_split(
            batch=size_hint(B),
            tout=size_hint(tout),
            n=size_hint(N),
            cin=size_hint(Cin),
            ksize=size_hint(ksize),
            block_r=block_r,
        )
    )
    if scratch is not None:
        ws, cnt = scratch
    elif splits > 1:
        ws = torch.empty((splits * B * tout * N,), dtype=torch.float32, device=x.device)
        cnt = torch.zeros((B * triton.cdiv(tout, 16) * triton.cdiv(N, 16),), dtype=torch.int32, device=x.device)
    else:
        ws, cnt = out, out
    meta = dict(
        HAS_PHASES=phases > 1,
        JOINT_R=joint_reduction(size_hint(Cin)),
        HAS_BIAS=bias is not None,
        HAS_RES=residual is not None,
        HAS_AFFINE=scale is not None,
        WRITE_PRE=write_pre,
        PRECISION=precision if x.dtype == torch.float32 else "ieee",
        UPCAST_DOT=x.device.type != "cuda",
        **_flags(x, act),
    )
    args = (
        x,
        w,
        x if bias is None else bias,
        x if residual is None else residual,
        x if scale is None else scale,
        x if shift is None else shift,
        x if alpha is None else alpha,
        x if inv_beta is None else inv_beta,
        out,
        out if pre is None else pre,
        ws,
        cnt,
        B,
        T,
        Cin,
        tout,
        N,
        cout,
        ksize,
        dilation,
        stride,
        pad,
    )

    def grid(m):
        return (triton.cdiv(tout, m["BLOCK_T"]) * triton.cdiv(N, m["BLOCK_N"]) * m["SPLIT_K"], B)

    if config is None:
        kernel = _conv_gemm_32 if x.dtype == torch.float32 else _conv_gemm_16
        wrap(kernel)[grid](*args, **meta)
    else:
        _conv_gemm_jit[grid(config.meta())](
            *args, **meta, **config.meta(), num_warps=config.num_warps, num_stages=config.num_stages
        )
    return out, pre


def launch_dwconv(
    x: torch.Tensor,
    w: torch.Tensor,
    bias,
    residual,
    scale,
    shift,
    alpha,
    inv_beta,
    *,
    tout: int,
    dilation: int,
    pad: int,
    act: str,
    out_dtype,
    wrap=lambda k: k,
    config: DwKernelConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [B, T, C], w [K, C] → [B, tout, C]."""
    x, w, bias, residual, scale, shift, alpha, inv_beta = _contiguous(
        x, w, bias, residual, scale, shift, alpha, inv_beta
    )
    B, T, C = x.shape
    if out is None:
        out = torch.empty((B, tout, C), dtype=out_dtype or x.dtype, device=x.device)
    torch._check(C * T < 2**31, lambda: "per-sample tensor too large")
    torch._check(C * tout < 2**31, lambda: "per-sample tensor too large")
    meta = dict(
        HAS_BIAS=bias is not None,
        HAS_RES=residual is not None,
        HAS_AFFINE=scale is not None,
        WRITE_PRE=False,
        **_flags(x, act),
    )
    args = (
        x,
        w,
        x if bias is None else bias,
        x if residual is None else residual,
        x if scale is None else scale,
        x if shift is None else shift,
        x if alpha is None else alpha,
        x if inv_beta is None else inv_beta,
        out,
        out,
        B,
        T,
        C,
        tout,
        w.shape[0],
        dilation,
        pad,
    )

    def grid(m):
        return (triton.cdiv(tout, m["BLOCK_T"]), triton.cdiv(C, m["BLOCK_C"]), B)

    if config is None:
        wrap(_dwconv_tuned)[grid](*args, **meta)
    else:
        _dwconv_jit[grid(config.meta())](*args, **meta, **config.meta(), num_warps=config.num_warps)
    return out


# ------------------------------------------------------------------------------------------ op bodies
def conv1d_forward(
    x,
    weight,
    bias,
    residual,
    scale,
    shift,
    alpha,
    inv_beta,
    stride: int,
    dilation: int,
    left_pad: int,
    act: str,
    out_dtype,
    precision: str,
    write_pre: bool,
    wrap=lambda k: k,
    config: ConvKernelConfig | None = None,
    out=None,
    pre=None,
):
    """Shared body of ttsaot::conv1d(_dual): (pre, out) with pre None unless write_pre. With `config` the kernel
    runs on any device (CPU: TRITON_INTERPRET=1) into the optional preallocated `out`/`pre`."""
    Cout, K, tout = _check_conv1d(x, weight, stride, dilation, left_pad)
    _check_epilogue(
        x, Cout, (x.shape[0], tout, Cout), bias, residual, scale, shift, alpha, inv_beta, act, out_dtype, precision
    )
    if x.device.type != "cuda" and config is None:
        pre, out = _conv1d_ref_impl(
            x, weight, bias, residual, scale, shift, alpha, inv_beta, stride, dilation, left_pad, act, out_dtype
        )
        return (pre if write_pre else None), out
    out, pre = launch_conv_gemm(
        x,
        weight,
        bias,
        residual,
        scale,
        shift,
        alpha,
        inv_beta,
        cout=Cout,
        tout=tout,
        stride=stride,
        dilation=dilation,
        pad=left_pad,
        act=act,
        write_pre=write_pre,
        out_dtype=out_dtype,
        precision=precision,
        wrap=wrap,
        config=config,
        out=out,
        pre=pre,
    )
    return pre, out


def conv_transpose1d_forward(
    x,
    weight,
    bias,
    residual,
    scale,
    shift,
    alpha,
    inv_beta,
    act: str,
    out_dtype,
    precision: str,
    write_pre: bool,
    wrap=lambda k: k,
    config: ConvKernelConfig | None = None,
    out=None,
    pre=None,
):
    s, Cout, M, Cin = _check_conv_transpose1d(x, weight)
    T = x.shape[1]
    _check_epilogue(
        x, Cout, (x.shape[0], T * s, Cout), bias, residual, scale, shift, alpha, inv_beta, act, out_dtype, precision
    )
    if x.device.type != "cuda" and config is None:
        pre, out = _conv_transpose1d_ref_impl(x, weight, bias, residual, scale, shift, alpha, inv_beta, act, out_dtype)
        return (pre if write_pre else None), out
    out, pre = launch_conv_gemm(
        x,
        weight.reshape(s * Cout, M, Cin),
        bias,
        residual,
        scale,
        shift,
        alpha,
        inv_beta,
        cout=Cout,
        tout=T,
        stride=1,
        dilation=1,
        pad=M - 1,
        act=act,
        write_pre=write_pre,
        out_dtype=out_dtype,
        precision=precision,
        wrap=wrap,
        config=config,
        out=out,
        pre=pre,
    )
    return pre, out


def dwconv1d_forward(
    x,
    weight,
    bias,
    residual,
    scale,
    shift,
    alpha,
    inv_beta,
    dilation: int,
    left_pad: int,
    act: str,
    out_dtype,
    wrap=lambda k: k,
    config: DwKernelConfig | None = None,
    out=None,
):
    tout = _check_dwconv1d(x, weight, dilation, left_pad)
    C = x.shape[2]
    _check_epilogue(x, C, (x.shape[0], tout, C), bias, residual, scale, shift, alpha, inv_beta, act, out_dtype, "ieee")
    if x.device.type != "cuda" and config is None:
        return dwconv1d_reference(
            x, weight, bias, residual, scale, shift, alpha, inv_beta, dilation, left_pad, act, out_dtype
        )
    return launch_dwconv(
        x,
        weight,
        bias,
        residual,
        scale,
        shift,
        alpha,
        inv_beta,
        tout=tout,
        dilation=dilation,
        pad=left_pad,
        act=act,
        out_dtype=out_dtype,
        wrap=wrap,
        config=config,
        out=out,
    )


# ------------------------------------------------------------------------------------------ registration
Tensor = torch.Tensor
OptTensor = torch.Tensor | None

if HAVE_TRITON:
    _wrap = torch.library.wrap_triton

    def _op(name: str):
        return torch.library.triton_op(f"ttsaot::{name}", mutates_args=())
else:  # CPU-only installs: the same names and schemas as plain custom ops (their fake is the same function)

    def _wrap(k):
        raise RuntimeError("conv kernels need Triton and CUDA")

    def _op(name: str):
        def deco(fn):
            op = torch.library.custom_op(f"ttsaot::{name}", mutates_args=())(fn)
            op.register_fake(fn)
            return op

        return deco


@_op("conv1d")
def conv1d(
    x: Tensor,
    weight: Tensor,
    bias: OptTensor,
    residual: OptTensor,
    scale: OptTensor,
    shift: OptTensor,
    alpha: OptTensor,
    inv_beta: OptTensor,
    stride: int,
    dilation: int,
    left_pad: int,
    act: str,
    out_dtype: torch.dtype | None,
    precision: str,
) -> Tensor:
    return conv1d_forward(
        x,
        weight,
        bias,
        residual,
        scale,
        shift,
        alpha,
        inv_beta,
        stride,
        dilation,
        left_pad,
        act,
        out_dtype,
        precision,
        False,
        wrap=_wrap,
    )[1]


@_op("conv1d_dual")
def conv1d_dual(
    x: Tensor,
    weight: Tensor,
    bias: OptTensor,
    residual: OptTensor,
    scale: OptTensor,
    shift: OptTensor,
    alpha: OptTensor,
    inv_beta: OptTensor,
    stride: int,
    dilation: int,
    left_pad: int,
    act: str,
    out_dtype: torch.dtype | None,
    precision: str,
) -> tuple[Tensor, Tensor]:
    return conv1d_forward(
        x,
        weight,
        bias,
        residual,
        scale,
        shift,
        alpha,
        inv_beta,
        stride,
        dilation,
        left_pad,
        act,
        out_dtype,
        precision,
        True,
        wrap=_wrap,
    )


@_op("conv_transpose1d")
def conv_transpose1d(
    x: Tensor,
    weight: Tensor,
    bias: OptTensor,
    residual: OptTensor,
    scale: OptTensor,
    shift: OptTensor,
    alpha: OptTensor,
    inv_beta: OptTensor,
    act: str,
    out_dtype: torch.dtype | None,
    precision: str,
) -> Tensor:
    return conv_transpose1d_forward(
        x, weight, bias, residual, scale, shift, alpha, inv_beta, act, out_dtype, precision, False, wrap=_wrap
    )[1]


@_op("conv_transpose1d_dual")
def conv_transpose1d_dual(
    x: Tensor,
    weight: Tensor,
    bias: OptTensor,
    residual: OptTensor,
    scale: OptTensor,
    shift: OptTensor,
    alpha: OptTensor,
    inv_beta: OptTensor,
    act: str,
    out_dtype: torch.dtype | None,
    precision: str,
) -> tuple[Tensor, Tensor]:
    return conv_transpose1d_forward(
        x, weight, bias, residual, scale, shift, alpha, inv_beta, act, out_dtype, precision, True, wrap=_wrap
    )


@_op("dwconv1d")
def dwconv1d(
    x: Tensor,
    weight: Tensor,
    bias: OptTensor,
    residual: OptTensor,
    scale: OptTensor,
    shift: OptTensor,
    alpha: OptTensor,
    inv_beta: OptTensor,
    dilation: int,
    left_pad: int,
    act: str,
    out_dtype: torch.dtype | None,
) -> Tensor:
    return dwconv1d_forward(
        x, weight, bias, residual, scale, shift, alpha, inv_beta, dilation, left_pad, act, out_dtype, wrap=_wrap
    )


# Target-specific lowering (export.py for CPU builds, onnx_export.py as ONNX decompositions): exact aten forms, in
# the one table every kernel module registers into (decompositions.py).
for _op, _ref in (
    (torch.ops.ttsaot.conv1d.default, conv1d_reference),
    (torch.ops.ttsaot.conv1d_dual.default, conv1d_dual_reference),
    (torch.ops.ttsaot.conv_transpose1d.default, conv_transpose1d_reference),
    (torch.ops.ttsaot.conv_transpose1d_dual.default, conv_transpose1d_dual_reference),
    (torch.ops.ttsaot.dwconv1d.default, dwconv1d_reference),
):
    register_cpu_decomposition(_op, _ref)


# ------------------------------------------------------------------------------------------ bake (build time)
@dataclass(frozen=True)
class ConvMeta:
    """What `ttsaot::conv1d` needs besides the tensors."""

    cin: int
    cout: int
    kernel_size: int
    stride: int
    dilation: int
    left_pad: int

    def out_len(self, T: int) -> int:
        return causal_out_len(T, self.kernel_size, self.stride, self.dilation, self.left_pad)


def _conv_parts(conv) -> tuple[torch.nn.Conv1d, int]:
    """(the nn.Conv1d, its causal left pad) of layers.conv.CausalConv1d (conv under `.conv`, right pad to whole
    strides) or of a Conv1d subclass carrying `left_pad` (VoxCPM2's CausalConv1d, stride 1, no right pad:
    both follow causal_out_len)."""
    inner = getattr(conv, "conv", conv)
    if not isinstance(inner, torch.nn.Conv1d):
        raise ConvBakeError(f"{type(conv).__name__}: not a causal Conv1d")
    if not hasattr(conv, "left_pad"):
        raise ConvBakeError(f"{type(conv).__name__}: no `left_pad` (not a causal conv)")
    if isinstance(inner.padding, str) or inner.padding[0] != 0 or inner.padding_mode != "zeros":
        raise ConvBakeError(f"{type(conv).__name__}: the inner conv must not pad (causal padding is explicit)")
    if conv is inner and inner.stride[0] != 1:
        raise ConvBakeError(f"{type(conv).__name__}: a strided conv without CausalConv1d's right-pad rule")
    return inner, int(conv.left_pad)


def bake_conv1d(conv) -> tuple[torch.Tensor, torch.Tensor | None, ConvMeta]:
    """(weight [Cout, K, Cin], bias, meta) for `ttsaot::conv1d`."""
    inner, left = _conv_parts(conv)
    if inner.groups != 1:
        raise ConvBakeError(f"groups={inner.groups}: use bake_dwconv1d for depthwise convs")
    w = inner.weight.detach()
    cout, cin, k = w.shape
    bias = None if inner.bias is None else inner.bias.detach().clone()
    return (w.permute(0, 2, 1).contiguous(), bias, ConvMeta(cin, cout, k, inner.stride[0], inner.dilation[0], left))


def bake_conv_transpose1d(conv) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """(weight [s, Cout, M, Cin], bias, stride) of layers.conv.CausalConvTranspose1d or a ConvTranspose1d
    subclass carrying `trim`; the trim must be K − s (exactly T·s outputs). K is zero-padded to M·s."""
    inner = getattr(conv, "conv", conv)
    if not isinstance(inner, torch.nn.ConvTranspose1d):
        raise ConvBakeError(f"{type(conv).__name__}: not a ConvTranspose1d")
    k, s = inner.kernel_size[0], inner.stride[0]
    if inner.groups != 1 or inner.dilation[0] != 1 or inner.padding[0] != 0 or inner.output_padding[0] != 0:
        raise ConvBakeError("conv_transpose1d: groups/dilation/padding/output_padding must be the defaults")
    if k < s or getattr(conv, "trim", None) != k - s:
        raise ConvBakeError(
            f"conv_transpose1d: kernel {k}, stride {s}, trim {getattr(conv, 'trim', None)}: "
            "only the causal form (trim = kernel − stride ≥ 0) is supported"
        )
    w = inner.weight.detach()  # [Cin, Cout, K]
    cin, cout, _ = w.shape
    m = -(-k // s)
    w = F.pad(w, (0, m * s - k))
    wb = w.view(cin, cout, m, s).flip(2).permute(3, 1, 2, 0).contiguous()
    bias = None if inner.bias is None else inner.bias.detach().clone()
    return wb, bias, s


def bake_dwconv1d(conv) -> tuple[torch.Tensor, torch.Tensor | None, int, int]:
    """(weight [K, C], bias, dilation, left_pad) of a causal depthwise conv: a CausalConv1d / Conv1d-with-left_pad
    with groups = channels, or passes.conv.ShiftDepthwiseConv1d."""
    if (
        hasattr(conv, "weight")
        and hasattr(conv, "kernel")
        and hasattr(conv, "dilation")
        and not isinstance(conv, torch.nn.Conv1d)
    ):  # ShiftDepthwiseConv1d
        w, b, dil, left = conv.weight, conv.bias, conv.dilation, conv.left_pad
    else:
        inner, left = _conv_parts(conv)
        if not (inner.groups == inner.in_channels == inner.out_channels) or inner.stride[0] != 1:
            raise ConvBakeError("dwconv1d: groups must equal the channel count, stride 1")
        w, b, dil = inner.weight, inner.bias, inner.dilation[0]
    return (w.detach()[:, 0, :].t().contiguous(), None if b is None else b.detach().clone(), int(dil), int(left))


__all__ = [
    "ACTS",
    "CPU_DECOMPOSITIONS",
    "DW_CONFIGS",
    "FP32_MAX_TILE",
    "GEMM_TILES",
    "LAYOUT",
    "MAX_TUNED_CONFIGS",
    "JOINT_REDUCTION_MAX_CIN",
    "TUNED_CONFIGS",
    "OPS",
    "PRECISIONS",
    "SPLITS",
    "SPLIT_WS_BYTES",
    "TF32X3_MAX_SIDE",
    "ConvBakeError",
    "ConvKernelConfig",
    "ConvMeta",
    "DwKernelConfig",
    "bake_conv1d",
    "bake_conv_transpose1d",
    "bake_dwconv1d",
    "causal_out_len",
    "conv1d",
    "conv1d_dual",
    "conv1d_dual_reference",
    "conv1d_forward",
    "conv1d_reference",
    "conv_transpose1d",
    "conv_transpose1d_dual",
    "conv_transpose1d_dual_reference",
    "conv_transpose1d_forward",
    "conv_transpose1d_reference",
    "dwconv1d",
    "dwconv1d_forward",
    "dwconv1d_reference",
    "estimate_us",
    "gemm_kernel_configs",
    "launch_conv_gemm",
    "launch_dwconv",
    "max_split",
    "one_step",
    "prune_dw_configs",
    "prune_gemm_configs",
    "round_to_tf32",
    "unbake_conv_transpose1d",
]
