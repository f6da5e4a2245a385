"""VoxCPM2 LM stages: faithful modules (parameter counts, static-cache step == full sequence, fusion), strict
checkpoint loading, and the built tiny artifact through the runtime (prefill + step dataflow vs eager, in-place
cache mutation, idle rows, position overflow, cache sharing, golden verify)."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch

from ttsaot.builder.checkpoint import CheckpointError
from ttsaot.builder.families.voxcpm2 import FAMILY as VOX
from ttsaot.builder.families.voxcpm2 import checkpoint as vck
from ttsaot.builder.families.voxcpm2 import config as vcfg
from ttsaot.builder.families.voxcpm2 import lm as vlm
from ttsaot.builder.families.voxcpm2 import stages as vst
from ttsaot.builder.families.voxcpm2.options import VoxCPM2Options
from ttsaot.builder.passes import count_parameters, fuse_projections
from ttsaot.runtime import InputRangeError, InputShapeError, load
from ttsaot.runtime.lm import KVCache, LMPrefillStage, LMStepStage
from ttsaot.runtime.verify import verify_bundle

from .conftest import built_artifact, rel_err

TINY = vcfg.LM_PRESETS["tiny"]
H = TINY.lm.hidden_size
MAX_LEN = 16  # artifact: batch bucket 2, prefill bucket 8, fp32
PREFILL = 8


def _numel(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.state_dict().values())


# ------------------------------------------------------------------------------------------ modules
def test_full_config_parameter_counts_match_the_checkpoint():
    """STAGES.md §3.1 [verified]: base_lm layers+norm 1 321 322 496, embed 150 421 504, residual 377 522 176."""
    cfg = vcfg.LM_PRESETS["full"]
    with torch.device("meta"):
        step = vlm.BaseLMStep(cfg, 4096)
        res = vlm.ResidualLMStep(cfg, 4096)
        pre = vlm.BaseLMPrefill(cfg, 4096)
    assert _numel(step.base_lm) == 1_321_322_496
    assert _numel(pre.base_lm.embed_tokens) == 150_421_504
    assert _numel(res.residual_lm) == 377_522_176
    assert _numel(step.fsq_layer) == 2_099_712
    assert _numel(step.stop_proj) == 4_196_352 and _numel(step.stop_head) == 4_096
    assert _numel(res.fusion_concat_proj) == 8_390_656
    assert not hasattr(step.base_lm, "embed_tokens")  # the step never carries the 574 MiB table
    assert res.residual_lm.rope is None  # residual LM: no RoPE
    assert cfg.lm.head_dim == 128 and cfg.lm.rope_factors()[1] == 1.0


@pytest.mark.parametrize("lm", ["base", "residual"])
@torch.no_grad()
def test_static_cache_steps_equal_the_full_sequence(lm):
    cfg = TINY.lm if lm == "base" else TINY.residual
    model = vck.init_random_lm(vlm.MiniCPM4(cfg, MAX_LEN + 1), seed=1)
    fused = copy.deepcopy(model)
    fuse_projections(fused)
    assert not hasattr(fused.layers[0].self_attn, "q_proj") and fused.layers[0].mlp.gate_up_proj is not None
    B, T = 3, 11
    x = torch.randn(B, T, H, generator=torch.Generator().manual_seed(0))
    ref, _ = model.forward_seq(x)
    for m in (model, fused):
        shape = vst.cache_shape(cfg, B, MAX_LEN)
        kc, vc = torch.zeros(shape), torch.zeros(shape)
        lengths = torch.tensor([4, 2, 6])
        h = m.prefill(x[:, :6], lengths, kc, vc)
        for b in range(B):
            assert rel_err(h[b, : lengths[b]], ref[b, : lengths[b]]) < 1e-5
        pos = lengths.clone()
        for _ in range(4):  # rows advance from different positions
            out = m.forward_step(x[torch.arange(B), pos], pos, kc, vc)
            for b in range(B):
                assert rel_err(out[b], ref[b, pos[b]]) < 1e-5
            pos += 1


@torch.no_grad()
def test_idle_rows_write_only_the_scratch_slot():
    model = vck.init_random_lm(vlm.MiniCPM4(TINY.lm, MAX_LEN + 1), seed=2)
    shape = vst.cache_shape(TINY.lm, 2, MAX_LEN)
    kc, vc = torch.randn(shape), torch.randn(shape)
    k0, v0 = kc.clone(), vc.clone()
    model.forward_step(torch.randn(2, H), torch.tensor([3, MAX_LEN]), kc, vc)
    for c, c0 in ((kc, k0), (vc, v0)):
        changed = (c != c0).any(-1).any(2)  # [layers, batch, slot]
        assert changed[:, 0, 3].all() and changed[:, 1, MAX_LEN].all()
        assert changed.sum() == 2 * TINY.lm.num_hidden_layers
    # prefill: row 1 with length 0 only touches the scratch slot
    kc = torch.randn(shape)
    k0 = kc.clone()
    model.prefill(torch.randn(2, 5, H), torch.tensor([5, 0]), kc, vc)
    changed = (kc != k0).any(-1).any(2)
    assert changed[:, 0, :5].all() and not changed[:, 0, 5:].any()
    assert not changed[:, 1, :MAX_LEN].any()


@torch.no_grad()
def test_mup_flag_is_honoured():
    cfg = replace(TINY.lm, use_mup=True)
    a = vck.init_random_lm(vlm.MiniCPM4(TINY.lm, 9), seed=0)
    b = vck.init_random_lm(vlm.MiniCPM4(cfg, 9), seed=0)
    assert b.layers[0].branch_scale == pytest.approx(cfg.scale_depth / cfg.num_hidden_layers**0.5)
    x = torch.randn(1, 4, H)
    assert rel_err(a.forward_seq(x)[0], b.forward_seq(x)[0]) > 1e-3


def test_random_init_is_keyed_by_name_across_stage_modules():
    step = vck.init_random_lm(vlm.BaseLMStep(TINY, MAX_LEN), seed=5).state_dict()
    pre = vck.init_random_lm(vlm.BaseLMPrefill(TINY, MAX_LEN), seed=5).state_dict()
    common = set(step) & set(pre)
    assert len(common) > 20 and all(torch.equal(step[k], pre[k]) for k in common)


def test_config_json_round_trip():
    d = vcfg.LM_PRESETS["full"].to_json()
    assert d["lm_config"]["rope_scaling"]["type"] == "longrope"
    assert vcfg.VoxCPM2LMConfig.from_json(d) == vcfg.LM_PRESETS["full"]


# --------------------------------------------------------------------------------------- checkpoint
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("voxcpm2_ckpt")
    full = vck.init_random_lm(vlm.VoxCPM2LM(TINY, MAX_LEN), seed=7)
    # an audio-side tensor as the real file has (never read by the LM stages)
    vck.write_lm_checkpoint(full, out, extra={"feat_encoder.special_token": torch.randn(1, 1, 1, 8)})
    return out, full


def test_strict_loading_from_the_real_layout(checkpoint):
    path, full = checkpoint
    assert vcfg.lm_config_from_checkpoint(path) == TINY
    sd = full.state_dict()
    for name in vst.LM_STAGES:
        m, rep = vck.load_lm_stage_module(name, path, TINY, MAX_LEN)
        for k, v in m.state_dict().items():
            assert torch.equal(v, sd[k]), (name, k)
        assert rep["ignored"]["tensors"] >= 1 and not rep["unknown"]
        dropped = set(rep["dropped"])
        assert dropped == ({"base_lm.embed_tokens.weight"} if name == "base_lm_step" else set())


def test_loading_refuses_unknown_and_missing_keys(checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    path, _ = checkpoint
    sd = load_file(str(path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    save_file({**sd, "mystery.weight": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="mystery.weight"):
        vck.load_lm_stage_module("base_lm_step", tmp_path, TINY, MAX_LEN)
    save_file({k: v for k, v in sd.items() if k != "residual_lm.norm.weight"}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="residual_lm.norm.weight"):
        vck.load_lm_stage_module("residual_lm_step", tmp_path, TINY, MAX_LEN)


def test_stage_specs_from_checkpoint_report_and_options(checkpoint):
    path, _ = checkpoint
    opts = VoxCPM2Options(checkpoint=str(path), max_len=MAX_LEN, prefill_buckets=(PREFILL,), batch_buckets=(2,))
    specs = VOX.specs(opts, vst.LM_STAGES)
    assert [s.name for s in specs] == list(vst.LM_STAGES)
    step = specs[1]
    m = step.make_module()
    assert step.checkpoint_report["sha256"] and "base_lm.embed_tokens.weight" in step.checkpoint_report["dropped"]
    assert count_parameters(m)["params"] == _numel(m)
    with pytest.raises(ValueError, match="prefill bucket"):
        VOX.specs(replace(opts, prefill_buckets=(32,)), vst.LM_STAGES)


# ----------------------------------------------------------------------------------------- artifact
@pytest.fixture(scope="session")
def voxcpm2_lm_tiny():
    from ttsaot.builder.build import build_family

    def build(root):
        opts = VoxCPM2Options(dtype=torch.float32, batch_buckets=(2,), max_len=MAX_LEN, prefill_buckets=(PREFILL,))
        # the golden cases are re-run in-process by test_manifest_and_golden_verify
        return build_family(VOX.name, VOX.specs(opts, vst.LM_STAGES), root, "cpu", verify_in_subprocess=False).path

    return built_artifact("voxcpm2-lm-tiny-fp32", build)


@pytest.fixture(scope="module")
def bundle(voxcpm2_lm_tiny):
    return load(voxcpm2_lm_tiny)


@pytest.fixture(scope="module")
def eager():
    return vck.init_random_lm(vlm.VoxCPM2LM(TINY, MAX_LEN), seed=0)  # the weights the artifact was built from


@torch.no_grad()
def _reference(eager, tok, tmask, fe, fmask, steps):
    """VoxCPM2Model._inference's LM dataflow, on the FULL sequence (no caches): prompt then one token per step."""
    base, res = eager.base_lm, eager.residual_lm
    P = tok.shape[1]
    x = tmask[..., None] * base.embed_tokens(tok) + fmask[..., None] * fe
    h, _ = base.forward_seq(torch.cat([x, steps], 1))
    lm = torch.cat(
        [eager.fsq_layer(h[:, :P]) * fmask[..., None] + h[:, :P] * tmask[..., None], eager.fsq_layer(h[:, P:])], 1
    )
    rin = torch.cat([torch.cat([lm[:, :P], fmask[..., None] * fe], -1), torch.cat([lm[:, P:], steps], -1)], 1)
    r, _ = res.forward_seq(eager.fusion_concat_proj(rin))
    stop = eager.stop_head(torch.nn.functional.silu(eager.stop_proj(lm)))
    return h, lm, r, stop


