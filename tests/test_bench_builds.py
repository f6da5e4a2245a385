"""`python -m bench builds` (build time cold/cached + cold start per stage) and `python -m bench bucket-hits`."""

import json
import re
import subprocess
import sys

import pytest

from bench.bucket_hits import chunk_plan, default_plan, tally
from bench.build_times import cold_caches_env, parse_reuse, progress_lines, summary
from bench.report import write_report
from ttsaot.builder.buckets import BucketPlan


def test_reuse_notes_parse_per_stage():
    log = (
        "code2wav: 3 of 27 packages reused from the package cache\n"
        "noise\ncode_predictor: 3 of 3 packages reused from the package cache\n"
        "fast_ar: 2 of 2 packages reused from the installed artifact\n"
    )
    assert parse_reuse(log) == {
        "code2wav": {"packages": 27, "reused": 3, "compiled": 24},
        "code_predictor": {"packages": 3, "reused": 3, "compiled": 0},
        "fast_ar": {"packages": 2, "reused": 2, "compiled": 0},
    }


def test_a_stopped_builds_record_keeps_its_progress_not_the_warnings():
    log = (
        "[   12.0s] code2wav/b1_f8 compiled (11s)\n  warnings.warn('x')\n[W CudaIPCTypes.cpp:16] Producer\n\n"
        "/usr/lib/python3.12/copyreg.py:99: FutureWarning: `isinstance(treespec, LeafSpec)` is deprecated\n"
        "  return cls.__new__(cls, *args)\ncompile code2wav    0/22 0:03:47\n"
    )
    assert progress_lines(log) == ["[   12.0s] code2wav/b1_f8 compiled (11s)", "compile code2wav    0/22 0:03:47"]


def test_a_build_the_budget_stopped_shows_its_time_and_progress():
    """H100, Fish's full default build (bench/results/nvidia-h100/builds.json): stopped at 541 s, the table says
    how far each stage got instead of a bare "skipped"."""
    cold = {
        "status": "skipped",
        "wall_s": 540.8,
        "reason": "stopped at the end of the budget",
        "log_tail": [
            "[  504.2s] fast_ar/b1 compiled (491s)",
            "compile fast_ar (b1 491s)         ━━━━━━━━━━━━━━━━━━━━━━━━━━╸              2/3   0:08:34",
            "compile dac_decoder (b1_f32 472s) ━━━━━━━━━━                                7/27 0:08:16",
            "compile dac_encoder                                                        0/4   0:06:53",
        ],
    }
    fam = {"cold": cold, "warm": {"status": "skipped", "reason": "no cold build"}}
    res = {"default_build": True, "families": {"fish-s2-pro": fam}}
    assert "| fish-s2-pro | > 541 (stopped) | fast_ar 2/3, dac_decoder 7/27, dac_encoder 0/4 | skipped |" in summary(
        res
    )
    # a caveat added to the result after the run is shown; the run's own legend (the first note) is not
    res["notes"] = ["legend", "some kernels were already in the Inductor cache"]
    text = summary(res)
    assert "Note: some kernels were already in the Inductor cache" in text and "legend" not in text


def test_a_used_up_budget_records_every_section_skipped(tmp_path):
    out = tmp_path / "builds.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "builds",
            "--families",
            "voxcpm2",
            "--device",
            "cpu",
            "--budget",
            "0",
            "--result",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]  # nothing measured: incomplete
    res = json.loads(out.read_text())
    fam = res["families"]["voxcpm2"]
    assert res["kind"] == "builds" and res["status"] == "incomplete" and res["default_build"]
    assert all(fam[p]["status"] == "skipped" for p in ("cold", "warm", "cached"))
    assert "voxcpm2 | skipped" in summary(res)


