"""Probe (issue 17, the GPU predictor test's check): the full-size Qwen code predictor (1.7B talker, random
weights) run in fp32 eager on the CPU stands in for a bf16 artifact: its sampled codes, teacher-forced through the
bf16 eager module, go through `tests/sampling_checks.py` `gumbel_max_violations` as the GPU test's do. Prints the
violations of the fp32 codes (bf16 noise alone: should be none) and of the codes shifted by 7 (wrong: should be
all), per batch; with `--detail`, the top probabilities of each violating row in both precisions; with `--strict`,
the check without its top-p slack (TOP_P_SLACK 0, as it was before it had one).

    python -m bench.probes.predictor_check_cpu [--detail] [--strict]
"""

from __future__ import annotations

import argparse
import copy

import torch


def main() -> None:
    from ttsaot.builder.families.qwen3_tts_12hz import stages as qst
    from ttsaot.builder.families.qwen3_tts_12hz.options import Qwen3TTSOptions
    from ttsaot.builder.passes import cast_to_compute_dtype

    ap = argparse.ArgumentParser()
    ap.add_argument("--detail", action="store_true")
    ap.add_argument("--strict", action="store_true")
    a = ap.parse_args()
    if a.strict:
        import tests.sampling_checks

        tests.sampling_checks.TOP_P_SLACK = 0.0
    opts = Qwen3TTSOptions(
        preset="full", talker_size="1.7B", dtype=torch.bfloat16, batch_buckets=(8,), code_predictor_with_embedding=True
    )
    spec = qst.code_predictor_stage(opts)
    base = spec.make_module()

    def eager(dtype: torch.dtype) -> torch.nn.Module:
        m = copy.deepcopy(base)
        for p in spec.passes:
            p(m)
        return cast_to_compute_dtype(m, dtype).eval()

    e32, e16 = eager(torch.float32), eager(torch.bfloat16)
    print(f"qwen3-tts-12hz code_predictor 1.7B (full, random weights), torch {torch.__version__}")
    for B, seed in ((8, 0), (5, 1), (8, 2), (8, 3)):  # the GPU test's two cases, then two more
        _case(spec, e32, e16, B, seed, a.detail)


def _teacher_forced(module: torch.nn.Module, x: dict, codes: torch.Tensor) -> list[torch.Tensor]:
    _, logits, _ = module.decode(x["hidden"], x["code0"], lambda s, lg: codes[:, s], collect_embedding=True)
    return logits


def _case(spec, e32: torch.nn.Module, e16: torch.nn.Module, B: int, seed: int, detail: bool) -> None:
    from tests.sampling_checks import gumbel_max_violations
    from ttsaot.builder.predictor import random_sampling_inputs

    V = e32.cfg.vocab_size
    g = torch.Generator().manual_seed(seed)
    x = dict(spec.make_inputs({"batch": B}, g))
    x.update(random_sampling_inputs(B, 15, V, g))
    with torch.no_grad():
        codes, _ = e32(*[x[n] for n in spec.input_names])
        l16, l32 = _teacher_forced(e16, x, codes), _teacher_forced(e32, x, codes)
    rows = x["code0"] < V
    wrong = codes.clone()
    wrong[:, 1:] = (wrong[:, 1:] + 7) % V
    u, T, k, p = x["noise"], x["temperature"], x["top_k"], x["top_p"]
    bad = [gumbel_max_violations(lg, codes[:, s], u[:, s - 1], T, k, p) & rows for s, lg in enumerate(l16, start=1)]
    shifted = [gumbel_max_violations(lg, wrong[:, s], u[:, s - 1], T, k, p) & rows for s, lg in enumerate(l16, 1)]
    n = int(rows.sum()) * 15
    n_bad, n_shifted = sum(int(b.sum()) for b in bad), sum(int(b.sum()) for b in shifted)
    print(f"B={B} seed={seed}: fp32 codes {n_bad} of {n} off; codes shifted by 7: {n_shifted} of {n} off")
    for s, b in enumerate(bad if detail else [], start=1):
        for r in b.nonzero().flatten().tolist():
            t = float(T[r])
            tops = [torch.softmax(L[s - 1][r].float() / t, -1).sort(descending=True).values[:3] for L in (l16, l32)]
            print(
                f"  step {s} row {r}: top_p {float(p[r]):.3f}, top probs bf16 {tops[0].tolist()}, "
                f"fp32 {tops[1].tolist()}"
            )


if __name__ == "__main__":
    main()
