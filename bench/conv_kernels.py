"""`python -m bench conv-kernels --out DIR`: the codec conv kernels (builder/kernels/conv1d.py) against cuDNN, per
layer and per fused chain, on the GPU (issue 15).

Layers: every dense/depthwise conv of the H100 survey (bench/results/nvidia-h100/probes/codec_conv_survey.json:
code2wav bf16 B=1/4 50 frames, Fish dac_decoder fp32 (as TF32 and as tf32x3) and bf16 at 29 frames, the VoxCPM2
VAE decoder 36 frames, the Fish DAC encoder 10 s), identical shapes timed once. Per shape:
- `cudnn_ms`: F.conv1d / conv_transpose1d on the pre-padded NCL input in the stage's precision (TF32 on for the
  "tf32" rows, off for "tf32x3"/"ieee", which are compared with exact fp32);
- `kernel_ms`: the Triton kernel without epilogue, best of the autotuning space (each config's time recorded);
- `kernel_nlc_input`: the same kernel and config reading a channels-last copy of x (an experiment: are the
  time-shifted, unaligned NCL loads what limits it?);
- `fused_ms`: the kernel with the layer's epilogue (bias + snake, + residual and the second output inside residual
  units, tanh/clamp on the head) vs `unfused_ms`: pad + cuDNN conv + add + `ttsaot::snake_beta` (the eager chain);
- TFLOP/s, % of the dense tensor-core peak (H100 SXM: 989 bf16, 495 TF32; tf32x3 does 3 TF32 products per useful
  one), errors against an fp64 reference of the same inputs, and for tf32x3 against cuDNN exact fp32.
Every time is the median per call of CUDA-graph replays (launch gaps removed) cycling over enough distinct input /
weight sets that they do not fit in the 50 MB L2 (`rotation`; `l2_resident` when they still do).

Chains: Qwen's 192-channel DecoderBlock and one ResidualUnit, the whole code2wav / Fish / VAE decoder conv stacks
and the Fish encoder conv stack, fused (`fuse_conv_chain`, op autotuner as AOTI uses it) vs the eager modules
(cuDNN + `ttsaot::snake_beta`), both in CUDA graphs.

Work runs as prioritised tasks under a time budget (`--budget`, default 200 s); a task that fails or does not fit
is recorded, never fatal."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import RESULTS_SCHEMA
from .common import REPO, device_info, git_commit, now_iso, rel_err, short_error, write_json

DEVICE = "cuda"          # a module constant so that the logic can be dry-run on CPU (tests patch it)
SURVEY = REPO / "bench" / "results" / "nvidia-h100" / "probes" / "codec_conv_survey.json"
PEAK_TFLOPS = {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "tf32x3": 494.7, "ieee": 66.9}   # H100 SXM, dense
L2_BYTES = 50 * 2**20
ROTATE_BYTES = 160 * 2**20
# (survey stage, survey dtype, batch, precisions to measure); the order is the priority under the budget.
LAYER_PLAN = [
    ("code2wav", "torch.bfloat16", 1, ("bf16",)),
    ("dac_decoder", "torch.float32", 1, ("tf32",)),
    ("vae_decoder", "torch.float32", 1, ("tf32", "tf32x3")),
    ("dac_encoder", "torch.float32", 1, ("tf32x3",)),
    ("code2wav", "torch.bfloat16", 4, ("bf16",)),
    ("dac_decoder", "torch.float32", 4, ("tf32",)),
    ("dac_decoder", "torch.bfloat16", 4, ("bf16",)),
    ("dac_decoder", "torch.float32", 1, ("tf32x3",)),
    ("dac_decoder", "torch.float32", 4, ("tf32x3",)),
]
ROLES = {  # epilogue of the layer in a fused stage: act, residual input, second output, output dtype
    "bias": ("none", False, False, None),
    "snake": ("snake", False, False, None),
    "snake_dual": ("snake", False, True, None),
    "res_snake_dual": ("snake", True, True, None),
    "tanh": ("tanh", False, False, None),
    "clamp_f32": ("clamp", False, False, torch.float32),
}


def _dtype(precision: str) -> torch.dtype:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)


def _set_tf32(precision: str) -> None:
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"


# ------------------------------------------------------------------------------------------ timing
def graph_ms(fns: list[Callable[[], Any]], reps: int = 10) -> float:
    """Median ms per call of a CUDA graph that calls fns round-robin (≥ 8 calls per replay)."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    calls = max(8, len(fns))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(calls):
            fns[i % len(fns)]()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fns[i % len(fns)]()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    del g
    return statistics.median(times)


# ------------------------------------------------------------------------------------------ layer cases
@dataclass
class Case:
    stage: str
    precision: str
    kind: str                    # conv | convT | dw
    B: int
    cin: int
    cout: int
    k: int
    stride: int
    dil: int
    T: int                       # unpadded input length
    left: int
    role: str
    layers: list[str] = field(default_factory=list)
    survey_ms: list[Any] = field(default_factory=list)

    @property
    def dtype(self) -> torch.dtype:
        return _dtype(self.precision)

    @property
    def tout(self) -> int:
        from ttsaot.builder.kernels.conv1d import causal_out_len

        if self.kind == "convT":
            return self.T * self.stride
        return causal_out_len(self.T, self.k, self.stride, self.dil, self.left)

    @property
    def flops(self) -> float:
        if self.kind == "convT":
            return 2.0 * self.B * self.T * self.cin * self.cout * self.k
        if self.kind == "dw":
            return 2.0 * self.B * self.cin * self.k * self.tout
        return 2.0 * self.B * self.cin * self.cout * self.k * self.tout

    def key(self) -> tuple:
        return (self.stage, self.precision, self.kind, self.B, self.cin, self.cout, self.k, self.stride, self.dil,
                self.T, self.left, self.role)


