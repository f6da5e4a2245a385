"""CPU smoke test of the benchmark harness (bench/): one tiny stage end to end through `python -m bench run`
(own process per stage, artifact build, timings, floor, parity, streaming, throughput, cold start, snake) and
`python -m bench report`. The numbers are not publishable; the test checks the JSON's fields and sanity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# End-to-end bench runs over built artifacts: `make test-all` (CI's 2 cores cannot fit them with the rest).
pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[1]


def _bench(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "results"
    proc = _bench(
        "run",
        "--device",
        "cpu",
        "--preset",
        "tiny",
        "--family",
        "qwen3-tts-12hz",
        "--stages",
        "code2wav",
        "--variants",
        "eager_raw,eager,ttsaot_nograph,ttsaot_inductor,compile_ro",
        "--quick",
        "--throughput-batches",
        "1,2",
        "--stream-seconds",
        "0.1",
        "--snake-cpu",
        "--out",
        str(out),
        "--cache-dir",
        str(tmp / "cache"),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, out, proc.stdout


def test_stage_json_fields_and_sanity(smoke_run):
    _, out, stdout = smoke_run
    (path,) = list(out.glob("cpu-*/qwen3-tts-12hz__code2wav.json"))
    r = json.loads(path.read_text())
    assert r["status"] == "ok" and r["schema"] == 1
    assert r["device"]["type"] == "cpu" and r["device"]["torch"] and "git_commit" in r
    assert r["stage"]["kind"] == "codec_decoder" and r["stage"]["dtype"] == "float32"
    assert r["hardware"]["copy"]["gb_per_s"] > 0 and r["hardware"]["matmul"]["tflop_per_s"] > 0
    (bucket,) = r["buckets"]
    key = bucket["key"]
    assert key == "b1_f16"
    floor = r["floor"][key]
    assert floor["flops"] > 1e5 and floor["weight_bytes"] > 0 and floor["io_bytes"] > 0 and floor["ms"] > 0
    # weights counted in the compute dtype after the passes; the faithful module is at least as large
    p = r["params"]
    assert p["after_passes_fp32"]["params"] <= p["faithful_fp32"]["params"]
    assert r["build"]["cached"] is False and r["build"]["seconds"] > 0
    for name in ("eager_raw", "eager", "ttsaot_nograph"):
        v = r["variants"][name]
        assert v["status"] == "ok", (name, v)
        b = v["buckets"][key]
        assert 0 < b["min_ms"] <= b["ms"] <= b["p90_ms"] and b["reps"] == 10 and b["timer"] == "perf_counter"
        # fp32 on CPU: same math as the reference up to kernel order, well inside the stage tolerance
        assert b["rel_err_vs_fp32"] <= r["stage"]["tolerance"], (name, b["rel_err_vs_fp32"])
        assert b["x_floor"] > 1.0  # nothing beats the hardware floor
    assert r["variants"]["compile_ro"]["status"] == "skipped"
    assert "CUDA" in r["variants"]["compile_ro"]["reason"]
    # kernels=inductor is what auto resolves to on CPU: one artifact, the second "build" a cache hit
    ind = r["variants"]["ttsaot_inductor"]
    assert ind["status"] == "ok" and ind["kernels"] == "inductor" == r["variants"]["ttsaot_nograph"]["kernels"]
    assert ind["buckets"][key]["rel_err_vs_fp32"] <= r["stage"]["tolerance"]
    assert r["build_inductor"]["cache_key"] == r["build"]["cache_key"] and r["build_inductor"]["cached"] is True
    for name in ("eager", "ttsaot_nograph"):
        s = r["variants"][name]["streaming"]
        assert s["chunks"] >= 2 and 0 < s["ttfa_ms"] <= s["total_ms"] and s["rtf"] > 0
        assert abs(s["utterance_s"] - 0.1) < 0.01
        rows = r["variants"][name]["throughput"]
        assert [row["batch"] for row in rows] == [1, 2]
        assert all(row["items_per_s"] > 0 and row["audio_s_per_s"] > 0 for row in rows)
    assert "bucket" in r["variants"]["ttsaot_nograph"]["throughput"][1]  # B=2 > largest bucket: split
    cs = r["cold_start"]["ttsaot"]
    assert cs["status"] == "ok", cs
    assert 0 < cs["load_s"] < cs["first_output_s"] and cs["buckets_loaded"] == 1 and cs["startup_s"] > 0
    assert "qwen3-tts-12hz/code2wav" in stdout and "bench summary" in stdout


def test_snake_json(smoke_run):
    _, out, _ = smoke_run
    (path,) = list(out.glob("cpu-*/snake_kernel.json"))
    r = json.loads(path.read_text())
    assert r["kind"] == "snake_kernel" and set(r["cases"]) == {"float32", "bfloat16"}
    for case in r["cases"].values():
        assert case["copy"]["gb_per_s"] > 0 and case["eager"]["gb_per_s"] > 0
        assert case["kernel"]["status"].startswith("unavailable")  # the Triton kernel needs CUDA


def test_report_ignores_cpu_unless_asked(smoke_run):
    from bench.report import write_report

    tmp, out, _ = smoke_run
    md = tmp / "B.md"
    write_report(out, md, tmp / "plots", include_cpu=False)
    text = md.read_text()
    assert "No GPU results yet" in text and "How to read these numbers" in text
    write_report(out, md, tmp / "plots", include_cpu=True)
    text = md.read_text()
    assert "qwen3-tts-12hz / code2wav" in text and "not publishable" in text
    assert "ttsaot_inductor" in text
    assert "| `b1_f16` |" in text and "Cold start" in text and "Streaming" in text and "SnakeBeta" in text


def test_chunk_schedule_and_time_box():
    from bench.common import BudgetExceeded, time_box
    from bench.stage import chunk_schedule

    assert chunk_schedule(125, 25, 0) == [25] * 5
    assert chunk_schedule(60, 25, 4) == [4] * 6 + [1, 25, 10]  # first chunks until 25 frames, then 25
    assert sum(chunk_schedule(7, 25, 4)) == 7
    t0 = time.time()
    with pytest.raises(BudgetExceeded):
        with time_box(0.3, "spin"):
            while True:
                pass
    assert time.time() - t0 < 5


def test_artifact_cache_key_follows_the_build_options():
    import torch

    from bench.artifacts import artifact_key
    from bench.specs import make_spec

    cpu = torch.device("cpu")
    a, da = make_spec("qwen3-tts-12hz", "code2wav", "tiny", dtype="fp32")
    b, db = make_spec("qwen3-tts-12hz", "code2wav", "tiny", dtype="fp32")
    c, dc = make_spec("qwen3-tts-12hz", "code2wav", "tiny", dtype="fp32", axes={"frames": (8,)})
    d, dd = make_spec("qwen3-tts-12hz", "code2wav", "tiny", dtype="bf16")
    assert dict(c.plan.axes) == {"batch": (1,), "frames": (8,)}
    assert artifact_key(a, da, cpu) == artifact_key(b, db, cpu)
    assert len({artifact_key(a, da, cpu), artifact_key(c, dc, cpu), artifact_key(d, dd, cpu)}) == 3
    # the kernel choice is keyed as resolved: on CPU auto is inductor (one artifact), ttsaot another
    keys = {
        k: artifact_key(*make_spec("qwen3-tts-12hz", "code2wav", "tiny", dtype="fp32", kernels=k), cpu)
        for k in ("auto", "inductor", "ttsaot")
    }
    assert keys["auto"] == keys["inductor"] == artifact_key(a, da, cpu) != keys["ttsaot"]


def test_a_stage_over_its_timeout_is_killed_and_recorded(tmp_path):
    out = tmp_path / "results"
    proc = _bench(
        "run",
        "--device",
        "cpu",
        "--family",
        "qwen3-tts-12hz",
        "--stages",
        "code2wav",
        "--variants",
        "eager",
        "--stage-timeout",
        "4",
        "--record-failures",
        "--out",
        str(out),
        "--cache-dir",
        str(tmp_path / "cache"),
        timeout=120,
    )
    assert proc.returncode == 1
    assert "killed after the 4 s stage timeout" in proc.stdout
    (path,) = list(out.glob("cpu-*/qwen3-tts-12hz__code2wav.json"))
    r = json.loads(path.read_text())
    assert r["status"] in ("failed", "incomplete") and "killed after" in r["reason"]
    assert r["stage"]["family"] == "qwen3-tts-12hz" and r["device"]["type"] == "cpu"
