"""Bounding the package cache (builder/cache_prune.py): least recently used entries go first, never one a running
build holds or the current build used; index entries of removed packages and crashed stores' folders go with them;
a reuse refreshes an entry's "last used"; the CLI's `cache info` / `cache prune` and `build --cache-max-size`."""

import json
import os
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from filelock import FileLock

from ttsaot.builder.cache_layout import ENTRY, GOLDEN, INDEX, PACKAGE, lock_name, lock_path
from ttsaot.builder.cache_prune import (
    CacheSizeError,
    cache_bytes,
    cache_items,
    default_max_bytes,
    parse_size,
    prune,
)
from ttsaot.builder.cli import main
from ttsaot.builder.package_cache import PackageCache


@pytest.mark.parametrize(
    "text, n",
    [
        ("1000", 1000),
        ("0", 0),
        ("20GB", 20 * 10**9),
        ("20gb", 20 * 10**9),
        ("512M", 512 * 10**6),
        ("1.5GiB", int(1.5 * 2**30)),
        ("3KiB", 3072),
        ("7 kb", 7000),
        ("off", None),
        ("None", None),
    ],
)
def test_sizes_parse(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "GB", "-1GB", "12 parsecs", "1e3", "5PB"])
def test_a_bad_size_is_a_typed_error(text):
    with pytest.raises(CacheSizeError, match="cache size"):
        parse_size(text)


def test_the_default_bound_reads_the_environment(monkeypatch):
    monkeypatch.delenv("TTSAOT_CACHE_MAX_SIZE", raising=False)
    assert default_max_bytes() == 20 * 10**9
    monkeypatch.setenv("TTSAOT_CACHE_MAX_SIZE", "off")
    assert default_max_bytes() is None


def _key(i: int) -> str:
    return f"{i:064x}"


def _package(root: Path, i: int, size: int, age_s: float) -> str:
    key = _key(i)
    entry = root / key
    entry.mkdir(parents=True)
    (entry / PACKAGE).write_bytes(os.urandom(size))
    (entry / ENTRY).write_text(json.dumps({"key": key}))
    t = time.time() - age_s
    os.utime(entry / ENTRY, (t, t))
    return key


def _golden(root: Path, i: int, size: int, age_s: float) -> str:
    key = _key(1000 + i)
    (root / GOLDEN).mkdir(parents=True, exist_ok=True)
    (root / GOLDEN / f"{key}.safetensors").write_bytes(os.urandom(size))
    record = root / GOLDEN / f"{key}.json"
    record.write_text("{}")
    t = time.time() - age_s
    os.utime(record, (t, t))
    return key


def _index(root: Path, pre: int, key: str) -> Path:
    (root / INDEX).mkdir(parents=True, exist_ok=True)
    path = root / INDEX / f"{_key(5000 + pre)}.json"
    path.write_text(json.dumps({"package_key": key}))
    return path


def test_least_recently_used_go_first_the_protected_and_the_busy_stay(tmp_path):
    root = tmp_path / "cache"
    oldest, busy, older, recent = (_package(root, i, 10_000, age) for i, age in enumerate((400, 300, 200, 100)))
    golden = _golden(root, 0, 5_000, 250)
    gone_index, kept_index = _index(root, 0, oldest), _index(root, 1, recent)
    stale = root / ".tmp-crashed"
    stale.mkdir()
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    assert [i.key for i in cache_items(root)] == [oldest, busy, golden, older, recent]
    # held by "another build" (a lock of its own: flock conflicts across open files, in one process too)
    with FileLock(str(lock_path(root, lock_name(PACKAGE, busy)))):
        res = prune(root, max_bytes=1, protect_since=time.time() - 150)
    assert [i.key for i in res.removed] == [oldest, golden, older]  # busy skipped, recent protected
    assert res.busy == 1 and res.stale_tmp == 1 and res.dangling_index == 1
    assert not (root / oldest).exists() and not (root / older).exists() and (root / busy).exists()
    assert not (root / GOLDEN / f"{golden}.safetensors").exists()
    assert not gone_index.exists() and kept_index.exists() and not stale.exists()
    assert res.freed == sum(i.bytes for i in res.removed) and res.bytes_after == cache_bytes(root)
    assert res.bytes_after < res.bytes_before


def test_a_bound_already_met_removes_nothing(tmp_path):
    root = tmp_path / "cache"
    keys = [_package(root, i, 1_000, 100 * i) for i in range(3)]
    res = prune(root, max_bytes=cache_bytes(root))
    assert res.removed == [] and all((root / k).exists() for k in keys)
    assert prune(tmp_path / "absent", 0).removed == []  # no cache yet: nothing to do, no error


def test_a_reuse_refreshes_last_used(tmp_path):
    cache = PackageCache(tmp_path / "cache")
    w = torch.arange(6.0)
    package = tmp_path / "p.pt2"
    package.write_bytes(b"a package")
    key = _key(7)
    assert cache.store(key, package, {"w": w}, {"w": w})
    record = cache.root / key / ENTRY
    os.utime(record, (1.0, 1.0))
    assert cache.fetch(key, {"w": w}, tmp_path / "out.pt2").weights is not None
    assert record.stat().st_mtime > time.time() - 60
    golden = tmp_path / "g.safetensors"
    golden.write_bytes(b"cases")
    cache.store_golden(key, golden)
    os.utime(cache.root / GOLDEN / f"{key}.json", (1.0, 1.0))
    assert cache.fetch_golden(key, tmp_path / "g2.safetensors")
    assert (cache.root / GOLDEN / f"{key}.json").stat().st_mtime > time.time() - 60


def test_cli_cache_info_and_prune(tmp_path):
    root = tmp_path / "cache"
    for i in range(3):
        _package(root, i, 2_000, 100 * (i + 1))
    runner = CliRunner()
    res = runner.invoke(main, ["cache", "info", "--cache-dir", str(root)])
    assert res.exit_code == 0, res.output
    assert "package" in res.output and "3" in res.output
    res = runner.invoke(main, ["cache", "prune", "--cache-dir", str(root), "--max-size", "0"])
    assert res.exit_code == 0, res.output
    assert "3 least recently used entries removed" in res.output and cache_items(root) == []
    res = runner.invoke(main, ["cache", "prune", "--cache-dir", str(root), "--max-size", "12 parsecs"])
    assert res.exit_code == 2 and "cache size '12 parsecs'" in res.output


def test_build_refuses_a_bad_cache_size_before_building(tmp_path):
    res = CliRunner().invoke(
        main,
        ["build", "qwen3-tts-12hz", "--random-weights", "--out", str(tmp_path), "--cache-max-size", "lots"],
    )
    assert res.exit_code == 2 and "--cache-max-size" in res.output and not any(tmp_path.iterdir())
