"""Codec convolutions as Triton implicit GEMMs in NCL layout, with the bias/residual/affine/activation epilogue
fused into the single pass over each output tile.

Ops (each one node under torch.export, embedded in the AOTI package on CUDA, an exact aten reference on CPU):

- `ttsaot::conv1d`            causal (or any left-padded) Conv1d, groups = 1, any kernel/stride/dilation;
- `ttsaot::conv1d_dual`       the same, returning (pre, act): the residual stream and the next conv's input;
- `ttsaot::conv_transpose1d`  CausalConvTranspose1d (K a multiple of the stride after zero-padding, tail trimmed:
                              exactly T·stride outputs) as a polyphase GEMM;
- `ttsaot::conv_transpose1d_dual`;
- `ttsaot::dwconv1d`          depthwise causal conv (stride 1) with the same epilogue (VoxCPM2's residual units).

Layouts. Activations are [B, C, T] contiguous everywhere (no layout conversion). Weights are baked once at build
time into the GEMM's A operand [rows, R] (`bake_*`):
- conv1d, tap-major:     [Cout, K, Cin]  (reduction index r = j·Cin + ci; chosen for stride 1: a block of rows is
                          one tap over consecutive channels, so each row of the X tile is one contiguous run of x);
- conv1d, channel-major: [Cout, Cin, K]  (PyTorch's own layout, r = ci·K + j; chosen for stride > 1: the rows of a
                          block tile x densely, where tap-major rows would each read every stride-th sample);
- conv_transpose1d:      [Cout, s, M, Cin] with M = ceil(K/s): out[b, co, t·s + p] = Σ_j Σ_ci Wb[co, p, j, ci] ·
                          x[b, ci, t + j − (M − 1)], i.e. the transposed conv is a causal stride-1 conv with M taps and
                          Cout·s output rows whose row (co, p) is written at time t·s + p;
- dwconv1d:              [C, K].

Epilogue, in this order, everything in fp32 registers, rounded to the compute dtype c (= x.dtype) exactly where
the eager module chain rounds, so a bf16 stage keeps its eager numerics up to the accumulation order:
  v = c(acc + bias) → v = c(v + residual) → v = c(c(v · scale) + shift) → pre = v
  → act: snake v + inv_beta·sin²(alpha·v) | tanh | clamp to [−1, 1] | none → c(·) → cast to out_dtype.
SnakeBeta uses the same math as `ttsaot::snake_beta` (fast sin.approx for 16-bit outputs on CUDA). `_dual` ops
also return `pre` (dtype c).

Precision (fp32 inputs only; 16-bit inputs always multiply on the tensor cores with fp32 accumulation):
`precision` = "ieee" (FMA, exact fp32 products), "tf32" (tensor cores, ~1e-3 relative), "tf32x3" (three TF32
products with error compensation, ~fp32 accuracy on tensor cores). The CPU reference is always exact fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .snake_beta import HAVE_TRITON, snake_beta_reference

OPS = ("conv1d", "conv1d_dual", "conv_transpose1d", "conv_transpose1d_dual", "dwconv1d")
ACTS = ("none", "snake", "tanh", "clamp")
PRECISIONS = ("ieee", "tf32", "tf32x3")
_ACT_CODE = {a: i for i, a in enumerate(ACTS)}
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from .snake_beta import _fast_sin


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
def _finish_c(acc: torch.Tensor, residual, scale, shift, alpha, inv_beta, act: str, out_dtype, c) -> tuple:
    """The epilogue in aten ops on the fp32 conv result (bias included), rounding to the compute dtype `c` where
    the kernel does; returns (pre, out)."""
    v = acc.to(c)
    if residual is not None:
        v = (v.float() + residual.float()).to(c)
    if scale is not None:
        v = (v.float() * scale.float().view(1, -1, 1)).to(c)
        v = (v.float() + shift.float().view(1, -1, 1)).to(c)
    pre = v
    if act == "snake":
        y = snake_beta_reference(v, alpha, inv_beta)
    elif act == "tanh":
        y = torch.tanh(v.float()).to(c)
    elif act == "clamp":
        y = v.clamp(-1.0, 1.0)
    else:
        y = v
    return pre, y.to(out_dtype if out_dtype is not None else c)


def _conv1d_ref_impl(x, weight, bias, residual, scale, shift, alpha, inv_beta, kernel_size, stride, dilation,
                     left_pad, tap_major, act, out_dtype):
    w = weight.permute(0, 2, 1) if tap_major else weight              # → [Cout, Cin, K]
    T = x.shape[-1]
    xp = F.pad(x.float(), (left_pad, _right_pad(T, kernel_size, stride, dilation, left_pad)))
    acc = F.conv1d(xp, w.float(), None if bias is None else bias.float(), stride=stride, dilation=dilation)
    return _finish_c(acc, residual, scale, shift, alpha, inv_beta, act, out_dtype, x.dtype)


def conv1d_reference(x, weight, bias, residual, scale, shift, alpha, inv_beta, kernel_size: int, stride: int,
                     dilation: int, left_pad: int, tap_major: bool, act: str, out_dtype, precision: str):
    """Exact fp32 (products and sums) aten form of `ttsaot::conv1d`; also its CPU/ONNX decomposition."""
    return _conv1d_ref_impl(x, weight, bias, residual, scale, shift, alpha, inv_beta, kernel_size, stride,
                            dilation, left_pad, tap_major, act, out_dtype)[1]


def conv1d_dual_reference(x, weight, bias, residual, scale, shift, alpha, inv_beta, kernel_size: int, stride: int,
                          dilation: int, left_pad: int, tap_major: bool, act: str, out_dtype, precision: str):
    return _conv1d_ref_impl(x, weight, bias, residual, scale, shift, alpha, inv_beta, kernel_size, stride,
                            dilation, left_pad, tap_major, act, out_dtype)


def unbake_conv_transpose1d(weight: torch.Tensor) -> torch.Tensor:
    """[Cout, s, M, Cin] → the ConvTranspose1d weight [Cin, Cout, M·s] (zero-padded taps included)."""
    Cout, s, M, Cin = weight.shape
    return weight.flip(2).permute(3, 0, 2, 1).reshape(Cin, Cout, M * s)


def _conv_transpose1d_ref_impl(x, weight, bias, residual, scale, shift, alpha, inv_beta, act, out_dtype):
    s = weight.shape[1]
    T = x.shape[-1]
    acc = F.conv_transpose1d(x.float(), unbake_conv_transpose1d(weight).float(),
                             None if bias is None else bias.float(), stride=s)
    return _finish_c(acc[..., : T * s], residual, scale, shift, alpha, inv_beta, act, out_dtype, x.dtype)


def conv_transpose1d_reference(x, weight, bias, residual, scale, shift, alpha, inv_beta, act: str, out_dtype,
                               precision: str):
    return _conv_transpose1d_ref_impl(x, weight, bias, residual, scale, shift, alpha, inv_beta, act, out_dtype)[1]


def conv_transpose1d_dual_reference(x, weight, bias, residual, scale, shift, alpha, inv_beta, act: str, out_dtype,
                                    precision: str):
    return _conv_transpose1d_ref_impl(x, weight, bias, residual, scale, shift, alpha, inv_beta, act, out_dtype)


def dwconv1d_reference(x, weight, bias, residual, scale, shift, alpha, inv_beta, dilation: int, left_pad: int,
                       act: str, out_dtype):
    C, K = weight.shape
    T = x.shape[-1]
    xp = F.pad(x.float(), (left_pad, _right_pad(T, K, 1, dilation, left_pad)))
    acc = F.conv1d(xp, weight.float().unsqueeze(1), None if bias is None else bias.float(), dilation=dilation,
                   groups=C)
    return _finish_c(acc, residual, scale, shift, alpha, inv_beta, act, out_dtype, x.dtype)[1]


# ------------------------------------------------------------------------------------------ checks
def _check_epilogue(x, cout: int, out_shape, bias, residual, scale, shift, alpha, inv_beta, act, out_dtype,
                    precision) -> None:
    torch._check(x.dtype in _DTYPES, lambda: f"conv kernels take fp32/bf16/fp16 inputs, got {x.dtype}")
    torch._check(act in ACTS, lambda: f"act must be one of {ACTS}, got {act!r}")
    torch._check(precision in PRECISIONS, lambda: f"precision must be one of {PRECISIONS}, got {precision!r}")
    torch._check(out_dtype is None or out_dtype in _DTYPES, lambda: f"unsupported out_dtype {out_dtype}")
    if bias is not None:
        torch._check(tuple(bias.shape) == (cout,), lambda: f"bias must be [{cout}], got {tuple(bias.shape)}")
    if residual is not None:
        torch._check(tuple(residual.shape) == tuple(out_shape),
                     lambda: f"residual must have the output shape {tuple(out_shape)}, got {tuple(residual.shape)}")
        torch._check(residual.dtype == x.dtype, lambda: "residual must have the input's dtype")
    torch._check((scale is None) == (shift is None), lambda: "scale and shift come together")
    if scale is not None:
        torch._check(tuple(scale.shape) == (cout,) and tuple(shift.shape) == (cout,),
                     lambda: f"scale and shift must be [{cout}]")
    if act == "snake":
        torch._check(alpha is not None and inv_beta is not None, lambda: "act='snake' needs alpha and inv_beta")
        torch._check(tuple(alpha.shape) == (cout,) and tuple(inv_beta.shape) == (cout,),
                     lambda: f"alpha and inv_beta must be [{cout}]")


def _check_conv1d(x, weight, kernel_size, stride, dilation, left_pad, tap_major) -> tuple[int, int, int]:
    torch._check(x.dim() == 3, lambda: f"conv1d expects x [B,Cin,T], got {tuple(x.shape)}")
    torch._check(weight.dim() == 3, lambda: "conv1d expects a baked weight [Cout,K,Cin] or [Cout,Cin,K]")
    torch._check(weight.dtype == x.dtype, lambda: f"weight dtype {weight.dtype} != input dtype {x.dtype}")
    torch._check(kernel_size >= 1 and stride >= 1 and dilation >= 1 and left_pad >= 0,
                 lambda: "kernel_size, stride, dilation ≥ 1 and left_pad ≥ 0")
    Cout = weight.shape[0]
    Cin, K = (weight.shape[2], weight.shape[1]) if tap_major else (weight.shape[1], weight.shape[2])
    torch._check(K == kernel_size, lambda: f"weight has {K} taps, kernel_size is {kernel_size}")
    torch._check(Cin == x.shape[1], lambda: f"weight expects {Cin} input channels, x has {x.shape[1]}")
    tout = causal_out_len(x.shape[2], kernel_size, stride, dilation, left_pad)
    torch._check(tout >= 1, lambda: "input shorter than one output window")
    return Cout, Cin, tout


def _check_conv_transpose1d(x, weight) -> tuple[int, int, int, int]:
    torch._check(x.dim() == 3, lambda: f"conv_transpose1d expects x [B,Cin,T], got {tuple(x.shape)}")
    torch._check(weight.dim() == 4, lambda: "conv_transpose1d expects a baked weight [Cout,stride,M,Cin]")
    torch._check(weight.dtype == x.dtype, lambda: f"weight dtype {weight.dtype} != input dtype {x.dtype}")
    Cout, s, M, Cin = weight.shape
    torch._check(Cin == x.shape[1], lambda: f"weight expects {Cin} input channels, x has {x.shape[1]}")
    return Cout, s, M, Cin


def _check_dwconv1d(x, weight, dilation, left_pad) -> int:
    torch._check(x.dim() == 3, lambda: f"dwconv1d expects x [B,C,T], got {tuple(x.shape)}")
    torch._check(weight.dim() == 2 and weight.shape[0] == x.shape[1], lambda: "dwconv1d expects a weight [C,K]")
    torch._check(weight.dtype == x.dtype, lambda: f"weight dtype {weight.dtype} != input dtype {x.dtype}")
    torch._check(dilation >= 1 and left_pad >= 0, lambda: "dilation ≥ 1 and left_pad ≥ 0")
    tout = causal_out_len(x.shape[2], weight.shape[1], 1, dilation, left_pad)
    torch._check(tout >= 1, lambda: "input shorter than one output window")
    return tout


# ------------------------------------------------------------------------------------------ kernels
@dataclass(frozen=True)
class ConvKernelConfig:
    """One tile configuration: skips autotuning (TRITON_INTERPRET tests, benchmarks of a given config).
    block_m: output rows (channels·phases), block_n: output times, block_r: reduction (taps·channels)."""

    block_m: int = 64
    block_n: int = 64
    block_r: int = 32
    num_warps: int = 4
    num_stages: int = 3

    def meta(self) -> dict[str, int]:
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_R": self.block_r}


@dataclass(frozen=True)
class DwKernelConfig:
    block_c: int = 16
    block_t: int = 256
    num_warps: int = 4


DW_CONFIGS = (DwKernelConfig(8, 512, 4), DwKernelConfig(16, 256, 4), DwKernelConfig(32, 256, 8))


# (BLOCK_M, BLOCK_N, warps): wgmma-sized tiles for wide layers, smaller ones for short inputs (50-frame buckets
# at B=1 give few time tiles), 16-row tiles for the single-channel output conv.
GEMM_TILES = ((128, 128, 8), (128, 64, 4), (64, 128, 4), (64, 64, 4), (16, 256, 4))


def gemm_kernel_configs(dtype: torch.dtype) -> list[ConvKernelConfig]:
    """The autotuning space. fp32 tiles take twice the shared memory per pipeline stage: shorter reduction
    block, one stage fewer."""
    block_r, stages = (32, 3) if dtype == torch.float32 else (64, 4)
    return [ConvKernelConfig(m, n, block_r, w, stages) for m, n, w in GEMM_TILES]


def prune_gemm_configs(configs: list[ConvKernelConfig], rows: int, tout: int) -> list[ConvKernelConfig]:
    """Drop tiles much larger than the problem (a 1-channel output, a 50-frame input); keep at least one."""
    def pow2(n: int) -> int:
        return 1 << max(0, (n - 1).bit_length())

    keep = [c for c in configs
            if (c.block_m == 16) == (rows <= 16)
            and c.block_m <= max(16, pow2(rows)) and c.block_n <= max(64, pow2(tout))]
    return keep or [min(configs, key=lambda c: c.block_m * c.block_n)]


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
    def _epilogue_store(v, ch, ch_ok, off, omask, res_ptr, scale_ptr, shift_ptr, alpha_ptr, ib_ptr, out_ptr,
                        pre_ptr, CDT: tl.constexpr, HAS_RES: tl.constexpr, HAS_AFFINE: tl.constexpr,
                        ACT: tl.constexpr, WRITE_PRE: tl.constexpr, FAST_SIN: tl.constexpr,
                        GPU_MATH: tl.constexpr, EMULATE_RNE: tl.constexpr):
        # v: fp32 conv result (bias added, already rounded to CDT); ch: per-row channel; off: output offsets.
        if HAS_RES:
            r = tl.load(res_ptr + off, mask=omask, other=0.0).to(tl.float32)
            v = _round(v + r, CDT, EMULATE_RNE)
        if HAS_AFFINE:
            sc = tl.load(scale_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)
            sh = tl.load(shift_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)
            v = _round(v * sc[:, None], CDT, EMULATE_RNE)
            v = _round(v + sh[:, None], CDT, EMULATE_RNE)
        if WRITE_PRE:
            tl.store(pre_ptr + off, v.to(CDT), mask=omask)
        if ACT == 1:  # SnakeBeta, the math of ttsaot::snake_beta
            a = tl.load(alpha_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)
            ib = tl.load(ib_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)
            if FAST_SIN:
                s = _fast_sin(v * a[:, None])
            else:
                s = tl.sin(v * a[:, None])
            v = v + ib[:, None] * s * s
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
    def _conv_gemm_jit(x_ptr, w_ptr, bias_ptr, res_ptr, scale_ptr, shift_ptr, alpha_ptr, ib_ptr, out_ptr, pre_ptr,
                       B, Cin, T, ROWS, TOUT, R, KSIZE, DIL, STRIDE, PAD, PHASES,
                       TAP_MAJOR: tl.constexpr, POINTWISE: tl.constexpr, TAP_BLOCKED: tl.constexpr,
                       X_NLC: tl.constexpr, HAS_BIAS: tl.constexpr,
                       HAS_RES: tl.constexpr, HAS_AFFINE: tl.constexpr, ACT: tl.constexpr,
                       WRITE_PRE: tl.constexpr, PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
                       FAST_SIN: tl.constexpr, GPU_MATH: tl.constexpr, EMULATE_RNE: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
        # out[rows, cols] = W[rows, R] @ X[R, cols] with X[(j, ci), t] = x[ci, t·STRIDE + j·DIL − PAD] (zero
        # outside [0, T)): an implicit GEMM whose B tile is gathered straight from the NCL input, each of its
        # rows a contiguous run of x along time. Time tiles are the fastest grid axis so that programs running
        # together share their weight tile in L2.
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        b = tl.program_id(2).to(tl.int64)
        CDT: tl.constexpr = x_ptr.dtype.element_ty
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.max_contiguous(tl.multiple_of(cols, BLOCK_N), BLOCK_N)
        row_ok = rows < ROWS
        x_b = x_ptr + b * Cin * T
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for r0 in tl.range(0, R, BLOCK_R):
            rr = r0 + tl.arange(0, BLOCK_R)
            r_ok = rr < R
            w = tl.load(w_ptr + rows[:, None] * R + rr[None, :], mask=row_ok[:, None] & r_ok[None, :], other=0.0)
            if POINTWISE:
                xm = r_ok[:, None] & (cols < T)[None, :]
                if X_NLC:
                    xv = tl.load(x_b + rr[:, None] + cols[None, :] * Cin, mask=xm, other=0.0)
                else:
                    xv = tl.load(x_b + rr[:, None] * T + cols[None, :], mask=xm, other=0.0)
            elif TAP_BLOCKED:
                # Cin is a multiple of BLOCK_R: the block is one tap over consecutive channels, so the shift and
                # the padding mask are per column only.
                j = r0 // Cin
                ci = r0 - j * Cin + tl.arange(0, BLOCK_R)
                tin = cols * STRIDE + (j * DIL - PAD)
                xm = ((tin >= 0) & (tin < T))[None, :]
                if X_NLC:
                    xv = tl.load(x_b + ci[:, None] + tin[None, :] * Cin, mask=xm, other=0.0)
                else:
                    xv = tl.load(x_b + ci[:, None] * T + tin[None, :], mask=xm, other=0.0)
            else:
                if TAP_MAJOR:
                    j = rr // Cin
                    ci = rr - j * Cin
                else:
                    ci = rr // KSIZE
                    j = rr - ci * KSIZE
                tin = cols[None, :] * STRIDE + (j * DIL - PAD)[:, None]
                xm = r_ok[:, None] & (tin >= 0) & (tin < T)
                if X_NLC:
                    xv = tl.load(x_b + ci[:, None] + tin * Cin, mask=xm, other=0.0)
                else:
                    xv = tl.load(x_b + ci[:, None] * T + tin, mask=xm, other=0.0)
            if UPCAST_DOT:  # the interpreter multiplies 16-bit dot operands wrongly; upcasting is exact
                w = w.to(tl.float32)
                xv = xv.to(tl.float32)
            acc = tl.dot(w, xv, acc, input_precision=PRECISION)

        co = rows // PHASES
        ph = rows - co * PHASES
        v = acc
        if HAS_BIAS:
            v = v + tl.load(bias_ptr + co, mask=row_ok, other=0.0).to(tl.float32)[:, None]
        v = _round(v, CDT, EMULATE_RNE)
        cout = ROWS // PHASES
        tlen = TOUT * PHASES
        off = b * cout * tlen + (co * tlen + ph)[:, None] + cols[None, :] * PHASES
        omask = row_ok[:, None] & (cols < TOUT)[None, :]
        _epilogue_store(v, co, row_ok, off, omask, res_ptr, scale_ptr, shift_ptr, alpha_ptr, ib_ptr, out_ptr,
                        pre_ptr, CDT, HAS_RES, HAS_AFFINE, ACT, WRITE_PRE, FAST_SIN, GPU_MATH, EMULATE_RNE)

    @triton.jit
    def _dwconv_jit(x_ptr, w_ptr, bias_ptr, res_ptr, scale_ptr, shift_ptr, alpha_ptr, ib_ptr, out_ptr, pre_ptr,
                    C, T, TOUT, KSIZE, DIL, PAD,
                    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, HAS_AFFINE: tl.constexpr, ACT: tl.constexpr,
                    WRITE_PRE: tl.constexpr, FAST_SIN: tl.constexpr, GPU_MATH: tl.constexpr,
                    EMULATE_RNE: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr):
        # Bandwidth-bound: each tap re-reads the (L1-resident) shifted input tile; fp32 accumulation.
        pid_t = tl.program_id(0)
        pid_c = tl.program_id(1)
        b = tl.program_id(2).to(tl.int64)
        CDT: tl.constexpr = x_ptr.dtype.element_ty
        ch = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        cols = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        ch_ok = ch < C
        x_b = x_ptr + b * C * T
        acc = tl.zeros((BLOCK_C, BLOCK_T), dtype=tl.float32)
        for j in range(KSIZE):
            tin = cols + (j * DIL - PAD)
            xm = ch_ok[:, None] & ((tin >= 0) & (tin < T))[None, :]
            xv = tl.load(x_b + ch[:, None] * T + tin[None, :], mask=xm, other=0.0).to(tl.float32)
            wj = tl.load(w_ptr + ch * KSIZE + j, mask=ch_ok, other=0.0).to(tl.float32)
            acc += wj[:, None] * xv
        v = acc
        if HAS_BIAS:
            v = v + tl.load(bias_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)[:, None]
        v = _round(v, CDT, EMULATE_RNE)
        off = b * C * TOUT + ch[:, None] * TOUT + cols[None, :]
        omask = ch_ok[:, None] & (cols < TOUT)[None, :]
        _epilogue_store(v, ch, ch_ok, off, omask, res_ptr, scale_ptr, shift_ptr, alpha_ptr, ib_ptr, out_ptr,
                        pre_ptr, CDT, HAS_RES, HAS_AFFINE, ACT, WRITE_PRE, FAST_SIN, GPU_MATH, EMULATE_RNE)

    def _prune_autotune(configs, named_args, **kwargs):
        by_meta = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]): c for c in configs}
        kept = prune_gemm_configs([ConvKernelConfig(m, n) for m, n in by_meta], named_args["ROWS"],
                                  named_args["TOUT"])
        return [by_meta[(c.block_m, c.block_n)] for c in kept]

    def _triton_configs(dtype: torch.dtype) -> list:
        return [triton.Config(c.meta(), num_warps=c.num_warps, num_stages=c.num_stages)
                for c in gemm_kernel_configs(dtype)]

    _AUTOTUNE_KEY = ["B", "Cin", "T", "ROWS", "TOUT", "R", "KSIZE", "DIL", "STRIDE", "PHASES", "PRECISION"]
    # Tuned per bucket at AOTI compile time on the compile GPU (one config baked into each package).
    _conv_gemm_16 = triton.autotune(configs=_triton_configs(torch.bfloat16), key=_AUTOTUNE_KEY,
                                    prune_configs_by={"early_config_prune": _prune_autotune})(_conv_gemm_jit)
    _conv_gemm_32 = triton.autotune(configs=_triton_configs(torch.float32), key=_AUTOTUNE_KEY,
                                    prune_configs_by={"early_config_prune": _prune_autotune})(_conv_gemm_jit)
    _dwconv_tuned = triton.autotune(
        configs=[triton.Config({"BLOCK_C": c.block_c, "BLOCK_T": c.block_t}, num_warps=c.num_warps)
                 for c in DW_CONFIGS],
        key=["C", "T", "KSIZE", "DIL"])(_dwconv_jit)


def _flags(x: torch.Tensor, act: str) -> dict[str, Any]:
    cuda = x.device.type == "cuda"
    # Off CUDA these kernels only run under TRITON_INTERPRET (tests): no libdevice there, and its float32 →
    # bfloat16 cast truncates, so rounding to nearest even is emulated.
    return {"ACT": _ACT_CODE[act], "FAST_SIN": cuda and act == "snake" and x.dtype != torch.float32,
            "GPU_MATH": cuda, "EMULATE_RNE": not cuda}


def launch_conv_gemm(x: torch.Tensor, w: torch.Tensor, bias, residual, scale, shift, alpha, inv_beta, *,
                     rows: int, tout: int, ksize: int, dilation: int, stride: int, pad: int, phases: int,
                     tap_major: bool, act: str, write_pre: bool, out_dtype, precision: str,
                     wrap=lambda k: k, config: ConvKernelConfig | None = None, out: torch.Tensor | None = None,
                     pre: torch.Tensor | None = None, x_nlc: bool = False):
    """Launch the implicit-GEMM kernel; returns (out, pre or None), out [B, rows/phases, tout·phases].
    `config` skips autotuning (the interpreter tests use it: the autotuner's benchmark needs a GPU); `out`/`pre`
    are preallocated outputs (tests poison them to see that every element is written). `x_nlc`: x is given as
    [B, T, Cin] (an experiment of the benchmark: channel-contiguous loads are aligned whatever the tap shift;
    the ops are NCL)."""
    # the kernel indexes every tensor as contiguous (no-ops under export for the tensors the chains pass)
    x, w = x.contiguous(), w.contiguous()
    bias, residual, scale, shift, alpha, inv_beta = (
        None if t is None else t.contiguous() for t in (bias, residual, scale, shift, alpha, inv_beta))
    B, T, Cin = x.shape if x_nlc else (x.shape[0], x.shape[2], x.shape[1])
    R = w.numel() // rows
    cout = rows // phases
    if out is None:
        out = torch.empty((B, cout, tout * phases), dtype=out_dtype or x.dtype, device=x.device)
    if pre is None and write_pre:
        pre = torch.empty((B, cout, tout * phases), dtype=x.dtype, device=x.device)
    torch._check(Cin * T < 2**31 and cout * tout * phases < 2**31, lambda: "per-sample tensor too large")
    cuda = x.device.type == "cuda"
    pointwise = ksize == 1 and stride == 1 and pad == 0
    block_r = config.block_r if config is not None else gemm_kernel_configs(x.dtype)[0].block_r
    meta = dict(TAP_MAJOR=tap_major, POINTWISE=pointwise,
                TAP_BLOCKED=tap_major and not pointwise and Cin % block_r == 0, X_NLC=x_nlc,
                HAS_BIAS=bias is not None, HAS_RES=residual is not None, HAS_AFFINE=scale is not None,
                WRITE_PRE=write_pre, PRECISION=precision if x.dtype == torch.float32 else "ieee",
                UPCAST_DOT=not cuda, **_flags(x, act))
    args = (x, w, x if bias is None else bias, x if residual is None else residual, x if scale is None else scale,
            x if shift is None else shift, x if alpha is None else alpha, x if inv_beta is None else inv_beta,
            out, out if pre is None else pre, B, Cin, T, rows, tout, R, ksize, dilation, stride, pad, phases)

    def grid(m):
        return (triton.cdiv(tout, m["BLOCK_N"]), triton.cdiv(rows, m["BLOCK_M"]), B)

    if config is None:
        kernel = _conv_gemm_32 if x.dtype == torch.float32 else _conv_gemm_16
        wrap(kernel)[grid](*args, **meta)
    else:
        _conv_gemm_jit[grid(config.meta())](*args, **meta, **config.meta(), num_warps=config.num_warps,
                                            num_stages=config.num_stages)
    return out, pre


def launch_dwconv(x: torch.Tensor, w: torch.Tensor, bias, residual, scale, shift, alpha, inv_beta, *,
                  tout: int, dilation: int, pad: int, act: str, out_dtype, wrap=lambda k: k,
                  config: DwKernelConfig | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    x, w = x.contiguous(), w.contiguous()
    bias, residual, scale, shift, alpha, inv_beta = (
        None if t is None else t.contiguous() for t in (bias, residual, scale, shift, alpha, inv_beta))
    B, C, T = x.shape
    if out is None:
        out = torch.empty((B, C, tout), dtype=out_dtype or x.dtype, device=x.device)
    torch._check(C * max(T, tout) < 2**31, lambda: "per-sample tensor too large")
    meta = dict(HAS_BIAS=bias is not None, HAS_RES=residual is not None, HAS_AFFINE=scale is not None,
                WRITE_PRE=False, **_flags(x, act))
    args = (x, w, x if bias is None else bias, x if residual is None else residual, x if scale is None else scale,
            x if shift is None else shift, x if alpha is None else alpha, x if inv_beta is None else inv_beta,
            out, out, C, T, tout, w.shape[1], dilation, pad)

    def grid(m):
        return (triton.cdiv(tout, m["BLOCK_T"]), triton.cdiv(C, m["BLOCK_C"]), B)

    if config is None:
        wrap(_dwconv_tuned)[grid](*args, **meta)
    else:
        m = {"BLOCK_C": config.block_c, "BLOCK_T": config.block_t}
        _dwconv_jit[grid(m)](*args, **meta, **m, num_warps=config.num_warps)
    return out


# ------------------------------------------------------------------------------------------ op bodies
def conv1d_forward(x, weight, bias, residual, scale, shift, alpha, inv_beta, kernel_size: int, stride: int,
                   dilation: int, left_pad: int, tap_major: bool, act: str, out_dtype, precision: str,
                   write_pre: bool, wrap=lambda k: k, config: ConvKernelConfig | None = None, out=None, pre=None):
    """Shared body of ttsaot::conv1d(_dual): (pre, out) with pre None unless write_pre. With `config` the kernel
    runs on any device (CPU: TRITON_INTERPRET=1) into the optional preallocated `out`/`pre`."""
    Cout, Cin, tout = _check_conv1d(x, weight, kernel_size, stride, dilation, left_pad, tap_major)
    _check_epilogue(x, Cout, (x.shape[0], Cout, tout), bias, residual, scale, shift, alpha, inv_beta, act,
                    out_dtype, precision)
    if x.device.type != "cuda" and config is None:
        pre, out = _conv1d_ref_impl(x, weight, bias, residual, scale, shift, alpha, inv_beta, kernel_size, stride,
                                    dilation, left_pad, tap_major, act, out_dtype)
        return (pre if write_pre else None), out
    out, pre = launch_conv_gemm(x, weight, bias, residual, scale, shift, alpha, inv_beta, rows=Cout, tout=tout,
                                ksize=kernel_size, dilation=dilation, stride=stride, pad=left_pad, phases=1,
                                tap_major=tap_major, act=act, write_pre=write_pre, out_dtype=out_dtype,
                                precision=precision, wrap=wrap, config=config, out=out, pre=pre)
    return pre, out


def conv_transpose1d_forward(x, weight, bias, residual, scale, shift, alpha, inv_beta, act: str, out_dtype,
                             precision: str, write_pre: bool, wrap=lambda k: k,
                             config: ConvKernelConfig | None = None, out=None, pre=None):
    Cout, s, M, Cin = _check_conv_transpose1d(x, weight)
    T = x.shape[2]
    _check_epilogue(x, Cout, (x.shape[0], Cout, T * s), bias, residual, scale, shift, alpha, inv_beta, act,
                    out_dtype, precision)
    if x.device.type != "cuda" and config is None:
        pre, out = _conv_transpose1d_ref_impl(x, weight, bias, residual, scale, shift, alpha, inv_beta, act,
                                              out_dtype)
        return (pre if write_pre else None), out
    out, pre = launch_conv_gemm(x, weight, bias, residual, scale, shift, alpha, inv_beta, rows=Cout * s, tout=T,
                                ksize=M, dilation=1, stride=1, pad=M - 1, phases=s, tap_major=True, act=act,
                                write_pre=write_pre, out_dtype=out_dtype, precision=precision, wrap=wrap,
                                config=config, out=out, pre=pre)
    return pre, out


def dwconv1d_forward(x, weight, bias, residual, scale, shift, alpha, inv_beta, dilation: int, left_pad: int,
                     act: str, out_dtype, wrap=lambda k: k, config: DwKernelConfig | None = None, out=None):
    tout = _check_dwconv1d(x, weight, dilation, left_pad)
    _check_epilogue(x, x.shape[1], (x.shape[0], x.shape[1], tout), bias, residual, scale, shift, alpha, inv_beta,
                    act, out_dtype, "ieee")
    if x.device.type != "cuda" and config is None:
        return dwconv1d_reference(x, weight, bias, residual, scale, shift, alpha, inv_beta, dilation, left_pad, act,
                                  out_dtype)
    return launch_dwconv(x, weight, bias, residual, scale, shift, alpha, inv_beta, tout=tout, dilation=dilation,
                         pad=left_pad, act=act, out_dtype=out_dtype, wrap=wrap, config=config, out=out)


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
def conv1d(x: Tensor, weight: Tensor, bias: OptTensor, residual: OptTensor, scale: OptTensor, shift: OptTensor,
           alpha: OptTensor, inv_beta: OptTensor, kernel_size: int, stride: int, dilation: int, left_pad: int,
           tap_major: bool, act: str, out_dtype: torch.dtype | None, precision: str) -> Tensor:
    return conv1d_forward(x, weight, bias, residual, scale, shift, alpha, inv_beta, kernel_size, stride, dilation,
                          left_pad, tap_major, act, out_dtype, precision, False, wrap=_wrap)[1]


@_op("conv1d_dual")
def conv1d_dual(x: Tensor, weight: Tensor, bias: OptTensor, residual: OptTensor, scale: OptTensor,
                shift: OptTensor, alpha: OptTensor, inv_beta: OptTensor, kernel_size: int, stride: int,
                dilation: int, left_pad: int, tap_major: bool, act: str, out_dtype: torch.dtype | None,
                precision: str) -> tuple[Tensor, Tensor]:
    return conv1d_forward(x, weight, bias, residual, scale, shift, alpha, inv_beta, kernel_size, stride, dilation,
                          left_pad, tap_major, act, out_dtype, precision, True, wrap=_wrap)


@_op("conv_transpose1d")
def conv_transpose1d(x: Tensor, weight: Tensor, bias: OptTensor, residual: OptTensor, scale: OptTensor,
                     shift: OptTensor, alpha: OptTensor, inv_beta: OptTensor, act: str,
                     out_dtype: torch.dtype | None, precision: str) -> Tensor:
    return conv_transpose1d_forward(x, weight, bias, residual, scale, shift, alpha, inv_beta, act, out_dtype,
                                    precision, False, wrap=_wrap)[1]


@_op("conv_transpose1d_dual")
def conv_transpose1d_dual(x: Tensor, weight: Tensor, bias: OptTensor, residual: OptTensor, scale: OptTensor,
                          shift: OptTensor, alpha: OptTensor, inv_beta: OptTensor, act: str,
                          out_dtype: torch.dtype | None, precision: str) -> tuple[Tensor, Tensor]:
    return conv_transpose1d_forward(x, weight, bias, residual, scale, shift, alpha, inv_beta, act, out_dtype,
                                    precision, True, wrap=_wrap)


@_op("dwconv1d")
def dwconv1d(x: Tensor, weight: Tensor, bias: OptTensor, residual: OptTensor, scale: OptTensor, shift: OptTensor,
             alpha: OptTensor, inv_beta: OptTensor, dilation: int, left_pad: int, act: str,
             out_dtype: torch.dtype | None) -> Tensor:
    return dwconv1d_forward(x, weight, bias, residual, scale, shift, alpha, inv_beta, dilation, left_pad, act,
                            out_dtype, wrap=_wrap)


# Target-specific lowering (export.py for CPU builds, onnx_export.py as ONNX decompositions): exact aten forms.
CPU_DECOMPOSITIONS = {
    torch.ops.ttsaot.conv1d.default: conv1d_reference,
    torch.ops.ttsaot.conv1d_dual.default: conv1d_dual_reference,
    torch.ops.ttsaot.conv_transpose1d.default: conv_transpose1d_reference,
    torch.ops.ttsaot.conv_transpose1d_dual.default: conv_transpose1d_dual_reference,
    torch.ops.ttsaot.dwconv1d.default: dwconv1d_reference,
}


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
    tap_major: bool

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


def bake_conv1d(conv, tap_major: bool | None = None) -> tuple[torch.Tensor, torch.Tensor | None, ConvMeta]:
    """(weight_baked, bias, meta) for `ttsaot::conv1d`. Tap-major [Cout,K,Cin] for stride 1, channel-major
    [Cout,Cin,K] (PyTorch's layout) for strided convs, unless `tap_major` says otherwise."""
    inner, left = _conv_parts(conv)
    if inner.groups != 1:
        raise ConvBakeError(f"groups={inner.groups}: use bake_dwconv1d for depthwise convs")
    w = inner.weight.detach()
    cout, cin, k = w.shape
    stride = inner.stride[0]
    tm = (stride == 1) if tap_major is None else tap_major
    wb = (w.permute(0, 2, 1) if tm else w).contiguous()
    bias = None if inner.bias is None else inner.bias.detach().clone()
    return wb, bias, ConvMeta(cin, cout, k, stride, inner.dilation[0], left, tm)


def bake_conv_transpose1d(conv) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """(weight_baked [Cout, s, M, Cin], bias, stride) of layers.conv.CausalConvTranspose1d or a ConvTranspose1d
    subclass carrying `trim`; the trim must be K − s (exactly T·s outputs). K is zero-padded to M·s."""
    inner = getattr(conv, "conv", conv)
    if not isinstance(inner, torch.nn.ConvTranspose1d):
        raise ConvBakeError(f"{type(conv).__name__}: not a ConvTranspose1d")
    k, s = inner.kernel_size[0], inner.stride[0]
    if inner.groups != 1 or inner.dilation[0] != 1 or inner.padding[0] != 0 or inner.output_padding[0] != 0:
        raise ConvBakeError("conv_transpose1d: groups/dilation/padding/output_padding must be the defaults")
    if k < s or getattr(conv, "trim", None) != k - s:
        raise ConvBakeError(f"conv_transpose1d: kernel {k}, stride {s}, trim {getattr(conv, 'trim', None)}: "
                            "only the causal form (trim = kernel − stride ≥ 0) is supported")
    w = inner.weight.detach()                                           # [Cin, Cout, K]
    cin, cout, _ = w.shape
    m = -(-k // s)
    w = F.pad(w, (0, m * s - k))
    wb = w.view(cin, cout, m, s).flip(2).permute(1, 3, 2, 0).contiguous()
    bias = None if inner.bias is None else inner.bias.detach().clone()
    return wb, bias, s


def bake_dwconv1d(conv) -> tuple[torch.Tensor, torch.Tensor | None, int, int]:
    """(weight [C,K], bias, dilation, left_pad) of a causal depthwise conv: a CausalConv1d / Conv1d-with-left_pad
    with groups = channels, or passes.conv.ShiftDepthwiseConv1d."""
    if hasattr(conv, "weight") and hasattr(conv, "kernel") and hasattr(conv, "dilation") and \
            not isinstance(conv, torch.nn.Conv1d):                       # ShiftDepthwiseConv1d
        w, b, dil, left = conv.weight, conv.bias, conv.dilation, conv.left_pad
    else:
        inner, left = _conv_parts(conv)
        if not (inner.groups == inner.in_channels == inner.out_channels) or inner.stride[0] != 1:
            raise ConvBakeError("dwconv1d: groups must equal the channel count, stride 1")
        w, b, dil = inner.weight, inner.bias, inner.dilation[0]
    return (w.detach()[:, 0, :].contiguous(), None if b is None else b.detach().clone(), int(dil), int(left))


__all__ = [
    "ACTS", "CPU_DECOMPOSITIONS", "DW_CONFIGS", "GEMM_TILES", "OPS", "PRECISIONS", "ConvBakeError", "ConvKernelConfig",
    "ConvMeta", "DwKernelConfig", "bake_conv1d", "bake_conv_transpose1d", "bake_dwconv1d", "causal_out_len",
    "conv1d", "conv1d_dual", "conv1d_dual_reference", "conv1d_forward", "conv1d_reference", "conv_transpose1d",
    "conv_transpose1d_dual", "conv_transpose1d_dual_reference", "conv_transpose1d_forward",
    "conv_transpose1d_reference", "dwconv1d", "dwconv1d_forward", "dwconv1d_reference", "gemm_kernel_configs",
    "launch_conv_gemm", "launch_dwconv", "prune_gemm_configs", "unbake_conv_transpose1d",
]
