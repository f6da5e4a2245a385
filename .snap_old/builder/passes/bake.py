from __future__ import annotations

from typing import Any

from torch import nn

from ..layers.snake import BakedSnakeBeta, Snake1d, SnakeBeta
from .prune import count_parameters


def _replace(root: nn.Module, cls: type, make) -> int:
    n = 0
    for name, child in list(root.named_children()):
        if isinstance(child, cls):
            setattr(root, name, make(child))
            n += 1
        else:
            n += _replace(child, cls, make)
    return n


def bake_snake(module: nn.Module) -> dict[str, Any]:
    """Replace every SnakeBeta (log-scale α, β) and Snake1d (linear α) by BakedSnakeBeta, whose per-channel
    scalars (exp(α) and 1/(exp(β)+eps), or α and 1/(α+eps)) are computed once here. Folded parameters: before
    minus after (negative for Snake1d, whose precomputed 1/(α+eps) is an extra table)."""
    before = count_parameters(module)["params"]
    n = _replace(module, SnakeBeta, lambda m: BakedSnakeBeta.from_log_scale(m.alpha, m.beta))
    n += _replace(module, Snake1d, lambda m: BakedSnakeBeta.from_linear(m.alpha))
    return {
        "pass": "bake_snake",
        "replaced": n,
        "folded": {"snake α/β into baked scalars": before - count_parameters(module)["params"]},
    }
