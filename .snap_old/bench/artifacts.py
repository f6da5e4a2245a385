"""The bench's artifacts: one per (stage spec, bench buckets, kernel choice, toolchain), built through the builder's
public entry (`ttsaot.builder.build.build_family`) into a shared cache `<cache>/<key>/`, so `bench run`,
`bench build`, `bench profile` and the family commands reuse each other's builds."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch

from .common import now_iso, source_hash


def artifact_key(spec, desc: dict, device: torch.device) -> str:
    from ttsaot.builder.export import compiler_info
    from ttsaot.builder.stage_spec import resolve_kernels

    info = {
        "desc": {k: v for k, v in desc.items() if k not in ("options", "kernels")},
        # resolved: on CPU `auto` is `inductor`, and both name one artifact
        "kernels": resolve_kernels(desc.get("kernels", "auto"), device, spec.cuda_auto_kernels),
        "options": desc["options"],
        "torch": torch.__version__,
        "device": device.type,
        "sm": ".".join(map(str, torch.cuda.get_device_capability(device))) if device.type == "cuda" else None,
        "sources": source_hash("builder", "runtime"),
        # The C++ compiler too: a cached package built by another compiler may not even load (2026-11-21 on the
        # GPU machine, a preset $CXX wrapper's packages segfaulted on load and were reused by the next run).
        "cxx": compiler_info(),
    }
    return hashlib.sha256(json.dumps(info, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build_or_reuse(
    spec, desc: dict, device: torch.device, cache: Path, verify: bool, package_cache: Path | None = None, jobs: int = 1
) -> tuple[Path, dict]:
    """Build the stage's artifact for the bench buckets under cache/<hash>/, or reuse a finished one. Processes
    sharing the cache (xdist workers, parallel bench runs) wait for each other's build of the same key instead of
    failing on the builder's lock. package_cache: the builder's per-package cache (builder/package_cache.py), so
    that an artifact of other buckets reuses the packages it shares with one built before; jobs: parallel AOTI
    compiles of the stage's buckets (the artifact is the same either way)."""
    from filelock import FileLock

    key = artifact_key(spec, desc, device)
    root = cache / key
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root) + ".lock"):
        return _build_or_reuse_locked(spec, desc, device, root, key, verify, package_cache, jobs)


def _build_or_reuse_locked(
    spec,
    desc: dict,
    device: torch.device,
    root: Path,
    key: str,
    verify: bool,
    package_cache: Path | None = None,
    jobs: int = 1,
) -> tuple[Path, dict]:
    from ttsaot.builder.build import build_family

    path = root / spec.family
    done = root / ".done"
    if done.is_file() and (path / "manifest.json").is_file():
        return path, {"cache_key": key, "cached": True, "seconds": 0.0}
    t0 = time.time()
    res = build_family(
        spec.family,
        [spec],
        root,
        device=device,
        seed=desc["seed"],
        preset=desc["preset"],
        verify_in_subprocess=verify,
        keep_existing_stages=False,
        cache_dir=package_cache,
        jobs=jobs,
    )
    done.write_text(now_iso())
    return res.path, {
        "cache_key": key,
        "cached": False,
        "seconds": round(time.time() - t0, 2),
        "verified_in_subprocess": verify,
    }


def same_program_as_auto(spec, kernels: str, device: torch.device) -> str | None:
    """Why building the stage with `kernels` would only repeat the `auto` build, or None. On CUDA a stage without
    kernel passes compiles the same program either way (only its manifest's `kernels` would differ): the second
    build is skipped. (On CPU both resolve to inductor and share one cached artifact anyway.)"""
    from ttsaot.builder.stage_spec import resolve_kernels

    auto = resolve_kernels("auto", device, spec.cuda_auto_kernels)
    if kernels == "auto" or resolve_kernels(kernels, device, spec.cuda_auto_kernels) == auto or spec.kernel_passes:
        return None
    return f"the stage has no kernel passes: kernels={kernels} builds the same program as kernels=auto ({auto})"
