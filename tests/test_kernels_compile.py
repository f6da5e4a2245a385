"""The Triton kernels compile for sm_90 (H100/H200) on a machine without a GPU, with the machine code the design
relies on: 16-byte vector loads of W in the GEMV form, tensor-core instructions in the tile forms, nothing in
local memory (spills). Triton's compiler and ptxas/cuobjdump ship with the triton wheel; the GPU has its own
Triton (3.6 there), so this catches what the interpreter cannot (types, layouts, register pressure) early, not
everything. Runs in a child process: the interpreter (TRITON_INTERPRET, set for CPU test sessions) must be off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from .conftest import computed_once
from .kernel_fixtures import ON_GPU

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent(r"""
    import json, os, re, subprocess, sys, tempfile
    import triton
    from triton.backends.compiler import GPUTarget
    from ttsaot.builder.kernels import decode_attention_triton as A, skinny_linear_triton as S
    from ttsaot.builder.kernels import sequence_attention_triton as Q
    from ttsaot.builder.kernels import sequence_attention_o_triton as QO
    from ttsaot.builder.kernels.sequence_attention_o import plan as attention_o_plan
    from ttsaot.builder.kernels import qkv_attention_triton as QA
    from ttsaot.builder.kernels import sample_triton as SM

    BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    OPS = ("LDG.E.128", "LDGSTS", "HMMA", "HGMMA", "LDL", "STL", "ATOM", "BAR.SYNC")

    def build(fn, types, constexprs, num_warps, num_stages, aligned):
        # constexprs a case leaves out take the kernel's own defaults (STREAM, NORM_CHUNKS); skinny_linear's
        # SWAP_AB (no default: the launcher always passes it) is off unless the case sets it
        constexprs = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}, **constexprs}
        if "SWAP_AB" in fn.arg_names:
            constexprs.setdefault("SWAP_AB", False)
        sig = {n: ("constexpr" if n in constexprs else types[n]) for n in fn.arg_names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n in aligned}
        src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": num_warps, "num_stages": num_stages})
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(k.asm["cubin"])
        sass = subprocess.run([f"{BIN}/cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
        ptx = k.asm["ptx"]
        wait = ptx.find("griddepcontrol.wait")
        res = subprocess.run([f"{BIN}/cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
        os.unlink(f.name)
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", res)
        out = {op: sass.count(op) for op in OPS}
        out.update(dict(zip(("regs", "stack", "shared", "local"), map(int, m.groups()))))
        # programmatic dependent launch (pdl.py): the wait, and the global loads the PTX issues before it
        out["pdl_wait"] = ptx.count("griddepcontrol.wait")
        out["pdl_trigger"] = ptx.count("griddepcontrol.launch_dependents")
        out["loads_before_wait"] = ptx[:wait].count("ld.global") if wait >= 0 else -1
        out["trigger_after_wait"] = ptx.find("griddepcontrol.launch_dependents") > wait
        return out

    bf = "bf16"
    sl_types = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", g_ptr="*bf16", r_ptr="*bf16", y_ptr="*bf16",
                    part_ptr="*fp32", sem_ptr="*i32", M="i32", N_OUT="i32", K="i32", K_SPLIT="i32", eps="fp32",
                    scale="fp32")
    sl_aligned = {"x_ptr", "w_ptr", "b_ptr", "g_ptr", "r_ptr", "y_ptr", "part_ptr", "sem_ptr", "N_OUT", "K",
                  "K_SPLIT"}
    results = {}
    flags = {"plain": dict(HAS_NORM=False, HAS_BIAS=False, GATED=False, HAS_RESIDUAL=False),
             "norm": dict(HAS_NORM=True, HAS_BIAS=False, GATED=False, HAS_RESIDUAL=False),
             "norm_gated": dict(HAS_NORM=True, HAS_BIAS=False, GATED=True, HAS_RESIDUAL=False),
             "bias_residual": dict(HAS_NORM=False, HAS_BIAS=True, GATED=False, HAS_RESIDUAL=True)}
    cases = [("gemv", 1, S.GEMV_CONFIGS[0], "plain", 1), ("gemv", 1, S.GEMV_CONFIGS[1], "norm_gated", 2),
             ("gemv", 2, S.GEMV_CONFIGS[2], "bias_residual", 1), ("dot", 16, S.GEMM_CONFIGS[1], "plain", 2),
             ("dot", 16, S.GEMM_CONFIGS[0], "norm_gated", 1), ("dot", 16, S.GEMM_CONFIGS[2], "bias_residual", 1),
             ("dot64", 64, S.GEMM_CONFIGS[0], "norm_gated", 1), ("gemv", 1, S.GEMV_CONFIGS[3], "norm_gated", 1)]
    # (GEMM_CONFIGS[1], BLOCK_N 32, with the gated epilogue's two accumulators spills one register under Triton 3.7;
    # it is still the fastest gate_up config on the H100 with Triton 3.6, kernel_configs.json)
    for form, block_m, c, fname, split in cases:
        cx = dict(flags[fname], SPLIT_K=split, FUSED_REDUCE=False, USE_DOT=form != "gemv", FP32_DOT=False, PDL=True,
                  NORM_BLOCK=2048 if form == "gemv" else 0, BLOCK_M=block_m, STREAM=False, NORM_CHUNKS=0,
                  **c.kwargs)
        key = f"skinny/{form}/{fname}/m{block_m}/split{split}/bn{c.kwargs['BLOCK_N']}bk{c.kwargs['BLOCK_K']}"
        results[key] = build(S.skinny_linear_kernel, sl_types, cx, c.num_warps, c.num_stages, sl_aligned)
    # the GEMV form with the whole K range preloaded (PRELOAD) at the code predictor's one-row shapes: qkv + norm
    # (K 1024), gate_up + norm (gated), o (K 2048), down (K 3072 in a 4096 tile), 64 W values per thread
    for fname, bn, bk, warps in (("norm", 8, 1024, 4), ("norm_gated", 4, 1024, 4), ("bias_residual", 4, 2048, 4),
                                 ("bias_residual", 2, 4096, 4), ("norm_gated", 8, 1024, 8)):
        cx = dict(flags[fname], SPLIT_K=1, FUSED_REDUCE=False, USE_DOT=False, FP32_DOT=False, PDL=True,
                  NORM_BLOCK=bk, BLOCK_M=1, STREAM=False, NORM_CHUNKS=0, BLOCK_N=bn, BLOCK_K=bk, PRELOAD=True)
        results[f"skinny/gemv/preload/{fname}/bn{bn}bk{bk}w{warps}"] = build(
            S.skinny_linear_kernel, sl_types, cx, warps, 1, sl_aligned)
    # the streamed tile form (no cp.async stages; W and x of the next step in registers; first W tile before the wait)
    for fname, block_m, c in (("norm_gated", 32, S.STREAM_CONFIGS[0]), ("bias_residual", 32, S.STREAM_CONFIGS[1]),
                              ("norm_gated", 16, S.STREAM_CONFIGS[2])):
        cx = dict(flags[fname], SPLIT_K=1, FUSED_REDUCE=False, USE_DOT=True, FP32_DOT=False, PDL=True,
                  NORM_BLOCK=256, BLOCK_M=block_m, STREAM=True, NORM_CHUNKS=4, **c.kwargs)
        key = f"skinny/stream/{fname}/m{block_m}/bn{c.kwargs['BLOCK_N']}bk{c.kwargs['BLOCK_K']}"
        results[key] = build(S.skinny_linear_kernel, sl_types, cx, c.num_warps, c.num_stages, sl_aligned)
    # the swapped tile form (W · xᵀ, 64-row W tiles as the warpgroup MMA's M side): gated + norm, and residual split
    for fname, c, split in (("norm_gated", S.SWAP_CONFIGS[0], 1), ("bias_residual", S.SWAP_CONFIGS[0], 4)):
        cx = dict(flags[fname], SPLIT_K=split, FUSED_REDUCE=False, USE_DOT=True, FP32_DOT=False, PDL=True,
                  NORM_BLOCK=256, BLOCK_M=16, STREAM=False, NORM_CHUNKS=8, SWAP_AB=True, **c.kwargs)
        results[f"skinny/dot/swap/{fname}/m16/split{split}"] = build(
            S.skinny_linear_kernel, sl_types, cx, c.num_warps, c.num_stages, sl_aligned)
    # the tile form's RMSNorm prologue unrolled into 256-wide chunks (skinny_linear.norm_block), K = 2048
    for fname, block_m, c in (("norm_gated", 16, S.GEMM_CONFIGS[1]), ("norm_gated", 32, S.GEMM_CONFIGS[0])):
        cx = dict(flags[fname], SPLIT_K=1, FUSED_REDUCE=False, USE_DOT=True, FP32_DOT=False, PDL=True,
                  NORM_BLOCK=256, BLOCK_M=block_m, STREAM=False, NORM_CHUNKS=8, **c.kwargs)
        results[f"skinny/dot/{fname}/m{block_m}/norm_unrolled"] = build(
            S.skinny_linear_kernel, sl_types, cx, c.num_warps, c.num_stages, sl_aligned)
    # split-K reduced in the kernel by each tile's last program (a semaphore workspace instead of a second launch)
    for form, block_m, c in (("dot", 32, S.GEMM_CONFIGS[1]), ("gemv", 1, S.GEMV_CONFIGS[0])):
        cx = dict(flags["bias_residual"], SPLIT_K=4, FUSED_REDUCE=True, USE_DOT=form == "dot", FP32_DOT=False,
                  PDL=True, NORM_BLOCK=0, BLOCK_M=block_m, STREAM=False, NORM_CHUNKS=0, **c.kwargs)
        results[f"skinny/{form}/fused_split4"] = build(S.skinny_linear_kernel, sl_types, cx, c.num_warps,
                                                      c.num_stages, sl_aligned)
    ep_types = dict(part_ptr="*fp32", b_ptr="*bf16", r_ptr="*bf16", y_ptr="*bf16", M="i32", N_OUT="i32",
                    scale="fp32")
    results["skinny/split_k_epilogue"] = build(S.split_k_epilogue_kernel, ep_types,
        dict(HAS_BIAS=True, GATED=True, HAS_RESIDUAL=True, SPLIT_K=4, PDL=True, BLOCK_M=16, BLOCK_N=128), 4, 1,
        set())
    # skinny_linear_norm_out's second pass, whole rows: the LocDiT's 1024 columns, the VoxCPM2 LM's 2048, Fish's 2560
    no_types = dict(part_ptr="*fp32", b_ptr="*bf16", r_ptr="*bf16", g_ptr="*bf16", y_ptr="*bf16", yn_ptr="*bf16",
                    M="i32", N_OUT="i32", scale="fp32", eps="fp32")
    for block_n, split in ((1024, 2), (2048, 0), (4096, 4)):
        results[f"skinny/norm_out_epilogue/{block_n}/split{split}"] = build(S.norm_out_epilogue_kernel, no_types,
            dict(HAS_BIAS=True, HAS_RESIDUAL=True, SPLIT_K=split, PDL=True, BLOCK_M=1, BLOCK_N=block_n), 4, 1, set())
    da_types = dict(qkv_ptr="*bf16", pos_ptr="*i64", kc_ptr="*bf16", vc_ptr="*bf16", cos_ptr="*fp32",
                    sin_ptr="*fp32", qn_ptr="*bf16", kn_ptr="*bf16", o_ptr="*bf16", part_o_ptr="*fp32",
                    part_ml_ptr="*fp32", ws_ptr="*i32", layer="i32", S="i32", QKV_ROW="i32", CACHE_LAYER="i32",
                    eps="fp32", qk_scale="fp32")
    da_aligned = {n for n in da_types if n.endswith("_ptr")} | {"QKV_ROW"}
    for name, (hq, hkv, rope, qkn) in {"voxcpm2": (16, 2, 1, False), "residual": (16, 2, 0, False),
                                       "interleaved_gqa4": (32, 8, 2, False), "qk_norm": (16, 8, 1, True)}.items():
        for ns in ((1, 16) if name == "voxcpm2" else (4,)):
            cx = dict(HQ=hq, HKV=hkv, HEAD_DIM=128, D_PAD=128, G_PAD=16, ROPE=rope, QK_NORM=qkn, NUM_SPLITS=ns,
                      MIN_CHUNK=64, BLOCK_S=64, FP32_DOT=False, PDL=True, WHOLE=False, EARLY_BLOCK=False)
            results[f"attention/{name}/splits{ns}"] = build(A.decode_attention_kernel, da_types, cx, A.split_warps(128),
                                                            A.SPLIT_STAGES, da_aligned)
    # TTSAOT_ATTENTION_EARLY_BLOCK=1: each split's first cache block loaded before the PDL wait
    results["early_attention/voxcpm2/splits16"] = build(
        A.decode_attention_kernel, da_types, dict(cx, HQ=16, HKV=2, ROPE=1, NUM_SPLITS=16, EARLY_BLOCK=True),
        A.split_warps(128), A.SPLIT_STAGES, da_aligned)
    # AOTInductor types float arguments of user kernels fp64: the kernels must keep their fp32 state (the loop-carried
    # softmax state of decode attention became fp64 and failed to compile on the H100)
    results["attention/voxcpm2/fp64_scalars"] = build(
        A.decode_attention_kernel, dict(da_types, eps="fp64", qk_scale="fp64"),
        dict(cx, HQ=16, HKV=2, ROPE=1, QK_NORM=True, NUM_SPLITS=16), A.split_warps(128), A.SPLIT_STAGES, da_aligned)
    results["skinny/gemv/norm_gated/fp64_scalars"] = build(
        S.skinny_linear_kernel, dict(sl_types, eps="fp64", scale="fp64"),
        dict(flags["norm_gated"], SPLIT_K=1, FUSED_REDUCE=False, USE_DOT=False, FP32_DOT=False, PDL=True,
             NORM_BLOCK=2048, BLOCK_M=1, STREAM=False, NORM_CHUNKS=0, **S.GEMV_CONFIGS[1].kwargs),
        S.GEMV_CONFIGS[1].num_warps, S.GEMV_CONFIGS[1].num_stages, sl_aligned)
    # Triton specialises an int argument equal to 1 into a constexpr: layer 1 of every LM compiles this variant
    results["attention/voxcpm2/layer1"] = build(
        A.decode_attention_kernel, da_types, dict(cx, HQ=16, HKV=2, ROPE=1, QK_NORM=False, NUM_SPLITS=1, layer=1),
        A.split_warps(128), A.SPLIT_STAGES, da_aligned)
    # The Qwen tiny presets' head_dim 8, padded to 16 lanes for tl.dot, with the ticket merge
    results["attention/hd8_padded/splits4"] = build(
        A.decode_attention_kernel, da_types, dict(cx, HQ=4, HKV=2, HEAD_DIM=8, D_PAD=16, ROPE=1, QK_NORM=True,
                                                  NUM_SPLITS=4, BLOCK_S=16, MIN_CHUNK=16), A.split_warps(8),
        A.SPLIT_STAGES, da_aligned)
    # the whole-cache form: the Qwen code predictor's 16 positions (one 16-row tile), and a 64-position cache
    for name, block_s, warps in (("code_predictor", 16, 4), ("s64", 64, 4), ("code_predictor_w1", 16, 1)):
        results[f"attention/whole/{name}"] = build(
            A.decode_attention_kernel, da_types, dict(cx, HQ=16, HKV=8, ROPE=1, QK_NORM=True, NUM_SPLITS=1,
                                                      BLOCK_S=block_s, WHOLE=True), warps, 1, da_aligned)
    # the fused qkv projection + whole-cache attention (qkv_attention) at the predictors' one-row shapes: the code
    # predictor's PRELOAD projection (K 1024, q/k norm, NeoX) and Fish fast_ar's loop one (K 2560, interleaved)
    qa_types = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", g_ptr="*bf16", qkv_ptr="*bf16", pos_ptr="*i64",
                    kc_ptr="*bf16", vc_ptr="*bf16", cos_ptr="*bf16", sin_ptr="*bf16", qn_ptr="*bf16",
                    kn_ptr="*bf16", o_ptr="*bf16", ws_ptr="*i32", layer="i32", M="i32", N_OUT="i32", K="i32",
                    K_SPLIT="i32", S="i32", CACHE_LAYER="i32", eps="fp32", qk_eps="fp32", qk_scale="fp32")
    qa_aligned = {n for n in qa_types if n.endswith("_ptr")} | {"N_OUT", "K", "K_SPLIT"}
    # (NORM_BLOCK: skinny_linear.norm_block's, the whole row)
    for name, hq, rope, qkn, c, norm_block in (
            ("code_predictor", 16, 1, True, S.preload_config(1024, False, 4096, 132), 1024),
            ("fast_ar", 32, 2, False, S.GEMV_CONFIGS[1], 4096)):
        cx = dict(HAS_NORM=True, HAS_BIAS=False, PDL=True, NORM_BLOCK=norm_block, NORM_CHUNKS=0, BLOCK_M=1, HQ=hq,
                  HKV=8, HEAD_DIM=128, D_PAD=128, G_PAD=16, ROPE=rope, QK_NORM=qkn, BLOCK_S=16, FP32_DOT=False,
                  **c.kwargs)
        results[f"qkv_attention/{name}"] = build(QA.qkv_attention_kernel, qa_types, cx, c.num_warps, c.num_stages,
                                                 qa_aligned)
    # sequence attention at the VoxCPM2 LocDiT / local encoder shapes (16 query heads over 2 kv heads, hd 128)
    sq_types = dict(qkv_ptr="*bf16", cos_ptr="*fp32", sin_ptr="*fp32", o_ptr="*bf16", T="i32", row_stride="i32",
                    scale_log2="fp32")
    for name, rope in (("locdit", 1), ("norope", 0)):
        results[f"sequence/{name}"] = build(
            Q.sequence_attention_kernel, sq_types,
            dict(HQ=16, HKV=2, HEAD_DIM=128, T_PAD=16, ROPE=rope, FP32_DOT=False, PDL=True), 4, 1,
            {"qkv_ptr", "cos_ptr", "sin_ptr", "o_ptr", "row_stride"})
    # the LocDiT's attention inside its o_proj (22 rows in a 32-row tile, hidden 1024), at the op's plan
    qo_types = dict(qkv_ptr="*bf16", cos_ptr="*fp32", sin_ptr="*fp32", w_ptr="*bf16", b_ptr="*bf16", r_ptr="*bf16",
                    y_ptr="*bf16", part_ptr="*fp32", M="i32", T="i32", QKV_ROW="i32", N_OUT="i32", K="i32",
                    scale_log2="fp32", residual_scale="fp32")
    split, block_n, warps = attention_o_plan(16)
    results["sequence_o/locdit"] = build(
        QO.sequence_attention_o_kernel, qo_types,
        dict(HQ=16, HKV=2, HEAD_DIM=128, HEADS_PER_SPLIT=16 // split, SPLIT=split, ROPE=1, HAS_BIAS=False,
             FP32_DOT=False, PDL=True, BLOCK_M=32, BLOCK_N=block_n), warps, 2,
        {n for n in qo_types if n.endswith("_ptr")} | {"QKV_ROW", "N_OUT", "K"})
    # without PDL (pre-Hopper builds): no griddepcontrol at all
    results["nopdl/skinny/gemv"] = build(
        S.skinny_linear_kernel, sl_types,
        dict(flags["plain"], SPLIT_K=1, FUSED_REDUCE=False, USE_DOT=False, FP32_DOT=False, PDL=False, NORM_BLOCK=0,
             BLOCK_M=1, STREAM=False, NORM_CHUNKS=0, **S.GEMV_CONFIGS[0].kwargs), 8, 1, sl_aligned)
    # the predictors' sampler (no programmatic launch): their vocabularies, the row in registers without spills
    sm_types = dict(logits_ptr="*bf16", u_ptr="*fp32", t_ptr="*fp32", k_ptr="*i64", p_ptr="*fp32", out_ptr="*i64",
                    V="i32", logits_row_stride="i64", u_row_stride="i64")
    for v in (2048, 4096):
        for sort in (True, False):
            sm_meta = dict(U_MIN=1e-20, U_MAX=1.0 - 1e-7, BLOCK_V=v, SORT=sort)
            results[f"nopdl/sample/V{v}/{'sort' if sort else 'radix'}"] = build(
                SM.sample_tokens_kernel, sm_types, sm_meta, SM.warps(v), 1, set())
    print(json.dumps(results))
""")


def _compile_for_sm90() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, cwd=REPO, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def sm90() -> dict:
    """The child's figures, once per run (both tests read them; the compile took ~70 s of a CI core per worker)."""
    return computed_once("kernels-sm90", _compile_for_sm90)


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="the GPU tests compile and run the kernels for real")
def test_kernels_compile_for_sm90_with_the_intended_machine_code(sm90):
    for key, r in sm90.items():
        assert r["local"] == 0 and r["LDL"] == 0 and r["STL"] == 0, (key, r)  # no spills
        if key.startswith("skinny/gemv"):
            assert r["LDG.E.128"] > 0, (key, r)  # W streamed with 16-byte loads
        elif key.startswith("skinny/dot"):
            assert r["HMMA"] + r["HGMMA"] > 0 and r["LDGSTS"] > 0, (key, r)  # tensor cores, cp.async pipeline
        elif key.startswith("skinny/stream"):
            # tensor cores fed from registers: 16-byte loads, no cp.async pipeline
            assert r["HMMA"] > 0 and r["LDG.E.128"] > 0 and r["LDGSTS"] == 0, (key, r)
        elif key.startswith(("sequence/", "sequence_o/")):
            assert r["HMMA"] > 0, (key, r)  # q·kᵀ and p·v (and the o_proj product) on the tensor cores
        elif key.startswith("qkv_attention/"):
            # the projection's 16-byte W loads, the attention's tensor cores, the arrival counter's atomic
            assert r["LDG.E.128"] > 0 and r["HMMA"] > 0 and r["ATOM"] >= 1, (key, r)
        elif key.startswith("attention/whole"):
            assert r["HMMA"] > 0 and r["LDG.E.128"] > 0, (key, r)  # one tile in registers, 16-byte loads
        elif key.startswith(("attention/", "early_attention/")):
            assert r["HMMA"] > 0 and r["LDGSTS"] > 0, (key, r)
            if "splits1" not in key and "layer1" not in key:
                assert r["ATOM"] > 0, (key, r)  # the ticket of the split merge
    assert sum(k.startswith("skinny/dot64") and sm90[k]["HGMMA"] > 0 for k in sm90) > 0  # wgmma at 64 rows
    for key in ("skinny/dot/swap/norm_gated/m16/split1", "skinny/dot/swap/bias_residual/m16/split4"):
        # swapped at 16 rows: warpgroup MMAs on W where cp.async put it, no mma.sync
        assert sm90[key]["HGMMA"] > 0 and sm90[key]["HMMA"] == 0 and sm90[key]["LDGSTS"] > 0, (key, sm90[key])
    # one warp (TTSAOT_WHOLE_ATTENTION_WARPS=1): the tile's reductions and dot operands stay in the warp
    whole = sm90["attention/whole/code_predictor"]["BAR.SYNC"]
    assert sm90["attention/whole/code_predictor_w1"]["BAR.SYNC"] < whole / 2, whole
    for key in ("skinny/dot/fused_split4", "skinny/gemv/fused_split4"):
        # the in-kernel split-K reduction: a barrier before the tile counter's atomic (and the counter's reset)
        assert sm90[key]["ATOM"] >= 1 and sm90[key]["BAR.SYNC"] >= 1, (key, sm90[key])


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="the GPU tests compile and run the kernels for real")
def test_decode_kernels_wait_on_their_predecessor_after_loading_weights_only(sm90):
    """Programmatic dependent launch (builder/kernels/pdl.py): every kernel PDL_KERNELS names has the trigger and
    the wait in its PTX (a kernel launched with the attribute that never waits would race its predecessor); the
    GEMV and streamed tile forms issue their first W tile's loads BEFORE the wait (the overlap PDL is for) and let
    their dependent launch at once, the cp.async tile form only after its K loop (measured slower otherwise at
    B=16), while the kernels that read only activations first (attention, split-K epilogue) load nothing before it,
    but for the split attention's first cache block under TTSAOT_ATTENTION_EARLY_BLOCK=1."""
    for key, r in sm90.items():
        if key.startswith("nopdl/"):
            assert r["pdl_wait"] == 0 and r["pdl_trigger"] == 0, (key, r)
            continue
        assert r["pdl_wait"] >= 1 and r["pdl_trigger"] >= 1, (key, r)
        # the GEMV and streamed forms trigger their dependent at once, the tile form only after its K loop
        assert r["trigger_after_wait"] == key.startswith("skinny/dot"), (key, r)
        if key.startswith(("skinny/gemv", "skinny/stream", "qkv_attention/", "early_attention/")):
            assert r["loads_before_wait"] > 0, (key, r)
        elif key.startswith(("attention/", "sequence/", "sequence_o/", "skinny/split_k_epilogue")):
            assert r["loads_before_wait"] == 0, (key, r)
