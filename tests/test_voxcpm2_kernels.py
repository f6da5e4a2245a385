"""VoxCPM2's step stages on the kernel layer (`--kernels ttsaot`, StageSpec.kernel_passes): the pass swaps every
decoder layer's attention / MLP block for skinny_linear + decode_attention, the exported program holds those ops
(before the CPU lowering), and the artifact's outputs AND KV caches over several decode steps match the
`--kernels inductor` build of the same weights (tests/test_voxcpm2_lm.py's tiny fp32 artifact)."""

from __future__ import annotations

import copy

import pytest
import torch

from ttsaot.builder.families.voxcpm2 import FAMILY as VOX
from ttsaot.builder.families.voxcpm2 import checkpoint as vck
from ttsaot.builder.families.voxcpm2 import lm as vlm
from ttsaot.builder.families.voxcpm2 import stages as vst
from ttsaot.builder.families.voxcpm2.options import VoxCPM2Options
from ttsaot.builder.kernels.decode_modules import KernelAttention, KernelLinear, KernelSwiGLU
from ttsaot.builder.passes import cast_to_compute_dtype, fuse_projections
from ttsaot.runtime import load

from .conftest import built_artifact, rel_err
from .kernel_fixtures import build_recording_exported_ops, exported_ops
from .test_voxcpm2_lm import MAX_LEN, PREFILL, TINY, voxcpm2_lm_tiny  # noqa: F401  (the inductor build)

STEPS = ("base_lm_step", "residual_lm_step")
TAIL_LINEARS = {
    "base_lm_step": ("fsq_layer.in_proj", "fsq_layer.out_proj", "stop_proj", "stop_head"),
    "residual_lm_step": ("fusion_concat_proj",),
}
OPS = ("ttsaot.skinny_linear.default", "ttsaot.decode_attention.default")


def _steps(name: str, module: torch.nn.Module, caches, g: torch.Generator, n: int = 4):
    """n decode steps of a step module from rows at 0, mid-cache and the scratch slot → per-step outputs."""
    cfg = TINY.lm if name.startswith("base") else TINY.residual
    pos = torch.tensor([0, 5, MAX_LEN])
    outs = []
    for _ in range(n):
        xs = [torch.randn(3, cfg.hidden_size, generator=g) for _ in range(1 if name.startswith("base") else 2)]
        with torch.no_grad():
            y = module(*xs, pos, *caches)
        outs.append(y if isinstance(y, tuple) else (y,))
        pos = (pos + 1).clamp(max=MAX_LEN)
    return outs


def _module_pair(name: str):
    orig = vck.init_random_lm(vlm.STAGE_MODULES[name](TINY, MAX_LEN), 0).eval()
    kern = copy.deepcopy(orig)
    fuse_projections(kern)
    report = vlm.use_decode_kernels(kern)
    return orig, kern, report


def _caches(name: str, dtype=torch.float32):
    cfg = TINY.lm if name.startswith("base") else TINY.residual
    g = torch.Generator().manual_seed(3)
    shape = vst.cache_shape(cfg, 3, MAX_LEN)
    return torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)


@pytest.mark.parametrize("name", STEPS)
def test_pass_swaps_every_layer_and_keeps_parameter_names(name):
    orig, kern, report = _module_pair(name)
    lm = kern.base_lm if name.startswith("base") else kern.residual_lm
    assert report["layers"] == len(lm.layers) and lm.uses_kernels
    assert all(isinstance(ly.self_attn, KernelAttention) and isinstance(ly.mlp, KernelSwiGLU) for ly in lm.layers)
    # the step's own Linears (FSQ, stop projection and head; the residual step's fusion) on skinny_linear too
    tail = TAIL_LINEARS[name]
    assert report["linears"] == len(tail)
    assert all(isinstance(kern.get_submodule(n), KernelLinear) for n in tail)
    lm_name = "base_lm" if name.startswith("base") else "residual_lm"
    assert not [n for n, m in kern.named_modules() if type(m) is torch.nn.Linear and not n.startswith(lm_name)]
    fused = copy.deepcopy(orig)
    fuse_projections(fused)
    assert sorted(kern.state_dict()) == sorted(fused.state_dict())  # same constants, shared with the prefill
    again = vlm.use_decode_kernels(kern)
    assert again["layers"] == 0 and again["linears"] == 0  # idempotent


@pytest.mark.parametrize("name", STEPS)
def test_kernel_step_module_equals_the_eager_step(name):
    """fp32: the pass changes no math (the ops run their aten references on CPU), caches included. bf16: within
    the stage's tolerance against the fp32 eager step."""
    orig, kern, _ = _module_pair(name)
    c_ref, c_kern = _caches(name), _caches(name)
    ref = _steps(name, orig, c_ref, torch.Generator().manual_seed(1))
    got = _steps(name, kern, c_kern, torch.Generator().manual_seed(1))
    for r, k in zip(ref, got):
        for a, b in zip(r, k):
            assert rel_err(b, a) < 1e-5
    assert rel_err(c_kern[0], c_ref[0]) < 1e-6 and rel_err(c_kern[1], c_ref[1]) < 1e-6
    c16 = _caches(name, torch.bfloat16)
    got16 = _steps(name, cast_to_compute_dtype(kern, torch.bfloat16), c16, torch.Generator().manual_seed(1))
    for r, k in zip(ref, got16):
        for a, b in zip(r, k):
            assert rel_err(b.float(), a) < vst.BF16_TOLERANCE[name]
    assert rel_err(c16[0].float(), c_ref[0]) < vst.BF16_TOLERANCE[name]


