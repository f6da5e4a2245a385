from __future__ import annotations

import torch
from torch import nn


def cast_to_compute_dtype(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast floating parameters and buffers to `dtype`, except in modules that declare `keep_fp32 = True`
    (baked SnakeBeta scalars: a per-channel frequency in bf16 would move every sin())."""
    for sub in module.modules():
        if getattr(sub, "keep_fp32", False):
            continue
        for _, p in list(sub.named_parameters(recurse=False)):
            if p.is_floating_point():
                p.data = p.data.to(dtype)
        for name, b in list(sub.named_buffers(recurse=False)):
            if b is not None and b.is_floating_point() and not getattr(sub, f"{name}_keep_fp32", False):
                setattr(sub, name, b.to(dtype))
    return module
