"""torch's access analysis of the decode-step kernels, as AOTInductor runs it on the build GPU: every launch form of
skinny_linear, decode_attention, qkv_attention, sequence_attention(_o), window_attention and the sampler, launched by
its real launcher on small CPU tensors, each launch recorded instead of run and handed to torch's analysis (TTIR
for sm_90: no GPU needed), with PDL on as on an sm_90 build. Printed: one JSON line per launch, {"form", "kernel",
"writes"}. Run in a child process without TRITON_INTERPRET (test_kernel_analysis.py): the analysis compiles the
JIT functions, which the interpreter replaces.

Why: the analysis follows each stored pointer back through the ops that made it, and through a helper call's
arguments when the pointer's offsets came out of that call. A kernel that leaks a read-only input into its write
set makes AOTInductor treat that input as mutated; a stage's weights then come back as package outputs, which the
runtime refuses (H200 at 2d3e484: every code_predictor package, `skinny_linear`'s rows returned from a helper
that took x / W / g)."""

from __future__ import annotations

import importlib
import json
from typing import Any

import torch
import torch._higher_order_ops.triton_kernel_wrap as wrap_module
import triton
from triton.backends.compiler import GPUTarget

from ttsaot.builder.kernels.kernel_analysis import check_writes, written_args

# the modules by path: the package re-exports each op under its module's name
decode_attention, qkv_attention, sample, sequence_attention, sequence_attention_o, skinny_linear, window_attention = (
    importlib.import_module(f"ttsaot.builder.kernels.{name}")
    for name in (
        "decode_attention",
        "qkv_attention",
        "sample",
        "sequence_attention",
        "sequence_attention_o",
        "skinny_linear",
        "window_attention",
    )
)

ANALYSIS = next(n for n in ("identify_accessed_tensors", "identify_mutated_tensors") if hasattr(wrap_module, n))


class _Sm90:  # generate_ttir asks the active driver for its target
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


def _recorder(calls: list, form: str):
    def wrap(kernel):
        class Launch:
            def __getitem__(self, grid):
                def run(*args, **kwargs):
                    calls.append((form, kernel, args, kwargs))

                return run

        return Launch()

    return wrap


def _bound(kernel: Any, args: tuple, kwargs: dict) -> tuple[Any, dict]:
    """The JIT function and every argument by name, as an sm_90 build launches it: an autotuner's first config
    fills the constants the launcher left to it; PDL on, bf16 dots on the tensor cores."""
    configs = []
    while not isinstance(kernel, triton.runtime.jit.JITFunction):
        configs = configs or list(getattr(kernel, "configs", []))
        kernel = kernel.fn
    named = dict(zip(kernel.arg_names, args))
    named.update(kwargs)
    if configs:
        named = {**configs[0].kwargs, **named}
    if "PDL" in named:
        named["PDL"] = True
    if "FP32_DOT" in named:  # the launchers' off-GPU (interpreter) choice; every case here is bf16
        named["FP32_DOT"] = False
    for k in ("num_warps", "num_stages"):
        named.pop(k, None)
    return kernel, named