def test_request_through_artifacts_equals_eager_full_sequence(bundle, eager):
    """Prefill both LMs (prompt lengths 8 and 5, bucket 8) then 6 decode steps of both, all on artifacts."""
    bp, bs = bundle["base_lm_prefill"], bundle["base_lm_step"]
    rp, rs = bundle["residual_lm_prefill"], bundle["residual_lm_step"]
    assert isinstance(bs, LMStepStage) and isinstance(bp, LMPrefillStage)
    g = torch.Generator().manual_seed(11)
    lengths, N = [8, 5], 6
    tok = torch.randint(0, TINY.lm.vocab_size, (2, PREFILL), generator=g)
    fmask = torch.zeros(2, PREFILL)
    fmask[:, 2:4] = 1.0  # reference-audio patches inside the prompt
    tmask = 1.0 - fmask
    fe = torch.randn(2, PREFILL, H, generator=g)
    steps = torch.randn(2, N, H, generator=g)
    base_cache, res_cache = bs.cache(2), rs.cache(2)
    ptrs = (base_cache.k.data_ptr(), base_cache.v.data_ptr(), res_cache.k.data_ptr())

    lm_seq = bp.prefill(tok, tmask, fe, fmask, lengths=lengths, cache=base_cache)
    r_seq = rp.prefill(lm_seq, fe, fmask, lengths=lengths, cache=res_cache)
    assert base_cache.positions.tolist() == lengths == res_cache.positions.tolist()
    for b, n in enumerate(lengths):
        h, lm, r, stop = _reference(
            eager, tok[b : b + 1, :n], tmask[b : b + 1, :n], fe[b : b + 1, :n], fmask[b : b + 1, :n], steps[b : b + 1]
        )
        assert rel_err(lm_seq[b, :n], lm[0, :n]) < 1e-4
        assert rel_err(r_seq[b, :n], r[0, :n]) < 1e-4
        row_ref = (h[0, n:], lm[0, n:], r[0, n:], stop[0, n:])
        setattr(test_request_through_artifacts_equals_eager_full_sequence, f"ref{b}", row_ref)
    got = {k: [] for k in ("h", "lm", "r", "stop")}
    for i in range(N):
        h, lm, stop = bs.step(steps[:, i], cache=base_cache)
        r = rs.step(lm, steps[:, i], cache=res_cache)
        for k, v in zip(got, (h, lm, r, stop)):
            got[k].append(v)
    assert base_cache.positions.tolist() == [n + N for n in lengths]
    for b in range(2):
        ref = getattr(test_request_through_artifacts_equals_eager_full_sequence, f"ref{b}")
        for k, want in zip(got, ref):
            out = torch.stack([t[b] for t in got[k]])
            assert rel_err(out, want) < 1e-4, (b, k, rel_err(out, want))
    # the caches were written in place: same storage as allocated, no per-step copy handed back
    assert (base_cache.k.data_ptr(), base_cache.v.data_ptr(), res_cache.k.data_ptr()) == ptrs


