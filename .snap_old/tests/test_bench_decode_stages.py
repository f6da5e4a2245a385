"""`python -m bench decode-stages` end to end on CPU (tiny preset, one batch bucket, no torch.compile): both builds,
the runtime check of ttsaot vs inductor vs eager (outputs and the step's cache slot) and the timings are recorded.
The GPU run itself is not a test (bench/decode_stages.py)."""

from __future__ import annotations

import json

import pytest

from bench.__main__ import main as bench_main


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("stage,layers,pdl_ab", [("base_lm_step", 3, False), ("residual_lm_step", 2, True)])
def test_decode_stages_smoke_on_cpu(tmp_path, stage, layers, pdl_ab):
    out = tmp_path / "r.json"
    rc = bench_main(
        [
            "decode-stages",
            "--stage",
            stage,
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--batches",
            "2",
            "--no-compile",
            "--reps",
            "2",
            "--result",
            str(out),
            "--work",
            str(tmp_path),
        ]
        + (["--pdl-ab"] if pdl_ab else [])
    )
    res = json.loads(out.read_text())
    assert rc == 0 and res["status"] == "ok", res
    want = {"ttsaot": "ttsaot", "inductor": "inductor"} | ({"ttsaot_nopdl": "ttsaot"} if pdl_ab else {})
    assert res["kernels_recorded"] == want
    assert res["stage"] == f"voxcpm2/{stage}"
    assert res["config"]["layers"] == layers and res["config"]["position"] == res["config"]["max_len"] - 1
    case = res["sections"]["B=2"]
    check = case["check"]
    assert check["agree"] and check["ttsaot_wrote_slot_in_place"] and check["inductor_wrote_slot_in_place"]
    assert check["hidden_ttsaot_vs_inductor"] < 5e-2 and check["k_slot_ttsaot_vs_inductor"] < 5e-2
    assert case["floor_ms"] > 0 and case["ttsaot"]["step_ms"] > 0 and case["inductor"]["step_ms"] > 0
    assert case["eager"]["ms"] > 0 and case["ttsaot_speedup_vs_inductor"] > 0
    assert res["sections"]["build_ttsaot"]["seconds"] > 0
    if pdl_ab:  # the same kernels without the launch attribute (a no-op off Hopper): the same outputs
        assert check["hidden_ttsaot_vs_ttsaot_nopdl"] == 0 and case["pdl_speedup"] > 0
