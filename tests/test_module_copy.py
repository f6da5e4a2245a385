"""The build's module copies and random weights (builder/module_copy.py, builder/checkpoint.py `fill_by_name`)."""

import torch
from torch import nn

from ttsaot.builder import parallel_compile
from ttsaot.builder.checkpoint import fill_by_name, name_seed
from ttsaot.builder.module_copy import module_sharing_tensors
from ttsaot.builder.passes import cast_to_compute_dtype


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.proj = nn.Linear(8, 8)
        self.head = nn.Linear(8, 11, bias=False)
        self.head.weight = self.embed.weight  # tied, as LM heads often are
        self.register_buffer("table", torch.arange(6, dtype=torch.float32))


def test_a_copy_sharing_tensors_keeps_the_original_through_the_compute_dtype_cast():
    """The golden cases keep the fp32 rewritten module while the build casts and moves its copy: the cast replaces
    tensors, so sharing them is safe and costs no copy."""
    original = _Tied()
    copy = module_sharing_tensors(original)
    for (n, a), (_, b) in zip(original.state_dict(keep_vars=True).items(), copy.state_dict(keep_vars=True).items()):
        assert a.data_ptr() == b.data_ptr(), n
        if isinstance(a, nn.Parameter):
            assert b is not a, n  # its own Parameter objects: replacing one's tensor leaves the other's
        assert a.requires_grad == b.requires_grad
    assert copy.head.weight is copy.embed.weight  # still tied
    before = {k: v.clone() for k, v in original.state_dict().items()}
    cast_to_compute_dtype(copy, torch.bfloat16)
    assert copy.proj.weight.dtype == torch.bfloat16 and copy.table.dtype == torch.bfloat16
    for k, v in original.state_dict().items():
        assert v.dtype == torch.float32 and torch.equal(v, before[k]), k


def _fill(name: str, t: torch.Tensor, g: torch.Generator) -> None:
    t.normal_(0.0, 1.0, generator=g)


def test_random_weights_do_not_depend_on_the_threads(monkeypatch):
    """Each tensor draws from its own generator, seeded by its name: one thread or many, the same weights."""
    a, b = _Tied(), _Tied()
    monkeypatch.setattr(parallel_compile, "usable_cores", lambda: 4)
    fill_by_name(dict(a.named_parameters()), _fill, seed=3)
    monkeypatch.setattr(parallel_compile, "usable_cores", lambda: 1)
    fill_by_name(dict(b.named_parameters()), _fill, seed=3)
    for (n, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), n
    expected = torch.empty(8, 8).normal_(generator=torch.Generator().manual_seed(name_seed(3, "proj.weight")))
    assert torch.equal(a.proj.weight.detach(), expected)


def test_a_tied_tensor_is_drawn_once_under_its_last_name():
    """Two names for one tensor: filled once (threads writing it twice would race), as filling them in order
    leaves it: under the last name."""
    m = _Tied()
    fill_by_name(m.state_dict(), _fill, seed=0)  # state_dict names the tied weight twice
    last = torch.empty(11, 8).normal_(generator=torch.Generator().manual_seed(name_seed(0, "head.weight")))
    assert torch.equal(m.embed.weight.detach(), last)
