"""Why did max_autotune artifacts segfault? Build the tiny + full residual_lm_step (B=1) on CUDA with and without
max_autotune, verify each in a subprocess (faulthandler on), print where it dies."""
import json, os, subprocess, sys, time, traceback
from pathlib import Path
os.environ.setdefault("CXX", "/usr/bin/g++")
OUT = Path(os.environ.get("OUT", "/tmp/out")); OUT.mkdir(parents=True, exist_ok=True)
import torch
from bench.specs import make_spec
from ttsaot.builder.build import build_family
res = {}
preset = sys.argv[1] if len(sys.argv) > 1 else "tiny"
for label, extra in (("autotune", None), ("no_autotune", {"max_autotune": False})):
    spec, desc = make_spec("voxcpm2", "residual_lm_step", preset, axes={"batch": (1,)})
    spec.cuda_inductor_options = {"max_autotune": True}
    root = Path(f"/tmp/diag_{preset}_{label}")
    t0 = time.time()
    try:
        r = build_family("voxcpm2", [spec], root, device="cuda", preset=preset, verify_in_subprocess=False,
                         extra_inductor_options=extra)
        res[label] = {"build_s": round(time.time() - t0, 1)}
    except Exception as e:
        res[label] = {"build_error": repr(e)[:500]}; continue
    code = ("import faulthandler,sys,torch;faulthandler.enable();from ttsaot.runtime import load;"
            f"print('loading',flush=True);a=load('{root}/voxcpm2',device='cuda');print('loaded',flush=True);"
            f"import ttsaot.runtime.verify as v;v.main(['{root}/voxcpm2','--device','cuda'])")
    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True, timeout=300)
    res[label].update(rc=p.returncode, stdout=p.stdout[-1500:], stderr=p.stderr[-3000:])
    print(label, json.dumps(res[label], indent=1)[:4000], flush=True)
    json.dump(res, open(OUT / f"diag_{preset}.json", "w"), indent=1)
