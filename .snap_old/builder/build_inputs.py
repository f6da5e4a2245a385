"""The key of everything a build's output depends on, so that the same command run again over an artifact it built
is a no-op (issue 17: a rebuild with no change in seconds, not the minute a full pass over the package cache takes
on a full-size checkpoint).

A build records this key in its manifest (`build_env["inputs_key"]`). When the key of a new build equals the one
the installed artifact records, the build checks that artifact instead of making it again: the subprocess load
check (every file's sha256, every package loaded, every golden case run, builder/load_check.py) or, with
`--no-verify`, the file digests alone; if that check fails, the build goes on as a full one. `--no-cache` skips it.

What the key covers: the family, the stage specs (`stable_text`: configs, bucket plans, dtypes, kernel choices,
I/O), the caller's options (the family options the CLI parsed: preset, seed, checkpoint folder, flags), the files
the weights come from (`checkpoint_identity`), formats and Inductor options, the source of the builder and the
runtime, the build environment (torch, Triton, CUDA, compiler, GPU) and the Inductor / Triton environment."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .package_cache import _environment, sources_hash, stable_text

INPUTS_KEY = "inputs_key"  # the manifest's build_env entry
INPUTS_FORMAT = 1
CONTENT_HASH_BYTES = 1 << 20  # checkpoint files up to this size are hashed; larger ones are identified by stat


def checkpoint_identity(root: str | Path) -> list[list[Any]]:
    """Every file below `root` (symlinks followed, as the loaders read them; hidden names skipped: a hub download's
    `.cache/` bookkeeping): its relative path, size, and either its sha256 (small files: the configs) or its
    (mtime_ns, ctime_ns, inode, device). A weights file rewritten in place changes its ctime, which nothing can set
    back, so re-hashing gigabytes of weights on every build is not needed to notice it."""
    root = Path(root)
    out: list[list[Any]] = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or not path.is_file():
            continue
        st = path.stat()
        if st.st_size <= CONTENT_HASH_BYTES:
            out.append([rel.as_posix(), st.st_size, hashlib.sha256(path.read_bytes()).hexdigest()])
        else:
            out.append([rel.as_posix(), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev])
    return out


def build_inputs_key(
    family: str,
    specs: Sequence[Any],
    caller_inputs: dict[str, Any],
    build_env: dict[str, Any],
    formats: Sequence[str],
    extra_inductor_options: dict | None,
    keep_existing_stages: bool,
) -> str:
    """`caller_inputs`: what the caller knows decides the modules and weights beyond the specs (the CLI: the family
    options it parsed and `checkpoint_identity` of the checkpoint folder). `build_env`: builder/build.py
    `build_env` of the build's device."""
    from .. import runtime
    from ..runtime.artifact import FORMAT_VERSION

    info = {
        "inputs_format": INPUTS_FORMAT,
        "artifact_format": FORMAT_VERSION,
        "family": family,
        "specs": [stable_text(s) for s in specs],
        "caller": stable_text(caller_inputs),
        "formats": list(formats),
        "inductor_options": stable_text(extra_inductor_options),
        "keep_existing_stages": keep_existing_stages,
        # the whole builder, CLI included (it parses the options), and the runtime, which writes and reads the
        # manifest and runs the golden cases the build checks
        "builder_sources": sources_hash(Path(__file__).parent),
        "runtime_sources": sources_hash(Path(runtime.__file__).parent),
        "build_env": build_env,
        "torch_config": [torch.__version__, torch.get_default_dtype()],
        **_environment(),
    }
    return hashlib.sha256(json.dumps(info, sort_keys=True, default=str).encode()).hexdigest()


__all__ = ["INPUTS_KEY", "build_inputs_key", "checkpoint_identity"]
