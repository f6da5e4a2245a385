"""Fish S2 Pro DAC codec: faithful modules, strict codec.pth loading (both weight-norm styles), passes
(pruning is bit-exact, bakes), full-config parameter counts, causality of both paths. Eager only: no
compiles here."""

import copy
import re
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from ttsaot.builder.build import BuildError, build_stage
from ttsaot.builder.checkpoint import CheckpointError
from ttsaot.builder.families.fish_s2_pro import checkpoint as fck
from ttsaot.builder.families.fish_s2_pro import config as fcfg
from ttsaot.builder.families.fish_s2_pro import dac as fdac
from ttsaot.builder.families.fish_s2_pro import stages as fst
from ttsaot.builder.families.fish_s2_pro.dac import DACDecoder, DACEncoder, WindowLimitedTransformer
from ttsaot.builder.families.fish_s2_pro.options import STREAMING_DEFAULTS, FishS2Options
from ttsaot.builder.layers import BakedSnakeBeta, Snake1d
from ttsaot.builder.passes import bake_snake, bake_weight_norm, cast_to_compute_dtype

from .conftest import rel_err

TINY = fcfg.DAC_PRESETS["tiny"]
FULL = fcfg.DAC_PRESETS["full"]


def _audio(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n) / 44100.0
    tone = 0.3 * torch.sin(2 * torch.pi * 220 * t * (1 + t))
    return (tone + 0.05 * torch.randn(n, generator=g)).view(1, 1, n)


def _apply(module, passes):
    m = copy.deepcopy(module)
    reports = [p(m) for p in passes]
    return m, reports


def _stage_passes(spec):
    return spec.passes


# ------------------------------------------------------------------------------------------ counts
def test_full_config_parameter_counts_match_the_reference():
    counts = fst.count_stage_params(FULL)
    assert counts["codec"]["params"] == 391_430_530
    dec, enc = counts["dac_decoder"], counts["dac_encoder"]
    assert dec["kept"]["params"] == 184_405_090  # STAGES.md §1.4: 703.4 MiB fp32
    assert round(dec["kept"]["params"] * 4 / 2**20, 1) == 703.4
    assert dec["dropped"]["encoder"] == 76_851_328
    assert dec["dropped"]["quantizer.pre_module"] == 109_085_696
    assert dec["dropped"]["quantizer.downsample"] == 21_006_336
    assert sum(v for k, v in dec["dropped"].items() if k.endswith("in_proj")) == 82_080
    # reference 207 234 336 minus the last residual out_proj (10 240): encode never reads it
    assert enc["kept"]["params"] == 207_234_336 - 10_240
    assert enc["dropped"]["decoder"] == 54_104_162
    assert enc["dropped"]["quantizer.post_module"] == 109_085_696


def test_full_module_tree_has_the_checkpoint_names():
    with torch.device("meta"):
        sd = fdac.DAC(FULL).state_dict()
    assert len(sd) == 541 - 6  # + 3 transformers × (freqs_cis, causal_mask) buffers in codec.pth
    for k in (
        "encoder.block.0.conv.parametrizations.weight.original0",
        "encoder.block.4.block.5.layers.3.attention.wqkv.weight",
        "encoder.block.4.block.5.layers.0.attention_layer_scale.gamma",
        "quantizer.semantic_quantizer.quantizers.0.in_proj.parametrizations.weight.original1",
        "quantizer.quantizer.quantizers.8.codebook.weight",
        "quantizer.post_module.layers.7.feed_forward.w3.weight",
        "quantizer.upsample.1.1.dwconv.conv.weight",
        "quantizer.downsample.0.0.conv.weight",
        "decoder.model.1.block.1.conv.parametrizations.weight.original0",
        "decoder.model.5.alpha",
        "decoder.model.6.conv.bias",
    ):
        assert k in sd, k
    vq_v = "quantizer.semantic_quantizer.quantizers.0.in_proj.parametrizations.weight.original1"
    assert tuple(sd[vq_v].shape) == (8, 1024, 1)
    assert tuple(sd["encoder.block.4.block.5.layers.0.attention.wqkv.weight"].shape) == (3072, 1024)
    assert tuple(sd["decoder.model.1.block.1.conv.parametrizations.weight.original0"].shape) == (1536, 1, 1)


