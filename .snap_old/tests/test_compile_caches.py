"""The builder keeps Inductor's kernel-level caches on (so buckets and rebuilds share compiled kernels) but never
reuses a cached GRAPH compile: packages are weightless, yet small constants are folded into the generated code, so
a graph-level cache hit would bind the previous weights' values into a new package."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ttsaot.builder.export import compile_bucket, inductor_options


class _Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # a 4-element bias is small enough for Inductor to inline into the generated code
        self.proj = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(x)) * 2.0


def _package_output(path: Path, weights: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    runner = torch._inductor.aoti_load_package(str(path))
    runner.load_constants(weights, check_full_update=True, user_managed=True)
    return runner(x)


def test_same_graph_other_weights_never_reuses_the_first_compile(tmp_path: Path) -> None:
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(1))
    outs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        m = _Head().eval()
        cb = compile_bucket(m, (x,), torch.device("cpu"), tmp_path / f"s{seed}.pt2", model_name="m", metadata={})
        with torch.no_grad():
            ref = m(x)
        got = _package_output(cb.package, cb.weights, x)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        outs.append(got)
    assert not torch.allclose(outs[0], outs[1])


def test_kernel_caches_stay_on_and_graph_caches_off() -> None:
    opts = inductor_options("m", {}, torch.device("cuda"))
    assert opts["fx_graph_cache"] is False and opts["fx_graph_remote_cache"] is False
    assert not opts.get("force_disable_caches", False)


def test_cuda_packages_carry_no_cpu_isa_flags_and_cpu_packages_probe() -> None:
    assert inductor_options("m", {}, torch.device("cuda"))["cpp.vec_isa_ok"] is False
    assert "cpp.vec_isa_ok" not in inductor_options("m", {}, torch.device("cpu"))
