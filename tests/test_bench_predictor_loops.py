"""The per-step loop baselines of the codebook predictors (bench/predictor_loops.py) return the stage's codes.

CPU, tiny presets, fp32: `loop_eager_host` and the code path of `loop_compile_graph` (torch.compile with the
`aot_eager` backend instead of Inductor, with and without a CPU stand-in for the per-step CUDA graph capture) give
the same codes (and next-embedding output) as the stage module's `forward`, over mixed sampling parameters, greedy
rows, top-k and top-p, and over consecutive frames reusing one KV cache."""

from __future__ import annotations

import copy

import pytest
import torch

from bench.common import Skipped
from bench.predictor_loops import (
    LoopCompileGraphVariant,
    LoopEagerHostVariant,
    PredictorLoop,
    PredictorSteps,
    adapter_for,
)
from bench.variants import VariantContext, make_variant

CPU = torch.device("cpu")
PREDICTORS = [
    ("fish-s2-pro", "fast_ar", "fast_ar_with_embedding"),
    ("qwen3-tts-12hz", "code_predictor", "code_predictor_with_embedding"),
]


def _context(family: str, stage: str, emb_option: str, with_embedding: bool) -> VariantContext:
    from ttsaot.builder.families import get_family

    fam = get_family(family)
    opts = fam.options(preset="tiny", dtype=torch.float32, seed=3, **{emb_option: with_embedding})
    spec = fam.specs(opts, [stage])[0]
    original = spec.make_module().eval()
    rewritten = copy.deepcopy(original)
    for p in spec.passes:
        p(rewritten)
    return VariantContext(
        family=family,
        stage=stage,
        spec=spec,
        device=CPU,
        original=original,
        rewritten=rewritten,
        artifact=None,
        artifact_error=None,
    )


@pytest.fixture(
    scope="module",
    params=[(*p, emb) for p in PREDICTORS for emb in (False, True)],
    ids=lambda p: f"{p[1]}{'+emb' if p[3] else ''}",
)
def ctx(request):
    # grad off while this module's tests run, and back as it was after them: left off, it changed the exported
    # programs of later builds on the worker (another package-cache key: a reuse missed)
    enabled = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    yield _context(*request.param)
    torch.set_grad_enabled(enabled)


# Sampling regimes: the stage's own random mix (greedy, top-k, top-p and plain rows), all greedy, top-k only,
# top-p only, and hot plain sampling.
REGIMES = ("mixed", "greedy", "top_k", "top_p", "hot")


