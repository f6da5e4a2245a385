"""Check an artifact's ONNX models with onnxruntime against its golden cases (the fp32 eager reference).

CPU provider always; CUDA provider when onnxruntime has it. Every file is integrity-checked (size + sha256)
against the manifest before onnxruntime reads it. Dynamic axes take the golden inputs as they are; axes the
export left static are padded to their size with the input descriptors' `pad` values and the outputs trimmed,
as the ttsaot runtime does for AOTI buckets.

A provider that has no kernel for the graph (onnxruntime's CPU provider has no bfloat16 Conv, for example) is
reported as skipped with onnxruntime's message, never as a pass.

Also the build-time subprocess check: `python -m ttsaot.builder.onnx_verify DIR --json`."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..runtime.artifact import StageEntry, check_file, read_manifest
from ..runtime.verify import compare, compare_decided, load_golden

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"


@dataclass
class OnnxCaseResult:
    stage: str
    case: str
    output: str
    provider: str
    metric: str
    value: float
    limit: float
    ok: bool
    skipped: str = ""  # why this provider could not run the model ("" = it ran)


def default_providers() -> list[str]:
    import onnxruntime as ort

    have = ort.get_available_providers()
    return [p for p in (CPU, CUDA) if p in have]


_ONNX_BF16 = 16  # TensorProto.BFLOAT16


def _to_ort(t: torch.Tensor):
    import onnxruntime as ort

    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(t.view(torch.int16).numpy().view(np.uint16), _ONNX_BF16)
    return ort.OrtValue.ortvalue_from_numpy(t.numpy())


def _from_ort(v) -> torch.Tensor:
    if v.data_type() == "tensor(bfloat16)":
        raw = np.asarray(v.numpy())
        return torch.from_numpy(raw.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.asarray(v.numpy()).copy())


def onnx_files(entry: StageEntry) -> list:
    if entry.onnx is None:
        return []
    return [entry.onnx.model, *entry.onnx.external_data]


def _target(entry: StageEntry, axis: str, n: int) -> int:
    """The size the model takes for `n` along `axis`: a static axis its fixed size; a dynamic axis at least its
    min, rounded up to its step (`multiple_of`); otherwise n."""
    onnx = entry.onnx
    if axis in onnx.static_axes:
        if n > onnx.static_axes[axis]:
            raise ValueError(f"{entry.name}: {axis}={n} exceeds the ONNX model's static size {onnx.static_axes[axis]}")
        return onnx.static_axes[axis]
    rng = onnx.dynamic_axes.get(axis, {})
    step = rng.get("multiple_of", 1)
    return -(-max(n, rng.get("min", 1)) // step) * step


def run_case(session, entry: StageEntry, inputs: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], bool]:
    """Run one call: pad static (or stepped) axes, feed, trim outputs to the caller's sizes. Returns the outputs
    and whether any input was padded."""
    sizes: dict[str, int] = {}
    feeds = {}
    padded = False
    for spec in entry.inputs:
        x = inputs[spec.name]
        for d, axis, scale in spec.axes():
            sizes.setdefault(axis, int(x.shape[d]) // scale)
        full = list(x.shape)
        for d, axis, scale in spec.axes():
            full[d] = _target(entry, axis, int(x.shape[d]) // scale) * scale
        if full != list(x.shape):
            buf = torch.full(full, spec.pad if spec.pad is not None else 0, dtype=x.dtype)
            buf[tuple(slice(0, n) for n in x.shape)] = x
            x, padded = buf, True
        feeds[spec.name] = _to_ort(x)
    outs = session.run_with_ort_values([o.name for o in entry.outputs], feeds)
    trimmed = []
    for spec, v in zip(entry.outputs, outs):
        o = _from_ort(v)
        idx = [slice(None)] * o.dim()
        for d, axis, scale in spec.axes():
            if axis in sizes:
                idx[d] = slice(0, sizes[axis] * scale)
        trimmed.append(o[tuple(idx)])
    return trimmed, padded


def _trim_derived(out: torch.Tensor, ref: torch.Tensor, spec) -> torch.Tensor:
    """An output axis that is not an input axis (the encoder's frames = ⌈samples / hop⌉) is not trimmed by
    run_case; after padding a static input axis it is longer than the caller's: cut it to the reference length,
    as the runtime stage does. Only axis dims, and only ever shorter."""
    if out.dim() != ref.dim():
        return out
    idx = [slice(None)] * out.dim()
    for d, _axis, _scale in spec.axes():
        if out.shape[d] > ref.shape[d]:
            idx[d] = slice(0, ref.shape[d])
    return out[tuple(idx)]


def make_session(path: Path, provider: str):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=so, providers=[provider])


def verify_onnx(
    root: str | Path, stages: list[str] | None = None, providers: list[str] | None = None
) -> list[OnnxCaseResult]:
    root = Path(root)
    manifest = read_manifest(root)
    providers = providers or default_providers()
    results: list[OnnxCaseResult] = []
    for name, entry in manifest.stages.items():
        if (stages and name not in stages) or entry.onnx is None or entry.golden is None:
            continue
        for f in onnx_files(entry):
            check_file(root, f)
        golden = load_golden(check_file(root, entry.golden))
        model_path = root / entry.onnx.model.file
        for provider in providers:
            try:
                session = make_session(model_path, provider)
            except Exception as e:  # noqa: BLE001 - e.g. NOT_IMPLEMENTED: no kernel for a dtype on this provider
                msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                for case in entry.golden_cases:
                    for spec in entry.outputs:
                        results.append(
                            OnnxCaseResult(
                                name,
                                case,
                                spec.name,
                                provider,
                                "-",
                                float("nan"),
                                entry.tolerance,
                                False,
                                skipped=msg[:300],
                            )
                        )
                continue
            for case in entry.golden_cases:
                inputs = {s.name: golden[f"{case}/in/{s.name}"] for s in entry.inputs}
                outs, padded = run_case(session, entry, inputs)
                for spec, o in zip(entry.outputs, outs):
                    ref = golden[f"{case}/out/{spec.name}"]
                    if padded:
                        o = _trim_derived(o, ref, spec)
                    margin = golden.get(f"{case}/margin/{spec.name}")
                    if margin is not None:  # decided codes: a difference is allowed at a near-tie only
                        metric, value, limit, ok, _ = compare_decided(o, ref, margin, entry.tolerance)
                    else:
                        metric, value, limit, ok = compare(o, ref, entry.tolerance)
                    results.append(OnnxCaseResult(name, case, spec.name, provider, metric, value, limit, ok))
    return results


def failures(results: list[OnnxCaseResult]) -> list[OnnxCaseResult]:
    return [r for r in results if not r.ok and not r.skipped]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ttsaot.builder.onnx_verify")
    p.add_argument("artifact")
    p.add_argument("--stages", default=None)
    p.add_argument("--providers", default=None, help="comma-separated onnxruntime providers (default: CPU, CUDA)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    results = verify_onnx(
        a.artifact, a.stages.split(",") if a.stages else None, a.providers.split(",") if a.providers else None
    )
    if a.json:
        print(json.dumps([asdict(r) for r in results]))
    else:
        for r in results:
            state = "skip" if r.skipped else ("ok  " if r.ok else "BAD ")
            print(
                f"{state} {r.stage}/{r.case}/{r.output} [{r.provider}]: {r.metric}={r.value:.3g} "
                f"(limit {r.limit:.3g}){' ' + r.skipped if r.skipped else ''}"
            )
    ran = [r for r in results if not r.skipped]
    return 0 if ran and not failures(results) else 1


if __name__ == "__main__":
    sys.exit(main())