@pytest.mark.parametrize("name", STEPS)
def test_fp32_module_over_bf16_caches_equals_the_eager_step(name):
    """What build_stage's parity check runs for a bf16 stage: the fp32 modules on the golden inputs, whose caches
    are bf16 (k/v rounded as they are written)."""
    orig, kern, _ = _module_pair(name)
    c_ref, c_kern = _caches(name, torch.bfloat16), _caches(name, torch.bfloat16)
    ref = _steps(name, orig, c_ref, torch.Generator().manual_seed(1))
    got = _steps(name, kern, c_kern, torch.Generator().manual_seed(1))
    for r, k in zip(ref, got):
        for a, b in zip(r, k):
            assert rel_err(b, a) < 1e-5
    assert torch.equal(c_kern[0], c_ref[0]) and torch.equal(c_kern[1], c_ref[1])


@pytest.fixture(scope="module")
def kernels_build():
    def build(root):
        opts = VoxCPM2Options(
            dtype=torch.float32, batch_buckets=(2,), max_len=MAX_LEN, prefill_buckets=(PREFILL,), kernels="ttsaot"
        )
        return build_recording_exported_ops(VOX.name, VOX.specs(opts, STEPS), root)

    path = built_artifact("voxcpm2-lm-tiny-fp32-ttsaot", build)
    return path, exported_ops(path)


def test_exported_programs_hold_the_kernel_ops(kernels_build):
    path, seen = kernels_build
    assert len(seen) == len(STEPS)  # one bucket per stage
    layers = [TINY.lm.num_hidden_layers, TINY.residual.num_hidden_layers]
    for targets, n, name in zip(seen, layers, STEPS):
        assert targets.count(OPS[1]) == n and targets.count(OPS[0]) == 4 * n + len(TAIL_LINEARS[name]), targets
        assert not {"aten.linear.default", "aten.addmm.default", "aten.mm.default"} & set(targets), targets
        assert not any("index_put" in t for t in targets)  # the cache writes are inside the op
    bundle = load(path)
    assert all(bundle[s].entry.kernels == "ttsaot" for s in STEPS)
    assert bundle["base_lm_step"].entry.passes[-1]["pass"] == "use_decode_kernels"


def test_artifact_steps_and_caches_match_the_inductor_build(kernels_build, voxcpm2_lm_tiny):  # noqa: F811
    path, _ = kernels_build
    kern, ind = load(path), load(voxcpm2_lm_tiny, stages=list(STEPS))
    assert all(ind[s].entry.kernels == "inductor" for s in STEPS)
    g = torch.Generator().manual_seed(7)
    H = TINY.lm.hidden_size
    caches = {}
    for b in (kern, ind):
        caches[id(b)] = (b["base_lm_step"].new_cache(2), b["residual_lm_step"].new_cache(2))
        for c in caches[id(b)]:
            c.k.copy_(torch.randn(c.k.shape, generator=torch.Generator().manual_seed(2)))
            c.v.copy_(torch.randn(c.v.shape, generator=torch.Generator().manual_seed(4)))
            c.positions[:] = torch.tensor([0, 9])
    tol = 1e-4  # both stages' fp32 tolerance
    for _ in range(5):
        embeds, feat = torch.randn(2, H, generator=g), torch.randn(2, H, generator=g)
        outs = []
        for b in (kern, ind):
            bc, rc = caches[id(b)]
            h, lm_h, stop = b["base_lm_step"].step(embeds, cache=bc)
            r = b["residual_lm_step"].step(lm_h, feat, cache=rc)
            outs.append((h, lm_h, stop, r))
        for got, want in zip(*outs):
            assert rel_err(got, want) < tol
    for ck, ci in zip(caches[id(kern)], caches[id(ind)]):
        assert ck.positions.tolist() == ci.positions.tolist() == [5, 14]
        assert rel_err(ck.k, ci.k) < tol and rel_err(ck.v, ci.v) < tol


@pytest.mark.parametrize("name", STEPS)
def test_one_attention_workspace_per_step(name):
    """The exported step zeroes ONE decode_attention workspace and hands it to every layer (each call leaves it
    zeroed), instead of a zeroing launch per layer; and every call says the cache is settled (one step per stage
    call: the split attention may load its first cache block before its PDL wait)."""
    _, kern, _ = _module_pair(name)
    cfg = TINY.lm if name.startswith("base") else TINY.residual
    xs = tuple(torch.randn(3, cfg.hidden_size) for _ in range(1 if name.startswith("base") else 2))
    ep = torch.export.export(kern, (*xs, torch.tensor([0, 5, MAX_LEN]), *_caches(name)), strict=False)
    nodes = [n for n in ep.graph.nodes if n.op == "call_function"]
    attn = [n for n in nodes if "decode_attention" in str(n.target)]
    zeros = [n for n in nodes if "zeros" in str(n.target)]
    lm = kern.base_lm if name.startswith("base") else kern.residual_lm
    assert len(attn) == len(lm.layers)
    names = [a.name for a in torch.ops.ttsaot.decode_attention.default._schema.arguments]
    ws, settled = names.index("workspace"), names.index("cache_settled")
    assert len(zeros) == 1 and all(n.args[ws] is zeros[0] for n in attn), [n.args[ws] for n in attn]
    assert all(n.args[settled] is True for n in attn), [n.args[settled] for n in attn]
