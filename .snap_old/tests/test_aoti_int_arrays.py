"""builder/aoti_int_arrays.py: the cpp wrapper's int-array cache never hands out a declaration from a buffer that
was garbage-collected (the H100 LocDiT build's `int_array_N was not declared in this scope`)."""

from __future__ import annotations

import gc
import itertools
import weakref

import pytest
from torch._inductor.codegen import cpp_wrapper_cpu
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu

from ttsaot.builder.aoti_int_arrays import stable_int_array_ids


class _Buffer:
    """A code buffer whose bound `writeline` is what the wrapper passes (IndentedBuffer's role)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def writeline(self, line: str) -> None:
        self.lines.append(line)


class _Wrapper:
    """The state torch's codegen_int_array_var reads; declarations numbered like the real ones."""

    def __init__(self) -> None:
        self.codegen_int_array_var_cache: dict = {}
        self.n = 0

    def _codegen_int_array_var_impl(self, int_array, writeline, known_statically):
        var = f"int_array_{self.n}"
        self.n += 1
        writeline(f"int64_t {var}[] = {int_array};")
        return var


class _ReusedIds:
    """`id` as CPython's allocator behaves at worst: an object gets the lowest address no live object holds, so a
    collected buffer's id goes to the next buffer (torch's cache key is that id)."""

    def __init__(self) -> None:
        self.slots: dict[int, weakref.ref] = {}

    def __call__(self, obj) -> int:
        for slot, ref in self.slots.items():
            if ref() is obj:
                return slot
        slot = next(s for s in itertools.count() if s not in self.slots or self.slots[s]() is None)
        self.slots[slot] = weakref.ref(obj)
        return slot


@pytest.fixture
def reused_ids(monkeypatch):
    monkeypatch.setattr(cpp_wrapper_cpu, "id", _ReusedIds(), raising=False)


def _passes(method) -> tuple[str, str, _Buffer]:
    """Memory planning's two passes: a declaration written into a first buffer that is then dropped, and the same
    array asked for from a second buffer, which must get its own declaration."""
    w = _Wrapper()
    first = _Buffer()
    a = method(w, "{1, 2}", first.writeline)
    del first
    gc.collect()
    second = _Buffer()  # gets the dropped buffer's id
    b = method(w, "{1, 2}", second.writeline)
    return a, b, second


def test_a_dropped_buffer_never_lends_its_declaration_to_a_new_one(reused_ids):
    original = CppWrapperCpu.__dict__["codegen_int_array_var"]
    a, b, second = _passes(original)
    assert a == b and second.lines == []  # torch alone: the new buffer uses a variable it never declared
    with stable_int_array_ids() as applied:
        assert applied
        patched = CppWrapperCpu.__dict__["codegen_int_array_var"]
        a, b, second = _passes(patched)
        assert a != b and second.lines == [f"int64_t {b}[] = {{1, 2}};"]
    assert CppWrapperCpu.__dict__["codegen_int_array_var"] is original


def test_the_same_live_buffer_still_shares_one_declaration():
    with stable_int_array_ids():
        method = CppWrapperCpu.__dict__["codegen_int_array_var"]
        w, buf = _Wrapper(), _Buffer()
        assert method(w, "{4}", buf.writeline) == method(w, "{4}", buf.writeline) == "int_array_0"
        assert method(w, "{5}", buf.writeline) == "int_array_1" and len(buf.lines) == 2


def test_torch_2_11_key_on_the_bound_method_is_pinned_too(reused_ids):
    """torch 2.11 (the GPU machine's) keys the cache on `id(writeline)`, the bound method object, which is created
    anew at each attribute access and dropped after the call: the pin keeps it alive as well."""
    from ttsaot.builder.aoti_int_arrays import _pinning

    def torch_2_11(self, int_array, writeline, known_statically=False, graph=None):
        key = (int_array, cpp_wrapper_cpu.id(writeline), known_statically, None)
        if key not in self.codegen_int_array_var_cache:
            self.codegen_int_array_var_cache[key] = self._codegen_int_array_var_impl(
                int_array, writeline, known_statically
            )
        return self.codegen_int_array_var_cache[key]

    a, b, second = _passes(torch_2_11)
    assert a == b and second.lines == []
    a, b, second = _passes(_pinning(torch_2_11))
    assert a != b and second.lines == [f"int64_t {b}[] = {{1, 2}};"]
