"""The codec stages on the channels-last conv kernels (`kernels="ttsaot"`, issue 15), on CPU where the ops lower to
their aten references: the kernel passes keep the stage's outputs, the exported graph holds the ttsaot conv ops
with no layout change between conv layers, and the built artifacts match the Inductor-built ones (the session
fixtures) within the stage tolerance, stream like them and keep the encoder's codes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from ttsaot.builder.families import get_family
from ttsaot.builder.kernels.conv_modules import conv_graph_report
from ttsaot.builder.kernels.window_attention import KernelWindowAttention
from ttsaot.builder.options import OptionsError
from ttsaot.runtime import load
from ttsaot.runtime.verify import verify_bundle

from . import fish_fixtures
from .conftest import built_artifact, rel_err

fish_dac_ckpt = fish_fixtures.fish_dac_ckpt
fish_dac_tiny = fish_fixtures.fish_dac_tiny

# (family, stage, family options) of the tiny preset
CASES = {
    "code2wav": ("qwen3-tts-12hz", "code2wav", {"dtype": torch.float32}),
    "code2wav_bf16": ("qwen3-tts-12hz", "code2wav", {}),
    "dac_decoder": ("fish-s2-pro", "dac_decoder", {}),
    "dac_decoder_bf16": ("fish-s2-pro", "dac_decoder", {"dac_decoder_precision": "bf16"}),
    "dac_encoder": ("fish-s2-pro", "dac_encoder", {"encoder_seconds": (1.0,)}),
    "vae_decoder": ("voxcpm2", "vae_decoder", {}),
}


def _spec(case: str, kernels: str = "ttsaot"):
    family, stage, opts = CASES[case]
    fam = get_family(family)
    return fam.specs(fam.options(kernels=kernels, **opts), [stage])[0]


def _rewrite(spec, kernel_passes: bool) -> tuple[torch.nn.Module, torch.nn.Module, list]:
    original = spec.make_module().eval()
    m = copy.deepcopy(original)
    reports = [p(m) for p in spec.passes + (spec.kernel_passes if kernel_passes else [])]
    return original, m, reports


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_pass_keeps_outputs_and_leaves_no_layout_change_between_convs(case):
    spec = _spec(case)
    assert spec.kernel_passes, "the stage wires the conv kernels"
    original, faithful, _ = _rewrite(spec, kernel_passes=False)
    m = copy.deepcopy(faithful)
    reports = [p(m) for p in spec.kernel_passes]
    rep = reports[-1]
    assert rep["pass"] == "channels_last_kernels" and len(rep["layout_changes"]) <= 2  # the two ends at most
    if case in ("dac_decoder", "dac_encoder"):  # exact fp32 (tf32x3): the transformers' linears on the kernel too
        assert rep["kernel_linears"] > 0
        assert not any(isinstance(x, torch.nn.Linear) for x in m.channels_last.chain.modules())
    elif case == "dac_decoder_bf16":
        assert rep["kernel_linears"] == 0  # bf16 linears stay on cuBLAS's tensor cores
    if case != "vae_decoder":  # every transformer layer's attention on ttsaot::window_attention, at every precision
        layers = [x for x in m.modules() if hasattr(x, "window_kernel")]
        assert layers and all(isinstance(x.window_kernel, KernelWindowAttention) for x in layers)
        assert rep["kernel_attentions"] == len(layers)
    sizes = spec.plan.buckets()[0]
    inputs = spec.make_inputs(sizes, torch.Generator().manual_seed(3))
    args = tuple(inputs[n] for n in spec.input_names)
    with torch.no_grad():
        ref, out = original(*args), m(*args)
    if ref.is_floating_point():
        assert rel_err(out, ref) < min(spec.tolerance, 1e-4)  # fp32 here: only the summation order differs
    else:
        assert torch.equal(out, ref)  # the encoder's codes
    before = conv_graph_report(torch.export.export(faithful, args))
    ep = torch.export.export(m, args)
    after = conv_graph_report(ep)
    assert not before.conv_ops  # the faithful graph: aten convs
    assert len(after.conv_ops) >= 20
    assert "conv1d_dual" in after.conv_ops and "dwconv1d" in after.conv_ops  # residual units, ConvNeXt
    attentions = [n for n in ep.graph.nodes if n.target == torch.ops.ttsaot.window_attention.default]
    assert len(attentions) == reports[-1]["kernel_attentions"]
    assert after.layout_changes == [], after.layout_changes
    assert len(after.entry) <= 1  # [B, C, T] → rows once, at the input
    if spec.name != "dac_encoder":
        assert "conv_transpose1d_dual" in after.conv_ops
        assert len(after.exit) <= 1  # the wave's [B, T, 1] → [B, 1, T] view
    else:
        # the quantizers run on the latent's rows (RVQEncodeNLC): no layout change after the last conv either
        assert after.exit == [], after.exit


def test_inductor_builds_do_not_take_the_kernel_passes():
    spec = _spec("code2wav", kernels="inductor")
    assert spec.kernels == "inductor" and spec.kernel_passes  # wired; build_stage applies them only on ttsaot


def test_dac_decoder_precision_option():
    fam = get_family("fish-s2-pro")

    def spec(**kw):
        return fam.specs(fam.options(**kw), ["dac_decoder"])[0]

    default = spec()  # options that do not say the device: the CPU default
    assert default.dtype == torch.float32 and default.metadata["numerics"]["precision"] == "fp32"
    assert default.metadata["numerics"]["chosen_by"] == "default (cpu)" and "allow_tf32" not in default.metadata
    assert spec(device="cpu").metadata["numerics"] == default.metadata["numerics"]
    # CUDA: bf16, the faster of bf16 and TF32 on an H100 and faster than upstream eager at every timed bucket
    on_cuda = spec(device="cuda")
    assert on_cuda.dtype == torch.bfloat16 and on_cuda.metadata["numerics"]["chosen_by"] == "default (cuda)"
    assert on_cuda.metadata["numerics"]["default"] == "bf16" and on_cuda.kernels_on(torch.device("cuda")) == "ttsaot"
    exact = spec(device="cuda", dac_decoder_precision="fp32")  # exact fp32 stays a build option
    assert exact.dtype == torch.float32 and exact.metadata["numerics"]["chosen_by"] == "--dac-decoder-precision"
    with pytest.raises(OptionsError, match="device must be cpu or cuda"):
        spec(device="cuda:0")
    tf32 = spec(dac_decoder_precision="tf32")
    assert tf32.dtype == torch.float32 and tf32.metadata["allow_tf32"] is True
    assert tf32.metadata["numerics"]["conv_kernels"] == "tf32"
    bf16 = spec(dac_decoder_precision="bf16")
    assert bf16.dtype == torch.bfloat16 and bf16.metadata["numerics"]["criterion"] == {"snr_db_min": 35.0}
    assert spec(dtype=torch.bfloat16).metadata["numerics"]["precision"] == "bf16"
    with pytest.raises(OptionsError, match="contradicts"):
        spec(dtype=torch.bfloat16, dac_decoder_precision="tf32")
    with pytest.raises(OptionsError, match="not one of its numerics"):
        spec(dtype=torch.float16)


def test_bf16_decoder_records_its_measured_error_vs_fp32():
    spec = _spec("dac_decoder_bf16")
    _, _, reports = _rewrite(spec, kernel_passes=False)
    measured = spec.metadata["numerics"]["measured"]
    assert [r for r in reports if r["pass"] == "measure_numerics"][0]["snr_db"] == measured["snr_db"]
    assert 30.0 < measured["snr_db"] < 80.0 and measured["rel_error"] > 0
    assert spec.metadata["numerics"]["meets_criterion"] == (measured["snr_db"] >= 35.0)


# ------------------------------------------------------------------------------------------ built artifacts
@pytest.fixture(scope="module")
def qwen_ttsaot() -> Path:
    """code2wav, fp32, kernels=ttsaot: one bucket (b1_f48) of the qwen_tiny_fp32 fixture's plan and streaming."""
    from ttsaot.builder.buckets import StreamingConfig
    from ttsaot.builder.build import build_family

    def build(root: Path) -> Path:
        fam = get_family("qwen3-tts-12hz")
        opts = fam.options(
            dtype=torch.float32,
            batch_buckets=(1,),
            frame_buckets=(48,),
            streaming=StreamingConfig(16, 32, 0, 0),
            kernels="ttsaot",
        )
        return build_family(fam.name, fam.specs(opts, ["code2wav"]), root, "cpu").path

    return built_artifact("qwen-tiny-fp32-ttsaot", build)


