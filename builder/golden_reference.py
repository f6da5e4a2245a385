"""Where a stage's golden cases run: the fp32 eager forwards of the faithful and the rewritten module on the golden
inputs (builder/build.py `_golden_cases`), whose outputs every package is later compared with.

A CPU build runs them on its host. A CUDA build runs them on its GPU, in exact fp32 (no TF32 in cuBLAS or cuDNN),
when the GPU has room for both modules: in a parallel build they run while the packages compile, and on the host
they were the heaviest thing the build's own process did beside the compile workers — the full Fish DAC encoder's 5
cases alone took 248 s on a 2-core CPU and 121.5 s of the H200 build (torch's intra-op threads on top of 16 busy
workers), where the GPU sits idle between the workers' autotuning measurements. There, as on the host, every
ttsaot op runs its aten reference (no Triton kernel compiled in the build's process), and the cases hold the GPU's
benchmark lock (builder/gpu_benchmark_lock.py) so that no worker times its kernel configs beside them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..runtime.stage import fp32_mode
from .gpu_benchmark_lock import holding, lock_path
from .kernels.decompositions import reference_ops

# What the GPU keeps free beside the two fp32 modules, for their activations and the compile workers' autotuning
# buffers: an allowance, not a measured peak (the full Fish stages' cases ran within it on an H200,
# bench/results/nvidia-h200/probes/golden_on_gpu/).
HEADROOM_BYTES = 4 << 30
HOST = torch.device("cpu")


def reference_device(build_device: torch.device, module_bytes: int) -> torch.device:
    """The device the golden cases of a stage whose faithful + rewritten modules take `module_bytes` run on."""
    if build_device.type != "cuda" or not torch.cuda.is_available():
        return HOST
    free, _total = torch.cuda.mem_get_info(build_device)
    return build_device if free >= module_bytes + HEADROOM_BYTES else HOST


def describe(device: torch.device) -> list[str]:
    """What decides the last bits of the cases' outputs beyond the build's own inputs (the golden cases' cache key
    adds it): the GPU and the cuBLAS / cuDNN versions, or "cpu" (the key already names the CPU's kernels)."""
    if device.type != "cuda":
        return ["cpu"]
    return [
        torch.cuda.get_device_name(device),
        f"cuda {torch.version.cuda}",
        f"cudnn {torch.backends.cudnn.version()}",
    ]


@contextlib.contextmanager
def reference_forwards(device: torch.device) -> Iterator[None]:
    """Inside: the cases' forwards as the reference computes them on `device`: every ttsaot op its aten reference
    (on the host the ops take that branch anyway), and on a GPU exact fp32, alone on it."""
    with contextlib.ExitStack() as stack:
        if device.type == "cuda":
            stack.enter_context(holding(lock_path(device)))
            stack.enter_context(fp32_mode(active=True, tf32=False))
        stack.enter_context(reference_ops())
        yield
