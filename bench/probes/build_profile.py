"""Probe (issue 17): where a build's time goes, from cProfile files — the CLI process's own (`python -m cProfile -o
parent.prof -m ttsaot.builder.cli build ...`) and each compile worker's (`TTSAOT_BUILD_PROFILE_DIR=DIR`,
builder/parallel_compile.py).

    python -m bench.probes.build_profile parent.prof DIR/*.prof > summary.txt

For every profile: its total, the inclusive seconds of the build's phases (a phase is every call of the functions
named below; phases nest — the autotuning runs inside Inductor's compile — so they do not add up to the total), and
the heaviest functions by inclusive time."""

from __future__ import annotations

import argparse
import pstats
from pathlib import Path

# phase → (file suffix, function name) pairs; the inclusive time of the outermost matching calls is reported
PHASES: dict[str, tuple[tuple[str, str], ...]] = {
    "import (module level)": (("<frozen importlib._bootstrap>", "_find_and_load"),),
    "construct modules (checkpoint.construct)": (("builder/checkpoint.py", "construct"),),
    "random init (seeded)": tuple(
        (f"builder/families/{fam}/checkpoint.py", f"init_random_{what}")
        for fam, what in (
            ("fish_s2_pro", "dac"),
            ("fish_s2_pro", "fast_ar"),
            ("qwen3_tts_12hz", "code2wav"),
            ("qwen3_tts_12hz", "code_predictor"),
            ("voxcpm2", "lm"),
            ("voxcpm2", "audio"),
            ("voxcpm2", "vae"),
        )
    ),
    "load checkpoint tensors (load_strict)": (("builder/checkpoint.py", "load_strict"),),
    "copy the module (deepcopy)": (("copy.py", "deepcopy"),),
    "passes + parity (prepare_modules)": (("builder/build.py", "prepare_modules"),),
    "golden cases (eager forwards)": (("builder/build.py", "_golden_cases"),),
    "torch.export": (("torch/export/_trace.py", "_export"),),
    "package cache key/lookup": (("builder/package_cache.py", "pre_export_key"), ("builder/package_cache.py", "fetch")),
    "compile, in this process or waiting on workers": (("builder/build.py", "_compile_all"),),
    "waiting on the compile pool (a multi-stage build)": (("builder/build.py", "_wait"),),
    "hand compiles to the pool (save programs)": (("builder/build.py", "_submit_compiles"),),
    "load a saved program (worker)": (("torch/export/__init__.py", "load"),),
    "AOTInductor compile": (("torch/_inductor/__init__.py", "aot_compile"),),
    "Inductor lowering + codegen": (("torch/_inductor/graph.py", "codegen_with_cpp_wrapper"),),
    "Triton compile (waiting on async compiles)": (("torch/_inductor/async_compile.py", "wait"),),
    "autotuning (benchmark_all_configs)": (("torch/_inductor/runtime/triton_heuristics.py", "benchmark_all_configs"),),
    "C++ build of the wrapper/kernels": (("torch/_inductor/cpp_builder.py", "build"),),
    "write the package (package_aoti)": (("torch/_inductor/package/package.py", "package_aoti"),),
    "stage files (weights, golden, hashes)": (("builder/build.py", "finish"),),
    "safetensors save": (("safetensors/torch.py", "save_file"),),
    "subprocess load check (waiting)": (("builder/build.py", "subprocess_verify"),),
}


def phase_seconds(stats: pstats.Stats) -> dict[str, float]:
    """Inclusive seconds per phase: the largest cumulative time among the phase's matching functions (recursive
    calls are counted once by cProfile's cumulative figure; two names of one phase are summed)."""
    out: dict[str, float] = {}
    table = stats.stats  # type: ignore[attr-defined]
    for phase, names in PHASES.items():
        total = 0.0
        for suffix, func in names:
            best = 0.0
            for (filename, _line, fname), (_cc, _nc, _tt, ct, _callers) in table.items():
                if fname == func and filename.endswith(suffix):
                    best = max(best, ct)
            total += best
        out[phase] = total
    return out


def summarize(path: Path, top: int) -> str:
    stats = pstats.Stats(str(path))
    lines = [f"== {path.name}: {stats.total_tt:.1f} s profiled"]  # type: ignore[attr-defined]
    for phase, s in phase_seconds(stats).items():
        if s >= 0.05:
            lines.append(f"  {s:8.1f} s  {phase}")
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][3])  # type: ignore[attr-defined]
    lines.append(f"  top {top} by inclusive time:")
    shown = 0
    for (filename, line, fname), (_cc, nc, _tt, ct, _callers) in rows:
        if fname.startswith("<") or "importlib" in filename or filename == "~":
            continue
        short = "/".join(Path(filename).parts[-3:])
        lines.append(f"  {ct:8.1f} s  {nc:7d} calls  {short}:{line}({fname})")
        shown += 1
        if shown >= top:
            break
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("profiles", nargs="+", type=Path)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    for p in a.profiles:
        print(summarize(p, a.top))
        print()


if __name__ == "__main__":
    main()