def _role(name: str, kind: str, cin: int, cout: int, k: int, stage: str) -> str:
    if kind == "convT":
        return "snake_dual"
    if kind == "dw":
        return "snake"
    if cout == 1:
        return "clamp_f32" if stage == "code2wav" else "tanh"
    if "quantizer" in name or "pre_conv" in name:
        return "bias"
    if k == 1 and cin == cout:
        return "res_snake_dual"
    return "snake"


def survey_cases(survey: dict, stage: str, dtype: str, batch: int, precision: str) -> list[Case]:
    """The conv layers of one survey run as kernel cases (unpadded lengths reconstructed from the hooks' inputs:
    layers.conv.CausalConv1d hooks its inner Conv1d on the padded input, VoxCPM2's subclasses pad inside)."""
    runs = [r for r in survey["runs"] if r.get("stage") == stage and r.get("dtype") == dtype
            and (r.get("sizes") or {}).get("batch", 1) == batch and "convs" in r]
    if not runs:
        raise LookupError(f"no survey run for {stage} {dtype} B={batch}")
    cases: dict[tuple, Case] = {}
    for row in runs[0]["convs"]:
        B, cin, tin = row["in"]
        k, s, d, g, cout = row["kernel"], row["stride"], row["dilation"], row["groups"], row["out_channels"]
        eff = (k - 1) * d + 1
        typ = row["type"]
        if "Transpose" in typ:
            kind, T, left = "convT", tin, 0
        else:
            kind = "dw" if g > 1 else "conv"
            if g > 1 and not (g == cin == cout):
                continue
            if typ == "Conv1d":        # input already padded: T = Tout · stride
                T, left = ((tin - eff) // s + 1) * s, eff - s
            else:                      # pads inside (stride 1)
                T, left = tin, eff - 1
        c = Case(stage, precision, kind, B, cin, cout, k, s, d, T, left, _role(row["layer"], kind, cin, cout, k, stage))
        ms = row.get("ncl_tf32" if precision == "tf32" else "ncl")
        c = cases.setdefault(c.key(), c)
        c.layers.append(row["layer"])
        c.survey_ms.append(ms)
    return list(cases.values())


class _Set:
    """One rotation set of a case's tensors (baked for the kernel, plain for cuDNN)."""

    def __init__(self, case: Case, gen: torch.Generator, proto: dict) -> None:
        dev, dt = DEVICE, case.dtype
        self.x = (torch.randn(case.B, case.cin, case.T, generator=gen, device=dev)).to(dt)
        self.w = proto["w"].clone()
        self.wb = proto["wb"].clone()
        self.b = proto["b"].clone()
        act, use_res, _, _ = ROLES[case.role]
        self.res = torch.randn(case.B, case.cout, case.tout, generator=gen, device=dev).to(dt) if use_res else None
        self.alpha, self.inv_beta = proto["alpha"], proto["inv_beta"]
        self.x_nlc = self.x.transpose(1, 2).contiguous() if case.kind == "conv" else None
        if case.kind != "convT":
            from ttsaot.builder.kernels.conv1d import _right_pad

            self.xpad = F.pad(self.x, (case.left, _right_pad(case.T, case.k, case.stride, case.dil, case.left)))

    def nbytes(self) -> int:
        ts = [self.x, self.w, self.b] + ([self.res] if self.res is not None else [])
        return sum(t.numel() * t.element_size() for t in ts)


def _prototype(case: Case, gen: torch.Generator) -> dict:
    from ttsaot.builder.kernels.conv1d import bake_conv1d, bake_conv_transpose1d, bake_dwconv1d
    from ttsaot.builder.layers.conv import CausalConv1d, CausalConvTranspose1d

    dev, dt = DEVICE, case.dtype
    with torch.device(dev):
        if case.kind == "convT":
            m = CausalConvTranspose1d(case.cin, case.cout, case.k, case.stride)
            fan = case.cin * case.k / case.stride
        else:
            m = CausalConv1d(case.cin, case.cout, case.k, stride=case.stride, dilation=case.dil,
                             groups=case.cin if case.kind == "dw" else 1)
            m.left_pad = case.left
            fan = case.k if case.kind == "dw" else case.cin * case.k
    with torch.no_grad():
        m.conv.weight.copy_(torch.randn(m.conv.weight.shape, generator=gen, device=dev) / math.sqrt(fan))
        m.conv.bias.copy_(0.1 * torch.randn(m.conv.bias.shape, generator=gen, device=dev))
    tap_major = True
    if case.kind == "convT":
        wb, b, _ = bake_conv_transpose1d(m)
    elif case.kind == "dw":
        wb, b, _, _ = bake_dwconv1d(m)
    else:
        wb, b, meta = bake_conv1d(m)
        tap_major = meta.tap_major
    return {"w": m.conv.weight.detach().to(dt).contiguous(), "wb": wb.to(dt).contiguous(), "b": b.to(dt),
            "alpha": torch.rand(case.cout, generator=gen, device=dev) + 0.5,
            "inv_beta": torch.rand(case.cout, generator=gen, device=dev), "tap_major": tap_major}


def _cudnn(case: Case, s: _Set) -> Callable[[], torch.Tensor]:
    if case.kind == "convT":
        return lambda: F.conv_transpose1d(s.x, s.w, s.b, stride=case.stride)
    groups = case.cin if case.kind == "dw" else 1
    return lambda: F.conv1d(s.xpad, s.w, s.b, stride=case.stride, dilation=case.dil, groups=groups)


def _kernel(case: Case, s: _Set, cfg, role: str, tap_major: bool) -> Callable[[], Any]:
    from ttsaot.builder.kernels import conv1d as K

    act, use_res, dual, odt = ROLES[role]
    res = s.res if use_res else None
    a, ib = (s.alpha, s.inv_beta) if act == "snake" else (None, None)
    prec = "ieee" if case.precision in ("bf16", "fp16") else case.precision
    if case.kind == "dw":
        return lambda: K.dwconv1d_forward(s.x, s.wb, s.b, res, None, None, a, ib, case.dil, case.left, act, odt,
                                          config=cfg)
    if case.kind == "convT":
        def run():
            return K.conv_transpose1d_forward(s.x, s.wb, s.b, res, None, None, a, ib, act, odt, prec, dual,
                                              config=cfg)
    else:
        def run():
            return K.conv1d_forward(s.x, s.wb, s.b, res, None, None, a, ib, case.k, case.stride, case.dil,
                                    case.left, tap_major, act, odt, prec, dual, config=cfg)
    # (pre, out) for a dual epilogue, else out
    return run if dual else (lambda: run()[1])


def _kernel_nlc(case: Case, s: _Set, cfg, tap_major: bool) -> Callable[[], Any]:
    """The same kernel reading a [B, T, Cin] copy of x (channel-contiguous, always aligned loads): how much the
    time-shifted NCL loads cost."""
    from ttsaot.builder.kernels import conv1d as K

    prec = "ieee" if case.precision in ("bf16", "fp16") else case.precision
    return lambda: K.launch_conv_gemm(s.x_nlc, s.wb, s.b, None, None, None, None, None, rows=case.cout,
                                      tout=case.tout, ksize=case.k, dilation=case.dil, stride=case.stride,
                                      pad=case.left, phases=1, tap_major=tap_major, act="none", write_pre=False,
                                      out_dtype=None, precision=prec, config=cfg, x_nlc=True)[0]


def _unfused(case: Case, s: _Set, role: str) -> Callable[[], Any]:
    """The eager chain of the layer: (pad +) cuDNN conv (+ trim view) (+ residual add) + activation."""
    act, use_res, dual, odt = ROLES[role]
    groups = case.cin if case.kind == "dw" else 1

    def run():
        if case.kind == "convT":
            y = F.conv_transpose1d(s.x, s.w, s.b, stride=case.stride)[..., : case.tout]
        else:
            from ttsaot.builder.kernels.conv1d import _right_pad

            xp = F.pad(s.x, (case.left, _right_pad(case.T, case.k, case.stride, case.dil, case.left)))
            y = F.conv1d(xp, s.w, s.b, stride=case.stride, dilation=case.dil, groups=groups)
        if use_res:
            y = s.res + y
        if act == "snake":
            return y, torch.ops.ttsaot.snake_beta(y, s.alpha, s.inv_beta)
        if act == "tanh":
            return torch.tanh(y)
        if act == "clamp":
            return y.clamp(-1, 1).to(odt or y.dtype)
        return y
    return run


def _ref64(case: Case, s: _Set, role: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(conv, pre, act) in fp64 from the same (rounded) inputs, no intermediate rounding."""
    act, use_res, _, _ = ROLES[role]
    if case.kind == "convT":
        conv = F.conv_transpose1d(s.x.double(), s.w.double(), s.b.double(), stride=case.stride)[..., : case.tout]
    else:
        groups = case.cin if case.kind == "dw" else 1
        conv = F.conv1d(s.xpad.double(), s.w.double(), s.b.double(), stride=case.stride, dilation=case.dil,
                        groups=groups)
    pre = conv + s.res.double() if use_res else conv
    if act == "snake":
        a, ib = s.alpha.double().view(1, -1, 1), s.inv_beta.double().view(1, -1, 1)
        out = pre + ib * torch.sin(a * pre) ** 2
    elif act == "tanh":
        out = torch.tanh(pre)
    elif act == "clamp":
        out = pre.clamp(-1, 1)
    else:
        out = pre
    return conv, pre, out


def _configs(case: Case) -> list:
    from ttsaot.builder.kernels import conv1d as K

    if case.kind == "dw":
        return list(K.DW_CONFIGS)
    rows = case.cout * (case.stride if case.kind == "convT" else 1)
    tout = case.T if case.kind == "convT" else case.tout
    return K.prune_gemm_configs(K.gemm_kernel_configs(case.dtype), rows, tout)


def _cfg_name(c) -> str:
    if hasattr(c, "block_m"):
        return f"m{c.block_m}n{c.block_n}r{c.block_r}w{c.num_warps}s{c.num_stages}"
    return f"c{c.block_c}t{c.block_t}w{c.num_warps}"


def measure_case(case: Case, reps: int) -> dict:
    gen = torch.Generator(device=DEVICE).manual_seed(zlib.crc32(repr(case.key()).encode()))
    _set_tf32(case.precision)
    proto = _prototype(case, gen)
    first = _Set(case, gen, proto)
    n_rot = max(1, min(16, math.ceil(ROTATE_BYTES / max(1, first.nbytes()))))
    sets = [first] + [_Set(case, gen, proto) for _ in range(n_rot - 1)]
    tap_major = proto["tap_major"]
    row: dict[str, Any] = {
        "stage": case.stage, "precision": case.precision, "kind": case.kind, "layers": case.layers,
        "count": len(case.layers), "B": case.B, "cin": case.cin, "cout": case.cout, "kernel": case.k,
        "stride": case.stride, "dilation": case.dil, "T": case.T, "T_out": case.tout, "left_pad": case.left,
        "role": case.role, "gflop": case.flops / 1e9, "rotation": n_rot,
        "footprint_mb": round(first.nbytes() / 2**20, 2), "l2_resident": n_rot * first.nbytes() < L2_BYTES,
        "survey_cudnn_ms": case.survey_ms[0],
    }
    peak = PEAK_TFLOPS.get(case.precision)

    io_bytes = 2 * first.x.numel() * first.x.element_size()

    def perf(ms: float) -> dict:
        d = {"ms": round(ms, 5), "tflops": round(case.flops / ms / 1e9, 2)}
        if case.kind == "dw":
            d["gb_per_s"] = round(io_bytes / ms / 1e6, 1)
        elif peak:
            d["pct_peak"] = round(100 * case.flops / ms / 1e9 / peak, 1)
        return d

    row["cudnn"] = perf(graph_ms([_cudnn(case, s) for s in sets], reps))
    cfg_ms: dict[str, Any] = {}
    best, best_ms = None, float("inf")
    for cfg in _configs(case):
        try:
            ms = graph_ms([_kernel(case, s, cfg, "bias", tap_major) for s in sets], reps)
            cfg_ms[_cfg_name(cfg)] = round(ms, 5)
            if ms < best_ms:
                best, best_ms = cfg, ms
        except Exception as e:  # noqa: BLE001 - a config that does not compile/fit is data
            cfg_ms[_cfg_name(cfg)] = f"error: {short_error(e)}"
    row["configs_ms"] = cfg_ms
    if best is None:
        raise RuntimeError(f"no kernel config ran: {cfg_ms}")
    row["kernel"] = {**perf(best_ms), "config": _cfg_name(best)}
    row["fused"] = perf(graph_ms([_kernel(case, s, best, case.role, tap_major) for s in sets], reps))
    if case.kind == "conv":
        row["kernel_nlc_input"] = perf(graph_ms([_kernel_nlc(case, s, best, tap_major) for s in sets], reps))
    row["unfused"] = perf(graph_ms([_unfused(case, s, case.role) for s in sets], reps))
    row["speedup_kernel_vs_cudnn"] = round(row["cudnn"]["ms"] / row["kernel"]["ms"], 2)
    row["speedup_fused_vs_unfused"] = round(row["unfused"]["ms"] / row["fused"]["ms"], 2)

    # numerics on the first set
    conv64, pre64, out64 = _ref64(case, first, case.role)
    cud = _cudnn(case, first)()
    cud = cud[..., : case.tout] if case.kind == "convT" else cud
    plain = _kernel(case, first, best, "bias", tap_major)()
    fused = _kernel(case, first, best, case.role, tap_major)()
    unf = _unfused(case, first, case.role)()
    err = {"cudnn": rel_err(cud, conv64), "kernel": rel_err(plain, conv64)}
    if case.kind == "conv":
        err["kernel_nlc_input"] = rel_err(_kernel_nlc(case, first, best, tap_major)(), conv64)
    if isinstance(fused, tuple):
        err["fused_pre"], err["fused"] = rel_err(fused[0], pre64), rel_err(fused[1], out64)
    else:
        err["fused"] = rel_err(fused, out64)
    err["unfused"] = rel_err(unf[1] if isinstance(unf, tuple) else unf, out64)
    if case.precision in ("tf32x3", "ieee"):
        err["kernel_vs_cudnn_fp32"] = rel_err(plain, cud)
    row["rel_err"] = {k: float(f"{v:.3g}") for k, v in err.items()}
    row["nan"] = bool(plain.isnan().any()) or bool((fused[1] if isinstance(fused, tuple) else fused).isnan().any())
    del sets, first
    return row


# ------------------------------------------------------------------------------------------ chains
class _Unit(nn.Module):
    def __init__(self, block: list[nn.Module]) -> None:
        super().__init__()
        self.block = nn.Sequential(*block)

    def forward(self, x):
        return x + self.block(x)


class _LeftPad(nn.Conv1d):
    """VoxCPM2's causal conv form (stride 1, pads inside)."""

    def __init__(self, *a, left_pad: int = 0, **kw) -> None:
        super().__init__(*a, **kw)
        self.left_pad = left_pad

    def forward(self, x):
        return super().forward(F.pad(x, (self.left_pad, 0)))


class _Affine(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.rand(c) + 0.5)
        self.shift = nn.Parameter(0.1 * torch.randn(c))

    def forward(self, x):
        return x * self.scale.view(1, -1, 1) + self.shift.view(1, -1, 1)


class _Head(nn.Module):
    def __init__(self, act: str, out_dtype: torch.dtype | None) -> None:
        super().__init__()
        self.act, self.out_dtype = act, out_dtype

    def forward(self, x):
        x = torch.tanh(x) if self.act == "tanh" else x.clamp(-1, 1)
        return x if self.out_dtype is None else x.to(self.out_dtype)


def _unit(c: int, d: int, snake, depthwise: bool = False):
    from ttsaot.builder.kernels.conv_modules import Residual
    from ttsaot.builder.layers.conv import CausalConv1d

    conv1 = _LeftPad(c, c, 7, dilation=d, groups=c, left_pad=6 * d) if depthwise else CausalConv1d(c, c, 7,
                                                                                                  dilation=d)
    conv2 = _LeftPad(c, c, 1) if depthwise else CausalConv1d(c, c, 1)
    block = [snake(c), conv1, snake(c), conv2]
    return _Unit(block), Residual(block)


def decoder_stack(family: str, blocks: int | None = None):
    """(eager modules, chain items, input channels, out dtype) of a codec decoder conv stack with random weights:
    qwen (code2wav decoder), fish (DAC decoder), vox (VAE decoder), enc (Fish DAC encoder, transformer omitted)."""
    from ttsaot.builder.layers.conv import CausalConv1d, CausalConvTranspose1d
    from ttsaot.builder.layers.snake import Snake1d, SnakeBeta

    mods: list[nn.Module] = []
    items: list[Any] = []

    def add(m, item=None):
        mods.append(m)
        items.append(m if item is None else item)

    if family in ("qwen", "fish"):
        snake = SnakeBeta if family == "qwen" else Snake1d
        dim, rates = 1536, (8, 5, 4, 3) if family == "qwen" else (8, 8, 4, 2)
        add(CausalConv1d(1024, dim, 7))
        for i, r in enumerate(rates[:blocks]):
            cin, cout = dim // 2**i, dim // 2 ** (i + 1)
            add(snake(cin))
            add(CausalConvTranspose1d(cin, cout, 2 * r, r))
            for d in (1, 3, 9):
                add(*_unit(cout, d, snake))
        out = dim // 2 ** len(rates)
        add(snake(out))
        add(CausalConv1d(out, 1, 7))
        act = "clamp" if family == "qwen" else "tanh"
        mods.append(_Head(act, torch.float32))
        items.append(act)
        return nn.Sequential(*mods), items, 1024
    if family == "vox":
        from ttsaot.builder.kernels.conv_modules import Affine

        dim, rates = 2048, (8, 6, 5, 2, 2, 2)
        add(_LeftPad(64, 64, 7, groups=64, left_pad=6))
        add(_LeftPad(64, dim, 1))
        for i, r in enumerate(rates):
            cin, cout = dim // 2**i, dim // 2 ** (i + 1)
            aff = _Affine(cin)
            add(aff, Affine(aff.scale, aff.shift))
            add(Snake1d(cin))
            ct = nn.ConvTranspose1d(cin, cout, 2 * r, stride=r)
            ct.trim = r
            add(_Trim(ct), ct)
            for d in (1, 3, 9):
                add(*_unit(cout, d, Snake1d, depthwise=True))
        out = dim // 2 ** len(rates)
        add(Snake1d(out))
        add(_LeftPad(out, 1, 7, left_pad=6))
        mods.append(_Head("tanh", None))
        items.append("tanh")
        return nn.Sequential(*mods), items, 64
    if family == "enc":
        d = 64
        add(CausalConv1d(1, d, 7))
        for s in (2, 4, 8, 8):
            for dl in (1, 3, 9):
                add(*_unit(d, dl, Snake1d))
            add(Snake1d(d))
            add(CausalConv1d(d, 2 * d, 2 * s, stride=s))
            d *= 2
        add(Snake1d(d))
        add(CausalConv1d(d, 1024, 3))
        return nn.Sequential(*mods), items, 1
    raise ValueError(family)


class _Trim(nn.Module):
    def __init__(self, ct: nn.ConvTranspose1d) -> None:
        super().__init__()
        self.ct = ct

    def forward(self, x):
        y = self.ct(x)
        return y[..., : y.shape[-1] - self.ct.trim]


def _randomize(m: nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(("alpha", "beta")):
                p.copy_(torch.rand(p.shape, generator=g) * 0.5 + (0.6 if name.endswith("alpha") else 0.0))
            elif name.endswith("scale"):
                p.copy_(torch.rand(p.shape, generator=g) * 0.5 + 0.75)
            elif p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * (0.7 / math.sqrt(p[0].numel())))
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=g))


