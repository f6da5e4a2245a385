"""One `ttsaot::sample_tokens` variant in a process of its own (a device plan runs each under `timeout`, so a
variant that hangs the GPU is named, not fatal): `python -m bench.probes.sampler_variant V DIGIT_BITS SKIP_OFF
[WARPS]` draws 64 rows (some greedy, some with top-k or top-p off), compares them with the aten sampler and prints
the kernel's time in a CUDA graph of 16 draws of one row."""

from __future__ import annotations

import sys

import torch


def main(argv: list[str]) -> int:
    from bench.kernels import bench_sampler_case
    from ttsaot.builder.kernels.sample import launch_sample_tokens, sample

    V, bits, skip = int(argv[0]), int(argv[1]), argv[2] == "1"
    variant = dict(sort=False, digit_bits=bits, skip_off=skip)
    if len(argv) > 3:
        variant["num_warps"] = int(argv[3])
    g = torch.Generator().manual_seed(V)
    B = 64
    logits = (torch.randn(B, V, generator=g) * 4).to(torch.bfloat16).cuda()
    u = torch.rand(B, V, generator=g).cuda()
    t = (torch.rand(B, generator=g) * 1.5).cuda()
    t[::9] = 0.0
    k = torch.randint(-1, 80, (B,), generator=g).cuda()
    p = torch.rand(B, generator=g).cuda() * 0.5 + 0.6
    k[1::7] = 0
    p[2::5] = 1.0
    out = launch_sample_tokens(logits, u, t, k, p, **variant)
    torch.cuda.synchronize()
    differ = int((out != sample(logits, u, t, k, p)).sum())
    r = bench_sampler_case(V, 1, 1.0, 30, torch.device("cuda"), params="fish", variant=variant, with_aten=False)
    print(f"V={V} {variant}: {differ} of {B} differ; one row {r['kernel']['graph_ms'] * 1e3:.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
