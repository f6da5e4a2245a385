"""`ttsaot::decode_attention`: the Triton kernel (interpreter on CPU, compiled on a GPU) against the aten
reference (GQA ratios 1/2/4/8, head_dim 8/16/32, RoPE NeoX / interleaved / none, q/k norm, positions at 0, mid
and the scratch slot S-1, B not a power of two, several context splits merged by the last split through the
workspace tickets, which end zeroed), the cache written in place and nowhere else, one node under torch.export, the
CPU lowering of a mutating op, an AOTI CPU package writing the caller's cache in place, CPU installs without Triton.
The `gpu` tests at the end: real shapes (VoxCPM2, Fish, Qwen code_predictor), forced many-split runs reusing one
workspace, and the AOTI CUDA package re-inplacing the functionalized cache write."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from ttsaot.builder.kernels import CPU_DECOMPOSITIONS, lower_for_cpu
from ttsaot.builder.kernels.decode_attention import (
    decode_attention,
    decode_attention_reference,
    launch_decode_attention,
    plan_num_splits,
)
from ttsaot.builder.kernels.skinny_linear import skinny_linear
from ttsaot.builder.layers.rope import apply_rope_interleaved, apply_rope_neox, rope_table, rope_table_interleaved

from .conftest import rel_err
from .kernel_fixtures import DEVICE, ON_GPU, kernel_rounding, require_kernel_runtime

DA = torch.ops.ttsaot.decode_attention.default
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _kernel_runtime():
    require_kernel_runtime()


def _case(B, hq, hkv, hd, S, L, dtype, rope, qk_norm, seed=0):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, S, (B,), generator=g)
    pos[0], pos[-1] = 0, S - 1  # first position, and an idle row on the scratch slot
    if B > 2:
        pos[1] = S // 2
    t = {
        "qkv": torch.randn(B, (hq + 2 * hkv) * hd, generator=g).to(dtype),
        "positions": pos,
        "k_cache": torch.randn(L, B, hkv, S, hd, generator=g).to(dtype),
        "v_cache": torch.randn(L, B, hkv, S, hd, generator=g).to(dtype),
        "cos": None,
        "sin": None,
        "q_norm": None,
        "k_norm": None,
    }
    if rope == "neox":
        t["cos"], t["sin"] = rope_table(hd, S + 5, 10000.0)  # tables may be longer than the cache
    elif rope == "interleaved":
        t["cos"], t["sin"] = rope_table_interleaved(hd, S, 1e6, round_to=torch.bfloat16)
    if qk_norm:
        t["q_norm"] = (torch.rand(hd, generator=g) + 0.5).to(dtype)
        t["k_norm"] = (torch.rand(hd, generator=g) + 0.5).to(dtype)
    return {k: v.to(DEVICE) if v is not None else None for k, v in t.items()}


def _written_k_mirror(t, hq, hkv, hd, rope, rnd):
    """This token's k as the kernel must write it: RMSNorm (project rounding), fp32 rotation, cast back."""
    B = t["qkv"].shape[0]
    k = t["qkv"].cpu().float().view(B, hq + 2 * hkv, hd)[:, hq : hq + hkv]
    if t["k_norm"] is not None:
        rstd = 1.0 / torch.sqrt((k * k).sum(-1, keepdim=True) / hd + 1e-6)
        k = rnd(t["k_norm"].cpu().float() * rnd(k * rstd))
    if rope is not None:
        S = t["k_cache"].shape[3]
        pos = t["positions"].cpu().clamp(0, S - 1)
        c, s = t["cos"].cpu()[pos][:, None], t["sin"].cpu()[pos][:, None]
        k = rnd((apply_rope_interleaved if rope == "interleaved" else apply_rope_neox)(k, c, s))
    return k


