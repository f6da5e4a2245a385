"""CPU probe (issue 15): how far from exact fp32 do the conv kernels' fp32 precisions put the Fish DAC encoder's conv
stack, and do its codes move? The GPU decides the stage default (`python -m bench conv-kernels`: the encoder chains'
`code_match`); this emulates the operand roundings on CPU, where products of TF32 values are exact in fp32:

- ieee:        F.conv1d in fp32 (exact products, fp32 sums: cuDNN fp32 and the kernels' "ieee" are of this kind);
- tf32x3:      Triton's 3xTF32 split a = big + small, big = RN_tf32(a), small fed to the tensor cores (truncated):
               small·big + big·small + big·big, each an fp32-summed conv;
- tf32:        both operands rounded to nearest TF32 (the kernels' "tf32");
- tf32_trunc:  both truncated (raw fp32 on the tensor cores: what "tf32" was before it rounded);
against the same stack in fp64. Random weights (bench.conv_kernels.decoder_stack("enc"), the encoder without its
transformers) on a random-noise clip; codes of a random factorised VQ (bench.conv_kernels._vq_codes) on the latent.

`python bench/probes/tf32x3_emulation.py [--seconds 1.0] [--out FILE]` (≈1-2 min on two cores)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.conv_kernels import _randomize, _vq_codes, decoder_stack  # noqa: E402
from ttsaot.builder.kernels.conv1d import round_to_tf32  # noqa: E402


def trunc_tf32(t: torch.Tensor) -> torch.Tensor:
    return (t.float().contiguous().view(torch.int32) & -8192).view(torch.float32)


_conv1d = F.conv1d


def _split_conv(x, w, bias, stride, padding, dilation, groups, mode: str):
    def conv(a, b):
        return _conv1d(a, b, None, stride, padding, dilation, groups)

    if mode == "tf32":
        y = conv(round_to_tf32(x), round_to_tf32(w))
    elif mode == "tf32_trunc":
        y = conv(trunc_tf32(x), trunc_tf32(w))
    else:  # tf32x3
        xb, wb = round_to_tf32(x), round_to_tf32(w)
        xs, ws = trunc_tf32(x - xb), trunc_tf32(w - wb)
        y = conv(xs, wb) + conv(xb, ws) + conv(xb, wb)
    return y if bias is None else y + bias.view(1, -1, 1)


@contextlib.contextmanager
def conv_mode(mode: str):
    """Every F.conv1d of the stack in `mode` (fp32 inputs); "ieee"/"fp64" leave it alone."""
    if mode in ("ieee", "fp64"):
        yield
        return

    def patched(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
        return _split_conv(x, w, bias, stride, padding, dilation, groups, mode)

    F.conv1d = patched
    try:
        yield
    finally:
        F.conv1d = _conv1d


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.manual_seed(0)
    samples = max(1, round(a.seconds * 44100 / 2048)) * 2048
    eager, _, _ = decoder_stack("enc")
    _randomize(eager)
    eager.eval()
    x = torch.randn(1, 1, samples, generator=torch.Generator().manual_seed(1)) * 0.3
    out: dict = {"samples": samples, "modes": {}}
    with torch.no_grad():
        t0 = time.time()
        ref = eager.double()(x.double())
        out["fp64_seconds"] = round(time.time() - t0, 1)
        eager.float()
        codes64 = _vq_codes(ref)
        lat: dict[str, torch.Tensor] = {}
        for mode in ("ieee", "tf32x3", "tf32", "tf32_trunc"):
            t0 = time.time()
            with conv_mode(mode):
                lat[mode] = eager(x)
            codes = _vq_codes(lat[mode])
            bias = ((lat[mode].double() - ref) * ref.sign()).mean() / ref.abs().mean()
            out["modes"][mode] = {
                "rel_err_vs_fp64": float(f"{rel(lat[mode], ref):.3g}"),
                "signed_bias_vs_fp64": float(f"{bias:.3g}"),
                "code_match_vs_fp64": round((codes == codes64).double().mean().item(), 5),
                "seconds": round(time.time() - t0, 1),
            }
        for mode in ("tf32x3", "tf32", "tf32_trunc"):
            out["modes"][mode]["rel_err_vs_ieee"] = float(f"{rel(lat[mode], lat['ieee']):.3g}")
            out["modes"][mode]["code_match_vs_ieee"] = round(
                (_vq_codes(lat[mode]) == _vq_codes(lat["ieee"])).double().mean().item(), 5
            )
        out["frames"] = int(codes64.numel())
    print(json.dumps(out, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
