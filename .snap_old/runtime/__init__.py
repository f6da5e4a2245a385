"""ttsaot runtime: load an artifact and serve its stages. Imports torch, safetensors and numpy only.

The names below are imported on first use, so `ttsaot.runtime.errors` and `ttsaot.runtime.dtypes` can be used
without importing torch (the builder's CLI checks its arguments before torch is loaded)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .artifact import FORMAT_VERSION, Manifest, read_manifest
    from .errors import (
        ArtifactError,
        ArtifactNotFoundError,
        BindingError,
        CompatibilityError,
        InputDeviceError,
        InputDTypeError,
        InputError,
        InputRangeError,
        InputShapeError,
        InputValueError,
        IntegrityError,
        ManifestError,
        TTSAOTError,
    )
    from .loader import STAGE_CLASSES, Bundle, load, stage_class
    from .stage import Stage
    from .streaming import CodecDecoderStage

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("FORMAT_VERSION", "Manifest", "read_manifest"), "artifact"),
    **dict.fromkeys(
        (
            "ArtifactError",
            "ArtifactNotFoundError",
            "BindingError",
            "CompatibilityError",
            "InputDeviceError",
            "InputDTypeError",
            "InputError",
            "InputRangeError",
            "InputShapeError",
            "InputValueError",
            "IntegrityError",
            "ManifestError",
            "TTSAOTError",
        ),
        "errors",
    ),
    **dict.fromkeys(("STAGE_CLASSES", "Bundle", "load", "stage_class"), "loader"),
    "Stage": "stage",
    "CodecDecoderStage": "streaming",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "FORMAT_VERSION",
    "ArtifactError",
    "ArtifactNotFoundError",
    "BindingError",
    "Bundle",
    "CodecDecoderStage",
    "CompatibilityError",
    "InputDTypeError",
    "InputDeviceError",
    "InputError",
    "InputRangeError",
    "InputShapeError",
    "InputValueError",
    "IntegrityError",
    "Manifest",
    "ManifestError",
    "STAGE_CLASSES",
    "Stage",
    "TTSAOTError",
    "load",
    "read_manifest",
    "stage_class",
]