@pytest.mark.slow
def test_code2wav_ttsaot_artifact_matches_the_inductor_one(qwen_ttsaot, qwen_tiny_fp32):
    manifest = json.loads((qwen_ttsaot / "manifest.json").read_text())
    st = manifest["stages"]["code2wav"]
    assert st["kernels"] == "ttsaot"
    assert any(p.get("pass") == "channels_last_kernels" for p in st["passes"])
    mine, theirs = load(qwen_ttsaot)["code2wav"], load(qwen_tiny_fp32)["code2wav"]
    g = torch.Generator().manual_seed(11)
    x = torch.randint(0, 64, (1, 16, 45), generator=g)
    one_shot = mine(x)
    assert rel_err(one_shot, theirs(x)) < st["tolerance"]
    pieces = list(mine.stream(x.split(16, dim=-1)))
    assert rel_err(torch.cat(pieces, -1), one_shot) < 1e-4
    results = verify_bundle(load(qwen_ttsaot))
    assert results and all(r.ok for r in results)


@pytest.fixture(scope="module")
def fish_ttsaot(fish_dac_ckpt) -> Path:
    """Both DAC stages, kernels=ttsaot, from the fish_dac_tiny fixture's checkpoint: decoder b2_f16, encoder 1 s."""
    from ttsaot.builder.build import build_family

    def build(root: Path) -> Path:
        fam = get_family("fish-s2-pro")
        opts = fam.options(
            preset="tiny",
            checkpoint=str(fish_dac_ckpt),
            batch_buckets=(2,),
            frame_buckets=(16,),
            streaming=fish_fixtures._streaming(),
            encoder_seconds=fish_fixtures.ENCODER_SECONDS,
            kernels="ttsaot",
        )
        return build_family(fam.name, fam.specs(opts), root, "cpu").path

    return built_artifact("fish-dac-tiny-ttsaot", build)


