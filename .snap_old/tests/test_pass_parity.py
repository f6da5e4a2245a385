"""Pass parity (builder/pass_parity.py): a rewrite whose fp32 result differs only by summation order is re-decided
in float64 and accepted; a wrong rewrite is refused with both errors; the LM / step stages on the ttsaot ops run
the float64 re-check on their tiny presets."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from ttsaot.builder import build as build_mod
from ttsaot.builder import pass_parity as pp
from ttsaot.builder.buckets import BucketPlan
from ttsaot.builder.build import BuildError, Reporter, _golden_sizes, build_stage, prepare_modules
from ttsaot.builder.families.fish_s2_pro.options import FishS2Options
from ttsaot.builder.families.fish_s2_pro.stages import fast_ar_stage
from ttsaot.builder.families.qwen3_tts_12hz import config as qcfg
from ttsaot.builder.families.qwen3_tts_12hz.options import Qwen3TTSOptions
from ttsaot.builder.families.qwen3_tts_12hz.stages import code_predictor_stage
from ttsaot.builder.families.voxcpm2.options import VoxCPM2Options
from ttsaot.builder.families.voxcpm2.stages import lm_stage
from ttsaot.builder.kernels.decode_modules import KernelAttention, KernelSwiGLU
from ttsaot.builder.stage_spec import StageSpec


class LeftSum(nn.Module):
    """y = (x0·w0 + x1·w1) + x2·w2, summed left to right."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x * self.w
        return ((t[:, 0] + t[:, 1]) + t[:, 2])[:, None]


class RightSum(LeftSum):
    """The same sum, associated the other way: x0·w0 + (x1·w1 + x2·w2)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x * self.w
        return (t[:, 0] + (t[:, 1] + t[:, 2]))[:, None]


class Fp32Constant(RightSum):
    """The reassociated sum plus 0·(x @ an fp32 constant): the same in fp32, a dtype error in float64."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + 0.0 * (x @ torch.ones(3, 1, dtype=torch.float32))


def _swap_class(cls: type[nn.Module]):
    def rewrite(module: nn.Module) -> dict:
        module.__class__ = cls
        return {"pass": f"to_{cls.__name__}"}

    return rewrite


def _change_weight(module: nn.Module) -> dict:
    with torch.no_grad():
        module.w[2] *= 1.01
    return {"pass": "change_weight"}


def _spec(rewrite) -> StageSpec:
    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        # 1 + (-1 + 1e-4) loses the low bits of 1e-4 in fp32 (rel error ~1e-4), none in float64
        x = torch.tensor([1.0, -1.0, 1e-4]) * (1 + 0.01 * torch.rand(1, generator=g))
        return {"x": x.expand(sizes["batch"], 3).contiguous()}

    return StageSpec(
        family="test",
        name="sum3",
        kind="generic",
        make_module=LeftSum,
        passes=[rewrite],
        plan=BucketPlan({"batch": (1, 2)}),
        make_inputs=make_inputs,
        inputs=[{"name": "x", "dtype": "float32", "shape": ["batch", 3]}],
        outputs=[{"name": "y", "dtype": "float32", "shape": ["batch", 1]}],
        dtype=torch.float32,
        tolerance=1e-5,
    )


class _ParityPassed(Exception):
    pass


def _stop_after_parity(monkeypatch) -> None:
    """build_stage casts the rewritten module to the compute dtype right after the parity loop: stop there."""

    def stop(*_a, **_k):
        raise _ParityPassed

    monkeypatch.setattr(build_mod, "cast_to_compute_dtype", stop)


