"""Keep AOTInductor's C++ wrapper from reusing an int-array declaration of a discarded code buffer.

Why: the cpp wrapper memoises `codegen_int_array_var` (the `int64_t int_array_N[] = {...}` declarations of sizes and
strides) under a key holding `id(writeline.__self__)`, the buffer the declaration was written into. Memory planning
generates the code twice and throws the first pass's buffers away; once one is garbage-collected, a new object can
get its id, and a lookup from the second pass then returns a variable that was only declared in the discarded code.
The H100 LocDiT build (a 13,000-line wrapper) failed that way, now and then, in both of two source trees of one A/B
(`error: 'int_array_2127' was not declared in this scope; did you mean 'int_array_1227'?`,
bench/results/nvidia-h100/probes/skinny_split_k_ab/), and built on the next try.

`stable_int_array_ids()` pins every object whose id enters the key for as long as the wrapper lives, so an id in
the cache always names the same live buffer. Nothing else changes: same variables, same code when no id is reused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

_PINS = "_ttsaot_pinned_writeline_owners"


def _pinning(original: Callable[..., str]) -> Callable[..., str]:
    def codegen_int_array_var(self: Any, int_array: str, writeline: Callable[..., None], *args: Any, **kw: Any) -> str:
        pins = self.__dict__.setdefault(_PINS, {})
        # alive as long as the wrapper (and its cache), so their ids are never reused: the buffer (the key's
        # `writeline.__self__`) and the bound method itself (what older torch keys on)
        for obj in (getattr(writeline, "__self__", writeline), writeline):
            pins.setdefault(id(obj), obj)
        return original(self, int_array, writeline, *args, **kw)

    codegen_int_array_var.__wrapped__ = original  # type: ignore[attr-defined]
    return codegen_int_array_var


@contextlib.contextmanager
def stable_int_array_ids() -> Iterator[bool]:
    """While an AOTInductor compile runs: the int-array cache's writeline owners stay alive. Yields whether the
    wrapper class was found (a torch without it compiles unchanged)."""
    try:
        from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    except ImportError:
        yield False
        return
    original = CppWrapperCpu.__dict__.get("codegen_int_array_var")
    if original is None:
        yield False
        return
    CppWrapperCpu.codegen_int_array_var = _pinning(original)
    try:
        yield True
    finally:
        CppWrapperCpu.codegen_int_array_var = original