@pytest.mark.heavy
def test_cold_then_cached_build_and_cold_start(tmp_path):
    """One family, one stage, one bucket: the cold build compiles it, the cached one reuses it, and the stage's
    fresh process gives its first output; the report renders the section."""
    out = tmp_path / "cpu" / "builds.json"
    cmd = [
        sys.executable,
        "-m",
        "bench",
        "builds",
        "--families",
        "qwen3-tts-12hz",
        "--stages",
        "code_predictor",
        "--build-args",
        "--max-batch 1",
        "--device",
        "cpu",
        "--jobs",
        "1",
        "--budget",
        "550",
        "--result",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())
    fam = res["families"]["qwen3-tts-12hz"]
    assert not res["default_build"] and res["jobs"] == 1
    assert (fam["cold"]["compiled"], fam["cold"]["reused"], fam["cold"]["packages"]) == (1, 0, 1)
    assert fam["cold"]["buckets"] == 1
    assert (fam["warm"]["compiled"], fam["warm"]["reused"], fam["warm"]["up_to_date"]) == (0, 1, True)
    assert (fam["cached"]["compiled"], fam["cached"]["reused"], fam["cached"]["up_to_date"]) == (0, 1, False)
    assert fam["warm"]["wall_s"] < fam["cold"]["wall_s"] and fam["cached"]["wall_s"] < fam["cold"]["wall_s"]
    # each build's console output is kept beside the JSON, every line stamped with its time since the start
    cold_log = (out.parent / "build_logs" / fam["cold"]["log"]).read_text().splitlines()
    assert fam["cold"]["log"] == "qwen3-tts-12hz-cold.log" and cold_log
    assert all(re.match(r"\[ *\d+\.\d s\] ", ln) for ln in cold_log)
    assert any("1 compiled" in ln or "packages reused" in ln for ln in cold_log), cold_log
    cs = fam["cold_start"]["code_predictor"]
    assert cs["status"] == "ok" and 0 < cs["startup_s"] < cs["first_output_s"] and cs["buckets_loaded"] == 1
    # the load's phases (runtime load_stats): they add up to no more than the load the child timed
    ls = cs["load_stats"]
    phases = [ls[k] for k in ("validate_s", "weights_s", "package_load_s", "warmup_capture_s")]
    assert all(p >= 0 for p in phases) and sum(phases) <= cs["load_s"] + 0.01
    report = write_report(tmp_path, tmp_path / "BENCHMARKS.md", include_cpu=True).read_text()
    assert "Build time and cold start" in report and "qwen3-tts-12hz/code_predictor" in report
    row = next(ln for ln in report.splitlines() if ln.startswith("| qwen3-tts-12hz/code_predictor |"))
    assert f"{cs['load_s']:.2f} ({ls['validate_s']:.2f} / {ls['weights_s']:.2f} /" in row


def test_cold_builds_get_the_empty_inductor_cache_the_builder_uses(tmp_path, monkeypatch):
    from ttsaot.builder.build import _use_private_inductor_cache

    for key, value in cold_caches_env({}, tmp_path).items():
        monkeypatch.setenv(key, value)
    assert _use_private_inductor_cache().is_relative_to(tmp_path)


def test_stream_chunks_produce_exactly_the_plans_streaming_windows():
    """The bucket-hits workload streams as the plan assumes: its windows (new frames + left context) are the
    streaming windows the default plan compiles, plus, where the left context is longer than a chunk (VoxCPM2: 24
    frames, chunks of 12), the warm-up windows while the history fills (12 → 24 → 36), which the plan does not
    list (24 pads to 32)."""
    from ttsaot.builder.buckets import StreamingConfig

    for family, stage in (("qwen3-tts-12hz", "code2wav"), ("fish-s2-pro", "dac_decoder"), ("voxcpm2", "vae_decoder")):
        _, meta = default_plan(family, stage, "tiny")
        st = meta["streaming"]
        windows, history = set(), 0
        for n in chunk_plan(10 * st["chunk_frames"], st):  # whole chunks: no tail
            windows.add(history + n)
            history = min(st["left_context_frames"], history + n)
        steady = StreamingConfig(**{**st, "nonstreaming_chunk_frames": 0}).window_sizes()
        c, ctx = st["chunk_frames"], st["left_context_frames"]
        warm_up = set(range(2 * c, c + ctx, c))
        assert windows == set(steady) | warm_up, (family, windows, steady)
        assert bool(warm_up) == (family == "voxcpm2")
    assert chunk_plan(7, {"chunk_frames": 25, "first_chunk_frames": 4}) == [4, 3]


