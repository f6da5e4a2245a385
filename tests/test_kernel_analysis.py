"""builder/kernels/kernel_analysis.py: torch's user-kernel access analysis runs once per distinct call key while a
stage exports and compiles (the H100 locdit build spent 166 s re-running it), with the same answers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch._higher_order_ops.triton_kernel_wrap as wrap
from torch._subclasses.fake_tensor import FakeTensorMode

from ttsaot.builder.kernels.kernel_analysis import KernelAccessError, analysis_key, memoized_kernel_analysis

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANALYSIS = next(n for n in ("identify_accessed_tensors", "identify_mutated_tensors") if hasattr(wrap, n))


@pytest.fixture
def counting(monkeypatch):
    """torch's analysis replaced by a counter that answers with a fresh list naming the kernel's first argument."""
    calls = []

    def analysis(kernel, kwargs, tma_descriptor_metadata):
        calls.append(kernel)
        return [sorted(kwargs)[0]]

    monkeypatch.setattr(wrap, ANALYSIS, analysis)
    return calls


def fake(dtype: torch.dtype, n: int = 4) -> torch.Tensor:
    with FakeTensorMode():
        return torch.empty(n, dtype=dtype)


def test_one_analysis_per_key_and_copies_returned(counting):
    kernel = object()
    with memoized_kernel_analysis() as active:
        assert active
        a = getattr(wrap, ANALYSIS)(kernel, {"x": fake(torch.bfloat16), "n": 7, "BLOCK": 64}, {})
        # another call site: other fake tensors of the same dtype and sizes (Triton sees torch.empty(2, dtype))
        b = getattr(wrap, ANALYSIS)(kernel, {"x": fake(torch.bfloat16, 99), "n": 7, "BLOCK": 64}, {})
        assert len(counting) == 1 and a == b == ["BLOCK"] and a is not b
        getattr(wrap, ANALYSIS)(kernel, {"x": fake(torch.float32), "n": 7, "BLOCK": 64}, {})  # dtype differs
        getattr(wrap, ANALYSIS)(kernel, {"x": fake(torch.bfloat16), "n": 8, "BLOCK": 64}, {})  # a scalar differs
        getattr(wrap, ANALYSIS)(kernel, {"x": fake(torch.bfloat16), "n": 7, "BLOCK": 64.0}, {})  # its type differs
        getattr(wrap, ANALYSIS)(object(), {"x": fake(torch.bfloat16), "n": 7, "BLOCK": 64}, {})  # another kernel
        assert len(counting) == 5


def test_calls_triton_specialises_differently_are_not_memoised(counting):
    kernel = object()
    with memoized_kernel_analysis():
        for _ in range(2):
            getattr(wrap, ANALYSIS)(kernel, {"x": torch.empty(4), "n": 7}, {})  # real tensor: alignment
            getattr(wrap, ANALYSIS)(kernel, {"x": fake(torch.float32), "n": [1, 2]}, {})  # unhashable
            getattr(wrap, ANALYSIS)(kernel, {"x": fake(torch.float32), "n": 7}, {"x": ("stable", ((16,),))})  # TMA
    assert len(counting) == 6


def test_symbolic_sizes_share_a_key():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    s1 = env.create_unbacked_symint()
    s2 = env.create_unbacked_symint()
    assert analysis_key("k", {"n": s1}, {}) == analysis_key("k", {"n": s2}, {})  # generate_ttir passes 2 for both
    assert analysis_key("k", {"n": s1}, {}) != analysis_key("k", {"n": 2}, {})


def test_context_restores_torch_and_nests(counting):
    original = getattr(wrap, ANALYSIS)
    with memoized_kernel_analysis():
        outer = getattr(wrap, ANALYSIS)
        assert outer is not original
        with memoized_kernel_analysis() as active:
            assert active and getattr(wrap, ANALYSIS) is outer  # the enclosing memo stays in place
        assert getattr(wrap, ANALYSIS) is outer
    assert getattr(wrap, ANALYSIS) is original


REAL = textwrap.dedent(r"""
    import torch, triton
    import torch._higher_order_ops.triton_kernel_wrap as wrap
    from torch._subclasses.fake_tensor import FakeTensorMode
    from triton.backends.compiler import GPUTarget
    from ttsaot.builder.kernels import skinny_linear_triton as S
    from ttsaot.builder.kernels.kernel_analysis import memoized_kernel_analysis

    class Sm90:  # generate_ttir asks the active driver for its target; no GPU here
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    triton.runtime.driver.set_active(Sm90())
    name = next(n for n in ("identify_accessed_tensors", "identify_mutated_tensors") if hasattr(wrap, n))
    frontend = wrap.generate_ttir
    runs = []
    wrap.generate_ttir = lambda *a, **k: runs.append(1) or frontend(*a, **k)
    def kw(m):  # a fresh set of fake tensors per call site
        with FakeTensorMode():
            t = lambda dtype=torch.bfloat16: torch.empty(64, dtype=dtype)
            return dict(x_ptr=t(), w_ptr=t(), b_ptr=t(), g_ptr=t(), r_ptr=t(), y_ptr=t(),
                        part_ptr=t(torch.float32), sem_ptr=t(torch.int32), M=m, N_OUT=4096, K=1024, K_SPLIT=1024,
                        eps=1e-5, scale=1.0,
                        HAS_NORM=True, HAS_BIAS=False, GATED=False, HAS_RESIDUAL=True, SPLIT_K=1, FUSED_REDUCE=False,
                        USE_DOT=True, FP32_DOT=False, PDL=True, NORM_BLOCK=0, BLOCK_M=32, BLOCK_N=32,
                        BLOCK_K=256, STREAM=False, NORM_CHUNKS=0, PRELOAD=False, SWAP_AB=False)

    def writes(result):
        result = result.read_writes.writes if hasattr(result, "read_writes") else result
        return sorted(getattr(d, "name", d) for d in result)

    plain = writes(getattr(wrap, name)(S.skinny_linear_kernel, kw(22), {}))
    with memoized_kernel_analysis():
        memo = [writes(getattr(wrap, name)(S.skinny_linear_kernel, kw(22), {})) for _ in range(3)]
    print(plain, memo, len(runs))
    assert plain == ["y_ptr"] and memo == [plain] * 3, (plain, memo)
    assert len(runs) == 2, runs  # the plain call, then one for the three memoised calls
