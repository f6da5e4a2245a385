"""Programmatic dependent launch (builder/kernels/pdl.py): the launch half, on CPU. (The kernels' half, the wait and
what is loaded before it, is pinned in sm_90 PTX by test_kernels_compile.py; the GPU timings by the bench.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ttsaot.builder import package_cache
from ttsaot.builder.kernels import pdl
from ttsaot.builder.kernels.common import HAVE_TRITON


def _driver_source() -> str:
    from torch._inductor.codegen.cuda.device_op_overrides import CUDADeviceOpOverrides

    return CUDADeviceOpOverrides().kernel_driver()


def test_the_launch_helper_of_this_torch_is_rewritten_once():
    src = _driver_source()
    out = pdl.rewrite_launch_helper(src)
    assert out is not None, "AOTInductor's launchKernel text changed: PDL would silently be off"
    assert out.count("cuLaunchKernelEx(") == 1 and out.count("ttsaotLaunchKernel(") == 2  # defined, then called
    assert "CUDA_DRIVER_CHECK(cuLaunchKernel(" not in out
    for name in pdl.PDL_KERNELS:
        assert f'"{name}"' in out
    # everything else is untouched: the rewritten text minus the helper is the original with one call renamed
    assert out.replace(pdl._helper_source(pdl.PDL_KERNELS), "").replace("ttsaotLaunchKernel(", "cuLaunchKernel(") == src


def test_unknown_wrapper_text_is_left_alone():
    assert pdl.rewrite_launch_helper("static inline void launchKernel() { cuLaunchKernelEx(...); }") is None
    twice = "static inline void launchKernel(" + "CUDA_DRIVER_CHECK(cuLaunchKernel(" * 2
    assert pdl.rewrite_launch_helper(twice) is None


def test_the_patch_applies_to_cuda_compiles_only_and_is_undone(monkeypatch):
    from torch._inductor.codegen.cuda.device_op_overrides import CUDADeviceOpOverrides

    original = CUDADeviceOpOverrides.kernel_driver
    with pdl.programmatic_launches(torch.device("cpu")) as applied:
        assert applied is False and CUDADeviceOpOverrides.kernel_driver is original
    with pdl.programmatic_launches(torch.device("cuda")) as applied:
        assert applied is True
        assert "ttsaotLaunchKernel" in CUDADeviceOpOverrides().kernel_driver()
    assert CUDADeviceOpOverrides.kernel_driver is original
    monkeypatch.setenv(pdl.ENV_SWITCH, "0")
    with pdl.programmatic_launches(torch.device("cuda")) as applied:
        assert applied is False and "ttsaotLaunchKernel" not in CUDADeviceOpOverrides().kernel_driver()


def test_the_switch_is_part_of_the_package_key(monkeypatch):
    monkeypatch.delenv(pdl.ENV_SWITCH, raising=False)
    on = package_cache._inductor_env()
    monkeypatch.setenv(pdl.ENV_SWITCH, "0")
    assert package_cache._inductor_env() != on


def test_kernels_wait_only_on_hopper_or_newer():
    assert pdl.kernels_wait(torch.device("cpu")) is False


@pytest.mark.skipif(not HAVE_TRITON or shutil.which("g++") is None, reason="needs Triton's cuda.h and g++")
def test_the_launch_helper_compiles_against_the_driver_api(tmp_path: Path):
    """The C++ that goes into every CUDA package, compiled (syntax and types) against the CUDA driver header that
    ships with Triton: a typo here would surface only as a failed package compile on the GPU host."""
    import triton

    include = Path(triton.__file__).parent / "backends" / "nvidia" / "include"
    if not (include / "cuda.h").exists():
        pytest.skip("Triton without its NVIDIA headers")
    src = tmp_path / "helper.cpp"
    src.write_text("#include <cuda.h>\n" + pdl._helper_source(pdl.PDL_KERNELS))
    env = {k: v for k, v in os.environ.items() if k != "CXX"}
    proc = subprocess.run(
        ["g++", "-std=c++17", "-fsyntax-only", f"-I{include}", str(src)], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
def test_every_listed_kernel_exists_and_waits():
    """A name in PDL_KERNELS gets the launch attribute: it must be a Triton kernel of ours that calls the wait (itself
    or through the device helpers it calls, e.g. skinny_linear_triton._gemv_program)."""
    import inspect

    from ttsaot.builder.kernels import (
        decode_attention_triton,
        qkv_attention_triton,
        sequence_attention_o_triton,
        sequence_attention_triton,
        skinny_linear_triton,
    )

    def waits(fn) -> bool:
        src = inspect.getsource(fn)
        helpers = [
            v.fn
            for n, v in fn.__globals__.items()
            if hasattr(v, "fn") and inspect.isfunction(v.fn) and v.fn is not fn and f"{n}(" in src
        ]
        return "grid_dependency_wait(PDL," in src or any(waits(h) for h in helpers)

    kernels = {
        k.fn.__name__: k
        for mod in (
            decode_attention_triton,
            qkv_attention_triton,
            sequence_attention_o_triton,
            sequence_attention_triton,
            skinny_linear_triton,
        )
        for k in vars(mod).values()
        if hasattr(k, "fn") and hasattr(k, "arg_names") and inspect.isfunction(k.fn)
    }
    for name in pdl.PDL_KERNELS:
        assert name in kernels, name
        assert "PDL" in kernels[name].arg_names
        assert waits(kernels[name].fn), name
    # and the converse: a kernel that waits but is left off the list launches plainly, so its launch cannot
    # overlap the kernel before it (skinny_linear_norm_out's second pass was, from e6c5913 until this test)
    waiting = {name for name, k in kernels.items() if "PDL" in k.arg_names and waits(k.fn)}
    assert waiting == set(pdl.PDL_KERNELS), waiting ^ set(pdl.PDL_KERNELS)


_REEMIT = textwrap.dedent("""
    import ast, importlib, json, pathlib, sys
    import triton
    from torch._inductor.codegen.wrapper import user_defined_triton_kernel_transitive_closure_source_code as closure

    out = {}
    for path in sorted(pathlib.Path(sys.argv[1]).glob("*.py")):
        if "@triton.jit" not in path.read_text():
            continue
        mod = importlib.import_module("ttsaot.builder.kernels." + path.stem)
        for name, k in vars(mod).items():
            if not isinstance(k, triton.JITFunction) or k.fn.__module__ != mod.__name__:
                continue
            src = closure(k)
            # what AOTInductor writes: the closure inside a non-raw triple-quoted string, read back by Python
            seen = ast.literal_eval("'''" + src + "'''")
            compile(seen, name, "exec")  # a SyntaxError fails the test
            out[f"{path.stem}.{name}"] = {"same": seen == src, "asm": seen.count("griddepcontrol")}
    print(json.dumps(out))
