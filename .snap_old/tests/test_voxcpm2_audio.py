"""VoxCPM2 locdit / local_encoder / vae_decoder: eager modules, checkpoint loading, built artifacts (tiny,
fp32), streaming vs one-shot VAE audio, and the audio half of the decode pipeline."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from ttsaot.builder.buckets import StreamingConfig
from ttsaot.builder.checkpoint import CheckpointError
from ttsaot.builder.families.voxcpm2 import FAMILY as VOX
from ttsaot.builder.families.voxcpm2 import audio as va
from ttsaot.builder.families.voxcpm2 import checkpoint as vck
from ttsaot.builder.families.voxcpm2 import config as vcfg
from ttsaot.builder.families.voxcpm2 import stages as vst
from ttsaot.builder.families.voxcpm2 import vae as vvae
from ttsaot.builder.families.voxcpm2.options import VoxCPM2Options
from ttsaot.builder.layers import Snake1d
from ttsaot.builder.passes import bake_snake, bake_weight_norm, cast_to_compute_dtype

from .conftest import built_artifact, rel_err

CFG = vcfg.AUDIO_PRESETS["tiny"]
STREAM = StreamingConfig(12, 24, 0, 0)  # the serving pattern: 3 LM steps = 12 frames, 24 frames of context


def _opts(**kw) -> VoxCPM2Options:
    # 4 Euler steps (3 estimator calls) keep the CPU compile short; the default 10 is checked in eager/oracle
    base = dict(dtype=torch.float32, batch_buckets=(2,), frame_buckets=(36,), streaming=STREAM, n_timesteps=4)
    base.update(kw)
    return VoxCPM2Options(**base)


@pytest.fixture(scope="session")
def voxcpm2_audio_fp32():
    from ttsaot.builder.build import build_family

    def build(root):
        # the golden cases are re-run in-process by test_manifest_golden_cases_verify
        specs = VOX.specs(_opts(), vst.AUDIO_STAGES)
        return build_family(VOX.name, specs, root, "cpu", verify_in_subprocess=False).path

    return built_artifact("voxcpm2-audio-fp32", build)


def _dit_inputs(B: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    H, C, P = CFG.lm_hidden_size, CFG.feat_dim, CFG.patch_size
    return (
        torch.randn(B, H, generator=g),
        torch.randn(B, H, generator=g),
        torch.randn(B, C, P, generator=g),
        torch.randn(B, C, P, generator=g),
    )


# ------------------------------------------------------------------------------------------ eager semantics
def test_time_grid_and_step_count_in_model_dtype():
    for dtype in (torch.float32, torch.bfloat16):
        sched = va.euler_schedule(10, dtype)
        assert len(sched) == 10 and [z for *_, z in sched].count(True) == 1  # zero-init first step
        u = torch.linspace(1, 0, 11, dtype=dtype)
        grid = u + (torch.cos(torch.pi / 2 * u) - 1 + u)
        assert sched[0][0] == float(grid[0]) == 1.0
        # t advances by subtracting dt in the model dtype; every value is representable in that dtype
        for t, dt, _ in sched:
            assert float(torch.tensor(t, dtype=dtype)) == t and float(torch.tensor(dt, dtype=dtype)) == dt
    bf, f32 = va.euler_schedule(10, torch.bfloat16), va.euler_schedule(10, torch.float32)
    assert bf[1][0] != f32[1][0]  # the bf16 grid is really the bf16 one
    assert sum(1 for *_, z in va.euler_schedule(10, torch.float32) if not z) == 9


def _stepwise_solve(stage: va.LocDiTStage, lm, res, cond, noise, n: int, cfg_rate: float) -> torch.Tensor:
    """Independent step-by-step Euler loop with CFG-zero*, one estimator call per step on [cond; uncond]."""
    est = stage.feat_decoder.estimator
    mu = torch.cat([stage.lm_to_dit_proj(lm), stage.res_to_dit_proj(res)], dim=-1)
    u = torch.linspace(1, 0, n + 1)
    t_span = u + (torch.cos(torch.pi / 2 * u) - 1 + u)
    x, t, dt = noise.clone(), t_span[0], t_span[0] - t_span[1]
    B = x.shape[0]
    for step in range(1, n + 1):
        if step > max(1, int((n + 1) * 0.04)):
            out = est(
                torch.cat([x, x]),
                torch.cat([mu, torch.zeros_like(mu)]),
                t.repeat(2 * B),
                torch.cat([cond, cond]),
                torch.zeros(2 * B),
            )
            vc, vu = out[:B], out[B:]
            s = (vc * vu).flatten(1).sum(1) / (vu.flatten(1).pow(2).sum(1) + 1e-8)
            s = s[:, None, None]
            x = x - dt * (vu * s + cfg_rate * (vc - vu * s))
        t = t - dt
        if step < n:
            dt = t - t_span[step + 1]
    return x


@pytest.mark.parametrize("n,cfg_rate", [(10, 2.0), (6, 1.5)])
def test_cfm_solve_equals_stepwise_loop(n, cfg_rate):
    stage = vck.init_random_audio(va.LocDiTStage(CFG, n, cfg_rate), seed=5)
    inputs = _dit_inputs(3, seed=1)
    with torch.no_grad():
        out = stage(*inputs)
        ref = _stepwise_solve(stage, *inputs, n=n, cfg_rate=cfg_rate)
    assert out.shape == (3, CFG.feat_dim, CFG.patch_size) and out.dtype == torch.float32
    assert rel_err(out, ref) < 1e-6
    with torch.no_grad():  # different noise → different patch: the noise input is really used
        other = stage(*inputs[:3], torch.randn_like(inputs[3]))
    assert rel_err(other, out) > 0.1


def test_folded_time_embeddings_are_the_estimators_own():
    """The `fold_time_embeddings` pass: per Euler step, the table row IS the estimator's time conditioning computed
    in that dtype (bit for bit), the tables stay fp32 through the compute-dtype cast, and the folded stage computes
    the unfolded one's patch (fp32: the same ops; bf16: within a small fraction of the stage tolerance)."""
    stage = vck.init_random_audio(va.LocDiTStage(CFG, 6), seed=7)
    folded = copy.deepcopy(stage)
    report = va.fold_time_embeddings(folded)
    calls = sum(1 for *_, zero in va.euler_schedule(6, torch.float32) if not zero)
    assert report == {"pass": "fold_time_embeddings", "solvers": 1, "steps": [calls]}
    cfm = folded.feat_decoder
    for dtype in (torch.float32, torch.bfloat16):
        est = copy.deepcopy(stage.feat_decoder.estimator).to(dtype)
        steps = [(t, dt) for t, dt, zero in cfm.schedule(dtype) if not zero]
        table = cfm._time_table(dtype)
        assert table.dtype == torch.float32 and table.shape == (calls, CFG.dit.hidden_size)
        for row, (t, dt) in zip(table, steps):
            t_in = torch.full((1,), t, dtype=dtype)
            dt_in = torch.full((1,), dt if cfm.mean_mode else 0.0, dtype=dtype)
            with torch.no_grad():
                assert torch.equal(row, est.time_embedding(t_in, dt_in, dtype)[0].float())
    inputs = _dit_inputs(3, seed=8)
    with torch.no_grad():
        assert rel_err(folded(*inputs), stage(*inputs)) < 1e-6
        bf_folded = cast_to_compute_dtype(copy.deepcopy(folded), torch.bfloat16)
        assert bf_folded.feat_decoder.time_table_bfloat16.dtype == torch.float32  # keep_fp32
        bf_stage = cast_to_compute_dtype(copy.deepcopy(stage), torch.bfloat16)
        assert rel_err(bf_folded(*inputs), bf_stage(*inputs)) < 1e-2