""")


def test_real_analysis_of_a_kernel_layer_kernel_is_unchanged():
    """torch's own analysis of skinny_linear (TTIR for sm_90, no GPU needed): the memoised answer is the same, from
    one frontend run for three calls. A child process: the interpreter (TRITON_INTERPRET) must be off."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", REAL], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]


# What each decode-step kernel writes, by launch form (tests/kernel_access_cases.py launches them): nothing else.
WRITES = {
    "skinny gemv": {"skinny_linear_kernel": ["y_ptr"]},
    "skinny gemv preload": {"skinny_linear_kernel": ["y_ptr"]},
    "skinny gemv split-k": {"skinny_linear_kernel": ["part_ptr", "y_ptr"], "split_k_epilogue_kernel": ["y_ptr"]},
    "skinny gemv split-k fused reduce": {"skinny_linear_kernel": ["part_ptr", "sem_ptr", "y_ptr"]},
    "skinny dot": {"skinny_linear_kernel": ["y_ptr"]},
    "skinny dot stream": {"skinny_linear_kernel": ["y_ptr"]},
    "skinny dot swap": {"skinny_linear_kernel": ["y_ptr"]},
    "skinny gated": {"skinny_linear_kernel": ["y_ptr"]},
    "skinny residual": {"skinny_linear_kernel": ["y_ptr"]},
    # skinny_linear_norm_out: split, the second pass writes y and its norm; unsplit, it reads y back
    "skinny norm out split-k": {
        "skinny_linear_kernel": ["part_ptr", "y_ptr"],
        "norm_out_epilogue_kernel": ["y_ptr", "yn_ptr"],
    },
    "skinny norm out": {"skinny_linear_kernel": ["y_ptr"], "norm_out_epilogue_kernel": ["yn_ptr"]},
    "decode attention whole": {"decode_attention_kernel": ["kc_ptr", "o_ptr", "vc_ptr"]},
    "decode attention split": {
        "decode_attention_kernel": ["kc_ptr", "o_ptr", "part_ml_ptr", "part_o_ptr", "vc_ptr", "ws_ptr"]
    },
    "qkv attention": {"qkv_attention_kernel": ["kc_ptr", "o_ptr", "qkv_ptr", "vc_ptr", "ws_ptr"]},
    "qkv attention preload": {"qkv_attention_kernel": ["kc_ptr", "o_ptr", "qkv_ptr", "vc_ptr", "ws_ptr"]},
    "sequence attention": {"sequence_attention_kernel": ["o_ptr"]},
    "sequence attention o split 1": {"sequence_attention_o_kernel": ["y_ptr"], "norm_out_epilogue_kernel": ["yn_ptr"]},
    "sequence attention o split 2": {
        "sequence_attention_o_kernel": ["part_ptr"],
        "norm_out_epilogue_kernel": ["y_ptr", "yn_ptr"],
    },
    "window attention": {"window_attention_kernel": ["o_ptr"]},
    "sample": {"sample_tokens_kernel": ["out_ptr"]},
}


