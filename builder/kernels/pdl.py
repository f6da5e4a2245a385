"""Programmatic dependent launch (PDL, sm_90+) for the decode kernels inside AOTInductor packages.

Why: a decode step is a chain of short, bandwidth-bound launches (skinny_linear ×4 + decode_attention per layer).
Profiles put their gap to the weight-read floor in each launch's ramp and tail (bench/results/nvidia-h100/probes/
decode_layer_run/README.md: a persistent one-launch layer was slower; L2 prefetch did not help; decode_layer_barrier/:
a second one, with grid barriers, at best equal to these launches with PDL and slower in the stage). With PDL the next
kernel's programs are launched while the previous kernel drains, issue their first WEIGHT loads (weights are never
written by the step), and only then wait for the previous kernel's results (`griddepcontrol.wait`).

Two halves, both needed:
- the kernels (pdl_triton.grid_dependency_wait, compiled in when `PDL` is true = an sm_90+ GPU) signal their
  dependents early and wait before touching anything a previous kernel writes: every activation pointer is offset
  by the wait's (zero) result, so no load of one can be scheduled before the wait;
- the launch: AOTInductor launches every kernel with a plain cuLaunchKernel. While a CUDA package compiles,
  `programmatic_launches()` rewrites the generated wrapper's launch helper so that the kernels named in
  `PDL_KERNELS` (and only those: a kernel launched with the attribute MUST wait) get the programmatic
  stream-serialization attribute on devices of compute capability ≥ 9. The generated C++ is compiled into the
  package: the runtime needs nothing (CUDA graph capture turns the attribute into programmatic graph edges).
A kernel that waits but is launched plainly is correct (the wait returns at once), so a torch whose wrapper text
does not match leaves the package correct, only without the overlap; `programmatic_launches` reports whether it
applied. Set TTSAOT_PDL=0 to build without the launch attribute (the A/B of `python -m bench decode-stages`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

# Triton entry points (cubin function names) compiled with `grid_dependency_wait` on sm_90+.
PDL_KERNELS = (
    "skinny_linear_kernel",
    "split_k_epilogue_kernel",
    "norm_out_epilogue_kernel",
    "decode_attention_kernel",
    "qkv_attention_kernel",
    "sequence_attention_kernel",
    "sequence_attention_o_kernel",
)
ENV_SWITCH = "TTSAOT_PDL"
METADATA_KEY = "ttsaot_pdl"  # "1" / "0" in each package's metadata: whether its launches carry the attribute
# Packages of buckets up to this many rows get the attribute: the GEMV form (skinny_linear.GEMV_MAX_M), whose
# programs load their first W tile before the wait. H100, VoxCPM2 steps at ctx 512 (bench/results/nvidia-h100/
# decode_stages_*_pdl*.json): B=1 base_lm_step 0.413 vs 0.459 ms, residual_lm_step 0.395 vs 0.437 ms; B=16
# base_lm_step (tile form) 0.596 vs 0.570 ms, slower with an early or a late trigger.
MAX_ROWS = 2
# TTSAOT_PDL_MAX_ROWS=N at build time: packages of buckets up to N rows get the attribute instead (an A/B switch, a
# package-key switch in package_cache). Kept for the streamed tile form (TTSAOT_SKINNY_STREAM=1: several programs per
# SM, the first W tile loaded before the wait, an early trigger), where dependents could start early as they cannot
# behind the cp.async form's one program per SM. Timed, it lost: H100 B=16 residual_lm_step 746.6 vs 512.2 µs,
# base_lm_step 2,448.0 vs 1,780.4 (bench/results/nvidia-h100/probes/attention_plan_step/).
MAX_ROWS_ENV = "TTSAOT_PDL_MAX_ROWS"

# The statement of AOTInductor's launchKernel helper (torch/_inductor/codegen/cuda/device_op_overrides.py) that is
# replaced, and what replaces it. Same arguments, same error handling.
_PLAIN_LAUNCH = "CUDA_DRIVER_CHECK(cuLaunchKernel("
_PDL_LAUNCH = "CUDA_DRIVER_CHECK(ttsaotLaunchKernel("
_MARKER = "static inline void launchKernel("


def _helper_source(names: tuple[str, ...]) -> str:
    listed = ", ".join(f'"{n}"' for n in names)
    return f"""
            #include <cstring>
            #include <mutex>
            #include <unordered_map>
            // ttsaot: programmatic dependent launch for the kernels that wait on their predecessor
            // (builder/kernels/pdl.py). Decided once per function: sm_90+ and a name in the list.
            static inline bool ttsaotPdlKernel(CUfunction func) {{
                static std::mutex lock;
                static std::unordered_map<CUfunction, bool> known;
                std::lock_guard<std::mutex> guard(lock);
                auto hit = known.find(func);
                if (hit != known.end()) return hit->second;
                static const char* const kNames[] = {{{listed}}};
                bool pdl = false;
                CUdevice dev;
                int major = 0;
                const char* name = nullptr;
                if (cuCtxGetDevice(&dev) == CUDA_SUCCESS &&
                    cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) == CUDA_SUCCESS &&
                    major >= 9 && cuFuncGetName(&name, func) == CUDA_SUCCESS && name != nullptr) {{
                    for (const char* n : kNames) pdl = pdl || std::strcmp(name, n) == 0;
                }}
                known.emplace(func, pdl);
                return pdl;
            }}

            static inline CUresult ttsaotLaunchKernel(
                    CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                    unsigned int by, unsigned int bz, unsigned int smem, CUstream stream, void** args,
                    void** extra) {{
                if (!ttsaotPdlKernel(f)) {{
                    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, smem, stream, args, extra);
                }}
                CUlaunchAttribute attr;
                std::memset(&attr, 0, sizeof(attr));
                attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
                attr.value.programmaticStreamSerializationAllowed = 1;
                CUlaunchConfig cfg;
                std::memset(&cfg, 0, sizeof(cfg));
                cfg.gridDimX = gx; cfg.gridDimY = gy; cfg.gridDimZ = gz;
                cfg.blockDimX = bx; cfg.blockDimY = by; cfg.blockDimZ = bz;
                cfg.sharedMemBytes = smem;
                cfg.hStream = stream;
                cfg.attrs = &attr;
                cfg.numAttrs = 1;
                return cuLaunchKernelEx(&cfg, f, args, extra);
            }}

