"""`ttsaot::skinny_linear`: the aten reference equals the eager modules bit for bit, the Triton kernels (interpreter
on CPU, compiled on a GPU) compute the reference with its exact rounding order, one node under torch.export, CPU
lowering. Real shapes on the GPU: the `gpu` tests at the end."""

from __future__ import annotations

import pytest
import torch

from ttsaot.builder.kernels import CPU_DECOMPOSITIONS, lower_for_cpu
from ttsaot.builder.kernels.skinny_linear import (
    MAX_KERNEL_ROWS,
    MIN_SPLIT_K_CHUNK,
    NORM_ROW_ELEMENTS,
    kernel_rows,
    launch_skinny_linear,
    norm_block,
    plan_split_k,
    skinny_linear,
    skinny_linear_reference,
    tile_block_n,
)
from ttsaot.builder.layers import RMSNorm, SwiGLU

from .conftest import rel_err
from .kernel_fixtures import DEVICE, ON_GPU, kernel_rounding, require_kernel_runtime

SL = torch.ops.ttsaot.skinny_linear.default


@pytest.fixture(autouse=True)
def _kernel_runtime():
    require_kernel_runtime()


def _inputs(M, N, K, dtype, *, bias=False, norm=False, gated=False, residual=False, lead=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    n_out = N // 2 if gated else N
    shape = lead if lead is not None else (M,)
    t = {
        "x": torch.randn(*shape, K, generator=g),
        "weight": torch.randn(N, K, generator=g) / K**0.5,
        "bias": torch.randn(N, generator=g) if bias else None,
        "norm_weight": torch.rand(K, generator=g) + 0.5 if norm else None,
        "residual": torch.randn(*shape, n_out, generator=g) if residual else None,
    }
    return {k: None if v is None else v.to(dtype).to(DEVICE) for k, v in t.items()}


def _mirror(x, weight, bias, norm_weight, eps, gated, residual, scale, rnd):
    """The documented rounding order (skinny_linear.py) with fp64 products: `rnd` is the kernels' fp32 → dtype cast."""
    x, weight = x.cpu().float(), weight.cpu().float()
    if norm_weight is not None:
        rstd = 1.0 / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps)
        x = rnd(norm_weight.cpu().float() * rnd(x * rstd))
    z = (x.double() @ weight.double().T).float()
    if bias is not None:
        z = z + bias.cpu().float()
    z = rnd(z)
    if gated:
        gate, up = z.chunk(2, -1)
        z = rnd(rnd(gate / (1 + torch.exp(-gate))) * up)
    if residual is not None:
        z = rnd(residual.cpu().float() + rnd(z * scale))
    return z


# ------------------------------------------------------------------------------------------ reference
def test_reference_is_the_eager_modules_math():
    torch.manual_seed(0)
    D, H = 48, 40
    norm, lin = RMSNorm(D, 1e-5).bfloat16(), torch.nn.Linear(D, D, bias=True).bfloat16()
    mlp = SwiGLU(D, H).bfloat16()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        mlp.fuse_projections()
        x = torch.randn(3, 5, D).bfloat16()
        h = x + lin(norm(x)) * 0.37  # MiniCPM's muP branch scaling
        got = skinny_linear_reference(x, lin.weight, lin.bias, norm.weight, 1e-5, residual=x, residual_scale=0.37)
        assert torch.equal(got, h)
        assert torch.equal(skinny_linear_reference(x, lin.weight, lin.bias, residual=x), x + lin(x))
        up = skinny_linear_reference(norm(x), mlp.gate_up_proj.weight, gated=True)
        assert torch.equal(skinny_linear_reference(up, mlp.down_proj.weight, residual=x), x + mlp(norm(x)))


def test_op_on_cpu_is_the_reference():
    t = _inputs(3, 10, 16, torch.float32, bias=True, norm=True, gated=True, residual=True)
    t = {k: v.cpu() if v is not None else None for k, v in t.items()}
    got = skinny_linear(**t, norm_eps=1e-5, gated=True, residual_scale=0.5)
    assert torch.equal(got, skinny_linear_reference(**t, norm_eps=1e-5, gated=True, residual_scale=0.5))


