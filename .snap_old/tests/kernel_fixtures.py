"""Shared by tests/test_kernels_*.py: where the Triton kernels run, and the rounding mirror they are held to.

Without a GPU the kernels run under Triton's interpreter: tests/conftest.py sets TRITON_INTERPRET=1 before anything
imports triton (Triton decorates its own library functions, `tl.zeros`, `tl.sum`, ..., at import, so the variable
must be set before the first `import triton` of the process). On a CUDA machine the same tests run the compiled
kernels on the GPU.

The interpreter differs from compiled Triton in one way that matters here: it converts fp32 → bf16 by truncation
(round toward zero), where the GPU rounds to nearest even. The rounding mirrors take the conversion as an argument,
so one test checks the exact rounding order on both."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")


def require_kernel_runtime() -> None:
    """Fail clearly (instead of deep inside Triton) when this CPU process imported triton without the interpreter."""
    if ON_GPU:
        return
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(tl.zeros, InterpretedFunction):
        pytest.fail(
            "Triton was imported without TRITON_INTERPRET=1 (tests/conftest.py sets it before any import of "
            "triton; run the kernel tests through pytest from the repository root)"
        )


def _round_to_zero(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float32:
        return t.float()
    assert dtype == torch.bfloat16, dtype
    return (t.float().contiguous().view(torch.int32) & -65536).view(torch.float32)


def _round_nearest(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.float().to(dtype).float()


def kernel_rounding(dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """fp32 → `dtype` → fp32 the way the kernels' casts round on this machine."""
    fn = _round_nearest if ON_GPU else _round_to_zero
    return lambda t: fn(t, dtype)


def build_recording_exported_ops(family: str, specs: list, root) -> Path:
    """`build_family` on CPU (no verify subprocess) that records the call_function targets of every exported
    program before its CPU lowering, where the ttsaot ops are still nodes; written to <root>/exported_ops.json
    (read it back with `exported_ops`). Returns the artifact path."""
    import json
    from unittest import mock

    from ttsaot.builder import export
    from ttsaot.builder.build import build_family

    seen: list[list[str]] = []
    lower = export.lower_for_cpu

    def recording(ep):
        seen.append([str(n.target) for n in ep.graph.nodes if n.op == "call_function"])
        return lower(ep)

    with mock.patch.object(export, "lower_for_cpu", recording):
        path = build_family(family, specs, root, "cpu", verify_in_subprocess=False).path
    (root / "exported_ops.json").write_text(json.dumps(seen))
    return path


def exported_ops(artifact) -> list[list[str]]:
    """What `build_recording_exported_ops` recorded for the artifact at `artifact`."""
    import json

    return json.loads((artifact.parent / "exported_ops.json").read_text())
