import json, os, statistics, subprocess, sys, time, copy
import torch
os.environ.setdefault("CXX", "/usr/bin/g++")
OUT = os.environ.get("OUT", "/tmp/out"); os.makedirs(OUT, exist_ok=True)
res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
def save(): json.dump(res, open(f"{OUT}/issue2_code2wav.json", "w"), indent=1)
from ttsaot.builder.buckets import StreamingConfig
from ttsaot.builder.build import build_family
from ttsaot.builder.families import qwen3_tts as q
from ttsaot.builder.kernels.snake_beta import launch_snake_beta_kernel, snake_beta_reference
from ttsaot.builder.passes import cast_to_compute_dtype
from ttsaot.runtime import load
def bench(fn, n=50, warm=10):
    for _ in range(warm): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); fn(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
    return statistics.median(ts)
x = torch.randn(8, 1024, 24000, device="cuda")
for dt in (torch.float32, torch.bfloat16):
    xx = x.to(dt); a = torch.rand(1024, device="cuda") + .5; ib = torch.rand(1024, device="cuda")
    nbytes = 2 * xx.numel() * xx.element_size(); y = torch.empty_like(xx)
    t_copy = bench(lambda: y.copy_(xx)); t_k = bench(lambda: launch_snake_beta_kernel(xx, a, ib))
    t_e = bench(lambda: snake_beta_reference(xx, a, ib), n=20)
    res[f"snake_{str(dt)[6:]}"] = {"copy_GBps": round(nbytes / t_copy / 1e6), "kernel_GBps": round(nbytes / t_k / 1e6),
                                   "ratio_to_copy": round(t_copy / t_k, 3), "kernel_ms": t_k, "eager_formula_ms": t_e}
del x, xx, y; save()
opts = q.Qwen3TTSOptions(preset="full", dtype=torch.bfloat16, batch_buckets=(1, 4), frame_buckets=(25, 50),
                         streaming=StreamingConfig(25, 25, 0, 0))
t0 = time.time(); build_family(q.FAMILY, [q.code2wav_stage(opts)], "/tmp/art", "cuda"); res["build_s"] = round(time.time() - t0, 1)
print("build", res["build_s"], flush=True); save()
code = ("import time;t0=time.time();import torch;from ttsaot.runtime import load;"
        "b=load('/tmp/art/qwen3-tts-12hz');c=torch.randint(0,2048,(1,16,25),device='cuda');"
        "w=b['code2wav'](c);torch.cuda.synchronize();t4=time.time();"
        "import json;print(json.dumps({'process_to_first_chunk_s':t4-t0,'bundle':b.load_stats,'stage':b['code2wav'].load_stats}))")
t0 = time.time(); p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
res["cold_start_ttsaot"] = {"wall_s": round(time.time() - t0, 2), **(json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {"err": p.stderr[-800:]})}
print(res["cold_start_ttsaot"], flush=True); save()
code_tc = ("import time,torch;t0=time.time();from ttsaot.builder.families import qwen3_tts as q;"
           "from ttsaot.builder.passes import cast_to_compute_dtype;"
           "sp=q.code2wav_stage(q.Qwen3TTSOptions(preset='full'));m=sp.make_module();"
           "m=cast_to_compute_dtype(m,torch.bfloat16).cuda().eval();"
           "f=torch.compile(m,dynamic=False);c=torch.randint(0,2048,(1,16,25),device='cuda');"
           "\nwith torch.no_grad():\n  f(c)\ntorch.cuda.synchronize();print(time.time()-t0)")
env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": "/tmp/tc_cache_probe3"}
for label in ("cold_start_torch_compile_empty_cache_s", "cold_start_torch_compile_warm_cache_s"):
    t0 = time.time(); p = subprocess.run([sys.executable, "-c", code_tc], capture_output=True, text=True, env=env)
    res[label] = round(time.time() - t0, 2) if p.returncode == 0 else p.stderr[-500:]
print(res, flush=True); save()
spec = q.code2wav_stage(opts)
faithful = cast_to_compute_dtype(spec.make_module(), torch.bfloat16).cuda().eval()
rew = spec.make_module()
for p_ in spec.passes: p_(rew)
rew = cast_to_compute_dtype(rew, torch.bfloat16).cuda().eval()
ref32 = spec.make_module().cuda().eval()
stage = load("/tmp/art/qwen3-tts-12hz")["code2wav"]
stage_ng = load("/tmp/art/qwen3-tts-12hz", cuda_graphs=False)["code2wav"]
def graphed(fn, c):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn(c)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g): out = fn(c)
    return g, out
tc_f = torch.compile(faithful, dynamic=False)
tc_r = torch.compile(rew, dynamic=False)
for B in (1, 4):
    c = torch.randint(0, 2048, (B, 16, 50), device="cuda")
    r = {}
    with torch.no_grad():
        ref = ref32(c)
        r["eager_faithful_ms"] = bench(lambda: faithful(c), n=20, warm=3)
        r["eager_rewritten_ms"] = bench(lambda: rew(c), n=20, warm=3)
        g1, o1 = graphed(tc_f, c); r["torch_compile_faithful_graph_ms"] = bench(g1.replay)
        g2, o2 = graphed(tc_r, c); r["torch_compile_rewritten_graph_ms"] = bench(g2.replay)
        r["torch_compile_faithful_nograph_ms"] = bench(lambda: tc_f(c), n=20)
    r["ttsaot_nograph_ms"] = bench(lambda: stage_ng(c))
    r["ttsaot_graph_ms"] = bench(lambda: stage(c))
    stage.validate_inputs = False
    r["ttsaot_graph_novalidate_ms"] = bench(lambda: stage(c)); stage.validate_inputs = True
    r["speedup_vs_tc_faithful_graph"] = r["torch_compile_faithful_graph_ms"] / r["ttsaot_graph_ms"]
    r["rel_err_vs_fp32_ttsaot"] = ((stage(c) - ref).norm() / ref.norm()).item()
    r["rel_err_vs_fp32_tc_faithful"] = ((o1.float() - ref).norm() / ref.norm()).item()
    res[f"B{B}_F50"] = r; print(B, r, flush=True); save()
res["mem_allocated_MiB"] = torch.cuda.memory_allocated() / 2**20
save(); print(json.dumps(res, indent=1))
