"""Codebook predictors on the GPU (run on the GPU machine): one CUDA-graph replay per frame, sampling included.

fp32 artifacts must reproduce the eager module's codes exactly given the same noise; bf16 artifacts (the default)
are checked for self-consistency: each sampled code is the Gumbel-max choice under the eager bf16 logits,
teacher-forced on the artifact's own codes, up to bf16 rounding, and the embedding output equals the table sum
of the artifact's codes, at the tiny presets and at full size. Latency is the bench's (`python -m bench run`)."""

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from ttsaot.builder.families.fish_s2_pro import FAMILY as FISH  # noqa: E402
from ttsaot.builder.families.fish_s2_pro import stages as fst  # noqa: E402
from ttsaot.builder.families.fish_s2_pro.options import FishS2Options  # noqa: E402
from ttsaot.builder.families.qwen3_tts_12hz import FAMILY as QWEN  # noqa: E402
from ttsaot.builder.families.qwen3_tts_12hz import stages as qst  # noqa: E402
from ttsaot.builder.families.qwen3_tts_12hz.options import Qwen3TTSOptions  # noqa: E402
from ttsaot.builder.predictor import random_sampling_inputs  # noqa: E402

FISH = FISH.name
from ttsaot.builder.passes import cast_to_compute_dtype  # noqa: E402
from ttsaot.runtime import load  # noqa: E402

from ..conftest import rel_err  # noqa: E402
from ..sampling_checks import gumbel_max_violations  # noqa: E402
from . import build_on_gpu, gpu_artifact  # noqa: E402


def _fish(dtype, buckets=(1, 4), preset="tiny"):
    return fst.fast_ar_stage(
        FishS2Options(preset=preset, dtype=dtype, batch_buckets=buckets, fast_ar_with_embedding=True)
    )


def _qwen(dtype, buckets=(1, 4), preset="tiny", size="0.6B"):
    return qst.code_predictor_stage(
        Qwen3TTSOptions(
            preset=preset, talker_size=size, dtype=dtype, batch_buckets=buckets, code_predictor_with_embedding=True
        )
    )


# One artifact per family and dtype, each its own test, so that a run builds the four on separate workers (the
# two families' fixture took 129 s fp32 and 211 s bf16 cold at 97e2f69, on one worker each; half of it is marked)
@pytest.fixture(
    scope="module",
    params=[
        pytest.param(("fast_ar", "fp32"), marks=pytest.mark.compiles(82), id="fast_ar-fp32"),
        pytest.param(("code_predictor", "fp32"), marks=pytest.mark.compiles(87), id="code_predictor-fp32"),
        pytest.param(("fast_ar", "bf16"), marks=pytest.mark.compiles(112), id="fast_ar-bf16"),
        pytest.param(("code_predictor", "bf16"), marks=pytest.mark.compiles(156), id="code_predictor-bf16"),
    ],
)
def built(request):
    name, dt = request.param
    dtype = torch.float32 if dt == "fp32" else torch.bfloat16
    # the builds verify their golden cases
    if name == "fast_ar":
        spec = _fish(dtype)
        art = gpu_artifact(f"fast-ar-{dt}", FISH, [spec])
    else:
        spec = _qwen(dtype)
        art = gpu_artifact(f"code-predictor-{dt}", QWEN.name, [spec])
    return dtype, spec, load(art, device="cuda")[name]


def _eager(spec, dtype):
    import copy

    m = spec.make_module()
    m = copy.deepcopy(m)
    for p in spec.passes:
        p(m)
    return cast_to_compute_dtype(m, dtype).cuda().eval()


def _case(stage, spec, B, seed):
    g = torch.Generator().manual_seed(seed)
    x = {k: v.cuda() for k, v in spec.make_inputs({"batch": B}, g).items()}
    steps, width = stage.noise_shape
    x.update(random_sampling_inputs(B, steps, width, g))  # real sampling mix, not the golden one
    return {k: v.cuda() for k, v in x.items()}


def test_graphs_replay_and_match_eager(built):
    dtype, spec, stage = built
    assert stage.uses_cuda_graphs
    eager = _eager(spec, dtype)
    for B, seed in ((1, 0), (4, 1), (3, 2)):
        x = _case(stage, spec, B, seed)
        args = [x[n] for n in spec.input_names]
        codes, emb = stage(*args)
        again, _ = stage(*args)
        assert torch.equal(codes, again)  # replay is deterministic
        if dtype == torch.float32:
            with torch.no_grad():
                ref_codes, ref_emb = eager(*args)
            assert torch.equal(codes, ref_codes)
            assert rel_err(emb, ref_emb) < 1e-4
        else:
            _check_bf16_consistency(eager, stage.name, x, codes, emb)


def _check_bf16_consistency(eager, name, x, codes, emb):
    """Teacher-force the eager bf16 module on the artifact's codes; every sampled code must be the Gumbel-max
    choice up to a bf16-sized margin, and the embedding output must be the table sum of those codes."""
    with torch.no_grad():
        if name == "fast_ar":
            _, logits = eager.decode(x["hidden"], x["token"], lambda s, lg: codes[:, s])
            ref_emb = eager.next_input_embedding(x["token"], codes, x["token_embed"])
        else:
            _, logits, summed = eager.decode(x["hidden"], x["code0"], lambda s, lg: codes[:, s], collect_embedding=True)
            ref_emb = summed.float()
    # Qwen rows whose code0 is a special token are zeroed by design: nothing was sampled there.
    rows = x["code0"] < eager.cfg.vocab_size if name == "code_predictor" else torch.ones_like(x["temperature"] > 0)
    bad = 0
    for s, lg in enumerate(logits, start=1):
        off = gumbel_max_violations(lg, codes[:, s], x["noise"][:, s - 1], x["temperature"], x["top_k"], x["top_p"])
        bad += int((off & rows).sum())
    assert bad == 0
    assert rel_err(emb[rows], ref_emb[rows]) < 2e-2


@pytest.mark.parametrize(
    "which",
    [
        pytest.param("fast_ar_full", marks=pytest.mark.compiles(97)),
        pytest.param("code_predictor_1.7B", marks=pytest.mark.compiles(135)),
    ],
)
def test_full_size_frame_in_graphs(which, tmp_path):
    """Full-size configs (random weights, bf16, one bucket of 8): the kernel layer's full-size shapes build, replay
    deterministically and sample what the eager module would (per-frame latency is the bench's, `python -m bench
    run`: tests assert no timings)."""
    if which == "fast_ar_full":
        spec = _fish(torch.bfloat16, buckets=(8,), preset="full")
        art = build_on_gpu(FISH, [spec], tmp_path)
        stage = load(art, device="cuda")["fast_ar"]
    else:
        spec = _qwen(torch.bfloat16, buckets=(8,), preset="full", size="1.7B")
        art = build_on_gpu(QWEN.name, [spec], tmp_path)
        stage = load(art, device="cuda")["code_predictor"]
    assert stage.uses_cuda_graphs
    eager = _eager(spec, torch.bfloat16)
    for B, seed in ((8, 0), (5, 1)):
        x = _case(stage, spec, B, seed)
        args = [x[n] for n in spec.input_names]
        codes, emb = stage(*args)
        again, _ = stage(*args)
        assert codes.shape[0] == B and torch.equal(codes, again)
        _check_bf16_consistency(eager, stage.name, x, codes, emb)