def _fp32_errors(spec: StageSpec, sizes: dict[str, int], seed: int) -> dict[str, float]:
    original, rewritten, _ = prepare_modules(spec)
    inputs = spec.make_inputs(sizes, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ref, out = original(inputs["x"]), rewritten(inputs["x"])
    return pp.output_errors(spec, (ref,), (out,))


def test_reassociating_rewrite_passes_through_the_float64_recheck(tmp_path, monkeypatch):
    spec = _spec(_swap_class(RightSum))
    for i, sizes in enumerate(_golden_sizes(spec)):  # the fp32 check alone refuses it (precondition)
        assert _fp32_errors(spec, sizes, i)["y"] > pp.FP32_LIMIT
        original, rewritten, _ = prepare_modules(spec)
        assert pp.float64_errors(spec, original, rewritten, sizes, i)["y"] <= pp.FP64_LIMIT
    _stop_after_parity(monkeypatch)
    with pytest.raises(_ParityPassed):
        build_stage(spec, tmp_path, torch.device("cpu"), 0, Reporter())


def test_wrong_rewrite_is_refused_with_both_errors(tmp_path, monkeypatch):
    _stop_after_parity(monkeypatch)
    spec = _spec(_change_weight)
    with pytest.raises(BuildError) as e:
        build_stage(spec, tmp_path, torch.device("cpu"), 0, Reporter())
    msg = str(e.value)
    assert "sum3: passes changed output 'y' on case b1" in msg and "a rewrite is wrong" in msg
    assert "in fp32" in msg and "in float64" in msg


def test_float64_recheck_that_cannot_run_keeps_the_fp32_verdict(tmp_path, monkeypatch):
    _stop_after_parity(monkeypatch)
    spec = _spec(_swap_class(Fp32Constant))
    with pytest.raises(BuildError) as e:
        build_stage(spec, tmp_path, torch.device("cpu"), 0, Reporter())
    msg = str(e.value)
    assert "passes changed output 'y' on case b1" in msg and "float64 re-check" in msg and "could not run" in msg


def test_recheck_leaves_the_modules_as_they_were():
    spec = _spec(_swap_class(RightSum))
    original, rewritten, _ = prepare_modules(spec)
    pp.float64_errors(spec, original, rewritten, {"batch": 2}, 0)
    assert all(p.dtype == torch.float32 for m in (original, rewritten) for p in m.parameters())


def _voxcpm2(name: str) -> StageSpec:
    return lm_stage(name, VoxCPM2Options(dtype=torch.bfloat16, batch_buckets=(1, 3), max_len=32, kernels="ttsaot"))


def _qwen_code_predictor() -> StageSpec:
    return code_predictor_stage(
        Qwen3TTSOptions(
            dtype=torch.bfloat16, batch_buckets=(1, 3), kernels="ttsaot", code_predictor_with_embedding=True
        )
    )


def _fish_fast_ar() -> StageSpec:
    return fast_ar_stage(
        FishS2Options(dtype=torch.bfloat16, batch_buckets=(1, 3), kernels="ttsaot", fast_ar_with_embedding=True)
    )


@pytest.mark.parametrize(
    "make_spec",
    [
        lambda: _voxcpm2("base_lm_step"),
        lambda: _voxcpm2("residual_lm_step"),
        _qwen_code_predictor,
        _fish_fast_ar,
    ],
    ids=["voxcpm2-base_lm_step", "voxcpm2-residual_lm_step", "qwen-code_predictor", "fish-fast_ar"],
)
def test_stages_on_the_kernel_ops_run_the_float64_recheck(make_spec, monkeypatch):
    # the tiny Qwen predictor's head_dim 8 is one the kernel refuses (the stage would stay eager): 16 here
    tiny = qcfg.CODE_PREDICTOR_PRESETS["tiny"]
    monkeypatch.setitem(qcfg.CODE_PREDICTOR_PRESETS, "tiny", replace(tiny, head_dim=16))
    spec = make_spec()
    original, rewritten, _ = prepare_modules(spec, "ttsaot")
    kernel_blocks = [m for m in rewritten.modules() if isinstance(m, (KernelAttention, KernelSwiGLU))]
    assert kernel_blocks, "the kernel passes put no ttsaot op into the stage"
    monkeypatch.setattr(pp, "FP32_LIMIT", -1.0)  # every output goes to the float64 re-check
    for i, sizes in enumerate(_golden_sizes(spec)):
        errs = pp.float64_errors(spec, original, rewritten, sizes, i)
        assert set(errs) == {d["name"] for d in spec.outputs}
        assert max(errs.values()) <= pp.FP64_LIMIT, (sizes, errs)
        inputs = spec.make_inputs(sizes, torch.Generator().manual_seed(i))
        with torch.no_grad():
            ref = original(*[inputs[n] for n in spec.input_names])
            out = rewritten(*[spec.make_inputs(sizes, torch.Generator().manual_seed(i))[n] for n in spec.input_names])
        ref, out = (ref if isinstance(ref, tuple) else (ref,)), (out if isinstance(out, tuple) else (out,))
        assert pp.pass_parity_problem(spec, original, rewritten, sizes, i, ref, out) is None
