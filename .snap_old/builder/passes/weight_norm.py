"""Weight norm, in both checkpoint styles, and its bake.

Checkpoints store weight-normed convs either new-style (`<m>.parametrizations.weight.original0` = g,
`.original1` = v; torch.nn.utils.parametrizations.weight_norm) or legacy (`<m>.weight_g`, `<m>.weight_v`;
torch.nn.utils.weight_norm). Faithful modules are built with the new style; `legacy_weight_norm_to_new` renames
a legacy state dict so both load into the same module, and `bake_weight_norm` folds g·v/‖v‖ into a plain
`weight` before export (no per-call norm in the served graph).

Faithful modules must use the new style only: legacy hook modules cannot be deep-copied after a forward (their
`weight` is a non-leaf tensor), and the builder deep-copies modules before rewriting them."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from .prune import count_parameters

NEW_G, NEW_V = "parametrizations.weight.original0", "parametrizations.weight.original1"


def weight_norm(module: nn.Module, dim: int = 0) -> nn.Module:
    """Apply new-style weight norm (the names the faithful modules load)."""
    return nn.utils.parametrizations.weight_norm(module, name="weight", dim=dim)


def legacy_weight_norm_to_new(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`x.weight_g`/`x.weight_v` → `x.parametrizations.weight.original0/1`; other keys unchanged."""
    out = {}
    for k, v in state.items():
        if k.endswith(".weight_g"):
            out[k[: -len("weight_g")] + NEW_G] = v
        elif k.endswith(".weight_v"):
            out[k[: -len("weight_v")] + NEW_V] = v
        else:
            out[k] = v
    return out


def bake_weight_norm(module: nn.Module) -> dict[str, Any]:
    """Replace every weight-norm parametrization (and legacy hook) by the plain weight it computes (the
    magnitudes g are folded into it)."""
    before = count_parameters(module)["params"]
    n = 0
    for sub in module.modules():
        if parametrize.is_parametrized(sub, "weight"):
            # deepcopy shares the injected `Parametrized*` class between the copies, and removal deletes the
            # `weight` property from that class, which would break the other copy (the builder still runs the
            # original after the passes): give this instance its own class first.
            cls = sub.__class__
            own = {k: v for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__")}
            sub.__class__ = type(cls.__name__, cls.__bases__, own)
            parametrize.remove_parametrizations(sub, "weight", leave_parametrized=True)
            n += 1
        elif hasattr(sub, "weight_g") and hasattr(sub, "weight_v"):
            nn.utils.remove_weight_norm(sub)
            n += 1
    return {
        "pass": "bake_weight_norm",
        "baked": n,
        "folded": {"weight-norm magnitudes g·v/‖v‖": before - count_parameters(module)["params"]},
    }
