"""The tiny Fish dac_decoder exported with batch over [1, BATCH_MAX] and frames 8..32, AOT-compiled through the
builder's compile_bucket, run at batch 1 / 2: in the exporting process, and after torch.export.save / load (how a
compile worker gets the program). Usage: python probe.py {inprocess|saved} BATCH_MAX (the batch range asked is
[1, BATCH_MAX] exactly: dynamic_shapes.axis_dim's widening is bypassed by a plain torch.export.Dim)."""

import sys
import tempfile
from pathlib import Path

import torch

from ttsaot.builder.build import prepare_modules
from ttsaot.builder.export import compile_bucket, export_program
from ttsaot.builder.families.fish_s2_pro import FAMILY as FISH
from ttsaot.builder.kernels.decompositions import lower_for_cpu

mode, batch_max = sys.argv[1], int(sys.argv[2])
spec = FISH.specs(FISH.options(frame_buckets=(8, 16, 25, 32), batch_buckets=(1, 2), device="cpu"), ["dac_decoder"])[0]
_, module, _ = prepare_modules(spec, "inductor")
ex = spec.make_inputs({"batch": 2, "frames": 32}, torch.Generator().manual_seed(0))
args = tuple(ex[n] for n in spec.input_names)
shapes = [{0: torch.export.Dim("batch", min=1, max=batch_max), 2: torch.export.Dim("frames", min=8, max=32)}]
ep = lower_for_cpu(export_program(module, args, torch.device("cpu"), dynamic_shapes=shapes))
print("exported:", ep.range_constraints)
if mode == "saved":
    path = tempfile.mktemp(suffix=".pt2")
    torch.export.save(ep, path)
    ep = torch.export.load(path)
package = Path(tempfile.mkdtemp()) / "m.pt2"
cb = compile_bucket(None, args, torch.device("cpu"), package, model_name="m", metadata={}, exported=ep)
loader = torch._C._aoti.AOTIModelPackageLoader(str(package), "model", False, 1, -1)
loader.load_constants({k: cb.weights[k] for k in loader.get_constant_fqns()}, False, True, True)
for b, f in ((1, 8), (2, 8), (1, 32)):
    x = torch.randint(0, 4, (b,) + tuple(args[0].shape[1:-1]) + (f,))
    print(f"{mode} batch<= {batch_max}: input batch {b} frames {f} -> output", [tuple(t.shape) for t in loader.run([x])])
