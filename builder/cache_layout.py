"""The package cache's files on disk (builder/package_cache.py writes and reads them, builder/cache_prune.py bounds
them). Torch-free, so that the CLI's `cache` commands answer without importing torch.

    <root>/<key>/{package.pt2, entry.json}      a package and its record (key: 64 hex digits)
    <root>/index/<pre-key>.json                 a pre-export key → the package key it led to
    <root>/golden/<key>.{safetensors,json}      a stage's golden cases and their record
    <root>/<name>.lock                          the lock of one of them (`lock_name`)
    <root>/compiling-<key>.lock                 held by the build compiling that package in its workers
"""

from __future__ import annotations

import os
import re
from pathlib import Path

CACHE_ENV = "TTSAOT_CACHE_DIR"

PACKAGE, ENTRY, INDEX, GOLDEN = "package.pt2", "entry.json", "index", "golden"
COMPILING = "compiling"  # lock_name kind: a package's compile claim (PackageCache.claim)
KEY = re.compile(r"[0-9a-f]{64}")


def default_cache_dir() -> Path:
    """$TTSAOT_CACHE_DIR, else the user cache dir: $XDG_CACHE_HOME/ttsaot/packages (~/.cache/ttsaot/packages)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ttsaot" / "packages"


def lock_name(kind: str, key: str) -> str:
    """The lock of a package entry (kind PACKAGE), an index entry (INDEX), golden cases (GOLDEN) or a package's
    compile claim (COMPILING)."""
    return key if kind == PACKAGE else f"{kind}-{key}"


def lock_path(root: Path, name: str) -> Path:
    return Path(root) / f"{name}.lock"


__all__ = [
    "CACHE_ENV",
    "COMPILING",
    "ENTRY",
    "GOLDEN",
    "INDEX",
    "KEY",
    "PACKAGE",
    "default_cache_dir",
    "lock_name",
    "lock_path",
]
