"""The codebook predictors on the kernel layer (`--kernels ttsaot`, `use_predictor_kernels`): Fish `fast_ar` and
Qwen `code_predictor` run their frame over a static in-graph cache, one skinny_linear + decode_attention step per
position, and each step's logits from one normed skinny_linear (final RMSNorm + output head). Module parity with
the eager frame (codes identical, logits and embeddings within fp32 noise), the exported ops, and the Fish artifact
against its `--kernels inductor` build (tests/test_fast_ar.py)."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from ttsaot.builder.families.fish_s2_pro import FAMILY as FISH
from ttsaot.builder.families.fish_s2_pro import checkpoint as fck
from ttsaot.builder.families.fish_s2_pro import fast_ar as far
from ttsaot.builder.families.fish_s2_pro import stages as fst
from ttsaot.builder.families.fish_s2_pro.options import FishS2Options
from ttsaot.builder.families.qwen3_tts_12hz import checkpoint as qck
from ttsaot.builder.families.qwen3_tts_12hz import config as qcfg
from ttsaot.builder.families.qwen3_tts_12hz.code_predictor import CodePredictor, prune_code_predictor
from ttsaot.builder.kernels.decode_modules import KernelAttention, KernelLinear
from ttsaot.builder.passes import fuse_projections
from ttsaot.builder.predictor import random_sampling_inputs, use_predictor_kernels
from ttsaot.runtime import load

from .conftest import built_artifact, rel_err
from .kernel_fixtures import build_recording_exported_ops, exported_ops
from .test_fast_ar import CFG as FISH_TINY
from .test_fast_ar import _args, _inputs, fast_ar_fp32  # noqa: F401  (the inductor build)

QWEN_TINY = qcfg.CODE_PREDICTOR_PRESETS["tiny"]


def _pair(module: torch.nn.Module, prune) -> tuple[torch.nn.Module, torch.nn.Module, dict]:
    prune(module)
    fuse_projections(module)
    kern = copy.deepcopy(module)
    return module.eval(), kern.eval(), use_predictor_kernels(kern)


def _greedy_logits(m, hidden, first):
    with torch.no_grad():
        codes, logits, *_ = m.decode(hidden, first, lambda step, lg: lg.argmax(-1))
    return codes, logits


def test_fast_ar_frame_on_kernels_equals_eager():
    ref, kern, report = _pair(fck.init_random_fast_ar(far.FastAR(FISH_TINY, with_embedding=True), 0), fst.prune_fast_ar)
    assert report["layers"] == FISH_TINY.n_layer and isinstance(kern.layers[0].self_attn, KernelAttention)
    assert report["heads"] == 1 and isinstance(kern.output, KernelLinear)
    assert torch.equal(kern.output.weight, ref.output.weight)
    assert kern.layers[0].self_attn.rope_interleaved
    for B, seed, T in ((1, 0, None), (3, 1, 0.8), (4, 2, 0.0)):
        x = _inputs(B, seed, T)
        with torch.no_grad():
            want, got = ref(*_args(x)), kern(*_args(x))
        assert torch.equal(got[0], want[0]) and rel_err(got[1], want[1]) < 1e-5
        c_ref, l_ref = _greedy_logits(ref, x["hidden"], x["token"])
        c_got, l_got = _greedy_logits(kern, x["hidden"], x["token"])
        assert torch.equal(c_got, c_ref) and max(rel_err(b, a) for a, b in zip(l_ref, l_got)) < 1e-5


def test_code_predictor_frame_on_kernels_equals_eager():
    """head_dim 16 (the kernel's smallest; the tiny preset's 8 is refused below): q/k norm + NeoX RoPE."""
    cfg = replace(QWEN_TINY, head_dim=16)
    ref, kern, report = _pair(qck.init_random_code_predictor(CodePredictor(cfg, True), 0), prune_code_predictor)
    assert report["layers"] == cfg.num_hidden_layers and kern.model.layers[0].self_attn.q_norm is not None
    assert report["heads"] == cfg.num_code_groups - 1 and all(isinstance(h, KernelLinear) for h in kern.lm_head)
    assert set(dict(kern.named_parameters())) == set(dict(ref.named_parameters()))  # the checkpoint's names
    for B, seed in ((1, 0), (3, 1)):
        g = torch.Generator().manual_seed(seed)
        hidden = torch.randn(B, cfg.talker_hidden_size, generator=g)
        code0 = torch.randint(0, cfg.vocab_size, (B,), generator=g)
        samp = random_sampling_inputs(B, cfg.num_code_groups - 1, cfg.vocab_size, g)
        args = [hidden, code0, samp["noise"], samp["temperature"], samp["top_k"], samp["top_p"]]
        with torch.no_grad():
            want, got = ref(*args), kern(*args)
        assert torch.equal(got[0], want[0]) and rel_err(got[1], want[1]) < 1e-5
        c_ref, l_ref = _greedy_logits(ref, hidden, code0)
        c_got, l_got = _greedy_logits(kern, hidden, code0)
        assert torch.equal(c_got, c_ref) and max(rel_err(b, a) for a, b in zip(l_ref, l_got)) < 1e-5


def _source(node: torch.fx.Node) -> torch.fx.Node:
    """The node a view chain starts from (select / slice / view of it)."""
    views = {torch.ops.aten.select.int, torch.ops.aten.slice.Tensor, torch.ops.aten.view.default}
    while node.op == "call_function" and node.target in views:
        node = node.args[0]
    return node


def _frame_args(cfg, B: int) -> tuple:
    """A code predictor frame's inputs for B rows: hidden, first code, sampling noise and settings."""
    g = torch.Generator().manual_seed(B)
    samp = random_sampling_inputs(B, cfg.num_code_groups - 1, cfg.vocab_size, g)
    return (
        torch.randn(B, cfg.talker_hidden_size, generator=g),
        torch.randint(0, cfg.vocab_size, (B,), generator=g),
        *(samp[n] for n in ("noise", "temperature", "top_k", "top_p")),
    )


