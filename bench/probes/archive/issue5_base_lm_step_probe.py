"""Where does base_lm_step (B=1, ctx 512, bf16, full) spend its 1.9 ms? Kernel table + GEMV-only lower bound +
a coordinate-descent-tuned torch.compile for comparison."""
import copy, json, os, statistics, sys, time, traceback
import torch
OUT = os.environ.get("OUT", "/tmp/out"); os.makedirs(OUT, exist_ok=True)
res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
def save(): json.dump(res, open(f"{OUT}/probe_lm.json", "w"), indent=1, default=str)
torch.set_grad_enabled(False)
dev = torch.device("cuda", 0)
def bench(fn, n=50, warm=10):
    for _ in range(warm): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); fn(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
    return statistics.median(ts)
def graph_of(fn):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g): fn()
    return g
from bench.specs import make_spec
from bench.stage import make_bucket_inputs, build_or_reuse
from pathlib import Path
stage_name = sys.argv[1] if len(sys.argv) > 1 else "base_lm_step"
spec, desc = make_spec("voxcpm2", stage_name, "full", axes={"batch": (1,)})
t0 = time.time()
path, info = build_or_reuse(spec, desc, dev, Path("/tmp/probe_cache"), verify=False)
res["build"] = {**info, "s": round(time.time() - t0, 1)}; print(res["build"], flush=True); save()
xs = make_bucket_inputs(spec, {"batch": 1}, 0, dev)
from ttsaot.runtime import load
st = load(path, device=dev, stages=[stage_name], cuda_graphs=False)[stage_name]
st(*xs); torch.cuda.synchronize()
res["nograph_ms"] = bench(lambda: st(*xs))
try:
    g = graph_of(lambda: st(*xs)); res["graph_of_plain_call_ms"] = bench(g.replay)
except Exception as e:
    res["graph_of_plain_call_ms"] = repr(e)[:300]
print(res, flush=True); save()
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(5): st(*xs)
    torch.cuda.synchronize()
ka = prof.key_averages()
rows = sorted(((e.key, e.count / 5, e.device_time_total / 5 / 1000) for e in ka), key=lambda r: -r[2])
res["kernels_per_call"] = sum(r[1] for r in rows)
res["kernel_ms_per_call"] = sum(r[2] for r in rows)
res["top_kernels"] = [(k[:110], c, round(ms, 4)) for k, c, ms in rows[:40]]
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30), flush=True); save()
# GEMV-only bound: every Linear weight of the stage, M = 1, in one graph
from ttsaot.builder.passes import cast_to_compute_dtype
mod = spec.make_module().eval()
for p in spec.passes: p(mod)
mod = cast_to_compute_dtype(mod, spec.dtype).to(dev).eval()
lins = [m for m in mod.modules() if isinstance(m, torch.nn.Linear)]
xin = {m.in_features: torch.randn(1, m.in_features, device=dev, dtype=spec.dtype) for m in lins}
def all_linear():
    for m in lins: torch.nn.functional.linear(xin[m.in_features], m.weight)
gl = graph_of(all_linear)
wb = sum(m.weight.numel() * m.weight.element_size() for m in lins)
src = torch.empty(wb // 2, dtype=torch.bfloat16, device=dev); dst = torch.empty_like(src)
res["linear_only_graph_ms"] = bench(gl.replay); res["linear_weight_bytes"] = wb; res["n_linear"] = len(lins)
res["copy_ms_same_bytes"] = bench(lambda: dst.copy_(src)) / 2   # copy reads+writes: reading wb bytes ≈ half
print({k: res[k] for k in ("linear_only_graph_ms", "copy_ms_same_bytes", "n_linear")}, flush=True); save()
del src, dst
# eager module in a graph, and torch.compile variants (time boxed by the caller's timeout)
ge = graph_of(lambda: mod(*xs)); res["eager_graph_ms"] = bench(ge.replay); save()
import torch._inductor.config as ic
for label, cfg in (("compile_default", {}), ("compile_cdt", {"coordinate_descent_tuning": True}),
                   ("compile_cdt_maxat", {"coordinate_descent_tuning": True, "max_autotune_gemm": True,
                                          "max_autotune_gemm_backends": "TRITON,ATEN"})):
    try:
        torch._dynamo.reset(); t0 = time.time()
        with ic.patch(cfg):
            c = torch.compile(mod, dynamic=False)
            c(*xs); torch.cuda.synchronize()
            gc_ = graph_of(lambda: c(*xs))
        res[label] = {"compile_s": round(time.time() - t0, 1), "graph_ms": bench(gc_.replay)}
    except Exception as e:
        res[label] = {"error": repr(e)[:400]}; traceback.print_exc()
    print(label, res[label], flush=True); save()
