"""Parity with the upstream `voxcpm` package: UnifiedCFM + LocDiT V2, the local encoder (VoxCPMLocEnc) and the
AudioVAE V2 decoder, tiny configs, identical weights read from a checkpoint written in the real layout
(model.safetensors + config.json + audiovae.safetensors with legacy weight norm)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from bench.families.voxcpm2 import voxcpm_audio_vae, voxcpm_cfm, voxcpm_local_encoder
from ttsaot.builder.families.voxcpm2 import FAMILY as VOX
from ttsaot.builder.families.voxcpm2 import audio as va
from ttsaot.builder.families.voxcpm2 import checkpoint as vck
from ttsaot.builder.families.voxcpm2 import stages as vst
from ttsaot.runtime import load

from ..conftest import rel_err
from ..test_voxcpm2_audio import CFG, _dit_inputs, _modules_from_build, _opts, voxcpm2_audio_fp32  # noqa: F401
from .upstream import import_upstream

pytestmark = pytest.mark.oracle


@pytest.fixture(scope="module")
def upstream():
    pytest.importorskip("pydantic")
    pytest.importorskip("einops")
    import_upstream("voxcpm.modules.minicpm4.config")  # skips if voxcpm is not installed, fails if broken


@pytest.fixture(scope="module")
def ckpt_and_upstream(upstream, tmp_path_factory):
    """Our build-fixture modules written as a real checkpoint; upstream modules loaded from it strictly."""
    dit, enc, dec = _modules_from_build()
    up_vae_probe = voxcpm_audio_vae(CFG.vae.to_json())
    encoder_sd = {f"encoder.{k}": v for k, v in up_vae_probe.encoder.state_dict().items()}
    ckpt = vck.write_audio_checkpoint(
        tmp_path_factory.mktemp("voxcpm2") / "VoxCPM2-tiny", CFG, dit, enc, dec, vae_extra=encoder_sd
    )
    conf = json.loads((ckpt / "config.json").read_text())
    sd = load_file(str(ckpt / "model.safetensors"))

    def strip(prefix):
        return {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}

    up_enc = voxcpm_local_encoder(conf)
    up_enc.load_state_dict(strip("feat_encoder."), strict=True)
    cfm = voxcpm_cfm(conf)
    cfm.estimator.load_state_dict(strip("feat_decoder.estimator."), strict=True)
    projs = {}
    for name, (i, o) in {
        "enc_to_lm_proj": (CFG.encoder.hidden_size, CFG.lm_hidden_size),
        "lm_to_dit_proj": (CFG.lm_hidden_size, CFG.dit.hidden_size),
        "res_to_dit_proj": (CFG.lm_hidden_size, CFG.dit.hidden_size),
    }.items():
        projs[name] = nn.Linear(i, o)
        projs[name].load_state_dict(strip(f"{name}."), strict=True)
    up_vae = voxcpm_audio_vae(conf["audio_vae_config"])
    up_vae.load_state_dict(load_file(str(ckpt / "audiovae.safetensors")), strict=True)
    return ckpt, {"enc": up_enc.eval(), "cfm": cfm.eval(), "vae": up_vae.eval(), **projs}


def _upstream_patch(up, lm, res, cond, n_timesteps, cfg_rate, seed):
    mu = torch.cat([up["lm_to_dit_proj"](lm), up["res_to_dit_proj"](res)], dim=-1)
    torch.manual_seed(seed)  # z = randn((b, C, P), dtype=mu.dtype) inside UnifiedCFM
    return up["cfm"](mu=mu, n_timesteps=n_timesteps, patch_size=CFG.patch_size, cond=cond, cfg_value=cfg_rate)


def _same_noise(B, seed, dtype=torch.float32):
    torch.manual_seed(seed)
    return torch.randn(B, CFG.feat_dim, CFG.patch_size, dtype=dtype)


def test_checkpoint_loads_into_our_stages(ckpt_and_upstream):
    ckpt, _ = ckpt_and_upstream
    specs = {s.name: s for s in VOX.specs(_opts(checkpoint=str(ckpt)), vst.AUDIO_STAGES)}
    for name, ref in zip(vst.AUDIO_STAGES, _modules_from_build()):
        own = specs[name].make_module().state_dict()
        assert all(torch.equal(own[k], v) for k, v in ref.state_dict().items())


def test_locdit_eager_matches_upstream_cfm(ckpt_and_upstream):
    """The default 10-step solve (9 estimator calls), fp32, our eager module vs UnifiedCFM.forward."""
    ckpt, up = ckpt_and_upstream
    ours = vst.locdit_stage(_opts(checkpoint=str(ckpt), n_timesteps=10)).make_module()
    lm, res, cond, _ = _dit_inputs(3, seed=31)
    with torch.no_grad():
        ref = _upstream_patch(up, lm, res, cond, 10, CFG.inference_cfg_rate, seed=5)
        out = ours(lm, res, cond, _same_noise(3, 5))
    assert rel_err(out, ref) < 1e-5


def test_locdit_bf16_time_grid_matches_upstream(ckpt_and_upstream):
    """In bf16 the estimator sees exactly the reference's t values (grid computed in the model dtype)."""
    ckpt, up = ckpt_and_upstream
    seen: list[float] = []
    cfm_bf = copy.deepcopy(up["cfm"]).to(torch.bfloat16)  # a copy: .to() would round the fixture weights
    cfm_bf.estimator.register_forward_pre_hook(lambda m, args: seen.append(float(args[2][0])))
    lm, res, cond, _ = _dit_inputs(2, seed=3)
    mu = torch.cat([up["lm_to_dit_proj"](lm), up["res_to_dit_proj"](res)], dim=-1).to(torch.bfloat16)
    with torch.no_grad():
        cfm_bf(mu=mu, n_timesteps=10, patch_size=CFG.patch_size, cond=cond.to(torch.bfloat16), cfg_value=2.0)
    ours = [t for t, _, zero in va.euler_schedule(10, torch.bfloat16) if not zero]
    assert seen == ours