# -------------------------------------------------------------------------------------------- kernels
EPILOGUES = {
    "plain": {},
    "bias": {"bias": True},
    "norm": {"norm": True},
    "norm_gated": {"norm": True, "gated": True},
    "gated_bias": {"gated": True, "bias": True},
    "residual": {"residual": True},
    "norm_bias_residual_scaled": {"norm": True, "bias": True, "residual": True, "scale": 0.7},
}
# (rows, N, K, form, split-K): GEMV and tensor-core forms, N and K off the block sizes, B = 3 and 5, M > 16,
# leading dims [2, 3] (a re-prefill's [B, T, D]); one K past NORM_ROW_ELEMENTS (the GEMV prologue in two chunks);
# N = 2.
CASES = [
    ((1,), 40, 100, "gemv", 1),
    ((1,), 16, NORM_ROW_ELEMENTS + 300, "gemv", 1),
    ((3,), 34, 70, "gemv", 2),
    ((5,), 24, 130, "dot", 1),
    ((20,), 48, 96, "dot", 3),
    ((2, 3), 32, 80, "dot", 2),
    ((1,), 2, 100, "gemv", 1),  # N below every block: VoxCPM2's stop head (two logits)
    ((3,), 2, 70, "dot", 1),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("epilogue", list(EPILOGUES))
def test_kernel_matches_reference_with_its_rounding_order(epilogue, dtype):
    spec = dict(EPILOGUES[epilogue])
    scale = spec.pop("scale", 1.0)
    rnd = kernel_rounding(dtype)
    for i, (lead, N, K, form, split) in enumerate(CASES):
        t = _inputs(None, N, K, dtype, lead=lead, seed=i, **spec)
        kw = dict(norm_eps=1e-5, gated=spec.get("gated", False), residual_scale=scale)
        # BLOCK_K 32 makes several K steps per split, and split boundaries fall inside K
        y = launch_skinny_linear(**t, **kw, config={"BLOCK_N": 16, "BLOCK_K": 32}, split_k=split, use_dot=form == "dot")
        ref = skinny_linear_reference(**t, **kw)
        assert y.shape == ref.shape and y.dtype == dtype, (lead, N, K)
        mirror = _mirror(t["x"], t["weight"], t["bias"], t["norm_weight"], 1e-5, kw["gated"], t["residual"], scale, rnd)
        if dtype == torch.float32:
            assert rel_err(y.cpu(), ref.cpu()) < 1e-5, (lead, N, K, form, split)
        else:
            # Against the reference (nearest-even casts): the interpreter's truncating casts add up to ~3% over the
            # 4-5 roundings of a gated, normalised product; on the GPU this is the usual bf16 ~4e-3.
            assert rel_err(y.cpu(), ref.cpu()) < (1e-2 if ON_GPU else 5e-2), (lead, N, K, form, split)
            # The exact check: every rounding where the reference rounds (ties of the fp32 sums aside).
            same = (y.cpu().float() == mirror.view(y.shape)).float().mean().item()
            assert same >= 0.99, (lead, N, K, form, split, same)


def test_every_gemv_config_computes_a_two_output_head_at_its_planned_split():
    """VoxCPM2's stop head (use_decode_kernels: N = 2 outputs over K = 2048, one row) narrower than every config's
    BLOCK_N, at the split-K the op plans for it on an H100's 132 SMs: every GEMV config the autotuner may pick, and
    each that can hold a program's whole K range with PRELOAD, gives the reference."""
    from ttsaot.builder.kernels import skinny_linear_triton as kernels

    t = _inputs(1, 2, 2048, torch.float32)
    split = plan_split_k(1, 2, 2048, 132, False)
    ref = skinny_linear_reference(t["x"], t["weight"])
    ran = 0
    for c in kernels.GEMV_CONFIGS:
        config = {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}
        preloads = (False, True) if config["BLOCK_K"] >= -(-2048 // split) else (False,)
        for preload in preloads:
            y = launch_skinny_linear(t["x"], t["weight"], config={**config, "PRELOAD": preload}, split_k=split)
            assert rel_err(y.cpu(), ref.cpu()) < 1e-5, (config, preload, split)
            ran += 1
    assert ran > len(kernels.GEMV_CONFIGS)  # some configs preload too


@pytest.mark.parametrize("epilogue", ["norm", "norm_gated", "norm_bias_residual_scaled"])
def test_preloaded_gemv_equals_the_streamed_loop(epilogue):
    """PRELOAD: the program's whole K range is one W tile loaded before the wait, and with no split-K the RMSNorm's
    rstd comes from that same x tile. Against the streamed GEMV loop on the same call: the same products, summed in
    one pass (fp32 order aside); K off the power of two (masked lanes), 1 and 2 rows, split-K 1 and 2."""
    spec = dict(EPILOGUES[epilogue])
    scale = spec.pop("scale", 1.0)
    for i, (m, N, K, split) in enumerate(((1, 40, 100, 1), (2, 24, 200, 1), (1, 34, 200, 2))):
        t = _inputs(None, N, K, torch.float32, lead=(m,), seed=i, **spec)
        kw = dict(norm_eps=1e-5, gated=spec.get("gated", False), residual_scale=scale, split_k=split, use_dot=False)
        block_k = 256 if split == 1 else 128  # the whole K range of a program: 200 in one, 100 in each of two
        pre = launch_skinny_linear(**t, **kw, config={"BLOCK_N": 8, "BLOCK_K": block_k, "PRELOAD": True})
        loop = launch_skinny_linear(**t, **kw, config={"BLOCK_N": 8, "BLOCK_K": 32})
        assert rel_err(pre.cpu(), loop.cpu()) < 1e-6, (m, N, K, split)
        ref = skinny_linear_reference(
            **{k: v for k, v in t.items()}, **{k: kw[k] for k in ("norm_eps", "gated")}, residual_scale=scale
        )
        assert rel_err(pre.cpu(), ref.cpu()) < 1e-5


# (rows, N, K, split-K) per form: the streamed form at BLOCK_N 16, the swapped one at 64 (a warpgroup MMA's rows)
ALTERNATIVE_TILE_CASES = {
    "stream": (16, [((5,), 24, 130, 1), ((20,), 48, 96, 3), ((2, 3), 32, 200, 2)]),
    "swap": (64, [((5,), 80, 130, 1), ((20,), 48, 96, 3), ((2, 3), 72, 200, 2)]),
}


@pytest.mark.parametrize("form", list(ALTERNATIVE_TILE_CASES))
@pytest.mark.parametrize("epilogue", ["norm", "norm_gated", "norm_bias_residual_scaled", "residual"])
def test_alternative_tile_forms_keep_the_rounding_order(epilogue, form):
    """The streamed tensor-core form (registers instead of cp.async stages, its RMSNorm prologue unrolled) and the
    swapped one (W · xᵀ, W the MMA's M side) compute what the tile form computes, with the same roundings: rows 5, 20
    and [2, 3], N and K off the block sizes, splits."""
    spec = dict(EPILOGUES[epilogue])
    scale = spec.pop("scale", 1.0)
    rnd = kernel_rounding(torch.bfloat16)
    block_n, cases = ALTERNATIVE_TILE_CASES[form]
    for i, (lead, N, K, split) in enumerate(cases):
        t = _inputs(None, N, K, torch.bfloat16, lead=lead, seed=i, **spec)
        kw = dict(norm_eps=1e-5, gated=spec.get("gated", False), residual_scale=scale)
        launch = dict(config={"BLOCK_N": block_n, "BLOCK_K": 32}, split_k=split, use_dot=True)
        alt = {"stream": True} if form == "stream" else {"config": {**launch["config"], "SWAP_AB": True}}
        y = launch_skinny_linear(**t, **kw, **{**launch, **alt})
        mirror = _mirror(t["x"], t["weight"], t["bias"], t["norm_weight"], 1e-5, kw["gated"], t["residual"], scale, rnd)
        assert (y.cpu().float() == mirror.view(y.shape)).float().mean().item() >= 0.99, (lead, N, K, split)
        tile = launch_skinny_linear(**t, **kw, **launch)
        if not ON_GPU and form == "stream":  # the interpreter's products are numpy's whatever the tiling
            assert torch.equal(y, tile), (lead, N, K, split)
        else:  # numpy's fp32 sums of the transposed product may differ from the tile form's in the last bit
            assert rel_err(y.cpu(), tile.cpu()) < 1e-2, (lead, N, K, split)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "tile"])
