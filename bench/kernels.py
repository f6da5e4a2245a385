"""The kernel layer (`builder/kernels`) on the GPU: correctness, time, bytes and bandwidth on the stages' real shapes.

    python -m bench kernels [--out bench/results] [--quick] [--budget 200] [--sections copy,skinny,...]
                            [--with-compile]

Sections, in this order (each case is recorded, a failing one as an error; cases and sections that would start
after the time budget are recorded as skipped):
- `copy`: device-to-device copy bandwidth (1 GiB, bytes read + written): the roof every figure is compared with.
- `skinny`: `ttsaot::skinny_linear` (autotuned, as AOTI bakes it) on the VoxCPM2 decode shapes at M = 1..16. Per
  case: rel. error vs the aten reference, time per call replaying a CUDA graph of back-to-back calls (weights
  rotated over > 4× L2 so every call reads HBM, as a step over 28 layers does), time of one eager launch, a D2D
  copy moving the same bytes in the same kind of graph, the eager torch ops (cuBLAS + elementwise) in the same
  kind of graph; bytes, GB/s, % of the same-bytes copy (the ≥ 85% target) and of the 1 GiB copy, speed-up vs
  torch, and the launch plan (form, split-K).
- `attention`: `ttsaot::decode_attention` for VoxCPM2's base (RoPE) and residual (no RoPE) LMs, B = 1..16, a 4097-
  position cache at context 512 (and 2048); layers rotated like the weights; time vs the bytes' floor.
- `aoti`: a 2-layer step AOTInductor-compiled on this GPU: the op's functionalized cache write must be re-inplaced
  (no cache-sized copy: peak memory during the call, the generated code), results vs eager, time.
- `layer`: one VoxCPM2 base-LM layer step (norm+qkv → attention → o_proj+residual → norm+gate_up+SiLU·mul →
  down+residual) from the ops vs the eager bf16 module (`MiniCPMLayer.forward_step`), both replayed from CUDA
  graphs over 4 distinct layers; output and caches checked against eager; time per layer vs the layer's byte
  floor. `--with-compile` adds torch.compile(mode="max-autotune-no-cudagraphs") + manual graph (minutes).
- `predictors`: the predictors' shapes at their rows: Fish fast_ar's and the Qwen code_predictor's four
  projections at their decode steps' M = 1 and 4, the VoxCPM2 locdit's at 22 and 88.
- `sampler`: `ttsaot::sample_tokens` at the predictors' vocabularies (Qwen 2048, Fish 4096) and rows, against the
  aten sampler it replaces (a sort and a dozen small ops) in the same kind of graph; tokens compared.
- `sweep`: split-K × GEMV/tensor-core form for the VoxCPM2 shapes: what the split-K plan is tuned from.
- `sweep_attention`: decode attention's split count × BLOCK_S at B = 1, 4, 16 and both contexts, each case marked
  with the launcher's plan (`decode_attention.plan_num_splits`), which the summary prints beside the best:
  `--sections sweep_attention` alone takes ~1 minute.
- `sweep_predictors`: split-K 1/2/4 of the tensor-core form at the predictors' own shapes and rows (VoxCPM2 locdit:
  each epilogue launch against the SMs a split fills; not run by default).
- `configs`: explicit launch configs (block sizes, warps, stages) × split-K × form for the VoxCPM2 decode shapes at
  M = 1, 16 and 4, each timed like `skinny` (one weight rotation and one same-bytes copy per shape): what the
  autotune lists and the split-K plan are chosen from (not run by default; `--sections configs`).
- `configs_gemv`: the GEMV form's candidates at M = 1 on the predictors' and VoxCPM2's decode shapes (not run by
  default).
- `norm_prologue`: the tile form's RMSNorm prologue at the normed projections' serving rows, its chunks in a rolled
  loop (as the op runs it) against unrolled 256- and 512-wide chunks (not run by default).
- `gemv_preload`: at M = 1, the one-row rule's config against PRELOAD candidates (the program's whole K range one W
  tile, loaded before the grid-dependency wait), each also launched with programmatic dependent launch
  (`launch_pdl`: in the graph each call's programs start while the previous call runs, as the stages' packages
  launch them), on the predictors' and VoxCPM2's shapes whose K fits one 4096-wide tile (not run by default).
- `norm_cost`: what the RMSNorm prologue costs a normed projection at its serving rows: the same shape, weights and
  config with the prologue and without it (x taken as already normed), rolled and unrolled chunks, 4 and 8 warps:
  what moving the norm out of the projection (into the kernel that writes x) could save (not run by default).
A fresh machine compiles ~50 Triton kernels for the first four sections: ~3-4 minutes with the default budget;
`--budget 540` also covers `predictors` and the sweeps. Writes `<out>/<device-slug>/kernels.json` (rewritten after
every case, so a crash keeps what was measured).
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from . import RESULTS_SCHEMA
from .common import device_info, git_commit, graph_replay_ms, now_iso, rel_err, short_error, time_fn

TARGET_RATIO = 0.85
SECTIONS = (
    "copy",
    "skinny",
    "attention",
    "aoti",
    "layer",
    "predictors",
    "sampler",
    "sweep",
    "sweep_attention",
    "sweep_predictors",
    "configs",
    "configs_predictors",
    "configs_stream",
    "configs_gemv",
    "norm_prologue",
    "gemv_preload",
    "norm_cost",
)
DEFAULT_SECTIONS = SECTIONS[:-8]  # the last eight (minutes of compiles) only when asked for
_WARMUP = {True: 3, False: 0}  # warm-up calls before eager timings: on the GPU, none in a CPU smoke run
ROTATE_L2_MULTIPLE = 4  # weights rotated over at least this many times the L2 size
MIN_GRAPH_CALLS = 16

# name: (N, K, epilogue, M values). VoxCPM2 decode (base LM: 28 layers, residual LM: 8, same dims): fused qkv
# (RMSNorm prologue), o_proj + residual, gate_up (RMSNorm, SiLU·mul), down + residual.
DECODE_M = (1, 2, 4, 8, 16)
SKINNY_SHAPES: dict[str, tuple[int, int, dict, tuple[int, ...]]] = {
    "voxcpm2_qkv": (2560, 2048, {"norm": True}, DECODE_M),
    "voxcpm2_o": (2048, 2048, {"residual": True}, DECODE_M),
    "voxcpm2_gate_up": (12288, 2048, {"norm": True, "gated": True}, DECODE_M),
    "voxcpm2_down": (2048, 6144, {"residual": True}, DECODE_M),
}
# The codebook predictors' projections at their decode steps' rows (builder/predictor.py: one token per row over a
# KV cache, M = batch; the H200 code_predictor profile at b1 ran gate_up in 13.6-17.1 µs for 12.6 MB,
# bench/results/nvidia-h200/profiles/), and VoxCPM2 locdit / local_encoder at theirs (~10 positions × 2B rows).
# (The predictors re-ran every position per step before the KV cache: 11-176 / 16-64 rows, the earlier results'.)
PREDICTOR_SHAPES: dict[str, tuple[int, int, dict, tuple[int, ...]]] = {
    "fish_fast_ar_qkv": (6144, 2560, {"norm": True}, (1, 4)),
    "fish_fast_ar_o": (2560, 4096, {"residual": True}, (1, 4)),
    "fish_fast_ar_gate_up": (19456, 2560, {"norm": True, "gated": True}, (1, 4)),
    "fish_fast_ar_down": (2560, 9728, {"residual": True}, (1, 4)),
    "qwen_code_predictor_qkv": (4096, 1024, {"norm": True}, (1, 4)),
    "qwen_code_predictor_o": (1024, 2048, {"residual": True}, (1, 4)),
    "qwen_code_predictor_gate_up": (6144, 1024, {"norm": True, "gated": True}, (1, 4)),
    "qwen_code_predictor_down": (1024, 3072, {"residual": True}, (1, 4)),
    # LocDiT: 16 q + 2·2 kv heads of 128, hidden 1024, FFN 4096; 11 tokens × 2 (CFG) rows per request
    "voxcpm2_locdit_qkv": (2560, 1024, {"norm": True}, (22, 88)),
    "voxcpm2_locdit_o": (1024, 2048, {"residual": True}, (22, 88)),
    "voxcpm2_locdit_gate_up": (8192, 1024, {"norm": True, "gated": True}, (22, 88)),
    "voxcpm2_locdit_down": (1024, 4096, {"residual": True}, (22, 88)),
}
# `sampler`: (vocabulary, rows) of the codebook predictors' draws (Qwen code_predictor 2048, Fish fast_ar 4096)
SAMPLER_CASES = ((2048, 1), (2048, 8), (4096, 1), (4096, 8))
# VoxCPM2's base/residual LM attention (16 q heads, 2 kv heads, hd 128) over a cache of max_len 4096 (+ scratch).
ATTENTION = {"hq": 16, "hkv": 2, "hd": 128, "cache_positions": 4097, "contexts": (512, 2048)}
# `sweep_attention`: the grid (splits × BLOCK_S at each batch size and context). BLOCK_S 64 is the launcher's. One
# split and BLOCK_S 32 lost every case on the H100 (bench/results/nvidia-h100/probes/swap_ab_step/attention_splits.txt);
# 32 splits (past MAX_SPLITS) and BLOCK_S 128 ask whether a long context wants fewer blocks a split.
ATTENTION_SWEEP = {"batches": (1, 4, 16), "splits": (2, 4, 8, 16, 32), "blocks": (64, 128)}
LAYER = {"preset": "full", "cache_positions": 4097, "context": 512, "layers": 4}
# `configs` candidates: (BLOCK_N, BLOCK_K, num_warps, num_stages) per form, tried with split-K 1/2/4 (1 only for
# gate_up, whose 6144 output columns already give every SM several programs).
GEMV_CANDIDATES = (
    (4, 1024, 4, 1),
    (8, 512, 4, 1),
    (16, 256, 4, 1),
    (8, 1024, 8, 1),
    (4, 512, 2, 1),
    (2, 1024, 2, 1),
    (8, 512, 4, 2),
    (16, 512, 8, 1),
)
DOT_CANDIDATES = (
    (16, 256, 4, 4),
    (16, 512, 4, 3),
    (32, 256, 4, 4),
    (64, 128, 4, 4),
    (16, 128, 4, 6),
    (32, 128, 4, 5),
)
CONFIG_SWEEP_M = ((1, "gemv"), (16, "dot"), (4, "gemv"), (4, "dot"), (2, "gemv"), (8, "dot"))
# `configs_predictors`: the tensor-core form at the re-prefill predictors' rows (> 16), where x is re-read from L2
# by every column tile (x bytes / W bytes = M / BLOCK_N), so wider tiles with more K splits are tried, each split
# as the op runs it (an epilogue kernel) and reduced in the kernel on a shared counter workspace.
PREDICTOR_DOT_CANDIDATES = (
    (16, 256, 4, 4),
    (32, 256, 4, 4),
    (16, 128, 4, 6),
    (32, 128, 4, 4),
    (64, 128, 4, 4),
    (64, 64, 4, 6),
    (64, 256, 8, 3),
    (128, 128, 8, 3),
)
PREDICTOR_SWEEP = ("voxcpm2_locdit", (22,), (1, 2, 4, 8))
# `configs_stream`: the streamed tensor-core form (no cp.async stages, the next tiles in registers, first W tile
# before the PDL wait) against the tile form's autotuned plan, at each tile-form shape's serving rows: (BLOCK_N,
# BLOCK_K, num_warps, num_stages) × split-K 1/2 (1 for gated).
STREAM_CANDIDATES = ((16, 256, 4, 1), (32, 256, 8, 1), (16, 128, 4, 1), (16, 512, 8, 1), (32, 128, 4, 1))
STREAM_SWEEP = {
    "voxcpm2_locdit_qkv": (22,),
    "voxcpm2_locdit_o": (22,),
    "voxcpm2_locdit_gate_up": (22,),
    "voxcpm2_locdit_down": (22,),
    "voxcpm2_qkv": (16,),
    "voxcpm2_o": (16,),
    "voxcpm2_gate_up": (16,),
    "voxcpm2_down": (16,),
    "qwen_code_predictor_qkv": (16,),
    "qwen_code_predictor_down": (16,),
    "fish_fast_ar_qkv": (11,),
    "fish_fast_ar_gate_up": (11,),
    "fish_fast_ar_down": (11,),
}


def _interpreter_kwargs(device: torch.device, kind: str) -> dict:
    """Off-GPU (Triton's interpreter) the autotuner cannot benchmark: smoke runs launch one explicit config."""
    if device.type == "cuda":
        return {}
    return {"config": {"BLOCK_N": 16, "BLOCK_K": 32}} if kind == "skinny" else {"config": {"num_warps": 4}}


class _Budget:
    def __init__(self, seconds: float) -> None:
        self.t0, self.seconds = time.time(), seconds

    def left(self) -> float:
        return self.seconds - (time.time() - self.t0)


# ------------------------------------------------------------------------------------------------ timing
def graph_ms(calls: list[Callable[[], Any]], reps: int, device: torch.device) -> float:
    """Median time per call of `calls` captured back to back in one CUDA graph (warmed up first: autotuning,
    lazy loads and allocations happen outside the capture). Off-GPU (smoke runs) a timed Python loop."""
    if device.type != "cuda":
        for c in calls:
            c()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for c in calls:
                c()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times) / len(calls)
    return graph_replay_ms(calls, reps)


