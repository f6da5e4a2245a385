"""`python -m bench memory` (bench/memory.py): the manifest arithmetic, the fresh-process measurement on CPU (its
smoke path), the report section, the full-plan spec, the runtime's per-bucket load stats and the one warm-up
stream per device that keeps a stage's warm-up blocks reusable across its buckets."""

import json
import subprocess
import sys

import pytest
import torch

from bench import memory as M
from bench.__main__ import commands


def test_command_is_registered_and_targets_parse():
    assert "memory" in commands()
    assert M.parse_targets("qwen3-tts-12hz/code2wav, fish-s2-pro/dac_decoder:bf16") == [
        ("qwen3-tts-12hz", "code2wav", None),
        ("fish-s2-pro", "dac_decoder", "bf16"),
    ]
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        M.parse_targets("code2wav")


def test_tensor_storage_bytes_follows_the_strides():
    assert M.tensor_storage_bytes([2, 3], [3, 1], 4) == 24
    assert M.tensor_storage_bytes([2, 3], [1, 2], 2) == 12  # column-major: same span
    assert M.tensor_storage_bytes([2, 3], [8, 1], 4) == (1 + 8 + 2) * 4  # padded rows span more
    assert M.tensor_storage_bytes([0, 5], [5, 1], 4) == 0


def test_full_plan_spec_is_the_family_default_and_the_bench_subset_keeps_its_key():
    from bench.specs import family_module, make_spec
    from ttsaot.builder.buckets import BucketPlan

    fam = family_module("qwen3-tts-12hz")
    default = fam.specs(fam.options(preset="tiny"), ["code2wav"])[0].plan
    spec, desc = make_spec("qwen3-tts-12hz", "code2wav", "tiny", full_plan=True)
    assert spec.plan.axes == default.axes and spec.plan.buckets() == default.buckets()  # the batch × frames cap too
    assert desc["full_plan"] is True and desc["max_batch_frames"] == default.max_batch_frames == 325
    capped, _ = make_spec("qwen3-tts-12hz", "code2wav", "tiny", axes={"frames": (64, 325)}, full_plan=True)
    assert [BucketPlan.key(b) for b in capped.plan.buckets()] == ["b1_f64", "b1_f325", "b2_f64", "b4_f64"]
    sub, sub_desc = make_spec("qwen3-tts-12hz", "code2wav", "tiny")
    assert len(sub.plan.buckets()) < len(default.buckets()) and "full_plan" not in sub_desc


def test_measure_load_on_cpu_records_rss_and_per_bucket_stats(qwen_tiny_fp32):
    from ttsaot.runtime import read_manifest

    entry = read_manifest(qwen_tiny_fp32).stages["code2wav"]
    from safetensors import safe_open

    with safe_open(str(qwen_tiny_fp32 / entry.weights.file), framework="pt") as f:
        file_bytes = sum(f.get_tensor(k).nbytes for k in f.keys() if k in entry.constants)
    rec = M.measure_load(qwen_tiny_fp32, "code2wav", "cpu")
    assert rec["weights_bytes"] == file_bytes > 0
    assert rec["buckets"] == len(entry.buckets) == 6 and rec["graphs"] == 0
    assert set(rec["per_bucket"]) == {b.key for b in entry.buckets}
    assert all(not b["graph"] and b["package_load_s"] >= 0 for b in rec["per_bucket"].values())
    assert rec["static_inputs_bytes"] == 0  # no static buffers without graphs
    assert "reserved_beyond_weights_bytes" not in rec and "cpu_note" in rec  # no GPU numbers on CPU
    assert rec["rss_bytes"] > 0
    assert rec["golden"]["ok"] and rec["golden"]["cases"] > 0