# ------------------------------------------------------------------------------------------ loading
@pytest.fixture(scope="module")
def tiny():
    return fck.init_random_dac(fdac.DAC(TINY), seed=3)


def _baked(model):
    m = copy.deepcopy(model)
    bake_weight_norm(m)
    return m.state_dict()


@pytest.mark.parametrize(
    "style",
    [
        dict(),
        dict(legacy_vq=False, with_buffers=False),
        dict(legacy_all=True, with_buffers=False),
        dict(generator_wrapper=False, with_buffers=False),
    ],
)
def test_both_weight_norm_styles_load_to_identical_baked_weights(tiny, tmp_path, style):
    p = fck.write_codec_pth(tiny, tmp_path / "codec.pth", **style)
    raw = torch.load(p, weights_only=True)
    raw = raw.get("generator", raw)
    n_legacy = sum(k.endswith(".weight_g") for k in raw)
    assert n_legacy == (0 if style.get("legacy_vq") is False else 80 if style.get("legacy_all") else 20)
    loaded, report = fck.load_codec(tmp_path, TINY)
    want, got = _baked(tiny), _baked(loaded)
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert report["ignored"]["tensors"] == (0 if style.get("with_buffers") is False else 6)


def _write_raw(tmp_path, sd):
    p = tmp_path / "codec.pth"
    torch.save({"generator": sd}, str(p))
    return p


def _raw(tiny, tmp_path):
    p = fck.write_codec_pth(tiny, tmp_path / "codec.pth")
    return torch.load(p, weights_only=True)["generator"]


def test_missing_key_is_an_error_naming_it(tiny, tmp_path):
    sd = _raw(tiny, tmp_path)
    del sd["quantizer.quantizer.quantizers.3.codebook.weight"]
    _write_raw(tmp_path, sd)
    with pytest.raises(CheckpointError, match=r"missing key 'quantizer\.quantizer\.quantizers\.3\.codebook"):
        fck.load_codec(tmp_path, TINY)


def test_unexpected_key_is_an_error_naming_it(tiny, tmp_path):
    sd = _raw(tiny, tmp_path)
    sd["decoder.model.9.alpha"] = torch.ones(1, 4, 1)
    sd["quantizer.pre_module.rel_pos"] = torch.ones(3)
    _write_raw(tmp_path, sd)
    with pytest.raises(CheckpointError, match=r"unexpected key 'decoder\.model\.9\.alpha' \(\+1 more\)"):
        fck.load_codec(tmp_path, TINY)


def test_wrong_shape_is_an_error(tiny, tmp_path):
    sd = _raw(tiny, tmp_path)
    sd["decoder.model.0.conv.bias"] = torch.zeros(3)
    _write_raw(tmp_path, sd)
    with pytest.raises(CheckpointError, match=r"decoder\.model\.0\.conv\.bias.*shape"):
        fck.load_codec(tmp_path, TINY)


def test_stored_rope_table_must_match_the_config(tiny, tmp_path):
    sd = _raw(tiny, tmp_path)
    sd["quantizer.post_module.freqs_cis"] = sd["quantizer.post_module.freqs_cis"].flip(0)
    _write_raw(tmp_path, sd)
    with pytest.raises(CheckpointError, match="post_module.freqs_cis"):
        fck.load_codec(tmp_path, TINY)


def test_checkpoint_loading_never_unpickles_code(tmp_path):
    torch.save({"generator": {"x": torch.ones(1)}, "evil": Snake1d(2)}, str(tmp_path / "codec.pth"))
    with pytest.raises(Exception, match="(?i)weights_only|unpickl"):
        fck.load_codec(tmp_path, TINY)


def test_preset_is_detected_from_the_checkpoint(tiny, tmp_path):
    fck.write_codec_pth(tiny, tmp_path / "codec.pth")
    assert fcfg.dac_config_from_checkpoint(tmp_path, prefer="full") == TINY
    fck.write_codec_pth(tiny, tmp_path / "bare" / "codec.pth", with_buffers=False, generator_wrapper=False)
    assert fcfg.dac_config_from_checkpoint(tmp_path / "bare") == TINY


