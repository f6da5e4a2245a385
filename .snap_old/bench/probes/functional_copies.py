"""Probe (issue 14, GPU): which tensors AOTInductor copies around the kernel layer's ops in a codebook predictor.

The H100 profiles of the predictors on the kernel layer (bench/results/nvidia-h100/profiles/*code_predictor*ttsaot*,
*fast_ar*ttsaot*) show ~12 kernels per layer pass where the ops are 5 (skinny_linear ×4 + decode_attention): tiny
Inductor kernels named `…_to_copy_full…` sized like the step's positions, q/k-norm weights, workspace and RoPE
tables, i.e. copies that functionalization put in front of decode_attention. This builds a small Qwen-style
code_predictor (head_dim 128 so the kernel pass applies), exports and AOT-compiles it for CUDA with Inductor's trace
on, and reports: what torch's user-kernel access analysis says each kernel writes, the copies in the post-grad
graph, and the kernels the generated wrapper launches per name.

    python -m bench.probes.functional_copies --out DIR [--sampler-kernel]
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import re
import tempfile
from pathlib import Path

import torch


def _module(sampler_kernel: bool) -> tuple[torch.nn.Module, tuple]:
    from builder.families.qwen3_tts_12hz.code_predictor import CodePredictor
    from builder.families.qwen3_tts_12hz.config import CodePredictorConfig
    from builder.passes.fuse import fuse_projections
    from builder.predictor import use_predictor_kernels, use_sampler_kernel

    cfg = CodePredictorConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        vocab_size=64,
        num_code_groups=4,
        talker_hidden_size=256,
        talker_vocab_size=96,
    )
    torch.manual_seed(0)
    m = CodePredictor(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    fuse_projections(m)
    print(use_predictor_kernels(m))
    if sampler_kernel:
        print(use_sampler_kernel(m))
    B, S, V = 1, cfg.num_code_groups - 1, cfg.vocab_size
    dev = "cuda"
    args = (
        torch.randn(B, cfg.talker_hidden_size, device=dev),
        torch.randint(0, V, (B,), device=dev),
        torch.rand(B, S, V, device=dev),
        torch.full((B,), 0.9, device=dev),
        torch.full((B,), 20, dtype=torch.long, device=dev),
        torch.full((B,), 0.8, device=dev),
    )
    return m, args


def _analysis(out: dict) -> None:
    """torch's own access analysis of each kernel-layer launch of one layer, with real CUDA tensors."""
    import torch._higher_order_ops.triton_kernel_wrap as wrap

    from builder.kernels import decode_attention as _  # noqa: F401 - registers the ops
    from builder.kernels.decode_attention import launch_decode_attention
    from builder.kernels.skinny_linear import launch_skinny_linear

    name = next(n for n in ("identify_accessed_tensors", "identify_mutated_tensors") if hasattr(wrap, n))
    analyse = getattr(wrap, name)
    calls: list = []

    class Capture:
        def __init__(self, kernel) -> None:
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **meta):
                calls.append((self.kernel, args, meta))

            return launch

    dev, dt = "cuda", torch.bfloat16
    B, hq, hkv, hd, L, S = 1, 2, 1, 128, 2, 4
    qkv = torch.randn(B, (hq + 2 * hkv) * hd, device=dev, dtype=dt)
    pos = torch.zeros(B, dtype=torch.long, device=dev)
    kc = torch.zeros(L, B, hkv, S, hd, device=dev, dtype=dt)
    cos, sin = torch.randn(S, hd, device=dev), torch.randn(S, hd, device=dev)
    qn = torch.ones(hd, device=dev, dtype=dt)
    ws = torch.zeros(B * hkv, dtype=torch.int32, device=dev)
    launch_decode_attention(qkv, pos, kc, kc.clone(), 1, 0.1, cos, sin, False, qn, qn.clone(), 1e-6, ws, wrap=Capture)
    x = torch.randn(B, 256, device=dev, dtype=dt)
    launch_skinny_linear(
        x, torch.randn(512, 256, device=dev, dtype=dt), None, torch.ones(256, device=dev, dtype=dt), wrap=Capture
    )
    for kernel, args, meta in calls:
        fn = getattr(kernel, "fn", kernel)
        kwargs = dict(zip(fn.arg_names, args))
        kwargs.update(meta)
        try:
            result = analyse(kernel, kwargs, {})
        except TypeError:
            result = analyse(kernel, kwargs, {}, [])
        out.setdefault("analysis", {})[fn.__name__] = {"torch": torch.__version__, "fn": name, "result": str(result)}
        print(fn.__name__, "->", result)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sampler-kernel", action="store_true")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    warnings: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(f"{record.name}: {record.getMessage()}")

    logging.getLogger("torch._higher_order_ops").addHandler(Keep(level=logging.WARNING))
    out: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
    _analysis(out)

    from torch._inductor import aot_compile

    from builder.export import export_program
    from builder.kernels.kernel_analysis import memoized_kernel_analysis

    m, args = _module(a.sampler_kernel)
    ep = export_program(m, args, torch.device("cuda"))
    ops = collections.Counter(str(n.target) for n in ep.graph.nodes if n.op == "call_function")
    out["exported_ops"] = dict(ops.most_common())
    dbg = a.out / "trace"
    with tempfile.TemporaryDirectory() as work, memoized_kernel_analysis(), torch.no_grad():
        opts = {
            "aot_inductor.output_path": work,
            "trace.enabled": True,
            "trace.debug_dir": str(dbg),
            "fx_graph_cache": False,
        }
        aot_compile(ep.module(), args, options=opts)
        wrapper = a.out / "wrapper"
        wrapper.mkdir(exist_ok=True)
        src = ""
        for p in Path(work).rglob("*.cpp"):
            src += p.read_text(errors="replace")
            (wrapper / p.name).write_text(p.read_text(errors="replace"))
    # one launch per kernel name in the wrapper's run_impl (AOTI: `kernels_.<name>` / `call_<name>(`)
    launches = collections.Counter(re.findall(r"(?:kernels_\.|call_)(\w+?)\b", src))
    out["wrapper_calls"] = dict(launches.most_common())
    out["warnings"] = warnings
    for f in dbg.rglob("fx_graph_transformed.py"):
        text = f.read_text()
        out.setdefault("post_grad_copies", []).extend(
            line.strip()[:240] for line in text.splitlines() if re.search(r"clone|copy_|_to_copy|full", line)
        )
    (a.out / "functional_copies.json").write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "post_grad_copies"}, indent=1)[:6000])
    print("\n".join(out.get("post_grad_copies", [])[:80]))


if __name__ == "__main__":
    main()
