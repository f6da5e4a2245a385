"""torch.export with a stage's bucket-plan axes made dynamic, as many as the graph allows: the one search that both
the ONNX export (one model per stage) and the AOTI build's dynamic packages (one package for many buckets) use.

An axis range is `(min, max)` or `(min, max, multiple_of)`: the latter becomes `multiple_of * Dim(...)` (an encoder
needs whole hops). The search tries every plan axis dynamic first; on a constraint violation it takes torch's own
suggested fix (a narrower range) or whole steps (guards like `samples // 2048`), then every subset with one axis
fewer, and so on down to no dynamic axis. Only constraint violations are retried: any other export failure is the
stage's bug and raises. Example inputs must be ≥ 2 on every dynamic axis, or torch specialises the axis to 0/1
(the callers export at the largest size of each axis)."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

AxisRange = tuple  # (min, max) or (min, max, multiple_of)


class DynamicExportError(RuntimeError):
    """torch.export failed for a reason other than a dynamic axis (or failed with every axis static)."""


@dataclass
class DynamicExport:
    """What the search got: the program, the axes it kept dynamic (with the ranges the graph accepted), the axes
    it had to leave static and why (torch's first line of the last constraint violation)."""

    program: torch.export.ExportedProgram
    dynamic: dict[str, AxisRange]
    dropped: list[str] = field(default_factory=list)
    reason: str = ""

    def covers(self, sizes: Mapping[str, int]) -> bool:
        """True when a bucket of `sizes` is inside every dynamic axis's range (and on its steps)."""
        for axis, r in self.dynamic.items():
            n = sizes[axis]
            if not r[0] <= n <= r[1] or (len(r) > 2 and n % r[2]):
                return False
        return True


def plan_ranges(sizes_by_axis: Mapping[str, Sequence[int]], low: int | None = None) -> dict[str, tuple[int, int]]:
    """Axes with more than one size → (min, max) of their sizes (`low`: the range's lower end instead of the
    smallest size; ONNX uses 1, since its model serves every size up to the largest without padding). Single-size
    axes stay static: nothing to choose between."""
    return {a: (min(s) if low is None else low, max(s)) for a, s in sizes_by_axis.items() if len(set(s)) > 1}


def with_steps(
    ranges: Mapping[str, AxisRange], steps: Mapping[str, int], sizes_by_axis: Mapping[str, Sequence[int]]
) -> dict[str, AxisRange]:
    """`ranges` with each axis a stage declares stepped (StageSpec.axis_steps) as `(min, max, step)`, where every
    size of that axis is a whole number of steps (otherwise the axis keeps its plain range and the search finds
    what the graph allows)."""
    out = dict(ranges)
    for axis, step in steps.items():
        r = out.get(axis)
        if r is not None and len(r) == 2 and step > 1 and all(n % step == 0 for n in sizes_by_axis[axis]):
            out[axis] = (r[0], r[1], step)
    return out


# A symbol whose range tops out at 2 is asked for up to 3. Found on torch 2.13 (CPU): the tiny Fish dac_decoder
# exported with batch in [1, 2] (frames 8..32) compiled right in the exporting process, but once the program went
# through torch.export.save / load (how it reaches a compile worker) AOTInductor baked batch = 2 into the package
# (batch-1 inputs gave batch-2 outputs; the build's load check refused it); asked as [1, 3] or [1, 4], the same
# saved-and-loaded program compiled right (bench/results/cpu/probes/dynamic_range_top_2/). The package then
# accepts one size more than its buckets; the runtime feeds it bucket sizes only.
MIN_SYMBOL_MAX = 3


def _symbol(name: str, lo: int, hi: int):
    return torch.export.Dim(name, min=lo, max=max(hi, MIN_SYMBOL_MAX) if lo < hi else hi)


def axis_dim(axis: str, lo: int, hi: int, mult: int = 1):
    if mult <= 1:
        return _symbol(axis, lo, hi)
    return mult * _symbol(f"{axis}_per_{mult}", max(1, -(-lo // mult)), hi // mult)


def dynamic_shapes(inputs: Sequence[Mapping[str, Any]], dyn: Mapping[str, AxisRange]) -> list[dict[int, Any]]:
    """Positional dynamic_shapes for `forward(*inputs)` (the stage contract, whatever the parameter names) from the
    I/O descriptors' shapes: a dimension named `axis` or `[axis, scale]` gets that axis's Dim (times scale)."""
    dims = {a: axis_dim(a, *r) for a, r in dyn.items()}
    out: list[dict[int, Any]] = []
    for desc in inputs:
        per: dict[int, Any] = {}
        for d, s in enumerate(desc["shape"]):
            axis, scale = (s, 1) if isinstance(s, str) else (tuple(s) if isinstance(s, list) else (None, 1))
            if axis in dims:
                per[d] = dims[axis] if int(scale) == 1 else int(scale) * dims[axis]
        out.append(per)
    return out


def is_constraint_error(e: BaseException | None) -> bool:
    from torch._dynamo.exc import UserError
    from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

    while e is not None:
        if isinstance(e, ConstraintViolationError):
            return True
        if isinstance(e, UserError) and "onstraint" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def first_line(e: BaseException | None) -> str:
    s = str(e).strip() if e is not None else ""
    return s.splitlines()[0] if s else type(e).__name__


def export_dynamic(
    export: Callable[[list[dict[int, Any]] | None], torch.export.ExportedProgram],
    inputs: Sequence[Mapping[str, Any]],
    sizes_by_axis: Mapping[str, Sequence[int]],
    dyn: Mapping[str, AxisRange],
    name: str,
) -> DynamicExport:
    """`export(dynamic_shapes)` (None = all static) with as many of `dyn`'s axes dynamic as the graph allows: all
    of them first; then axes whose sizes (`sizes_by_axis`) share a factor g > 1 as multiples of g; then every
    subset with one axis fewer, ... Raises DynamicExportError naming `name` for any other failure."""
    names = list(dyn)
    last: BaseException | None = None
    attempts: list[dict[str, AxisRange]] = []
    mults = {a: math.gcd(*sizes_by_axis[a]) for a in names if a in sizes_by_axis}
    stepped = {a: (r[0], r[1], mults[a]) if mults.get(a, 1) > 1 else r for a, r in dyn.items()}
    for k in range(len(names), -1, -1):
        for keep in itertools.combinations(names, k):
            attempts.append({a: dyn[a] for a in keep})
            if any(stepped[a] != dyn[a] for a in keep):
                attempts.append({a: stepped[a] for a in keep})
    queue = list(attempts)
    while queue:
        sub = queue.pop(0)
        try:
            ep = export(dynamic_shapes(inputs, sub) if sub else None)
        except Exception as e:  # noqa: BLE001 - only constraint violations are retried
            if not is_constraint_error(e):
                raise DynamicExportError(f"{name}: torch.export failed: {type(e).__name__}: {first_line(e)}") from e
            last = e
            narrowed = suggested_ranges(e, sub) or stepped_ranges(e, sub, mults)
            if narrowed is not None and narrowed not in attempts:
                attempts.append(narrowed)
                queue.insert(0, narrowed)  # torch's own fix first: a narrower range or whole steps
            continue
        dropped = sorted(set(names) - set(sub))
        return DynamicExport(ep, dict(sub), dropped, first_line(last) if last is not None else "")
    raise DynamicExportError(f"{name}: torch.export failed even with static shapes: {first_line(last)}")


_SUGGESTED = re.compile(r"(\w+) = Dim\('(\w+)'(?:, min=(\d+))?(?:, max=(\d+))?\)")


def suggested_ranges(e: BaseException, sub: Mapping[str, AxisRange]) -> dict[str, AxisRange] | None:
    """torch.export's "Suggested fixes: samples = Dim('samples', min=2049, max=45056)" for our plain dynamic
    axes: the same axes with the narrowed ranges, or None when it suggests nothing new for them."""
    text = str(e)
    if "Suggested fixes" not in text:
        return None
    out, changed = dict(sub), False
    for name, _dim, lo, hi in _SUGGESTED.findall(text.split("Suggested fixes", 1)[1]):
        r = sub.get(name)
        if r is None or len(r) > 2:
            continue
        new = (int(lo) if lo else r[0], int(hi) if hi else r[1])
        if new != tuple(r) and new[0] <= new[1]:
            out[name], changed = new, True
    return out if changed else None


_FLOORDIV = re.compile(r"Not all values of (\w+) = .*?// (\d+)\)")


def stepped_ranges(
    e: BaseException, sub: Mapping[str, AxisRange], mults: Mapping[str, int]
) -> dict[str, AxisRange] | None:
    """Guards like `samples // 2048` (a conv stack that needs whole hops): make the axis dynamic in steps of
    that divisor, when every bucket size is a multiple of it."""
    out, changed = dict(sub), False
    for name, div in _FLOORDIV.findall(str(e)):
        d, r = int(div), sub.get(name)
        if r is None or len(r) > 2 or d <= 1 or mults.get(name, 1) % d:
            continue
        out[name], changed = (r[0], r[1], d), True
    return out if changed else None


def range_record(r: AxisRange) -> dict[str, int]:
    """An axis range as the manifest writes it: {min, max[, multiple_of]} (the step-aligned ends)."""
    if len(r) > 2 and r[2] > 1:
        m = r[2]
        return {"min": max(m, -(-r[0] // m) * m), "max": r[1] // m * m, "multiple_of": m}
    return {"min": r[0], "max": r[1]}


__all__ = [
    "DynamicExport",
    "DynamicExportError",
    "axis_dim",
    "dynamic_shapes",
    "export_dynamic",
    "first_line",
    "is_constraint_error",
    "plan_ranges",
    "range_record",
    "stepped_ranges",
    "suggested_ranges",
    "with_steps",
]
