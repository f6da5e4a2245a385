"""What the bench knows about a family beyond its builder package, behind one small protocol.

Each module here exports `BENCH = BenchFamily(...)` and is registered in `MODULES` (one line per family). A family
without a module is benchmarked with the generic defaults: buckets from its own plan, no upstream comparator, no
per-step loops. The generic harness (stage runner, variants, specs, profile, report) reads families only through
`bench_family(name)` and `family_commands()`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn


@dataclass(frozen=True)
class Buckets:
    """The bench's choice for one stage at one preset (GPU time is scarce: a few buckets, not the whole plan)."""

    axes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # axis → sizes measured
    options: dict[str, Any] = field(default_factory=dict)  # family option overrides (e.g. max_len)
    streaming: dict[str, int] = field(default_factory=dict)  # StreamingConfig overrides


@dataclass(frozen=True)
class Upstream:
    """An upstream implementation with OUR weights: `build(our faithful fp32 module)` → an nn.Module taking the
    stage inputs in the StageSpec's order and returning the stage outputs (bench/upstream.py)."""

    what: str
    build: Callable[[nn.Module], nn.Module]


@dataclass(frozen=True)
class BenchFamily:
    buckets: dict[str, dict[str, Buckets]] = field(default_factory=dict)  # stage → preset → Buckets
    upstream: dict[str, Upstream] = field(default_factory=dict)  # stage → comparator
    # codebook predictors: stage → StepAdapter(module) for the per-codebook-step loops (bench/predictor_loops.py)
    step_loops: dict[str, Callable[[nn.Module], Any]] = field(default_factory=dict)
    # stage → (manifest StageEntry) → (layer passes in one call, how), for kernels per layer in `bench profile`;
    # LM kinds default to the layers of their KV cache
    layers: dict[str, Callable[[Any], tuple[int, str]]] = field(default_factory=dict)
    # family subcommands: `python -m bench <name>` → the module that defines it with `add_parser(subparsers)` and
    # `main(args) -> int`
    commands: dict[str, str] = field(default_factory=dict)
    # result kinds of those commands → "module:function" rendering (result, per-stage results of the same device)
    # as a BENCHMARKS.md section
    report_sections: dict[str, str] = field(default_factory=dict)


GENERIC = BenchFamily()

# family id → its module under bench/families/ (the one place a family is registered with the bench)
MODULES = {
    "qwen3-tts-12hz": "qwen3_tts_12hz",
    "fish-s2-pro": "fish_s2_pro",
    "voxcpm2": "voxcpm2",
}


def bench_family(family: str) -> BenchFamily:
    """The family's BenchFamily, or the generic defaults when the bench has no module for it."""
    name = MODULES.get(family)
    if name is None:
        return GENERIC
    mod = importlib.import_module(f"{__name__}.{name}")
    bench = getattr(mod, "BENCH", None)
    if not isinstance(bench, BenchFamily):
        raise TypeError(f"{mod.__name__} does not export BENCH = BenchFamily(...)")
    return bench


def family_commands() -> dict[str, str]:
    """Every registered family's subcommands: name → the module (dotted path) with its `add_parser` and `main`."""
    return {name: module for family in MODULES for name, module in bench_family(family).commands.items()}


def result_sections() -> dict[str, Callable[[dict, list[dict]], str]]:
    """Every registered family's report renderers: result kind → function."""
    out = {}
    for family in MODULES:
        for kind, ref in bench_family(family).report_sections.items():
            module, _, name = ref.partition(":")
            out[kind] = getattr(importlib.import_module(module), name)
    return out
