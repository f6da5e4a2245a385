"""How CPU builds (and the ONNX exporter) lower our custom ops to aten: one table for every kernel module.

Each kernel module adds its functional ops here when it is imported (the package `__init__` imports them all, so
the table is complete as soon as anything under `builder.kernels` is imported). `snake_beta` re-exports the same
dict under its old name for `export.py` / `onnx_export.py`.

Ops that MUTATE an input (`ttsaot::decode_attention` writes the KV cache) cannot be lowered through a table:
`torch.export` wraps such a node in `auto_functionalized_v2`, which `run_decompositions(table)` leaves as it is, and
an AOTI CPU compile then emits a proxy-executor call that needs the op registered in the serving process. They are
lowered by `lower_for_cpu`, which also asks `run_decompositions` to trace every `triton_op` body; on CPU the body
takes its aten reference branch, so the graph ends up as plain aten ops (the cache write an in-place `index_put`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

CPU_DECOMPOSITIONS: dict[Any, Callable] = {}
# Every ttsaot op → its aten reference, the mutating ones too: what `reference_ops` runs.
REFERENCES: dict[Any, Callable] = {}


def register_cpu_decomposition(op: Any, fn: Callable) -> None:
    """`op` (an OpOverload) is replaced by `fn` (aten ops, same signature) in CPU builds and ONNX exports."""
    CPU_DECOMPOSITIONS[op] = fn
    REFERENCES[op] = fn


def register_reference(op: Any, fn: Callable) -> None:
    """`fn` (aten ops, same signature, the same inputs mutated) is what the mutating `op` computes."""
    REFERENCES[op] = fn


class reference_ops(TorchDispatchMode):
    """Inside: every ttsaot op runs its aten reference, on any device. The builder's fp32 eager forwards (golden
    cases, pass parity) run so on a GPU as on the host: the same math, and no Triton kernel compiled or autotuned
    in the build's own process (with the kernels, a full Fish DAC decoder's 2 golden cases took 116 s on an H200,
    its conv GEMMs' candidates compiled one after another)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return REFERENCES.get(func, func)(*args, **(kwargs or {}))


def lower_for_cpu(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """The exported program with every ttsaot op (functional or mutating) replaced by its aten reference.

    Only our ops are decomposed here, not the rest of the graph to core aten: Inductor applies its own
    decompositions when it compiles, so the core-aten table only made this re-trace slower and the graph bigger
    (tiny qwen3-tts-12hz, 2-core box: code_predictor 36.2 → 26.7 s, 3123 → 2320 operator calls;
    bench/results/cpu/probes/tiny_build_profile/)."""
    return ep.run_decompositions(dict(CPU_DECOMPOSITIONS), decompose_custom_triton_ops=True)
