"""Parity of a stage's rewritten module (its passes) with the faithful one, per golden case.

The check runs both modules in fp32 where the golden cases run (the build host's CPU, or a CUDA build's GPU in exact
fp32: builder/golden_reference.py). A correct rewrite may still change the order in which
fp32 sums are taken: `fuse_projections` turns three GEMMs into one of another shape, for which the host's CPU BLAS
may block the K loop differently; through the 8 layers of VoxCPM2's full-size residual LM at batch 16 that reached
1.5e-4 on a 16-core host (0.0 on a 2-core one). So an fp32 miss is re-decided in float64, where reassociation moves
the result by ~1e-16 (amplified a few orders by depth) while a wrong rewrite stays at the size of its mistake
(1e-3 and up): deep copies of both modules in float64 on fresh float64 inputs, compared with the same metric.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from ..runtime.metrics import rel_error
from .buckets import BucketPlan
from .stage_spec import StageSpec

FP32_LIMIT = 1e-5  # the fast check: rewritten vs original module in fp32
FP64_LIMIT = 1e-9  # the re-decision: float64 reassociation stays orders below this, a wrong rewrite far above


def output_errors(spec: StageSpec, ref: Sequence[torch.Tensor], out: Sequence[torch.Tensor]) -> dict[str, float]:
    """{output name: rel_error(out, ref)} for floating outputs, the number of differing elements for integer ones."""
    return {
        d["name"]: rel_error(o, r) if r.is_floating_point() else float((o != r).sum())
        for d, r, o in zip(spec.outputs, ref, out)
    }


def _run(spec: StageSpec, module: nn.Module, sizes: dict[str, int], seed: int) -> tuple[torch.Tensor, ...]:
    # Fresh inputs per module: step modules write their cache inputs in place.
    inputs = spec.make_inputs(sizes, torch.Generator().manual_seed(seed))
    device = next(iter(module.parameters()), torch.empty(0)).device
    args = [(t.double() if t.is_floating_point() else t).to(device) for t in (inputs[n] for n in spec.input_names)]
    with torch.no_grad():
        out = module(*args)
    return out if isinstance(out, tuple) else (out,)


def float64_errors(
    spec: StageSpec, original: nn.Module, rewritten: nn.Module, sizes: dict[str, int], seed: int
) -> dict[str, float]:
    """The case's output errors with float64 copies of both modules on its inputs (made with generator `seed`)
    in float64; the modules themselves are left as they are."""
    ref = _run(spec, copy.deepcopy(original).double(), sizes, seed)
    out = _run(spec, copy.deepcopy(rewritten).double(), sizes, seed)
    return output_errors(spec, ref, out)


def pass_parity_problem(
    spec: StageSpec,
    original: nn.Module,
    rewritten: nn.Module,
    sizes: dict[str, int],
    seed: int,
    ref: Sequence[torch.Tensor],
    out: Sequence[torch.Tensor],
) -> str | None:
    """None when the rewrite keeps the math on this golden case, else the reason (the caller's BuildError).

    `ref` / `out`: the fp32 outputs of `original` / `rewritten` on the case's inputs, made by `spec.make_inputs`
    with a generator seeded `seed`. Outputs over FP32_LIMIT are re-decided in float64 against FP64_LIMIT."""
    errs32 = {n: e for n, e in output_errors(spec, ref, out).items() if e > FP32_LIMIT}
    if not errs32:
        return None
    name, err32 = next(iter(errs32.items()))
    head = f"{spec.name}: passes changed output {name!r} on case {BucketPlan.key(sizes)}"
    try:
        errs64 = float64_errors(spec, original, rewritten, sizes, seed)
    except (RuntimeError, TypeError, ValueError) as e:  # a module or op that keeps fp32 somewhere
        return (
            f"{head} (rel error {err32:.3g} > {FP32_LIMIT}); a rewrite is wrong (the float64 re-check that would "
            f"tell fp32 summation order from a wrong rewrite could not run: {type(e).__name__}: {e})"
        )
    for name, err32 in errs32.items():
        err64 = errs64[name]
        if err64 > FP64_LIMIT:
            return (
                f"{spec.name}: passes changed output {name!r} on case {BucketPlan.key(sizes)} "
                f"(rel error {err32:.3g} > {FP32_LIMIT} in fp32, {err64:.3g} > {FP64_LIMIT} in float64); "
                "a rewrite is wrong"
            )
    return None