# Sizes no preset has: every inferable field differs from both presets (other codebooks, strides, transformer depths
# and widths); what the tensors cannot tell (windows, RoPE base, eps, rate) at the upstream defaults.
ODD = replace(
    fcfg.DACConfig(),
    encoder_block_size=TINY.encoder_block_size,
    quantizer_block_size=512,
    encoder_dim=8,
    encoder_rates=(2, 4, 4),
    latent_dim=64,
    decoder_dim=48,
    decoder_rates=(4, 4, 2),
    encoder_transformer_layers=(0, 0, 2),
    transformer_head_dim=32,
    n_codebooks=5,
    codebook_size=64,
    semantic_codebook_size=128,
    codebook_dim=4,
    downsample_factor=(2,),
    quantizer_layers=2,
    quantizer_heads=4,
    quantizer_head_dim=16,
    quantizer_intermediate=96,
)


@pytest.mark.parametrize("with_buffers", [True, False])
def test_any_consistent_codec_builds_its_config_from_the_tensors(tmp_path, with_buffers):
    """A codec.pth matching no preset (issue 17): its sizes come from the tensors' shapes (head dims and block sizes
    from the stored RoPE tables when present), it loads strictly, and decodes / encodes."""
    model = fck.init_random_dac(fdac.DAC(ODD), seed=4)
    fck.write_codec_pth(model, tmp_path / "codec.pth", with_buffers=with_buffers)
    cfg = fcfg.dac_config_from_checkpoint(tmp_path)
    if with_buffers:
        assert cfg == ODD
    else:  # no RoPE tables stored: head dims and block sizes keep the preset-of-origin / upstream values
        assert {f: getattr(cfg, f) for f in ("encoder_rates", "decoder_rates", "n_codebooks", "latent_dim")} == {
            f: getattr(ODD, f) for f in ("encoder_rates", "decoder_rates", "n_codebooks", "latent_dim")
        }
    loaded, _ = fck.load_codec(tmp_path, cfg, DACDecoder)
    codes = fst.random_codes(cfg, 1, 4, torch.Generator().manual_seed(0))
    with torch.no_grad():
        wav = loaded(codes)
    assert wav.shape == (1, 1, 4 * cfg.samples_per_frame) and torch.isfinite(wav).all()


def test_a_sibling_codec_yaml_gives_what_the_tensors_cannot(tmp_path):
    model = fck.init_random_dac(fdac.DAC(ODD), seed=4)
    fck.write_codec_pth(model, tmp_path / "codec.pth")
    (tmp_path / "modded_dac_vq.yaml").write_text(
        "sample_rate: 22050\ntransformer_general_config:\n  rope_base: 5000\n  norm_eps: 1.0e-6\n"
        "quantizer:\n  post_module:\n    window_size: 16\n"
    )
    cfg = fcfg.dac_config_from_checkpoint(tmp_path)
    assert (cfg.sample_rate, cfg.rope_base, cfg.norm_eps, cfg.quantizer_window) == (22050, 5000.0, 1e-6, 16)
    assert cfg.n_codebooks == ODD.n_codebooks


@pytest.mark.parametrize(
    "key, shape, needle",
    [
        ("quantizer.quantizer.quantizers.3.codebook.weight", (32, 4), "quantizers.3.codebook.weight"),
        ("decoder.model.2.block.1.conv.parametrizations.weight.original1", None, "decoder.model.2.block.1.conv"),
        ("quantizer.pre_module.layers.1.feed_forward.w1.weight", (80, 64), "layers.1.feed_forward.w1.weight"),
    ],
)
def test_an_inconsistent_codec_is_refused_naming_the_key(tmp_path, key, shape, needle):
    sd = fck.init_random_dac(fdac.DAC(ODD), seed=4).state_dict()
    if shape is None:
        del sd[key]
    else:
        sd[key] = torch.zeros(shape)
    torch.save(sd, str(tmp_path / "codec.pth"))
    with pytest.raises(CheckpointError, match=re.escape(needle)):
        fcfg.dac_config_from_checkpoint(tmp_path)


# ------------------------------------------------------------------------------------------- passes
def _dec_spec():
    return fst.dac_decoder_stage(FishS2Options(frame_buckets=(8,), batch_buckets=(1,)))


def _enc_spec():
    return fst.dac_encoder_stage(FishS2Options(encoder_seconds=(1.0,)))


