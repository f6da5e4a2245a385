"""`python -m bench kernels` end to end on CPU (Triton's interpreter, shrunk shape tables): every section's code
path runs and records figures and checks, so the GPU run spends its time measuring. The GPU run itself is not a
test (bench/kernels.py)."""

from __future__ import annotations

import json

import pytest
import torch

from bench import kernels as kb
from bench.report import write_report

from .kernel_fixtures import ON_GPU, require_kernel_runtime


@pytest.mark.skipif(ON_GPU, reason="the GPU runs the real bench")
def test_kernels_bench_smoke_on_cpu(monkeypatch, tmp_path):
    require_kernel_runtime()
    monkeypatch.setattr(
        kb,
        "SKINNY_SHAPES",
        {
            "voxcpm2_qkv": (40, 48, {"norm": True}, (1, 3)),
            "voxcpm2_gate_up": (64, 32, {"norm": True, "gated": True}, (2, 20)),
            "voxcpm2_down": (24, 96, {"residual": True}, (5,)),
        },
    )
    monkeypatch.setattr(kb, "PREDICTOR_SHAPES", {"fish_fast_ar_down": (24, 40, {"residual": True}, (33,))})
    monkeypatch.setattr(kb, "ATTENTION", {"hq": 4, "hkv": 2, "hd": 16, "cache_positions": 40, "contexts": (7, 30)})
    monkeypatch.setattr(kb, "LAYER", {"preset": "tiny", "cache_positions": 40, "context": 9, "layers": 2})
    monkeypatch.setattr(kb, "SAMPLER_CASES", ((50, 3),))
    seen = []
    res = kb.run_kernels(
        torch.device("cpu"),
        quick=True,
        budget_s=600,
        sections=("copy", "skinny", "attention", "layer", "predictors", "sampler"),
        progress=lambda r: seen.append(1),
    )
    assert res["status"] == "ok" and seen
    sec = res["sections"]
    assert sec["copy"]["gb_per_s"] > 0
    skinny = sec["skinny"]
    assert set(skinny) == {
        "voxcpm2_qkv/M=1",
        "voxcpm2_qkv/M=3",
        "voxcpm2_gate_up/M=2",
        "voxcpm2_gate_up/M=20",
        "voxcpm2_down/M=5",
    }, skinny
    assert set(sec["predictors"]) == {"fish_fast_ar_down/M=33"}
    for key, case in {**skinny, **sec["predictors"]}.items():
        assert "error" not in case, (key, case)
        assert case["rel_err_vs_reference"] < 5e-2 and case["kernel"]["graph_ms"] > 0
        assert case["torch_eager_graph"]["ms"] > 0 and case["plan"]["split_k"] >= 1
    for key, case in sec["attention"].items():
        assert "error" not in case, (key, case)
        assert case["rel_err_vs_reference"] < 3e-2 and case["k_cache_rel_err_vs_reference"] < 1e-2
        assert case["workspace_zero_after"] and case["workspace_zero_after_timing"]
    for key, case in sec["layer"].items():
        assert "error" not in case, (key, case)
        assert case["check"]["rel_err_out_vs_eager"] < 5e-2, case["check"]
        assert case["kernels_graph"]["ms_per_layer"] > 0 and case["floor_ms_per_layer"] > 0
    (case,) = sec["sampler"].values()
    assert "error" not in case, case
    assert case["tokens_differing"] == 0 and case["draws_compared"] == 6 and case["kernel"]["graph_ms"] > 0
    text = kb.summary(res)
    assert "skinny voxcpm2_gate_up/M=20" in text and "layer B=1" in text and "sampler V=50/B=3" in text

    # The report renders the kernel results (their summary) next to the stages.
    out = tmp_path / "results" / res["device"]["slug"]
    out.mkdir(parents=True)
    (out / "kernels.json").write_text(json.dumps(res))
    report = write_report(tmp_path / "results", tmp_path / "BENCH.md", tmp_path / "plots", include_cpu=True)
    assert "Kernel layer" in report.read_text() and "skinny voxcpm2_qkv/M=1" in report.read_text()


