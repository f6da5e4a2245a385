"""On-device sampling from explicit noise: temperature, top-k, top-p, greedy when temperature ≤ 0.

Pure tensor functions with static shapes and no host synchronisation, no `multinomial`, no boolean-mask
indexing: they are traced into exported programs (the codebook predictors call them inside `forward`) and run
unchanged in eager mode, so the artifact and the eager reference compute the same thing.

Semantics (the vLLM-Omni Fish/Qwen samplers): scaled = logits / T; top-k keeps the k largest scaled logits;
top-p then keeps the smallest prefix of the remaining tokens, in descending order, whose probability mass
before the token is < p (the first token is always kept); the draw is Gumbel-max over the kept set,
argmax(scaled + g) with g = −log(−log u), which samples exactly softmax(scaled) restricted to the kept set.
Per-row parameters: top_k ≤ 0 or ≥ V disables top-k, top_p ≥ 1 disables top-p, temperature ≤ 0 is greedy
(argmax of the logits; noise unused)."""

from __future__ import annotations

import torch

# u is clamped into (0, 1) so that −log(−log u) stays finite whatever the caller passes.
_U_MIN = 1e-20
_U_MAX = 1.0 - 1e-7


def gumbel(uniforms: torch.Tensor) -> torch.Tensor:
    u = uniforms.float().clamp(_U_MIN, _U_MAX)
    return -torch.log(-torch.log(u))


def support_mask(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Bool [B,V]: tokens kept by top-k then top-p (per row). `scaled` is fp32 logits / temperature."""
    B, V = scaled.shape
    ordered = scaled.sort(dim=-1, descending=True).values
    k = torch.where((top_k <= 0) | (top_k > V), torch.full_like(top_k, V), top_k)            # [B]
    rank = torch.arange(V, device=scaled.device)[None, :]
    in_k = rank < k[:, None]
    probs = torch.softmax(ordered.masked_fill(~in_k, float("-inf")), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    n_p = ((mass_before < top_p.float()[:, None]) & in_k).sum(dim=-1)
    n = torch.where(top_p.float() >= 1.0, k, torch.minimum(k, n_p)).clamp(min=1)             # kept prefix length
    threshold = ordered.gather(1, (n - 1)[:, None])                                          # smallest kept value
    return scaled >= threshold


def sample(logits: torch.Tensor, uniforms: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
           top_p: torch.Tensor) -> torch.Tensor:
    """logits [B,V] (any float dtype; computed in fp32), uniforms [B,V] in (0,1), temperature [B] float,
    top_k [B] int, top_p [B] float → token ids [B] int64."""
    x = logits.float()
    t = temperature.float()
    greedy = t <= 0
    scaled = x / torch.where(greedy, torch.ones_like(t), t)[:, None]
    keep = support_mask(scaled, top_k, top_p)
    perturbed = torch.where(keep, scaled + gumbel(uniforms), torch.full_like(scaled, float("-inf")))
    drawn = perturbed.argmax(dim=-1)
    return torch.where(greedy, x.argmax(dim=-1), drawn)


def kept_distribution(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                      top_p: torch.Tensor) -> torch.Tensor:
    """The distribution `sample` draws from (rows with temperature > 0): softmax(scaled) over the kept set."""
    x = logits.float()
    scaled = x / temperature.float().clamp(min=1e-30)[:, None]
    keep = support_mask(scaled, top_k, top_p)
    return torch.softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)


__all__ = ["gumbel", "kept_distribution", "sample", "support_mask"]
