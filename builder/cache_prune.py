"""Keep the package cache (builder/package_cache.py) within a size: least recently used entries go first.

Every build adds packages and golden cases for what it compiled; a change to a kernel source, the toolchain or a
bucket plan makes new keys and leaves the old entries behind, so without a bound the cache only grows (the GPU
tests' cache, shared by every run of the suite: 135 MB after one cold run). What is bounded: package entries
(`<key>/`, their package and record) and golden cases (`golden/<key>.*`). Their "last used" is the modification time
of their record, which `PackageCache.fetch` / `fetch_golden` refresh on every reuse and a store writes. Index
entries (`index/<pre-key>.json`, a few KB each) only point at a package: those whose package is gone (pruned here or
discarded by a build) are dropped. Folders a crashed store left (`.tmp-*`) older than an hour are removed too. Lock
files (empty) stay: removing one that another process holds or waits on would let two processes hold "the" lock at
once. Torch-free (the CLI's `cache` commands).

An entry is removed only under its lock, taken without waiting: one that a running build holds is skipped and
counted (`busy`), never waited for. An entry used at or after `protect_since` (a build passes its start) is kept
whatever the size, so a build never evicts what it just used. Removing an entry is always safe for a concurrent
build: a lookup that finds nothing compiles (or runs the golden cases) again, and repairs the index.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout

from .cache_layout import ENTRY, GOLDEN, INDEX, KEY, PACKAGE, lock_name, lock_path

SIZE_ENV = "TTSAOT_CACHE_MAX_SIZE"
# The CLI's bound when neither --cache-max-size nor $TTSAOT_CACHE_MAX_SIZE says: generous (what the full builds'
# entries weigh has not been measured; the tiny GPU test suite's cold run stored ~135 MB), it is a backstop against
# the cache growing with every kernel or toolchain change, not a tight budget.
DEFAULT_MAX_SIZE = "20GB"
STALE_TMP_S = 3600.0  # a `.tmp-*` folder this old is a crashed store's, not one in progress
_SIZE = re.compile(r"(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>(?:[kmgt]i?)?b?)", re.IGNORECASE)
_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}
_BINARY = {"ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}


class CacheSizeError(ValueError):
    """A cache size that does not parse (`20GB`, `512MiB`, `0`, `off`)."""


def parse_size(text: str) -> int | None:
    """Bytes for `20GB` / `1.5GiB` / `512M` / `1000` (decimal units, `i` for binary ones); None for `off` / `none`
    (no bound)."""
    s = text.strip()
    if s.lower() in ("off", "none", "unlimited"):
        return None
    m = _SIZE.fullmatch(s)
    if m is None:
        raise CacheSizeError(
            f"cache size {text!r}: expected a number of bytes with an optional unit (20GB, 512MiB) or off"
        )
    unit = m["unit"].lower().removesuffix("b")
    return int(float(m["n"]) * (_BINARY.get(unit) or _UNITS[unit]))


def default_max_bytes() -> int | None:
    """$TTSAOT_CACHE_MAX_SIZE, else DEFAULT_MAX_SIZE."""
    return parse_size(os.environ.get(SIZE_ENV) or DEFAULT_MAX_SIZE)


@dataclass(frozen=True)
class CacheItem:
    kind: str  # "package" | "golden"
    key: str
    bytes: int
    last_used: float  # seconds since the epoch
    paths: tuple[Path, ...]
    lock: str  # its lock's name (cache_layout.lock_name)


@dataclass
class PruneResult:
    removed: list[CacheItem] = field(default_factory=list)
    busy: int = 0  # entries over the bound that a running build held: left
    dangling_index: int = 0  # index entries dropped because their package is gone
    stale_tmp: int = 0
    bytes_before: int = 0
    bytes_after: int = 0

    @property
    def freed(self) -> int:
        return sum(i.bytes for i in self.removed)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def cache_items(root: Path) -> list[CacheItem]:
    """The cache's package entries and golden cases, least recently used first. Entries that vanish while they
    are listed (a concurrent prune or discard) are left out."""
    items: list[CacheItem] = []
    if not root.is_dir():
        return items
    for entry in root.iterdir():
        if not (entry.is_dir() and KEY.fullmatch(entry.name)):
            continue
        try:
            items.append(
                CacheItem(
                    "package",
                    entry.name,
                    _size(entry),
                    (entry / ENTRY).stat().st_mtime,
                    (entry,),
                    lock_name(PACKAGE, entry.name),
                )
            )
        except FileNotFoundError:
            continue
    golden = root / GOLDEN
    if golden.is_dir():
        for record in golden.glob("*.json"):
            if not KEY.fullmatch(record.stem):
                continue
            files = (record.with_suffix(".safetensors"), record)
            try:
                used = record.stat().st_mtime
                size = sum(p.stat().st_size for p in files if p.exists())
            except FileNotFoundError:
                continue
            items.append(CacheItem("golden", record.stem, size, used, files, lock_name(GOLDEN, record.stem)))
    return sorted(items, key=lambda i: i.last_used)


def _index_bytes(root: Path) -> int:
    index = root / INDEX
    return sum(p.stat().st_size for p in index.glob("*.json")) if index.is_dir() else 0


def cache_bytes(root: Path) -> int:
    """What prune bounds: package entries, golden cases and index entries."""
    return sum(i.bytes for i in cache_items(root)) + _index_bytes(root)


def _remove(item: CacheItem) -> None:
    for p in item.paths:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _drop_dangling_index(root: Path) -> int:
    dropped = 0
    index = root / INDEX
    if not index.is_dir():
        return 0
    for path in index.glob("*.json"):
        try:
            key = json.loads(path.read_text()).get("package_key")
        except (OSError, ValueError, AttributeError):
            key = None  # unreadable: fetch_indexed would discard it too
        if isinstance(key, str) and (root / key / ENTRY).is_file():
            continue
        try:
            with FileLock(str(lock_path(root, lock_name(INDEX, path.stem))), timeout=0):
                path.unlink(missing_ok=True)
                dropped += 1
        except Timeout:
            continue
    return dropped


def _drop_stale_tmp(root: Path, now: float) -> int:
    dropped = 0
    for tmp in root.glob(".tmp-*"):
        try:
            if now - tmp.stat().st_mtime > STALE_TMP_S:
                shutil.rmtree(tmp, ignore_errors=True)
                dropped += 1
        except FileNotFoundError:
            continue
    return dropped


def prune(root: Path, max_bytes: int, protect_since: float | None = None) -> PruneResult:
    """Remove least recently used entries until the cache at `root` holds at most `max_bytes` (0 empties it of
    everything not in use). Entries used at or after `protect_since` and entries another process holds are kept."""
    root = Path(root)
    res = PruneResult(stale_tmp=_drop_stale_tmp(root, time.time()) if root.is_dir() else 0)
    items = cache_items(root)
    total = sum(i.bytes for i in items) + _index_bytes(root)
    res.bytes_before = total
    for item in items:
        if total <= max_bytes:
            break
        if protect_since is not None and item.last_used >= protect_since:
            continue
        try:
            with FileLock(str(lock_path(root, item.lock)), timeout=0):
                _remove(item)
        except Timeout:
            res.busy += 1
            continue
        res.removed.append(item)
        total -= item.bytes
    res.dangling_index = _drop_dangling_index(root)
    res.bytes_after = cache_bytes(root)
    return res


def describe(res: PruneResult, max_bytes: int) -> str:
    """One line for the build's notes / the CLI."""
    mb = 1e6
    line = (
        f"package cache: {len(res.removed)} least recently used entries removed ({res.freed / mb:.1f} MB), "
        f"{res.bytes_after / mb:.1f} MB left (bound {max_bytes / mb:.1f} MB)"
    )
    extra = [
        f"{n} {what}"
        for n, what in (
            (res.busy, "in use by another build, kept"),
            (res.dangling_index, "index entries of missing packages dropped"),
            (res.stale_tmp, "crashed stores' folders removed"),
        )
        if n
    ]
    return line + (f"; {', '.join(extra)}" if extra else "")


__all__ = [
    "DEFAULT_MAX_SIZE",
    "SIZE_ENV",
    "CacheItem",
    "CacheSizeError",
    "PruneResult",
    "cache_bytes",
    "cache_items",
    "default_max_bytes",
    "describe",
    "parse_size",
    "prune",
]
