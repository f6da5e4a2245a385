from __future__ import annotations

from typing import Any

import torch
from torch import nn


def count_parameters(module: nn.Module) -> dict[str, float]:
    """Parameters and persistent-buffer bytes (fp32-equivalent MiB uses the tensors' own dtypes)."""
    tensors = list(module.state_dict().values())
    n = sum(t.numel() for t in tensors if torch.is_floating_point(t) or t.dtype == torch.int64)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    return {"params": int(n), "mib": round(nbytes / 2**20, 3)}


def prune_submodules(module: nn.Module, names: list[str]) -> dict[str, Any]:
    """Delete the named submodules (dotted paths) that a stage never calls, and report what went
    ({path: parameters}).

    Run BEFORE the module moves to the device, so dropped weights never reach it."""
    dropped = {}
    for path in names:
        parent_path, _, leaf = path.rpartition(".")
        parent = module.get_submodule(parent_path) if parent_path else module
        sub = getattr(parent, leaf)
        dropped[path] = count_parameters(sub)["params"] if isinstance(sub, nn.Module) else 0
        delattr(parent, leaf)
    return {"pass": "prune", "dropped": dropped, "kept": count_parameters(module)}
