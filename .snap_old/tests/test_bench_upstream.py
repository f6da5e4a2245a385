"""bench/upstream.py + bench/families/: every wired upstream module, built from our faithful tiny module, computes
the stage's outputs from the stage's inputs (fp32, CPU) — and what it runs is upstream code, not ours."""

from __future__ import annotations

import pytest
import torch

from bench.common import Skipped
from bench.families import MODULES, bench_family
from bench.families.voxcpm2 import VoxCPMLMStep
from bench.specs import make_spec
from bench.stage import make_bucket_inputs, parity
from bench.upstream import import_module_alone, upstream_module

CPU = torch.device("cpu")
LM_STEPS = [("voxcpm2", "base_lm_step"), ("voxcpm2", "residual_lm_step")]
UPSTREAM = [(family, stage) for family in MODULES for stage in bench_family(family).upstream]


def _build(family: str, stage: str, axes: dict | None = None):
    """(spec, our fp32 module, upstream module) for the tiny preset, as the bench builds them (fp32: the LM
    caches are then fp32 too, as the fp32 upstream module needs)."""
    spec, _ = make_spec(family, stage, "tiny", dtype="fp32", axes=axes)
    ours = spec.make_module().eval()
    try:
        _, up = upstream_module(family, stage, ours)
    except Skipped as e:
        if "is not installed" in str(e):
            pytest.skip(str(e))
        raise
    return spec, ours, up


def _clones(xs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [x.clone() for x in xs]  # our LM steps write into their cache inputs


@pytest.mark.parametrize("family,stage", list(UPSTREAM))
@torch.no_grad()
def test_upstream_matches_our_module(family, stage):
    spec, ours, up = _build(family, stage)
    foreign = {type(m).__module__ for m in up.modules() if type(m).__module__.startswith("ttsaot")}
    assert not foreign, f"upstream module runs our code: {foreign}"
    for i, sizes in enumerate(spec.plan.buckets()):
        xs = make_bucket_inputs(spec, sizes, 11 + i, CPU)
        ref = ours(*_clones(xs))
        out = up(*_clones(xs))
        err = parity(out, ref)
        assert err is not None, "output shapes differ"
        ints = [o for o in (out if isinstance(out, tuple) else (out,)) if not o.is_floating_point()]
        assert (err == 0.0) if ints else (err <= 1e-4), (sizes, err)


@pytest.mark.parametrize("family,stage", LM_STEPS)
@torch.no_grad()
def test_lm_step_fills_upstream_cache_once_per_cache_inputs(family, stage):
    spec, ours, up = _build(family, stage)
    assert isinstance(up, VoxCPMLMStep)
    xs = make_bucket_inputs(spec, spec.plan.buckets()[0], 5, CPU)
    k_in, v_in = xs[-2].clone(), xs[-1].clone()
    first = up(*xs)
    cache = up.lm.kv_cache
    again = up(*xs)  # same cache tensors: upstream's own cache is reused, not refilled
    assert up.lm.kv_cache is cache
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            first if isinstance(first, tuple) else (first,), again if isinstance(again, tuple) else (again,)
        )
    )
    assert torch.equal(xs[-2], k_in) and torch.equal(xs[-1], v_in)  # upstream writes its own cache only
    other = make_bucket_inputs(spec, spec.plan.buckets()[0], 6, CPU)  # new caches: filled again
    assert parity(up(*_clones(other)), ours(*_clones(other))) <= 1e-4
    assert up.lm.kv_cache is not cache


@pytest.mark.parametrize("family,stage", LM_STEPS)
@torch.no_grad()
def test_lm_step_batch_in_lockstep(family, stage):
    """Upstream decodes a batch at one shared position: with every row at the same position the rows match."""
    spec, ours, up = _build(family, stage, axes={"batch": (3,)})
    xs = make_bucket_inputs(spec, {"batch": 3}, 9, CPU)
    pos = spec.input_names.index("positions")
    xs[pos] = xs[pos][:1].expand(3).clone()
    assert parity(up(*_clones(xs)), ours(*_clones(xs))) <= 1e-4


@torch.no_grad()
def test_fish_decoder_is_prepared_as_vllm_omni_serves_it():
    _, _, up = _build("fish-s2-pro", "dac_decoder")
    codec = up.codec
    assert codec.encoder is None and codec.quantizer.pre_module is None
    assert not any(getattr(m, "parametrizations", None) for m in codec.modules())  # weight norm baked


def test_unavailable_upstream_is_skipped_not_crashed():
    with pytest.raises(Skipped, match="unavailable: upstream package .* is not installed"):
        import_module_alone("no_such_upstream_pkg_xyz.models.codec")
    with pytest.raises(Skipped, match="unavailable: no standalone upstream module"):
        upstream_module("voxcpm2", "no_such_stage", torch.nn.Identity())