def test_tile_forms_unroll_their_norm_prologue(stream):
    """Both tile forms read the norm's row in TILE_NORM_BLOCK-wide chunks, unrolled; a gated call at 32 rows keeps
    the rolled BLOCK_K loop in the cp.async tile form (at its register limit, measured slower unrolled)."""
    from ttsaot.builder.kernels.skinny_linear import TILE_NORM_BLOCK

    assert norm_block(1024, 22, True, stream=stream) == TILE_NORM_BLOCK
    assert norm_block(100, 22, True, stream=stream) == 128  # one chunk covers a short row
    assert norm_block(1024, 16, True, stream=stream, gated=True) == TILE_NORM_BLOCK
    assert norm_block(1024, 22, True, stream=stream, gated=True) == (TILE_NORM_BLOCK if stream else 0)
    launched = []
    t = _inputs(None, 32, 600, torch.float32, lead=(20,), norm=True)
    launch_skinny_linear(
        **t,
        config={"BLOCK_N": 16, "BLOCK_K": 64},
        use_dot=True,
        stream=stream,
        wrap=lambda k: _record_meta(k, launched),
    )
    ((meta,),) = launched
    assert meta["STREAM"] == stream and meta["NORM_CHUNKS"] == 3 and meta["NORM_BLOCK"] == TILE_NORM_BLOCK


def test_streamed_gated_calls_at_32_rows_are_offered_no_spilling_tile():
    from ttsaot.builder.kernels import skinny_linear_triton as kernels

    prune = kernels.skinny_stream_autotuned.early_config_prune
    kept = prune(kernels.STREAM_CONFIGS, {"M": 22}, GATED=True, BLOCK_M=32)
    assert kept and all(c.kwargs["BLOCK_N"] * c.kwargs["BLOCK_K"] <= kernels.STREAM_GATED_TILE for c in kept)
    assert len(kept) < len(kernels.STREAM_CONFIGS)
    assert prune(kernels.STREAM_CONFIGS, {"M": 22}, GATED=False, BLOCK_M=32) == kernels.STREAM_CONFIGS
    assert prune(kernels.STREAM_CONFIGS, {"M": 16}, GATED=True, BLOCK_M=16) == kernels.STREAM_CONFIGS


@pytest.mark.parametrize("switch", ["stream", "swap_ab"])
def test_the_tile_form_switches_are_read_at_trace_time_and_key_the_packages(monkeypatch, switch):
    from ttsaot.builder import package_cache
    from ttsaot.builder.kernels.skinny_linear import STREAM_ENV, SWAP_AB_ENV, stream_tiles, swap_ab_tiles

    env, read = {"stream": (STREAM_ENV, stream_tiles), "swap_ab": (SWAP_AB_ENV, swap_ab_tiles)}[switch]
    monkeypatch.delenv(env, raising=False)
    off = package_cache._inductor_env()
    assert not read()
    monkeypatch.setenv(env, "1")
    assert read() and package_cache._inductor_env() != off


def test_swapped_form_is_asked_for_16_bit_cp_async_tiles_of_gate_up_and_down_only():
    from ttsaot.builder.kernels.skinny_linear import swaps

    bf16, fp32 = torch.zeros(2, dtype=torch.bfloat16), torch.zeros(2)
    on = dict(use_dot=True, stream=False, swap_ab=True)
    assert swaps(bf16, 16, 6144, 2048, True, **on)  # gate_up
    assert swaps(bf16, 8, 2048, 6144, False, **on)  # down: K ≥ 2·N
    assert not swaps(bf16, 16, 2560, 2048, False, **on)  # qkv
    assert not swaps(bf16, 16, 2048, 2048, False, **on)  # o
    assert not swaps(bf16, 22, 8192, 1024, True, **on)  # a 32-row tile (the LocDiT's 22 rows)
    assert not swaps(fp32, 16, 6144, 2048, True, **on)  # exact fp32 products: no warpgroup MMA
    assert not swaps(bf16, 2, 6144, 2048, True, **{**on, "use_dot": False})  # the GEMV form (≤ 2 rows)
    assert not swaps(bf16, 16, 6144, 2048, True, **{**on, "stream": True})
    assert not swaps(bf16, 16, 6144, 2048, True, **{**on, "swap_ab": False})