def test_decoder_passes_are_bit_exact_in_fp32_and_drop_the_encode_side():
    model = fck.init_random_dac(DACDecoder(TINY), seed=1)
    rewritten, reports = _apply(model, _dec_spec().passes)
    dropped = reports[0]["dropped"]
    assert {"encoder", "quantizer.pre_module", "quantizer.downsample"} <= set(dropped)
    assert not hasattr(rewritten, "encoder") and not hasattr(rewritten.quantizer, "pre_module")
    assert all(not hasattr(q, "in_proj") for q in rewritten.quantizer.quantizer.quantizers)
    assert reports[1]["baked"] > 0 and reports[2]["replaced"] == 29
    assert not any(isinstance(m, Snake1d) for m in rewritten.modules())
    g = torch.Generator().manual_seed(0)
    for B, Fr in ((1, 3), (2, 8)):
        codes = fst.random_codes(TINY, B, Fr, g)
        with torch.no_grad():
            assert torch.equal(rewritten(codes), model(codes))


def test_encoder_passes_are_bit_exact_and_drop_the_decode_side():
    model = fck.init_random_dac(DACEncoder(TINY), seed=1)
    rewritten, reports = _apply(model, _enc_spec().passes)
    assert {"decoder", "quantizer.post_module", "quantizer.upsample"} <= set(reports[0]["dropped"])
    assert not hasattr(rewritten, "decoder")
    with torch.no_grad():
        for n in (3000, 12_000):
            x = _audio(n, seed=n)
            assert torch.equal(rewritten(x), model(x))


def test_baked_snake_is_the_linear_alpha_snake():
    s = Snake1d(6)
    with torch.no_grad():
        s.alpha.copy_(torch.rand(1, 6, 1) * 2 + 0.01)
    root = torch.nn.Sequential(s)
    bake_snake(root)
    assert isinstance(root[0], BakedSnakeBeta)
    x = torch.randn(2, 6, 50) * 3
    assert torch.equal(root(x), s(x))


def test_bf16_decoder_error_is_within_its_tolerance():
    spec = fst.dac_decoder_stage(FishS2Options(frame_buckets=(8,), batch_buckets=(1,), dtype=torch.bfloat16))
    model = fck.init_random_dac(DACDecoder(TINY), seed=1)
    rewritten, _ = _apply(model, spec.passes)
    low = cast_to_compute_dtype(rewritten, torch.bfloat16)
    codes = fst.random_codes(TINY, 1, 8, torch.Generator().manual_seed(0))
    with torch.no_grad():
        out, ref = low(codes), model(codes)
    assert out.dtype == torch.float32
    assert rel_err(out, ref) < spec.tolerance  # measured ~1.5e-2 on the tiny preset


def test_encoder_stage_is_fp32_only(tmp_path):
    spec = fst.dac_encoder_stage(FishS2Options(encoder_seconds=(1.0,), dtype=torch.bfloat16))
    assert spec.fp32_only
    from ttsaot.builder.build import Reporter

    with pytest.raises(BuildError, match="fp32 only"):
        build_stage(spec, tmp_path, torch.device("cpu"), 0, Reporter())


# ------------------------------------------------------------------------------------ stage specs
def test_decoder_buckets_come_from_the_fish_streaming_config():
    spec = fst.dac_decoder_stage(FishS2Options(max_batch=4, streaming=STREAMING_DEFAULTS))
    frames = spec.plan.axes["frames"]
    assert frames == (4, 8, 16, 25, 32, 50)  # the ramp windows 12, 20, 24 pad (builder/buckets.py frame_sizes)
    assert spec.plan.axes["batch"] == (1, 2, 4)
    codes = spec.inputs[0]
    assert codes["range"]["high"] == [4096] + [1024] * 9 and codes["range"]["low"] == 0
    assert spec.metadata["sample_rate"] == 44100 and spec.metadata["samples_per_frame"] == 2048
    assert spec.metadata["streaming"]["first_chunk_frames"] == 4
    assert spec.dtype == torch.float32 and spec.kind == "codec_decoder"


