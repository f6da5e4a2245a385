"""How a parallel build hands its ExportedPrograms to the compile workers (builder/parallel_compile.py): each
program saved without its tensors, and the tensors of all of a stage's programs written once beside them.

A stage's packages are exports of one module at different buckets, so their state dicts hold the same parameters.
`torch.export.save` writes them into every archive: the build's own process wrote a full DAC decoder's 739 MB
(fp32) once per package, one package after another, while the workers waited for their programs
(bench/results/cpu/probes/ep_save_cost/: 2.2-3.9 s a save, 1.3 s of it the program). Here each tensor is written
once per stage (`StageTensors`), each archive carries zero-stride stand-ins of its tensors' shapes and dtypes
(`save_program`; a few bytes each), and the worker puts the real tensors back before it compiles
(`load_program`). A tensor is shared only where the programs hold the very same one (same storage, offset, shape,
strides); a constant lifted per bucket under the same name stays that bucket's own. The build writes the file with
a stage's first program (its compile starts while the others export) and later programs share what it holds
(`StageTensors.held`)."""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _tables(ep: torch.export.ExportedProgram) -> dict[str, dict]:
    return {"state_dict": ep.state_dict, "constants": ep.constants}


def _shareable(t: object) -> bool:
    return type(t) in _PLAIN


def _identity(t: torch.Tensor) -> tuple:
    return (t.device, t.dtype, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())


class StageTensors:
    """The tensors of one stage's programs, each once: `add` a program (returns where each of its tensors sits in
    the file, `"<table>/<name>"` → entry), then `write`; `held` for programs after the write."""

    def __init__(self) -> None:
        self.entries: dict[str, torch.Tensor] = {}
        self._by_identity: dict[tuple, str] = {}

    def add(self, ep: torch.export.ExportedProgram) -> dict[str, str]:
        return self._names(ep, grow=True)

    def held(self, ep: torch.export.ExportedProgram) -> dict[str, str]:
        """`add` for a program that comes after `write`: only the tensors already held (the file has them); the
        program's others are saved in its own archive."""
        return self._names(ep, grow=False)

    def _names(self, ep: torch.export.ExportedProgram, grow: bool) -> dict[str, str]:
        names: dict[str, str] = {}
        for table, values in _tables(ep).items():
            for name, t in values.items():
                if not _shareable(t):
                    continue  # script objects, tensor subclasses: saved in the archive as torch does
                key = _identity(t)
                entry = self._by_identity.get(key)
                if entry is None and grow:
                    entry = self._by_identity[key] = str(len(self.entries))
                    self.entries[entry] = t
                if entry is not None:
                    names[f"{table}/{name}"] = entry
        return names

    def write(self, path: Path) -> None:
        # torch.save keeps Parameters as Parameters and views as views (one storage written once)
        torch.save(self.entries, path)


@contextmanager
def _stand_ins(ep: torch.export.ExportedProgram, names: dict[str, str]):
    """The program's shared tensors replaced by zero-stride stand-ins (a few bytes each in the archive), put back
    on exit."""
    tables = _tables(ep)
    originals: dict[tuple[str, str], torch.Tensor] = {}
    try:
        for qualified in names:
            table, name = qualified.split("/", 1)
            t = tables[table][name]
            originals[(table, name)] = t
            # on the CPU whatever the program's device: the archive writer copies a CUDA tensor to the host first,
            # and that copy of a zero-stride view would be the full size
            stand_in = torch.zeros((), dtype=t.dtype).expand(t.shape)
            tables[table][name] = torch.nn.Parameter(stand_in, False) if isinstance(t, torch.nn.Parameter) else stand_in
        yield
    finally:
        for (table, name), t in originals.items():
            tables[table][name] = t


def save_program(ep: torch.export.ExportedProgram, path: Path, names: dict[str, str]) -> None:
    """`torch.export.save` of `ep` without the tensors `names` places in its stage's file (`StageTensors.add`)."""
    with _stand_ins(ep, names), warnings.catch_warnings():
        # the archive writer looks for the tensor that covers each storage; a stand-in covers its one element only
        warnings.filterwarnings("ignore", message="No complete tensor found in the group")
        torch.export.save(ep, str(path))


def load_program(path: Path, tensors: Path | None, names: dict[str, str]) -> torch.export.ExportedProgram:
    """The program `save_program` wrote, its tensors back from the stage's file (`tensors`; None: a plain save)."""
    ep = torch.export.load(str(path))
    if tensors is None:
        return ep
    stored = torch.load(tensors, mmap=True, weights_only=True)
    tables = _tables(ep)
    for qualified, entry in names.items():
        table, name = qualified.split("/", 1)
        stand_in, t = tables[table][name], stored[entry]
        if (stand_in.shape, stand_in.dtype) != (t.shape, t.dtype):
            raise ValueError(
                f"{path.name}: {qualified} is {tuple(t.shape)} {t.dtype} in {tensors.name}, "
                f"{tuple(stand_in.shape)} {stand_in.dtype} in the program"
            )
        tables[table][name] = t
    return ep


__all__ = ["StageTensors", "load_program", "save_program"]
