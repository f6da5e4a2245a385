"""`python -m bench profile`: the per-bucket kernel profile of one stage, on CPU (no graph: the package call)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.profile import (
    kernel_rows,
    kernel_timeline,
    launch_text,
    own_per_launch,
    own_per_name,
    own_times,
    profile_stage,
    render,
    trace_device_events,
    trace_events,
    write_profile,
)

from . import bench_fixtures

local_encoder_bench_cache = bench_fixtures.local_encoder_bench_cache  # the prebuild of test_bench_prebuild.py

ROOT = Path(__file__).resolve().parents[1]


def test_local_encoder_profile_on_cpu(local_encoder_bench_cache, tmp_path):
    # a copy of the bench cache tests/bench_fixtures.py prebuilt: the artifact this profile asks for is in it
    cache = shutil.copytree(local_encoder_bench_cache, tmp_path / "cache", ignore=shutil.ignore_patterns("*.lock"))
    res = profile_stage(
        "voxcpm2",
        "local_encoder",
        device=torch.device("cpu"),
        axes=bench_fixtures.AXES,
        calls=2,
        reps=3,
        cache=cache,
    )
    assert res["build"]["cached"] is True  # reused, not compiled again
    assert res["status"] == "ok" and res["kernels"] == "inductor" == res["manifest_kernels"]
    assert res["stage"]["dtype"] == "float32" and res["settings"]["graphs"] is False
    lay = res["layers"]
    assert (lay["passes"], lay["how"]) == (2, "encoder layers")  # the tiny preset's encoder
    # each layer runs once: the loop floor is the weights-once floor
    assert lay["loop"]["distinct_layers"] == 2 and lay["loop"]["repeats"] == 1
    assert 0 < lay["loop"]["layer_weight_bytes"] < res["weight_bytes"] == lay["loop"]["bytes"]
    assert res["weight_bytes"] > 0 and res["copy"]["gb_per_s"] > 0
    (key,) = res["buckets"]
    b = res["buckets"][key]
    assert b["sizes"]["batch"] == 1 and b["call_ms"] > 0 and b["kernels_per_call"] > 0
    assert b["kernels_per_layer"] == round(b["kernels_per_call"] / 2, 2)
    assert b["gap_ms"] == pytest.approx(b["call_ms"] - b["kernel_ms"])
    assert b["bytes"] == res["weight_bytes"] + b["io_bytes"] and b["x_floor"] > 1.0
    assert b["loop_bytes"] == b["bytes"] and b["x_loop_floor"] == pytest.approx(b["x_floor"])
    times = [r["us_per_call"] for r in b["top"]]
    assert times == sorted(times, reverse=True) and all(r["name"] != "bench::profiled_call" for r in b["top"])
    assert sum(r["share"] for r in b["top"]) <= 1.0 + 0.5e-4 * len(b["top"])  # each share rounded to 4 decimals
    path = write_profile(res, tmp_path / "results" / res["device"]["slug"] / "profiles")
    assert path.name == "voxcpm2__local_encoder__inductor.json"
    assert json.loads(path.read_text())["buckets"][key]["kernels_per_call"] == b["kernels_per_call"]
    text = path.with_suffix(".txt").read_text()
    assert f"[{key}]" in text and "kernels/call" in text and text.strip() == render(res)
    # `bench report` lists it (CPU results only when asked)
    from bench.report import write_report

    md = tmp_path / "B.md"
    write_report(tmp_path / "results", md, tmp_path / "plots", include_cpu=False)
    assert "voxcpm2/local_encoder" not in md.read_text()
    write_report(tmp_path / "results", md, tmp_path / "plots", include_cpu=True)
    row = next(ln for ln in md.read_text().splitlines() if ln.startswith("| voxcpm2/local_encoder | inductor"))
    assert f"`{key}`" in row and f"| {b['kernels_per_call']:g} |" in row


def test_loop_floor_counts_the_stack_once_per_pass():
    from bench.floor import loop_weight_bytes
    from bench.profile import add_loop_floor

    # Fish fast_ar's shape: 4 layers × 9 steps; the heads and norms outside the stack count once
    named = {f"layers.{i}.{p}": 100 for i in range(4) for p in ("qkv", "o")} | {"output.weight": 50, "norm.weight": 2}
    loop = loop_weight_bytes(named, 36)
    assert loop == {"stack": "", "layer_weight_bytes": 800, "distinct_layers": 4, "repeats": 9, "bytes": 852 + 8 * 800}
    # a stage with two stacks (VoxCPM2 locdit: the DiT's layers loop, another stack runs once)
    two = {f"dit.layers.{i}.w": 10 for i in range(2)} | {f"enc.layers.{i}.w": 1 for i in range(3)}
    assert loop_weight_bytes(two, 18)["stack"] == "dit" and loop_weight_bytes(two, 18)["repeats"] == 9
    assert loop_weight_bytes(named, 35) is None and loop_weight_bytes({"head": 1}, 9) is None
    b = {"bytes": 852 + 48, "call_ms": 2.0}
    add_loop_floor(b, {"passes": 36, "loop": loop}, copy_gbps=1.0)
    assert b["loop_bytes"] == 900 + 8 * 800 and b["loop_floor_ms"] == pytest.approx(7300 / 1e9 * 1e3)
    assert b["x_loop_floor"] == pytest.approx(2.0 / b["loop_floor_ms"])
    b2 = {"bytes": 10, "call_ms": 1.0}
    add_loop_floor(b2, {"passes": 3, "loop": None}, 1.0)
    assert "x_loop_floor" not in b2


def test_kernel_rows_count_per_call_and_drop_the_marker():
    from torch.profiler import ProfilerActivity, profile, record_function

    x = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(4):
            with record_function("bench::profiled_call"):
                torch.mm(x, x)
    rows = {r["name"]: r for r in kernel_rows(prof.key_averages(), cuda=False, calls=4)}
    assert "bench::profiled_call" not in rows and rows["aten::mm"]["per_call"] == 1.0


def test_kernel_timeline_is_one_call_in_launch_order_with_median_durations():
    # three calls of (gemm, dw, gemm), recorded out of order; the middle call is the slow outlier
    calls = [[("gemm", 10.0, 5.0), ("dw", 16.0, 2.0), ("gemm", 19.0, 7.0)]]
    calls.append([(n, t + 100, d * 3) for n, t, d in calls[0]])
    calls.append([(n, t + 200, d + 1) for n, t, d in calls[0]])
    events = [e for c in calls for e in c][::-1]
    tl = kernel_timeline(events, calls=3)
    assert [e["name"] for e in tl] == ["gemm", "dw", "gemm"]
    assert [e["us"] for e in tl] == [6.0, 3.0, 8.0]
    # the middle call's spans overlap (gemm 110-125, dw 116-122 inside it, gemm 119-140): own times 15, 0, 15
    assert own_times(sorted(calls[1], key=lambda e: e[1])) == [15.0, 0.0, 15.0]
    assert [e["own_us"] for e in tl] == [6.0, 2.0, 8.0]  # medians of (5, 15, 6), (2, 0, 3), (7, 15, 8)


def test_own_times_count_overlapped_spans_once():
    """Programmatic dependent launch: a kernel starts while its predecessor drains and waits on the GPU; its span
    covers that tail, and the spans' sum passes the call. Each activity's own time is what it adds past every
    earlier one's end, so they sum to the device's busy time; per name as the profile tables print them."""
    call = [("qkv", 0.0, 5.0), ("attn", 2.0, 6.0), ("o", 3.0, 2.0), ("o", 9.0, 3.0)]
    assert own_times(call) == [5.0, 3.0, 0.0, 3.0]
    tl = kernel_timeline(call, calls=1)
    assert own_per_name(tl) == {"qkv": 5.0, "attn": 3.0, "o": 3.0}
    assert sum(e["us"] for e in tl) == 16.0 and sum(own_per_name(tl).values()) == 11.0  # busy 0-8 and 9-12


def test_own_per_launch_separates_the_roles_one_kernel_plays():
    """One kernel name, several grids (a layer's projections): a row per (name, launch shape), most own time first,
    with the median own µs of one launch."""
    qkv, o = {"grid": [1, 512, 1], "block": [128, 1, 1]}, {"grid": [1, 256, 1], "block": [128, 1, 1]}
    call = [
        ("skinny", 0.0, 4.0, qkv),
        ("attn", 4.0, 6.0, {"grid": [8, 1, 1], "block": [128, 1, 1]}),
        ("skinny", 10.0, 2.0, o),
        ("skinny", 12.0, 5.0, qkv),
        ("attn", 17.0, 7.0, {"grid": [8, 1, 1], "block": [128, 1, 1]}),
        ("skinny", 24.0, 1.0, o),
    ]
    rows = own_per_launch(kernel_timeline(call, calls=1))
    assert [(r["name"], r["launch"], r["n"], r["own_us"]) for r in rows] == [
        ("attn", "grid 8×1×1 block 128", 2, 13.0),
        ("skinny", "grid 1×512×1 block 128", 2, 9.0),
        ("skinny", "grid 1×256×1 block 128", 2, 3.0),
    ]
    assert rows[1]["own_us_median"] == 5.0  # the median of 4 and 5: the upper of two


def test_kernel_timeline_refuses_calls_that_differ():
    a = [("gemm", 0.0, 1.0), ("dw", 2.0, 1.0)]
    b = [("dw", 10.0, 1.0), ("gemm", 12.0, 1.0)]
    assert kernel_timeline(a + b, calls=2) is None
    assert kernel_timeline(a + b[:1], calls=2) is None  # not one sequence per call
    assert kernel_timeline([], calls=2) is None


def test_trace_events_carry_each_kernels_launch_shape():
    """The device activities come from the profiler's chrome trace (kineto's args): kernels with their grid, block,
    shared memory and registers, copies without, the per-call annotation left out; the timeline keeps the first
    call's launch shape and the rendered table prints it."""
    kernel = {"ph": "X", "cat": "kernel", "name": "skinny_linear_kernel", "ts": 10.0, "dur": 7.5}
    kernel["args"] = {"grid": [1, 64, 2], "block": [128, 1, 1], "shared memory": 98304, "registers per thread": 96}
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": "gpu_user_annotation", "name": "bench::profiled_call", "ts": 9.0, "dur": 30.0},
            kernel,
            {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 1.0, "dur": 2.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 3.0, "dur": 4.0},
            {"ph": "f", "cat": "kernel", "name": "skinny_linear_kernel", "ts": 10.0},
        ]
    }
    events = trace_events(trace)
    assert events == [
        ("skinny_linear_kernel", 10.0, 7.5, {"grid": [1, 64, 2], "block": [128, 1, 1], "smem": 98304, "regs": 96}),
        ("Memcpy HtoD (Pageable -> Device)", 1.0, 2.0, {}),
    ]
    tl = kernel_timeline(events, calls=1)
    assert tl[1] == {"name": "skinny_linear_kernel", "us": 7.5, "own_us": 7.5, "grid": [1, 64, 2]} | {
        "block": [128, 1, 1],
        "smem": 98304,
        "regs": 96,
    }
    assert launch_text(tl[1]) == "grid 1×64×2 block 128 smem 98304" and launch_text(tl[0]) == ""
    # the export itself, on a real (CPU-only) profile: host ops only, so no device activities
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.mm(torch.randn(8, 8), torch.randn(8, 8))
    assert trace_device_events(prof) == []