def _sets_for(nbytes: int, device: torch.device) -> int:
    """How many copies of a tensor of `nbytes` to rotate over so that a pass reads device memory, not L2."""
    if device.type != "cuda":
        return 1
    l2 = torch.cuda.get_device_properties(device).L2_cache_size or (50 << 20)
    return max(1, math.ceil(ROTATE_L2_MULTIPLE * l2 / max(nbytes, 1)))


def _rotation(n_sets: int, device: torch.device) -> list[int]:
    """Set indices for the calls of one graph: enough calls that launch gaps average out (one call off-GPU)."""
    if device.type != "cuda":
        return list(range(n_sets))
    return [i % n_sets for i in range(max(MIN_GRAPH_CALLS, n_sets))]


def copy_gbps(nbytes: int, reps: int, device: torch.device) -> dict:
    """D2D copy moving `nbytes` in total (nbytes/2 read + nbytes/2 written), sources rotated past L2, in a graph."""
    half = max(16, nbytes // 2 // 16 * 16)
    n = _sets_for(half, device)
    src = [torch.empty(half, dtype=torch.uint8, device=device).random_(0, 255) for _ in range(n)]
    dst = [torch.empty(half, dtype=torch.uint8, device=device) for _ in range(n)]
    ms = graph_ms([lambda i=i: dst[i].copy_(src[i]) for i in _rotation(n, device)], reps, device)
    return {"ms": ms, "gb_per_s": 2 * half / (ms * 1e-3) / 1e9, "bytes": 2 * half}


def _peak_copy(reps: int, device: torch.device) -> dict:
    n = (1 << 29) if device.type == "cuda" else (1 << 24)
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), device, 3, reps)
    return {"bytes": 2 * n, "ms": t["ms"], "gb_per_s": 2 * n / (t["ms"] * 1e-3) / 1e9}


