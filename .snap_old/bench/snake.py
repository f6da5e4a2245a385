"""SnakeBeta kernel bandwidth vs a device-to-device copy of the same bytes, in the same process.

GB/s count bytes read + written (x in, y out; the per-channel scalars are negligible). The kernel is a pure
bandwidth kernel, so its target is ≥ 85% of the copy bandwidth."""

from __future__ import annotations

import time
from typing import Any

import torch

from . import RESULTS_SCHEMA
from .common import device_info, git_commit, now_iso, rel_err, short_error, time_fn

TARGET_RATIO = 0.85


def run_snake(device: torch.device, shape: tuple[int, ...] | None, quick: bool) -> dict[str, Any]:
    from ttsaot.builder.kernels.snake_beta import launch_snake_beta_kernel, snake_beta_reference

    torch.set_grad_enabled(False)
    if shape is None:
        shape = (8, 1024, 24000) if device.type == "cuda" else (2, 64, 24000)
    warmup, reps = (3, 10) if quick else (10, 50)
    res: dict[str, Any] = {
        "schema": RESULTS_SCHEMA,
        "kind": "snake_kernel",
        "started": now_iso(),
        "git_commit": git_commit(),
        "device": device_info(device),
        "shape": list(shape),
        "target_ratio": TARGET_RATIO,
        "cases": {},
    }
    t_all = time.time()
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        case: dict[str, Any] = {}
        try:
            g = torch.Generator(device=device).manual_seed(0)
            x = (torch.randn(shape, generator=g, device=device) * 3).to(dtype)
            alpha = torch.rand(shape[1], generator=g, device=device) + 0.5
            inv_beta = torch.rand(shape[1], generator=g, device=device)
            nbytes = 2 * x.numel() * x.element_size()
            y = torch.empty_like(x)
            t = time_fn(lambda x=x, y=y: y.copy_(x), device, warmup, reps)
            copy_gbps = nbytes / (t["ms"] * 1e-3) / 1e9
            case["copy"] = {"ms": t["ms"], "gb_per_s": copy_gbps}
            t = time_fn(lambda x=x, a=alpha, ib=inv_beta: snake_beta_reference(x, a, ib), device, warmup, reps)
            case["eager"] = {
                "ms": t["ms"],
                "gb_per_s": nbytes / (t["ms"] * 1e-3) / 1e9,
                "ratio_to_copy": (nbytes / (t["ms"] * 1e-3) / 1e9) / copy_gbps,
            }
            if device.type != "cuda" or launch_snake_beta_kernel is None:
                case["kernel"] = {"status": "unavailable: needs CUDA and Triton"}
            else:
                out = launch_snake_beta_kernel(x, alpha, inv_beta)  # autotunes on the first call
                err = rel_err(out.float(), snake_beta_reference(x, alpha, inv_beta).float())
                t = time_fn(lambda x=x, a=alpha, ib=inv_beta: launch_snake_beta_kernel(x, a, ib), device, warmup, reps)
                gbps = nbytes / (t["ms"] * 1e-3) / 1e9
                case["kernel"] = {
                    "ms": t["ms"],
                    "gb_per_s": gbps,
                    "ratio_to_copy": gbps / copy_gbps,
                    "meets_target": gbps / copy_gbps >= TARGET_RATIO,
                    "rel_err_vs_eager": err,
                }
            case["bytes_moved"] = nbytes
        except Exception as e:  # noqa: BLE001
            case["error"] = short_error(e)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        res["cases"][name] = case
    res["seconds"] = round(time.time() - t_all, 1)
    res["status"] = "ok"
    return res
