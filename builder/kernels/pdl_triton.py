"""The device half of programmatic dependent launch (launch half and the why: pdl.py).

Imported by the Triton kernel modules. Triton's own `gdc_wait` / `gdc_launch_dependents` are impure inline asm,
which torch's user-kernel mutation analysis cannot read (it then assumes every input is mutated; the L2-prefetch
probe's AOTI build failed that way). This is one PURE asm with a result instead: the result (always 0) is added to
every activation pointer, so the data dependence alone keeps each load of a previous kernel's output after the wait,
and the asm cannot be dropped while the pointers use it.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _asm_zero(ASM: tl.constexpr):
    """Run the PTX in ASM (which must end by setting $0 to 0) as one pure asm; its result, × 64: an opaque value has
    unknown alignment, and without the factor every pointer it offsets loses its 16-byte divisibility and with it
    vector loads, cp.async and register budget (seen as spills in sm_90 SASS)."""
    return tl.inline_asm_elementwise(ASM, "=r", [], dtype=tl.int32, is_pure=True, pack=1) * 64


@triton.jit
def grid_dependency_wait(PDL: tl.constexpr, TRIGGER: tl.constexpr):
    """0 (int32). With PDL (sm_90+): wait until the previous grid has completed and its writes are visible; with
    TRIGGER, first let the dependent grid launch (its programs then start loading their weights while this kernel
    runs). Every program of a kernel launched with the attribute must call this before it reads or writes
    anything a previous kernel writes (activations, caches, workspaces, buffers the allocator reuses). The one
    exception: the split decode attention's first cache block where its caller promises a settled cache
    (decode_attention.py `cache_settled`: no kernel of the stage call writes those slots)."""
    # One line each, no escapes: AOTInductor re-emits user kernel sources (comments too) inside a non-raw
    # triple-quoted string, where an escaped newline became a real one (H100: "unterminated string literal").
    if PDL:
        if TRIGGER:
            token = _asm_zero("griddepcontrol.launch_dependents; griddepcontrol.wait; mov.u32 $0, 0;")
        else:
            token = _asm_zero("griddepcontrol.wait; mov.u32 $0, 0;")
    else:
        token = 0
    return token


@triton.jit
def grid_dependency_trigger(PDL: tl.constexpr):
    """0 (int32): the late trigger of a kernel that waited without one (the dependent grid launches once every
    program has passed here). The result must be used (added to the output rows) or the pure asm is dropped."""
    if PDL:
        token = _asm_zero("griddepcontrol.launch_dependents; mov.u32 $0, 0;")
    else:
        token = 0
    return token
