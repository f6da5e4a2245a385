"""The runtime must load in a serving process that has nothing but torch (+ safetensors, numpy)."""

import ast
import subprocess
import sys
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[1] / "runtime"


def test_runtime_imports_neither_builder_nor_triton():
    code = (
        "import sys, ttsaot.runtime, ttsaot.runtime.verify, ttsaot.runtime.streaming; "
        "bad = [m for m in sys.modules if m.startswith(('ttsaot.builder', 'triton', 'click', 'rich'))]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


FORBIDDEN = ("ttsaot.builder", "triton", "click", "rich")


def _absolute(py: Path, node: ast.ImportFrom) -> str:
    """The module an ImportFrom names, relative imports resolved against the file's package."""
    if node.level == 0:
        return node.module or ""
    package = ["ttsaot", "runtime", *py.relative_to(RUNTIME).parent.parts]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def test_runtime_sources_have_no_builder_imports():
    for py in RUNTIME.rglob("*.py"):
        tree = ast.parse(py.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                mod = _absolute(py, node)
                assert mod.startswith("ttsaot.runtime") or not mod.startswith(("ttsaot.", "builder")), (py, mod)
                assert not mod.startswith(FORBIDDEN), (py, mod)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    assert not a.name.startswith((*FORBIDDEN, "builder")), (py, a.name)
