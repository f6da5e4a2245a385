"""The family registry: family id → its package, which exports `FAMILY: Family` (builder/family.py describes the
package layout). Adding a family touches its package and one line here. A family kept outside this repository
registers itself with `register_family("its.package")` before the builder is used (in-process)."""

from __future__ import annotations

import importlib

from ..family import Family
from ..options import OptionsError

FAMILIES: dict[str, str] = {
    "qwen3-tts-12hz": "ttsaot.builder.families.qwen3_tts_12hz",
    "fish-s2-pro": "ttsaot.builder.families.fish_s2_pro",
    "voxcpm2": "ttsaot.builder.families.voxcpm2",
}


def _load(package: str) -> Family:
    fam = getattr(importlib.import_module(package), "FAMILY", None)
    if not isinstance(fam, Family):
        raise TypeError(f"{package} does not export FAMILY = Family(...)")
    return fam


def get_family(name: str) -> Family:
    """The Family of a registered id (torch-free: imports only the package's __init__ and options)."""
    if name not in FAMILIES:
        raise OptionsError(f"unknown family {name!r} (known: {', '.join(sorted(FAMILIES))})")
    fam = _load(FAMILIES[name])
    if fam.name != name:
        raise TypeError(f"{FAMILIES[name]} exports family {fam.name!r}, registered as {name!r}")
    return fam


def register_family(package: str) -> Family:
    """Add the family exported by `package` (an importable package with the family layout) to the registry."""
    fam = _load(package)
    if FAMILIES.get(fam.name, package) != package:
        raise ValueError(f"family {fam.name!r} is already registered by {FAMILIES[fam.name]}")
    FAMILIES[fam.name] = package
    return fam
