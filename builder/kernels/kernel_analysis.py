"""One access analysis per distinct user-Triton-kernel call while a stage is exported and compiled.

Why: torch decides which tensors a user Triton kernel reads and writes by compiling the kernel to TTIR (Triton's
frontend, in Python) and walking the IR, and it does so again at every call site in every tracing pass (export,
AOTAutograd's functionalisation, Inductor's lowering). A looped stage calls the same kernels hundreds of times:
the H100 build of `locdit` (12 DiT layers × 9 estimator calls = 108 layer passes, ~500 kernel calls) ran about
4,000 analyses, 166 s of Triton frontend time, and had not finished after 380 s
(bench/results/nvidia-h100/probes/locdit_build_profile/).

What the analysis sees is exactly what torch's `generate_ttir` hands Triton: the kernel, each tensor argument as
`torch.empty(2, dtype)` (so only its dtype), every scalar's value (a symbolic size as the constant 2) and the TMA
metadata. Keyed on those, the result is the same for every call with the same key, and it is computed once per
process. Calls with anything else (a real tensor, whose pointer alignment Triton specialises on; TMA descriptors;
an unhashable argument) go to torch's analysis unchanged.

Every answer for a kernel-layer kernel is also checked against the writes its module declares (`WRITES`): an
argument the analysis counts as written becomes a mutated output of the package, which the runtime refuses at
its first call (H200 at 2d3e484: every code_predictor package returned its weights), so the build stops here
with the kernel and the arguments named instead."""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Iterator
from typing import Any

import torch

# torch ≥ 2.12 names it identify_accessed_tensors (reads and writes), 2.11 identify_mutated_tensors (writes): same
# arguments (kernel, kwargs, tma_descriptor_metadata), looked up through the module at each call by its callers.
_ANALYSES = ("identify_accessed_tensors", "identify_mutated_tensors")
_results: dict[tuple, Any] = {}
_UNCACHEABLE = object()


class KernelAccessError(RuntimeError):
    """torch's access analysis counts as written an argument that its kernel only reads."""


def written_args(result: Any) -> list[str]:
    """The argument names an analysis result counts as written (torch ≥ 2.12: accesses; 2.11: a list of names)."""
    result = result.read_writes.writes if hasattr(result, "read_writes") else result
    return sorted(getattr(d, "name", d) for d in result)


def check_writes(kernel: Any, result: Any) -> None:
    """Raise KernelAccessError when `result` counts as written an argument that the kernel's module does not
    declare in its WRITES; kernels whose module declares none are not checked."""
    fn = kernel
    while hasattr(fn, "fn"):  # an autotuner / JIT function → the Python function
        fn = fn.fn
    declared = getattr(sys.modules.get(getattr(fn, "__module__", ""), None), "WRITES", {})
    name = getattr(fn, "__name__", "")
    if name not in declared:
        return
    extra = sorted(set(written_args(result)) - declared[name])
    if extra:
        raise KernelAccessError(
            f"{name}: torch's access analysis counts {extra} as written, which the kernel only reads; AOTInductor "
            "would return them as mutated package outputs. Either a stored pointer's offsets come out of a helper "
            "call that takes those arguments (make the offsets in the kernel body, as skinny_linear_kernel does), "
            "or the analysis failed (torch logged why, above)"
        )


def _arg_key(value: Any) -> Any:
    import sympy
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, sympy.Expr)):
        return ("symbolic",)  # generate_ttir substitutes 2 for every one of them
    if isinstance(value, FakeTensor):
        return ("tensor", value.dtype)
    if isinstance(value, torch.Tensor):
        return _UNCACHEABLE  # a real tensor reaches Triton as it is (its data pointer's alignment is specialised)
    try:
        from torch._inductor.ir import TensorBox

        if isinstance(value, TensorBox):
            return ("tensor", value.get_dtype())
    except ImportError:
        pass
    try:
        hash(value)
    except TypeError:
        return _UNCACHEABLE
    return (type(value).__name__, value)  # the type too: 1, 1.0 and True hash alike but specialise differently


def analysis_key(kernel: Any, kwargs: dict[str, Any], tma_descriptor_metadata: Any) -> tuple | None:
    """The memo key of one analysis call, or None when it must not be memoised."""
    if tma_descriptor_metadata:
        return None
    args = []
    for name in sorted(kwargs):
        k = _arg_key(kwargs[name])
        if k is _UNCACHEABLE:
            return None
        args.append((name, k))
    return (kernel, tuple(args))


@contextlib.contextmanager
def memoized_kernel_analysis() -> Iterator[bool]:
    """Within: torch's user-kernel access analysis is memoised by `analysis_key` (process-wide; every hit returns a
    deep copy) and checked by `check_writes`. Yields whether this torch has an analysis to memoise; leaves the
    module as it found it."""
    import torch._higher_order_ops.triton_kernel_wrap as wrap

    name = next((n for n in _ANALYSES if callable(getattr(wrap, n, None))), None)
    if name is None or getattr(getattr(wrap, name), "_ttsaot_memoized", False):
        yield name is not None  # unknown torch, or already inside an enclosing context
        return
    original = getattr(wrap, name)

    def memoized(kernel, kwargs, tma_descriptor_metadata, *rest, **options):
        key = None if rest or options else analysis_key(kernel, kwargs, tma_descriptor_metadata)
        if key is None:
            result = original(kernel, kwargs, tma_descriptor_metadata, *rest, **options)
            check_writes(kernel, result)
            return result
        if key not in _results:
            result = original(kernel, kwargs, tma_descriptor_metadata)
            check_writes(kernel, result)
            _results[key] = result
        return copy.deepcopy(_results[key])

    memoized._ttsaot_memoized = True
    setattr(wrap, name, memoized)
    try:
        yield True
    finally:
        setattr(wrap, name, original)