@pytest.mark.parametrize("B", [2, 65])
def test_frame_reads_positions_and_rope_tables_from_module_buffers(B):
    """The compiled graph recomputes an input of a user kernel it has not realized into a new buffer at each use
    (one fill kernel per layer per input on the H100): decode_attention's positions must be a row of the
    `frame_positions` buffer and its RoPE tables the module's buffers themselves, not a torch.full / an fp32 copy.
    Past the table's rows (B = 65) the frame makes its own positions, with the same codes. No call promises a settled
    cache (the frame writes it in the graph)."""
    cfg = replace(QWEN_TINY, head_dim=16)
    ref, kern, report = _pair(qck.init_random_code_predictor(CodePredictor(cfg), 0), prune_code_predictor)
    assert report["frame_positions"] == [cfg.num_code_groups, 64]
    args = _frame_args(cfg, B)
    with torch.no_grad():
        assert torch.equal(kern(*args), ref(*args))
    ep = torch.export.export(kern, args)
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    consts = {**ep.graph_signature.inputs_to_buffers, **ep.graph_signature.inputs_to_parameters}
    calls = [n for n in ep.graph.nodes if n.target == torch.ops.ttsaot.decode_attention.default]
    assert len(calls) == cfg.num_hidden_layers * cfg.num_code_groups
    # the frame writes (and zeroes) its cache in the graph: no call may promise a settled one (cache_settled)
    settled = [a.name for a in torch.ops.ttsaot.decode_attention.default._schema.arguments].index("cache_settled")
    assert not any(len(n.args) > settled and n.args[settled] for n in calls)
    for n in calls:
        positions, cos, sin = _source(n.args[1]), n.args[6], n.args[7]
        if B <= 64:
            assert consts.get(positions.name, "").endswith("self_attn.frame_positions"), positions
        else:
            assert positions.target == torch.ops.aten.full.default
        assert consts.get(cos.name) == "rope_cos" and consts.get(sin.name) == "rope_sin" and cos.name in placeholders