def _record_meta(kernel, seen):
    class _Launch:
        def __getitem__(self, grid):
            def call(*args, **kw):
                seen.append((kw,))
                return kernel[grid](*args, **kw)

            return call

    return _Launch()


def test_kernel_is_deterministic_with_split_k():
    t = _inputs(None, 64, 300, torch.bfloat16, lead=(4,), norm=True, residual=True, gated=True)
    runs = [
        launch_skinny_linear(**t, gated=True, config={"BLOCK_N": 16, "BLOCK_K": 32}, split_k=4, use_dot=False)
        for _ in range(2)
    ]
    assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize("epilogue", ["plain", "norm_bias_residual_scaled", "norm_gated"])
@pytest.mark.parametrize("form", ["gemv", "dot"])
def test_fused_split_k_reduction_equals_the_epilogue_kernel(epilogue, form):
    """With a semaphore workspace the tile's last program adds the partials in split order: the same bits as the
    second (epilogue) kernel, one launch, and the counters are zero again afterwards, so the workspace serves the
    next call (and the next op) unchanged."""
    spec = dict(EPILOGUES[epilogue])
    scale = spec.pop("scale", 1.0)
    sem = torch.zeros(64, dtype=torch.int32, device=DEVICE)
    for i, (lead, N, K, split) in enumerate([((3,), 48, 200, 2), ((20,), 40, 130, 3), ((2, 3), 34, 96, 4)]):
        t = _inputs(None, N, K, torch.bfloat16, lead=lead, seed=i, **spec)
        kw = dict(norm_eps=1e-5, gated=spec.get("gated", False), residual_scale=scale, split_k=split)
        kw.update(config={"BLOCK_N": 16, "BLOCK_K": 32}, use_dot=form == "dot")
        launched: list = []
        two = launch_skinny_linear(**t, **kw)
        for _ in range(2):
            fused = launch_skinny_linear(**t, **kw, semaphores=sem, wrap=lambda k, seen=launched: seen.append(k) or k)
            assert torch.equal(fused, two), (lead, N, K, split)
            assert torch.count_nonzero(sem).item() == 0
        assert len(launched) == 2  # one kernel per call


def test_fused_split_k_refuses_a_short_workspace():
    t = _inputs(None, 64, 200, torch.float32, lead=(3,))
    for sem in (torch.zeros(3, dtype=torch.int32, device=DEVICE), torch.zeros(64, device=DEVICE)):
        with pytest.raises(RuntimeError, match="semaphores must be"):
            launch_skinny_linear(**t, split_k=2, use_dot=True, config={"BLOCK_N": 16, "BLOCK_K": 32}, semaphores=sem)


@pytest.mark.parametrize("epilogue", ["norm", "residual", "norm_gated"])
def test_launches_pass_each_kernel_only_its_own_arguments(epilogue):
    """Compiled Triton refuses a keyword its kernel does not declare (the interpreter does not): the split-K
    epilogue kernel got HAS_NORM and crashed on the H100 (Qwen code_predictor down, M = 16)."""
    spec = EPILOGUES[epilogue]
    t = _inputs(None, 48, 96, torch.float32, lead=(3,), **spec)
    launched = []

    def checked(kernel):
        def launcher(grid):
            def call(*args, **kw):
                names = kernel.arg_names
                assert len(args) + len(kw) <= len(names) and set(kw) <= set(names[len(args) :]), sorted(
                    set(kw) - set(names)
                )
                launched.append(kernel)
                return kernel[grid](*args, **kw)

            return call

        class _Wrapped:
            def __getitem__(self, grid):
                return launcher(grid)

        return _Wrapped()

    launch_skinny_linear(
        **t,
        gated=spec.get("gated", False),
        split_k=2,
        use_dot=True,
        wrap=checked,
        config={"BLOCK_N": 16, "BLOCK_K": 32},
    )
    assert len(launched) == 2  # the split-K pass and its epilogue


def test_rows_above_the_threshold_take_the_aten_path():
    assert kernel_rows(torch.empty(16, 8)) and kernel_rows(torch.empty(2, 16, 8))
    assert not kernel_rows(torch.empty(MAX_KERNEL_ROWS + 1, 8)) and not kernel_rows(torch.empty(4, 11, 8))


def test_gemv_norm_prologue_reads_the_row_in_one_chunk_where_it_fits():
    assert norm_block(2560, 1, False) == 4096 and norm_block(2048, 1, False) == 2048  # Fish, VoxCPM2: one step
    assert norm_block(100, 1, False) == 128 and norm_block(2560, 2, False) == NORM_ROW_ELEMENTS // 2
    assert norm_block(3 * NORM_ROW_ELEMENTS, 1, False) == NORM_ROW_ELEMENTS  # longer rows: chunks of that size
    assert norm_block(2560, 16, True) == 256  # the tile form: 256-wide chunks, unrolled