@pytest.mark.skipif(ON_GPU, reason="the GPU runs the real bench")
def test_kernels_bench_config_sweep_on_cpu(monkeypatch):
    """`--sections configs`: every candidate × split-K is checked against the reference and timed; the best is
    named; a gated shape only tries split 1; a candidate past the budget is recorded as skipped."""
    require_kernel_runtime()
    monkeypatch.setattr(
        kb,
        "SKINNY_SHAPES",
        {
            "voxcpm2_qkv": (40, 48, {"norm": True}, (1,)),
            "voxcpm2_gate_up": (64, 32, {"norm": True, "gated": True}, (1,)),
        },
    )
    monkeypatch.setattr(kb, "GEMV_CANDIDATES", ((4, 32, 4, 1), (8, 16, 2, 1)))
    monkeypatch.setattr(kb, "DOT_CANDIDATES", ((16, 32, 4, 2),))
    monkeypatch.setattr(kb, "CONFIG_SWEEP_M", ((1, "gemv"), (5, "dot")))
    res = kb.run_kernels(torch.device("cpu"), budget_s=600, sections=("copy", "configs"))
    sec = res["sections"]["configs"]
    assert set(sec) == {
        "voxcpm2_qkv/M=1/gemv",
        "voxcpm2_gate_up/M=1/gemv",
        "voxcpm2_qkv/M=5/dot",
        "voxcpm2_gate_up/M=5/dot",
    }, sec
    # splits 1/2/4 of K = 48 in whole BLOCK_Ks: 1, 2, 2 ranges of 32 (run once) and 1, 2, 3 ranges of 16
    assert set(sec["voxcpm2_qkv/M=1/gemv"]["runs"]) == {
        "bn4/bk32/w4/s1/split1",
        "bn4/bk32/w4/s1/split2",
        "bn8/bk16/w2/s1/split1",
        "bn8/bk16/w2/s1/split2",
        "bn8/bk16/w2/s1/split3",
    }
    assert set(sec["voxcpm2_gate_up/M=5/dot"]["runs"]) == {"bn16/bk32/w4/s2/split1"}
    for case in sec.values():
        for key, run in case["runs"].items():
            assert "error" not in run, (key, run)
            assert run["rel_err_vs_reference"] < 5e-2 and run["graph_ms"] > 0
        assert case["best"]["graph_ms"] == min(r["graph_ms"] for r in case["runs"].values())
    assert "configs voxcpm2_qkv/M=1/gemv" in kb.summary(res)

    skipped = kb.bench_skinny_configs(
        1, 40, 48, {"norm": True}, "gemv", 1.0, 1, torch.device("cpu"), time_left=lambda: 0.0
    )
    assert all(r == {"skipped": "time budget used up"} for r in skipped["runs"].values()) and "best" not in skipped


def test_kernels_bench_predictor_config_sweep_on_cpu(monkeypatch):
    """`--sections configs_predictors`: the tensor-core form at the predictors' rows, each candidate × split-K (with
    its epilogue kernel, and reduced in the kernel on a shared workspace), checked against the reference."""
    require_kernel_runtime()
    monkeypatch.setattr(kb, "PREDICTOR_SHAPES", {"voxcpm2_locdit_o": (40, 64, {"residual": True}, (22,))})
    monkeypatch.setattr(kb, "PREDICTOR_DOT_CANDIDATES", ((16, 32, 4, 2),))
    monkeypatch.setattr(kb, "PREDICTOR_SWEEP", ("voxcpm2_locdit", (20,), (1, 2)))
    res = kb.run_kernels(torch.device("cpu"), budget_s=600, sections=("copy", "configs_predictors"))
    case = res["sections"]["configs_predictors"]["voxcpm2_locdit_o/M=20/dot"]
    assert set(case["runs"]) == {"bn16/bk32/w4/s2/split1", "bn16/bk32/w4/s2/split2", "bn16/bk32/w4/s2/split2/shared"}
    for key, run in case["runs"].items():
        assert "error" not in run and run["rel_err_vs_reference"] < 1e-2, (key, run)


