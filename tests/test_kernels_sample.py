"""`ttsaot::sample_tokens`: the Triton kernel (interpreter on CPU, compiled on a GPU) draws the reference sampler's
tokens (builder/kernels/sample.py `sample`): greedy rows, top-k off (≤ 0, > V), top-k 1, top-p off and tight,
V not a power of two, B not a power of two, noise as the strided per-step slice of a [B, S, V] input, bf16 logits;
one node under torch.export and the CPU lowering; the predictors' kernel pass puts one node per draw in their
graphs. The `gpu` test: the predictors' vocabularies (1024, 2048, 4096) over many rows."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from ttsaot.builder.kernels import CPU_DECOMPOSITIONS, lower_for_cpu
from ttsaot.builder.kernels.sample import MAX_VOCAB, launch_sample_tokens, sample, supported

from .kernel_fixtures import DEVICE, ON_GPU, require_kernel_runtime

ST = torch.ops.ttsaot.sample_tokens.default


@pytest.fixture(autouse=True)
def _kernel_runtime():
    require_kernel_runtime()


def _inputs(B, V, steps=3, dtype=torch.float32, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, V, generator=g) * 3).to(dtype)
    noise = torch.rand(B, steps, V, generator=g)
    # per-row parameters covering every branch: greedy, top-k off (0 and > V), top-k 1, top-p off / tight
    temperature = torch.tensor([0.8, 1.0, 0.0, 0.5, 1.3, 0.9, 0.7])[:B]
    top_k = torch.tensor([30, 0, 5, 1, V + 7, 10, 3])[:B]
    top_p = torch.tensor([0.9, 1.0, 0.5, 0.7, 0.95, 0.3, 1.0])[:B]
    return [t.to(device) for t in (logits, noise, temperature, top_k, top_p)]


SORT = pytest.mark.parametrize("sort", [True, False], ids=["sort", "radix"])


@SORT
@pytest.mark.parametrize("B,V", [(7, 100), (5, 256), (3, 37)])
def test_kernel_draws_the_reference_tokens(B, V, sort):
    logits, noise, t, k, p = _inputs(B, V, seed=B + V)
    for step in range(noise.shape[1]):
        u = noise[:, step]  # a strided view (row stride S·V), as the traced sampler passes it
        out = launch_sample_tokens(logits, u, t, k, p, sort=sort)
        ref = sample(logits.cpu(), u.cpu(), t.cpu(), k.cpu(), p.cpu())
        assert out.dtype == torch.int64 and out.shape == (B,)
        assert out.cpu().tolist() == ref.tolist(), (step, out.tolist(), ref.tolist())
    # greedy row 2: the logits' argmax, whatever the noise
    assert out[2].item() == logits[2].argmax().item()


@SORT
def test_kernel_draws_from_bf16_logits_as_the_reference(sort):
    logits, noise, t, k, p = _inputs(6, 200, dtype=torch.bfloat16, seed=3)
    out = launch_sample_tokens(logits, noise[:, 1], t, k, p, sort=sort)
    assert out.cpu().tolist() == sample(logits.cpu(), noise[:, 1].cpu(), t.cpu(), k.cpu(), p.cpu()).tolist()


@SORT
def test_kernel_keeps_ties_and_the_first_of_equal_maxima(sort):
    """Equal logits: top-k keeps every token tied with the k-th (as the reference's `>= threshold`), greedy takes the
    first of equal maxima (torch.argmax)."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 0.5], [2.0, 2.0, 1.0, 2.0, 0.0, 2.0]]).to(DEVICE)
    t = torch.tensor([1.0, 0.0]).to(DEVICE)
    k = torch.tensor([1, 2]).to(DEVICE)
    p = torch.tensor([1.0, 1.0]).to(DEVICE)
    for seed in range(4):
        u = torch.rand(2, 6, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
        out = launch_sample_tokens(logits, u, t, k, p, sort=sort).cpu()
        assert out.tolist() == sample(logits.cpu(), u.cpu(), t.cpu(), k.cpu(), p.cpu()).tolist()
        assert out[0].item() in (1, 2, 4) and out[1].item() == 0


@SORT
def test_kernel_thresholds_match_the_sorted_reference_on_tied_rows(sort):
    """Both ways to the thresholds (the sort, and the radix select that never sorts): rows with many
    equal values (logits on a grid of 0.5) straddling both boundaries, top-p ≤ 0 (the largest value only), k at,
    inside and past ties, drawn token for token as the sorted reference draws them."""
    B, V = 16, 120 if sort else 300  # the interpreter's sort costs ~1 s per row of 512
    g = torch.Generator().manual_seed(7)
    logits = torch.round(torch.randn(B, V, generator=g) * 4) / 2
    t = torch.rand(B, generator=g) + 0.3
    k = torch.randint(0, 40, (B,), generator=g)
    p = torch.rand(B, generator=g)
    p[0], p[1], p[2] = 0.0, -0.5, 1.0
    for step in range(3 if sort else 6):
        u = torch.rand(B, V, generator=torch.Generator().manual_seed(100 + step))
        out = launch_sample_tokens(*(x.to(DEVICE) for x in (logits, u, t, k, p)), sort=sort)
        assert out.cpu().tolist() == sample(logits, u, t, k, p).tolist(), step
        assert logits[0, out[0]] == logits[0].max() and logits[1, out[1]] == logits[1].max()  # p ≤ 0


def test_op_is_one_export_node_and_lowers_for_cpu():
    class M(torch.nn.Module):
        def forward(self, logits, noise, t, k, p):
            return torch.stack([torch.ops.ttsaot.sample_tokens(logits, noise[:, s], t, k, p) for s in range(2)], 1)

    xs = _inputs(4, 50, steps=2, device="cpu")
    ep = torch.export.export(M(), tuple(xs))
    assert [n.target for n in ep.graph.nodes if n.op == "call_function"].count(ST) == 2
    assert ST in CPU_DECOMPOSITIONS
    lowered = lower_for_cpu(ep)
    assert ST not in [n.target for n in lowered.graph.nodes]
    assert torch.equal(lowered.module()(*xs), M()(*xs))


def test_cpu_install_without_triton_exports_and_lowers():
    """CPU-only installs (no triton): the same op as a plain custom_op, one export node, lowered to the reference."""
    code = textwrap.dedent("""
        import sys
        sys.modules["triton"] = None                      # import triton -> ImportError
        import torch
        from ttsaot.builder.kernels import lower_for_cpu
        from ttsaot.builder.kernels.common import HAVE_TRITON
        from ttsaot.builder.kernels.sample import sample
        assert not HAVE_TRITON
        class M(torch.nn.Module):
            def forward(self, logits, u, t, k, p):
                return torch.ops.ttsaot.sample_tokens(logits, u, t, k, p)
        g = torch.Generator().manual_seed(0)
        x = (torch.randn(3, 50, generator=g), torch.rand(3, 50, generator=g), torch.tensor([0.8, 0.0, 1.0]),
             torch.tensor([5, 0, 10]), torch.tensor([0.9, 1.0, 0.5]))
        ep = torch.export.export(M(), x)
        assert [str(n.target) for n in ep.graph.nodes].count("ttsaot.sample_tokens.default") == 1
        assert torch.equal(lower_for_cpu(ep).module()(*x), sample(*x)) and torch.equal(M()(*x), sample(*x))
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=repo, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


def test_op_dispatch_support_and_errors():
    assert supported(2048) and supported(4096) and supported(MAX_VOCAB) and not supported(MAX_VOCAB + 1)
    logits, noise, t, k, p = _inputs(3, 40, device="cpu")
    assert torch.equal(ST(logits, noise[:, 0], t, k, p), sample(logits, noise[:, 0], t, k, p))  # CPU: reference
    with pytest.raises(RuntimeError, match=r"\[B, V\] alike"):
        ST(logits, noise[:, 0, :-1], t, k, p)
    with pytest.raises(RuntimeError, match="must be \\[3\\]"):
        ST(logits, noise[:, 0], t[:2], k, p)
    with pytest.raises(RuntimeError, match="integer top_k"):
        ST(logits, noise[:, 0], t, k.float(), p)


def test_sampler_kernel_pass_draws_through_the_op():
    """`use_sampler_kernel` turns every draw of a predictor's frame into one `ttsaot::sample_tokens` node (Qwen
    tiny: 15 sampled codebooks), and the frame's codes do not change. Both predictors' kernel-layer builds take it."""
    from bench.specs import make_spec
    from ttsaot.builder.families.qwen3_tts_12hz import checkpoint as qck
    from ttsaot.builder.families.qwen3_tts_12hz.code_predictor import CodePredictor, prune_code_predictor
    from ttsaot.builder.families.qwen3_tts_12hz.config import CODE_PREDICTOR_PRESETS
    from ttsaot.builder.predictor import random_sampling_inputs, use_sampler_kernel

    cfg = CODE_PREDICTOR_PRESETS["tiny"]
    module = qck.init_random_code_predictor(CodePredictor(cfg), 0).eval()
    prune_code_predictor(module)
    B, steps = 3, cfg.num_code_groups - 1
    g = torch.Generator().manual_seed(1)
    x = {
        "hidden": torch.randn(B, cfg.talker_hidden_size, generator=g),
        "code0": torch.randint(0, cfg.vocab_size, (B,), generator=g),
        **random_sampling_inputs(B, steps, cfg.vocab_size, g),
    }
    args = tuple(x[n] for n in ("hidden", "code0", "noise", "temperature", "top_k", "top_p"))
    with torch.no_grad():
        before = module(*args)
        report = use_sampler_kernel(module)
        after = module(*args)
    assert module.sampler_kernel and "ttsaot::sample_tokens" in report["ops"]
    assert torch.equal(before, after)
    ep = torch.export.export(module, args)
    assert [n.target for n in ep.graph.nodes if n.op == "call_function"].count(ST) == steps
    fish, _ = make_spec("fish-s2-pro", "fast_ar", "tiny")
    qwen, _ = make_spec("qwen3-tts-12hz", "code_predictor", "tiny")
    assert use_sampler_kernel in fish.kernel_passes and use_sampler_kernel in qwen.kernel_passes


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("V", [1024, 2048, 4096])
def test_gpu_predictor_vocabularies(V):
    g = torch.Generator().manual_seed(V)
    B = 64
    logits = (torch.randn(B, V, generator=g) * 4).to(torch.bfloat16).cuda()
    u = torch.rand(B, V, generator=g).cuda()
    t = (torch.rand(B, generator=g) * 1.5).cuda()  # some rows near 0, none greedy
    t[::9] = 0.0  # and some greedy
    k = torch.randint(-1, 80, (B,), generator=g).cuda()
    p = torch.rand(B, generator=g).cuda() * 0.5 + 0.6
    out = launch_sample_tokens(logits, u, t, k, p)
    ref = sample(logits, u, t, k, p)
    # the kernel's exp/log and summation order may move a top-p boundary or a Gumbel near-tie by an ulp
    assert (out != ref).sum().item() <= 1, (out != ref).nonzero()