def measure_chain(name: str, family: str, B: int, T: int, precision: str, reps: int,
                  blocks: int | None = None, units_only: int | None = None) -> dict:
    """Fused chain vs the eager modules (cuDNN convs, ttsaot::snake_beta) of one conv stack, both in CUDA graphs."""
    from ttsaot.builder.kernels.conv_modules import fuse_conv_chain
    from ttsaot.builder.passes import bake_snake, cast_to_compute_dtype

    dt = _dtype(precision)
    eager, items, cin = decoder_stack(family, blocks)
    if units_only is not None:       # a slice of the stack: [snake, convT, units...] of one decoder block
        eager = nn.Sequential(*list(eager)[units_only[0]:units_only[1]])
        items = items[units_only[0]:units_only[1]]
        first = next(m for m in eager.modules() if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d)))
        cin = first.in_channels
    _randomize(eager)
    out_dtype = torch.float32 if family in ("qwen", "fish") and units_only is None else None
    chain = fuse_conv_chain(items, out_dtype=out_dtype if dt != torch.float32 else None,
                            precision=precision if dt == torch.float32 else "ieee")
    bake_snake(eager)
    eager = cast_to_compute_dtype(eager, dt).to(DEVICE).eval()
    chain = cast_to_compute_dtype(chain, dt).to(DEVICE).eval()
    g = torch.Generator(device=DEVICE).manual_seed(1)
    x = torch.randn(B, cin, T, generator=g, device=DEVICE).to(dt)
    row: dict[str, Any] = {"name": name, "family": family, "precision": precision, "B": B, "input": [B, cin, T],
                           "plan": chain.plan.steps, "fused_launches": chain.plan.launches}
    with torch.no_grad():
        _set_tf32("ieee")
        flops = [0.0]
        remove = _count_flops(eager, flops)
        ref = eager.float()(x.float()) if dt != torch.float32 else eager(x)     # exact fp32 eager
        remove()
        eager = cast_to_compute_dtype(eager, dt)
        _set_tf32(precision)
        y_eager = eager(x)
        y = chain(x)                                        # autotunes every layer shape (as AOTI does)
        row["rel_err_fused_vs_eager"] = float(f"{rel_err(y, y_eager):.3g}")
        row["rel_err_fused_vs_fp32"] = float(f"{rel_err(y, ref):.3g}")
        row["rel_err_eager_vs_fp32"] = float(f"{rel_err(y_eager, ref):.3g}")
        row["eager_ms"] = round(graph_ms([lambda: eager(x)], reps), 4)
        row["fused_ms"] = round(graph_ms([lambda: chain(x)], reps), 4)
    row["speedup"] = round(row["eager_ms"] / row["fused_ms"], 2)
    row["gflop"] = round(flops[0] / 1e9, 2)
    row["fused_tflops"] = round(flops[0] / row["fused_ms"] / 1e9, 1)
    return row