def test_report_section_renders_gpu_and_failed_rows():
    m = {
        "dtype": "bfloat16",
        "kernels": "ttsaot",
        "buckets": 27,
        "graphs": 27,
        "weights_bytes": 200 * M.MIB,
        "reserved_beyond_weights_bytes": 700 * M.MIB,
        "graph_pools": {"reserved_bytes": 512 * M.MIB},
        "default_pool_cached_free_bytes": 150 * M.MIB,
        "device_used_beyond_weights_bytes": 900 * M.MIB,
        "load_s": 3.5,
        "load_stats": {"warmup_capture_s": 2.25},
        "golden": {"cases": 2, "ok": True},
        "static_inputs_bytes": 10 * M.MIB,
        "allocated_beyond_weights_bytes": 60 * M.MIB,
        "peak_reserved_bytes": 1500 * M.MIB,
        "peak_reserved_beyond_weights_bytes": 1300 * M.MIB,
    }
    res = {
        "preset": "full",
        "git_commit": "abc",
        "stages": {
            "qwen3-tts-12hz/code2wav": {"status": "ok", "measured": m, "meets_1gib": True},
            "voxcpm2/vae_decoder": {"status": "skipped", "reason": "not built within the 200 s build budget"},
        },
    }
    text = M.report_section(res)
    row = next(line for line in text.splitlines() if "code2wav" in line)
    assert "| 27 (default) | 27 | 200 | 700 | 512 | 150 | 900 | 3.50 (2.25) | 2 cases ok |" in row
    assert "vae_decoder` | skipped" in text and "build budget" in text
    assert any("target ≤ 1 GiB: met" in line for line in M.summary_lines(res))


def test_one_warmup_stream_per_device(monkeypatch):
    from ttsaot.runtime import graphs

    made = []

    class FakeStream:
        def __init__(self, device):
            made.append(device)

    monkeypatch.setattr(graphs, "_WARMUP_STREAMS", {})
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    a = graphs.warmup_stream(torch.device("cuda", 0))
    assert graphs.warmup_stream(torch.device("cuda", 0)) is a
    b = graphs.warmup_stream(torch.device("cuda"))  # the current device (1 here)
    assert b is not a and graphs.warmup_stream(torch.device("cuda", 1)) is b
    assert made == [torch.device("cuda", 0), torch.device("cuda", 1)]


@pytest.mark.gpu
def test_warmups_of_several_graphs_reuse_one_set_of_cached_blocks():
    from ttsaot.runtime.graphs import StaticGraph, new_pool

    dev = torch.device("cuda", 0)
    n = 16 * 2**20  # floats: a 64 MiB intermediate per call

    def fn(xs):
        return (xs[0].expand(n) * 2).sum(dim=0, keepdim=True)

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    pool = new_pool()

    def default_pool_reserved():
        return sum(
            s["total_size"] for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", (0, 0))) == (0, 0)
        )

    before = default_pool_reserved()
    graphs = [StaticGraph(fn, [torch.ones(1, device=dev)], dev, pool) for _ in range(6)]
    grown = default_pool_reserved() - before
    # a stream per graph left six 64 MiB warm-up blocks cached; one stream keeps one
    assert grown < 2 * n * 4, grown
    for g in graphs:
        assert float(g.replay()[0]) == 2.0 * n


@pytest.mark.heavy
def test_memory_command_end_to_end_on_cpu(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "bench",
        "memory",
        "qwen3-tts-12hz/code2wav",
        "--device",
        "cpu",
        "--axis",
        "batch=1",
        "--axis",
        "frames=8",
        "--no-verify",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--result",
        str(tmp_path / "memory.json"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((tmp_path / "memory.json").read_text())
    assert res["kind"] == "memory" and res["status"] == "ok" and res["preset"] == "tiny"
    rec = res["stages"]["qwen3-tts-12hz/code2wav"]
    assert rec["status"] == "ok" and rec["axes_override"] == {"batch": [1], "frames": [8]}
    assert rec["build"]["ok"] and rec["measured"]["buckets"] == 1 and rec["measured"]["golden"]["ok"]
    assert "meets_1gib" not in rec  # the target is about the default plan, not an override
    assert "code2wav" in proc.stdout