def test_encoder_buckets_are_seconds_rounded_up_to_whole_frames():
    spec = fst.dac_encoder_stage(FishS2Options())
    assert spec.plan.axes["samples"] == tuple(-(-int(s * 44100) // 2048) * 2048 for s in (5, 10, 15, 30))
    assert spec.kind == "codec_encoder" and spec.inputs[0]["shape"] == [1, 1, "samples"]


def test_random_inputs_are_valid_and_nonzero():
    g = torch.Generator().manual_seed(0)
    codes = _dec_spec().make_inputs({"batch": 2, "frames": 30}, g)["codes"]
    assert codes[:, 0].max() < 4096 and codes[:, 1:].max() < 1024 and codes[:, 0].max() >= 1024
    audio = _enc_spec().make_inputs({"samples": 5000}, g)["audio"]
    assert audio.shape == (1, 1, 5000) and audio.abs().max() > 0.1


# ------------------------------------------------------------------------------------------ causality
def test_encoder_codes_of_real_frames_do_not_depend_on_right_padding():
    model = fck.init_random_dac(DACEncoder(TINY), seed=2)
    x = _audio(10_000, seed=1)
    with torch.no_grad():
        ref = model(x)
        assert ref.shape == (1, 10, 5)  # ⌈10000 / 2048⌉
        for n in (10_240, 16_384, 45_056):
            padded = model(F.pad(x, (0, n - x.shape[-1])))
            assert torch.equal(padded[..., : ref.shape[-1]], ref), n


def test_decoder_is_causal():
    model = fck.init_random_dac(DACDecoder(TINY), seed=2)
    codes = fst.random_codes(TINY, 1, 10, torch.Generator().manual_seed(1))
    with torch.no_grad():
        short, long = model(codes[..., :6]), model(codes)
    assert rel_err(long[..., : short.shape[-1]], short) < 1e-6


def test_window_limited_attention_sees_exactly_window_keys():
    tr = WindowLimitedTransformer(16, 1, 2, 8, 32, window=4, block_size=64, rope_base=1e4, eps=1e-5).eval()
    x = torch.randn(1, 16, 20)
    with torch.no_grad():
        base = tr(x)
        y = x.clone()
        y[..., 5] += 10.0  # visible to queries 5..8 only (i − 4 < 5 ≤ i)
        changed = (tr(y) - base).abs().amax(dim=1)[0] > 0
    assert changed.nonzero().flatten().tolist() == [5, 6, 7, 8]


# ------------------------------------------------------------------------------- golden near-ties
def test_encoder_golden_allows_a_frame_to_leave_only_at_a_quantizer_near_tie():
    """The tiny encoder's 2-second golden input has one quantizer choice fp32 does not decide (a distance gap of
    ~1e-6 at frame 32's semantic code): fp64 eager takes the other entry there, and the frame's nine residual
    codes change with it, as the H200 package did (bench/results/nvidia-h200/probes/gpu_suite_cpu/ run 8). The
    stage's margins mark that choice, and verify's rule allows exactly that frame to leave."""
    from ttsaot.runtime.verify import compare_decided

    spec = fst.dac_encoder_stage(FishS2Options(encoder_seconds=(1.0, 2.0)))
    module, _ = _apply(spec.make_module().eval(), spec.passes)
    x = spec.make_inputs({"samples": 90112}, torch.Generator().manual_seed(0))
    margin = spec.reference_margins(module, x)["codes"]
    with torch.no_grad():
        fp32 = module(x["audio"])
        fp64 = copy.deepcopy(module).double()(x["audio"].double())
    assert margin.shape == fp32.shape and bool((margin >= 0).all())
    differ = fp64 != fp32
    frames = differ[0].any(dim=0).nonzero().flatten().tolist()
    assert len(frames) == 1 and margin[0, 0, frames[0]] < spec.tolerance  # one frame, at its first code
    _, mismatches, _, ok, near = compare_decided(fp64, fp32, margin, spec.tolerance)
    assert ok and mismatches == 0 and near.nonzero().flatten().tolist() == frames  # one code row per frame
    decided = torch.full_like(margin, float("inf"))  # without the near-tie, the same codes are a mismatch
    assert not compare_decided(fp64, fp32, decided, spec.tolerance)[3]
    other = fp64.clone()
    other[0, 0, frames[0] - 1] += 1  # a decided frame that differs stays a mismatch
    assert not compare_decided(other, fp32, margin, spec.tolerance)[3]


def test_code_rows_are_frames_of_an_encoders_codes_and_a_predictors_rows_as_they_are():
    from ttsaot.runtime.verify import code_rows

    codes = torch.arange(2 * 3 * 4).view(2, 3, 4)  # [B, codebooks, frames]
    rows = code_rows(codes)
    assert rows.shape == (8, 3) and rows[0].tolist() == [0, 4, 8] and rows[5].tolist() == [13, 17, 21]
    draws = torch.arange(6).view(2, 3)
    assert code_rows(draws) is draws
