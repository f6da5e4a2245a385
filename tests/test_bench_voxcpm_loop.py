"""`python -m bench voxcpm-loop` (bench/families/voxcpm2_loop.py) on CPU with the tiny preset: the command's core
(build → ttsaot decode loop timings → VAE → first step in a fresh process → the upstream `voxcpm` loop with the
same weights, parity), its JSON, its BENCHMARKS.md section, and the budget / failure paths that the one GPU run
relies on. CPU numbers are not publishable: the test checks the fields, the parity and the recorded reasons.

Kept short for a 2-core machine: fp32, B=1 and 2 in one batch bucket of 2 (B=1 is padded into it), a 2-step CFM
(one estimator call), quick repetitions, one thread (OpenMP oversubscribed by other jobs is 100× slower). The five
tiny artifacts (~60 s of AOTI compiles on an idle 2-core machine) are cached across runs under the test artifact
folder, keyed like `bench run`'s cache (options, torch, builder + runtime sources), so stale ones are never used."""

from __future__ import annotations

import json

import pytest
import torch

from bench.common import BudgetExceeded, Skipped
from bench.families.voxcpm2_loop import RESULT_NAME, LoopRun, LoopSettings, _spawn_child, failure

from .conftest import CACHE

# End-to-end bench runs over built artifacts: `make test-all` (CI's 2 cores cannot fit them with the rest).
pytestmark = pytest.mark.heavy


def _upstream_missing(res: dict) -> str | None:
    """Why upstream could not be imported, if it is simply not installed (a broken install must fail)."""
    eager = res["upstream"]["eager"]
    reason = eager.get("reason", "")
    missing = "is not installed" in reason or any(f"No module named '{m}'" in reason for m in ("pydantic", "einops"))
    return reason if eager["status"] == "skipped" and missing else None


