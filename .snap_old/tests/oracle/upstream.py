"""Import single upstream modules without executing their packages' __init__ (which pull audio/hub stacks).

One implementation, shared with the benchmark harness (bench/upstream.py); here a missing package skips the
test and a broken one fails it."""

from __future__ import annotations

import pytest

from bench.common import Skipped
from bench.upstream import import_module_alone


def import_upstream(dotted: str):
    try:
        return import_module_alone(dotted)
    except Skipped as e:
        if "is not installed" in str(e):
            pytest.skip(str(e))
        raise AssertionError(str(e)) from e  # installed but broken: an oracle must not silently skip
