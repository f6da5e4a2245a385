"""The one input validator and the one output check of every stage kind.

Inputs are checked against the manifest's I/O descriptors BEFORE any native code sees them (AOTI checks no shape,
dtype or range and computes garbage or crashes instead): dtype, rank, static dims, agreement of bucket axes across
inputs, device, code ranges, NaN/Inf. Outputs of each bucket are checked once against the manifest, so an edited
manifest cannot make the runtime trim or hand out the wrong samples."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from .artifact import TensorSpec
from .errors import BindingError, InputDeviceError, InputDTypeError, InputRangeError, InputShapeError, InputValueError
from .graphs import StaticGraph
from .host_copies import PendingHost


def all_finite(x: torch.Tensor) -> bool:
    """Whether a float tensor holds no NaN or ±Inf, with ONE reduction and one read of its result: its ∞-norm
    (NaN and ±Inf carry into it, finite values keep it finite; an empty tensor holds none). `isfinite(x).all()`
    launches five kernels on CUDA (abs, two compares, an and, the reduction; H100 profile of vae_decoder). Integer
    and bool tensors (codes, masks) are finite by construction."""
    if not x.is_floating_point() or x.numel() == 0:
        return True
    return math.isfinite(_inf_norm(x).item())


def _inf_norm(x: torch.Tensor) -> torch.Tensor:
    """The ∞-norm of a float tensor, left where it is: finite exactly when x holds no NaN or ±Inf."""
    return torch.linalg.vector_norm(x, float("inf"))


def value_checks(spec: TensorSpec) -> tuple[str, ...]:
    """The value checks an input of this descriptor gets: "range" (codes), "finite" (float inputs)."""
    return (("range",) if spec.range is not None else ()) + (
        ("finite",) if spec.finite and spec.torch_dtype.is_floating_point else ()
    )


def flag_ok(what: str, flag: float | bool | torch.Tensor) -> bool:
    """Whether a read-back `InputChecker.flag` of check `what` passed: "finite", an ∞-norm that is finite; "range",
    no value out of range (False / 0)."""
    return math.isfinite(float(flag)) if what == "finite" else not bool(flag)


def shape_str(spec: TensorSpec) -> str:
    """`[batch, 16, frames·64]`: a descriptor's shape as users read it in error messages."""
    return (
        "["
        + ", ".join(
            s if isinstance(s, str) else (f"{s[0]}·{s[1]}" if isinstance(s, list) else str(s)) for s in spec.shape
        )
        + "]"
    )


