"""`ttsaot::decode_attention`: the Triton kernels (interpreter on CPU, compiled on a GPU) against the aten
reference (GQA ratios 1/4/8, RoPE NeoX / interleaved / none, q/k norm, positions at 0 and at the scratch slot,
several context splits), the cache written in place and nowhere else, one node under torch.export, the CPU
lowering of a mutating op, an AOTI CPU package writing the caller's cache in place, CPU installs without Triton.
The `gpu` tests at the end: real shapes, and the AOTI CUDA package re-inplacing the functionalized cache write."""

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
    plan_split_size,
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


# (B, Hq, Hkv, hd, S, L, split): GQA 4 with three context splits, MHA with one split, GQA 8 (VoxCPM2's ratio) with
# three splits; B = 3 and 5 (not powers of two).
CONFIGS = [(3, 4, 1, 32, 40, 2, 16), (5, 2, 2, 16, 33, 2, 64), (2, 16, 2, 32, 70, 2, 32)]
VARIANTS = [(None, False), ("neox", False), ("interleaved", False), ("neox", True), (None, True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rope,qk_norm", VARIANTS, ids=[f"{r}-{'qknorm' if n else 'plain'}" for r, n in VARIANTS])
def test_kernel_matches_reference_and_writes_only_its_slots(rope, qk_norm, dtype):
    for i, (B, hq, hkv, hd, S, L, split) in enumerate(CONFIGS):
        t = _case(B, hq, hkv, hd, S, L, dtype, rope, qk_norm, seed=i)
        kc0, vc0 = t["k_cache"].clone(), t["v_cache"].clone()
        ref_t = {**t, "k_cache": kc0.clone(), "v_cache": vc0.clone()}
        args = dict(layer=L - 1, scale=hd**-0.5, rope_interleaved=rope == "interleaved", norm_eps=1e-6)
        o = launch_decode_attention(**t, **args, split_size=split, block_s=16, config={"num_warps": 4})
        ref = decode_attention_reference(**ref_t, **args)
        assert o.shape == (B, hq * hd) and o.dtype == dtype
        tol = 1e-5 if dtype == torch.float32 else (1e-2 if ON_GPU else 3e-2)  # CPU: truncating casts
        assert rel_err(o.cpu().float(), ref.cpu().float()) < tol, (B, hq, hkv, S, split)

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


def test_split_count_does_not_change_the_result_and_runs_are_deterministic():
    B, hq, hkv, hd, S, L = 3, 8, 2, 32, 100, 1
    t = _case(B, hq, hkv, hd, S, L, torch.float32, "neox", False)
    outs = []
    for split in (16, 48, 128, 16):
        tt = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
        outs.append(
            launch_decode_attention(**tt, layer=0, scale=0.1, split_size=split, block_s=16, config={"num_warps": 4})
        )
    assert torch.equal(outs[0], outs[3])
    for o in outs[1:3]:
        assert rel_err(o.cpu(), outs[0].cpu()) < 1e-6


def test_positions_outside_the_cache_are_clamped_like_the_reference():
    """The runtime validates positions; the kernel still never touches memory outside the cache."""
    B, hq, hkv, hd, S, L = 3, 4, 2, 16, 20, 2
    t = _case(B, hq, hkv, hd, S, L, torch.float32, "neox", False)
    t["positions"] = torch.tensor([-3, S + 7, 5], device=DEVICE)
    ref_t = {**t, "k_cache": t["k_cache"].clone(), "v_cache": t["v_cache"].clone()}
    o = launch_decode_attention(**t, layer=1, scale=0.25, split_size=16, block_s=16, config={"num_warps": 4})
    ref = decode_attention_reference(**ref_t, layer=1, scale=0.25)
    assert rel_err(o.cpu(), ref.cpu()) < 1e-5
    assert torch.equal(t["v_cache"].cpu(), ref_t["v_cache"].cpu())


def test_split_plan():
    assert plan_split_size(513, 2, 132) == 64  # VoxCPM2 B=1: every 64 positions its own program
    for S, rows in ((513, 32), (8193, 2), (8193, 32), (100_001, 128)):
        size = plan_split_size(S, rows, 132)
        assert size >= 64 and size & (size - 1) == 0
        assert rows * math.ceil(S / size) <= 8 * 132 or size == 64


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
REAL = {  # name: (Hq, Hkv, rope, qk_norm)
    "voxcpm2_base_lm": (16, 2, "neox", False),
    "voxcpm2_residual_lm": (16, 2, None, False),
    "fish_slow_ar_like": (32, 8, "interleaved", False),
    "qwen_like_qk_norm": (16, 8, "neox", True),
}


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("S", [513, 4097])
@pytest.mark.parametrize("B", [1, 3, 16])
@pytest.mark.parametrize("name", list(REAL))
def test_gpu_real_shapes_autotuned(name, B, S):
    hq, hkv, rope, qk_norm = REAL[name]
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
