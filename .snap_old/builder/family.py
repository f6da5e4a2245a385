"""A model family as the builder sees it: `Family(name, presets, Options, stages, package)`.

Every family is a package with one layout (builder/families/<family id as module>/):

  __init__.py     `FAMILY = Family(...)`: torch-free, so the CLI answers --help, list and usage errors at once
  options.py      the options dataclass (a BuildOptions subclass declaring its CLI flags): torch-free
  config.py       config dataclasses per stage, named presets, `*_from_checkpoint(dir)` reading the real files
  <modules>.py    the faithful nn.Modules (one file per model part, named for what it is)
  checkpoint.py   the strict checkpoint-name mapping, loading, random init and test-checkpoint writers
  stages.py       `STAGES = {stage name: recipe(options) -> StageSpec}` and `default_stages(options)`

Only the stages asked for are set up: a recipe reads the configs and checkpoints of its own stage, when called."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from .options import BuildOptions, Flag, OptionsError, flags_of

if TYPE_CHECKING:
    from .stage_spec import StageSpec


@dataclass(frozen=True)
class Family:
    name: str  # family id, as in the artifact's manifest and the CLI
    presets: tuple[str, ...]  # named configs for --random-weights builds
    Options: type[BuildOptions]  # noqa: N815 - the options class, named as the design names it
    stages: tuple[str, ...]  # stage names, in build order
    package: str  # the family's package; `<package>.stages` holds the recipes

    @property
    def flags(self) -> list[Flag]:
        """The CLI flags this family declares (beyond the generic ones)."""
        return flags_of(self.Options)

    def options(self, **values: Any) -> BuildOptions:
        """The family's options from keyword values (None = the default); an unknown name is an OptionsError
        naming the family and its options."""
        known = [f.name for f in fields(self.Options)]
        unknown = [k for k in values if k not in known]
        if unknown:
            raise OptionsError(f"{self.name} has no option {unknown[0]!r} (its options: {', '.join(known)})")
        opts = self.Options(**{k: v for k, v in values.items() if v is not None})
        self.check(opts)
        return opts

    def check(self, opts: BuildOptions) -> None:
        if not isinstance(opts, self.Options):
            raise TypeError(f"{self.name} takes {self.Options.__name__}, got {type(opts).__name__}")
        if opts.preset not in self.presets:
            raise OptionsError(f"unknown preset {opts.preset!r} for {self.name} (have: {', '.join(self.presets)})")
        opts.validate()

    def check_stages(self, names: Sequence[str]) -> None:
        for n in names:
            if n not in self.stages:
                raise OptionsError(f"unknown stage {n!r} for {self.name} (have: {', '.join(self.stages)})")

    def default_stages(self, opts: BuildOptions) -> tuple[str, ...]:
        """The stages a build without --stages makes: all, or those the checkpoint holds (a Qwen speech-tokenizer
        directory has no code predictor; a Fish directory with only codec.pth has no Fast AR)."""
        chosen = set(self._recipes().default_stages(opts))
        return tuple(n for n in self.stages if n in chosen)

    def specs(self, opts: BuildOptions, names: Sequence[str] | None = None) -> list[StageSpec]:
        """Set up the named stages (default: `default_stages`), in the family's order. Imports torch and the
        family's modules; reads only these stages' configs and checkpoints."""
        self.check(opts)
        if names is not None:
            self.check_stages(names)
        chosen = set(names) if names is not None else set(self.default_stages(opts))
        recipes = self._recipes().STAGES
        return [
            replace(recipes[n](opts), kernels=opts.kernels, dynamic_packages=opts.dynamic_packages)
            for n in self.stages
            if n in chosen
        ]

    def _recipes(self):
        module = importlib.import_module(f"{self.package}.stages")
        if tuple(module.STAGES) != self.stages:
            raise RuntimeError(
                f"{self.package}.stages.STAGES {tuple(module.STAGES)} does not match FAMILY.stages {self.stages}"
            )
        return module
