"""`ttsaot::skinny_linear_norm_out`: a residual projection that also returns the next RMSNorm of its output, computed
in its second pass (whole rows per program) instead of in every program of the next projection. y is skinny_linear's
own (bit for bit, split or not); the norm rounds where the tile form's prologue rounds, so the next projection from it
equals the projection with the prologue up to the fp32 sum order; one node under torch.export, CPU lowering to aten;
`norm_out_pays` takes it only where the plan splits K (the second pass is launched anyway). The GPU tests at the end."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ttsaot.builder.kernels import CPU_DECOMPOSITIONS, lower_for_cpu
from ttsaot.builder.kernels.common import rms_norm
from ttsaot.builder.kernels.skinny_linear import (
    NORM_OUT_ENV,
    launch_skinny_linear,
    norm_out_pays,
    skinny_linear,
    skinny_linear_norm_out,
    skinny_linear_norm_out_reference,
)

from .conftest import rel_err
from .kernel_fixtures import DEVICE, ON_GPU, require_kernel_runtime

NORM_OUT = torch.ops.ttsaot.skinny_linear_norm_out.default
SL_MODULE = importlib.import_module("ttsaot.builder.kernels.skinny_linear")  # the package exports the op by this name


@pytest.fixture(autouse=True)
def _kernel_runtime():
    require_kernel_runtime()


def _case(M, N, K, dtype, *, bias, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    t = {
        "x": torch.randn(M, K, generator=g),
        "weight": torch.randn(N, K, generator=g) / K**0.5,
        "bias": torch.randn(N, generator=g) if bias else None,
        "residual": torch.randn(M, N, generator=g),
        "g": torch.rand(N, generator=g) + 0.5,
        "w_next": torch.randn(24, N, generator=g) / N**0.5,
    }
    return {k: None if v is None else v.to(dtype).to(device) for k, v in t.items()}


# (M, N, K, split): the tile form split in 2 (the LocDiT's o/down rows) and unsplit (its y read back), the GEMV
# form's one row split, the tile form with N not a multiple of the tile
CASES = [(22, 96, 1024, 2), (5, 80, 256, 1), (1, 64, 1024, 2), (3, 40, 512, 1)]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("M,N,K,split", CASES)
def test_second_pass_writes_y_and_its_next_norm(M, N, K, split, bias):
    """fp32 on the kernels (interpreter on CPU): y equals skinny_linear's own launch bit for bit, yn the RMSNorm of
    that y, and the next projection from yn the projection of y with its RMSNorm prologue."""
    t = _case(M, N, K, torch.float32, bias=bias)
    cfg = {"BLOCK_N": 16, "BLOCK_K": 256 if M > 2 else 512, "num_warps": 4, "num_stages": 1}
    common = dict(residual=t["residual"], residual_scale=0.7, split_k=split, config=cfg)
    y, yn = launch_skinny_linear(t["x"], t["weight"], t["bias"], **common, out_norm_weight=t["g"], out_norm_eps=1e-5)
    assert torch.equal(y, launch_skinny_linear(t["x"], t["weight"], t["bias"], **common))
    assert rel_err(yn.cpu(), rms_norm(y, t["g"], 1e-5).cpu()) < 1e-6
    ref_y, ref_yn = skinny_linear_norm_out_reference(t["x"], t["weight"], t["bias"], t["residual"], 0.7, t["g"], 1e-5)
    assert rel_err(y.cpu(), ref_y.cpu()) < 1e-5 and rel_err(yn.cpu(), ref_yn.cpu()) < 1e-5
    nxt = dict(config={"BLOCK_N": 8, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1})
    from_yn = launch_skinny_linear(yn, t["w_next"], **nxt)
    with_prologue = launch_skinny_linear(y, t["w_next"], norm_weight=t["g"], norm_eps=1e-5, **nxt)
    assert rel_err(from_yn.cpu(), with_prologue.cpu()) < 1e-6


def test_bf16_second_pass_rounds_like_the_reference():
    t = _case(22, 96, 1024, torch.bfloat16, bias=True, seed=1)
    cfg = {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 1}
    y, yn = launch_skinny_linear(
        t["x"], t["weight"], t["bias"], residual=t["residual"], split_k=2, config=cfg, out_norm_weight=t["g"]
    )
    ref_y, ref_yn = skinny_linear_norm_out_reference(t["x"], t["weight"], t["bias"], t["residual"], 1.0, t["g"], 1e-6)
    tol = 1e-2 if ON_GPU else 3e-2  # CPU: the interpreter's truncating casts
    assert rel_err(y.float(), ref_y.float()) < tol and rel_err(yn.float(), ref_yn.float()) < tol


def test_op_on_cpu_is_the_reference_and_checks_its_norm_weight():
    t = _case(4, 32, 64, torch.float32, bias=False, device="cpu")
    y, yn = skinny_linear_norm_out(t["x"], t["weight"], None, t["residual"], 1.0, t["g"], 1e-6)
    ref = skinny_linear_norm_out_reference(t["x"], t["weight"], None, t["residual"], 1.0, t["g"], 1e-6)
    assert torch.equal(y, ref[0]) and torch.equal(yn, ref[1])
    assert torch.equal(y, skinny_linear(t["x"], t["weight"], residual=t["residual"]))
    with pytest.raises(RuntimeError, match=r"out_norm_weight must be \[32\]"):
        skinny_linear_norm_out(t["x"], t["weight"], None, t["residual"], 1.0, t["g"][:16], 1e-6)
    with pytest.raises(RuntimeError, match="residual must be"):
        skinny_linear_norm_out(t["x"], t["weight"], None, t["residual"][:, :8], 1.0, t["g"], 1e-6)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.o = torch.nn.Linear(16, 12)
        self.up = torch.nn.Linear(12, 20)
        self.g = torch.nn.Parameter(torch.rand(12) + 0.5)

    def forward(self, h, x):
        y, yn = skinny_linear_norm_out(h, self.o.weight, self.o.bias, x, 1.0, self.g, 1e-6)
        return y + skinny_linear(yn, self.up.weight, self.up.bias).sum(-1, keepdim=True)


def test_export_keeps_one_node_and_cpu_lowers_to_aten():
    m, h, x = _Block(), torch.randn(3, 16), torch.randn(3, 12)
    with torch.no_grad():
        ep = torch.export.export(m, (h, x), strict=False)
        ops = [n.target for n in ep.graph.nodes if n.op == "call_function"]
        assert ops.count(NORM_OUT) == 1
        for lowered in (
            ep.run_decompositions({**torch.export.default_decompositions(), **CPU_DECOMPOSITIONS}),
            lower_for_cpu(ep),
        ):
            targets = {str(n.target) for n in lowered.graph.nodes if n.op == "call_function"}
            assert not any("ttsaot" in t for t in targets)
            torch.testing.assert_close(lowered.module()(h, x), m(h, x))


def test_norm_out_pays_where_the_plan_splits_k(monkeypatch):
    """Decided from static shapes at trace time (fake CUDA tensors here, 132 SMs): the LocDiT's o and down at 22
    rows split K in 2, so they take it; the local encoder's 5 rows are fewer than NORM_OUT_MIN_ROWS, the LM's one-row
    o_proj runs unsplit, and rows past MAX_KERNEL_ROWS run aten: none of these does; nor anything on CPU, nor with
    TTSAOT_NORM_OUT=0."""
    monkeypatch.setattr(SL_MODULE, "multiprocessor_count", lambda device: 132)
    monkeypatch.delenv(NORM_OUT_ENV, raising=False)
    with FakeTensorMode():
        cuda = torch.device("cuda")

        def pays(rows, n, k, device=cuda):
            return norm_out_pays(torch.empty(rows, k, device=device), torch.empty(n, k, device=device))

        assert pays(22, 1024, 2048) and pays(22, 1024, 4096)  # LocDiT o, down
        assert not pays(5, 1024, 2048)  # the local encoder's 5 rows: split, but the prologue costs too little
        assert not pays(1, 2048, 2048)  # a one-row LM o_proj: 256 GEMV column tiles, unsplit
        assert not pays(352, 1024, 4096)  # LocDiT b16: 352 rows, aten
        assert not pays(22, 1024, 512)  # K too short to split
        assert not pays(22, 1024, 2048, device=torch.device("cpu"))
        monkeypatch.setenv(NORM_OUT_ENV, "0")
        assert not pays(22, 1024, 2048)


# ------------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows", [22, 5, 1])
@pytest.mark.parametrize("N,K", [(1024, 2048), (1024, 4096), (2560, 9728)], ids=["locdit_o", "locdit_down", "fish"])
def test_gpu_norm_out_at_real_shapes(N, K, rows):
    """bf16, autotuned as a build bakes it: y equals skinny_linear's bit for bit, yn within bf16 of the RMSNorm of
    y, and the next projection from yn within bf16 of the projection with its prologue; a second call equal."""
    t = _case(rows, N, K, torch.bfloat16, bias=False, seed=rows)
    y, yn = skinny_linear_norm_out(t["x"], t["weight"], None, t["residual"], 1.0, t["g"], 1e-6)
    assert torch.equal(y, skinny_linear(t["x"], t["weight"], residual=t["residual"]))
    assert rel_err(yn.float(), rms_norm(y, t["g"], 1e-6).float()) < 1e-2
    from_yn = skinny_linear(yn, t["w_next"])
    assert rel_err(from_yn.float(), skinny_linear(y, t["w_next"], norm_weight=t["g"]).float()) < 1e-2
    again = skinny_linear_norm_out(t["x"], t["weight"], None, t["residual"], 1.0, t["g"], 1e-6)
    assert torch.equal(again[0], y) and torch.equal(again[1], yn)