""")


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
def test_kernel_sources_survive_inductors_reemission():
    """AOTInductor copies each user Triton kernel with the jit functions it calls (comments included,
    `user_defined_triton_kernel_transitive_closure_source_code`) into a non-raw triple-quoted Python string of its
    autotuning block. Every kernel module's functions must come back from that string unchanged and compilable: the
    H100 build failed when the wait's asm held a newline escape. In a child without TRITON_INTERPRET (under it
    Triton hands out interpreter objects, not the JIT functions Inductor reads)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    folder = Path(pdl.__file__).parent
    proc = subprocess.run(
        [sys.executable, "-c", _REEMIT, str(folder)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(got) >= 10
    assert all(v["same"] for v in got.values()), [k for k, v in got.items() if not v["same"]]
    for name in pdl.PDL_KERNELS:  # the closure carries the wait's asm along with the kernel
        entry = next(v for k, v in got.items() if k.endswith("." + name))
        assert entry["asm"] >= 2, (name, entry)


def test_only_gemv_sized_buckets_get_the_attribute(monkeypatch):
    """Measured on the H100: the attribute pays at B=1 (GEMV form) and costs at B=16 (tile form), so the packages
    of larger batch buckets are compiled without it (their kernels still wait: harmless without the attribute)."""
    from torch._inductor.codegen.cuda.device_op_overrides import CUDADeviceOpOverrides

    monkeypatch.delenv(pdl.MAX_ROWS_ENV, raising=False)
    assert pdl.wanted_for({"batch": 1}) and pdl.wanted_for({"batch": 2}) and pdl.wanted_for({"frames": 50})
    assert not pdl.wanted_for({"batch": 4}) and not pdl.wanted_for({"batch": 16, "frames": 8})
    with pdl.programmatic_launches(torch.device("cuda"), wanted=False) as applied:
        assert applied is False and "ttsaotLaunchKernel" not in CUDADeviceOpOverrides().kernel_driver()


def test_the_row_limit_of_the_attribute_is_a_package_key_switch(monkeypatch):
    """TTSAOT_PDL_MAX_ROWS (an A/B switch: the streamed tile form at B=16 with the attribute) raises the limit, is
    refused when it is not a number of rows, and is part of the package cache key, so a build with it never reuses
    a package compiled without it."""
    from ttsaot.builder import package_cache

    monkeypatch.setenv(pdl.MAX_ROWS_ENV, "16")
    assert pdl.wanted_for({"batch": 16}) and not pdl.wanted_for({"batch": 17})
    assert package_cache._inductor_env()[pdl.MAX_ROWS_ENV] == "16"
    monkeypatch.setenv(pdl.MAX_ROWS_ENV, "all")
    with pytest.raises(ValueError, match="TTSAOT_PDL_MAX_ROWS='all'"):
        pdl.wanted_for({"batch": 1})