def _count_flops(m: nn.Module, acc: list[float]) -> Callable[[], None]:
    """Forward hooks adding each conv's 2·MACs to acc[0]; returns the remover."""
    def hook(mod, inp, out):
        if isinstance(mod, nn.ConvTranspose1d):
            acc[0] += 2.0 * inp[0].numel() * mod.out_channels * mod.kernel_size[0]
        else:
            acc[0] += 2.0 * out.numel() * mod.in_channels // mod.groups * mod.kernel_size[0]
    hs = [c.register_forward_hook(hook) for c in m.modules() if isinstance(c, (nn.Conv1d, nn.ConvTranspose1d))]
    return lambda: [h.remove() for h in hs]


CHAIN_PLAN = [  # (name, family, B, T at the stack input, precision, blocks, slice of the eager list)
    ("qwen_ru_d9_192", "qwen", 1, 32000, "bf16", None, (15, 16)),
    ("qwen_decoder_block_192", "qwen", 1, 8000, "bf16", None, (11, 16)),
    ("qwen_decoder_stack_b1", "qwen", 1, 200, "bf16", None, None),
    ("fish_decoder_stack_b1_tf32", "fish", 1, 116, "tf32", None, None),
    ("vae_decoder_stack_b1_tf32", "vox", 1, 36, "tf32", None, None),
    ("fish_encoder_convs_tf32x3", "enc", 1, 442368, "tf32x3", None, None),
    ("qwen_decoder_stack_b4", "qwen", 4, 200, "bf16", None, None),
    ("fish_decoder_stack_b4_tf32", "fish", 4, 116, "tf32", None, None),
    ("fish_decoder_stack_b4_bf16", "fish", 4, 116, "bf16", None, None),
    ("fish_decoder_stack_b4_tf32x3", "fish", 4, 116, "tf32x3", None, None),
    ("vae_decoder_stack_b1_tf32x3", "vox", 1, 36, "tf32x3", None, None),
]


