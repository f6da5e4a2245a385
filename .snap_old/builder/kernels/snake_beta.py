"""`ttsaot::snake_beta(x, alpha, inv_beta)`: y = x + inv_beta * sin(alpha * x)^2 on x [B, C, T], and
`ttsaot::snake_beta_nlc`, the same on channels-last x [B, T, C] (the layout of the conv kernels' chains).

`alpha` = exp(log_alpha) and `inv_beta` = 1 / (exp(log_beta) + eps) are baked at build time (passes.bake), so
the kernel reads two per-channel scalars and streams x once: it is a pure bandwidth kernel.

Registration follows AOTI.md §1/§9: with Triton present the op is a `torch.library.triton_op` whose body branches
on the device, so `torch.export` keeps ONE node and AOTInductor embeds the compiled CUDA kernel in the package
(the serving process needs neither Triton nor this registration). Without Triton (CPU-only installs) the same
name and schema are registered as a plain custom op. CPU builds decompose the node into aten ops before compiling
(export.py), because Inductor's CPU backend cannot lower user Triton kernels.
"""

from __future__ import annotations

import torch

from .common import HAVE_TRITON
from .decompositions import CPU_DECOMPOSITIONS, register_cpu_decomposition

if HAVE_TRITON:
    import triton
    import triton.language as tl

OP_NAME = "ttsaot::snake_beta"


def snake_beta_reference(x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor) -> torch.Tensor:
    """The same math in aten ops, computed in fp32 and cast back (what the kernel does)."""
    xf = x.float()
    a = alpha.float().view(1, -1, 1)
    ib = inv_beta.float().view(1, -1, 1)
    s = torch.sin(xf * a)
    return (xf + ib * (s * s)).to(x.dtype)


def snake_beta_nlc_reference(x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor) -> torch.Tensor:
    """The channels-last form: per-channel scalars along the last dimension."""
    xf = x.float()
    s = torch.sin(xf * alpha.float())
    return (xf + inv_beta.float() * (s * s)).to(x.dtype)


def _check_nlc(x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor) -> None:
    torch._check(x.dim() == 3, lambda: f"snake_beta_nlc expects channels-last x [B,T,C], got {tuple(x.shape)}")
    torch._check(alpha.shape == (x.shape[2],), lambda: "alpha must be [C]")
    torch._check(inv_beta.shape == (x.shape[2],), lambda: "inv_beta must be [C]")


def _check(x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor) -> None:
    torch._check(x.dim() == 3, lambda: f"snake_beta expects x [B,C,T], got {tuple(x.shape)}")
    torch._check(alpha.shape == (x.shape[1],), lambda: "alpha must be [C]")
    torch._check(inv_beta.shape == (x.shape[1],), lambda: "inv_beta must be [C]")


