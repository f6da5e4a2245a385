from __future__ import annotations

from typing import Any

from torch import nn


def fuse_projections(module: nn.Module) -> dict[str, Any]:
    """Call `fuse_projections()` on every submodule that offers it (attention: q/k/v → qkv_proj; MLP:
    gate/up → gate_up_proj). Done once at build time; the separate weights are deleted."""
    fused = []
    for name, sub in module.named_modules():
        if hasattr(sub, "fuse_projections") and sub is not module:
            sub.fuse_projections()
            fused.append(name)
    return {"pass": "fuse_projections", "fused": len(fused)}
