"""The random-weights stage modules are constructed without torch's default parameter init
(`builder.checkpoint.construct`): the seeded init that follows writes every parameter, so each family's modules
come out bit-identical to a construction with the default init (a parameter left uninitialised would not)."""

from __future__ import annotations

import pytest
import torch

from ttsaot.builder import checkpoint
from ttsaot.builder.families import get_family


def _state(spec) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in spec.make_module().state_dict().items()}


@pytest.mark.parametrize("family", ["qwen3-tts-12hz", "fish-s2-pro", "voxcpm2"])
def test_skipping_the_default_init_changes_no_weight(family, monkeypatch):
    fam = get_family(family)
    specs = fam.specs(fam.options(preset="tiny"))
    assert checkpoint.SKIP_DEFAULT_INIT
    skipped = {s.name: _state(s) for s in specs}
    monkeypatch.setattr(checkpoint, "SKIP_DEFAULT_INIT", False)
    for s in specs:
        default = _state(s)
        assert default.keys() == skipped[s.name].keys()
        for k, v in default.items():
            assert torch.equal(v, skipped[s.name][k]), f"{family}/{s.name}: {k} is not written after construction"


def test_the_default_init_is_restored_after_construction():
    before = torch.nn.init.kaiming_uniform_
    with checkpoint.without_default_init():
        w = torch.nn.Linear(4, 4).weight
        assert torch.nn.init.kaiming_uniform_ is not before
    assert torch.nn.init.kaiming_uniform_ is before and w.shape == (4, 4)
    with pytest.raises(RuntimeError), checkpoint.without_default_init():
        raise RuntimeError("a failing constructor")
    assert torch.nn.init.kaiming_uniform_ is before
