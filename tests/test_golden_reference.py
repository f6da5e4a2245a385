"""builder/golden_reference.py: where a stage's golden cases run (the host, or a CUDA build's GPU with room for the
fp32 modules), and that the place is part of the cases' cache key."""

import torch

from ttsaot.builder import build as build_mod
from ttsaot.builder import golden_reference as G

from .test_build_atomic import _specs

CUDA = torch.device("cuda", 0)


def _gpu_with_free(monkeypatch, free: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 << 30))


def test_a_cpu_build_runs_its_cases_on_the_host(monkeypatch):
    _gpu_with_free(monkeypatch, 80 << 30)
    assert G.reference_device(torch.device("cpu"), 1 << 20) == G.HOST


def test_a_cuda_build_runs_them_on_its_gpu_when_both_modules_fit_beside_the_headroom(monkeypatch):
    modules = 3 << 30
    _gpu_with_free(monkeypatch, modules + G.HEADROOM_BYTES)
    assert G.reference_device(CUDA, modules) == CUDA
    _gpu_with_free(monkeypatch, modules + G.HEADROOM_BYTES - 1)
    assert G.reference_device(CUDA, modules) == G.HOST


def test_without_a_driver_a_cuda_build_falls_back_to_the_host(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert G.reference_device(CUDA, 1) == G.HOST


def test_host_precision_is_left_alone():
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    with G.reference_forwards(G.HOST):
        assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == before


def test_the_golden_key_names_where_the_cases_ran(monkeypatch):
    spec = _specs()[0]
    original = spec.make_module().eval()
    sizes = {"batch": 1, "frames": 8}
    cases = [build_mod._GoldenCase(sizes, 0, spec.make_inputs(sizes, torch.Generator().manual_seed(0)))]
    host = build_mod._golden_key(spec, original, original, cases)
    assert build_mod._golden_key(spec, original, original, cases, G.HOST) == host
    monkeypatch.setattr(G, "describe", lambda device: ["NVIDIA H100 80GB HBM3", "cuda 13.0", "cudnn 91500"])
    assert build_mod._golden_key(spec, original, original, cases, CUDA) != host


def test_every_ttsaot_op_has_a_reference_the_mode_runs(monkeypatch):
    from ttsaot.builder.kernels import decompositions as D

    ops = {getattr(torch.ops.ttsaot, n).default for n in dir(torch.ops.ttsaot) if not n.startswith("_") and n != "name"}
    assert ops <= set(D.REFERENCES), sorted(str(o) for o in ops - set(D.REFERENCES))
    calls = []
    op = torch.ops.ttsaot.snake_beta.default
    real = D.REFERENCES[op]
    monkeypatch.setitem(D.REFERENCES, op, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    x, alpha, inv_beta = torch.randn(1, 4, 8), torch.rand(4), torch.rand(4)
    with D.reference_ops():
        y = torch.ops.ttsaot.snake_beta(x, alpha, inv_beta)
    assert calls == [1] and torch.equal(y, real(x, alpha, inv_beta))
