"""What every kernel module shares: whether Triton is importable, the GPU's size (SMs, shared memory per program),
the aten RMSNorm they reference."""

from __future__ import annotations

from typing import Any

import torch

try:  # Triton is optional: the CPU wheel of torch does not depend on it.
    import triton  # noqa: F401

    HAVE_TRITON = True
except Exception:  # noqa: BLE001 - any import failure means "no Triton"
    HAVE_TRITON = False

# Grid heuristics need the SM count at trace time; off-GPU (TRITON_INTERPRET tests) they plan for an H100.
DEFAULT_MULTIPROCESSORS = 132


def multiprocessor_count(device: torch.device) -> int:
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_MULTIPROCESSORS


# Off-GPU (the interpreter) pruning plans for an sm_90 GPU's opt-in shared memory per block (H100 / H200).
DEFAULT_SHARED_MEMORY = 232_448


def shared_memory_per_block(device: torch.device) -> int:
    """The most shared memory one program may take on `device` (the opt-in limit a kernel launch is checked
    against: Triton raises OutOfResources above it)."""
    if device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        return int(getattr(props, "shared_memory_per_block_optin", DEFAULT_SHARED_MEMORY))
    return DEFAULT_SHARED_MEMORY


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The project's RMSNorm (layers.norms.RMSNorm.forward, HF/Qwen/MiniCPM): variance in fp32, the normalised
    value cast back to x's dtype, then × weight in that dtype. The kernels' prologues round at the same points."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def size_hint(v) -> int:
    """A size as a plain int. A symbolic size (a dynamic-shape export) gives its example value: launch-time choices
    (the tiles the autotuner may try, the split-K bound) follow the export's example bucket instead of guarding on
    the size, which would specialise the dynamic axis to that one value."""
    return v.node.hint if isinstance(v, torch.SymInt) else int(v)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def no_wrap(kernel: Any) -> Any:
    """The launchers' default `wrap`: the Triton kernel as it is (a direct launch: tests, the interpreter). Inside a
    `torch.library.triton_op` the ops pass `torch.library.wrap_triton` instead, so torch.export sees the launch."""
    return kernel