def test_step_writes_only_its_row_slot_in_place(bundle):
    stage = bundle["base_lm_step"]
    cache = stage.new_cache(1)
    assert cache.batch == 2 and tuple(cache.k.shape) == tuple(vst.cache_shape(TINY.lm, 2, MAX_LEN))
    cache.k.normal_()
    cache.positions[:] = torch.tensor([3, 9])
    before = cache.k.clone()
    ptr = cache.k.data_ptr()
    stage.step(torch.randn(1, H), cache=cache, rows=[1])  # row 0 idle → scratch slot
    changed = (cache.k != before).any(-1).any(2)
    assert cache.k.data_ptr() == ptr
    assert changed[:, 1, 9].all() and changed[:, 0, MAX_LEN].all()
    assert changed.sum() == 2 * TINY.lm.num_hidden_layers
    assert cache.positions.tolist() == [3, 10]


def test_position_overflow_is_a_typed_error(bundle):
    stage = bundle["residual_lm_step"]
    cache = stage.new_cache(2)
    cache.positions[:] = torch.tensor([MAX_LEN - 1, 0])
    x = torch.randn(2, H)
    stage.step(x, x, cache=cache)
    snapshot = cache.k.clone()
    with pytest.raises(InputRangeError, match="max_len=16"):
        stage.step(x, x, cache=cache)
    assert torch.equal(cache.k, snapshot) and cache.positions.tolist() == [MAX_LEN, 1]
    stage.step(x[1:], x[1:], cache=cache, rows=[1])  # the other row still steps
    cache.reset([0])
    assert cache.positions.tolist() == [0, 2]
    with pytest.raises(InputRangeError):
        bundle["base_lm_prefill"].prefill(
            torch.zeros(1, 4, dtype=torch.long),
            torch.ones(1, 4),
            torch.zeros(1, 4, H),
            torch.zeros(1, 4),
            lengths=[5],
            cache=bundle["base_lm_step"].new_cache(2),
        )


