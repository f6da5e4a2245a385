"""Typed errors. Every refusal is one of these, with a one-line message that says what to do."""

from __future__ import annotations


class TTSAOTError(Exception):
    """Base of every error ttsaot raises on purpose."""


# ----------------------------------------------------------------------------------- artifacts
class ArtifactError(TTSAOTError):
    """The artifact cannot be used (missing, malformed, tampered, incompatible)."""


class ArtifactNotFoundError(ArtifactError, FileNotFoundError):
    pass


class ManifestError(ArtifactError):
    """manifest.json is missing a field, has a wrong type, or an unknown format version."""


class IntegrityError(ArtifactError):
    """A file's sha256 or size differs from the manifest (corrupt, truncated or tampered)."""


class CompatibilityError(ArtifactError):
    """Built for another torch version, device type, GPU architecture or CPU ISA."""


class BindingError(ArtifactError):
    """The stage weights do not match what a package expects (name, dtype, shape, stride, alignment)."""


# -------------------------------------------------------------------------------------- inputs
class InputError(TTSAOTError, ValueError):
    """A request the stage cannot serve. The stage stays usable for the next call."""


class InputShapeError(InputError):
    pass


class InputDTypeError(InputError):
    pass


class InputDeviceError(InputError):
    pass


class InputRangeError(InputError):
    """A code outside its codebook, a position past the cache, ..."""


class InputValueError(InputError):
    """NaN/Inf in a float input, an empty input."""