# ------------------------------------------------------------------------------------------ smoke
def _smoke_cases(precision: str, g: torch.Generator) -> dict[str, tuple[Callable, Callable]]:
    """name → (kernel run, aten reference), each returning (pre or None, out)."""
    from ttsaot.builder.kernels import conv1d as K

    dt = _dtype(precision)
    prec = precision if dt == torch.float32 else "ieee"
    cfg, dcfg = K.ConvKernelConfig(64, 64, 32), K.DW_CONFIGS[1]          # one compile per case (no autotuning)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=DEVICE) * scale).to(dt)

    x, res = rnd(2, 24, 301), rnd(2, 20, 301)
    w, wt, wd, b = rnd(20, 7, 24, scale=1 / 13), rnd(20, 4, 2, 24, scale=1 / 7), rnd(24, 7), rnd(20)
    wc = w.permute(0, 2, 1).contiguous()                       # channel-major for the strided conv
    a, ib = torch.rand(24, device=DEVICE) + 0.5, torch.rand(24, device=DEVICE)
    a20, ib20, sc, sh = a[:20], ib[:20], b.float().abs() + 0.5, b.float()

    def single(fn):
        return lambda: (None, fn())

    return {
        "conv1d_res_snake_dual": (
            lambda: K.conv1d_forward(x, w, b, res, None, None, a20, ib20, 7, 1, 3, 18, True, "snake", None, prec,
                                     True, config=cfg),
            lambda: K.conv1d_dual_reference(x, w, b, res, None, None, a20, ib20, 7, 1, 3, 18, True, "snake", None,
                                            prec)),
        "conv1d_clamp_f32": (
            lambda: K.conv1d_forward(x, w, b, None, None, None, None, None, 7, 1, 1, 6, True, "clamp",
                                     torch.float32, prec, False, config=cfg),
            single(lambda: K.conv1d_reference(x, w, b, None, None, None, None, None, 7, 1, 1, 6, True, "clamp",
                                              torch.float32, prec))),
        "conv1d_strided_tanh": (
            lambda: K.conv1d_forward(x, wc, b, None, None, None, None, None, 7, 4, 1, 3, False, "tanh", None, prec,
                                     False, config=cfg),
            single(lambda: K.conv1d_reference(x, wc, b, None, None, None, None, None, 7, 4, 1, 3, False, "tanh",
                                              None, prec))),
        "conv_transpose1d_affine_snake_dual": (
            lambda: K.conv_transpose1d_forward(x, wt, b, None, sc, sh, a20, ib20, "snake", None, prec, True,
                                               config=cfg),
            lambda: K.conv_transpose1d_dual_reference(x, wt, b, None, sc, sh, a20, ib20, "snake", None, prec)),
        "dwconv1d_snake": (
            single(lambda: K.dwconv1d_forward(x, wd, None, None, None, None, a, ib, 9, 54, "snake", None,
                                              config=dcfg)),
            single(lambda: K.dwconv1d_reference(x, wd, None, None, None, None, a, ib, 9, 54, "snake", None))),
    }


