"""A stage's programs handed to the compile workers: saved without their tensors, the tensors written once."""

from __future__ import annotations

import pytest
import torch

from ttsaot.builder.saved_programs import StageTensors, load_program, save_program


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(64, 256)
        self.register_buffer("scale", torch.rand(256))

    def forward(self, x):
        return self.proj(x) * self.scale + torch.arange(x.shape[0], dtype=x.dtype)[:, None]  # a lifted constant


def test_a_stages_programs_share_one_copy_of_their_tensors(tmp_path):
    net = _Net().eval()
    inputs = [torch.randn(rows, 64) for rows in (2, 5)]
    eps = [torch.export.export(net, (x,)) for x in inputs]
    before = [dict(ep.state_dict) for ep in eps]
    shared = StageTensors()
    names = [shared.add(ep) for ep in eps]
    # weight, bias and scale once; the constant lifted from each bucket's own `arange` is each program's own
    assert names[0]["state_dict/proj.weight"] == names[1]["state_dict/proj.weight"]
    assert len(shared.entries) == 3 + sum(len(ep.constants) for ep in eps)
    shared.write(tmp_path / "tensors.pt")
    for i, (ep, x) in enumerate(zip(eps, inputs)):
        path = tmp_path / f"p{i}.pt2"
        save_program(ep, path, names[i])
        assert path.stat().st_size < 64 * 256 * 4  # the weight is not in the archive
        assert all(ep.state_dict[k] is v for k, v in before[i].items())  # the caller's program is left whole
        loaded = load_program(path, tmp_path / "tensors.pt", names[i])
        assert isinstance(loaded.state_dict["proj.weight"], torch.nn.Parameter)
        torch.testing.assert_close(loaded.module()(x), net(x), rtol=0, atol=0)


def test_a_tensor_file_that_does_not_fit_the_program_is_refused(tmp_path):
    ep = torch.export.export(_Net().eval(), (torch.randn(2, 64),))
    shared = StageTensors()
    names = shared.add(ep)
    save_program(ep, tmp_path / "p.pt2", names)
    shared.entries[names["state_dict/proj.weight"]] = torch.nn.Parameter(torch.zeros(64, 64))
    shared.write(tmp_path / "tensors.pt")
    with pytest.raises(ValueError, match=r"state_dict/proj.weight is \(64, 64\)"):
        load_program(tmp_path / "p.pt2", tmp_path / "tensors.pt", names)