# (B, Hq, Hkv, hd, S, L, num_splits), min_chunk = block_s = 16 so short caches still split: GQA 4 with three active
# splits at the cache end, MHA with one split, GQA 8 (VoxCPM2's ratio) with four splits planned (three active at
# S-1, two at S/2), GQA 2 at head_dim 8 (lanes padded to 16) with four; B = 3 and 5 (not powers of two).
CONFIGS = [(3, 4, 1, 32, 40, 2, 3), (5, 2, 2, 16, 33, 2, 1), (3, 16, 2, 32, 70, 2, 4), (3, 4, 2, 8, 50, 1, 4)]
VARIANTS = [(None, False), ("neox", False), ("interleaved", False), ("neox", True), (None, True)]
SMALL = dict(min_chunk=16, block_s=16, config={"num_warps": 4})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rope,qk_norm", VARIANTS, ids=[f"{r}-{'qknorm' if n else 'plain'}" for r, n in VARIANTS])
def test_kernel_matches_reference_and_writes_only_its_slots(rope, qk_norm, dtype):
    for i, (B, hq, hkv, hd, S, L, splits) in enumerate(CONFIGS):
        t = _case(B, hq, hkv, hd, S, L, dtype, rope, qk_norm, seed=i)
        kc0, vc0 = t["k_cache"].clone(), t["v_cache"].clone()
        ref_t = {**t, "k_cache": kc0.clone(), "v_cache": vc0.clone()}
        args = dict(layer=L - 1, scale=hd**-0.5, rope_interleaved=rope == "interleaved", norm_eps=1e-6)
        # every other config brings its own workspace (larger than needed); the others let the op zero one
        ws = torch.zeros(B * hkv + 3, dtype=torch.int32, device=DEVICE) if i % 2 == 0 else None
        o = launch_decode_attention(**t, **args, workspace=ws, num_splits=splits, **SMALL)
        ref = decode_attention_reference(**ref_t, **args)
        assert o.shape == (B, hq * hd) and o.dtype == dtype
        tol = 1e-5 if dtype == torch.float32 else (1e-2 if ON_GPU else 3e-2)  # CPU: truncating casts
        assert rel_err(o.cpu().float(), ref.cpu().float()) < tol, (B, hq, hkv, S, splits)
        if ws is not None:
            assert not ws.any(), "workspace not returned zeroed"

        written = torch.zeros(L, B, hkv, S, dtype=torch.bool)
        written[L - 1, torch.arange(B), :, t["positions"].cpu()] = True
        for new, old in ((t["k_cache"], kc0), (t["v_cache"], vc0)):
            assert torch.equal(new.cpu()[~written], old.cpu()[~written]), "wrote outside this step's slots"
        rows = torch.arange(B)
        pos = t["positions"].cpu()
        v_new = t["qkv"].cpu().view(B, hq + 2 * hkv, hd)[:, hq + hkv :]
        assert torch.equal(t["v_cache"].cpu()[L - 1, rows, :, pos], v_new)
        k_new = t["k_cache"].cpu()[L - 1, rows, :, pos].float()
        mirror = _written_k_mirror(t, hq, hkv, hd, rope, kernel_rounding(dtype))
        if dtype == torch.float32:
            assert rel_err(k_new, mirror) < 1e-6
        else:
            assert (k_new == mirror).float().mean().item() >= 0.99


