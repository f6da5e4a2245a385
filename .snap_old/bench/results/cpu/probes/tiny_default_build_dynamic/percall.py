"""Per-call time of one bucket through the runtime: the dynamic package of the default build vs a static package
built for that bucket alone (median of 20 calls after 3 warm-ups, 2 threads; the two interleaved, twice).

    python3 percall.py DYNAMIC_ARTIFACT STATIC_ARTIFACT code2wav 2 25 16 64   # stage, batch, frames, codebooks, vocab
"""

import json
import statistics
import sys
import time

import torch

from ttsaot.runtime import load


def median_ms(stage, x, reps=20):
    for _ in range(3):
        stage(x)
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        stage(x)
        t.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(t), 3)


dyn_dir, static_dir, stage_name, B, F, C, V = sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:8])
torch.set_num_threads(2)
x = torch.randint(0, V, (B, C, F), generator=torch.Generator().manual_seed(0))
dyn = load(dyn_dir, cpu_threads=2)[stage_name]
st = load(static_dir, cpu_threads=2)[stage_name]
assert dyn.pick_bucket({"batch": B, "frames": F}).key == st.pick_bucket({"batch": B, "frames": F}).key
res = {"bucket": f"b{B}_f{F}", "dynamic_package_ms": [], "static_package_ms": []}
for _ in range(2):  # interleaved, twice
    res["dynamic_package_ms"].append(median_ms(dyn, x))
    res["static_package_ms"].append(median_ms(st, x))
res["max_abs_diff"] = float((dyn(x).float() - st(x).float()).abs().max())
print(json.dumps(res))
