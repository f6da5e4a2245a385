"""Probe (tests/test_voxcpm2_audio_kernels.py): how far a VoxCPM2 audio stage run in bf16 EAGER lands from its fp32
eager output, the faithful module and the kernel-layer one (its ops' aten references, what a CPU build runs) alike,
over weight seeds and batches, tiny preset on the host CPU. The manifest's tolerance is what the compiled packages
meet (their golden cases); eager bf16 rounds every intermediate.

    python -m bench.probes.bf16_eager_spread [--stage locdit] [--seeds 4]
"""

from __future__ import annotations

import argparse
import copy

import torch


def main() -> None:
    from ttsaot.builder.families import get_family
    from ttsaot.builder.passes import cast_to_compute_dtype
    from ttsaot.runtime.metrics import rel_error

    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", default="locdit")
    ap.add_argument("--seeds", type=int, default=4)
    a = ap.parse_args()
    fam = get_family("voxcpm2")
    print(f"voxcpm2/{a.stage} (tiny), torch {torch.__version__}: rel err vs fp32 eager, (faithful bf16, kernel bf16)")
    for seed in range(a.seeds):
        (spec,) = fam.specs(fam.options(preset="tiny", seed=seed, kernels="ttsaot"), [a.stage])
        orig = spec.make_module().eval()
        kern = copy.deepcopy(orig)
        for p in spec.passes + spec.kernel_passes:
            p(kern)
        plain16 = cast_to_compute_dtype(copy.deepcopy(orig), torch.bfloat16)
        kern16 = cast_to_compute_dtype(kern, torch.bfloat16)
        errs = []
        for B, s in ((3, 2), (5, 3), (4, 7), (2, 11)):
            x = spec.make_inputs({"batch": B}, torch.Generator().manual_seed(s))
            xs = [x[n] for n in spec.input_names]
            with torch.no_grad():
                ref = orig(*xs)
                errs.append(tuple(round(rel_error(m(*xs), ref), 3) for m in (plain16, kern16)))
        print(f"  weight seed {seed}: {errs}  tolerance {spec.tolerance}", flush=True)


if __name__ == "__main__":
    main()