def test_cfg_rate_and_rows_are_independent():
    stage = vck.init_random_audio(va.LocDiTStage(CFG), seed=2)
    lm, res, cond, noise = _dit_inputs(3, seed=3)
    with torch.no_grad():
        full = stage(lm, res, cond, noise)
        single = stage(lm[1:2], res[1:2], cond[1:2], noise[1:2])
        stage.feat_decoder.cfg_rate = 1.0
        no_cfg = stage(lm, res, cond, noise)
    assert rel_err(single, full[1:2]) < 1e-5  # CFG-zero* scale is per sample, not per batch
    assert rel_err(no_cfg, full) > 1e-3


def test_local_encoder_uses_token_zero_of_five():
    enc = vck.init_random_audio(va.LocalEncoderStage(CFG), seed=4)
    patch = torch.randn(2, 1, CFG.patch_size, CFG.feat_dim)
    with torch.no_grad():
        out = enc(patch)
        fe = enc.feat_encoder
        h = torch.cat([fe.special_token.expand(2, 1, 1, -1), fe.in_proj(patch)], dim=2)[:, 0]
        ref = enc.enc_to_lm_proj(fe.encoder(h)[:, 0])
    assert out.shape == (2, CFG.lm_hidden_size)
    assert rel_err(out, ref) < 1e-6
    with torch.no_grad():  # bidirectional: every patch frame reaches token 0
        p2 = patch.clone()
        p2[:, :, -1] += 1.0
        assert rel_err(enc(p2), out) > 1e-3


