"""The one parity metric: relative error ‖out − ref‖ / ‖ref‖ (Frobenius), computed in double precision on the CPU.

Used for golden checks (build, `verify`), the builder's pass-parity check, the bench and the tests; tolerances in
manifests and tests are bounds on this number."""

from __future__ import annotations

import torch


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; the absolute error ‖out − ref‖ when ref is all zeros. NaN/Inf in `out`
    give NaN/Inf (never a pass). Shapes must broadcast (callers compare equal shapes)."""
    o = out.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    denom = r.norm().item()
    return (o - r).norm().item() / (denom if denom > 0 else 1.0)