def test_split_k_plan():
    for m, n, k, dot in (
        (1, 2048, 2048, False),
        (16, 1024, 3072, True),
        (1, 256, 8192, False),
        (176, 6144, 2560, True),
    ):
        s = plan_split_k(m, n, k, 132, dot)
        assert s >= 1 and s & (s - 1) == 0 and (s == 1 or k // s >= MIN_SPLIT_K_CHUNK)
    assert plan_split_k(1, 2048, 2048, 132, False) == 1  # VoxCPM2 o_proj: 256 GEMV programs fill the GPU
    assert plan_split_k(16, 1024, 3072, 132, True) == 2  # Qwen predictor down: 64 tensor-core tiles do not
    assert plan_split_k(176, 19456, 2560, 132, True) == 1  # Fish gate_up with 176 rows fills the GPU
    # swapped (64-row W tiles), the VoxCPM2 LM steps at 16 rows: gate_up's 96 tiles unsplit, down's 32 in 4 K ranges
    # (the H200 sweep's best), qkv's 40 in 2, each range ≥ SWAP_MIN_SPLIT_K_CHUNK
    for n, k, want in ((6144, 2048, 1), (2048, 6144, 4), (2560, 2048, 2), (2048, 2048, 4)):
        assert plan_split_k(16, n, k, 132, True, swapped=True) == want, (n, k)
    assert plan_split_k(16, 2048, 1024, 132, True, swapped=True) == 2  # K 1024: no range below 512


def test_tile_width_rule_picks_the_swept_best():
    """BLOCK_N of the tensor-core form by rule (the H100 sweeps' fastest width at these shapes), and the autotuner
    is offered only that width's configs."""
    from ttsaot.builder.kernels import skinny_linear_triton as kernels

    widths = [c.kwargs["BLOCK_N"] for c in kernels.GEMM_CONFIGS]
    cases = {  # (rows, N_out, split): swept best width
        (16, 2560, 1): 32,  # VoxCPM2 qkv, B = 16
        (16, 2048, 1): 16,  # o
        (16, 6144, 1): 32,  # gate_up (N_out of the gated pair)
        (4, 2048, 2): 32,  # o split in 2
        (22, 2560, 1): 32,  # LocDiT qkv
        (22, 4096, 1): 32,  # LocDiT gate_up
        (22, 1024, 1): 16,  # LocDiT o, down
        (22, 100, 1): 16,  # too few columns for half the SMs at any width: the narrowest
    }
    for (rows, n_out, split), want in cases.items():
        block_m = 16 if rows <= 16 else 32
        assert tile_block_n(rows, n_out, split, block_m, 132, widths) == want, (rows, n_out, split)
    x = torch.empty(22, 1024)
    named = {"x_ptr": x, "M": 22, "N_OUT": 4096, "K": 1024}
    kept = kernels.skinny_gemm_autotuned.early_config_prune(kernels.GEMM_CONFIGS, named, SPLIT_K=1, BLOCK_M=32)
    assert kept and {c.kwargs["BLOCK_N"] for c in kept} == {32}
    named["N_OUT"] = 1024
    kept = kernels.skinny_gemm_autotuned.early_config_prune(kernels.GEMM_CONFIGS, named, SPLIT_K=1, BLOCK_M=32)
    assert len(kept) == 2 and {c.kwargs["BLOCK_N"] for c in kept} == {16}  # both depths still tuned


def test_tile_stages_fit_the_gpus_shared_memory():
    """The tile form keeps its bf16 configs on sm_90, and takes the deepest pipeline that fits where fp32 operands
    (twice the bytes) would overflow its shared memory: an fp32 launch on the H200 raised Triton OutOfResources
    (265,216 > 232,448 bytes). The pruning hands out the same config objects on every call."""
    from ttsaot.builder.kernels import skinny_linear_triton as kernels
    from ttsaot.builder.kernels.common import DEFAULT_SHARED_MEMORY

    prune = kernels.skinny_gemm_autotuned.early_config_prune
    wide = [c for c in kernels.GEMM_CONFIGS if c.kwargs["BLOCK_N"] == 32]
    for dtype, gated, stages in ((torch.bfloat16, True, 4), (torch.float32, False, 3), (torch.float32, True, 2)):
        named = {"x_ptr": torch.empty(22, 2048, dtype=dtype), "M": 22, "N_OUT": 4096, "K": 2048}
        kept = prune(kernels.GEMM_CONFIGS, named, SPLIT_K=1, BLOCK_M=32, GATED=gated)
        assert [(c.kwargs, c.num_warps) for c in kept] == [(c.kwargs, c.num_warps) for c in wide]
        assert [c.num_stages for c in kept] == [stages], (dtype, gated)
        size = torch.empty((), dtype=dtype).element_size()
        assert all(kernels.tile_shared_memory(c, 32, size, gated) <= DEFAULT_SHARED_MEMORY for c in kept)
        assert kept == prune(kernels.GEMM_CONFIGS, named, SPLIT_K=1, BLOCK_M=32, GATED=gated)  # same objects
    assert prune(kernels.GEMM_CONFIGS, named, SPLIT_K=1, BLOCK_M=32, GATED=False)[0] is not wide[0]
    bf16 = {**named, "x_ptr": torch.empty(22, 2048, dtype=torch.bfloat16)}
    assert prune(kernels.GEMM_CONFIGS, bf16, SPLIT_K=1, BLOCK_M=32, GATED=True) == wide  # unchanged objects
    # a GPU with less shared memory (A100's 166,912 bytes) takes shallower bf16 pipelines too
    (small,) = kernels.fit_shared_memory(wide, 32, 2, True, 166_912)
    assert small.num_stages == 3 and kernels.tile_shared_memory(small, 32, 2, True) <= 166_912
    assert kernels.fit_shared_memory(wide, 32, 4, True, 64 * 1024) == []  # nothing fits: nothing offered


def test_one_row_takes_the_swept_gemv_config():
    """At one row the GEMV autotuner is offered one config, by epilogue: a gated call BLOCK_N 16 × BLOCK_K 256 × 4
    warps, a normed ungated one (qkv) 8 × 512 × 4 warps, any other 8 × 1024 × 8 warps where 1024 divides the K range
    (the VoxCPM2 shapes) and 8 × 512 × 4 warps where it does not (the Fish fast_ar's K = 2560, 9728); at two rows the
    three configs they autotuned over before the one-row gated config."""
    from ttsaot.builder.kernels import skinny_linear_triton as kernels

    prune = kernels.skinny_gemv_autotuned.early_config_prune
    wide, narrow, gated = (
        ({"BLOCK_N": 8, "BLOCK_K": 1024, "PRELOAD": False}, 8),
        ({"BLOCK_N": 8, "BLOCK_K": 512, "PRELOAD": False}, 4),
        ({"BLOCK_N": 16, "BLOCK_K": 256, "PRELOAD": False}, 4),
    )
    for k, flags, want in (
        (6144, {}, wide),
        (2048, {"HAS_RESIDUAL": True}, wide),
        (2560, {}, narrow),
        (9728, {"HAS_RESIDUAL": True}, narrow),
        (2048, {"HAS_NORM": True}, narrow),
        (1024, {"HAS_NORM": True, "GATED": True}, gated),
        (2560, {"HAS_NORM": True, "GATED": True}, gated),
    ):
        (one,) = prune(kernels.GEMV_CONFIGS, {"M": 1, "N_OUT": 2048, "K": k, "K_SPLIT": k}, **flags)
        assert (one.kwargs, one.num_warps) == want, (k, flags)
    # a split call is judged by its K range, not K
    (one,) = prune(kernels.GEMV_CONFIGS, {"M": 1, "N_OUT": 2048, "K": 2560, "K_SPLIT": 1024})
    assert one.kwargs["BLOCK_K"] == 1024
    # two rows: the three configs of the H100 sweep at M = 2, not the one-row gated one
    two = prune(kernels.GEMV_CONFIGS, {"M": 2, "N_OUT": 2048, "K": 6144, "K_SPLIT": 6144}, GATED=True)
    assert two == kernels.GEMV_CONFIGS[:3]
    # every autotuned config names PRELOAD (AOTInductor launches a user kernel with the chosen config's constants)
    for c in (*kernels.GEMV_CONFIGS, *kernels.GEMM_CONFIGS, *kernels.STREAM_CONFIGS):
        assert isinstance(c.kwargs.get("PRELOAD"), bool), c


def test_one_row_calls_preload_their_whole_k_range_where_the_grid_is_small(monkeypatch):
    """A one-row call whose K range fits 4096 and whose PRELOAD grid has ≤ PRELOAD_PROGRAMS_PER_SM programs per SM
    takes the PRELOAD config whose tile covers the range (64 W values per thread at 4 warps): the code predictor's
    four projections and the Fish fast_ar's o; not its qkv (3,072 programs) or gate_up (9,728), a longer range, two
    rows, or any call with TTSAOT_GEMV_PRELOAD=0."""
    from ttsaot.builder.kernels import skinny_linear_triton as kernels

    prune = kernels.skinny_gemv_autotuned.early_config_prune
    x = torch.empty(1, 8, dtype=torch.bfloat16)  # off-GPU: the plan's DEFAULT_MULTIPROCESSORS (132)

    def one(n_out, k_range, **flags):
        (config,) = prune(kernels.GEMV_CONFIGS, {"x_ptr": x, "M": 1, "N_OUT": n_out, "K": 9728, "K_SPLIT": k_range},
                          **flags)  # fmt: skip
        return config

    for n_out, k_range, flags, want in (
        (4096, 1024, {"HAS_NORM": True}, (8, 1024)),  # code_predictor qkv
        (3072, 1024, {"HAS_NORM": True, "GATED": True}, (4, 1024)),  # gate_up: 768 programs
        (1024, 2048, {"HAS_RESIDUAL": True}, (4, 2048)),  # o
        (1024, 3072, {"HAS_RESIDUAL": True}, (2, 4096)),  # down: 3072 in a 4096 tile
        (2560, 4096, {"HAS_RESIDUAL": True}, (2, 4096)),  # Fish fast_ar o: 1,280 programs
        (1024, 1536, {}, (4, 2048)),
    ):
        c = one(n_out, k_range, **flags)
        assert c.kwargs["PRELOAD"] and (c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]) == want, (n_out, k_range, flags)
        rows = 2 if flags.get("GATED") else 1
        assert c.kwargs["BLOCK_K"] >= k_range and c.kwargs["BLOCK_N"] * c.kwargs["BLOCK_K"] * rows == 64 * 128
    assert not one(6144, 2560, HAS_NORM=True).kwargs["PRELOAD"]  # fast_ar qkv: 3,072 programs
    assert not one(9728, 2560, HAS_NORM=True, GATED=True).kwargs["PRELOAD"]  # fast_ar gate_up: 9,728
    assert not one(2048, 6144).kwargs["PRELOAD"]  # longer than one tile
    assert (
        prune(kernels.GEMV_CONFIGS, {"x_ptr": x, "M": 2, "N_OUT": 1024, "K": 1024, "K_SPLIT": 1024})
        == (kernels.GEMV_CONFIGS[:3])
    )
    monkeypatch.setenv(kernels.PRELOAD_ENV, "0")
    assert not one(4096, 1024, HAS_NORM=True).kwargs["PRELOAD"]