# --------------------------------------------------------------------------------------------- skinny
def _skinny_inputs(M: int, N: int, K: int, spec: dict, n_sets: int, g: torch.Generator, dev: torch.device) -> dict:
    dt = torch.bfloat16
    n_out = N // 2 if spec.get("gated") else N
    return {
        "x": torch.randn(M, K, generator=g, device=dev).to(dt),
        "weights": [(torch.randn(N, K, generator=g, device=dev) / K**0.5).to(dt) for _ in range(n_sets)],
        "norm_weight": (torch.rand(K, generator=g, device=dev) + 0.5).to(dt) if spec.get("norm") else None,
        "residual": torch.randn(M, n_out, generator=g, device=dev).to(dt) if spec.get("residual") else None,
    }


def _skinny_bytes(M: int, N: int, K: int, spec: dict) -> int:
    """Bytes one call moves: the bf16 weight once, x, y (and the residual read), the norm weight."""
    n_out = N // 2 if spec.get("gated") else N
    return N * K * 2 + 2 * (M * K + M * n_out * (2 if spec.get("residual") else 1) + (K if spec.get("norm") else 0))


def _skinny_kwargs(t: dict, spec: dict) -> dict:
    return dict(
        norm_weight=t["norm_weight"],
        norm_eps=1e-5,
        gated=spec.get("gated", False),
        residual=t["residual"],
        residual_scale=0.7 if spec.get("residual") else 1.0,
    )


def bench_skinny_case(
    M: int,
    N: int,
    K: int,
    spec: dict,
    peak_gbps: float,
    reps: int,
    device: torch.device,
    launch_kw: dict | None = None,
    with_torch: bool = True,
) -> dict:
    from ttsaot.builder.kernels.skinny_linear import launch_skinny_linear, skinny_linear_reference

    g = torch.Generator(device=device).manual_seed(M * 7 + N)
    w_bytes = N * K * 2
    n_sets = _sets_for(w_bytes, device)
    t = _skinny_inputs(M, N, K, spec, n_sets, g, device)
    kw = _skinny_kwargs(t, spec)
    launch_kw = {**_interpreter_kwargs(device, "skinny"), **(launch_kw or {})}
    nbytes = _skinny_bytes(M, N, K, spec)
    out = launch_skinny_linear(t["x"], t["weights"][0], **kw, **launch_kw)  # autotunes here
    ref = skinny_linear_reference(t["x"], t["weights"][0], **kw)
    case: dict[str, Any] = {
        "M": M,
        "N": N,
        "K": K,
        "epilogue": spec,
        "bytes": nbytes,
        "weight_sets": n_sets,
        "rel_err_vs_reference": rel_err(out.float(), ref.float()),
    }
    calls = [
        lambda i=i: launch_skinny_linear(t["x"], t["weights"][i], **kw, **launch_kw) for i in _rotation(n_sets, device)
    ]
    ms = graph_ms(calls, reps, device)
    copy = copy_gbps(nbytes, reps, device)
    gbps = nbytes / (ms * 1e-3) / 1e9
    case["kernel"] = {
        "graph_ms": ms,
        "gb_per_s": gbps,
        "ratio_to_copy": gbps / copy["gb_per_s"],
        "ratio_to_peak_copy": gbps / peak_gbps,
        "meets_target": gbps / copy["gb_per_s"] >= TARGET_RATIO,
    }
    single = time_fn(
        lambda: launch_skinny_linear(t["x"], t["weights"][0], **kw, **launch_kw),
        device,
        _WARMUP[device.type == "cuda"],
        reps,
    )
    case["kernel"]["eager_launch_ms"] = single["ms"]
    case["copy_same_bytes"] = copy
    if with_torch:
        tcalls = [lambda i=i: skinny_linear_reference(t["x"], t["weights"][i], **kw) for i in _rotation(n_sets, device)]
        tms = graph_ms(tcalls, reps, device)
        case["torch_eager_graph"] = {"ms": tms, "gb_per_s": nbytes / (tms * 1e-3) / 1e9}
        case["speedup_vs_torch"] = tms / ms
    return case


# `configs_gemv`: the GEMV (one-row) form at M = 1 on every decode shape, predictors first, split in 2 only where N
# alone gives few programs (o, down): what `one_row_config` is chosen from. (BLOCK_N, BLOCK_K, num_warps, num_stages)
GEMV_SWEEP_CANDIDATES = tuple(
    (bn, bk, w, 1) for bn, bk, w in ((8, 1024, 8), (4, 1024, 4), (8, 512, 4), (4, 512, 2), (2, 1024, 2), (16, 256, 4))
)
# `gemv_preload`: K ranges up to one tile (the kernel's PRELOAD_MAX_K); candidates of 32 or 64 W values per thread at
# 4 warps, 64 at 8.
PRELOAD_SHAPES_PER_THREAD = ((64, 4), (32, 4), (64, 8))


def preload_sweep_candidates(K: int, spec: dict) -> tuple[tuple, ...]:
    """`gemv_preload`'s candidates for one shape: the one-row rule's config, then PRELOAD configs with the K range in
    one power-of-two tile; each plain and with `launch_pdl`."""
    from ttsaot.builder.kernels.common import next_power_of_2
    from ttsaot.builder.kernels.skinny_linear_triton import one_row_config

    rule = one_row_config(K, bool(spec.get("norm")), bool(spec.get("gated")))
    base = [(rule.kwargs["BLOCK_N"], rule.kwargs["BLOCK_K"], rule.num_warps, 1, {})]
    bk = next_power_of_2(K)
    for per_thread, warps in PRELOAD_SHAPES_PER_THREAD:
        bn = per_thread * 32 * warps // (bk * (2 if spec.get("gated") else 1))
        if bn >= 1:
            base.append((bn, bk, warps, 1, {"PRELOAD": True}))
    return tuple((*c[:4], {**c[4], **pdl}) for c in base for pdl in ({}, {"launch_pdl": True}))


# `norm_prologue`: the tile form's RMSNorm prologue (each program's rows' rstd before its K loop) at the normed
# projections' serving rows, as the op runs it (a rolled loop of BLOCK_K chunks: one L2 round trip per chunk, not
# overlapped) against the chunks unrolled so all their loads are in flight at once (NORM_UNROLL: the chunk width;
# the streamed form's way), at the width `tile_block_n` gives these shapes (32) and 16.
NORM_SWEEP_CANDIDATES = tuple(
    (bn, 256, 4, 4, extra) for bn in (32, 16) for extra in ({}, {"NORM_UNROLL": 256}, {"NORM_UNROLL": 512})
)
NORM_SWEEP = {
    "voxcpm2_locdit_qkv": (22,),
    "voxcpm2_locdit_gate_up": (22,),
    "voxcpm2_qkv": (16,),
    "voxcpm2_gate_up": (16,),
    "qwen_code_predictor_qkv": (4,),
    "qwen_code_predictor_gate_up": (4,),
    "fish_fast_ar_qkv": (4,),
    "fish_fast_ar_gate_up": (4,),
}


# `norm_cost`: the normed shapes of NORM_SWEEP at the plan's width (32), BLOCK_K 256, 4 stages; with the prologue
# rolled / unrolled at 4 and 8 warps, and without it (the last two candidates, run on the spec without "norm").
NORM_COST_NORMED = tuple((32, 256, w, 4, extra) for w in (4, 8) for extra in ({}, {"NORM_UNROLL": 256}))
NORM_COST_PLAIN = tuple((32, 256, w, 4) for w in (4, 8))


def _launch_extra(extra: dict, K: int) -> tuple[dict, str]:
    """A sweep candidate's extra launch constants and their key suffix: NORM_UNROLL w → NORM_BLOCK w with cdiv(K, w)
    NORM_CHUNKS, "/norm<w>"; any other constant as given, "/<name><value>"."""
    from ttsaot.builder.kernels.common import cdiv

    meta, key = {}, ""
    for name, value in extra.items():
        if name == "NORM_UNROLL":
            meta.update(NORM_BLOCK=value, NORM_CHUNKS=cdiv(K, value))
            key += f"/norm{value}"
        else:
            meta[name] = value
            key += f"/{name.lower()}{value}"
    return meta, key