def test_caches_are_checked_against_the_stage(bundle):
    with pytest.raises(InputShapeError, match="does not fit"):
        bundle["base_lm_step"].step(torch.randn(2, H), cache=bundle["residual_lm_step"].new_cache(2))
    with pytest.raises(InputShapeError, match="exceeds the largest bucket"):
        bundle["base_lm_step"].new_cache(3)
    bad = KVCache.allocate(vst.cache_shape(TINY.lm, 2, MAX_LEN), torch.float32, torch.device("cpu"), MAX_LEN)
    with pytest.raises(InputShapeError, match="must have shape"):
        bundle["base_lm_step"].step(torch.randn(2, H + 1), cache=bad)


def test_manifest_and_golden_verify(bundle):
    st = bundle["base_lm_step"].entry
    assert st.kind == "lm_step" and st.metadata["max_len"] == MAX_LEN
    assert not any("embed_tokens" in k for k in st.constants)
    assert any("embed_tokens" in k for k in bundle["base_lm_prefill"].entry.constants)
    assert any("qkv_proj" in k for k in st.constants) and not any("q_proj" in k for k in st.constants)
    assert st.checkpoint["params_after"]["params"] > 0
    results = verify_bundle(bundle)
    assert results and all(r.ok for r in results), [r for r in results if not r.ok]


