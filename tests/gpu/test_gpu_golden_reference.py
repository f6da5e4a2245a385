"""Golden cases on the build's GPU (builder/golden_reference.py): exact fp32 there (no TF32 even where the process
allows it), equal to the host's cases to fp32 rounding, and returned on the host."""

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from ttsaot.builder import build as build_mod  # noqa: E402
from ttsaot.runtime.metrics import rel_error  # noqa: E402

from ..test_build_atomic import _specs  # noqa: E402


def test_gpu_cases_equal_the_hosts_in_exact_fp32(monkeypatch):
    spec = _specs()[0]
    sizes = {"batch": 2, "frames": 16}

    def run(device):
        original, rewritten, _ = build_mod.prepare_modules(spec, spec.kernels_on(device))
        cases = [build_mod._GoldenCase(sizes, 7, spec.make_inputs(sizes, torch.Generator().manual_seed(7)))]
        return build_mod._golden_cases(spec, original, rewritten, cases, device)

    host = run(torch.device("cpu"))
    # TF32 on in the process: the reference must switch it off for its forwards and restore it after
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    gpu = run(torch.device("cuda"))
    assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    assert gpu.keys() == host.keys()
    for name, t in gpu.items():
        assert t.device.type == "cpu", name
        if "/in/" in name or not t.is_floating_point():
            assert torch.equal(t, host[name]), name
        else:
            assert rel_error(t, host[name]) < 1e-5, name