GEMV_SWEEP_SHAPES = ("qwen_code_predictor", "fish_fast_ar", "voxcpm2")


def bench_skinny_configs(
    M: int,
    N: int,
    K: int,
    spec: dict,
    form: str,
    peak_gbps: float,
    reps: int,
    device: torch.device,
    time_left: Callable[[], float] = lambda: math.inf,
    with_plan: bool = False,
    candidates: tuple[tuple, ...] | None = None,
    splits: tuple[int, ...] | None = None,
    shared_counters: bool = False,
    plan_variants: dict[str, dict] | None = None,
) -> dict:
    """Every candidate launch config × split-K of one (shape, M, form) on one weight rotation, each checked against
    the aten reference and timed in a graph of back-to-back calls; the same-bytes copy once. Candidates that would
    start past `time_left()` are recorded as skipped; splits that round to the same K ranges run once. A split runs
    as the op does (its epilogue kernel adds the partials); `shared_counters` also times it on one zeroed counter
    workspace that every call reuses (the kernel adds the partials and leaves the workspace zeroed). form "stream":
    the streamed tensor-core form. `with_plan`: also the op's own plan (the autotuned tile form) as "plan", and each
    of `plan_variants` (name: launch keywords, e.g. {"swap_ab": True}) under its name.
    A candidate is (BLOCK_N, BLOCK_K, num_warps, num_stages[, extra launch constants: `_launch_extra`]); without
    them the op's own."""
    from ttsaot.builder.kernels.common import cdiv
    from ttsaot.builder.kernels.skinny_linear import launch_skinny_linear, skinny_linear_reference

    g = torch.Generator(device=device).manual_seed(M * 7 + N)
    n_sets = _sets_for(N * K * 2, device)
    t = _skinny_inputs(M, N, K, spec, n_sets, g, device)
    kw = _skinny_kwargs(t, spec)
    nbytes = _skinny_bytes(M, N, K, spec)
    ref = skinny_linear_reference(t["x"], t["weights"][0], **kw).float()
    copy = copy_gbps(nbytes, reps, device)
    out: dict[str, Any] = {"M": M, "N": N, "K": K, "form": form, "bytes": nbytes, "copy_same_bytes": copy}
    if candidates is None:
        candidates = {"gemv": GEMV_CANDIDATES, "stream": STREAM_CANDIDATES}.get(form, DOT_CANDIDATES)
    if splits is None:
        splits = (1,) if spec.get("gated") else (1, 2, 4)
    shared = torch.zeros(1 << 14, dtype=torch.int32, device=device) if shared_counters else None
    runs: dict[str, Any] = {}
    for bn, bk, warps, stages, *extra in candidates:
        effective = {cdiv(K, cdiv(cdiv(K, sp), bk) * bk): sp for sp in splits}  # K ranges are whole BLOCK_Ks
        meta, suffix = _launch_extra(extra[0] if extra else {}, K)
        config = {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages, **meta}
        for split, semaphores in [(sp, None) for sp in sorted(effective)] + [
            (sp, shared) for sp in sorted(effective) if shared is not None and sp > 1
        ]:
            key = f"bn{bn}/bk{bk}/w{warps}/s{stages}/split{split}{'/shared' if semaphores is not None else ''}"
            key += suffix
            if time_left() <= 0:
                runs[key] = {"skipped": "time budget used up"}
                continue
            launch = dict(
                config=config,
                split_k=split,
                use_dot=form != "gemv",
                semaphores=semaphores,
                stream=form == "stream",
            )
            try:
                err = rel_err(launch_skinny_linear(t["x"], t["weights"][0], **kw, **launch).float(), ref)
                calls = [
                    lambda i=i, launch=launch: launch_skinny_linear(t["x"], t["weights"][i], **kw, **launch)
                    for i in _rotation(n_sets, device)
                ]
                ms = graph_ms(calls, reps, device)
                gbps = nbytes / (ms * 1e-3) / 1e9
                runs[key] = {
                    "graph_ms": ms,
                    "gb_per_s": gbps,
                    "ratio_to_copy": gbps / copy["gb_per_s"],
                    "ratio_to_peak_copy": gbps / peak_gbps,
                    "rel_err_vs_reference": err,
                }
            except Exception as e:  # noqa: BLE001 - a config the compiler refuses is a result too
                runs[key] = {"error": short_error(e)}
    for name, plan_kw in ({"plan": {}, **(plan_variants or {})} if with_plan else {}).items():
        if time_left() <= 0:
            break
        try:
            calls = [
                lambda i=i, p=plan_kw: launch_skinny_linear(t["x"], t["weights"][i], **kw, **p)
                for i in _rotation(n_sets, device)
            ]
            y = launch_skinny_linear(t["x"], t["weights"][0], **kw, **plan_kw)  # autotunes here
            ms = graph_ms(calls, reps, device)
            gbps = nbytes / (ms * 1e-3) / 1e9
            out[name] = {
                "graph_ms": ms,
                "gb_per_s": gbps,
                "ratio_to_copy": gbps / copy["gb_per_s"],
                "rel_err_vs_reference": rel_err(y.float(), ref),
            }
        except Exception as e:  # noqa: BLE001
            out[name] = {"error": short_error(e)}
    out["runs"] = runs
    timed = {k: r for k, r in runs.items() if "graph_ms" in r}
    if timed:
        best = min(timed, key=lambda k: timed[k]["graph_ms"])
        out["best"] = {"config": best, **timed[best]}
    return out


def _plan(M: int, N: int, K: int, spec: dict, device: torch.device) -> dict:
    from ttsaot.builder.kernels.common import multiprocessor_count
    from ttsaot.builder.kernels.skinny_linear import GEMV_MAX_M, plan_split_k

    n_out = N // 2 if spec.get("gated") else N
    return {
        "split_k": plan_split_k(M, n_out, K, multiprocessor_count(device), M > GEMV_MAX_M),
        "form": "dot" if M > GEMV_MAX_M else "gemv",
    }


# ------------------------------------------------------------------------------------------ attention
def _attention_inputs(B: int, S: int, L: int, ctx: int, rope: bool, g: torch.Generator, dev: torch.device):
    from ttsaot.builder.layers.rope import rope_table

    hq, hkv, hd, dt = ATTENTION["hq"], ATTENTION["hkv"], ATTENTION["hd"], torch.bfloat16
    t = {
        "qkv": torch.randn(B, (hq + 2 * hkv) * hd, generator=g, device=dev).to(dt),
        "positions": torch.full((B,), ctx, dtype=torch.long, device=dev),
        "k_cache": torch.randn(L, B, hkv, S, hd, generator=g, device=dev).to(dt),
        "v_cache": torch.randn(L, B, hkv, S, hd, generator=g, device=dev).to(dt),
        "cos": None,
        "sin": None,
    }
    if rope:
        cos, sin = rope_table(hd, S, 10000.0)
        t["cos"], t["sin"] = cos.to(dev), sin.to(dev)
    return t


def bench_sampler_case(V: int, B: int, peak_gbps: float, reps: int, device: torch.device) -> dict:
    """One draw of B rows over V tokens: the kernel and the aten sampler, each replayed from a graph of back-to-back
    calls (16 noise slices rotated, as a frame's steps; 2 in a CPU smoke run), tokens compared on every slice."""
    from ttsaot.builder.kernels.sample import launch_sample_tokens, sample

    g = torch.Generator(device=device).manual_seed(V + B)
    steps = 16 if device.type == "cuda" else 2  # the interpreter takes ~0.5 s per launch
    logits = (torch.randn(B, V, generator=g, device=device) * 3).to(torch.bfloat16)
    noise = torch.rand(B, steps, V, generator=g, device=device)
    temperature = torch.rand(B, generator=g, device=device) + 0.3
    top_k = torch.randint(0, 80, (B,), generator=g, device=device)
    top_p = torch.rand(B, generator=g, device=device) * 0.5 + 0.5
    args = (temperature, top_k, top_p)
    differ = sum(
        int((launch_sample_tokens(logits, noise[:, s], *args) != sample(logits, noise[:, s], *args)).sum())
        for s in range(steps)
    )
    kernel_calls = [lambda s=s: launch_sample_tokens(logits, noise[:, s], *args) for s in range(steps)]
    kernel = graph_ms(kernel_calls, reps, device)
    aten = graph_ms([lambda s=s: sample(logits, noise[:, s], *args) for s in range(steps)], reps, device)
    return {
        "V": V,
        "B": B,
        "draws_compared": steps * B,
        "tokens_differing": differ,
        "kernel": {"graph_ms": kernel},
        "aten": {"graph_ms": aten},
        "speedup": aten / kernel,
    }