def test_decode_step_kernels_write_only_their_outputs_in_torch_analysis():
    """torch's analysis of every decode-step kernel form, as an sm_90 AOTInductor build runs it: its write set is
    the kernel's outputs and workspaces, never an input. A leaked input is a mutated weight in the package (the
    H200 code_predictor packages at 2d3e484 returned every projection weight; kernel_access_cases.py says how)."""
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run(
        [sys.executable, "-m", "tests.kernel_access_cases"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    got: dict[str, dict[str, list[str]]] = {}
    for line in r.stdout.splitlines():
        row = json.loads(line)
        got.setdefault(row["form"], {})[row["kernel"]] = row["writes"]
    assert got == WRITES


def test_an_analysis_that_counts_an_input_as_written_stops_the_build(monkeypatch):
    """Inside the memoised analysis, an answer that counts as written an argument the kernel's module does not
    declare (WRITES) raises KernelAccessError naming it, memoised or not; a declared answer passes; a kernel whose
    module declares nothing is not checked."""
    from ttsaot.builder.kernels import skinny_linear_triton as S

    answer = {"names": ["x_ptr", "y_ptr"]}
    monkeypatch.setattr(wrap, ANALYSIS, lambda kernel, kwargs, tma: list(answer["names"]))
    kw = {"x_ptr": fake(torch.bfloat16), "y_ptr": fake(torch.bfloat16), "M": 3}
    with memoized_kernel_analysis():
        analysis = getattr(wrap, ANALYSIS)
        with pytest.raises(KernelAccessError, match=r"skinny_linear_kernel: .*\['x_ptr'\]"):
            analysis(S.skinny_linear_kernel, kw, {})
        with pytest.raises(KernelAccessError, match="x_ptr"):  # a real tensor: not memoised, still checked
            analysis(S.skinny_linear_kernel, {**kw, "x_ptr": torch.empty(2)}, {})
        answer["names"] = ["y_ptr"]
        assert analysis(S.skinny_linear_kernel, {**kw, "M": 4}, {}) == ["y_ptr"]

        def undeclared_kernel():  # not a kernel-layer kernel: its module declares no WRITES for it
            pass

        answer["names"] = ["x_ptr", "y_ptr"]
        assert analysis(undeclared_kernel, kw, {}) == ["x_ptr", "y_ptr"]
