"""`ttsaot::sample_tokens` before and after a kernel change, one process: `python -m bench.probes.sampler_radix4
OUT.json [BASE]` times the kernel of git revision (or file) BASE (default 01d382b: the radix select one bit per
round, both thresholds always searched, the greedy draw after them) and the working tree's (two bits per round,
searches skipped where the row does not ask for them, greedy rows straight to the argmax), each way to the kept set
(the sort, the radix select), at the predictors' vocabularies, one and eight rows, under sampling mixes: Qwen's
code-predictor defaults (temperature 0.9, top-k 50, top-p off), Fish's (0.8, top-k 30, top-p 0.9), top-p alone
(0.8), greedy, and the random rows of `bench kernels`' sampler section. Each case: a CUDA graph of 16 draws
(`bench/kernels.py graph_ms`), median µs per draw, and the tokens of every draw compared with the aten reference;
above V = 2048, the working tree's radix select also at half its warps."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

MIXES = {
    "qwen": (0.9, 50, 1.0),
    "fish": (0.8, 30, 0.9),
    "top_p": (0.8, 0, 0.8),
    "greedy": (0.0, 0, 1.0),
    "random": None,
}


def _module_at(rev: str):
    """builder/kernels/sample_triton.py at `rev` (or the file `rev` names: the device's checkout may lack the
    history), imported from a file (Triton reads a jit function's source)."""
    if Path(rev).is_file():
        src, rev = Path(rev).read_text(), "file"
    else:
        src = subprocess.run(
            ["git", "show", f"{rev}:builder/kernels/sample_triton.py"], check=True, capture_output=True, text=True
        ).stdout
    path = Path(tempfile.mkdtemp(prefix="sampler-base-")) / f"sample_triton_{rev}.py"
    path.write_text(src.replace("from .", "from ttsaot.builder.kernels."))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rule_warps(mod, block: int, sort: bool) -> int:
    """The module's own warps rule (by vocabulary; earlier kernels also by the way to the kept set)."""
    try:
        return mod.warps(block)
    except TypeError:
        return mod.warps(block, sort)


def _launch(mod, logits, u, t, k, p, sort: bool, warps: int | None = None) -> torch.Tensor:
    from ttsaot.builder.kernels.common import next_power_of_2
    from ttsaot.builder.kernels.sample import U_MAX, U_MIN

    B, V = logits.shape
    out = torch.empty((B,), dtype=torch.int64, device=logits.device)
    block = next_power_of_2(V)
    mod.sample_tokens_kernel[(B,)](
        logits, u, t, k, p, out, V, logits.stride(0), u.stride(0),
        U_MIN=U_MIN, U_MAX=U_MAX, BLOCK_V=block, SORT=sort, num_warps=warps or _rule_warps(mod, block, sort),
    )  # fmt: skip
    return out


def _calls(mod, logits, noise, t, k, p, sort: bool, warps: int | None = None) -> list:
    """One draw per noise slice (16), as a frame's steps."""
    return [lambda s=s: _launch(mod, logits, noise[:, s], t, k, p, sort, warps) for s in range(noise.shape[1])]


def _inputs(V: int, B: int, mix, dev: torch.device):
    g = torch.Generator(device=dev).manual_seed(V + B)
    logits = (torch.randn(B, V, generator=g, device=dev) * 3).to(torch.bfloat16)
    noise = torch.rand(B, 16, V, generator=g, device=dev)
    if mix is None:  # bench/kernels.py bench_sampler_case's rows
        t = torch.rand(B, generator=g, device=dev) + 0.3
        k = torch.randint(0, 80, (B,), generator=g, device=dev)
        p = torch.rand(B, generator=g, device=dev) * 0.5 + 0.5
    else:
        t = torch.full((B,), mix[0], device=dev)
        k = torch.full((B,), mix[1], dtype=torch.int64, device=dev)
        p = torch.full((B,), mix[2], device=dev)
    return logits, noise, t, k, p


def main(argv: list[str]) -> int:
    import ttsaot.builder.kernels.sample_triton as new
    from bench.common import device_info
    from bench.kernels import graph_ms
    from ttsaot.builder.kernels.sample import sample

    base = argv[1] if len(argv) > 1 else "01d382b"
    dev = torch.device("cuda")
    kernels = {"base": _module_at(base), "new": new}
    res: dict = {"device": device_info(dev), "base": base, "cases": {}}
    for V in (1024, 2048, 4096):
        for B in (1, 8):
            for mix_name, mix in MIXES.items():
                logits, noise, t, k, p = _inputs(V, B, mix, dev)
                row = {}
                for kname, mod in kernels.items():
                    for sort in (True, False) if V <= 2048 else (False,):
                        way = f"{kname}/{'sort' if sort else 'radix'}"
                        try:
                            calls = _calls(mod, logits, noise, t, k, p, sort)
                            differ = sum(
                                int((c().cpu() != sample(logits, noise[:, s], t, k, p).cpu()).sum())
                                for s, c in enumerate(calls)
                            )
                            row[way] = {"us": round(graph_ms(calls, 30, dev) * 1e3, 2), "tokens_differing": differ}
                        except Exception as e:  # noqa: BLE001 - a failing variant is a result too
                            row[way] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                if V > 2048:  # the radix select's warps rule at this width: against half as many
                    try:
                        calls = _calls(new, logits, noise, t, k, p, False, warps=new.warps(V) // 2)
                        row["new/radix/half_warps"] = {"us": round(graph_ms(calls, 30, dev) * 1e3, 2)}
                    except Exception as e:  # noqa: BLE001
                        row["new/radix/half_warps"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                key = f"V={V}/B={B}/{mix_name}"
                res["cases"][key] = row
                print(key, "  ".join(f"{w} {r.get('us', r.get('error'))} ({r.get('tokens_differing')})"
                                     for w, r in row.items()), flush=True)  # fmt: skip
                Path(argv[0]).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