def bench_attention_case(
    B: int, ctx: int, rope: bool, peak_gbps: float, reps: int, device: torch.device, launch_kw: dict | None = None
) -> dict:
    from ttsaot.builder.kernels.decode_attention import (
        attention_workspace,
        decode_attention_reference,
        launch_decode_attention,
    )

    hq, hkv, hd, S = ATTENTION["hq"], ATTENTION["hkv"], ATTENTION["hd"], ATTENTION["cache_positions"]
    L = max(2, min(28, _sets_for(B * hkv * (ctx + 1) * hd * 2 * 2, device)))
    g = torch.Generator(device=device).manual_seed(B * 31 + ctx)
    t = _attention_inputs(B, S, L, ctx, rope, g, device)
    launch_kw = {**_interpreter_kwargs(device, "attention"), **(launch_kw or {})}
    # One zeroed workspace for every call, as a step passes one to all its layers (the kernel returns it zeroed).
    ws = attention_workspace(t["qkv"], t["k_cache"])
    one = {**t, "k_cache": t["k_cache"][:1].clone(), "v_cache": t["v_cache"][:1].clone()}
    ref_t = {**t, "k_cache": t["k_cache"][:1].clone(), "v_cache": t["v_cache"][:1].clone()}
    out = launch_decode_attention(**one, layer=0, scale=hd**-0.5, workspace=ws, **launch_kw)
    ref = decode_attention_reference(**ref_t, layer=0, scale=hd**-0.5)
    # K/V of the context read, qkv read, o written, this token's k/v written
    nbytes = B * hkv * ctx * hd * 2 * 2 + B * (hq + 2 * hkv) * hd * 2 + B * hq * hd * 2 + B * hkv * hd * 2 * 2
    case: dict[str, Any] = {
        "B": B,
        "context": ctx,
        "cache_positions": S,
        "heads": [hq, hkv, hd],
        "rope": rope,
        "bytes": nbytes,
        "layers_rotated": L,
        "rel_err_vs_reference": rel_err(out.float(), ref.float()),
        "k_cache_rel_err_vs_reference": rel_err(one["k_cache"].float(), ref_t["k_cache"].float()),
        "workspace_zero_after": not bool(ws.any()),
    }
    calls = [
        lambda i=i: launch_decode_attention(**t, layer=i, scale=hd**-0.5, workspace=ws, **launch_kw)
        for i in _rotation(L, device)
    ]
    ms = graph_ms(calls, reps, device)
    gbps = nbytes / (ms * 1e-3) / 1e9
    case["kernel"] = {
        "graph_ms": ms,
        "gb_per_s": gbps,
        "ratio_to_peak_copy": gbps / peak_gbps,
        "floor_ms": nbytes / (peak_gbps * 1e9) * 1e3,
    }
    case["workspace_zero_after_timing"] = not bool(ws.any())
    single = time_fn(
        lambda: launch_decode_attention(**t, layer=0, scale=hd**-0.5, workspace=ws, **launch_kw),
        device,
        _WARMUP[device.type == "cuda"],
        reps,
    )
    case["kernel"]["eager_launch_ms"] = single["ms"]
    return case


# ---------------------------------------------------------------------------------------------- layer
@functools.lru_cache(maxsize=1)
def _voxcpm2_layers(n: int, S: int, device: torch.device):
    from ttsaot.builder.families.voxcpm2.config import LM_PRESETS
    from ttsaot.builder.families.voxcpm2.lm import MiniCPMLayer, RopeTable

    cfg = LM_PRESETS[LAYER["preset"]].lm
    torch.manual_seed(0)
    layers = []
    for _ in range(n):
        layer = MiniCPMLayer(cfg)
        with torch.no_grad():
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
            layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
        layer.self_attn.fuse_projections()
        layer.mlp.fuse_projections()
        layers.append(layer.to(device, torch.bfloat16).eval())
    rope = RopeTable(cfg, S).to(device)
    return cfg, layers, rope


def _kernel_layer_step(layer, x, positions, k_cache, v_cache, i, cos, sin):
    """The layer as the kernel pass wires it (builder/kernels/decode_modules.py)."""
    from ttsaot.builder.kernels.decode_modules import KernelAttention, KernelSwiGLU

    scale = layer.branch_scale or 1.0
    h = KernelAttention(layer.self_attn).decode_step(
        x, layer.input_layernorm, positions, k_cache, v_cache, i, cos, sin, scale
    )
    return KernelSwiGLU(layer.mlp).decode_step(h, layer.post_attention_layernorm, scale)


def bench_layer(B: int, peak_gbps: float, reps: int, with_compile: bool, device: torch.device) -> dict:
    n_layers, S, ctx = LAYER["layers"], LAYER["cache_positions"], LAYER["context"]
    cfg, layers, rope = _voxcpm2_layers(n_layers, S, device)
    hkv, hd = cfg.num_key_value_heads, cfg.head_dim
    g = torch.Generator(device=device).manual_seed(B)
    x = torch.randn(B, cfg.hidden_size, generator=g, device=device).bfloat16()
    positions = torch.full((B,), ctx, dtype=torch.long, device=device)
    kc0 = torch.randn(n_layers, B, hkv, S, hd, generator=g, device=device).bfloat16()
    vc0 = torch.randn(n_layers, B, hkv, S, hd, generator=g, device=device).bfloat16()
    cos_all, sin_all = rope.cos, rope.sin
    cos_rows, sin_rows = cos_all[positions][:, None, None, :], sin_all[positions][:, None, None, :]

    def eager_stack(x, kc, vc):
        for i, layer in enumerate(layers):
            x = layer.forward_step(x, cos_rows, sin_rows, i, positions, kc, vc)
        return x

    def kernel_stack(x, kc, vc):
        for i, layer in enumerate(layers):
            x = _kernel_layer_step(layer, x, positions, kc, vc, i, cos_all, sin_all)
        return x

    w_bytes = sum(p.numel() * p.element_size() for p in layers[0].parameters())
    kv_bytes = B * hkv * (ctx + 1) * hd * 2 * 2
    floor_ms = (w_bytes + kv_bytes) / (peak_gbps * 1e9) * 1e3
    res: dict[str, Any] = {
        "B": B,
        "context": ctx,
        "cache_positions": S,
        "layers_in_graph": n_layers,
        "weight_bytes_per_layer": w_bytes,
        "kv_bytes_per_layer": kv_bytes,
        "floor_ms_per_layer": floor_ms,
        "use_mup": cfg.use_mup,
    }
    with torch.no_grad():
        kc_e, vc_e, kc_k, vc_k = kc0.clone(), vc0.clone(), kc0.clone(), vc0.clone()
        want = eager_stack(x, kc_e, vc_e)
        got = kernel_stack(x, kc_k, vc_k)
        res["check"] = {
            "rel_err_out_vs_eager": rel_err(got.float(), want.float()),
            "rel_err_k_cache_vs_eager": rel_err(kc_k.float(), kc_e.float()),
            "rel_err_v_cache_vs_eager": rel_err(vc_k.float(), vc_e.float()),
        }
        variants = {"kernels_graph": kernel_stack, "eager_graph": eager_stack}
        for name, fn in variants.items():
            kc, vc = kc0.clone(), vc0.clone()
            ms = graph_ms([lambda fn=fn, kc=kc, vc=vc: fn(x, kc, vc)], reps, device) / n_layers
            res[name] = {"ms_per_layer": ms, "x_floor": ms / floor_ms}
        if with_compile:
            try:
                t0 = time.time()
                compiled = torch.compile(eager_stack, mode="max-autotune-no-cudagraphs", dynamic=False)
                kc, vc = kc0.clone(), vc0.clone()
                compiled(x, kc, vc)
                compile_s = time.time() - t0
                ms = graph_ms([lambda: compiled(x, kc, vc)], reps, device) / n_layers
                res["compile_graph"] = {"ms_per_layer": ms, "x_floor": ms / floor_ms, "compile_s": compile_s}
            except Exception as e:  # noqa: BLE001
                res["compile_graph"] = {"error": short_error(e)}
    res["speedup_vs_eager_graph"] = res["eager_graph"]["ms_per_layer"] / res["kernels_graph"]["ms_per_layer"]
    return res