def test_kernels_bench_stream_sweep_on_cpu(monkeypatch):
    """`--sections configs_stream`: the streamed tile form's candidates × split-K at a shape's serving rows, each
    checked against the reference, beside the tile form's plan (not timed under the interpreter: its autotuner
    needs a GPU, and the failure is recorded, not raised) and the summary line."""
    require_kernel_runtime()
    monkeypatch.setattr(kb, "SKINNY_SHAPES", {})
    monkeypatch.setattr(kb, "PREDICTOR_SHAPES", {"voxcpm2_locdit_o": (40, 64, {"residual": True}, (22,))})
    monkeypatch.setattr(kb, "STREAM_SWEEP", {"voxcpm2_locdit_o": (5,)})
    monkeypatch.setattr(kb, "STREAM_CANDIDATES", ((16, 32, 4, 1),))
    res = kb.run_kernels(torch.device("cpu"), budget_s=600, sections=("copy", "configs_stream"))
    case = res["sections"]["configs_stream"]["voxcpm2_locdit_o/M=5/stream"]
    assert set(case["runs"]) == {"bn16/bk32/w4/s1/split1", "bn16/bk32/w4/s1/split2"}
    for key, run in case["runs"].items():
        assert "error" not in run and run["rel_err_vs_reference"] < 1e-2, (key, run)
    assert "plan" in case and "stream voxcpm2_locdit_o/M=5/stream" in kb.summary(res)


def _one_row_predictor_shapes(monkeypatch) -> None:
    """The one-row sweeps' predictor table: a gated code_predictor shape, and a LocDiT one (never one row)."""
    monkeypatch.setattr(
        kb,
        "PREDICTOR_SHAPES",
        {
            "qwen_code_predictor_gate_up": (48, 96, {"norm": True, "gated": True}, (1,)),
            "voxcpm2_locdit_o": (40, 64, {"residual": True}, (22,)),
        },
    )


def test_kernels_bench_gemv_sweep_on_cpu(monkeypatch):
    """`--sections configs_gemv`: the one-row form's candidates at M = 1, split in 2 for residual shapes only,
    predictors first, LocDiT's (never one row) left out; every run checked against the reference."""
    require_kernel_runtime()
    monkeypatch.setattr(kb, "SKINNY_SHAPES", {"voxcpm2_o": (24, 64, {"residual": True}, (1,))})
    _one_row_predictor_shapes(monkeypatch)
    monkeypatch.setattr(kb, "GEMV_SWEEP_CANDIDATES", ((8, 32, 4, 1), (4, 32, 2, 1)))
    res = kb.run_kernels(torch.device("cpu"), budget_s=600, sections=("copy", "configs_gemv"))
    sweep = res["sections"]["configs_gemv"]
    assert list(sweep) == ["qwen_code_predictor_gate_up/M=1/gemv", "voxcpm2_o/M=1/gemv"]
    assert set(sweep["qwen_code_predictor_gate_up/M=1/gemv"]["runs"]) == {
        "bn8/bk32/w4/s1/split1",
        "bn4/bk32/w2/s1/split1",
    }
    assert set(sweep["voxcpm2_o/M=1/gemv"]["runs"]) == {
        "bn8/bk32/w4/s1/split1",
        "bn8/bk32/w4/s1/split2",
        "bn4/bk32/w2/s1/split1",
        "bn4/bk32/w2/s1/split2",
    }
    for case in sweep.values():
        for key, run in case["runs"].items():
            assert "error" not in run and run["rel_err_vs_reference"] < 5e-2, (key, run)  # bf16, as the smoke test


def test_kernels_bench_gemv_preload_sweep_on_cpu(monkeypatch):
    """`--sections gemv_preload`: at M = 1, the one-row rule's config and the PRELOAD candidates whose one tile
    covers K (64 / 32 W values per thread at 4 warps, 64 at 8), each plain and with `launch_pdl`; shapes whose K
    passes one tile and LocDiT's are left out; every run checked against the reference."""
    require_kernel_runtime()
    monkeypatch.setattr(kb, "SKINNY_SHAPES", {"voxcpm2_down": (24, 5000, {"residual": True}, (1,))})
    _one_row_predictor_shapes(monkeypatch)
    res = kb.run_kernels(torch.device("cpu"), budget_s=600, sections=("copy", "gemv_preload"))
    ((name, case),) = res["sections"]["gemv_preload"].items()
    assert name == "qwen_code_predictor_gate_up/M=1/gemv"
    rule = "bn16/bk256/w4/s1/split1"  # one_row_config's gated config
    preload = [f"bn{bn}/bk128/w{w}/s1/split1/preloadTrue" for bn, w in ((32, 4), (16, 4), (64, 8))]
    assert set(case["runs"]) == {k + pdl for k in (rule, *preload) for pdl in ("", "/launch_pdlTrue")}
    for key, run in case["runs"].items():
        assert "error" not in run and run["rel_err_vs_reference"] < 5e-2, (key, run)