@pytest.mark.parametrize("stage_cls,tol", [("locdit", 8e-2), ("local_encoder", 3e-2)])
def test_bf16_error_within_manifest_tolerance(stage_cls, tol):
    """The bf16 tolerances in the stage specs are measured, not guessed: eager bf16 vs the fp32 module."""
    spec = {s.name: s for s in VOX.specs(_opts(dtype=torch.bfloat16, n_timesteps=10), vst.AUDIO_STAGES)}[stage_cls]
    assert spec.tolerance == tol
    m = spec.make_module()
    mb = cast_to_compute_dtype(copy.deepcopy(m), torch.bfloat16)
    worst = 0.0
    for seed in range(3):
        x = spec.make_inputs({"batch": 4}, torch.Generator().manual_seed(seed))
        args = [x[n] for n in spec.input_names]
        with torch.no_grad():
            worst = max(worst, rel_err(mb(*args), m(*args)))
    assert 1e-4 < worst < tol / 1.5


# ---------------------------------------------------------------------------------------------------- VAE
def test_vae_topology_and_bakes():
    m = vck.init_random_vae(vvae.AudioVAEDecoder(CFG.vae), seed=1)
    snakes = sum(isinstance(x, Snake1d) for x in m.modules())
    assert snakes == 7 * len(CFG.vae.decoder_rates) + 1
    full = vvae.AudioVAEDecoder(vcfg.VAE_PRESETS["full"])
    assert sum(isinstance(x, Snake1d) for x in full.modules()) == 43
    z = torch.randn(2, CFG.vae.latent_dim, 10)
    with torch.no_grad():
        ref = m(z)
    assert ref.shape == (2, 1, 10 * CFG.vae.samples_per_frame)
    assert 1e-3 < ref.abs().max() < 0.9  # audio-range, tanh not saturated
    baked = copy.deepcopy(m)
    reports = [bake_weight_norm(baked), bake_snake(baked), vvae.bake_sample_rate(baked)]
    assert [r.get("baked", r.get("replaced")) for r in reports] == [31, snakes, len(CFG.vae.decoder_rates)]
    assert reports[2]["bin"] == 3  # 48 kHz > 40 kHz boundary
    assert not any("parametrizations" in k or "sr_bin" in k or "embed" in k for k in baked.state_dict())
    with torch.no_grad():
        assert rel_err(baked(z), ref) < 1e-6
        assert rel_err(m(z), ref) == 0.0  # baking a copy leaves the original intact


def test_vae_receptive_field_measured():
    """The analytic bound holds exactly (float64: a latent frame further back than receptive_field_frames does
    not move a single sample), and it is tight (the frame just inside it does)."""
    m = vck.init_random_vae(vvae.AudioVAEDecoder(CFG.vae), seed=2).double()
    rf = vvae.receptive_field_frames(CFG.vae)
    spf, F0 = CFG.vae.samples_per_frame, 24
    z = torch.randn(1, CFG.vae.latent_dim, F0 + 4, dtype=torch.float64)
    with torch.no_grad():
        base = m(z)[..., F0 * spf :]

        def moved(j: int) -> float:
            zp = z.clone()
            zp[:, :, j] += 1.0
            return float((m(zp)[..., F0 * spf :] - base).abs().max())

        assert moved(F0 - rf - 1) == 0.0
        assert moved(F0 - rf + 2) > 0.0
    assert vvae.receptive_field_frames(vcfg.VAE_PRESETS["full"]) == 20


# --------------------------------------------------------------------------------------------- checkpoints
def _modules(seed: int = 0):
    return (
        vck.init_random_audio(va.LocDiTStage(CFG), seed + 1),
        vck.init_random_audio(va.LocalEncoderStage(CFG), seed + 2),
        vck.init_random_vae(vvae.AudioVAEDecoder(CFG.vae), seed + 3),
    )


