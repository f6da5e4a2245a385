"""Probe (issue 17): PyTorch's masked SDPA in the Fish DAC decoder's post-quantizer transformer (16 heads × 64,
causal window 128, bf16: 8 calls per package) by backend. The first call of each new shape under cuDNN's attention
sets itself up: 50-140 ms of each package's first call in the decoder's warm-ups at load
(../results/nvidia-h200/probes/first_call_cost/).

    python -m bench.probes.sdpa_backends --out OUT [--skip-aoti]

1. Eager, per (B, T) and backend (cuDNN, memory-efficient, and `ttsaot::window_attention`, which the kernel
   bodies now run instead): the first call at the new shape (synchronised; the op's first call overall includes
   Triton's JIT compile and autotuning, which a package does not pay), the per-call time
   (bench.common.graph_replay_ms: a graph of 20 calls, median of 5 replays), the error against the fp32 math
   backend.
2. AOTInductor: a one-attention module exported and compiled with cuDNN's attention excluded
   (torch.nn.attention.sdpa_kernel), then which SDPA op the package's wrapper calls and its first call.
Writes OUT/sdpa_backends.json."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import ttsaot.builder.kernels  # noqa: F401 - registers ttsaot::window_attention
from bench.common import graph_replay_ms

HEADS, HEAD_DIM, WINDOW = 16, 64, 128
SHAPES = [(1, 16), (1, 32), (1, 64), (1, 128), (1, 200), (4, 64), (4, 200)]
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}


def _mask(T: int, dev) -> torch.Tensor:
    i = torch.arange(T, device=dev)[:, None]
    j = torch.arange(T, device=dev)[None, :]
    return (j <= i) & (j > i - WINDOW)


def eager(dev) -> list[dict[str, Any]]:
    rows = []
    g = torch.Generator(device=dev).manual_seed(0)
    for B, T in SHAPES:
        q, k, v = (torch.randn(B, HEADS, T, HEAD_DIM, generator=g, device=dev, dtype=torch.bfloat16) for _ in range(3))
        mask = _mask(T, dev)
        with sdpa_kernel([SDPBackend.MATH]):
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
        for name in (*BACKENDS, "ttsaot"):
            row: dict[str, Any] = {"B": B, "T": T, "backend": name}
            if name == "ttsaot":  # the op on [B, T, H, D] views, its output [B, T, H·D] back to [B, H, T, D]
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                call = functools.partial(torch.ops.ttsaot.window_attention, qt, kt, vt, WINDOW, HEAD_DIM**-0.5, "ieee")
                ctx: Any = contextlib.nullcontext()
            else:
                call = functools.partial(F.scaled_dot_product_attention, q, k, v, attn_mask=mask)
                ctx = sdpa_kernel([BACKENDS[name]])
            try:
                with ctx:
                    torch.cuda.synchronize(dev)
                    t = time.perf_counter()
                    y = call()
                    torch.cuda.synchronize(dev)
                    row["first_ms"] = (time.perf_counter() - t) * 1e3
                    t = time.perf_counter()
                    call()
                    torch.cuda.synchronize(dev)
                    row["second_ms"] = (time.perf_counter() - t) * 1e3
                    row["graph_us_per_call"] = graph_replay_ms([call] * 20, reps=5) * 1e3
                    if name == "ttsaot":
                        y = y.view(B, T, HEADS, HEAD_DIM).transpose(1, 2)
                    row["max_abs_err_vs_fp32_math"] = float((y.float() - ref).abs().max())
            except Exception as ex:  # noqa: BLE001 - recorded
                row["error"] = f"{type(ex).__name__}: {str(ex)[:200]}"
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


class _Attn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(HEADS * HEAD_DIM, 3 * HEADS * HEAD_DIM, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_mask(T, x.device))


def aoti(dev) -> dict[str, Any]:
    from torch._inductor import aoti_compile_and_package, aoti_load_package

    m = _Attn().to(dev, torch.bfloat16).eval()
    x = torch.randn(1, 64, HEADS * HEAD_DIM, device=dev, dtype=torch.bfloat16)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d, torch.no_grad():
        for name, allowed in (
            ("default", None),
            ("no_cudnn", [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]),
        ):
            path = str(Path(d) / f"{name}.pt2")
            t = time.perf_counter()
            if allowed is None:
                ep = torch.export.export(m, (x,))
                aoti_compile_and_package(ep, package_path=path)
            else:
                with sdpa_kernel(allowed):
                    ep = torch.export.export(m, (x,))
                    aoti_compile_and_package(ep, package_path=path)
            rec: dict[str, Any] = {"compile_s": time.perf_counter() - t}
            with zipfile.ZipFile(path) as z:
                src = "".join(z.read(n).decode(errors="ignore") for n in z.namelist() if n.endswith(".cpp"))
            rec["wrapper_calls"] = sorted({w for w in ("cudnn_attention", "efficient_attention", "flash_attention",
                                                       "scaled_dot_product") if w in src})  # fmt: skip
            pkg = aoti_load_package(path)
            torch.cuda.synchronize(dev)
            t = time.perf_counter()
            y = pkg(x)
            torch.cuda.synchronize(dev)
            rec["first_ms"] = (time.perf_counter() - t) * 1e3
            t = time.perf_counter()
            pkg(x)
            torch.cuda.synchronize(dev)
            rec["second_ms"] = (time.perf_counter() - t) * 1e3
            rec["max_abs_diff_vs_eager"] = float((y.float() - m(x).float()).abs().max())
            print(name, json.dumps(rec), flush=True)
            out[name] = rec
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--skip-aoti", action="store_true", help="only the eager part (1)")
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.zeros(1, device=dev)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
                           "cudnn": torch.backends.cudnn.version(), "eager": eager(dev)}  # fmt: skip
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "sdpa_backends.json").write_text(json.dumps(res, indent=1))
    if a.skip_aoti:
        return
    try:
        res["aoti"] = aoti(dev)
    except Exception as ex:  # noqa: BLE001
        res["aoti"] = {"error": f"{type(ex).__name__}: {str(ex)[:400]}"}
        print(res["aoti"], flush=True)
    (a.out / "sdpa_backends.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