@pytest.mark.parametrize("rope", ["neox", "interleaved"])
def test_compute_dtype_tables_equal_their_fp32_widening(rope):
    """A predictor passes its bf16 RoPE buffers as they are (no per-layer fp32 copy in the graph): kernel and
    reference widen them as they load, so the result is bit-identical to passing `.float()` of the same tables."""
    B, hq, hkv, hd, S, L, splits = CONFIGS[0]
    t = _case(B, hq, hkv, hd, S, L, torch.bfloat16, rope, True)
    narrow = {**t, "cos": t["cos"].bfloat16(), "sin": t["sin"].bfloat16()}
    wide = {**narrow, "cos": narrow["cos"].float(), "sin": narrow["sin"].float()}
    args = dict(layer=0, scale=hd**-0.5, rope_interleaved=rope == "interleaved", norm_eps=1e-6)
    outs = []
    for tabs in (narrow, wide):
        caches = {"k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
        o = launch_decode_attention(**{**tabs, **caches}, **args, num_splits=splits, **SMALL)
        ref_caches = {"k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
        ref = decode_attention_reference(**{**tabs, **ref_caches}, **args)
        outs.append((o, caches["k_cache"], ref, ref_caches["k_cache"]))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_split_count_does_not_change_the_result_and_runs_are_deterministic():
    """1..8 splits (the last active split merges up to 7 partials at S-1) agree; a repeated plan is bit-identical;
    one workspace serves every call and ends zeroed."""
    B, hq, hkv, hd, S, L = 3, 8, 2, 32, 130, 1
    t = _case(B, hq, hkv, hd, S, L, torch.float32, "neox", False)
    ws = torch.zeros(B * hkv, dtype=torch.int32, device=DEVICE)
    outs = []
    for splits in (1, 2, 8, 3, 8):
        tt = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
        outs.append(launch_decode_attention(**tt, layer=0, scale=0.1, workspace=ws, num_splits=splits, **SMALL))
        assert not ws.any()
    assert torch.equal(outs[2], outs[4])
    for o in outs[1:]:
        assert rel_err(o.cpu(), outs[0].cpu()) < 1e-6


def test_merge_of_partly_active_splits_matches_the_reference():
    """The last split merges the partials in NUM_SPLITS masked steps: rows whose positions leave 1, some and all of
    the splits active get the reference's output (an unmasked step would add the inactive splits' stale partials),
    and the workspace is zeroed after each launch. A first launch at the cache end leaves real partials in every slot
    of memory the allocator hands out again, so a step that is not masked merges them and shows."""
    B, hq, hkv, hd, S, L = 3, 8, 2, 32, 130, 1
    t = _case(B, hq, hkv, hd, S, L, torch.float32, "neox", False)
    ws = torch.zeros(B * hkv, dtype=torch.int32, device=DEVICE)
    launch = dict(layer=0, scale=0.1, num_splits=5, min_chunk=16, block_s=16)
    every = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
    every["positions"] = torch.full((B,), S - 1, device=DEVICE)  # every split active: partials in every slot
    launch_decode_attention(**every, **launch, workspace=ws, config={"num_warps": 4})
    t["positions"] = torch.tensor([10, 40, 129], device=DEVICE)  # 1, 3 and 5 of the 5 splits (16-position blocks)
    ref_t = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
    o = launch_decode_attention(**t, **launch, workspace=ws, config={"num_warps": 4})
    assert not ws.any()
    ref = decode_attention_reference(**ref_t, layer=0, scale=0.1)
    assert rel_err(o.cpu(), ref.cpu()) < 1e-5


def test_min_chunk_keeps_a_short_context_in_one_program():
    """A row whose context fits MIN_CHUNK is answered by its first split alone (no partials, no ticket) even when the
    bucket plans several; a longer row of the same launch still merges its splits."""
    B, hq, hkv, hd, S, L = 2, 4, 2, 16, 200, 1
    t = _case(B, hq, hkv, hd, S, L, torch.float32, "neox", True)
    t["positions"] = torch.tensor([40, 190], device=DEVICE)  # 41 positions < min_chunk 64; 191: 12 blocks, 3 splits
    ref_t = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
    ws = torch.zeros(B * hkv, dtype=torch.int32, device=DEVICE)
    o = launch_decode_attention(
        **t, layer=0, scale=0.25, workspace=ws, num_splits=4, min_chunk=64, block_s=16, config={"num_warps": 4}
    )
    ref = decode_attention_reference(**ref_t, layer=0, scale=0.25)
    assert rel_err(o.cpu(), ref.cpu()) < 1e-5 and not ws.any()


@pytest.mark.parametrize("rope,qk_norm", [("neox", True), ("interleaved", False)], ids=["neox-qknorm", "interleaved"])
def test_whole_cache_form_ignores_slots_past_the_position(rope, qk_norm):
    """A short cache planned as one split (the predictors' 10-17 positions) is read as one tile before the position
    is known, slot p and the slots past it too: what they hold (NaN here) must not reach the output, which equals
    the reference's and the loop form's over a clean copy; positions 0 and S-1 included, S not a power of two."""
    B, hq, hkv, hd, S, L = 4, 4, 2, 16, 17, 2
    t = _case(B, hq, hkv, hd, S, L, torch.float32, rope, qk_norm)
    t["positions"] = torch.tensor([0, 1, 9, S - 1], device=DEVICE)
    clean = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
    loop = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
    for b, p in enumerate(t["positions"].tolist()):  # slots p.. of each row, every layer
        t["k_cache"][:, b, :, p:] = float("nan")
        t["v_cache"][:, b, :, p:] = float("nan")
    args = dict(layer=1, scale=hd**-0.5, rope_interleaved=rope == "interleaved")
    o = launch_decode_attention(**t, **args, num_splits=1, config={"num_warps": 4})  # block_s 64 ≥ S: whole
    ref = decode_attention_reference(**clean, **args)
    by_loop = launch_decode_attention(**loop, **args, num_splits=1, block_s=16, config={"num_warps": 4})  # S > 16
    assert torch.isfinite(o).all()
    assert rel_err(o.cpu(), ref.cpu()) < 1e-5 and rel_err(o.cpu(), by_loop.cpu()) < 1e-6
    at = (1, torch.arange(B), slice(None), t["positions"].cpu())
    assert torch.equal(t["v_cache"].cpu()[at], clean["v_cache"].cpu()[at])  # this token's v written


def test_split_form_deals_blocks_and_ignores_slots_past_the_position(monkeypatch):
    """The split form deals the cache blocks to its splits in turn (split s: blocks s, s + n, ...), each split's first
    block loaded whatever the position, slot p and the slots past it too: what they hold (NaN here) must not reach
    the output. Rows whose positions leave 1, some and all splits active, an inactive split whose first block lies
    inside the context (MIN_CHUNK of 2 blocks), p at a block's start and at the cache end; the reference's output
    over a clean copy, this token's k/v written. `cache_settled` (the first block loaded before the PDL wait) gives
    the same bits, and TTSAOT_ATTENTION_EARLY_BLOCK=0 turns it off."""
    from ttsaot.builder.kernels.decode_attention import EARLY_BLOCK_ENV, early_block

    B, hq, hkv, hd, S, L = 5, 8, 2, 16, 97, 2
    t = _case(B, hq, hkv, hd, S, L, torch.float32, "neox", True)
    t["positions"] = torch.tensor([0, 20, 32, 50, S - 1], device=DEVICE)
    clean = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
    for b, p in enumerate(t["positions"].tolist()):
        t["k_cache"][:, b, :, p:] = float("nan")
        t["v_cache"][:, b, :, p:] = float("nan")
    ws = torch.zeros(B * hkv, dtype=torch.int32, device=DEVICE)
    args = dict(layer=1, scale=hd**-0.5, workspace=ws, num_splits=4, min_chunk=16, block_s=8, config={"num_warps": 4})
    ref = decode_attention_reference(**clean, layer=1, scale=hd**-0.5)
    outs = []
    for settled in (False, True):
        tt = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
        outs.append(launch_decode_attention(**tt, **args, cache_settled=settled))
        assert torch.isfinite(outs[-1]).all() and not ws.any()
        assert rel_err(outs[-1].cpu(), ref.cpu()) < 1e-5
        at = (1, torch.arange(B), slice(None), t["positions"].cpu())
        assert torch.equal(tt["v_cache"].cpu()[at], clean["v_cache"].cpu()[at])
    assert torch.equal(outs[0], outs[1])
    monkeypatch.delenv(EARLY_BLOCK_ENV, raising=False)
    assert early_block(True) and not early_block(False)
    monkeypatch.setenv(EARLY_BLOCK_ENV, "0")
    assert not early_block(True)


def test_cache_settled_reaches_the_split_kernel_as_early_block(monkeypatch):
    """What a traced op's body hands the split kernel (AOTInductor runs the same launcher): EARLY_BLOCK where the
    caller says the cache is settled, not otherwise, not under TTSAOT_ATTENTION_EARLY_BLOCK=0, never in the
    whole-cache form."""
    from ttsaot.builder.kernels import decode_attention_triton as kernels
    from ttsaot.builder.kernels.decode_attention import EARLY_BLOCK_ENV

    seen = []

    class Spy:
        def __getitem__(self, grid):
            return lambda *args, **meta: seen.append((meta["WHOLE"], meta["EARLY_BLOCK"]))

    monkeypatch.setattr(kernels, "decode_attention_split", {w: Spy() for w in (4, 8)})
    monkeypatch.setattr(kernels, "decode_attention_whole", {w: Spy() for w in kernels.WHOLE_WARPS})
    t = _case(2, 4, 2, 16, 200, 1, torch.float32, "neox", False)
    short = _case(2, 4, 2, 16, 12, 1, torch.float32, "neox", False)
    for env, case, splits, settled, want in (
        ("", t, 4, True, (False, True)),
        ("", t, 4, False, (False, False)),
        ("0", t, 4, True, (False, False)),
        ("", short, 1, True, (True, False)),
    ):
        monkeypatch.setenv(EARLY_BLOCK_ENV, env)
        launch_decode_attention(**case, layer=0, scale=0.25, num_splits=splits, cache_settled=settled)
        assert seen[-1] == want, (env, splits, settled)


def test_whole_form_warps_rule_and_switch(monkeypatch):
    """The whole-cache form launches the fixed-warp kernel of WHOLE_WARPS_BY_ROPE (1 warp for NeoX RoPE, 8 for
    interleaved) or of TTSAOT_WHOLE_ATTENTION_WARPS (a build-time A/B switch), with the same result; the loop form
    autotunes; a bad value is a clear error."""
    from ttsaot.builder.kernels import decode_attention_triton as kernels
    from ttsaot.builder.kernels.decode_attention import WHOLE_WARPS_ENV, whole_warps

    monkeypatch.delenv(WHOLE_WARPS_ENV, raising=False)
    rope_forms = (kernels.ROPE_NONE, kernels.ROPE_NEOX, kernels.ROPE_INTERLEAVED)
    assert tuple(whole_warps(r) for r in rope_forms) == (1, 1, 8)
    monkeypatch.setenv(WHOLE_WARPS_ENV, "3")
    with pytest.raises(ValueError, match="expected 1, 2, 4 or 8"):
        whole_warps(kernels.ROPE_NEOX)
    launched = []

    class Spy:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            launched.append(self.name)
            return self.kernel[grid] if self.kernel is not None else lambda *args, **meta: None

    whole = {w: Spy(f"whole{w}", k) for w, k in kernels.decode_attention_whole.items()}
    monkeypatch.setattr(kernels, "decode_attention_whole", whole)
    # (recorded, not run here)
    monkeypatch.setattr(kernels, "decode_attention_split", {w: Spy("split", None) for w in (4, 8)})
    B, hq, hkv, hd, S, L = 2, 4, 2, 16, 12, 1
    args = dict(layer=0, scale=hd**-0.5)
    for rope, env, want in (("neox", "2", "whole2"), ("neox", "", "whole1"), ("interleaved", "", "whole8")):
        monkeypatch.setenv(WHOLE_WARPS_ENV, env)
        t = _case(B, hq, hkv, hd, S, L, torch.float32, rope, True)
        ref_t = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
        o = launch_decode_attention(**t, **args, num_splits=1, rope_interleaved=rope == "interleaved")
        assert launched[-1] == want
        ref = decode_attention_reference(**ref_t, **args, rope_interleaved=rope == "interleaved")
        assert rel_err(o.cpu(), ref.cpu()) < 1e-5
    launch_decode_attention(**ref_t, **args, num_splits=1, block_s=8)  # S > 8: the loop form
    assert launched[-1] == "split"


def test_strided_qkv_rows():
    """qkv may be one position of a [B, T, ·] projection (rows strided, elements contiguous)."""
    B, hq, hkv, hd, S, L = 3, 4, 2, 16, 40, 1
    t = _case(B, hq, hkv, hd, S, L, torch.float32, "interleaved", False)
    wide = torch.randn(B, 2, t["qkv"].shape[1], device=DEVICE)
    wide[:, 1] = t["qkv"]
    ref_t = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
    got_t = {**t, "qkv": wide[:, 1]}
    args = dict(layer=0, scale=0.25, rope_interleaved=True)
    o = launch_decode_attention(**got_t, **args, num_splits=2, **SMALL)
    ref = decode_attention_reference(**ref_t, **args)
    assert rel_err(o.cpu(), ref.cpu()) < 1e-5
    assert rel_err(got_t["k_cache"].cpu(), ref_t["k_cache"].cpu()) < 1e-6


def test_positions_outside_the_cache_are_clamped_like_the_reference():
    """The runtime validates positions; the kernel still never touches memory outside the cache."""
    B, hq, hkv, hd, S, L = 3, 4, 2, 16, 20, 2
    t = _case(B, hq, hkv, hd, S, L, torch.float32, "neox", False)
    t["positions"] = torch.tensor([-3, S + 7, 5], device=DEVICE)
    ref_t = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
    o = launch_decode_attention(**t, layer=1, scale=0.25, num_splits=2, **SMALL)
    ref = decode_attention_reference(**ref_t, layer=1, scale=0.25)
    assert rel_err(o.cpu(), ref.cpu()) < 1e-5
    assert torch.equal(t["v_cache"].cpu(), ref_t["v_cache"].cpu())


def test_split_plan():
    assert plan_num_splits(2, 4097, 132) == 16  # VoxCPM2 B=1: 2 (row, kv head) pairs, capped at MAX_SPLITS
    assert plan_num_splits(32, 4097, 132) == 8  # B=16: 32 pairs × 8 splits ≈ two programs per SM
    assert plan_num_splits(2, 40, 132) == 1  # a cache shorter than MIN_CHUNK: one program per pair
    assert plan_num_splits(16, 17, 132) == 1  # Qwen code_predictor: 17 positions
    assert plan_num_splits(300, 4097, 132) == 1  # more pairs than two programs per SM
    for rows in (1, 2, 3, 7, 16, 64, 133):
        for S in (1, 64, 65, 513, 4097, 100_001):
            n = plan_num_splits(rows, S, 132)
            assert 1 <= n <= 16 and n <= math.ceil(S / 64) and (n == 1 or rows * n <= 2 * 132)


def test_shape_and_dtype_errors():
    t = _case(2, 4, 2, 16, 10, 2, torch.float32, "neox", True)
    t = {k: v.cpu() if v is not None else None for k, v in t.items()}
    base = dict(layer=0, scale=0.25)
    with pytest.raises(RuntimeError, match="layer 2 outside"):
        decode_attention(**t, **{**base, "layer": 2})
    with pytest.raises(RuntimeError, match="positions must be"):
        decode_attention(**{**t, "positions": t["positions"].float()}, **base)
    with pytest.raises(RuntimeError, match="share a float dtype"):
        decode_attention(**{**t, "qkv": t["qkv"].bfloat16()}, **base)
    with pytest.raises(RuntimeError, match="rope tables"):
        decode_attention(**{**t, "cos": t["cos"][:9], "sin": t["sin"][:9]}, **base)
    with pytest.raises(RuntimeError, match="query heads"):
        decode_attention(**{**t, "qkv": torch.randn(2, 16 * 7)}, **base)
    with pytest.raises(RuntimeError, match="q/k norm weights"):
        decode_attention(**{**t, "q_norm": torch.ones(8), "k_norm": torch.ones(8)}, **base)
    with pytest.raises(RuntimeError, match="workspace must be"):
        decode_attention(**t, **base, workspace=torch.zeros(4, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="workspace must be"):
        decode_attention(**t, **base, workspace=torch.zeros(3, dtype=torch.int32))  # B·Hkv = 4
    with pytest.raises(RuntimeError, match="head_dim 12 is not a power of 2"):
        c = torch.zeros(2, 2, 2, 10, 12)
        decode_attention(torch.zeros(2, 8 * 12), t["positions"], c, c.clone(), 0, 0.25)


# --------------------------------------------------------------------------------------------- export
class _TwoLayerStep(torch.nn.Module):
    """A 2-layer decode step as the families build it: norm + fused qkv, attention over the caller's caches,
    o_proj + residual."""

    def __init__(self, D=32, hq=4, hkv=2, hd=16, positions=24):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.norm = torch.nn.Parameter(torch.rand(2, D, generator=g) + 0.5)
        self.wqkv = torch.nn.Parameter(torch.randn(2, (hq + 2 * hkv) * hd, D, generator=g) / D**0.5)
        self.wo = torch.nn.Parameter(torch.randn(2, D, hq * hd, generator=g) / (hq * hd) ** 0.5)
        cos, sin = rope_table(hd, positions, 10000.0)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.scale = hd**-0.5

    def forward(self, x, positions, k_cache, v_cache):
        for layer in range(2):
            qkv = skinny_linear(x, self.wqkv[layer], norm_weight=self.norm[layer], norm_eps=1e-5)
            o = decode_attention(qkv, positions, k_cache, v_cache, layer, self.scale, self.cos, self.sin)
            x = skinny_linear(o, self.wo[layer], residual=x)
        return x


def _step_inputs(B=3, S=24, device="cpu"):
    g = torch.Generator().manual_seed(1)
    return (
        torch.randn(B, 32, generator=g).to(device),
        torch.tensor([0, 7, S - 1][:B]).to(device),
        torch.randn(2, B, 2, S, 16, generator=g).to(device),
        torch.randn(2, B, 2, S, 16, generator=g).to(device),
    )


def _targets(ep) -> list:
    return [n.target for n in ep.graph.nodes if n.op == "call_function"]


def test_export_one_node_per_call_functionalized_as_user_input_mutation():
    m, args = _TwoLayerStep(), _step_inputs()
    with torch.no_grad():
        ep = torch.export.export(m, args, strict=False)
    assert _targets(ep).count(DA) == 2
    # Functionalized (what AOTInductor compiles): the writes become mutations of the caller's cache inputs.
    sig = ep.run_decompositions({}).graph_signature
    assert sorted(sig.user_inputs_to_mutate.values()) == ["k_cache", "v_cache"]
    # A lowering table cannot reach a mutating op: it stays wrapped in auto_functionalized_v2 (an AOTI CPU compile
    # would call it through the proxy executor, i.e. need the op in the serving process). Hence lower_for_cpu.
    tabled = ep.run_decompositions({**torch.export.default_decompositions(), **CPU_DECOMPOSITIONS})
    assert torch.ops.higher_order.auto_functionalized_v2 in _targets(tabled)

    lowered = lower_for_cpu(ep)
    names = [str(t) for t in _targets(lowered)]
    assert not any("ttsaot" in n or "auto_functionalized" in n for n in names)
    assert any("index_put" in n for n in names)
    got_args, want_args = _step_inputs(), _step_inputs()
    with torch.no_grad():
        got, want = lowered.module()(*got_args), m(*want_args)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_args[2], want_args[2])
    torch.testing.assert_close(got_args[3], want_args[3])


class _WorkspaceStep(torch.nn.Module):
    """Two layers' attention sharing the caller's workspace, as a step module that passes one will."""

    def forward(self, qkv, positions, k_cache, v_cache, workspace):
        o = decode_attention(qkv, positions, k_cache, v_cache, 0, 0.25, workspace=workspace)
        return decode_attention(o.repeat(1, 2), positions, k_cache, v_cache, 1, 0.25, workspace=workspace)


def test_export_with_a_workspace_one_node_per_call_and_lowered_reference_unchanged():
    def inputs():
        g = torch.Generator().manual_seed(2)
        k = torch.randn(2, 3, 2, 24, 16, generator=g)
        return (
            torch.randn(3, 8 * 16, generator=g),
            torch.tensor([0, 11, 23]),
            k,
            k.clone() + 1,
            torch.zeros(6, dtype=torch.int32),
        )

    m = _WorkspaceStep()
    with torch.no_grad():
        ep = torch.export.export(m, inputs(), strict=False)
    assert _targets(ep).count(DA) == 2
    sig = ep.run_decompositions({}).graph_signature
    assert sorted(sig.user_inputs_to_mutate.values()) == ["k_cache", "v_cache", "workspace"]
    lowered = lower_for_cpu(ep)
    assert not any("ttsaot" in str(t) for t in _targets(lowered))
    got_args, want_args = inputs(), inputs()
    with torch.no_grad():
        got = lowered.module()(*got_args)
        want = [decode_attention_reference(*want_args[:4], layer=0, scale=0.25)]
        want = decode_attention_reference(want[0].repeat(1, 2), *want_args[1:4], layer=1, scale=0.25)
    assert torch.equal(got, want)  # the lowering is the aten reference, bit for bit
    assert torch.equal(got_args[2], want_args[2]) and torch.equal(got_args[3], want_args[3])
    assert not got_args[4].any()


@pytest.mark.slow
def test_aoti_cpu_package_writes_the_callers_cache_in_place(tmp_path):
    from torch._inductor import aoti_compile_and_package, aoti_load_package

    m, args = _TwoLayerStep(), _step_inputs()
    with torch.no_grad():
        ep = lower_for_cpu(torch.export.export(m, args, strict=False))
        path = aoti_compile_and_package(ep, package_path=str(tmp_path / "step.pt2"))
    runner = aoti_load_package(path)
    got_args, want_args = _step_inputs(), _step_inputs()
    ptrs = [a.data_ptr() for a in got_args[2:]]
    with torch.no_grad():
        got, want = runner(*got_args), m(*want_args)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_args[2], want_args[2])  # the caller's tensors, written in place
    torch.testing.assert_close(got_args[3], want_args[3])
    assert [a.data_ptr() for a in got_args[2:]] == ptrs
    import zipfile

    with zipfile.ZipFile(path) as z:
        wrapper = "".join(z.read(n).decode() for n in z.namelist() if n.endswith(".wrapper.cpp"))
    assert wrapper and "proxy_executor_call_function" not in wrapper  # nothing left for a registered op


def test_cpu_install_without_triton_exports_and_lowers():
    """CPU-only installs (no triton): the same exported program (one node per call), and the lowering table alone
    reaches aten (decode_attention is then a CompositeImplicitAutograd op, which run_decompositions inlines)."""
    code = textwrap.dedent("""
        import sys
        sys.modules["triton"] = None                      # import triton -> ImportError
        import torch
        from ttsaot.builder.kernels import CPU_DECOMPOSITIONS, decode_attention, skinny_linear
        from ttsaot.builder.kernels.common import HAVE_TRITON
        assert not HAVE_TRITON
        from tests.test_kernels_decode_attention import _TwoLayerStep, _step_inputs
        m, args = _TwoLayerStep(), _step_inputs()
        with torch.no_grad():
            ep = torch.export.export(m, args, strict=False)
        names = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
        assert names.count("ttsaot.skinny_linear.default") == 4, names
        assert names.count("ttsaot.decode_attention.default") == 2, names
        table = torch.export.default_decompositions()
        table.update(CPU_DECOMPOSITIONS)
        lowered = ep.run_decompositions(table)
        assert not any("ttsaot" in str(n.target) for n in lowered.graph.nodes)
        got_args, want_args = _step_inputs(), _step_inputs()
        with torch.no_grad():
            torch.testing.assert_close(lowered.module()(*got_args), m(*want_args))
        torch.testing.assert_close(got_args[2], want_args[2])
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


# ------------------------------------------------------------------------------------ GPU, real shapes
REAL = {  # name: (Hq, Hkv, rope, qk_norm, cache positions)
    "voxcpm2_base_lm": (16, 2, "neox", False, (513, 4097)),
    "voxcpm2_residual_lm": (16, 2, None, False, (513, 4097)),
    "fish_slow_ar_like": (32, 8, "interleaved", False, (513, 4097)),
    "qwen_like_qk_norm": (16, 8, "neox", True, (513, 4097)),
    "qwen_code_predictor": (16, 8, "neox", True, (17,)),  # 16 code groups + the talker's hidden state
}
REAL_CASES = [(name, S) for name, r in REAL.items() for S in r[4]]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("B", [1, 3, 16])
@pytest.mark.parametrize("name,S", REAL_CASES, ids=[f"{n}-S{S}" for n, S in REAL_CASES])
def test_gpu_real_shapes_autotuned(name, S, B):
    hq, hkv, rope, qk_norm, _ = REAL[name]
    t = _case(B, hq, hkv, 128, S, 4, torch.bfloat16, rope, qk_norm)
    ref_t = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
    args = dict(layer=2, scale=128**-0.5, rope_interleaved=rope == "interleaved")
    o = decode_attention(**t, **args)
    ref = decode_attention_reference(**ref_t, **args)
    assert rel_err(o.float(), ref.float()) < 1e-2
    assert torch.equal(t["v_cache"], ref_t["v_cache"])
    k_mirror = _written_k_mirror(t, hq, hkv, 128, rope, kernel_rounding(torch.bfloat16))
    k_new = t["k_cache"].cpu()[2, torch.arange(B), :, t["positions"].cpu()].float()
    assert (k_new == k_mirror).float().mean().item() >= 0.99
    again = decode_attention(**t, **args)  # same inputs (the slot now holds the same k/v)
    assert torch.equal(o, again)
    ws = torch.zeros(B * 2 * hkv, dtype=torch.int32, device="cuda")  # a step's workspace, larger than needed
    with_ws = decode_attention(**t, **args, workspace=ws)
    torch.cuda.synchronize()
    assert torch.equal(o, with_ws) and not ws.any()


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("splits", [2, 5, 16])
@pytest.mark.parametrize("B", [1, 3])
def test_gpu_forced_splits_merge_through_one_workspace(B, splits):
    """VoxCPM2 shapes at S = 4097 with the split count forced: every layer of a 'step' reuses one workspace (the
    tickets must come back to zero after every call), each layer matches the reference, repeats are bit-identical
    (the last split merges in split order whatever order the splits finished in)."""
    hq, hkv, S, L = 16, 2, 4097, 3
    t = _case(B, hq, hkv, 128, S, L, torch.bfloat16, "neox", False)
    ref_t = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
    ws = torch.zeros(B * hkv, dtype=torch.int32, device="cuda")
    for layer in range(L):
        args = dict(layer=layer, scale=128**-0.5)
        o = launch_decode_attention(**t, **args, workspace=ws, num_splits=splits, min_chunk=64)
        ref = decode_attention_reference(**ref_t, **args)
        assert rel_err(o.float(), ref.float()) < 1e-2, layer
        for _ in range(3):
            assert torch.equal(o, launch_decode_attention(**t, **args, workspace=ws, num_splits=splits, min_chunk=64))
        torch.cuda.synchronize()
        assert not ws.any(), layer
    assert torch.equal(t["v_cache"], ref_t["v_cache"])


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("splits", [2, 9, 16])
def test_gpu_merge_of_partly_active_splits_matches_the_reference(splits):
    """The split form's masked merge compiled for the GPU at the VoxCPM2 LM shape (a 512-token context, rows with few
    and with all splits active), after a launch that left real partials in every slot of the memory the caching
    allocator hands out again: the reference's output, the workspace back at zero."""
    B, hq, hkv, S, L = 2, 16, 2, 513, 1
    t = _case(B, hq, hkv, 128, S, L, torch.bfloat16, "neox", False)
    ws = torch.zeros(B * hkv, dtype=torch.int32, device="cuda")
    launch = dict(layer=0, scale=128**-0.5, num_splits=splits, min_chunk=32, block_s=32)
    every = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
    every["positions"] = torch.full((B,), S - 1, device="cuda")
    launch_decode_attention(**every, **launch, workspace=ws)
    t["positions"] = torch.tensor([100, 511], device="cuda")
    ref_t = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
    o = launch_decode_attention(**t, **launch, workspace=ws)
    torch.cuda.synchronize()
    assert not ws.any()
    ref = decode_attention_reference(**ref_t, layer=0, scale=128**-0.5)
    assert rel_err(o.float(), ref.float()) < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
def test_gpu_aoti_package_updates_the_cache_in_place_without_copying_it(tmp_path):
    """AOTInductor functionalizes the op's cache write and must re-inplace it: a copy of a cache would show as
    extra peak memory of the cache's size during the call."""
    from torch._inductor import aoti_compile_and_package, aoti_load_package

    m = _TwoLayerStep(positions=8192).cuda()
    args = _step_inputs(S=8192, device="cuda")
    with torch.no_grad():
        ep = torch.export.export(m, args, strict=False)
        path = aoti_compile_and_package(ep, package_path=str(tmp_path / "step.pt2"))
    runner = aoti_load_package(path, run_single_threaded=True)
    got_args, want_args = _step_inputs(S=8192, device="cuda"), _step_inputs(S=8192, device="cuda")
    with torch.no_grad():
        runner(*got_args)  # warm-up (lazy kernel loads)
        got_args = _step_inputs(S=8192, device="cuda")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        got = runner(*got_args)
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base
        want = m(*want_args)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_args[2], want_args[2], rtol=1e-4, atol=1e-4)
    assert extra < got_args[2].numel() * got_args[2].element_size() // 4, f"{extra} bytes extra: cache copied?"