def test_unknown_stage_is_a_usage_error():
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "profile", "voxcpm2/nope", "--device", "cpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "nope" in proc.stderr


def test_sampling_rows_are_the_predictor_inputs_only():
    from bench.profile import sampling_rows

    xs = [torch.ones(2, 3), torch.tensor([0.5, 0.0]), torch.tensor([50, 0]), torch.tensor([1.0, 0.25])]
    rows = sampling_rows(["hidden", "temperature", "top_k", "top_p"], xs)
    assert rows == {"temperature": [0.5, 0.0], "top_k": [50, 0], "top_p": [1.0, 0.25]}
    assert sampling_rows(["codes"], [torch.ones(1, 4)]) is None


def test_busy_time_in_the_text_and_the_report_rows():
    """A CUDA profile's busy time (spans, overlaps counted once) and each kernel's own time reach the text table and
    `bench report`'s profile rows; profiles recorded before it show a dash."""
    from bench.report import launch_shapes_section, profiles_section

    timeline = kernel_timeline([("qkv", 0.0, 5.0, {}), ("attn", 2.0, 6.0, {}), ("o", 9.0, 3.0, {})], calls=1)
    own = own_per_name(timeline)
    top = [
        {"name": n, "class": "kernel", "per_call": 1.0, "us_per_call": us, "share": us / 14, "own_us_per_call": own[n]}
        for n, us in (("attn", 6.0), ("qkv", 5.0), ("o", 3.0))
    ]
    bucket = {
        "call_ms": 0.012, "call_p10_ms": 0.012, "call_p90_ms": 0.012, "kernels_per_call": 3, "copies_per_call": 0,
        "kernel_ms": 0.014, "gap_ms": -0.002, "bytes": 10**6, "floor_ms": 0.001, "x_floor": 12.0,
        "gb_per_s_over_call": 83.0, "top": top, "timeline": timeline, "own_ms": sum(own.values()) / 1e3,
    }  # fmt: skip
    res = {
        "stage": {"family": "voxcpm2", "stage": "base_lm_step", "dtype": "bfloat16"},
        "device": {"name": "GPU"}, "kernels": "ttsaot", "settings": {"graphs": True}, "copy": {"gb_per_s": 3000.0},
        "weight_bytes": 10**6, "buckets": {"b1": bucket},
    }  # fmt: skip
    text = render(res)
    assert "busy 11.0 µs" in text and "     6.00      3.00       1" in text  # attn: span 6, own 3
    assert "sampling rows" not in text
    bucket["sampling"] = {"temperature": [1000.0], "top_k": [0], "top_p": [1.0]}
    assert "  sampling rows: temperature [1000.0], top_k [0], top_p [1.0]" in render(res).splitlines()
    del bucket["sampling"]
    assert "     6.00      3.00  attn" in text  # the timeline's span and own columns
    row = next(ln for ln in profiles_section([res]).splitlines() if ln.startswith("| voxcpm2/base_lm_step"))
    assert "| -2.0 | 11.0 |" in row
    # by launch shape: the text's table, and the report's rows with each shape's share of the busy time
    assert "by launch shape" in text
    shapes = [ln for ln in launch_shapes_section([res]).splitlines() if ln.startswith("| voxcpm2/base_lm_step")]
    assert [ln.split(" | ")[2] for ln in shapes] == ["`qkv`", "`attn`", "`o`"]  # own 5, 3, 3: most first
    assert shapes[0].endswith("| 1 | 5.00 | 5.0 | 45% |")
    assert launch_shapes_section([{**res, "kernels": "inductor"}]) == ""  # the kernel layer's profiles only
    del bucket["own_ms"]
    row = next(ln for ln in profiles_section([res]).splitlines() if ln.startswith("| voxcpm2/base_lm_step"))
    assert "| -2.0 | — |" in row
