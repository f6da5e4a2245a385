"""torch.export + AOTInductor, one package per bucket (or one dynamic-shape package for several buckets: the
exported program then carries symbolic sizes), compiled WITHOUT constants (AOTI.md §2.3).

The weights come back from the compile itself (`pickle_weights` → a `Weights` dict keyed by AOTI constant name,
which is not always the state_dict name: lifted tensors become `_tensor_constant0`), so the runtime binds
exactly what each package asks for."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .aoti_int_arrays import stable_int_array_ids
from .gpu_benchmark_lock import serialized_gpu_benchmarks
from .kernels import lower_for_cpu
from .kernels.kernel_analysis import memoized_kernel_analysis
from .kernels.pdl import METADATA_KEY as PDL_METADATA_KEY
from .kernels.pdl import programmatic_launches


class CompileError(RuntimeError):
    """torch.export or AOTInductor failed for one stage bucket."""


@dataclass
class CompiledBucket:
    package: Path
    weights: dict[str, torch.Tensor]  # constant name → tensor (CPU), in the order AOTI lists them
    metadata: dict[str, str]


def export_program(
    module: nn.Module, args: tuple, device: torch.device, dynamic_shapes: list | None = None
) -> torch.export.ExportedProgram:
    """`dynamic_shapes`: positional, as builder/dynamic_shapes.py makes them (None: every size static)."""
    with torch.no_grad(), memoized_kernel_analysis():
        ep = torch.export.export(module, args, dynamic_shapes=dynamic_shapes, strict=False)
    if device.type == "cpu":
        # Inductor's C++ backend cannot lower user Triton kernels: every ttsaot op (the mutating KV-cache writers
        # too) becomes its exact aten reference here (builder/kernels/decompositions.py).
        ep = lower_for_cpu(ep)
    return ep


def inductor_options(
    model_name: str, metadata: dict[str, str], device: torch.device, extra: dict | None = None
) -> dict:
    opts = {
        "aot_inductor.package": True,
        "aot_inductor.package_constants_in_so": False,
        "aot_inductor.package_constants_on_disk_format": "pickle_weights",
        "aot_inductor.model_name_for_generated_files": model_name,
        "aot_inductor.metadata": {k: str(v) for k, v in metadata.items()},
        # Never reuse a cached GRAPH compile: packages are weightless, yet small constants (e.g. a 4-element
        # bias) are folded into the generated code, and the FX-graph cache keys a frozen parameter on its
        # metadata only. (compile_bucket also gives every compile its own output folder, for the same reason.)
        # The kernel-level caches stay on (Triton binaries, generated kernel sources, autotune picks): they key
        # on the code itself, and without them every bucket and every rebuild recompiled and re-tuned the same
        # kernels from an empty cache, as `force_disable_caches` made them.
        "fx_graph_cache": False,
        "fx_graph_remote_cache": False,
    }
    if device.type == "cpu":
        # Thread count decided by the serving process, not frozen at the build host's core count.
        opts["cpp.dynamic_threads"] = True
    else:
        # A CUDA package's host code is its launch wrapper: no CPU vector math, so no ISA flags (-mavx512f, ...)
        # it would need only to run on hosts like the build host's. Saying so up front also skips Inductor's ISA
        # probe, which every compile worker ran once under one file lock, importing torch in a child process
        # (torch 2.11): 7 s each, one after another across the workers (probes/build_profile/).
        opts["cpp.vec_isa_ok"] = False
    opts.update(extra or {})
    return opts


def export_bucket(module: nn.Module, args: tuple, device: torch.device) -> torch.export.ExportedProgram:
    try:
        return export_program(module, args, device)
    except Exception as e:  # noqa: BLE001 - reported per bucket with the cause
        raise CompileError(f"torch.export failed: {type(e).__name__}: {str(e).splitlines()[0]}") from e


def compile_bucket(
    module: nn.Module,
    args: tuple,
    device: torch.device,
    package_path: Path,
    model_name: str,
    metadata: dict[str, str],
    extra_options: dict | None = None,
    exported: torch.export.ExportedProgram | None = None,
) -> CompiledBucket:
    """`exported`: the program of `module` on `args` when the caller has exported it already (the package cache
    keys on it)."""
    from torch._inductor import aot_compile
    from torch._inductor.package import package_aoti
    from torch.export.pt2_archive._package_weights import Weights

    ep = exported if exported is not None else export_bucket(module, args, device)
    # AOTI writes the wrapper sources to <output_path>/<model name>.cpp and keeps a file that already exists; its
    # default output_path is a hash of the graph's code, the same for the same graph compiled again with other
    # weights (another seed, a real checkpoint, a concurrent build): the first compile's wrapper, with its folded
    # constants, would be built into this package. Each compile gets its own folder, removed once packaged.
    with tempfile.TemporaryDirectory(prefix="ttsaot-aoti-") as work:
        options = inductor_options(model_name, metadata, device, extra_options)
        options["aot_inductor.output_path"] = work
        try:
            pdl = metadata.get(PDL_METADATA_KEY) == "1"
            with (
                torch.no_grad(),
                memoized_kernel_analysis(),
                stable_int_array_ids(),
                programmatic_launches(device, pdl),
                serialized_gpu_benchmarks(device),
            ):
                files = aot_compile(ep.module(), args, options=options)
        except Exception as e:  # noqa: BLE001
            raise CompileError(f"AOTInductor compile failed: {type(e).__name__}: {str(e).splitlines()[0]}") from e
        weights = [f for f in files if isinstance(f, Weights)]
        if len(weights) != 1:
            raise CompileError("AOTInductor returned no weights object (is package_constants_in_so honoured?)")
        package_path.parent.mkdir(parents=True, exist_ok=True)
        package_aoti(str(package_path), [f for f in files if isinstance(f, str)])
    tensors = {name: t.detach().to("cpu") for name, (t, _props) in weights[0].items()}
    return CompiledBucket(package=package_path, weights=tensors, metadata=metadata)


COMPILER_PROBE_TIMEOUT_S = 30  # `$CXX --version`


def compiler_info() -> dict[str, str]:
    """The C++ compiler AOTInductor will call (honours $CXX) and its version line."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        cxx = get_cpp_compiler()
    except Exception:  # noqa: BLE001
        cxx = os.environ.get("CXX", "g++")
    path = shutil.which(cxx) or cxx
    try:
        version = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=COMPILER_PROBE_TIMEOUT_S
        ).stdout
        version = version.splitlines()[0] if version else "unknown"
    except Exception:  # noqa: BLE001
        version = "unknown"
    return {"cxx": path, "cxx_version": version}