@pytest.mark.slow
@pytest.mark.heavy
def test_fish_dac_ttsaot_artifacts_match_the_inductor_ones(fish_ttsaot, fish_dac_tiny):
    manifest = json.loads((fish_ttsaot / "manifest.json").read_text())
    assert {n: s["kernels"] for n, s in manifest["stages"].items()} == {
        "dac_decoder": "ttsaot",
        "dac_encoder": "ttsaot",
    }
    assert manifest["stages"]["dac_decoder"]["metadata"]["numerics"]["precision"] == "fp32"
    mine, theirs = load(fish_ttsaot), load(fish_dac_tiny)
    g = torch.Generator().manual_seed(5)
    codes = torch.cat(
        [torch.randint(0, 4096, (2, 1, 16), generator=g), torch.randint(0, 1024, (2, 9, 16), generator=g)], dim=1
    )
    wav = mine["dac_decoder"](codes)
    assert rel_err(wav, theirs["dac_decoder"](codes)) < manifest["stages"]["dac_decoder"]["tolerance"]
    x = codes[:1]
    pieces = list(mine["dac_decoder"].stream(x.split(4, dim=-1), left_context_frames=16))
    assert rel_err(torch.cat(pieces, -1), mine["dac_decoder"](x)) < 1e-6
    audio = torch.randn(1, 1, 30_001, generator=g) * 0.3
    assert torch.equal(mine["dac_encoder"](audio), theirs["dac_encoder"](audio))  # voice-clone codes unchanged
    results = verify_bundle(mine)
    assert results and all(r.ok for r in results)