if HAVE_TRITON:

    @triton.jit
    def _fast_sin(t):
        # For 16-bit outputs the accurate sinf makes the kernel compute-bound (68% of copy bandwidth in bf16 on an
        # H200): reduce to [-pi, pi] in fp32, then the SFU's sin.approx (abs error ~1e-6, far below bf16's 4e-3).
        r = t - 6.283185307179586 * tl.extra.cuda.libdevice.rint(t * 0.15915494309189535)
        return tl.inline_asm_elementwise("sin.approx.f32 $0, $1;", "=r,r", [r], dtype=tl.float32, is_pure=True, pack=1)

    @triton.jit
    def _snake_beta_jit(x_ptr, a_ptr, ib_ptr, y_ptr, C, T, BLOCK: tl.constexpr, FAST_SIN: tl.constexpr):
        # Rows (b, c) on grid axis 0 (limit 2^31-1), time blocks on axis 1: per-channel scalars load once per
        # program and the row is streamed with contiguous vector accesses.
        row = tl.program_id(0)
        tblk = tl.program_id(1)
        c = row % C
        a = tl.load(a_ptr + c).to(tl.float32)
        ib = tl.load(ib_ptr + c).to(tl.float32)
        offs = tblk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < T
        base = row.to(tl.int64) * T
        x = tl.load(x_ptr + base + offs, mask=mask, other=0.0)
        xf = x.to(tl.float32)
        if FAST_SIN:
            s = _fast_sin(xf * a)
        else:
            s = tl.sin(xf * a)
        y = xf + ib * s * s
        tl.store(y_ptr + base + offs, y.to(x.dtype), mask=mask)

    @triton.jit(do_not_specialize=["ROWS"])
    def _snake_beta_nlc_jit(
        x_ptr, a_ptr, ib_ptr, y_ptr, ROWS, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, FAST_SIN: tl.constexpr
    ):
        # [rows = B·T, C] tiles: the per-channel scalars are one vector per program, rows stream contiguously.
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        c_ok = c < C
        a = tl.load(a_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        ib = tl.load(ib_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        off = rows.to(tl.int64)[:, None] * C + c[None, :]
        mask = (rows < ROWS)[:, None] & c_ok[None, :]
        x = tl.load(x_ptr + off, mask=mask, other=0.0)
        xf = x.to(tl.float32)
        if FAST_SIN:
            s = _fast_sin(xf * a[None, :])
        else:
            s = tl.sin(xf * a[None, :])
        tl.store(y_ptr + off, (xf + ib[None, :] * s * s).to(x.dtype), mask=mask)

    _snake_beta_nlc_kernel = triton.autotune(
        configs=[
            triton.Config({"BLOCK_R": 32, "BLOCK_C": 128}, num_warps=4),
            triton.Config({"BLOCK_R": 64, "BLOCK_C": 64}, num_warps=4),
            triton.Config({"BLOCK_R": 128, "BLOCK_C": 32}, num_warps=4),
        ],
        key=["ROWS", "C"],
    )(_snake_beta_nlc_jit)

    def launch_snake_beta_nlc_kernel(
        x: torch.Tensor,
        alpha: torch.Tensor,
        inv_beta: torch.Tensor,
        wrap=lambda k: k,
        block: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """x [B, T, C]; `block` = (rows, channels) skips autotuning (interpreter tests)."""
        x = x.contiguous()
        B, T, C = x.shape
        y = torch.empty_like(x)

        def grid(meta):
            return (triton.cdiv(B * T, meta["BLOCK_R"]), triton.cdiv(C, meta["BLOCK_C"]))

        fast_sin = x.dtype != torch.float32 and x.device.type == "cuda"
        if block is None:
            wrap(_snake_beta_nlc_kernel)[grid](x, alpha, inv_beta, y, B * T, C, FAST_SIN=fast_sin)
        else:
            _snake_beta_nlc_jit[grid({"BLOCK_R": block[0], "BLOCK_C": block[1]})](
                x, alpha, inv_beta, y, B * T, C, BLOCK_R=block[0], BLOCK_C=block[1], FAST_SIN=fast_sin
            )
        return y

    # Tuned per bucket at AOTI compile time on the compile GPU (one config is baked into each package).
    _snake_beta_kernel = triton.autotune(
        configs=[
            triton.Config({"BLOCK": 1024}, num_warps=4),
            triton.Config({"BLOCK": 2048}, num_warps=4),
            triton.Config({"BLOCK": 4096}, num_warps=8),
        ],
        key=["T"],
    )(_snake_beta_jit)

    def launch_snake_beta_kernel(
        x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor, wrap=lambda k: k, block: int | None = None
    ) -> torch.Tensor:
        """Launch the Triton kernel. `block` skips autotuning: the TRITON_INTERPRET=1 tests on CPU use it,
        since the autotuner's benchmark needs a GPU driver."""
        x = x.contiguous()
        B, C, T = x.shape
        y = torch.empty_like(x)

        def grid(meta):
            return (B * C, triton.cdiv(T, meta["BLOCK"]))

        fast_sin = x.dtype != torch.float32 and x.device.type == "cuda"  # fp32 keeps the accurate sinf
        if block is None:
            wrap(_snake_beta_kernel)[grid](x, alpha, inv_beta, y, C, T, FAST_SIN=fast_sin)
        else:
            _snake_beta_jit[grid](x, alpha, inv_beta, y, C, T, BLOCK=block, FAST_SIN=fast_sin)
        return y

    @torch.library.triton_op(OP_NAME, mutates_args=())
    def snake_beta(x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor) -> torch.Tensor:
        _check(x, alpha, inv_beta)
        if x.device.type != "cuda":
            # Traced with fake tensors during CPU compiles too: plain aten ops, fused by Inductor's C++ backend.
            return snake_beta_reference(x, alpha, inv_beta)
        return launch_snake_beta_kernel(x, alpha, inv_beta, wrap=torch.library.wrap_triton)

    @torch.library.triton_op(OP_NAME + "_nlc", mutates_args=())
    def snake_beta_nlc(x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor) -> torch.Tensor:
        _check_nlc(x, alpha, inv_beta)
        if x.device.type != "cuda":
            return snake_beta_nlc_reference(x, alpha, inv_beta)
        return launch_snake_beta_nlc_kernel(x, alpha, inv_beta, wrap=torch.library.wrap_triton)

else:

    @torch.library.custom_op(OP_NAME, mutates_args=())
    def snake_beta(x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor) -> torch.Tensor:
        _check(x, alpha, inv_beta)
        return snake_beta_reference(x, alpha, inv_beta)

    @snake_beta.register_fake
    def _(x, alpha, inv_beta):
        _check(x, alpha, inv_beta)
        return torch.empty_like(x)

    @torch.library.custom_op(OP_NAME + "_nlc", mutates_args=())
    def snake_beta_nlc(x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor) -> torch.Tensor:
        _check_nlc(x, alpha, inv_beta)
        return snake_beta_nlc_reference(x, alpha, inv_beta)

    @snake_beta_nlc.register_fake
    def _(x, alpha, inv_beta):
        _check_nlc(x, alpha, inv_beta)
        return torch.empty_like(x)

    launch_snake_beta_kernel = None  # type: ignore[assignment]
    launch_snake_beta_nlc_kernel = None  # type: ignore[assignment]


# CPU builds and the ONNX exporter lower the ops to their references. `CPU_DECOMPOSITIONS` (every kernel's entries,
# see decompositions.py) stays importable from here for export.py / onnx_export.py.
register_cpu_decomposition(torch.ops.ttsaot.snake_beta.default, snake_beta_reference)
register_cpu_decomposition(torch.ops.ttsaot.snake_beta_nlc.default, snake_beta_nlc_reference)
__all__ = [
    "CPU_DECOMPOSITIONS",
    "HAVE_TRITON",
    "launch_snake_beta_kernel",
    "launch_snake_beta_nlc_kernel",
    "snake_beta",
    "snake_beta_nlc",
    "snake_beta_nlc_reference",
    "snake_beta_reference",
]
