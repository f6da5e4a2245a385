"""Family registry: family id → module providing `stages(options)`, `options_from_cli(**kw)`, `STAGE_NAMES`,
`PRESETS`. Adding a family touches its own module, its tests and one line here."""

from __future__ import annotations

import importlib
from types import ModuleType

FAMILIES: dict[str, str] = {
    "qwen3-tts-12hz": "ttsaot.builder.families.qwen3_tts",
    "fish-s2-pro": "ttsaot.builder.families.fish_s2",
    "voxcpm2": "ttsaot.builder.families.voxcpm2",
}


def get_family(name: str) -> ModuleType:
    if name not in FAMILIES:
        raise KeyError(f"unknown family {name!r} (known: {', '.join(sorted(FAMILIES))})")
    return importlib.import_module(FAMILIES[name])