class InputChecker:
    """Validates named input tensors of one stage and moves them to its device."""

    def __init__(self, stage: str, device: torch.device) -> None:
        self.stage, self.device = stage, device
        self._high: dict[tuple[str, torch.device], torch.Tensor] = {}  # range bounds per input and device, built once

    def check(
        self,
        specs: Sequence[TensorSpec],
        named: dict[str, torch.Tensor],
        sizes: dict[str, int] | None = None,
        values: bool = True,
    ) -> dict[str, int]:
        """Check `named[spec.name]` for every spec; replace each by its copy on the stage device. `sizes`: axis
        sizes already decided by the caller (an LM's row count, its prompt length); the others are read from the
        inputs, which must agree. `values=False` skips the range and NaN/Inf scans (structure is always checked).
        Returns every bucket axis's size."""
        return self.check_deferring(specs, named, sizes, values, defer=False)[0]

    def check_deferring(
        self,
        specs: Sequence[TensorSpec],
        named: dict[str, torch.Tensor],
        sizes: dict[str, int] | None = None,
        values: bool = True,
        defer: bool = True,
    ) -> tuple[dict[str, int], bool]:
        """`check`, except that with `defer` the value checks of inputs that arrive on the device are left to the
        caller, who runs them as one captured graph over its static buffers once they hold the inputs
        (`DeviceValueChecks`). Returns (sizes, whether such checks are pending). Inputs on the host are checked
        here either way, before their copy: a call whose inputs all come from the host never synchronises."""
        sizes = dict(sizes or {})
        fixed = set(sizes)
        for spec in specs:
            self._check_structure(spec, named[spec.name], sizes, fixed)
        # (spec, what, its 0-d bool `flag` on the device), read back together below
        device_checks: list[tuple[TensorSpec, str, torch.Tensor]] = []
        pending = False
        for spec in specs:
            src = named[spec.name]
            on_host = src.device.type == "cpu"
            checks = value_checks(spec) if values and src.numel() else ()
            if on_host:
                # values of a host input are checked on the host, before its copy: no device work, no sync
                for what in checks:
                    if not flag_ok(what, self.flag(spec, what, src)):
                        self.raise_failed(spec, what, src)
            x = named[spec.name] = src.to(self.device, non_blocking=True)
            if checks and not on_host:
                if defer:
                    pending = True
                else:
                    device_checks += [(spec, what, self.flag(spec, what, x)) for what in checks]
        self._read_back(device_checks, named)
        return sizes, pending

    def check_values(self, specs: Sequence[TensorSpec], named: dict[str, torch.Tensor]) -> None:
        """The value checks alone of inputs `check_deferring` already checked and moved: the eager form of its
        pending checks, for a request that does not go to one bucket's buffers (a batch split over buckets)."""
        self._read_back(
            [
                (spec, what, self.flag(spec, what, named[spec.name]))
                for spec in specs
                if named[spec.name].numel()
                for what in value_checks(spec)
            ],
            named,
        )

    def _read_back(self, checks: list[tuple[TensorSpec, str, torch.Tensor]], named: dict[str, torch.Tensor]) -> None:
        if checks:
            flags = torch.stack([flag for *_, flag in checks])
            self.raise_first_failed([(spec, what) for spec, what, _ in checks], flags, named)

    def raise_first_failed(
        self, checks: Sequence[tuple[TensorSpec, str]], flags: torch.Tensor, named: dict[str, torch.Tensor]
    ) -> None:
        """Read the stacked `flag`s of `checks` back and raise the typed error of the first that failed, explained
        from `named` (the caller's tensors). Every check of device data is read back in ONE copy: each read is a
        stream synchronisation (the host waits for the queue to drain), and a predictor frame had five (H100
        profiles: fast_ar, code_predictor). The details of a failure are worked out only then."""
        for (spec, what), flag in zip(checks, flags.tolist(), strict=True):
            if not flag_ok(what, flag):
                self.raise_failed(spec, what, named[spec.name])

    def flag(self, spec: TensorSpec, what: str, x: torch.Tensor, clear: bool = False) -> torch.Tensor:
        """One value check of x as a 0-d tensor where x lives (no synchronisation; `flag_ok` reads it back):
        "range", a bool, True where some value is out of its range; "finite", x's ∞-norm (one reduction), finite
        exactly when x holds no NaN/Inf, compared on the host once read back (`flag_ok`): on the device, `isfinite`
        would be four kernels (abs, two compares, an and) and a compare one more, each a node of the check graph.
        `clear`: afterwards (in stream order) replace in x, in place, every value that fails the check by one that
        passes: a code outside its range by the range's low end, NaN / ±Inf by 0."""
        if what == "range":
            bad = self._out_of_range(spec, x)
            flag = bad.any()
            if clear:
                x.masked_fill_(bad, spec.range.get("low", 0))
            return flag
        flag = _inf_norm(x)  # NaN / ±Inf carry into it
        if clear:
            torch.nan_to_num_(x, nan=0.0, posinf=0.0, neginf=0.0)
        return flag

    def raise_failed(self, spec: TensorSpec, what: str, x: torch.Tensor) -> None:
        """The typed error of a failed value check of input x (the caller's tensor: the details name its values)."""
        if what == "finite":
            raise InputValueError(f"{self.stage}: input {spec.name!r} contains NaN or Inf")
        bad = self._out_of_range(spec, x)
        if not bool(bad.any()):  # a padding value failed: DeviceValueChecks.capturable refuses such pads
            raise InputRangeError(f"{self.stage}: input {spec.name!r} is padded with a value outside its range")
        self._raise_range(spec, x, bad)

    def _check_structure(self, spec: TensorSpec, x: torch.Tensor, sizes: dict[str, int], fixed: set[str]) -> None:
        where = f"{self.stage}: input {spec.name!r}"
        if x.dtype != spec.torch_dtype:
            raise InputDTypeError(f"{where} must be {spec.dtype}, got {str(x.dtype).removeprefix('torch.')}")
        if x.dim() != len(spec.shape):
            raise InputShapeError(f"{where} must have {len(spec.shape)} dims {shape_str(spec)}, got {tuple(x.shape)}")
        for d, s in enumerate(spec.shape):
            if isinstance(s, int) and x.shape[d] != s:
                raise InputShapeError(
                    f"{where} must have shape {shape_str(spec)} (dim {d} must be {s}), got {tuple(x.shape)}"
                )
        for d, axis, _ in spec.axes():
            n = int(x.shape[d])
            if axis in fixed:
                if n != sizes[axis]:
                    raise InputShapeError(
                        f"{where} must have shape {shape_str(spec)} with {axis} = {sizes[axis]}, got {tuple(x.shape)}"
                    )
                continue
            if n == 0:
                raise InputValueError(f"{where} is empty along {axis!r}")
            if sizes.setdefault(axis, n) != n:
                raise InputShapeError(f"{self.stage}: inputs disagree on {axis!r} ({sizes[axis]} vs {n})")
        if x.device.type == "cuda" and self.device.type == "cuda" and x.device != self.device:
            raise InputDeviceError(f"{where} is on {x.device}, the stage runs on {self.device}")

    def _out_of_range(self, spec: TensorSpec, x: torch.Tensor) -> torch.Tensor:
        """Bool like x: the values outside [low, high) of their codebook (no host synchronisation)."""
        rng = spec.range
        high = self._high.get((spec.name, x.device))
        if high is None:
            shape = [1] * x.dim()
            shape[rng["dim"]] = -1
            high = torch.tensor(rng["high"], dtype=x.dtype, device=x.device).view(shape)
            self._high[(spec.name, x.device)] = high
        return (x < rng.get("low", 0)) | (x >= high)

    def _raise_range(self, spec: TensorSpec, x: torch.Tensor, bad: torch.Tensor) -> None:
        rng = spec.range
        idx = tuple(int(i) for i in bad.nonzero()[0].tolist())
        at = idx[rng["dim"]]
        limit = rng["high"][at if len(rng["high"]) > 1 else 0]
        where = f" (codebook {at})" if len(rng["high"]) > 1 else ""
        raise InputRangeError(
            f"{self.stage}: input {spec.name!r}{list(idx)} = {int(x[idx])} is outside [{rng.get('low', 0)}, {limit})"
            f"{where}"
        )