def test_tally_uses_the_runtimes_smallest_covering_bucket():
    plan = [{"batch": b, "frames": f} for b in (1, 2, 4) for f in (8, 25, 50)]
    t = tally([{"batch": 1, "frames": 25}, {"batch": 3, "frames": 26}, {"batch": 2, "frames": 8}], plan)
    assert t["buckets"]["b1_f25"] == {"calls": 1, "work": 25, "useful": 25, "padding": 0.0}
    assert t["buckets"]["b4_f50"]["calls"] == 1 and t["buckets"]["b4_f50"]["padding"] == round(1 - 78 / 200, 3)
    assert t["buckets_hit"] == 3 and t["packages"] == 9
    assert t["padding"] == round(1 - (25 + 78 + 16) / (25 + 200 + 16), 3)


def test_tally_splits_a_batch_the_capped_plan_does_not_cover_like_the_runtime():
    plan = BucketPlan({"batch": (1, 2, 4), "frames": (25, 50)}, max_batch_frames=100).buckets()  # no b4_f50
    t = tally([{"batch": 4, "frames": 40}, {"batch": 3, "frames": 50}, {"batch": 4, "frames": 25}], plan)
    assert t["buckets"]["b2_f50"]["calls"] == 3  # 4 rows → 2 + 2; 3 rows → 2 + 1 (b1_f50)
    assert t["buckets"]["b1_f50"]["calls"] == 1 and t["buckets"]["b4_f25"]["calls"] == 1
    assert t["packages"] == 5 and "b4_f50" not in t["buckets"]


@pytest.mark.heavy
def test_streams_through_the_batcher_ask_for_the_windows_of_the_stream(tmp_path):
    """The real path: a one-package tiny vae_decoder, two streams through the runtime's Batcher at a time; every
    package call asks for the window the stream is at (12, 24, 36, then 24 + tail), two rows while both run."""
    import random

    from bench.bucket_hits import Recorder, build_one_package, drive_streams
    from ttsaot.runtime import load

    plan, meta = default_plan("voxcpm2", "vae_decoder", "tiny")
    art = build_one_package("voxcpm2", "vae_decoder", plan, tmp_path)
    stage = load(str(art), device="cpu", stages=["vae_decoder"])["vae_decoder"]
    rec = Recorder(stage)
    drive_streams(stage, [44, 20], 2, meta["streaming"], random.Random(0))
    # 44 = 12 + 12 + 12 + 8 and 20 = 12 + 8, in lock-step: round 2 merges windows 24 (stream 1) and 20 (stream 2)
    assert rec.calls == [
        {"batch": 2, "frames": 12},
        {"batch": 2, "frames": 24},
        {"batch": 1, "frames": 36},
        {"batch": 1, "frames": 32},
    ]
    assert tally(rec.calls, plan)["buckets"]["b2_f32"]["calls"] == 1  # the 24-frame window pads to 32


_COLDSTART_IMPORTS = """
import runpy, sys
sys.argv = ["bench", "_coldstart", "--help"]
try:
    runpy.run_module("bench", run_name="__main__")
except SystemExit:
    pass
print(sorted(m for m in sys.modules if m.startswith(("ttsaot.builder", "triton"))))
"""


def test_the_cold_start_child_imports_neither_the_builder_nor_triton():
    """Its start-up is counted before the stage's first output: it may import torch and the runtime, as a serving
    process does, not the builder that the bench's family tables pull in."""
    proc = subprocess.run([sys.executable, "-c", _COLDSTART_IMPORTS], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_the_report_renders_every_builds_file_of_a_device(tmp_path):
    """Each `bench builds` run writes its own file (a device call fits one family's full build): the report shows
    them all, not the last one read."""
    dev = tmp_path / "results" / "nvidia-h200"
    dev.mkdir(parents=True)
    for fam, name in (("fish-s2-pro", "builds.json"), ("qwen3-tts-12hz", "builds_qwen3-tts-12hz.json")):
        cold = {"status": "ok", "wall_s": 100.0, "packages": 2, "reused": 0, "compiled": 2}
        res = {
            "kind": "builds",
            "device": {"type": "cuda", "name": "NVIDIA H200"},
            "default_build": True,
            "git_commit": "abc",
            "families": {fam: {"cold": cold}},
        }
        (dev / name).write_text(json.dumps(res))
    report = write_report(tmp_path / "results", tmp_path / "BENCHMARKS.md", include_cpu=False).read_text()
    assert "| fish-s2-pro | 100" in report and "| qwen3-tts-12hz | 100" in report
