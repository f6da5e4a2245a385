"""Oracle parity: our MiniCPM4 (prefill, per-row static-cache step, fused projections) and the fsq/stop heads
against the installed `voxcpm` package's MiniCPMModel / ScalarQuantizationLayer with identical weights.

Only single upstream modules are imported (bench/upstream.py stubs the `voxcpm` package, skipping its
__init__, which pulls the audio/hub stacks) and built with the bench's constructors (`voxcpm_minicpm`,
`voxcpm_fsq`)."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from bench.families.voxcpm2 import voxcpm_fsq, voxcpm_minicpm, voxcpm_module
from ttsaot.builder.families.voxcpm2 import checkpoint as vck
from ttsaot.builder.families.voxcpm2 import config as vcfg
from ttsaot.builder.families.voxcpm2 import lm as vlm
from ttsaot.builder.families.voxcpm2 import stages as vst
from ttsaot.builder.passes import fuse_projections

from ..conftest import rel_err
from .upstream import import_upstream

pytestmark = pytest.mark.oracle
MAX_LEN = 24


@pytest.fixture(scope="module")
def up():
    pytest.importorskip("pydantic")
    import_upstream("voxcpm.modules.minicpm4.model")  # skips if voxcpm is not installed, fails if broken
    return voxcpm_module("minicpm4.model"), voxcpm_module("minicpm4.config")


def _upstream_lm(cfg: vcfg.MiniCPM4Config, ours: vlm.MiniCPM4):
    return voxcpm_minicpm(cfg.to_json(), ours.state_dict())


CASES = {
    "base": lambda c: c.lm,
    "residual_no_rope": lambda c: c.residual,
    "mup_long_rope": lambda c: replace(
        c.lm, use_mup=True, max_position_embeddings=8192, rope_original_max_position_embeddings=4096
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@torch.no_grad()
def test_minicpm4_prefill_and_steps_match_upstream(up, case):
    cfg = CASES[case](vcfg.LM_PRESETS["tiny"])
    ours = vck.init_random_lm(vlm.MiniCPM4(cfg, MAX_LEN + 1, with_embedding=cfg.vocab_size > 0), seed=3)
    ref = _upstream_lm(cfg, ours)
    B, T, P = 2, 7, 5
    x = torch.randn(B, T, cfg.hidden_size, generator=torch.Generator().manual_seed(0))

    # prefill (MiniCPMModel.forward) on the first P tokens: hidden and every layer's k/v
    h_ref, kv_ref = ref(x[:, :P], is_causal=True)
    h, kv = ours.forward_seq(x[:, :P])
    assert rel_err(h, h_ref) < 1e-5
    for (k, v), (kr, vr) in zip(kv, kv_ref):
        assert rel_err(k, kr) < 1e-5 and rel_err(v, vr) < 1e-5

    # then upstream's StaticKVCache + forward_step vs our prefill + per-row step, fused and unfused
    ref.setup_cache(B, MAX_LEN + 1, "cpu", torch.float32)
    ref.kv_cache.fill_caches(kv_ref)
    fused = copy.deepcopy(ours)
    fuse_projections(fused)
    for model in (ours, fused):
        shape = vst.cache_shape(cfg, B, MAX_LEN)
        kc, vc = torch.zeros(shape), torch.zeros(shape)
        model.prefill(x[:, :P], torch.full((B,), P), kc, vc)
        for t in range(P, T):
            if model is ours:
                want = ref.forward_step(x[:, t], torch.tensor([ref.kv_cache.step()]))
                setattr(ref, f"_want{t}", want)
            want = getattr(ref, f"_want{t}")
            got = model.forward_step(x[:, t], torch.full((B,), t), kc, vc)
            assert rel_err(got, want) < 1e-5, (case, t)
        # the caches hold what upstream's hold at the written positions
        assert rel_err(kc[:, :, :, :T], ref.kv_cache.kv_cache[0][:, :, :, :T]) < 1e-5
        assert rel_err(vc[:, :, :, :T], ref.kv_cache.kv_cache[1][:, :, :, :T]) < 1e-5


@torch.no_grad()
def test_rope_table_matches_upstream_longrope(up):
    model, config = up
    tiny = vcfg.LM_PRESETS["tiny"]
    for cfg in (tiny.lm, CASES["mup_long_rope"](tiny), vcfg.LM_PRESETS["full"].lm):
        rope = model.MiniCPMLongRoPE(config.MiniCPM4Config(**cfg.to_json()))
        ours = vlm.RopeTable(cfg, 64)
        assert rel_err(ours.cos, rope.cos_cached[:64]) < 1e-6 and rel_err(ours.sin, rope.sin_cached[:64]) < 1e-6


@torch.no_grad()
def test_fsq_and_stop_head_match_upstream(up):
    cfg = vcfg.LM_PRESETS["tiny"]
    step = vck.init_random_lm(vlm.BaseLMStep(cfg, MAX_LEN), seed=1)
    ref = voxcpm_fsq(cfg.lm.hidden_size, cfg.scalar_quantization_latent_dim, cfg.scalar_quantization_scale)
    ref.load_state_dict(step.fsq_layer.state_dict())
    ref.eval()
    h = torch.randn(3, 5, cfg.lm.hidden_size, generator=torch.Generator().manual_seed(2)) * 3
    assert torch.equal(step.fsq_layer(h), ref(h))
