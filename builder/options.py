"""Build options: the generic ones every family has, and how a family declares its own CLI flags.

A family's options dataclass subclasses `BuildOptions` and marks the fields the command line may set with
`flag(...)`, `switch(...)` or `flag_group(...)` (a nested dataclass whose own fields carry flags, e.g. the
streaming plan). `build-artifacts build` offers exactly those flags for that family and refuses any other.

Torch-free on purpose: `--help`, `list` and every usage error are answered from these declarations before torch
is imported (importing torch takes seconds)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

FLAG = "ttsaot.flag"  # field metadata key: a Flag
FLAG_GROUP = "ttsaot.flag_group"  # field metadata key: a nested dataclass whose fields carry flags
DYNAMIC_PACKAGES = ("auto", "on", "off", "cold")  # BuildOptions.dynamic_packages


class OptionsError(ValueError):
    """Options a family does not have, or values it cannot build: a usage error (the CLI exits 2)."""


@dataclass(frozen=True)
class Flag:
    """One command-line flag. `parse` turns its text into the field's value (raising ValueError with a short
    reason); a switch has no parse: given, it sets the field to the opposite of its default."""

    name: str
    help: str
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None
    path: tuple[str, ...] = ()  # field names from the options object down to the field (filled in by flags_of)

    @property
    def is_switch(self) -> bool:
        return self.parse is None


def flag(
    default: Any = MISSING,
    *,
    help: str,
    parse: Callable[[str], Any],
    name: str | None = None,
    metavar: str | None = None,
    default_factory: Any = MISSING,
) -> Any:
    """A dataclass field settable from the command line (`--field-name VALUE` unless `name` is given)."""
    meta = {FLAG: Flag(name or "", help, parse, metavar)}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def switch(default: bool, *, help: str, name: str | None = None) -> Any:
    """A boolean field flipped by a flag without a value (`--with-embedding`, `--no-pow2`)."""
    return field(default=default, metadata={FLAG: Flag(name or "", help, None)})


def flag_group(default_factory: Callable[[], Any], *, help: str = "") -> Any:
    """A nested dataclass field whose own fields are flags (they override fields of this default)."""
    return field(default_factory=default_factory, metadata={FLAG_GROUP: help})


def _flag_name(f: Field) -> str:
    return "--" + f.name.replace("_", "-")


def flags_of(options: type | Any) -> list[Flag]:
    """Every flag an options class (or instance) declares, nested groups included, with its field path."""
    cls = options if isinstance(options, type) else type(options)
    out: list[Flag] = []
    for f in fields(cls):
        if FLAG in f.metadata:
            fl: Flag = f.metadata[FLAG]
            out.append(replace(fl, name=fl.name or _flag_name(f), path=(f.name,)))
        elif FLAG_GROUP in f.metadata:
            inner = f.default_factory() if f.default_factory is not MISSING else f.default  # type: ignore[misc]
            if not is_dataclass(inner):
                raise TypeError(f"{cls.__name__}.{f.name}: flag_group needs a dataclass default")
            out += [replace(fl, path=(f.name, *fl.path)) for fl in flags_of(inner)]
    names = [fl.name for fl in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise TypeError(f"{cls.__name__} declares flag {dup[0]} twice")
    return out


def with_flags(options: Any, values: dict[str, Any]) -> Any:
    """A copy of `options` with parsed flag values ({flag name: value}) set on the fields they declare."""
    by_name = {fl.name: fl for fl in flags_of(options)}
    nested: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for name, value in values.items():
        path = by_name[name].path
        if len(path) == 1:
            top[path[0]] = value
        else:
            nested.setdefault(path[0], {})[path[1]] = value
    for group, kw in nested.items():
        try:
            top[group] = replace(getattr(options, group), **kw)
        except ValueError as e:  # the group's own validation (e.g. StreamingConfig)
            raise OptionsError(str(e)) from None
    return replace(options, **top)


# ----------------------------------------------------------------------------------------------- parsers
def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None
    if n <= 0:
        raise ValueError(f"must be positive, got {n}")
    return n


def non_negative_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None
    if n < 0:
        raise ValueError(f"must be >= 0, got {n}")
    return n


def positive_ints(text: str) -> tuple[int, ...]:
    """`1,4` → (1, 4)."""
    try:
        out = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    if any(v <= 0 for v in out):
        raise ValueError(f"sizes must be positive, got {text!r}")
    return out


def positive_floats(text: str) -> tuple[float, ...]:
    """`5,10` → (5.0, 10.0)."""
    try:
        out = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"expected comma-separated numbers, got {text!r}") from None
    if any(not v > 0 for v in out):
        raise ValueError(f"values must be positive, got {text!r}")
    return out


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    if not v > 0:
        raise ValueError(f"must be positive, got {text}")
    return v


def one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")
        return text

    parse.choices = choices  # type: ignore[attr-defined]  # shown in --help
    return parse


# ------------------------------------------------------------------------------------------ generic options
@dataclass
class BuildOptions:
    """What every family takes. The CLI sets these from its generic flags (--preset, --checkpoint, --seed,
    --dtype, --max-batch, --batch-buckets, --kernels, --dynamic-packages); family options add their own flagged
    fields."""

    preset: str = "tiny"  # named config for --random-weights builds
    checkpoint: str | None = None  # real checkpoint directory (family layout in README)
    seed: int = 0  # random weights and golden inputs
    dtype: torch.dtype | None = None  # None: each stage's default (numerics policy)
    max_batch: int = 4  # batch buckets: powers of two up to it (and it)
    batch_buckets: tuple[int, ...] | None = None  # explicit batch buckets instead
    kernels: str = "auto"  # the ttsaot kernel layer or Inductor's code (stage_spec.KERNELS)
    # One dynamic-shape AOTI package per stage serving all its buckets ("on"), one static package per bucket
    # ("off"), static ones for the buckets a stream hits on every chunk and dynamic ones for the rest ("cold"), or
    # "auto": on for CPU builds, off for CUDA ones (on the GPU the kernels autotune per static shape).
    # stage_spec.resolve_dynamic_packages.
    dynamic_packages: str = "auto"
    # the device type the artifact is built for ("cpu" | "cuda"), for defaults that differ by device (the Fish
    # dac_decoder's numerics); None = not said: the CPU defaults. The CLI sets it from --device.
    device: str | None = None

    def validate(self) -> None:
        """Raise OptionsError for values no stage can build (families extend this)."""
        if self.device is not None and self.device not in ("cpu", "cuda"):
            raise OptionsError(f"device must be cpu or cuda (a device type), got {self.device!r}")
        if self.kernels not in ("auto", "ttsaot", "inductor"):
            raise OptionsError(f"kernels must be auto, ttsaot or inductor, got {self.kernels!r}")
        if self.dynamic_packages not in DYNAMIC_PACKAGES:
            raise OptionsError(
                f"dynamic_packages must be one of {', '.join(DYNAMIC_PACKAGES)}, got {self.dynamic_packages!r}"
            )
        if self.max_batch < 1:
            raise OptionsError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.batch_buckets is not None and (not self.batch_buckets or min(self.batch_buckets) < 1):
            raise OptionsError(f"batch buckets must be positive, got {self.batch_buckets}")
