"""A copy of a module's structure over the same tensors, for a caller that only ever REPLACES them.

A stage's preparation kept a deep copy of its rewritten fp32 module for its deferred golden cases, because the
compute-dtype cast that follows changes the module; the cast replaces tensors (builder/passes/cast.py), so the
structure is all that needs copying. A full VoxCPM2 base-LM module (5.3 GB fp32) took 10.9-13.8 s to deep-copy on
a 2-core box and 0.04 s with `module_sharing_tensors` (bench/results/cpu/probes/random_init_threads/), and the deep
copy held 5.3 GB of host memory until the golden cases ran."""

from __future__ import annotations

import copy
from typing import TypeVar

from torch import nn

M = TypeVar("M", bound=nn.Module)


def module_sharing_tensors(module: M) -> M:
    """A copy of the module's structure whose parameters and buffers are the SAME tensors (new Parameter objects
    over them): replacing a tensor in one (`p.data = ...`, setattr of a buffer, `.to()`) leaves the other as it
    was, writing into one (`p.add_(...)`) changes both. Costs no tensor copy."""
    memo: dict[int, object] = {}
    for t in (*module.parameters(), *module.buffers()):  # each once: tied ones stay tied, as with deepcopy
        memo[id(t)] = nn.Parameter(t.detach(), requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else t
    return copy.deepcopy(module, memo)
