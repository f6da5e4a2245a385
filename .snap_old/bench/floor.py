"""The hardware floor of a stage call: max(bytes moved / copy bandwidth, FLOPs / matmul rate).

Both rates are measured in the same process as the stage (never taken from a datasheet): a large
device-to-device copy (bytes read + written) and a large square matmul in the stage's compute dtype (bf16 on
GPU). The floor assumes perfect overlap of memory and compute, every weight read once, activations read and
written once at the stage boundary only (input + output), and matmul-rate FLOPs for convolutions too: it is a
lower bound no implementation reaches, useful as a yardstick across variants."""

from __future__ import annotations

import copy
import re
from typing import Any

import torch
from torch import nn

from .common import as_tuple, short_error, sync, tensor_bytes, time_fn


def copy_bandwidth(device: torch.device, nbytes: int | None = None, reps: int = 20) -> dict[str, Any]:
    """GB/s (1e9 bytes/s) counting bytes read + written of a large contiguous D2D copy."""
    if nbytes is None:
        nbytes = (1 << 30) if device.type == "cuda" else (64 << 20)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), device, warmup=3, reps=reps)
    gbps = 2 * src.numel() * 4 / (t["ms"] * 1e-3) / 1e9
    return {"gb_per_s": round(gbps, 1), "bytes": nbytes, "ms": t["ms"]}


def matmul_rate(
    device: torch.device, dtype: torch.dtype | None = None, n: int | None = None, reps: int = 20
) -> dict[str, Any]:
    """TFLOP/s of an n×n×n matmul (2n³ FLOPs)."""
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if n is None:
        n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    t = time_fn(lambda: a @ b, device, warmup=3, reps=reps)
    tflops = 2 * n**3 / (t["ms"] * 1e-3) / 1e12
    return {
        "tflop_per_s": round(tflops, 2),
        "dtype": str(dtype).removeprefix("torch."),
        "n": n,
        "ms": t["ms"],
    }


def measure_hardware(device: torch.device, quick: bool = False) -> dict[str, Any]:
    reps = 10 if quick else 20
    hw = {"copy": copy_bandwidth(device, reps=reps), "matmul": matmul_rate(device, reps=reps)}
    if device.type == "cuda":
        hw["matmul_fp32"] = matmul_rate(device, torch.float32, n=4096, reps=reps)
    sync(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return hw


_META: dict[int, nn.Module] = {}


def count_flops(module: nn.Module, inputs: list[torch.Tensor]) -> dict[str, Any]:
    """FLOPs of one call of the fp32 faithful module, counted by FlopCounterMode (matmuls, convolutions,
    attention; elementwise ops count zero). On the meta device when the module allows it (instant), else on
    CPU."""
    from torch.utils.flop_counter import FlopCounterMode

    errors = []
    for where in ("meta", "cpu"):
        try:
            if where == "meta":
                if id(module) not in _META:  # one meta copy per module (a deepcopy of a big LM is slow)
                    _META.clear()
                    _META[id(module)] = copy.deepcopy(module).to("meta")
                m = _META[id(module)]
            else:
                m = module
            args = [x.to(where) for x in inputs]
            with torch.no_grad(), FlopCounterMode(display=False) as fc:
                m(*args)
            total = int(fc.get_total_flops())
            by_op = {str(k): int(v) for k, v in fc.get_flop_counts().get("Global", {}).items()}
            return {"flops": total, "method": f"FlopCounterMode on {where}", "by_op": by_op}
        except Exception as e:  # noqa: BLE001
            errors.append(f"{where}: {short_error(e)}")
    return {"flops": None, "method": "failed", "errors": errors}


def floor_for(flops: int | None, weight_bytes: int, io_bytes: int, hw: dict[str, Any]) -> dict[str, Any]:
    bw = hw["copy"]["gb_per_s"] * 1e9
    rate = hw["matmul"]["tflop_per_s"] * 1e12
    mem_ms = (weight_bytes + io_bytes) / bw * 1e3
    comp_ms = (flops / rate * 1e3) if flops else 0.0
    return {
        "ms": max(mem_ms, comp_ms),
        "memory_ms": mem_ms,
        "compute_ms": comp_ms,
        "bound": "memory" if mem_ms >= comp_ms else "compute",
        "flops": flops,
        "weight_bytes": weight_bytes,
        "io_bytes": io_bytes,
    }


def io_bytes(inputs: list[torch.Tensor], outputs) -> int:
    return tensor_bytes(inputs) + tensor_bytes(as_tuple(outputs))


_LAYER_NAME = re.compile(r"^(?:(.*)\.)?layers\.(\d+)\.")


def loop_weight_bytes(named_bytes: dict[str, int], passes: int | None) -> dict[str, Any] | None:
    """The weight bytes one call of a looped stage reads when its transformer stack runs `passes` layer passes in all
    (`bench/specs.py layer_passes`: layers × steps): every weight once, and the stack's weights (the constants named
    `<stack>.layers.<i>.…`) once more per further pass over it. The stack is the one with the most bytes whose layer
    count divides `passes`; other stacks, heads, embeddings and norms count once (a per-step head read once per step
    is read once in all). None when no stack fits (a stage that runs each layer once gets repeats 1)."""
    stacks: dict[str, tuple[set[str], int]] = {}
    for name, nbytes in named_bytes.items():
        m = _LAYER_NAME.match(name)
        if m:
            idx, total = stacks.get(m.group(1) or "", (set(), 0))
            idx.add(m.group(2))
            stacks[m.group(1) or ""] = (idx, total + nbytes)
    fits = [(total, prefix, len(idx)) for prefix, (idx, total) in stacks.items() if passes and passes % len(idx) == 0]
    if not fits:
        return None
    layer_bytes, prefix, layers = max(fits)
    repeats = passes // layers
    return {
        "stack": prefix,
        "layer_weight_bytes": layer_bytes,
        "distinct_layers": layers,
        "repeats": repeats,
        "bytes": sum(named_bytes.values()) + layer_bytes * (repeats - 1),
    }
