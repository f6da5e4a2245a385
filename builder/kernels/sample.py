"""`ttsaot::sample_tokens`: the codebook predictors' per-step sampler as one kernel launch.

    sample_tokens(logits [B, V], uniforms [B, V], temperature [B], top_k [B] int, top_p [B]) -> tokens [B] int64

Semantics (the vLLM-Omni Fish/Qwen samplers, `sample` below, which is also the op's aten reference): scaled =
logits / T; top-k keeps the k largest scaled logits; top-p then keeps the smallest prefix of the remaining tokens,
in descending order, whose probability mass before the token is < p (the first token is always kept); the draw is
Gumbel-max over the kept set, argmax(scaled + g) with g = −log(−log u), which samples exactly softmax(scaled)
restricted to the kept set. Per-row parameters: top_k ≤ 0 or ≥ V disables top-k, top_p ≥ 1 disables top-p,
temperature ≤ 0 is greedy (argmax of the logits; noise unused). Pure tensor functions with static shapes and no
host synchronisation: traced into the exported programs and run unchanged in eager mode.

Why a kernel: traced, one draw is a full sort of the row (a radix sort kernel of ~22 µs at V = 2048-4096 and one
row on an H100) and a dozen small Inductor kernels around it, once per sampled codebook: 9% of the Qwen
code_predictor's frame and 4% of the Fish fast_ar's (H100 profiles before the kernel:
bench/results/nvidia-h100/probes/predictor_kernels/call4_c7ba046/). Here one program per row holds the row in
registers, finds the top-k and top-p thresholds there (a sort in registers, or for larger vocabularies a radix
select over the values: sample_triton.py), and draws in the same registers. The softmax and the masses add in a
different order than aten's: a row whose mass before a token equals top_p to the last ulp may keep one token more or
less (as Inductor's fusion of the aten path may too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .common import HAVE_TRITON, next_power_of_2, no_wrap
from .decompositions import register_cpu_decomposition

OP_NAME = "ttsaot::sample_tokens"
MAX_VOCAB = 8192  # one program holds the whole row in registers (16 values per thread at 16 warps)
# u is clamped into (0, 1) so that −log(−log u) stays finite whatever the caller passes.
U_MIN = 1e-20
U_MAX = 1.0 - 1e-7


def gumbel(uniforms: torch.Tensor) -> torch.Tensor:
    u = uniforms.float().clamp(U_MIN, U_MAX)
    return -torch.log(-torch.log(u))


def support_mask(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Bool [B,V]: tokens kept by top-k then top-p (per row). `scaled` is fp32 logits / temperature."""
    B, V = scaled.shape
    ordered = scaled.sort(dim=-1, descending=True).values
    k = torch.where((top_k <= 0) | (top_k > V), torch.full_like(top_k, V), top_k)  # [B]
    rank = torch.arange(V, device=scaled.device)[None, :]
    in_k = rank < k[:, None]
    probs = torch.softmax(ordered.masked_fill(~in_k, float("-inf")), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    n_p = ((mass_before < top_p.float()[:, None]) & in_k).sum(dim=-1)
    n = torch.where(top_p.float() >= 1.0, k, torch.minimum(k, n_p)).clamp(min=1)  # kept prefix length
    threshold = ordered.gather(1, (n - 1)[:, None])  # smallest kept value
    return scaled >= threshold


def sample(
    logits: torch.Tensor, uniforms: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """logits [B,V] (any float dtype; computed in fp32), uniforms [B,V] in (0,1), temperature [B] float,
    top_k [B] int, top_p [B] float → token ids [B] int64. The op's aten reference."""
    x = logits.float()
    t = temperature.float()
    greedy = t <= 0
    scaled = x / torch.where(greedy, torch.ones_like(t), t)[:, None]
    keep = support_mask(scaled, top_k, top_p)
    perturbed = torch.where(keep, scaled + gumbel(uniforms), torch.full_like(scaled, float("-inf")))
    drawn = perturbed.argmax(dim=-1)
    return torch.where(greedy, x.argmax(dim=-1), drawn)


def supported(vocab: int) -> bool:
    """Whether the Triton kernel takes rows of this many tokens (otherwise the op runs its aten reference)."""
    return 1 <= vocab <= MAX_VOCAB


def _check(
    logits: torch.Tensor, uniforms: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> None:
    torch._check(
        logits.dim() == 2 and uniforms.shape == logits.shape,
        lambda: f"sample_tokens: logits and uniforms must be [B, V] alike, got {logits.shape}, {uniforms.shape}",
    )
    b = logits.shape[0]
    torch._check(
        temperature.shape == (b,) and top_k.shape == (b,) and top_p.shape == (b,),
        lambda: f"sample_tokens: temperature, top_k, top_p must be [{b}]",
    )
    torch._check(
        logits.is_floating_point() and uniforms.is_floating_point() and not top_k.is_floating_point(),
        lambda: "sample_tokens: float logits and uniforms, integer top_k",
    )


def launch_sample_tokens(
    logits: torch.Tensor,
    uniforms: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    *,
    wrap: Callable[[Any], Any] = no_wrap,
    sort: bool | None = None,
) -> torch.Tensor:
    """Run the Triton kernel (CUDA, or CPU under TRITON_INTERPRET=1) on a vocabulary `supported` allows. `sort`
    overrides how the kept set is found (sample_triton.use_sort: by the vocabulary)."""
    from . import sample_triton as kernels

    B, V = logits.shape
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    uniforms = uniforms if uniforms.stride(-1) == 1 else uniforms.contiguous()
    out = torch.empty((B,), dtype=torch.int64, device=logits.device)
    block = next_power_of_2(V)
    sort = kernels.use_sort(block) if sort is None else sort
    wrap(kernels.sample_tokens_kernel)[(B,)](
        logits,
        uniforms,
        temperature.contiguous(),
        top_k.contiguous(),
        top_p.contiguous(),
        out,
        V,
        logits.stride(0),
        uniforms.stride(0),
        U_MIN=U_MIN,
        U_MAX=U_MAX,
        BLOCK_V=block,
        SORT=sort,
        num_warps=kernels.warps(block),
    )
    return out


def _sample_tokens(
    logits: torch.Tensor, uniforms: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    _check(logits, uniforms, temperature, top_k, top_p)
    if not HAVE_TRITON or logits.device.type != "cuda" or not supported(logits.shape[1]):
        return sample(logits, uniforms, temperature, top_k, top_p)  # also what a CPU compile traces
    return launch_sample_tokens(logits, uniforms, temperature, top_k, top_p, wrap=torch.library.wrap_triton)


# One body either way: a triton_op where Triton is installed (one export node whose CUDA lowering is the kernel), a
# plain custom_op without it (CPU-only installs: the reference, with a fake for tracing).
if HAVE_TRITON:
    sample_tokens = torch.library.triton_op(OP_NAME, _sample_tokens, mutates_args=())
else:
    sample_tokens = torch.library.custom_op(OP_NAME, _sample_tokens, mutates_args=())

    @sample_tokens.register_fake
    def _(logits, uniforms, temperature, top_k, top_p):
        _check(logits, uniforms, temperature, top_k, top_p)
        return logits.new_empty((logits.shape[0],), dtype=torch.int64)


register_cpu_decomposition(torch.ops.ttsaot.sample_tokens.default, sample)