# ----------------------------------------------------------------------------------------------- AOTI
class _AotiProbe(torch.nn.Module):
    """Two decode layers (norm+qkv, attention over the caller's caches, o_proj+residual) at VoxCPM2's attention
    dims: what an exported step stage holds per layer."""

    def __init__(self, S: int, D: int = 2048, hq: int = 16, hkv: int = 2, hd: int = 128) -> None:
        super().__init__()
        from ttsaot.builder.layers.rope import rope_table

        g = torch.Generator().manual_seed(0)
        self.norm = torch.nn.Parameter(torch.rand(2, D, generator=g) + 0.5)
        self.wqkv = torch.nn.Parameter(torch.randn(2, (hq + 2 * hkv) * hd, D, generator=g) / D**0.5)
        self.wo = torch.nn.Parameter(torch.randn(2, D, hq * hd, generator=g) / (hq * hd) ** 0.5)
        cos, sin = rope_table(hd, S, 10000.0)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.cos_keep_fp32 = self.sin_keep_fp32 = True  # the op takes fp32 rope tables (cast_to_compute_dtype)
        self.scale = hd**-0.5

    def forward(self, x, positions, k_cache, v_cache):
        from ttsaot.builder.kernels import decode_attention, skinny_linear

        for layer in range(2):
            qkv = skinny_linear(x, self.wqkv[layer], norm_weight=self.norm[layer], norm_eps=1e-5)
            o = decode_attention(qkv, positions, k_cache, v_cache, layer, self.scale, self.cos, self.sin)
            x = skinny_linear(o, self.wo[layer], residual=x)
        return x


def bench_aoti(reps: int, B: int = 4, S: int = 8193) -> dict:
    from torch._inductor import aoti_compile_and_package, aoti_load_package

    if "CXX" not in os.environ and Path("/usr/bin/g++").exists():
        os.environ["CXX"] = "/usr/bin/g++"  # AOTI packages built with another compiler segfault on load
    from ttsaot.builder.passes import cast_to_compute_dtype

    m = cast_to_compute_dtype(_AotiProbe(S), torch.bfloat16).to("cuda")

    def inputs(seed: int):
        g = torch.Generator(device="cuda").manual_seed(seed)
        return (
            torch.randn(B, 2048, generator=g, device="cuda").bfloat16(),
            torch.tensor([0, 100, 511, S - 1][:B], device="cuda"),
            torch.randn(2, B, 2, S, 128, generator=g, device="cuda").bfloat16(),
            torch.randn(2, B, 2, S, 128, generator=g, device="cuda").bfloat16(),
        )

    res: dict[str, Any] = {"B": B, "cache_positions": S}
    cache_bytes = 2 * B * 2 * S * 128 * 2
    res["cache_bytes_each"] = cache_bytes
    with tempfile.TemporaryDirectory(prefix="bench-aoti-") as tmp, torch.no_grad():
        t0 = time.time()
        ep = torch.export.export(m, inputs(0), strict=False)
        res["exported_op_nodes"] = {
            name: sum(1 for n in ep.graph.nodes if n.op == "call_function" and name in str(n.target))
            for name in ("ttsaot.decode_attention", "ttsaot.skinny_linear")
        }
        path = aoti_compile_and_package(ep, package_path=str(Path(tmp) / "probe.pt2"))
        res["compile_s"] = time.time() - t0
        with zipfile.ZipFile(path) as z:
            code = "".join(
                z.read(n).decode(errors="replace") for n in z.namelist() if n.endswith((".wrapper.cpp", ".cpp", ".py"))
            )
        res["generated_code"] = {
            "clone_calls": code.count("aoti_torch_clone"),
            "copy_calls": code.count("aoti_torch_copy_"),
            "decode_attention_kernel_launches": code.count("decode_attention_kernel"),
            "skinny_linear_kernel_launches": code.count("skinny_linear_kernel"),
            "proxy_executor_calls": code.count("proxy_executor_call_function"),
        }
        runner = aoti_load_package(path, run_single_threaded=True)
        a_in, e_in = inputs(1), inputs(1)
        runner(*inputs(2))  # warm-up: lazy kernel loads
        torch.cuda.synchronize()
        ptrs = [a_in[2].data_ptr(), a_in[3].data_ptr()]
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        got = runner(*a_in)
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base
        want = m(*e_in)
        res["peak_extra_bytes_during_call"] = extra
        res["cache_copied"] = extra >= cache_bytes // 2
        res["rel_err_out_vs_eager_ops"] = rel_err(got.float(), want.float())
        res["rel_err_k_cache_vs_eager_ops"] = rel_err(a_in[2].float(), e_in[2].float())
        res["cache_written_in_callers_tensor"] = (
            ptrs == [a_in[2].data_ptr(), a_in[3].data_ptr()] and res["rel_err_k_cache_vs_eager_ops"] < 1e-2
        )
        res["graph_ms"] = graph_ms([lambda: runner(*a_in)], reps, torch.device("cuda"))
        res["eager_ops_graph_ms"] = graph_ms([lambda: m(*e_in)], reps, torch.device("cuda"))
    res["ok"] = (
        not res["cache_copied"] and res["cache_written_in_callers_tensor"] and res["rel_err_out_vs_eager_ops"] < 1e-2
    )
    return res