def smoke() -> dict:
    """Each op × dtype × precision once at a small odd shape against its aten reference (exact fp32): a compile
    error shows here once, with its traceback, instead of in every layer."""
    out: dict[str, Any] = {}
    g = torch.Generator(device=DEVICE).manual_seed(0)
    _set_tf32("ieee")
    for precision in ("bf16", "fp16", "ieee", "tf32", "tf32x3"):
        tol = 1e-5 if precision in ("ieee", "tf32x3") else 5e-3
        for name, (run_fn, ref_fn) in _smoke_cases(precision, g).items():
            key = f"{name}[{precision}]"
            try:
                got, want = run_fn(), ref_fn()
                e = {"out": rel_err(got[1], want[1])}
                if got[0] is not None:
                    e["pre"] = rel_err(got[0], want[0])
                out[key] = {"rel_err": {k: float(f"{v:.3g}") for k, v in e.items()},
                            "equal_frac": round((got[1] == want[1]).float().mean().item(), 4),
                            "ok": all(v < tol for v in e.values()) and not got[1].isnan().any().item()}
            except Exception:  # noqa: BLE001
                out[key] = {"ok": False, "error": traceback.format_exc()[-2500:]}
    return out


# ------------------------------------------------------------------------------------------ driver
def run(out_dir: Path, survey_path: Path, budget: float, reps: int, only: set[str] | None) -> dict:
    torch.set_grad_enabled(False)
    dev = torch.device(DEVICE)
    t0 = time.time()
    res: dict[str, Any] = {"schema": RESULTS_SCHEMA, "kind": "conv_kernels", "started": now_iso(),
                           "git_commit": git_commit(), "device": device_info(dev), "peak_tflops_h100_sxm": PEAK_TFLOPS,
                           "budget_s": budget, "survey": str(survey_path.relative_to(REPO))
                           if survey_path.is_relative_to(REPO) else str(survey_path),
                           "tasks": [], "layers": [], "chains": []}
    path = out_dir / res["device"]["slug"] / "conv_kernels.json"

    def save():
        res["seconds"] = round(time.time() - t0, 1)
        write_json(path, res)

    def task(name: str, fn: Callable[[], Any], sink: list | dict | None) -> None:
        if only and not any(name.startswith(o) for o in only):
            return
        left = budget - (time.time() - t0)
        if left <= 0:
            res["tasks"].append({"name": name, "status": "skipped: budget"})
            return
        t = time.time()
        try:
            r = fn()
            if isinstance(sink, list):
                sink.append(r) if isinstance(r, dict) else sink.extend(r)
            elif isinstance(sink, dict):
                sink.update(r)
            res["tasks"].append({"name": name, "status": "ok", "seconds": round(time.time() - t, 1)})
        except Exception as e:  # noqa: BLE001
            res["tasks"].append({"name": name, "status": "error", "error": short_error(e),
                                 "traceback": traceback.format_exc()[-2000:], "seconds": round(time.time() - t, 1)})
            torch.cuda.empty_cache()
        save()

    res["smoke"] = {}
    task("smoke", smoke, res["smoke"])
    survey = json.loads(survey_path.read_text())

    def layer_task(stage, dtype, batch, precision):
        def fn():
            rows = []
            for case in survey_cases(survey, stage, dtype, batch, precision):
                if time.time() - t0 > budget:
                    rows.append({"stage": stage, "precision": precision, "layers": case.layers,
                                 "status": "skipped: budget"})
                    continue
                try:
                    rows.append(measure_case(case, reps))
                except Exception as e:  # noqa: BLE001
                    rows.append({"stage": stage, "precision": precision, "layers": case.layers, "B": case.B,
                                 "error": short_error(e)})
                    torch.cuda.empty_cache()
            return rows
        return fn

    chains = {c[0]: c for c in CHAIN_PLAN}
    order: list[tuple[str, Callable[[], Any], list]] = []
    for name in ("qwen_ru_d9_192", "qwen_decoder_block_192", "qwen_decoder_stack_b1"):
        order.append((f"chain:{name}", _chain_fn(chains[name], reps), res["chains"]))
    for stage, dtype, batch, precisions in LAYER_PLAN:
        for p in precisions:
            order.append((f"layers:{stage}:b{batch}:{p}", layer_task(stage, dtype, batch, p), res["layers"]))
            if stage == "dac_decoder" and batch == 1 and p == "tf32":
                order.append(("chain:fish_decoder_stack_b1_tf32",
                              _chain_fn(chains["fish_decoder_stack_b1_tf32"], reps), res["chains"]))
            if stage == "vae_decoder" and p == "tf32x3":
                for n in ("vae_decoder_stack_b1_tf32", "vae_decoder_stack_b1_tf32x3"):
                    order.append((f"chain:{n}", _chain_fn(chains[n], reps), res["chains"]))
            if stage == "dac_encoder":
                order.append(("chain:fish_encoder_convs_tf32x3",
                              _chain_fn(chains["fish_encoder_convs_tf32x3"], reps), res["chains"]))
            if stage == "code2wav" and batch == 4:
                order.append(("chain:qwen_decoder_stack_b4", _chain_fn(chains["qwen_decoder_stack_b4"], reps),
                              res["chains"]))
    for name in ("fish_decoder_stack_b4_tf32", "fish_decoder_stack_b4_bf16", "fish_decoder_stack_b4_tf32x3"):
        order.append((f"chain:{name}", _chain_fn(chains[name], reps), res["chains"]))
    for name, fn, sink in order:
        task(name, fn, sink)
    res["summary"] = summarize(res)
    res["status"] = "ok"
    save()
    res["path"] = str(path)
    return res