def _inputs(ctx: VariantContext, batch: int, seed: int, regime: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    named = ctx.spec.make_inputs({"batch": batch}, g)
    t, k, p = named["temperature"], named["top_k"], named["top_p"]
    if regime == "greedy":
        t.zero_()
    elif regime == "top_k":
        t.fill_(0.8), k.copy_(torch.randint(1, 6, k.shape, generator=g)), p.fill_(1.0)
    elif regime == "top_p":
        t.fill_(1.0), k.zero_(), p.copy_(torch.rand(p.shape, generator=g) * 0.6 + 0.3)
    elif regime == "hot":
        t.fill_(2.0), k.zero_(), p.fill_(1.0)
    return [named[n] for n in ctx.spec.input_names]


def _assert_same(out, ref) -> None:
    out = out if isinstance(out, tuple) else (out,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    assert len(out) == len(ref)
    assert out[0].dtype == torch.int64 and torch.equal(out[0], ref[0])
    for o, r in zip(out[1:], ref[1:]):  # next-embedding output: same ops, attention rounding aside
        assert o.dtype == r.dtype and o.shape == r.shape
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)


def _check_variant(v, ctx: VariantContext, after_setup=None) -> None:
    """Each batch size prepared once, then several frames (regimes, seeds) through the same KV cache."""
    v.setup()
    if after_setup is not None:
        after_setup(v)
    try:
        for batch in (1, 8):
            fn = v.prepare({"batch": batch}, _inputs(ctx, batch, 100 + batch, "mixed"))
            for i, regime in enumerate(REGIMES):
                xs = _inputs(ctx, batch, 7 * i + batch, regime)
                _assert_same(fn(xs), ctx.original(*xs))
    finally:
        v.close()


def test_eager_host_loop_matches_stage(ctx):
    _check_variant(LoopEagerHostVariant(ctx), ctx)


def test_compiled_loop_matches_stage(ctx):
    v = LoopCompileGraphVariant(ctx)
    v.compile_backend = "aot_eager"  # Dynamo + AOTAutograd (functionalised in-place cache writes), no Inductor
    _check_variant(v, ctx)


def _fake_capture(fn, static_inputs, device, pool=None):
    """CPU stand-in for `capture_graph` with CUDA-graph semantics: the call reads its static input buffers
    only (callers' tensors are copied in), and returns the same output buffer every replay."""
    static_out = fn(*static_inputs).clone()

    def run(inputs):
        for dst, src in zip(static_inputs, inputs):
            if dst.data_ptr() != src.data_ptr():
                dst.copy_(src)
        static_out.copy_(fn(*static_inputs))
        return static_out

    return run


def test_graph_plumbing_matches_stage(ctx):
    """The per-step graph path (static code buffer, per-step position/table inputs, aliased outputs)."""
    v = LoopCompileGraphVariant(ctx)
    v.compile_backend = "aot_eager"

    def graphs_on_cpu(v):
        v.use_graphs, v.capture = True, _fake_capture

    _check_variant(v, ctx, graphs_on_cpu)


def test_one_new_position_per_step(ctx):
    """No re-prefill: step 1 decodes positions 0 and 1, every later step one position with the cache."""
    steps = PredictorSteps(adapter_for(ctx, ctx.rewritten))
    xs = _inputs(ctx, 2, 0, "mixed")
    loop = PredictorLoop(steps, ctx.spec.input_names, 2, CPU)
    widths = []

    def first(hidden, first, *kv):
        widths.append(steps.a.prefix(hidden, first).shape[1])
        return steps.first_step(hidden, first, *kv)

    def nxt(code, pos, *rest):
        widths.append(steps.a.embed(code, *rest[: steps.n_embed_w]).shape[1])
        return steps.next_step(code, pos, *rest)

    _assert_same(loop.run(xs, loop.direct(first, nxt), host_sync=True), ctx.original(*xs))
    assert widths == [2] + [1] * (steps.a.n_steps - 1)


def test_non_predictor_stage_is_skipped():
    from bench.specs import make_spec

    spec, _ = make_spec("qwen3-tts-12hz", "code2wav", "tiny", dtype="fp32")
    ctx = VariantContext(
        family="qwen3-tts-12hz",
        stage="code2wav",
        spec=spec,
        device=CPU,
        original=torch.nn.Identity(),
        rewritten=torch.nn.Identity(),
        artifact=None,
        artifact_error=None,
    )
    for cls in (LoopEagerHostVariant, LoopCompileGraphVariant):
        with pytest.raises(Skipped, match="only for codebook_predictor stages"):
            cls(ctx)
    with pytest.raises(Skipped, match="only for codebook_predictor stages"):
        make_variant("loop_eager_host", ctx)


def test_registered_in_harness():
    from bench.variants import ALL_VARIANTS, COMPILED, CUDA_ONLY

    i = ALL_VARIANTS.index("compile_ro")
    assert ALL_VARIANTS[i + 1 : i + 3] == ("loop_eager_host", "loop_compile_graph")
    assert "loop_compile_graph" in COMPILED and "loop_compile_graph" in CUDA_ONLY
    ctx = _context("fish-s2-pro", "fast_ar", "fast_ar_with_embedding", False)
    assert isinstance(make_variant("loop_eager_host", ctx), LoopEagerHostVariant)
    with pytest.raises(Skipped, match="needs CUDA"):
        make_variant("loop_compile_graph", ctx)