def test_prefill_and_step_bind_one_copy_of_the_shared_layer_weights(bundle):
    step, pre = bundle["base_lm_step"]._weights, bundle["base_lm_prefill"]._weights
    common = set(step) & set(pre)
    assert "base_lm.layers.0.self_attn.qkv_proj.weight" in common and "base_lm.embed_tokens.weight" not in common
    assert all(step[k] is pre[k] for k in common)
    rs, rp = bundle["residual_lm_step"]._weights, bundle["residual_lm_prefill"]._weights
    assert set(rs) == set(rp) and all(rs[k] is rp[k] for k in rs)


def test_step_program_reads_the_caches_in_place(voxcpm2_lm_tiny):
    """No buffer in the compiled step is as large as one layer's cache: the caches are written with index_put_
    into the inputs and read by the attention matmuls directly (no scaled / transposed / cloned copy per step)."""
    import re
    import zipfile

    for name, cfg in (("base_lm_step", TINY.lm), ("residual_lm_step", TINY.residual)):
        with zipfile.ZipFile(voxcpm2_lm_tiny / name / "b2.pt2") as z:
            src = [z.read(n).decode() for n in z.namelist() if n.endswith("wrapper.cpp")]
        if not src:
            pytest.skip("this torch packages no wrapper.cpp source")
        arrays = {
            m[0]: [int(x.rstrip("L")) for x in m[1].split(",")]
            for m in re.findall(r"int_array_(\d+)\[\] = \{([^}]*)\}", src[0])
        }
        allocs = re.findall(r"aoti_torch_empty_strided\(\d+, int_array_(\d+),", src[0])
        layer_cache = 2 * cfg.num_key_value_heads * (MAX_LEN + 1) * cfg.head_dim
        biggest = max(math.prod(arrays[a]) for a in allocs)
        assert allocs and biggest < layer_cache, (name, biggest, layer_cache)


@pytest.mark.parametrize("static", [False, True])
def test_lm_calls_run_under_the_stage_fp32_mode(voxcpm2_lm_tiny, static):
    """The LM stages' own call paths (per-cache static buffers / graphs, and the direct one) go through the runner's
    TF32 switch like every other stage: an exact-fp32 step must not run with a caller's process-wide TF32."""
    from ttsaot.runtime.stage import fp32_mode

    b = load(voxcpm2_lm_tiny, stages=["base_lm_prefill", "base_lm_step"])
    seen = []
    for st in b.values():
        st.static_buffers = static
        for runner in st._runners.values():
            runner.fp32 = fp32_mode(True, tf32=False)  # what a CUDA fp32 stage gets; CPU stages get it inactive
            run = runner.run_fn
            runner.run_fn = lambda xs, run=run: (seen.append(torch.backends.cuda.matmul.allow_tf32), run(xs))[1]
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        cache = b["base_lm_step"].new_cache(1)
        g = torch.Generator().manual_seed(5)
        b["base_lm_prefill"].prefill(
            torch.randint(0, TINY.lm.vocab_size, (1, 4), generator=g),
            torch.ones(1, 4),
            torch.zeros(1, 4, H),
            torch.zeros(1, 4),
            lengths=[4],
            cache=cache,
        )
        b["base_lm_step"].step(torch.randn(1, H, generator=g), cache=cache)
        assert torch.backends.cuda.matmul.allow_tf32 is True  # the caller's setting comes back
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert len(seen) == 2 and not any(seen)


