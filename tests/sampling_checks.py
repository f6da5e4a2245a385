"""The check that a bf16 artifact sampled what its eager module would: each code is the Gumbel-max choice under
the eager logits, teacher-forced on the artifact's codes, up to bf16 rounding (tests/gpu/test_gpu_predictors.py;
its logic pinned on the CPU in tests/test_sampling.py)."""

import torch

from ttsaot.builder.predictor import gumbel, support_mask

# How far bf16 logits may move the top-p boundary, as probability mass before a token: the full-size Qwen code
# predictor (1.7B, random weights) gave its top token 0.532 of the mass in bf16 and 0.513 in fp32 at a row whose
# top_p was 0.521, so the two supports differed by one token (fp32 eager on the CPU standing in for the artifact:
# bench/results/cpu/probes/bf16_checks/).
TOP_P_SLACK = 0.05


def gumbel_max_violations(
    logits: torch.Tensor,
    code: torch.Tensor,
    uniforms: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
) -> torch.Tensor:
    """Bool [B]: rows whose `code` is not the Gumbel-max choice under `logits` [B, V] (the eager module's, any
    dtype) up to bf16 rounding. Greedy rows (temperature ≤ 0) must take the largest logit; the others the largest
    logit/T + gumbel(uniforms) within their support, where the support may be the eager one's top-p prefix widened or
    narrowed by TOP_P_SLACK of probability mass (the supports are prefixes of the tokens by logit): the smallest such
    prefix that holds the code."""
    lg = logits.float()
    T = temperature.float()
    greedy = T <= 0
    scaled = lg / torch.where(greedy, torch.ones_like(T), T)[:, None]
    p = top_p.float()
    exact = (p >= 1.0)[:, None]  # top-p off: the support is the top-k, with no boundary for noise to move
    strict = support_mask(scaled, top_k, p)
    narrow = torch.where(exact, strict, support_mask(scaled, top_k, (p - TOP_P_SLACK).clamp(min=0.0)))
    wide = torch.where(exact, strict, support_mask(scaled, top_k, (p + TOP_P_SLACK).clamp(max=1.0)))
    at_code = scaled.gather(1, code[:, None])
    support = narrow | (wide & (scaled >= at_code))
    score = torch.where(greedy[:, None], lg, scaled + gumbel(uniforms))
    score = score.masked_fill(~support & ~greedy[:, None], float("-inf"))
    chosen = score.gather(1, code[:, None]).squeeze(1)
    slack = 0.05 * lg.abs().amax(1) / torch.where(greedy, torch.ones_like(T), T)  # bf16 logit error bound
    return chosen < score.amax(1) - slack
