"""The one dtype table: the names the artifact format uses, and the short aliases people type (`bf16`).

Importable without torch (the CLI checks its arguments before torch is imported); the torch conversions import it
on use."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Every dtype an artifact may name (manifest `dtype`, I/O descriptors, constants, `cache_dtype`); each is also
# the attribute name of the torch dtype.
DTYPE_NAMES: tuple[str, ...] = ("float32", "bfloat16", "float16", "int64", "int32", "bool", "uint8")

# What a user may type for a compute dtype (CLI `--dtype`, bench `--dtype`) → the format's name.
DTYPE_ALIASES: dict[str, str] = {
    "fp32": "float32",
    "float32": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
}
# The aliases a compute dtype is usually given by (`--dtype bf16`), in the order the CLI lists them.
SHORT_DTYPE_NAMES: tuple[str, ...] = ("bf16", "fp32", "fp16")


def canonical_dtype_name(name: str) -> str:
    """`bf16` → `bfloat16`; a format name is returned as it is. ValueError for anything else."""
    if name in DTYPE_NAMES:
        return name
    try:
        return DTYPE_ALIASES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (have: {', '.join([*DTYPE_ALIASES, *DTYPE_NAMES[3:]])})") from None


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a format name or alias."""
    import torch

    return getattr(torch, canonical_dtype_name(name))


def dtype_name(dtype: torch.dtype) -> str:
    """The format's name of a torch dtype (`torch.bfloat16` → `bfloat16`)."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_NAMES:
        raise ValueError(f"unsupported dtype {dtype}")
    return name