def test_shape_and_dtype_errors():
    x, w = torch.randn(2, 8), torch.randn(6, 8)
    with pytest.raises(RuntimeError, match="does not end in K"):
        skinny_linear(torch.randn(2, 7), w)
    with pytest.raises(RuntimeError, match="share a float dtype"):
        skinny_linear(x.bfloat16(), w)
    with pytest.raises(RuntimeError, match="even N"):
        skinny_linear(x, torch.randn(5, 8), gated=True)
    with pytest.raises(RuntimeError, match="residual must be"):
        skinny_linear(x, w, residual=torch.randn(2, 5))
    with pytest.raises(RuntimeError, match="contiguous"):
        skinny_linear(x, torch.randn(8, 6).t())
    with pytest.raises(RuntimeError, match="norm_weight must be"):
        skinny_linear(x, w, norm_weight=torch.ones(6))


# --------------------------------------------------------------------------------------------- export
class _TwoLinears(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.g = torch.nn.Parameter(torch.rand(16) + 0.5)
        self.w1 = torch.nn.Parameter(torch.randn(24, 16) / 4)
        self.w2 = torch.nn.Parameter(torch.randn(16, 12) / 4)

    def forward(self, x):
        h = skinny_linear(x, self.w1, norm_weight=self.g, norm_eps=1e-5, gated=True)
        return skinny_linear(h, self.w2, residual=x, residual_scale=0.5)


def test_export_keeps_one_node_per_call_and_cpu_lowers_to_aten():
    m, x = _TwoLinears(), torch.randn(3, 16)
    with torch.no_grad():
        ep = torch.export.export(m, (x,), strict=False)
        ops = [n.target for n in ep.graph.nodes if n.op == "call_function"]
        assert ops.count(SL) == 2 and len(ops) == 2
        for lowered in (
            ep.run_decompositions({**torch.export.default_decompositions(), **CPU_DECOMPOSITIONS}),
            lower_for_cpu(ep),
        ):  # a lowering table (as the ONNX exporter applies one), and lower_for_cpu (CPU builds)
            targets = {str(n.target) for n in lowered.graph.nodes if n.op == "call_function"}
            assert not any("ttsaot" in t for t in targets)
            assert any("mm" in t or "linear" in t for t in targets)  # lower_for_cpu leaves aten.linear to Inductor
            torch.testing.assert_close(lowered.module()(x), m(x))


# ------------------------------------------------------------------------------------ GPU, real shapes
REAL_SHAPES = {  # name: (N, K, epilogue) as the stages use them
    "voxcpm2_qkv_norm": (2560, 2048, {"norm": True}),
    "voxcpm2_o_residual": (2048, 2048, {"residual": True}),
    "voxcpm2_gate_up_norm_silu": (12288, 2048, {"norm": True, "gated": True}),
    "voxcpm2_down_residual": (2048, 6144, {"residual": True}),
    # the LM steps' own Linears (use_decode_kernels): FSQ in / out, stop projection and head, residual fusion
    "voxcpm2_fsq_in_bias": (512, 2048, {"bias": True}),
    "voxcpm2_fsq_out_bias": (2048, 512, {"bias": True}),
    "voxcpm2_stop_proj_bias": (2048, 2048, {"bias": True}),
    "voxcpm2_stop_head": (2, 2048, {}),
    "voxcpm2_fusion_concat_bias": (2048, 4096, {"bias": True}),
    "fish_qkv_norm": (6144, 2560, {"norm": True}),
    "fish_gate_up_norm_silu": (19456, 2560, {"norm": True, "gated": True}),
    "fish_down_residual": (2560, 9728, {"residual": True}),
    "qwen_cp_qkv_norm": (4096, 1024, {"norm": True}),
    "locdit_o_residual": (1024, 2048, {"residual": True}),
}


def _bf16_mirror(t: dict, gated: bool, scale: float) -> torch.Tensor:
    """`_mirror` of `_inputs`' tensors at eps 1e-5 with the kernels' bf16 rounding."""
    rnd = kernel_rounding(torch.bfloat16)
    return _mirror(t["x"], t["weight"], t["bias"], t["norm_weight"], 1e-5, gated, t["residual"], scale, rnd)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("M", [1, 3, 16, 176])
@pytest.mark.parametrize("name", list(REAL_SHAPES))
def test_gpu_real_shapes_autotuned(name, M):
    N, K, spec = REAL_SHAPES[name]
    t = _inputs(M, N, K, torch.bfloat16, **spec)
    gated = spec.get("gated", False)
    y = skinny_linear(**t, norm_eps=1e-5, gated=gated, residual_scale=0.7 if spec.get("residual") else 1.0)
    ref = skinny_linear_reference(**t, norm_eps=1e-5, gated=gated, residual_scale=0.7 if spec.get("residual") else 1.0)
    if not kernel_rows(t["x"]):
        # More rows than the kernels take: the op is its aten reference (cuBLAS), whose reduction order is cuBLAS's
        # (H100: 55 % of the two-output stop head's values bit-equal to the kernels' documented order at M = 176).
        assert torch.equal(y, ref)
        return
    assert rel_err(y.float(), ref.float()) < 1e-2
    mirror = _bf16_mirror(t, gated, 0.7 if spec.get("residual") else 1.0)
    assert (y.cpu().float() == mirror).float().mean().item() >= 0.99
    again = skinny_linear(**t, norm_eps=1e-5, gated=gated, residual_scale=0.7 if spec.get("residual") else 1.0)
    assert torch.equal(y, again)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("form, M", [("stream", m) for m in (3, 11, 16, 22)] + [("swap", m) for m in (3, 16, 22)])
@pytest.mark.parametrize("name", list(REAL_SHAPES))
def test_gpu_real_shapes_alternative_tile_forms(name, form, M):
    """The streamed tile form and the swapped one (warpgroup MMAs on sm_90) at the stages' shapes, every autotuning
    candidate, unsplit and split (streamed: in 2; swapped: its planned split), and the swapped form's autotuned plan:
    the documented rounding order (≥ 99% of outputs bit-equal to the mirror) and deterministic."""
    from ttsaot.builder.kernels import skinny_linear_triton as kernels

    N, K, spec = REAL_SHAPES[name]
    t = _inputs(M, N, K, torch.bfloat16, **spec)
    gated = spec.get("gated", False)
    scale = 0.7 if spec.get("residual") else 1.0
    kw = dict(norm_eps=1e-5, gated=gated, residual_scale=scale)
    mirror = _bf16_mirror(t, gated, scale)
    if form == "stream":
        configs, splits, alt = kernels.STREAM_CONFIGS, (1,) if gated else (1, 2), {"stream": True}
    else:
        y = launch_skinny_linear(**t, **kw, swap_ab=True)
        assert (y.cpu().float() == mirror).float().mean().item() >= 0.99
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        planned = plan_split_k(M, N // 2 if gated else N, K, sms, True, swapped=True)
        configs, splits, alt = kernels.SWAP_CONFIGS, sorted({1, planned}), {"SWAP_AB": True}
    for c in configs:
        config = {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}
        for split in splits:
            if form == "stream":
                launch = dict(config=config, split_k=split, use_dot=True, **alt)
            else:
                launch = dict(config={**config, **alt}, split_k=split, use_dot=True)
            try:
                y = launch_skinny_linear(**t, **kw, **launch)
            except Exception as e:  # noqa: BLE001 - a swapped config past the shared memory: the op's launches prune it
                assert form == "swap" and "OutOfResources" in type(e).__name__, (config, split, e)
                continue
            assert (y.cpu().float() == mirror).float().mean().item() >= 0.99, (config, split)
            assert torch.equal(y, launch_skinny_linear(**t, **kw, **launch)), (config, split)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
def test_gpu_fp32_weights():
    t = _inputs(4, 1000, 1000, torch.float32, bias=True, norm=True, residual=True)
    y = skinny_linear(**t, residual_scale=0.3)
    ref = skinny_linear_reference(**{k: None if v is None else v.double() for k, v in t.items()}, residual_scale=0.3)
    assert rel_err(y, ref) < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("M", [4, 22])
@pytest.mark.parametrize("name", ["fish_qkv_norm", "fish_gate_up_norm_silu", "voxcpm2_down_residual"])
def test_gpu_fp32_real_shapes_fit_shared_memory(name, M):
    """fp32 at the stages' full sizes in the tile form (`--dtype fp32` CUDA builds): the autotuned launch fits the
    GPU's shared memory and computes the reference in fp32."""
    N, K, spec = REAL_SHAPES[name]
    t = _inputs(M, N, K, torch.float32, **spec)
    kw = dict(norm_eps=1e-5, gated=spec.get("gated", False), residual_scale=0.7 if spec.get("residual") else 1.0)
    y = skinny_linear(**t, **kw)
    ref = skinny_linear_reference(**{k: None if v is None else v.double() for k, v in t.items()}, **kw)
    assert rel_err(y, ref) < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("split", [2, 4, 8])
@pytest.mark.parametrize("name", ["locdit_down", "locdit_gate_up"])
def test_gpu_fused_split_k_under_contention(name, split):
    """Many programs per tile counter, 200 calls back to back on one workspace (the graph's reuse): every output
    equals the two-kernel result bit for bit and the counters end zeroed (a lost partial or a missed reset would
    show as a wrong or stale tile)."""
    N, K, spec = {
        "locdit_down": (1024, 4096, {"residual": True}),
        "locdit_gate_up": (8192, 1024, {"norm": True, "gated": True}),
    }[name]
    t = _inputs(22, N, K, torch.bfloat16, **spec)
    kw = dict(gated=spec.get("gated", False), split_k=split, use_dot=True)
    kw["config"] = {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4}
    sem = torch.zeros(1 << 14, dtype=torch.int32, device=DEVICE)
    two = launch_skinny_linear(**t, **kw)
    outs = [launch_skinny_linear(**t, **kw, semaphores=sem) for _ in range(200)]
    torch.cuda.synchronize()
    assert all(torch.equal(y, two) for y in outs)
    assert torch.count_nonzero(sem).item() == 0