def test_kernels_bench_norm_prologue_sweep_on_cpu(monkeypatch):
    """`--sections norm_prologue`: the tile form with its RMSNorm chunks rolled (the op's way) and unrolled, at the
    normed shapes' rows, each checked against the reference; the unrolled launch takes cdiv(K, width) chunks."""
    require_kernel_runtime()
    monkeypatch.setattr(kb, "SKINNY_SHAPES", {})
    monkeypatch.setattr(kb, "PREDICTOR_SHAPES", {"voxcpm2_locdit_qkv": (40, 96, {"norm": True}, (22,))})
    monkeypatch.setattr(kb, "NORM_SWEEP", {"voxcpm2_locdit_qkv": (5,), "absent": (3,)})
    monkeypatch.setattr(kb, "NORM_SWEEP_CANDIDATES", ((16, 32, 4, 2, {}), (16, 32, 4, 2, {"NORM_UNROLL": 64})))
    assert kb._launch_extra({"NORM_UNROLL": 64}, 96) == ({"NORM_BLOCK": 64, "NORM_CHUNKS": 2}, "/norm64")
    res = kb.run_kernels(torch.device("cpu"), budget_s=600, sections=("copy", "norm_prologue"))
    (case,) = res["sections"]["norm_prologue"].values()
    assert set(case["runs"]) == {"bn16/bk32/w4/s2/split1", "bn16/bk32/w4/s2/split1/norm64"}
    for key, run in case["runs"].items():
        assert "error" not in run and run["rel_err_vs_reference"] < 5e-2, (key, run)


@pytest.mark.skipif(ON_GPU, reason="the GPU runs the real bench")
def test_kernels_bench_attention_sweep_marks_the_plan_on_cpu(monkeypatch):
    """`--sections sweep_attention`: every splits × BLOCK_S case checked against the reference and timed, each
    marked with the launcher's split count; exactly one case per (batch, context) is the launcher's own plan, and the
    summary prints the plan's time beside the best."""
    require_kernel_runtime()
    from ttsaot.builder.kernels.common import multiprocessor_count
    from ttsaot.builder.kernels.decode_attention import BLOCK_S, plan_num_splits

    monkeypatch.setattr(kb, "ATTENTION", {"hq": 4, "hkv": 2, "hd": 16, "cache_positions": 40, "contexts": (7, 30)})
    monkeypatch.setattr(kb, "ATTENTION_SWEEP", {"batches": (1, 3), "splits": (1, 2), "blocks": (16, BLOCK_S)})
    res = kb.run_kernels(torch.device("cpu"), budget_s=600, sections=("copy", "sweep_attention"))
    sec = res["sections"]["sweep_attention"]
    assert len(sec) == 2 * 2 * 2 * 2, sorted(sec)
    for key, case in sec.items():
        assert "error" not in case, (key, case)
        assert case["rel_err_vs_reference"] < 3e-2 and case["workspace_zero_after_timing"], key
        assert case["planned_splits"] == plan_num_splits(case["B"] * 2, 40, multiprocessor_count(torch.device("cpu")))
    plans = [k for k, c in sec.items() if c["is_plan"]]
    # the 40-position cache holds one 64-position chunk: the plan is one split at the launcher's BLOCK_S
    assert sorted(plans) == sorted(f"attention/base/B={b}/ctx={c}/splits=1/block_s={BLOCK_S}" for b in (1, 3)
                                   for c in (7, 30))  # fmt: skip
    text = kb.summary(res)
    assert text.count("; plan (1 splits)") == 4, text