@pytest.mark.parametrize("vae_format", ["safetensors", "pth"])
def test_checkpoint_roundtrip_real_layout(tmp_path, vae_format):
    dit, enc, dec = _modules()
    ckpt = vck.write_audio_checkpoint(
        tmp_path / "ckpt", CFG, dit, enc, dec, dtype=torch.bfloat16, vae_format=vae_format
    )
    assert vcfg.audio_config_from_checkpoint(ckpt) == CFG
    specs = {s.name: s for s in VOX.specs(_opts(checkpoint=str(ckpt)), vst.AUDIO_STAGES)}
    for name, ref in (("locdit", dit), ("local_encoder", enc), ("vae_decoder", dec)):
        m = specs[name].make_module()
        own, want = m.state_dict(), ref.state_dict()
        assert own.keys() == want.keys()
        for k in own:
            # model.safetensors is bf16 on disk (as the real one); the VAE file is fp32
            w = want[k] if name == "vae_decoder" else want[k].to(torch.bfloat16).float()
            assert torch.equal(own[k], w), (name, k)
        rep = specs[name].checkpoint_report
        assert rep["sha256"] and rep["ignored"]["tensors"] > 0
    from safetensors.torch import load_file

    keys = set(load_file(str(ckpt / "audiovae.safetensors"))) if vae_format == "safetensors" else set()
    if keys:
        assert "decoder.model.2.block.1.weight_v" in keys and "decoder.sr_bin_boundaries" in keys


def test_checkpoint_strictness(tmp_path):
    from safetensors.torch import load_file, save_file

    dit, enc, dec = _modules()
    ckpt = vck.write_audio_checkpoint(tmp_path / "ckpt", CFG, dit, enc, dec)
    sd = load_file(str(ckpt / "model.safetensors"))
    sd["feat_decoder.estimator.extra.weight"] = torch.zeros(2)
    save_file(sd, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match="feat_decoder.estimator.extra.weight"):
        vst.locdit_stage(_opts(checkpoint=str(ckpt))).make_module()
    vst.local_encoder_stage(_opts(checkpoint=str(ckpt))).make_module()  # other stage: unaffected
    vsd = load_file(str(ckpt / "audiovae.safetensors"))
    del vsd["decoder.model.0.weight_g"]
    save_file(vsd, str(ckpt / "audiovae.safetensors"))
    with pytest.raises(CheckpointError, match="missing key"):
        vst.vae_decoder_stage(_opts(checkpoint=str(ckpt))).make_module()


def test_stage_specs_and_options():
    specs = {s.name: s for s in VOX.specs(_opts(cfg_rate=1.5, n_timesteps=6), vst.AUDIO_STAGES)}
    assert list(specs) == list(vst.AUDIO_STAGES)
    assert specs["locdit"].metadata["estimator_calls"] == 5 and specs["locdit"].metadata["cfg_rate"] == 1.5
    v = specs["vae_decoder"]
    assert v.kind == "codec_decoder" and v.dtype == torch.float32 and v.fp32_only
    assert v.metadata["sample_rate"] == 48000 and v.metadata["samples_per_frame"] == CFG.vae.samples_per_frame
    assert v.metadata["receptive_field_frames"] <= STREAM.left_context_frames
    assert v.metadata["streaming_exact"]
    assert v.inputs == [{"name": "latents", "dtype": "float32", "shape": ["batch", CFG.feat_dim, "frames"], "pad": 0}]
    dflt = {s.name: s for s in VOX.specs(VoxCPM2Options(), vst.AUDIO_STAGES)}
    assert dflt["locdit"].dtype == torch.bfloat16 and dflt["vae_decoder"].dtype == torch.float32
    assert dflt["locdit"].metadata["estimator_calls"] == 9
    # default streaming plan: 12-frame chunks with 24 frames of context, padded into pow2 buckets
    assert {12, 36}.issubset(dflt["vae_decoder"].plan.axes["frames"])