def _launches() -> list:
    bf = torch.bfloat16
    g = torch.Generator().manual_seed(0)
    r = lambda *shape, dtype=bf: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    calls: list = []
    x, w, norm = r(1, 1024), r(384, 1024), r(1024)  # K = 4 · BLOCK_K: split-K splits
    gemv = {"BLOCK_N": 8, "BLOCK_K": 256, "num_warps": 4, "num_stages": 1}
    forms = {
        "skinny gemv": dict(config=gemv),
        "skinny gemv preload": dict(config={**gemv, "PRELOAD": True}),
        "skinny gemv split-k": dict(config=gemv, split_k=2),
        "skinny gemv split-k fused reduce": dict(config=gemv, split_k=2, semaphores=torch.zeros(64, dtype=torch.int32)),
        "skinny dot": dict(config={"BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}, use_dot=True),
        "skinny dot stream": dict(
            config={"BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}, use_dot=True, stream=True
        ),
        "skinny dot swap": dict(
            config={"BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, "SWAP_AB": True},
            use_dot=True,
            split_k=1,
        ),
    }
    for form, kw in forms.items():
        skinny_linear.launch_skinny_linear(x, w, None, norm, wrap=_recorder(calls, form), **kw)
    skinny_linear.launch_skinny_linear(
        x, r(768, 1024), r(384), norm, gated=True, wrap=_recorder(calls, "skinny gated"), config=gemv
    )
    skinny_linear.launch_skinny_linear(
        x, w, None, None, residual=r(1, 384), wrap=_recorder(calls, "skinny residual"), config=gemv
    )
    for form, split in (("skinny norm out split-k", 2), ("skinny norm out", 1)):
        skinny_linear.launch_skinny_linear(
            x, w, None, None, residual=r(1, 384), wrap=_recorder(calls, form), config=gemv, split_k=split,
            out_norm_weight=r(384),
        )  # fmt: skip
    hq, hkv, hd, S, L, B = 4, 2, 32, 32, 2, 1
    cos, sin = r(S, hd, dtype=torch.float32), r(S, hd, dtype=torch.float32)
    caches = dict(k_cache=r(L, B, hkv, S, hd), v_cache=r(L, B, hkv, S, hd))
    heads = dict(cos=cos, sin=sin, q_norm=r(hd), k_norm=r(hd))
    qkv, pos = r(B, (hq + 2 * hkv) * hd), torch.tensor([3])
    decode_attention.launch_decode_attention(
        qkv, pos, **caches, layer=1, scale=0.2, **heads, num_splits=1, wrap=_recorder(calls, "decode attention whole")
    )
    decode_attention.launch_decode_attention(
        qkv,
        pos,
        **caches,
        layer=1,
        scale=0.2,
        **heads,
        num_splits=2,
        min_chunk=16,
        block_s=16,
        config={"num_warps": 4},
        wrap=_recorder(calls, "decode attention split"),
    )
    xq = r(B, 256)
    for form, config in (("qkv attention", gemv), ("qkv attention preload", {**gemv, "PRELOAD": True})):
        qkv_attention.launch_qkv_attention(
            xq,
            r((hq + 2 * hkv) * hd, 256),
            None,
            norm,
            1e-6,
            pos,
            **caches,
            layer=1,
            scale=0.2,
            **heads,
            config=config,
            wrap=_recorder(calls, form),
        )
    sequence_attention.launch_sequence_attention(
        r(2, 8, (hq + 2 * hkv) * hd), cos, sin, hq, hkv, 0.2, wrap=_recorder(calls, "sequence attention")
    )
    for split in (1, 2):  # unsplit: the kernel's epilogue writes y; split: fp32 partials, the second pass adds them
        d_out = 32
        sequence_attention_o.launch_sequence_attention_o(
            r(2, 8, (hq + 2 * hkv) * hd), cos, sin, hq, hkv, 0.2, r(d_out, hq * hd), r(d_out), r(2, 8, d_out), 1.0,
            r(d_out), 1e-6, config=(split, 16, 4), wrap=_recorder(calls, f"sequence attention o split {split}"),
        )  # fmt: skip
    q = r(1, 16, 2, 64)
    window_attention.launch_window_attention(
        q, r(1, 16, 2, 64), r(1, 16, 2, 64), 8, 0.1, "ieee", wrap=_recorder(calls, "window attention")
    )
    logits = r(2, 300, dtype=torch.float32)
    sample.launch_sample_tokens(
        logits,
        torch.rand(2, 2, generator=g),
        torch.ones(2),
        torch.full((2,), 5),
        torch.full((2,), 0.9),
        wrap=_recorder(calls, "sample"),
    )
    return calls


def main() -> None:
    triton.runtime.driver.set_active(_Sm90())
    analysis = getattr(wrap_module, ANALYSIS)
    for form, kernel, args, kwargs in _launches():
        fn, named = _bound(kernel, args, kwargs)
        result = analysis(fn, named, {})
        check_writes(fn, result)  # within what the kernel's module declares (its WRITES)
        print(json.dumps({"form": form, "kernel": fn.__name__, "writes": written_args(result)}))


if __name__ == "__main__":
    main()
