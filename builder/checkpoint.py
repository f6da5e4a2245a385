"""Strict checkpoint reading shared by the families: every key is either loaded, explicitly ignored (another
model part, never read), or explicitly dropped (known but unused by the stage: counted as pruned). Anything else
is an error naming the key — the opposite of the reference loaders' `strict=False`."""

from __future__ import annotations

import contextlib
import math
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn


class CheckpointError(ValueError):
    """A checkpoint does not match the module that should load it."""


# torch.nn.init functions the layers' reset_parameters call (nn.Linear, nn.Conv1d/ConvTranspose1d, nn.Embedding,
# norms); `without_default_init` makes them no-ops.
_DEFAULT_INIT_FNS = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                     "xavier_normal_", "zeros_", "ones_", "constant_")  # fmt: skip
SKIP_DEFAULT_INIT = True  # the random-weights paths construct without it (tests turn it off to compare)
M = TypeVar("M", bound=nn.Module)


@contextlib.contextmanager
def without_default_init() -> Iterator[None]:
    """Modules constructed inside keep uninitialised parameters: torch's default init (kaiming_uniform_ of every
    Linear and conv weight) was ~40% of making a full-size stage module on the CPU (Fish, 2 cores: fast_ar 8.3 →
    5.5 s, dac_decoder 7.1 → 4.0 s, dac_encoder 6.9 → 4.1 s; bench/results/cpu/probes/module_init/), work that
    the seeded random init or the strict load right after overwrites. Only for callers that write EVERY parameter
    (tests/test_default_init_skip.py pins that the family modules come out bit-identical). Patches torch.nn.init
    for the duration: the builder constructs modules on one thread."""
    saved = {name: getattr(nn.init, name) for name in _DEFAULT_INIT_FNS}

    def keep(tensor: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return tensor

    try:
        for name in _DEFAULT_INIT_FNS:
            setattr(nn.init, name, keep)
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def construct(cls: Callable[..., M], *args, **kwargs) -> M:
    """cls(*args, **kwargs) without torch's default parameter init (`without_default_init`), for a caller that
    writes every parameter next."""
    if not SKIP_DEFAULT_INIT:
        return cls(*args, **kwargs)
    with without_default_init():
        return cls(*args, **kwargs)


def name_seed(seed: int, name: str) -> int:
    """The generator seed of one tensor of a random-weights module: keyed by its checkpoint NAME, not its place in
    the module, so every stage module built with the same seed holds the same tensor for the same name (VoxCPM2's
    base_lm_step and base_lm_prefill share base_lm.*)."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63


def fill_by_name(
    tensors: dict[str, torch.Tensor], fill: Callable[[str, torch.Tensor, torch.Generator], None], seed: int
) -> None:
    """Seeded random weights, in place: `fill(name, tensor, generator)` for each tensor, with a generator of its
    own (`name_seed`), on threads. The draws are the same whatever the threads and their order; a storage named
    twice (tied weights) is filled once, under its last name (what filling them in order left). On threads because
    the draws are one core's work per tensor and the CPU generator does not parallelise: a full VoxCPM2 base-LM
    module (1.33 B parameters) took 21.4 s on one thread and 7.1 s on two of a 2-core box
    (bench/results/cpu/probes/random_init_threads/); the `modules` phase of the base-LM stages' preparation took
    14-40 s on the 16-core H200 hosts before, 9.9-13.6 s after (nvidia-h200/build_logs/voxcpm2-cold*.log)."""
    last: dict[object, str] = {}  # the tensor's memory (or, empty, the tensor) → its last name
    for name, t in tensors.items():
        last[(t.data_ptr(), tuple(t.shape), t.stride()) if t.numel() else id(t)] = name
    names = sorted(last.values(), key=lambda n: -tensors[n].numel())  # the largest first: the threads end together

    def one(name: str) -> None:
        with torch.no_grad():  # per thread: grad mode is thread-local
            fill(name, tensors[name], torch.Generator().manual_seed(name_seed(seed, name)))

    from .parallel_compile import usable_cores

    with ThreadPoolExecutor(max(1, min(len(names), usable_cores()))) as pool:
        list(pool.map(one, names))


def fan_in_fill(name: str, p: torch.Tensor, g: torch.Generator, gain: float = 1.0) -> None:
    """The rules the codec decoders' random weights end with (`fill_by_name`'s `fill`, after their own): a 1-D
    norm weight ~ N(1, 0.1²), a bias ~ N(0, 0.02²), any other tensor ~ N(0, gain²/fan_in), fan_in being its
    elements per output row (a conv's in_channels × kernel)."""
    leaf = name.rsplit(".", 1)[-1]
    if "norm" in name and leaf == "weight" and p.dim() == 1:
        p.normal_(1.0, 0.1, generator=g)
    elif leaf == "bias":
        p.normal_(0.0, 0.02, generator=g)
    else:
        fan_in = p[0].numel() if p.dim() > 1 else p.numel()
        p.normal_(0.0, gain / math.sqrt(fan_in), generator=g)


@dataclass
class KeyRules:
    prefix: str  # checkpoint prefix of the module's own names ("decoder.")
    ignore_prefixes: tuple[str, ...] = ()  # other model parts: never read
    drop_patterns: tuple[str, ...] = ()  # regexes (on the full key): known, unused by this stage
    rename: dict[str, str] = field(default_factory=dict)  # full checkpoint key → module key, where they differ

    def classify(self, key: str) -> str:
        if any(key.startswith(p) for p in self.ignore_prefixes):
            return "ignore"
        if any(re.fullmatch(p, key) for p in self.drop_patterns):
            return "drop"
        if key in self.rename or key.startswith(self.prefix):
            return "load"
        return "unknown"

    def module_key(self, key: str) -> str:
        return self.rename.get(key, key[len(self.prefix) :])


def read_safetensors_selected(path: str | Path, rules: KeyRules) -> tuple[dict[str, torch.Tensor], dict]:
    """Read only the keys the module loads; ignored and dropped tensors are counted from the header, not read."""
    from safetensors import safe_open

    loaded: dict[str, torch.Tensor] = {}
    report = {"ignored": {"tensors": 0, "params": 0}, "dropped": {}, "unknown": []}
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():
            kind = rules.classify(key)
            if kind == "load":
                loaded[rules.module_key(key)] = f.get_tensor(key)
            else:
                numel = _numel(f.get_slice(key).get_shape())
                if kind == "ignore":
                    report["ignored"]["tensors"] += 1
                    report["ignored"]["params"] += numel
                elif kind == "drop":
                    report["dropped"][key] = numel
                else:
                    report["unknown"].append(key)
    return loaded, report


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def load_strict(
    module: nn.Module, tensors: dict[str, torch.Tensor], unknown: list[str] = (), source: str = "checkpoint"
) -> None:
    """Copy `tensors` into `module`; missing, unexpected or mis-shaped keys are errors naming the key."""
    if unknown:
        raise CheckpointError(
            f"{source}: unexpected key {unknown[0]!r}" + (f" (+{len(unknown) - 1} more)" if len(unknown) > 1 else "")
        )
    own = module.state_dict()
    missing = sorted(set(own) - set(tensors))
    extra = sorted(set(tensors) - set(own))
    if missing:
        raise CheckpointError(
            f"{source}: missing key {missing[0]!r}" + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    if extra:
        raise CheckpointError(
            f"{source}: unexpected key {extra[0]!r}" + (f" (+{len(extra) - 1} more)" if len(extra) > 1 else "")
        )
    for k, t in tensors.items():
        if tuple(t.shape) != tuple(own[k].shape):
            raise CheckpointError(
                f"{source}: key {k!r} has shape {tuple(t.shape)}, the module expects {tuple(own[k].shape)}"
            )
    module.load_state_dict({k: t.to(own[k].dtype) for k, t in tensors.items()}, strict=True)