@pytest.fixture(scope="module")
def loop_run(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("voxcpm-loop")
    s = LoopSettings(
        device="cpu",
        preset="tiny",
        dtype="fp32",
        batches=(1, 2),
        buckets=(2,),
        timesteps=2,
        quick=True,
        parity_steps=4,
        stream_steps=6,
        cache_dir=str(CACHE / "bench-voxcpm-loop"),
        out=str(tmp / "results"),
    )
    try:
        run = LoopRun(s)
        res = run.run()
    finally:
        torch.set_num_threads(threads)
    return run, res, tmp


def test_json_written_with_ttsaot_step_figures(loop_run):
    run, res, tmp = loop_run
    path = tmp / "results" / res["device"]["slug"] / RESULT_NAME
    assert run.path == path and path.is_file()
    saved = json.loads(path.read_text())
    assert saved["status"] == "ok" and saved["kind"] == "decode_loop"
    assert saved["stage"]["family"] == "voxcpm2" and saved["stage"]["n_timesteps"] == 2
    assert all(saved["build"]["stages"][n]["path"] for n in ("base_lm_step", "locdit", "vae_decoder"))
    assert saved["audio"]["audio_ms_per_step"] == pytest.approx(4 * 192 / 48000 * 1e3)  # tiny VAE: 192 spf
    steps = saved["ttsaot"]["steps"]
    assert steps["status"] == "ok", steps
    for b in ("1", "2"):
        cell = steps["batches"][b]
        assert cell["step_ms"] > 0 and cell["bucket"] == 2
        assert cell["rtf"] == pytest.approx(cell["step_ms"] / saved["audio"]["audio_ms_per_step"])
        assert set(cell["components_ms"]) >= {"locdit", "local_encoder", "base_lm_step", "residual_lm_step"}
        assert cell["stream"]["steps"] == 6 and cell["stream"]["samples"] == 6 * 4 * 192 * int(b)
    vae = saved["ttsaot"]["vae"]
    assert vae["status"] == "ok" and vae["ms"] > 0 and vae["new_frames"] == 12 and vae["window_frames"] == 36
    first = saved["first_step"]["ttsaot"]
    assert first["status"] == "ok", first
    assert first["first_step_s"] > first["startup_s"] > 0
    assert saved["summary"]["batches"]["1"]["ttsaot_ms"] == steps["batches"]["1"]["step_ms"]
    assert saved["summary"]["step_ms_b1_target_met"] in (True, False)


def test_upstream_loop_matches_the_ttsaot_loop(loop_run):
    _, res, _ = loop_run
    if _upstream_missing(res):
        pytest.skip(_upstream_missing(res))
    eager = res["upstream"]["eager"]
    assert eager["status"] == "ok", eager
    for b in ("1", "2"):
        assert eager["batches"][b]["step_ms"] > 0
        p = res["parity"]["batches"][b]
        assert p["steps"] == 4 and len(p["patch_rel_err"]) == 4, p
        assert p["max_rel_err"] <= 1e-3, p
        assert p["control_rel_err_other_noise"] > 0.1, p  # other noise: far off, so the match means something
    # CPU: optimize() cannot run; recorded with its reason, not dropped
    assert res["upstream"]["optimize"]["status"] == "skipped"
    assert "CUDA" in res["upstream"]["optimize"]["reason"]
    assert res["first_step"]["upstream_optimize"]["status"] == "skipped"


def test_upstream_first_step_process_detects_the_eager_fallback(loop_run):
    """The GPU's upstream first-step process, run on CPU: imports, builds the model from the config dict, calls
    optimize(), which stays eager off CUDA: that must come back as a recorded skip, not as a timing."""
    _, res, _ = loop_run
    if _upstream_missing(res):
        pytest.skip(_upstream_missing(res))
    from bench.families.voxcpm2_loop import upstream_config

    s = LoopSettings(device="cpu", preset="tiny")
    cfg = {
        "device": "cpu",
        "dtype": "float32",
        "batch": 1,
        "context": 8,
        "seed": 0,
        "timesteps": 2,
        "cfg_value": 2.0,
        "config": upstream_config(s, torch.float32),
    }
    r = _spawn_child(["upstream", json.dumps(cfg)], timeout=120)
    assert r["status"] == "skipped" and "fell back to eager" in r["reason"], r


def test_report_renders_the_decode_loop_section(loop_run):
    from bench.report import write_report

    _, res, tmp = loop_run
    out = write_report(tmp / "results", tmp / "BENCHMARKS.md", tmp / "plots", include_cpu=True)
    text = out.read_text()
    assert "### VoxCPM2 decode loop" in text
    assert "### voxcpm2 / decode_loop" not in text  # not also rendered as a per-stage section
    table = text.split("Per decode step, ms (RTF):", 1)[1]
    b1 = next(ln for ln in table.splitlines() if ln.startswith("| 1 |"))
    from bench.report import _fmt_ms

    assert _fmt_ms(res["ttsaot"]["steps"]["batches"]["1"]["step_ms"]) in b1
    assert "First step after process start" in text and "Targets (NVIDIA H200" in text
    if not _upstream_missing(res):
        assert "Parity, upstream loop vs ttsaot loop" in text
    assert "`upstream/optimize` skipped" in text


def test_merge_keeps_the_phases_a_second_call_does_not_redo(loop_run, tmp_path):
    """The GPU run may be split over two calls (artifact builds take most of one): the second call measures
    upstream only and merges into the first call's file."""
    run, res, _ = loop_run
    path = tmp_path / RESULT_NAME
    path.write_text(run.path.read_text())
    s = LoopSettings(
        device="cpu",
        preset="tiny",
        dtype="fp32",
        batches=(1,),
        timesteps=2,
        quick=True,
        phases=("upstream_optimize",),
        merge=True,
        result=str(path),
    )
    merged = LoopRun(s).run()
    assert merged["ttsaot"]["steps"]["batches"]["1"]["step_ms"] == res["ttsaot"]["steps"]["batches"]["1"]["step_ms"]
    assert merged["stage"]["n_timesteps"] == 2 and merged["upstream"]["optimize"]["status"] == "skipped"
    assert merged["summary"]["batches"]["1"]["ttsaot_ms"] == res["summary"]["batches"]["1"]["ttsaot_ms"]
    assert any("merged into a result started" in n for n in merged["notes"])


def test_budgets_and_failures_become_recorded_reasons(tmp_path):
    """What a GPU run needs: a phase over the global budget is skipped, a crashing phase is recorded as failed,
    a first-step process over its budget is killed and recorded as a timeout; nothing raises."""
    s = LoopSettings(device="cpu", budget=0.0, result=str(tmp_path / "r.json"))
    run = LoopRun(s)
    run.phase("never", lambda: {"x": 1}, None)
    assert run.res["never"]["status"] == "skipped" and "budget" in run.res["never"]["reason"]

    run.s.budget = None

    def boom():
        raise RuntimeError("kernel exploded")

    run.phase("boom", boom, None, "upstream")
    assert run.res["upstream"]["boom"] == {
        "status": "failed",
        "reason": "RuntimeError: kernel exploded",
        "seconds": run.res["upstream"]["boom"]["seconds"],
    }
    assert json.loads((tmp_path / "r.json").read_text())["upstream"]["boom"]["status"] == "failed"
    # a time box firing at one batch keeps the batches measured before it and skips the ones after it
    run.s.batches, run.s.buckets = (1, 2, 4), (4,)

    def one(b):
        if b == 2:
            raise BudgetExceeded("optimize exceeded its 9 s budget")
        return {"step_ms": float(b)}

    rec = {"batches": {}}
    run._per_batch(rec, one, "upstream", "optimize_partial")
    assert rec["batches"]["1"] == {"step_ms": 1.0}
    assert rec["batches"]["2"]["status"] == "timeout" and rec["batches"]["4"]["status"] == "skipped"
    assert "optimize_partial" not in run.res["upstream"]
    assert failure(RuntimeError("compile: optimize exceeded its 9 s budget"))["status"] == "timeout"  # wrapped
    assert failure(Skipped("unavailable: x"))["status"] == "skipped"

    cfg = {"device": "cpu", "artifacts": {}, "batch": 1, "context": 8, "seed": 0}
    r = _spawn_child(["ttsaot", json.dumps(cfg)], timeout=0.2)
    assert r["status"] == "timeout" and "0 s budget" in r["reason"]
    r = _spawn_child(["ttsaot", json.dumps(cfg)], timeout=120)  # no artifacts: fails inside, reason recorded
    assert r["status"] == "failed" and "KeyError" in r["reason"]


def test_cli_is_registered_and_parses(capsys):
    import argparse

    from bench.__main__ import main
    from bench.families.voxcpm2_loop import add_parser, settings_from_args

    with pytest.raises(SystemExit) as e:
        main(["voxcpm-loop", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--upstream-coldstart-budget" in out and "--phases" in out
    sub = argparse.ArgumentParser().add_subparsers(dest="cmd")
    add_parser(sub)
    a = sub.choices["voxcpm-loop"].parse_args(["--device", "cpu", "--phases", "build,ttsaot", "--budget", "500"])
    s = settings_from_args(a)
    assert (s.preset, s.dtype, s.batches, s.buckets, s.max_len, s.context) == ("tiny", "fp32", (1, 2), (1, 2), 512, 128)
    assert s.phases == ("build", "ttsaot") and s.budget == 500
    with pytest.raises(ValueError, match="unknown phase"):
        settings_from_args(sub.choices["voxcpm-loop"].parse_args(["--device", "cpu", "--phases", "bogus"]))


def test_section_takes_the_speed_up_from_the_timed_loop_and_names_a_merged_upstream():
    """A loop re-timed without its upstream (`bench run --merge` keeps the earlier run's, marked merged_from): the
    speed-up is the earlier upstream over this run's timed step, the section says where the upstream came from, and
    the stages' own result files do not stand in for a batch whose loop was timed."""
    from bench.families.voxcpm2_report import decode_loop_section

    res = {
        "status": "ok",
        "stage": {"batches": [1], "preset": "full"},
        "audio": {"ms_per_step": 160.0},
        "ttsaot": {"steps": {"batches": {"1": {"step_ms": 5.0}}}},
        "upstream": {
            "optimize": {"batches": {"1": {"step_ms": 10.0}}},
            "merged_from": {"started": "2026-11-21T11:19:21", "git_commit": "430b32f48167abc"},
        },
        "summary": {"batches": {"1": {"ttsaot_ms": 5.0}}},
    }
    stage = {"stage": {"stage": "locdit"}, "variants": {"ttsaot_graph": {"buckets": {"b1": {"ms": 9.0}}}}}
    text = decode_loop_section(res, [stage])
    row = next(ln for ln in text.splitlines() if ln.startswith("| 1 |"))
    assert row.endswith("| 2.0× |") and "Σ" not in text
    assert "come from the run of 2026-11-21T11:19:21 (commit `430b32f48167`" in text