def _chain_fn(spec: tuple, reps: int) -> Callable[[], dict]:
    name, family, B, T, precision, blocks, sl = spec
    return lambda: measure_chain(name, family, B, T, precision, reps, blocks=blocks, units_only=sl)


def summarize(res: dict) -> dict:
    """Per (stage, B, precision): layer times summed over every layer of the decode (count-weighted)."""
    out: dict[str, dict] = {}
    for r in res["layers"]:
        if "kernel" not in r:
            continue
        key = f"{r['stage']}:b{r['B']}:{r['precision']}"
        s = out.setdefault(key, {"layers": 0, "cudnn_ms": 0.0, "kernel_ms": 0.0, "fused_ms": 0.0,
                                 "unfused_ms": 0.0, "gflop": 0.0})
        n = r["count"]
        s["layers"] += n
        s["gflop"] += n * r["gflop"]
        for k in ("cudnn", "kernel", "fused", "unfused"):
            s[f"{k}_ms"] += n * r[k]["ms"]
    for s in out.values():
        for k in list(s):
            if k.endswith("_ms") or k == "gflop":
                s[k] = round(s[k], 3)
    return out


def print_summary(res: dict) -> None:
    bad = [k for k, v in res.get("smoke", {}).items() if not v.get("ok")]
    print(f"smoke: {len(res.get('smoke', {})) - len(bad)} ok, failed: {bad}")
    print(f"{'stage':28s} {'layers':>6s} {'cudnn':>8s} {'kernel':>8s} {'unfused':>8s} {'fused':>8s}  (ms, summed)")
    for k, s in res.get("summary", {}).items():
        print(f"{k:28s} {s['layers']:6d} {s['cudnn_ms']:8.3f} {s['kernel_ms']:8.3f} {s['unfused_ms']:8.3f} "
              f"{s['fused_ms']:8.3f}")
    for c in res.get("chains", []):
        print(f"chain {c['name']:34s} eager {c['eager_ms']:8.3f} fused {c['fused_ms']:8.3f} ms  ×{c['speedup']:.2f}"
              f"  err vs eager {c['rel_err_fused_vs_eager']:.2e} vs fp32 {c['rel_err_fused_vs_fp32']:.2e}")
    for t in res.get("tasks", []):
        if t["status"] != "ok":
            print(f"task {t['name']}: {t['status']} {t.get('error', '')}")
    print(f"total {res.get('seconds')} s")


def add_parser(sub) -> None:
    p = sub.add_parser("conv-kernels", help="codec conv kernels vs cuDNN, per layer and per fused chain (GPU)")
    p.add_argument("--out", default=str(REPO / "bench" / "results"), help="results root (<out>/<device>/...)")
    p.add_argument("--survey", default=str(SURVEY), help="per-layer cuDNN survey JSON whose shapes are measured")
    p.add_argument("--budget", type=float, default=200.0, help="seconds after which remaining tasks are skipped")
    p.add_argument("--reps", type=int, default=10, help="timed graph replays per measurement")
    p.add_argument("--only", type=lambda v: {s.strip() for s in v.split(",") if s.strip()}, default=None,
                   help="task name prefixes, e.g. smoke,chain:qwen,layers:code2wav")


def main(a: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print("conv-kernels needs a CUDA GPU")
        return 2
    res = run(Path(a.out), Path(a.survey), a.budget, a.reps, a.only)
    print_summary(res)
    print(f"→ {res['path']}")
    return 0