# ---------------------------------------------------------------------------------------------- runner
def run_kernels(
    device: torch.device,
    quick: bool = False,
    budget_s: float = 200.0,
    sections: tuple[str, ...] = DEFAULT_SECTIONS,
    with_compile: bool = False,
    progress: Callable[[dict], None] | None = None,
) -> dict[str, Any]:
    """`progress(result)` is called after every case (the CLI rewrites the JSON, so a crash keeps what was
    measured). Off-GPU this is a smoke run (Triton's interpreter, for the tests, with shrunk shape tables): no
    AOTI, no figures worth publishing."""
    torch.set_grad_enabled(False)
    res: dict[str, Any] = {
        "schema": RESULTS_SCHEMA,
        "kind": "kernels",
        "started": now_iso(),
        "git_commit": git_commit(),
        "device": device_info(device),
        "target_ratio": TARGET_RATIO,
        "budget_s": budget_s,
        "quick": quick,
        "sections": {},
    }
    from ttsaot.builder.kernels.common import HAVE_TRITON

    if not HAVE_TRITON:
        res["status"] = "unavailable: needs Triton"
        return res
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        res["status"] = "unavailable: needs CUDA (or TRITON_INTERPRET=1 for a smoke run)"
        return res
    budget = _Budget(budget_s)
    reps = (10 if quick else 30) if device.type == "cuda" else 1
    t_all = time.time()
    peak = _peak_copy(reps, device)
    res["sections"]["copy"] = peak
    peak_gbps = peak["gb_per_s"]
    common = dict(peak_gbps=peak_gbps, reps=reps, device=device)

    def guarded(section: str, fn: Callable[[], Any]) -> None:
        if section not in sections:
            return
        if budget.left() <= 0:
            res["sections"][section] = {"skipped": "time budget used up"}
            return
        t0 = time.time()
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001
            out = {"error": short_error(e)}
        res["sections"][section] = out
        res.setdefault("section_seconds", {})[section] = round(time.time() - t0, 1)
        if progress:
            progress(res)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    def cases(make: Callable[..., dict], items: list[tuple[str, dict]]) -> dict:
        out: dict[str, Any] = {}
        res["running"] = out
        for key, kw in items:
            if budget.left() <= 0:
                out[key] = {"skipped": "time budget used up"}
                continue
            t0 = time.time()
            try:
                out[key] = make(**kw, **common)
                out[key]["seconds"] = round(time.time() - t0, 2)
            except Exception as e:  # noqa: BLE001
                out[key] = {"error": short_error(e)}
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if progress:
                progress(res)
        res.pop("running", None)
        return out

    def skinny_section(shapes: dict) -> dict:
        items = []
        for name, (N, K, spec, ms) in shapes.items():
            for M in (ms[0], ms[-1]) if quick else ms:
                items.append((f"{name}/M={M}", dict(M=M, N=N, K=K, spec=spec)))
        out = cases(bench_skinny_case, items)
        for case in out.values():
            if "M" in case:
                case["plan"] = _plan(case["M"], case["N"], case["K"], case["epilogue"], device)
        return out

    guarded("skinny", lambda: skinny_section(SKINNY_SHAPES))
    contexts = ATTENTION["contexts"][:1] if quick else ATTENTION["contexts"]
    batches = (1, 16) if quick else (1, 2, 4, 8, 16)
    attn_items = [
        (f"{'base' if rope else 'residual'}/B={B}/ctx={ctx}", dict(B=B, ctx=ctx, rope=rope))
        for rope in (True, False)
        for ctx in contexts
        for B in batches
        if rope or ctx == contexts[0]
    ]
    guarded("attention", lambda: cases(bench_attention_case, attn_items))
    if device.type == "cuda":
        guarded("aoti", lambda: bench_aoti(reps))
    layer_items = [
        (f"B={B}/ctx={LAYER['context']}", dict(B=B, with_compile=with_compile))
        for B in ((1, 16) if quick else (1, 4, 16))
    ]
    guarded("layer", lambda: cases(bench_layer, layer_items))
    guarded("predictors", lambda: skinny_section(PREDICTOR_SHAPES))
    guarded("sampler", lambda: cases(bench_sampler_case, [(f"V={v}/B={b}", dict(V=v, B=b)) for v, b in SAMPLER_CASES]))

    def sweep_section() -> dict:
        items = []
        for name, (N, K, spec, _) in SKINNY_SHAPES.items():
            for M in (1, 4, 16):
                for form in ("gemv", "dot") if M < 16 else ("dot",):
                    for split in (1, 2, 4):
                        items.append(
                            (
                                f"skinny/{name}/M={M}/{form}/split_k={split}",
                                dict(
                                    M=M,
                                    N=N,
                                    K=K,
                                    spec=spec,
                                    with_torch=False,
                                    launch_kw={"split_k": split, "use_dot": form == "dot"},
                                ),
                            )
                        )
        return cases(bench_skinny_case, items)

    guarded("sweep", sweep_section)

    def sweep_attention_section() -> dict:
        """Decode attention's context splits × BLOCK_S for the base LM's heads at the steps' batch sizes and both
        contexts, each case marked with the split count `plan_num_splits` gives it and whether it is the launcher's
        own plan (the summary sets the plan's time beside the best)."""
        from ttsaot.builder.kernels.common import multiprocessor_count
        from ttsaot.builder.kernels.decode_attention import BLOCK_S, plan_num_splits

        items, planned = [], {}
        for B in (1, 16) if quick else ATTENTION_SWEEP["batches"]:
            plan = plan_num_splits(B * ATTENTION["hkv"], ATTENTION["cache_positions"], multiprocessor_count(device))
            for ctx in contexts:
                for splits in ATTENTION_SWEEP["splits"]:
                    for block_s in ATTENTION_SWEEP["blocks"]:
                        key = f"attention/base/B={B}/ctx={ctx}/splits={splits}/block_s={block_s}"
                        planned[key] = (plan, splits == plan and block_s == BLOCK_S)
                        kw = {"num_splits": splits, "min_chunk": block_s, "block_s": block_s}
                        items.append((key, dict(B=B, ctx=ctx, rope=True, launch_kw=kw)))
        out = cases(bench_attention_case, items)
        for key, case in out.items():
            case["planned_splits"], case["is_plan"] = planned[key]
        return out

    guarded("sweep_attention", sweep_attention_section)

    def sweep_predictors_section() -> dict:
        """split-K 1/2/4 of the tensor-core form at the predictors' own row counts: what plan_split_k chooses
        between there (each split costs an epilogue launch)."""
        items = [
            (
                f"skinny/{name}/M={M}/dot/split_k={split}",
                dict(M=M, N=N, K=K, spec=spec, with_torch=False, launch_kw={"split_k": split, "use_dot": True}),
            )
            for name, (N, K, spec, ms) in PREDICTOR_SHAPES.items()
            for M in ms
            for split in (1, 2, 4)
        ]
        return cases(bench_skinny_case, items)

    guarded("sweep_predictors", sweep_predictors_section)

    def config_sweep(cases_: list[tuple[str, int, str]], splits: Any = None, **kw: Any) -> dict:
        """`bench_skinny_configs` at each (shape name, rows, form) of the skinny or predictor tables; `splits` a
        tuple, or a function of the shape's epilogue giving one (None: the function's default)."""
        shapes = {**SKINNY_SHAPES, **PREDICTOR_SHAPES}
        items = []
        for name, M, form in cases_:
            N, K, spec, _ = shapes[name]
            split_ks = splits(spec) if callable(splits) else splits
            launch = dict(M=M, N=N, K=K, spec=spec, form=form, time_left=budget.left, splits=split_ks, **kw)
            items.append((f"{name}/M={M}/{form}", launch))
        return cases(bench_skinny_configs, items)

    guarded("configs", lambda: config_sweep([(n, M, form) for M, form in CONFIG_SWEEP_M for n in SKINNY_SHAPES]))
    sweep_prefix, sweep_rows, sweep_splits = PREDICTOR_SWEEP
    guarded(
        "configs_predictors",
        lambda: config_sweep(
            [(n, M, "dot") for M in sweep_rows for n in PREDICTOR_SHAPES if n.startswith(sweep_prefix)],
            sweep_splits,
            candidates=PREDICTOR_DOT_CANDIDATES,
            shared_counters=True,
        ),
    )
    guarded(
        "configs_stream",
        lambda: config_sweep(
            [(n, M, "stream") for n, ms in STREAM_SWEEP.items() for M in ms],
            lambda spec: (1,) if spec.get("gated") else (1, 2),
            with_plan=True,
        ),
    )
    # predictors first; LocDiT's rows are never one
    gemv_shapes = [n for p in GEMV_SWEEP_SHAPES for n in {**PREDICTOR_SHAPES, **SKINNY_SHAPES} if n.startswith(p)]
    guarded(
        "configs_gemv",
        lambda: config_sweep(
            [(n, 1, "gemv") for n in gemv_shapes if not n.startswith("voxcpm2_locdit")],
            lambda spec: (1, 2) if spec.get("residual") else (1,),
            candidates=GEMV_SWEEP_CANDIDATES,
        ),
    )
    norm_cases = [
        (n, M, "dot") for n, ms in NORM_SWEEP.items() if n in {**SKINNY_SHAPES, **PREDICTOR_SHAPES} for M in ms
    ]
    guarded("norm_prologue", lambda: config_sweep(norm_cases, (1,), candidates=NORM_SWEEP_CANDIDATES))

    def norm_cost_section() -> dict:
        shapes = {**SKINNY_SHAPES, **PREDICTOR_SHAPES}
        items = []
        for name, rows in NORM_SWEEP.items():
            N, K, spec, _ = shapes[name]
            plain = {k: v for k, v in spec.items() if k != "norm"}
            for M in rows:
                for label, sp, cands in (("norm", spec, NORM_COST_NORMED), ("plain", plain, NORM_COST_PLAIN)):
                    launch = dict(
                        M=M, N=N, K=K, spec=sp, form="dot", time_left=budget.left, splits=(1,), candidates=cands
                    )
                    items.append((f"{name}/M={M}/{label}", launch))
        return cases(bench_skinny_configs, items)

    guarded("norm_cost", norm_cost_section)

    def preload_section() -> dict:
        from ttsaot.builder.kernels.skinny_linear_triton import PRELOAD_MAX_K

        shapes = {**PREDICTOR_SHAPES, **SKINNY_SHAPES}
        items = [
            (f"{name}/M=1/gemv", dict(M=1, N=N, K=K, spec=spec, form="gemv", time_left=budget.left, splits=(1,),
                                      candidates=preload_sweep_candidates(K, spec)))
            for name in gemv_shapes
            for N, K, spec, _ in [shapes[name]]
            if not name.startswith("voxcpm2_locdit") and K <= PRELOAD_MAX_K
        ]  # fmt: skip
        return cases(bench_skinny_configs, items)

    guarded("gemv_preload", preload_section)
    _voxcpm2_layers.cache_clear()
    res["seconds"] = round(time.time() - t_all, 1)
    res["status"] = "ok"
    if progress:
        progress(res)
    return res


