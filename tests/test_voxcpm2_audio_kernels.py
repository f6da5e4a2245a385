"""VoxCPM2's `locdit` and `local_encoder` on the kernel layer (`--kernels ttsaot`, `use_sequence_kernels`; the
default for bf16 on CUDA): every MiniCPMLayer's projections and SwiGLU run as skinny_linear, its RoPE + attention as
one sequence_attention, every other projection as a KernelLinear. The pass keeps the parameter names; the kernel
modules, with the Triton kernels running (interpreter on CPU), equal the eager modules on odd sizes; the exported
programs hold one skinny_linear node per projection, one sequence_attention per layer and no aten linear or SDPA;
the tiny fp32 artifact built with kernels="ttsaot" (ops lowered to their aten references on CPU) matches the eager
stage within its manifest tolerance at batches that are not a power of two."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from ttsaot.builder.families.voxcpm2 import FAMILY as VOX
from ttsaot.builder.families.voxcpm2 import audio as va
from ttsaot.builder.families.voxcpm2 import checkpoint as vck
from ttsaot.builder.families.voxcpm2 import config as vcfg
from ttsaot.builder.families.voxcpm2 import stages as vst
from ttsaot.builder.kernels import decode_modules
from ttsaot.builder.kernels.decode_modules import KernelAttention, KernelLinear, KernelSwiGLU
from ttsaot.builder.kernels.sequence_attention import launch_sequence_attention, sequence_attention, supported
from ttsaot.builder.kernels.skinny_linear import launch_skinny_linear
from ttsaot.builder.passes import cast_to_compute_dtype, fuse_projections
from ttsaot.runtime import load

from .conftest import built_artifact, rel_err
from .kernel_fixtures import ON_GPU, build_recording_exported_ops, exported_ops, require_kernel_runtime
from .test_voxcpm2_audio import _opts

STAGES = ("locdit", "local_encoder")
SKINNY = "ttsaot.skinny_linear.default"
TINY = vcfg.AUDIO_PRESETS["tiny"]
# Odd sizes everywhere: widths, FFN, head_dim, feat_dim, patch (so the DiT sequence is 2 + 1 + 2·3 = 9 tokens and
# the encoder's 4); the encoder with mup residual scaling (the residual_scale epilogue).
_ODD_T = replace(TINY.dit, hidden_size=40, intermediate_size=72, head_dim=12, rope_factors=None)
ODD = replace(
    TINY,
    lm_hidden_size=56,
    feat_dim=6,
    patch_size=3,
    dit=_ODD_T,
    encoder=replace(_ODD_T, num_attention_heads=6, num_key_value_heads=3, use_mup=True),
)


def _module(name: str, cfg: vcfg.AudioConfig, n_timesteps: int = 3) -> torch.nn.Module:
    m = va.LocDiTStage(cfg, n_timesteps) if name == "locdit" else va.LocalEncoderStage(cfg)
    return vck.init_random_audio(m, vst.SEED_OFFSET[name]).eval()


def _pair(name: str, cfg: vcfg.AudioConfig) -> tuple[torch.nn.Module, torch.nn.Module, dict]:
    orig = _module(name, cfg)
    kern = copy.deepcopy(orig)
    fuse_projections(kern)
    return orig, kern, va.use_sequence_kernels(kern)


def _inputs(name: str, cfg: vcfg.AudioConfig, B: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    H, C, P = cfg.lm_hidden_size, cfg.feat_dim, cfg.patch_size
    if name == "locdit":
        return (
            torch.randn(B, H, generator=g),
            torch.randn(B, H, generator=g),
            torch.randn(B, C, P, generator=g),
            torch.randn(B, C, P, generator=g),
        )
    return (torch.randn(B, 1, P, C, generator=g),)


@pytest.mark.parametrize("name", STAGES)
def test_pass_swaps_every_layer_and_projection_and_keeps_parameter_names(name):
    orig, kern, report = _pair(name, TINY)
    layers = [m for m in kern.modules() if isinstance(m, va.MiniCPMLayer)]
    assert report["layers"] == len(layers) == 2
    assert all(isinstance(ly.self_attn, KernelAttention) and isinstance(ly.mlp, KernelSwiGLU) for ly in layers)
    # every projection outside the blocks: in/cond/out_proj, 2 timestep MLPs of 2, lm/res_to_dit | in_proj, enc_to_lm
    assert report["linears"] == (9 if name == "locdit" else 2)
    in_blocks = {id(p) for b in kern.modules() if isinstance(b, (KernelAttention, KernelSwiGLU)) for p in b.children()}
    assert all(id(m) in in_blocks for m in kern.modules() if type(m) is torch.nn.Linear)
    fused = copy.deepcopy(orig)
    fuse_projections(fused)
    assert sorted(kern.state_dict()) == sorted(fused.state_dict())  # same constants as the inductor build
    assert isinstance(kern.enc_to_lm_proj if name == "local_encoder" else kern.lm_to_dit_proj, KernelLinear)
    again = va.use_sequence_kernels(kern)
    assert again["layers"] == again["linears"] == 0  # idempotent


@pytest.mark.parametrize("name", STAGES)
def test_stage_specs_install_the_pass_for_ttsaot_only(name):
    for kernels, want in (("ttsaot", "ttsaot"), ("inductor", "inductor"), ("auto", "inductor")):
        (spec,) = VOX.specs(_opts(kernels=kernels), [name])
        assert spec.kernel_passes == [va.use_sequence_kernels]
        assert spec.kernels_on(torch.device("cpu")) == want
    assert spec.kernels_on(torch.device("cuda")) == "inductor"  # auto, fp32: Inductor's GEMMs on CUDA
    (spec,) = VOX.specs(_opts(kernels="auto", dtype=torch.bfloat16), [name])
    assert spec.kernels_on(torch.device("cuda")) == "ttsaot"  # auto, bf16: the kernel layer on CUDA
    assert spec.kernels_on(torch.device("cpu")) == "inductor"


def _interpreted(calls: list):
    """skinny_linear that always runs the Triton kernels (the interpreter on CPU), whatever the row count."""

    def run(x, *args, **kwargs):  # skinny_linear's signature
        calls.append(x.numel() // x.shape[-1])
        return launch_skinny_linear(x, *args, **kwargs, config={"BLOCK_N": 16, "BLOCK_K": 32})

    return run


def _interpreted_attention(calls: list):
    """sequence_attention on the Triton kernel (the interpreter on CPU) wherever it supports the sizes."""

    def run(qkv, cos, sin, n_heads, n_kv_heads, scale):
        hd = qkv.shape[-1] // (n_heads + 2 * n_kv_heads)
        if not supported(qkv.shape[1], hd):
            return sequence_attention(qkv, cos, sin, n_heads, n_kv_heads, scale)
        calls.append(qkv.shape[:2])
        return launch_sequence_attention(qkv, cos, sin, n_heads, n_kv_heads, scale)

    return run


# ODD: odd widths (head_dim 12: sequence_attention's aten reference); TINY: head_dim 32, the attention kernel too
@pytest.mark.parametrize("cfg", ["odd", "tiny"])
@pytest.mark.parametrize("name", STAGES)
def test_kernel_modules_on_the_triton_kernels_equal_eager(name, cfg, monkeypatch):
    """fp32, B = 3 and 1: the module with every skinny_linear on the Triton kernels (GEMV form at ≤ 2 rows,
    tensor-core tile above) and, at a power-of-2 head dim, every attention on sequence_attention's kernel, against
    the eager module; only the fp32 accumulation order differs."""
    require_kernel_runtime()
    config = ODD if cfg == "odd" else TINY
    orig, kern, _ = _pair(name, config)
    calls: list[int] = []
    attention: list = []
    monkeypatch.setattr(decode_modules, "skinny_linear", _interpreted(calls))
    monkeypatch.setattr(decode_modules, "sequence_attention", _interpreted_attention(attention))
    dev = torch.device("cuda") if ON_GPU else torch.device("cpu")
    orig, kern = orig.to(dev), kern.to(dev)
    for B, seed in ((3, 0), (1, 1)):
        xs = [x.to(dev) for x in _inputs(name, config, B, seed)]
        with torch.no_grad():
            want, got = orig(*xs), kern(*xs)
        assert rel_err(got, want) < 1e-5, (B, rel_err(got, want))
    tokens = 2 + 1 + 2 * config.patch_size if name == "locdit" else config.patch_size + 1
    per_call = 2 * (4 * 2 + 7) + 2 if name == "locdit" else 4 * 2 + 2  # 2 layers; DiT: 2 estimator calls + mu
    assert len(calls) == 2 * per_call
    assert min(calls) == 1 and max(calls) == (2 * 3 * tokens if name == "locdit" else 3 * tokens)
    sequences = [2 * 3, 2 * 1] if name == "locdit" else [3, 1]  # CFG doubles the DiT batch
    layer_calls = 2 * (2 if name == "locdit" else 1)  # layers × estimator calls per module call
    if cfg == "odd":
        assert not attention  # head_dim 12: the reference
    else:
        assert [tuple(a) for a in attention] == [(n, tokens) for n in sequences for _ in range(layer_calls)]


@pytest.mark.parametrize("name", STAGES)
def test_layers_hand_each_rmsnorm_to_the_projection_before_it(name, monkeypatch):
    """Where `norm_out_pays` (on a GPU build: the o_proj and down calls whose K the plan splits), each layer's o_proj
    returns the post-attention norm and its down the next layer's input norm (the last layer's: the final norm), so
    only the first qkv keeps its prologue: fp32 on the Triton kernels (interpreter on CPU), odd sizes, against the
    eager module; 2 such calls per layer pass."""
    require_kernel_runtime()
    orig, kern, _ = _pair(name, ODD)
    calls: list[int] = []
    handed: list[int] = []

    def norm_out(h, weight, bias, residual, residual_scale, g, eps):
        handed.append(h.numel() // h.shape[-1])
        return launch_skinny_linear(
            h, weight, bias, residual=residual, residual_scale=residual_scale, out_norm_weight=g, out_norm_eps=eps,
            config={"BLOCK_N": 16, "BLOCK_K": 32},
        )  # fmt: skip

    monkeypatch.setattr(decode_modules, "skinny_linear", _interpreted(calls))
    monkeypatch.setattr(decode_modules, "skinny_linear_norm_out", norm_out)
    monkeypatch.setattr(decode_modules, "norm_out_pays", lambda h, weight: True)
    for B, seed in ((3, 0), (1, 1)):
        xs = _inputs(name, ODD, B, seed)
        with torch.no_grad():
            want, got = orig(*xs), kern(*xs)
        assert rel_err(got, want) < 1e-5, (B, rel_err(got, want))
    layer_passes = 2 * (2 if name == "locdit" else 1)  # layers × estimator calls per module call
    assert len(handed) == 2 * 2 * layer_passes  # two batches, o_proj and down of each layer pass
    per_call = 2 * (4 * 2 + 7) + 2 if name == "locdit" else 4 * 2 + 2  # skinny_linear calls without the hand-over
    assert len(calls) == 2 * (per_call - 2 * layer_passes)


@pytest.mark.parametrize("name", STAGES)
def test_bf16_kernel_module_within_the_manifest_tolerance(name):
    """The stage as a CPU build makes it (its passes, the LocDiT's time-table fold included, then the kernel passes:
    the ops' aten references) in bf16 against the fp32 eager stage, at the tolerance the stage's manifest records.
    In bf16 eager the default LocDiT lands 0.016-0.044 from fp32 over 4 weight seeds × 4 batches, the faithful module
    and the kernel one alike (bench/results/cpu/probes/bf16_checks/)."""
    (spec,) = VOX.specs(_opts(dtype=torch.bfloat16, kernels="ttsaot"), [name])
    orig = spec.make_module().eval()
    kern = copy.deepcopy(orig)
    for p in spec.passes + spec.kernel_passes:
        p(kern)
    kern16 = cast_to_compute_dtype(kern, torch.bfloat16)
    for B, seed in ((3, 2), (5, 3)):
        x = spec.make_inputs({"batch": B}, torch.Generator().manual_seed(seed))
        xs = [x[n] for n in spec.input_names]
        with torch.no_grad():
            assert rel_err(kern16(*xs), orig(*xs)) < spec.tolerance


@pytest.fixture(scope="module")
def audio_kernels_build():
    def build(root):
        specs = VOX.specs(_opts(batch_buckets=(3,), kernels="ttsaot"), STAGES)
        return build_recording_exported_ops(VOX.name, specs, root)

    path = built_artifact("voxcpm2-audio-fp32-ttsaot", build)
    return path, exported_ops(path)


def test_exported_programs_hold_one_skinny_linear_per_projection(audio_kernels_build):
    path, seen = audio_kernels_build
    assert len(seen) == len(STAGES)  # one bucket per stage
    (spec,) = VOX.specs(_opts(), ["locdit"])
    calls = spec.metadata["estimator_calls"]
    layers = TINY.dit.num_hidden_layers
    # per estimator call: 4 per layer + in/cond/out_proj; + lm/res_to_dit once. The timestep MLPs are folded into
    # a table at build time (fold_time_embeddings), so neither their projections nor their SiLU remain.
    want = {"locdit": calls * (4 * layers + 3) + 2, "local_encoder": 4 * TINY.encoder.num_hidden_layers + 2}
    for name, targets in zip(STAGES, seen):
        assert targets.count(SKINNY) == want[name], (name, targets)
        assert not any(t.startswith(("aten.linear", "aten.addmm", "aten.mm", "aten.matmul")) for t in targets)
        # SwiGLU's SiLU·mul is the gated epilogue
        assert not any(t.startswith(("aten.silu", "aten.sin", "aten.cos")) for t in targets), (name, targets)
        attention_layers = calls * layers if name == "locdit" else TINY.encoder.num_hidden_layers
        assert targets.count("ttsaot.sequence_attention.default") == attention_layers, (name, targets)
        assert not any("scaled_dot_product" in t or "repeat_interleave" in t for t in targets)
    bundle = load(path)
    for name in STAGES:
        assert bundle[name].entry.kernels == "ttsaot"
        assert bundle[name].entry.passes[-1]["pass"] == "use_sequence_kernels"


def test_artifact_matches_eager_within_the_manifest_tolerance(audio_kernels_build):
    path, _ = audio_kernels_build
    bundle = load(path)
    eager = {s.name: s.make_module().eval() for s in VOX.specs(_opts(), STAGES)}
    for B, seed in ((3, 4), (1, 5), (2, 6)):  # the bucket (3) and padded calls
        for name in STAGES:
            xs = _inputs(name, TINY, B, seed)
            with torch.no_grad():
                want = eager[name](*xs)
            got = bundle[name](*xs)
            assert got.shape == want.shape
            assert rel_err(got, want) < bundle[name].entry.tolerance, (name, B)
