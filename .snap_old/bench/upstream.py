"""Upstream implementations with OUR random weights, where they run without their serving engine.

Upstream code is never vendored: it is imported from the installed package (one module at a time, without the
package __init__, which pulls audio and hub stacks). Where it is not importable the bench records
"unavailable: <reason>" instead of failing.

Each family's `Upstream` entry takes our faithful fp32 stage module and returns an upstream nn.Module holding the same
weights whose forward takes the stage inputs in the StageSpec's order and returns the stage outputs. Where the
upstream call has another signature, a thin adapter module does only the argument plumbing (dtype casts of the
fp32 stage inputs, a lengths tensor, picking an output); everything timed inside it is upstream code.

Which upstream module serves which stage is the family's business (`BenchFamily.upstream`, bench/families/); the
constructors there are shared with the oracle tests (tests/oracle/), which load real-format checkpoints into them:
one implementation of "how upstream is built"."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types
from pathlib import Path

import torch
from torch import nn

from .common import Skipped, short_error


def import_module_alone(dotted: str):
    """Import `a.b.c` with its parent packages stubbed (real __path__, no __init__ executed)."""
    top = dotted.split(".")[0]
    if top in sys.modules and getattr(sys.modules[top], "__path__", None):  # already stubbed by an earlier call
        root = Path(list(sys.modules[top].__path__)[0])
    else:
        spec = importlib.util.find_spec(top)
        if spec is None or not spec.submodule_search_locations:
            raise Skipped(f"unavailable: upstream package {top!r} is not installed")
        root = Path(list(spec.submodule_search_locations)[0])
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        name = ".".join(parts[:i])
        if name in sys.modules:
            continue
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(root.joinpath(*parts[1:i]))]
        sys.modules[name] = pkg
    try:
        return importlib.import_module(dotted)
    except Exception as e:  # noqa: BLE001
        raise Skipped(f"unavailable: import {dotted} failed ({short_error(e)})") from e


# ------------------------------------------------------------------------------------------------ weights
def load_our_weights(up: nn.Module, ours: nn.Module, unread: str | None = None) -> None:
    """Load `ours`' state into `up` under upstream's names. Names are the same except where upstream keeps
    legacy weight norm (`weight_g`/`weight_v`) and we the parametrization (`original0`/`original1`).
    `unread` (regex) names upstream tensors that may stay as upstream initialised them: buffers the forward
    never reads from the state (e.g. rope tables upstream rebuilds itself). Anything else missing, and any
    tensor of ours left over, is an error: the two modules must hold the same weights."""
    from ttsaot.builder.passes.weight_norm import legacy_weight_norm_to_new

    src = ours.state_dict()
    mapped: dict[str, torch.Tensor] = {}
    # our name → upstream's: the checkpoint loader's own legacy→parametrization key mapping
    for name, key in legacy_weight_norm_to_new({k: k for k in up.state_dict()}).items():
        if name in src:
            mapped[key] = src.pop(name)
    missing = [k for k in up.state_dict() if k not in mapped and not (unread and re.fullmatch(unread, k))]
    if missing or src:
        raise Skipped(
            f"unavailable: weights do not map onto upstream (missing {missing[:3]}, ours left over {list(src)[:3]})"
        )
    up.load_state_dict(mapped, strict=False)


def upstream_module(family: str, stage: str, ours: nn.Module) -> tuple[str, nn.Module]:
    from .families import bench_family

    entry = bench_family(family).upstream.get(stage)
    if entry is None:
        raise Skipped("unavailable: no standalone upstream module for this stage is wired into the bench")
    try:
        return entry.what, entry.build(ours).eval()
    except Skipped:
        raise
    except Exception as e:  # noqa: BLE001
        raise Skipped(f"unavailable: building {entry.what} failed ({short_error(e)})") from e


def param_dtype(m: nn.Module) -> torch.dtype:
    return next(p for p in m.parameters() if p.is_floating_point()).dtype


def linear_like(ours: nn.Linear) -> nn.Linear:
    """A plain `nn.Linear` (what upstream models use for their projections) with our weights."""
    lin = nn.Linear(ours.in_features, ours.out_features, bias=ours.bias is not None)
    lin.load_state_dict(ours.state_dict(), strict=True)
    return lin
