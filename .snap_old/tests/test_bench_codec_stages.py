"""The CPU side of `python -m bench codec-stages`: registration, task selection, the error criteria, and one end to
end run on the tiny preset (a kernels=ttsaot build, loaded by the runtime, checked against exact fp32)."""

import argparse
import json
import math

import pytest
import torch

from bench import codec_stages as C
from bench.__main__ import commands


def test_command_is_registered():
    assert "codec-stages" in commands()


def test_tasks_run_in_priority_order_and_unknown_ones_are_refused():
    tasks = C.make_tasks(["dac_encoder", "dac_decoder:tf32", "code2wav"], (1, 4), (50,), (4, 29), 10.0)
    assert [t.name for t in tasks] == ["code2wav", "dac_encoder", "dac_decoder:tf32"]
    c2w, enc, dec = tasks
    assert c2w.options == {"batch_buckets": (1, 4), "frame_buckets": (50,), "dtype": None}
    assert c2w.precision == "bf16" and c2w.criterion == {"snr_db_min": 35.0}
    assert enc.options == {"encoder_seconds": (10.0,)} and enc.criterion == {"code_match_min": 1.0}
    assert dec.options["dac_decoder_precision"] == "tf32" and dec.criterion == {"rel_error_max": 1e-3}
    assert dec.options["frame_buckets"] == (4, 29)
    assert C.make_tasks(["code2wav:fp32"], (1,), (8,), (8,), 1.0)[0].options["dtype"] == torch.float32
    with pytest.raises(ValueError, match="unknown codec-stages task 'vae'"):
        C.make_tasks(["vae"], (1,), (8,), (8,), 1.0)


def test_compare_applies_the_criteria():
    ref = torch.ones(1, 1, 1000)
    r = C.compare(ref + 1e-2, ref, {"snr_db_min": 35.0})  # rel 1e-2: 40 dB
    assert math.isclose(r["snr_db"], 40.0, abs_tol=0.01) and r["meets"]
    assert not C.compare(ref + 1e-3, ref, {"rel_error_max": 1e-4})["meets"]
    codes = torch.arange(10).view(1, 10, 1)
    r = C.compare(codes.clone(), codes, {"code_match_min": 1.0})
    assert r["code_match"] == 1.0 and r["codes_differing"] == 0 and r["meets"]
    moved = codes.clone()
    moved[0, 3] = 0
    r = C.compare(moved, codes, {"code_match_min": 1.0})
    assert r["codes_differing"] == 1 and not r["meets"]


@pytest.mark.slow
@pytest.mark.heavy
def test_cpu_smoke_run_end_to_end(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    C.add_parser(parser.add_subparsers(dest="cmd"))
    a = parser.parse_args(
        [
            "codec-stages",
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--stages",
            "code2wav:fp32",
            "--batches",
            "1",
            "--code2wav-frames",
            "8,16",
            "--variants",
            "eager",
            "--reps",
            "2",
            "--budget",
            "1500",
            "--out",
            str(tmp_path),
        ]
    )  # a loaded 2-core CI box: minutes
    assert C.main(a) == 0
    res = json.loads((tmp_path / "codec_stages.json").read_text())
    (task,) = res["tasks"]
    assert task["status"] == "ok" and task["builds"]["ttsaot"]["manifest_kernels"] == "ttsaot"
    assert sorted(task["buckets"]) == ["b1_f16", "b1_f8"]
    row = task["buckets"]["b1_f8"]
    assert row["ttsaot"]["meets"] and row["ttsaot"]["rel_error"] < 1e-4 and row["ttsaot"]["call_ms"] > 0
    assert row["eager"]["meets"] and row["eager"]["ms"] > 0
    # the faithful module as users run it, next to the artifact (CPU: exact fp32, so it meets fp32's criterion)
    assert row["eager_default"]["meets"] and row["eager_default"]["ms"] > 0
    assert row["ttsaot_speedup_vs_eager_default"] > 0
    assert "code2wav:fp32/b1_f8" in capsys.readouterr().out


def test_a_step_out_of_budget_is_recorded_skipped_not_failed(tmp_path, monkeypatch):
    def slow_build(*args, **kwargs):
        raise RuntimeError("code2wav/b1_f8: AOTInductor compile failed: InductorError: BudgetExceeded: out of time")

    monkeypatch.setattr(C, "_build", slow_build)
    parser = argparse.ArgumentParser()
    C.add_parser(parser.add_subparsers(dest="cmd"))
    a = parser.parse_args(
        ["codec-stages", "--device", "cpu", "--stages", "code2wav,dac_encoder", "--out", str(tmp_path)]
    )
    assert C.main(a) == 0
    res = json.loads((tmp_path / "codec_stages.json").read_text())
    assert [(t["task"], t["status"]) for t in res["tasks"]] == [("code2wav", "skipped"), ("dac_encoder", "skipped")]