def test_artifact_matches_upstream(ckpt_and_upstream, voxcpm2_audio_fp32):  # noqa: F811
    """The built fp32 artifact (same weights) vs upstream: CFM at the artifact's step count, encoder, VAE."""
    _, up = ckpt_and_upstream
    bundle = load(voxcpm2_audio_fp32)
    n = bundle["locdit"].metadata["n_timesteps"]
    lm, res, cond, _ = _dit_inputs(2, seed=41)
    with torch.no_grad():
        ref = _upstream_patch(up, lm, res, cond, n, bundle["locdit"].metadata["cfg_rate"], seed=9)
    patch = bundle["locdit"](lm, res, cond, _same_noise(2, 9))
    assert rel_err(patch, ref) < 1e-4

    x = patch.transpose(1, 2).unsqueeze(1)
    with torch.no_grad():
        ref_emb = up["enc_to_lm_proj"](up["enc"](x))[:, 0]
    assert rel_err(bundle["local_encoder"](x), ref_emb) < 1e-4

    z = torch.randn(2, CFG.feat_dim, 40, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref_wav = up["vae"].decode(z)
    wav = bundle["vae_decoder"](z)  # padded into the 48-frame bucket
    assert wav.shape == ref_wav.shape
    assert rel_err(wav, ref_wav) < 1e-4
    with torch.no_grad():  # streamed in the serving pattern: 12-frame chunks, 24 frames of context
        streamed = torch.cat(list(bundle["vae_decoder"].stream(z.split(12, dim=-1))), dim=-1)
    assert rel_err(streamed, ref_wav) < 1e-4


def test_vae_eager_matches_upstream_decoder(ckpt_and_upstream):
    ckpt, up = ckpt_and_upstream
    ours, report = vck.load_vae_decoder(ckpt, CFG.vae)
    z = torch.randn(1, CFG.feat_dim, 17)
    with torch.no_grad():
        assert rel_err(ours(z), up["vae"].decode(z)) < 1e-6
    assert report["ignored"]["tensors"] == len(up["vae"].encoder.state_dict())
