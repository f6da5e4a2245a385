"""Import single upstream modules without executing their packages' __init__ (which pull audio/hub stacks).

Parent packages are stubbed with the real __path__, so relative imports inside the module still resolve."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

import pytest


def import_upstream(dotted: str):
    top = dotted.split(".")[0]
    if top in sys.modules and getattr(sys.modules[top], "__path__", None):
        root = Path(list(sys.modules[top].__path__)[0])
    else:
        spec = importlib.util.find_spec(top)
        if spec is None or not spec.submodule_search_locations:
            pytest.skip(f"upstream package {top!r} not installed (make setup-dev installs it)")
        root = Path(list(spec.submodule_search_locations)[0])
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        name = ".".join(parts[:i])
        if name in sys.modules:
            continue
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(root.joinpath(*parts[1:i]))]
        sys.modules[name] = pkg
    return importlib.import_module(dotted)