class DeviceValueChecks:
    """The value checks (code ranges, NaN/Inf) of one bucket's device inputs as ONE CUDA graph over its static
    input buffers, its verdict read back without a stream synchronisation.

    Why a graph: eagerly each check is 4-5 small aten ops, each a few µs of host time while the GPU waits for the
    call's graph: with checks vs without, one call of the H200 bench took +156 µs for the code_predictor (24 check
    kernels), +200 fast_ar, +188 locdit, +71 residual_lm_step (bench/results/nvidia-h200/*.json,
    `ms_without_input_validation`). Replayed, the same kernels cost one launch.

    Why the verdict after the package's launch (`launch`, then the package's graph, then `verdict`): read back
    BEFORE that launch, the flags cost a stream synchronisation, during which the GPU idles, and then the GPU
    waits again for the host's launch of the package: 66-104 µs a call on the H100 at ee27d29 (residual_lm_step
    b1 0.420 ms with its checks, 0.354 without; base_lm_step 1.306 / 1.202 ms;
    bench/results/nvidia-h100/voxcpm2__*_lm_step.json). Now the flags go to pinned host memory behind the check
    graph and the host waits for that copy alone (an event), while the GPU goes on into the package's graph. The
    package may then run before its inputs are judged, so the check graph also clears, in the buffers, every
    value that fails its check (`InputChecker.flag(clear=True)`): a refused call's package reads no code out of
    its range (an embedding gather out of bounds would fault the CUDA context) and writes nothing non-finite,
    and its outputs are never handed out. A caller whose package writes state a refused call must leave as it
    was (an LM prefill rewrites its rows' live cache slots) calls `run`: the verdict first, then its launch.

    The buffers hold the inputs padded to the bucket, so the pads are checked too: `capturable` accepts only pads
    that pass (codes' pad in range, finite float pads); a stage whose pads do not keeps the eager checks. A failed
    flag is explained from the caller's own tensor (`InputChecker.raise_failed`), so the error names the same
    input, index and value as the eager checks. `capture=False` runs the checks on the buffers at each call (the
    CPU path of the static-buffer machinery)."""

    def __init__(
        self,
        checker: InputChecker,
        specs: Sequence[TensorSpec],
        buffers: Sequence[torch.Tensor],
        device: torch.device,
        pool: Any = None,
        capture: bool = True,
    ) -> None:
        self.checker = checker
        self.items = [
            (i, spec, what) for i, spec in enumerate(specs) if buffers[i].numel() for what in value_checks(spec)
        ]
        self._checks = [(spec, what) for _, spec, what in self.items]
        self.graph = (
            StaticGraph(self._flags, buffers, device, pool, capture=capture, pool_reserve=False) if self.items else None
        )
        self._readback: PendingHost | None = None

    @staticmethod
    def capturable(specs: Sequence[TensorSpec], pads: Sequence[float | int | None]) -> bool:
        """Whether every input's padding value passes its own checks (None pads with 0, as the runners do)."""
        for spec, pad in zip(specs, pads, strict=True):
            value = 0 if pad is None else pad
            if spec.range is not None and not (spec.range.get("low", 0) <= value < min(spec.range["high"])):
                return False
            if "finite" in value_checks(spec) and not math.isfinite(float(value)):
                return False
        return True

    def _flags(self, buffers: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([self.checker.flag(spec, what, buffers[i], clear=True) for i, spec, what in self.items])

    def launch(self) -> PendingHost | None:
        """Check the buffers (they hold this call's inputs): the flags on their way to the host, the failing
        values cleared. The flags are copied out at once, so a graph replayed next in the same pool cannot
        overwrite them before they are read; every call reuses one pinned buffer and one event (the runner reads
        each verdict before its next launch). None: nothing to check."""
        if self.graph is None:
            return None
        flags = self.graph.replay()
        if self._readback is None:
            self._readback = PendingHost(flags)
        else:
            self._readback.again(flags)
        return self._readback

    def verdict(self, flags: PendingHost | None, named: dict[str, torch.Tensor]) -> None:
        """Wait for `launch`'s flags; raise the typed error of the first failed check, with its details from
        `named` (the caller's tensors, by input name)."""
        if flags is not None:
            self.checker.raise_first_failed(self._checks, flags.wait(), named)

    def run(self, named: dict[str, torch.Tensor]) -> None:
        """The checks and their verdict, before anything else is launched."""
        self.verdict(self.launch(), named)


def check_outputs(
    stage: str, bucket_key: str, specs: Sequence[TensorSpec], sizes: dict[str, int], outs: Sequence[torch.Tensor]
) -> None:
    """A package's outputs for a bucket of `sizes` (bucket axes plus any axes the stage derives from them, e.g. an
    encoder's `frames`) must have the manifest's shapes and dtypes, or trimming would hand out wrong data."""
    want = [(spec.concrete(sizes), spec.torch_dtype) for spec in specs]
    got = [(tuple(o.shape), o.dtype) for o in outs]
    if got != want:
        raise BindingError(
            f"{stage}/{bucket_key}: package outputs {got} differ from the manifest's {want}; the "
            "manifest was edited or belongs to another build"
        )
