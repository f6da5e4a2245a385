"""Every Triton kernel of the kernel layer takes its arguments with no defaults. Inductor's AOT code for a user
kernel (its launcher and the autotuning block it runs while compiling a package) passes the call site's arguments
positionally and does not bind a kernel's defaulted parameters: two defaulted constexprs that a call did not pass
shifted the grid out of the launcher ("launcher() missing 2 required positional arguments: '_grid_1' and
'_grid_2'") and failed every CUDA build of a stage with a skinny_linear call on the H100, while the interpreter,
which binds defaults, passed. Without defaults, a call site that leaves one out fails on CPU too. The device
helpers are held to the same rule: nothing of theirs needs a default, and one rule is simpler to keep."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

triton = pytest.importorskip("triton")

import ttsaot.builder.kernels as kernel_layer  # noqa: E402


def kernel_functions() -> dict[str, object]:
    found = {}
    for info in pkgutil.iter_modules(kernel_layer.__path__):
        module = importlib.import_module(f"{kernel_layer.__name__}.{info.name}")
        for obj in vars(module).values():
            fn = obj
            while hasattr(fn, "fn") and not inspect.isfunction(fn):  # Autotuner → JITFunction → the Python function
                fn = fn.fn
            if fn is not obj and inspect.isfunction(fn) and fn.__module__ == module.__name__:
                found[f"{module.__name__}.{fn.__name__}"] = fn
    return found


def test_the_kernel_layer_has_triton_kernels_to_check():
    names = {k.rsplit(".", 1)[1] for k in kernel_functions()}
    expected = {"skinny_linear_kernel", "decode_attention_kernel", "_snake_beta_jit", "_conv_gemm_jit"}
    assert expected <= names, sorted(names)


@pytest.mark.parametrize("name", sorted(kernel_functions()))
def test_kernel_parameters_have_no_defaults(name):
    fn = kernel_functions()[name]
    defaulted = [p.name for p in inspect.signature(fn).parameters.values() if p.default is not inspect.Parameter.empty]
    assert not defaulted, f"{name}: defaulted parameters {defaulted} (AOTInductor's launcher does not bind them)"