def _step_bundle(path, static: bool) -> dict:
    """base_lm_prefill + base_lm_step, with the CUDA-graph path's static buffers (run on CPU without capture) or
    the direct path."""
    b = load(path, stages=["base_lm_prefill", "base_lm_step"])
    for st in b.values():
        st.static_buffers = static
    return b


def _prompt_and_steps(seed: int, tokens: int, steps: int) -> tuple[torch.Tensor, ...]:
    """Two prompts (tokens, text mask, feature embeddings) and `steps` step inputs [steps, 2, H]."""
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, TINY.lm.vocab_size, (2, tokens), generator=g)
    tm, fe = torch.ones(2, tokens), torch.randn(2, tokens, H, generator=g)
    return tok, tm, fe, torch.randn(steps, 2, H, generator=g)


def test_static_buffer_path_equals_direct_path(voxcpm2_lm_tiny, bundle):
    """The CUDA-graph path's machinery (per-(bucket, cache) static inputs whose cache slots ARE the cache
    tensors, scatter of rows, idle rows at the scratch slot) run on CPU without capture."""
    direct, static = bundle, _step_bundle(voxcpm2_lm_tiny, static=True)
    tok, tm, fe, x = _prompt_and_steps(seed=4, tokens=6, steps=3)
    outs = []
    for b in (direct, static):
        cache = b["base_lm_step"].new_cache(2)
        o = [b["base_lm_prefill"].prefill(tok, tm, fe, 1 - tm, lengths=[6, 3], cache=cache)]
        for i in range(3):
            o += list(b["base_lm_step"].step(x[i, :1], cache=cache, rows=[1]))
        outs.append((o, cache))
    for a, c in zip(outs[0][0], outs[1][0]):
        assert torch.equal(a, c)
    cache = outs[1][1]
    assert torch.equal(outs[0][1].k[:, :, :, :MAX_LEN], cache.k[:, :, :, :MAX_LEN])
    step = static["base_lm_step"]
    (bound,) = [gr for (_k, cid), gr in step._graphs.items() if cid == id(cache)]
    assert bound.inputs[step._cache_idx[0]] is cache.k and bound.inputs[step._cache_idx[1]] is cache.v
    prefill = static["base_lm_prefill"]  # its own input order: the cache slots are found by its own index
    (pbound,) = [gr for (_k, cid), gr in prefill._graphs.items() if cid == id(cache)]
    assert pbound.inputs[prefill._cache_idx[0]] is cache.k and pbound.inputs[prefill._cache_idx[1]] is cache.v
    assert prefill._cache_idx != step._cache_idx
    step.release(cache)
    assert not step._graphs


@pytest.mark.parametrize("static", [False, True], ids=["direct", "static_buffers"])
def test_whole_batch_step_equals_the_row_indexed_step(voxcpm2_lm_tiny, static):
    """A step of every row in order takes the runtime's whole-batch path (inputs copied in and outputs copied out
    whole, no index tensor); the same rows named in another order take the indexed scatter/gather. Same results,
    same caches, and the outputs are copies that the next step does not overwrite."""
    b = _step_bundle(voxcpm2_lm_tiny, static=static)
    tok, tm, fe, x = _prompt_and_steps(seed=7, tokens=5, steps=2)
    whole, indexed = b["base_lm_step"].new_cache(2), b["base_lm_step"].new_cache(2)
    for cache in (whole, indexed):
        b["base_lm_prefill"].prefill(tok, tm, fe, 1 - tm, lengths=[5, 2], cache=cache)
    first = b["base_lm_step"].step(x[0], cache=whole)
    kept = [o.clone() for o in first]
    second = b["base_lm_step"].step(x[1], cache=whole)
    for i, expect in enumerate((first, second)):
        got = b["base_lm_step"].step(x[i].flip(0), cache=indexed, rows=[1, 0])
        for e, o in zip(expect, got):
            assert torch.equal(e, o.flip(0))
    for a, c in zip(first, kept):
        assert torch.equal(a, c)  # the second step did not write into the first step's outputs
    assert torch.equal(whole.positions, indexed.positions)
    assert torch.equal(whole.k[:, :, :, :MAX_LEN], indexed.k[:, :, :, :MAX_LEN])