"""


def rewrite_launch_helper(driver_source: str, names: tuple[str, ...] = PDL_KERNELS) -> str | None:
    """AOTInductor's kernel-driver C++ with launchKernel routed through ttsaotLaunchKernel, or None when the text
    is not the one this was written against (then nothing is changed)."""
    if driver_source.count(_PLAIN_LAUNCH) != 1 or driver_source.count(_MARKER) != 1:
        return None
    at = driver_source.index(_MARKER)
    return driver_source[:at] + _helper_source(names) + driver_source[at:].replace(_PLAIN_LAUNCH, _PDL_LAUNCH)


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


def kernels_wait(device: torch.device) -> bool:
    """The kernels' `PDL` constexpr: griddepcontrol exists on sm_90+ only."""
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] >= 9


def max_rows() -> int:
    """The most rows a package may have and launch with the attribute: MAX_ROWS, or TTSAOT_PDL_MAX_ROWS."""
    value = os.environ.get(MAX_ROWS_ENV, "").strip()
    if not value:
        return MAX_ROWS
    if not value.isdigit():
        raise ValueError(f"{MAX_ROWS_ENV}={value!r}: expected a whole number of rows")
    return int(value)


def wanted_for(sizes: dict[str, int]) -> bool:
    """Whether a package of these bucket sizes should launch with the attribute (max_rows(); no batch axis = 1
    row)."""
    return sizes.get("batch", 1) <= max_rows()


@contextlib.contextmanager
def programmatic_launches(device: torch.device, wanted: bool = True) -> Iterator[bool]:
    """While an AOTInductor compile for `device` runs: the generated launch helper gives `PDL_KERNELS` the
    programmatic-launch attribute. Yields whether it applied (wanted, CUDA, TTSAOT_PDL not 0, wrapper text
    recognised)."""
    if not wanted or device.type != "cuda" or not enabled():
        yield False
        return
    try:
        from torch._inductor.codegen.cuda.device_op_overrides import CUDADeviceOpOverrides
    except ImportError:
        yield False
        return
    original = CUDADeviceOpOverrides.kernel_driver
    if rewrite_launch_helper(original(CUDADeviceOpOverrides())) is None:
        yield False
        return

    def kernel_driver(self) -> str:
        source = original(self)
        return rewrite_launch_helper(source) or source

    CUDADeviceOpOverrides.kernel_driver = kernel_driver
    try:
        yield True
    finally:
        CUDADeviceOpOverrides.kernel_driver = original
