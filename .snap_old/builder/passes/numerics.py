"""A measuring pass: the error of a stage's compute dtype against fp32, at build time, for the manifest."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ...runtime.metrics import rel_error
from .cast import cast_to_compute_dtype


def snr_db(rel: float) -> float:
    """SNR of a signal against its reference, from ‖out − ref‖/‖ref‖."""
    return math.inf if rel == 0 else -20.0 * math.log10(rel)


def measure_numerics(
    record: dict[str, Any],
    dtype: torch.dtype,
    make_inputs: Callable[[dict[str, int], torch.Generator], dict[str, torch.Tensor]],
    sizes: dict[str, int],
    prepare: Callable[[nn.Module], Any] | None = None,
    seed: int = 0,
) -> Callable[[nn.Module], dict[str, Any]]:
    """A pass that runs the module as the passes left it in fp32, and a copy rewritten by `prepare` (the stage's
    kernel pass) cast to `dtype`, on one input (make_inputs(sizes), seeded), and writes the relative error and SNR
    of the first output into `record` (the stage's metadata["numerics"]: manifest and `inspect`) under "measured".
    On CPU, where the builder's passes run, the conv kernels' references round to a 16-bit dtype exactly where the
    kernels (and the eager modules) do, only the accumulation order differs, and they multiply in fp32 (aten's
    16-bit CPU convs are orders of magnitude slower): that is why the copy takes the kernel pass whatever the
    build's --kernels. fp32 stages (exact, or TF32, which has no CPU form) record no measurement: the build's
    golden check holds them to the stage tolerance on the build device."""

    def measure(m: nn.Module) -> dict[str, Any]:
        if dtype == torch.float32:
            record["measured"] = None
            return {"pass": "measure_numerics", "skipped": "fp32 stage: held to its tolerance by the golden check"}
        inputs = make_inputs(sizes, torch.Generator().manual_seed(seed))
        args = tuple(inputs.values())
        probe = copy.deepcopy(m)
        if prepare is not None:
            prepare(probe)
        with torch.no_grad():
            ref = m(*args)
            low = cast_to_compute_dtype(probe, dtype)(*args)
        ref = ref[0] if isinstance(ref, tuple) else ref
        low = low[0] if isinstance(low, tuple) else low
        rel = rel_error(low.float(), ref.float())
        measured = {
            "rel_error": float(f"{rel:.4g}"),
            "snr_db": round(snr_db(rel), 2) if rel > 0 else None,
            "device": "cpu",
            "inputs": dict(sizes),
            "against": "the fp32 stage module (same weights)",
            "module": "conv kernels (CPU references)" if prepare is not None else "stage module",
        }
        crit = record.get("criterion") or {}
        if crit:
            record["meets_criterion"] = snr_db(rel) >= crit.get("snr_db_min", -math.inf) and rel <= crit.get(
                "rel_error_max", math.inf
            )
        record["measured"] = measured
        return {"pass": "measure_numerics", **measured}

    measure.__name__ = "measure_numerics"
    return measure