def test_full_config_parameter_counts():
    with torch.device("meta"):
        n_dit = sum(p.numel() for p in va.LocDiTStage(vcfg.AUDIO_PRESETS["full"]).parameters())
        n_enc = sum(p.numel() for p in va.LocalEncoderStage(vcfg.AUDIO_PRESETS["full"]).parameters())
        n_vae = sum(p.numel() for p in vvae.AudioVAEDecoder(vcfg.VAE_PRESETS["full"]).parameters())
    # STAGES.md §3.1: feat_decoder 212 040 768 + lm_to_dit / res_to_dit 2 098 176 each; feat_encoder
    # 207 711 232 + enc_to_lm 2 099 200; VAE decoder 45 778 882 parameters incl. sr_cond
    assert n_dit == 212_040_768 + 2 * 2_098_176
    assert n_enc == 207_711_232 + 2_099_200
    assert n_vae == 45_778_882


# ------------------------------------------------------------------------------------------- artifacts
def test_artifact_stages_match_eager(voxcpm2_audio_fp32):
    from ttsaot.runtime import load

    bundle = load(voxcpm2_audio_fp32)
    assert bundle["vae_decoder"].kind == "codec_decoder"
    dit, enc, dec = _modules_from_build()
    for B in (1, 2):
        inputs = _dit_inputs(B, seed=10 + B)
        patch = bundle["locdit"](*inputs)
        with torch.no_grad():
            ref = dit(*inputs)
        assert rel_err(patch, ref) < 1e-4
        emb = bundle["local_encoder"](patch.transpose(1, 2).unsqueeze(1))
        with torch.no_grad():
            assert rel_err(emb, enc(patch.transpose(1, 2).unsqueeze(1))) < 1e-4
    z = torch.randn(2, CFG.feat_dim, 30)
    with torch.no_grad():
        assert rel_err(bundle["vae_decoder"](z), dec(z)) < 1e-4


def _modules_from_build():
    specs = {s.name: s for s in VOX.specs(_opts(), vst.AUDIO_STAGES)}
    return tuple(specs[n].make_module() for n in vst.AUDIO_STAGES)


def test_streamed_vae_equals_one_shot(voxcpm2_audio_fp32):
    from ttsaot.runtime import load

    st = load(voxcpm2_audio_fp32)["vae_decoder"]
    z = torch.randn(2, CFG.feat_dim, 48, generator=torch.Generator().manual_seed(7))
    one_shot = st(z)
    streamed = torch.cat(list(st.stream(z.split(12, dim=-1))), dim=-1)
    assert streamed.shape == one_shot.shape
    assert rel_err(streamed, one_shot) < 1e-5
    # the reference's 12-frame pad is shorter than the receptive field: measurably different audio
    short = torch.cat(list(st.stream(z.split(12, dim=-1), left_context_frames=4)), dim=-1)
    assert rel_err(short, one_shot) > 1e-4


def test_pipeline_audio_half(voxcpm2_audio_fp32):
    """PatchGenerator (locdit → local_encoder) on the artifact, noise from per-request generators: same
    request seed → same patch whatever the batch; equals the eager modules fed the same noise."""
    from ttsaot.runtime import load
    from ttsaot.runtime.pipelines.voxcpm2 import PatchGenerator, draw_noise

    bundle = load(voxcpm2_audio_fp32)
    pg = PatchGenerator(bundle["locdit"], bundle["local_encoder"])
    lm, res, cond, _ = _dit_inputs(2, seed=21)
    gens = [torch.Generator().manual_seed(s) for s in (100, 200)]
    patch, embed = pg(lm, res, cond, gens)
    alone, _ = pg(lm[1:], res[1:], cond[1:], [torch.Generator().manual_seed(200)])
    assert rel_err(alone, patch[1:]) < 1e-5
    noise = draw_noise(
        2, CFG.feat_dim, CFG.patch_size, torch.device("cpu"), [torch.Generator().manual_seed(s) for s in (100, 200)]
    )
    dit, enc, _ = _modules_from_build()
    with torch.no_grad():
        ref = dit(lm, res, cond, noise)
        assert rel_err(patch, ref) < 1e-4
        assert rel_err(embed, enc(ref.transpose(1, 2).unsqueeze(1))) < 1e-4
    assert math.isclose(float(noise.std()), 1.0, abs_tol=0.5)


def test_manifest_golden_cases_verify(voxcpm2_audio_fp32):
    from ttsaot.runtime import load
    from ttsaot.runtime.verify import verify_bundle

    results = verify_bundle(load(voxcpm2_audio_fp32))
    assert {r.stage for r in results} == set(vst.AUDIO_STAGES)
    assert all(r.ok for r in results), [r for r in results if not r.ok]
    assert max(r.value for r in results) < 1e-4