@pytest.mark.parametrize("B", [2, 3])
def test_fused_qkv_attention_switch_routes_the_steps_that_fit(B, monkeypatch):
    """TTSAOT_QKV_ATTENTION=1: a frame of ≤ 2 rows traces one `qkv_attention` per layer and position in place of
    its qkv skinny_linear + decode_attention (3 rows: the two ops as before), reading the same position rows and
    RoPE buffers, with the eager frame's codes."""
    monkeypatch.setenv("TTSAOT_QKV_ATTENTION", "1")
    cfg = replace(QWEN_TINY, head_dim=16)
    ref, kern, report = _pair(qck.init_random_code_predictor(CodePredictor(cfg), 0), prune_code_predictor)
    assert "ttsaot::qkv_attention" in report["ops"]
    args = _frame_args(cfg, B)
    with torch.no_grad():
        want, got = ref(*args), kern(*args)
    assert torch.equal(got[0], want[0]) and rel_err(got[1], want[1]) < 1e-5
    ep = torch.export.export(kern, args)
    consts = {**ep.graph_signature.inputs_to_buffers, **ep.graph_signature.inputs_to_parameters}
    fused = [n for n in ep.graph.nodes if n.target == torch.ops.ttsaot.qkv_attention.default]
    plain = [n for n in ep.graph.nodes if n.target == torch.ops.ttsaot.decode_attention.default]
    steps = cfg.num_hidden_layers * cfg.num_code_groups
    assert (len(fused), len(plain)) == ((steps, 0) if B <= 2 else (0, steps))
    for n in fused:
        assert consts.get(_source(n.args[5]).name, "").endswith("self_attn.frame_positions")
        assert consts.get(n.args[10].name) == "rope_cos" and consts.get(n.args[11].name) == "rope_sin"


def test_head_dims_the_kernel_refuses_leave_the_stage_eager():
    m = qck.init_random_code_predictor(CodePredictor(QWEN_TINY), 0)  # head_dim 8
    report = use_predictor_kernels(m)
    assert report["layers"] == 0 and "skipped" in report
    assert not isinstance(m.model.layers[0].self_attn, KernelAttention)
    assert not any(isinstance(h, KernelLinear) for h in m.lm_head)  # the heads stay with their blocks


@pytest.fixture(scope="module")
def fast_ar_kernels():
    def build(root):
        opts = FishS2Options(dtype=torch.float32, batch_buckets=(4,), fast_ar_with_embedding=True, kernels="ttsaot")
        return build_recording_exported_ops(FISH.name, FISH.specs(opts, ["fast_ar"]), root)

    path = built_artifact("fish-fast-ar-fp32-ttsaot", build)
    return path, exported_ops(path)


def test_fast_ar_artifact_on_kernels_matches_the_inductor_build(fast_ar_kernels, fast_ar_fp32):  # noqa: F811
    path, seen = fast_ar_kernels
    positions = 2 + FISH_TINY.num_codebooks - 2  # rows 0, 1 and one per fed-back code
    (targets,) = seen
    assert targets.count("ttsaot.decode_attention.default") == positions * FISH_TINY.n_layer
    steps = FISH_TINY.num_codebooks - 1  # one normed head per sampled code
    assert targets.count("ttsaot.skinny_linear.default") == 4 * positions * FISH_TINY.n_layer + steps
    kern, ind = load(path)["fast_ar"], load(fast_ar_fp32)["fast_ar"]
    assert kern.entry.kernels == "ttsaot" and ind.entry.kernels == "inductor"
    for B, seed, T in ((1, 0, None), (4, 1, 0.8), (3, 2, 0.0), (6, 3, 1.3)):
        x = _inputs(B, seed, T)
        codes_k, emb_k = kern(*_args(x))
        codes_i, emb_i = ind(*_args(x))
        assert torch.equal(codes_k, codes_i) and rel_err(emb_k, emb_i) < 1e-4