@pytest.fixture(scope="module")
def vae_ttsaot() -> Path:
    """vae_decoder (fp32 by policy), kernels=ttsaot, one bucket (b2_f36), the serving stream pattern."""
    from ttsaot.builder.buckets import StreamingConfig
    from ttsaot.builder.build import build_family

    def build(root: Path) -> Path:
        fam = get_family("voxcpm2")
        opts = fam.options(
            batch_buckets=(2,), frame_buckets=(36,), streaming=StreamingConfig(12, 24, 0, 0), kernels="ttsaot"
        )
        return build_family(fam.name, fam.specs(opts, ["vae_decoder"]), root, "cpu").path

    return built_artifact("voxcpm2-vae-ttsaot", build)


@pytest.mark.slow
@pytest.mark.heavy
def test_vae_decoder_ttsaot_artifact_matches_eager_and_streams(vae_ttsaot):
    manifest = json.loads((vae_ttsaot / "manifest.json").read_text())
    st = manifest["stages"]["vae_decoder"]
    assert st["kernels"] == "ttsaot" and st["dtype"] == "float32"
    stage = load(vae_ttsaot)["vae_decoder"]
    eager = _spec("vae_decoder", kernels="inductor").make_module().eval()  # what the inductor build is held to
    z = torch.randn(2, 16, 48, generator=torch.Generator().manual_seed(7))
    one_shot = stage(z)
    with torch.no_grad():
        assert rel_err(one_shot, eager(z)) < st["tolerance"]
    streamed = torch.cat(list(stage.stream(z.split(12, dim=-1))), dim=-1)
    assert rel_err(streamed, one_shot) < 1e-5
    results = verify_bundle(load(vae_ttsaot))
    assert results and all(r.ok for r in results)


def test_inspect_names_the_precision_what_chose_it_and_the_measured_error():
    from ttsaot.builder.cli import _numerics_cell

    fam = get_family("fish-s2-pro")
    numerics = fam.specs(fam.options(device="cuda"), ["dac_decoder"])[0].metadata["numerics"]
    numerics = {**numerics, "measured": {"snr_db": 38.72}}  # what the build's measure_numerics pass writes
    assert _numerics_cell(numerics) == ["numerics=bf16 by default (cuda) (38.72 dB vs fp32)"]
    assert _numerics_cell({"precision": "fp32", "chosen_by": "--dac-decoder-precision"}) == [
        "numerics=fp32 by --dac-decoder-precision"
    ]
    assert _numerics_cell(None) == []


def test_code2wav_attention_on_the_kernel_only_with_as_many_kv_heads_as_query_heads():
    """`ttsaot::window_attention` takes as many k/v heads as query heads: a code2wav checkpoint with grouped k/v heads
    keeps SDPA in its kernel body (and its outputs); the presets' layers all go on the op."""
    import dataclasses

    from ttsaot.builder.families.qwen3_tts_12hz import checkpoint as qck
    from ttsaot.builder.families.qwen3_tts_12hz import code2wav as qm
    from ttsaot.builder.families.qwen3_tts_12hz import config as qcfg
    from ttsaot.builder.families.qwen3_tts_12hz.code2wav_nlc import _kernel_attention

    tiny = qcfg.CODE2WAV_PRESETS["tiny"]
    m = qck.init_random_code2wav(qm.Code2Wav(tiny), seed=3)
    assert _kernel_attention(m, "tf32x3") == tiny.num_hidden_layers
    grouped = dataclasses.replace(tiny, num_key_value_heads=tiny.num_attention_heads // 2)
    g = qck.init_random_code2wav(qm.Code2Wav(grouped), seed=3).eval()
    x = torch.randn(1, 12, grouped.latent_dim, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = g.pre_transformer(x)
        assert _kernel_attention(g, "tf32x3") == 0
        assert all(layer.window_kernel is None for layer in g.pre_transformer.layers)
        assert torch.equal(g.pre_transformer(x), ref)