def summary(res: dict) -> str:
    """A short table of the headline figures (the reply carries the end of the output)."""
    lines = []
    sec = res.get("sections", {})
    if "copy" in sec:
        lines.append(f"copy 1 GiB: {sec['copy']['gb_per_s']:.0f} GB/s")
    for key, c in {**sec.get("skinny", {}), **sec.get("predictors", {})}.items():
        if "kernel" in c:
            k = c["kernel"]
            lines.append(
                f"skinny {key:<34} {k['graph_ms'] * 1e3:7.1f} us {k['gb_per_s']:6.0f} GB/s "
                f"{k['ratio_to_copy']:4.0%} of copy  x{c.get('speedup_vs_torch', float('nan')):.2f} "
                f"vs torch  err {c['rel_err_vs_reference']:.1e}"
            )
        else:
            lines.append(f"skinny {key:<34} {c.get('error') or c.get('skipped')}")
    for key, c in sec.get("attention", {}).items():
        if "kernel" in c:
            k = c["kernel"]
            lines.append(
                f"attention {key:<31} {k['graph_ms'] * 1e3:7.1f} us (floor {k['floor_ms'] * 1e3:.1f} us) "
                f"err {c['rel_err_vs_reference']:.1e}"
            )
        else:
            lines.append(f"attention {key:<31} {c.get('error') or c.get('skipped')}")
    for key, c in sec.get("layer", {}).items():
        if "kernels_graph" in c:
            extra = ""
            if "compile_graph" in c and "ms_per_layer" in c["compile_graph"]:
                extra = f", compile {c['compile_graph']['ms_per_layer'] * 1e3:.1f} us"
            lines.append(
                f"layer {key:<12} kernels {c['kernels_graph']['ms_per_layer'] * 1e3:.1f} us "
                f"({c['kernels_graph']['x_floor']:.2f}x floor {c['floor_ms_per_layer'] * 1e3:.1f} us), "
                f"eager {c['eager_graph']['ms_per_layer'] * 1e3:.1f} us{extra}; "
                f"err {c['check']['rel_err_out_vs_eager']:.1e}"
            )
        else:
            lines.append(f"layer {key:<12} {c.get('error') or c.get('skipped')}")
    for key, c in sec.get("sampler", {}).items():
        if "kernel" in c:
            lines.append(
                f"sampler {key:<33} {c['kernel']['graph_ms'] * 1e3:7.1f} us, aten {c['aten']['graph_ms'] * 1e3:.1f} us "
                f"(x{c['speedup']:.2f}); {c['tokens_differing']} of {c['draws_compared']} tokens differ"
            )
        else:
            lines.append(f"sampler {key:<33} {c.get('error') or c.get('skipped')}")
    a = sec.get("aoti")
    if a and "ok" in a:
        lines.append(
            f"aoti ok={a['ok']} cache_copied={a['cache_copied']} "
            f"peak_extra={a['peak_extra_bytes_during_call']} B, code={a['generated_code']}, "
            f"graph {a['graph_ms'] * 1e3:.1f} us vs eager ops {a['eager_ops_graph_ms'] * 1e3:.1f} us"
        )
    elif a:
        lines.append(f"aoti {a.get('error') or a.get('skipped')}")
    sweeps = [sec.get(name, {}) for name in ("sweep", "sweep_attention", "sweep_predictors")]
    sw = {k: c for part in sweeps if "error" not in part and "skipped" not in part for k, c in part.items()}
    best: dict[str, tuple[float, str]] = {}
    plan: dict[str, str] = {}
    for key, c in sw.items():
        if "kernel" in c:
            group = key.rsplit("/", 2)[0]
            ms = c["kernel"]["graph_ms"]
            if group not in best or ms < best[group][0]:
                best[group] = (ms, key)
            if c.get("is_plan"):
                plan[group] = f"; plan ({c['planned_splits']} splits) {ms * 1e3:.1f} us"
    for group, (ms, key) in best.items():
        lines.append(f"sweep best {key}: {ms * 1e3:.1f} us" + plan.get(group, ""))
    for key, c in [*sec.get("configs", {}).items(), *sec.get("configs_predictors", {}).items()]:
        if isinstance(c, dict) and "best" in c:
            b = c["best"]
            lines.append(
                f"configs {key:<26} best {b['config']:<30} {b['graph_ms'] * 1e3:6.1f} us "
                f"{b['ratio_to_copy']:4.0%} of copy {b['ratio_to_peak_copy']:4.0%} of peak"
            )
        elif isinstance(c, dict):
            lines.append(f"configs {key:<26} {c.get('error') or c.get('skipped') or 'no run timed'}")
    for key, c in sec.get("configs_stream", {}).items():
        if not isinstance(c, dict) or "best" not in c:
            lines.append(f"stream {key:<32} {c.get('error') or c.get('skipped') if isinstance(c, dict) else c}")
            continue
        b, plan, copy = c["best"], c.get("plan", {}), c["copy_same_bytes"]["ms"]
        tile = f"{plan['graph_ms'] * 1e3:6.1f} us" if "graph_ms" in plan else plan.get("error", "-")
        lines.append(
            f"stream {key:<32} tile plan {tile}  stream best {b['graph_ms'] * 1e3:6.1f} us ({b['config']}, "
            f"{b['ratio_to_copy']:4.0%} of copy)  copy {copy * 1e3:5.1f} us"
        )
    for key, c in sec.get("norm_cost", {}).items():
        runs = c.get("runs", {}) if isinstance(c, dict) else {}
        timed = "  ".join(
            f"{k.split('/split1')[0].replace('bn32/bk256/', '')}{k.split('/split1')[1]} {r['graph_ms'] * 1e3:.2f}"
            for k, r in runs.items()
            if "graph_ms" in r
        )
        lines.append(f"norm_cost {key:<38} {timed or (c.get('error') or c.get('skipped') or 'none timed')} us")
    lines.append(f"status {res.get('status')} in {res.get('seconds', 0)} s")
    return "\n".join(lines)
