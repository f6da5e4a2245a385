"""Probe: can the VoxCPM2 VAE decoder's transposed convs run nearer their floors? (issue 15)

In the H100 timeline of vae_decoder (36 frames, fp32 tf32x3; bench/results/nvidia-h100/probes/codec_timeline/
run5_one_step/) its three transposed convs take 86, 87 and 94 µs of a 1.07 ms call: 2048 → 1024 ×8 over 36 rows
(134 MB of fp32 weights: 45 µs to read), 1024 → 512 ×6 over 288 rows and 512 → 256 ×5 over 1,728 rows (3.6 and
4.5 GFLOP: 22-27 µs of TF32 tensor-core time for tf32x3's three products). This times each layer at every tile the
conv kernel may use for it (fp32 register limits) × split-K 1/2/4/8, each in a CUDA graph of 20 launches, next to
what `prune_gemm_configs` offers the autotuner, a copy of the weight bytes, and the reference error. Writes JSON.

    CXX=/usr/bin/g++ python3 bench/probes/vae_transposed_tiles.py --out vae_transposed_tiles.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import graph_replay_ms  # noqa: E402
from ttsaot.builder.kernels import conv1d as K  # noqa: E402
from ttsaot.builder.layers.conv import CausalConvTranspose1d  # noqa: E402

# (name, cin, cout, stride, rows): the VAE decoder's first three upsampling convs at a 36-frame window
LAYERS = [("up8", 2048, 1024, 8, 36), ("up6", 1024, 512, 6, 288), ("up5", 512, 256, 5, 1728)]
SPLITS = (1, 2, 4, 8)
LAUNCHES, REPS = 20, 7  # launches of a layer per CUDA graph (bench.common.graph_replay_ms: µs per launch × 1e-3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="vae_transposed_tiles.json")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cudnn.allow_tf32 = False  # the reference in exact fp32 (cuDNN's default is TF32 convolutions)
    rows = []
    tiles = {(c.block_t, c.block_n, c.num_warps, c.num_stages) for c in K.gemm_kernel_configs(torch.float32)}
    for name, cin, cout, s, T in LAYERS:
        with torch.device("cuda"):
            w, b, stride = K.bake_conv_transpose1d(CausalConvTranspose1d(cin, cout, 2 * s, s))
            x = torch.randn(1, T, cin)
        args = (x, w, b, None, None, None, None, None, "none", None, "tf32x3", False)
        ref = K.conv_transpose1d_reference(x, w, b, None, None, None, None, None, "none", None, "tf32x3")
        n, k_taps = s * cout, w.shape[2]
        offered = K.prune_gemm_configs(
            K.gemm_kernel_configs(torch.float32),
            batch=1,
            tout=T,
            n=n,
            cin=cin,
            ksize=k_taps,
            elem=4,
            precision="tf32x3",
        )
        src = torch.empty(w.numel(), device="cuda").uniform_()
        dst = torch.empty_like(src)
        copy_us = graph_replay_ms([lambda: dst.copy_(src)] * LAUNCHES, REPS) * 1e3  # noqa: B023 - called at once
        flop = 2.0 * T * n * k_taps * cin
        for bt, bn, warps, stages in sorted(tiles):
            if stages == 1 or bn > max(16, 1 << (n - 1).bit_length()) or bt > max(64, 1 << (T - 1).bit_length()):
                continue
            if bn < 32 or bt * bn > K.FP32_MAX_TILE or max(bt, bn) > K.TF32X3_MAX_SIDE:
                continue
            for split in SPLITS:
                cfg = K.ConvKernelConfig(bt, bn, 32, warps, stages, split_k=split)

                def run(cfg=cfg, args=args):
                    return K.conv_transpose1d_forward(*args, config=cfg)[1]

                try:
                    got = run()
                    err = ((got - ref).norm() / ref.norm()).item()
                    us = graph_replay_ms([run] * LAUNCHES, REPS) * 1e3
                except Exception as e:  # noqa: BLE001 - a config the kernel refuses is a result too
                    rows.append({"layer": name, "tile": cfg.name, "error": str(e).splitlines()[0][:200]})
                    continue
                rows.append(
                    {
                        "layer": name,
                        "tile": cfg.name,
                        "us": round(us, 2),
                        "offered": cfg in offered,
                        "weight_copy_us": round(copy_us, 2),
                        "tf32_tflops_equiv": round(3 * flop / (us * 1e-6) / 1e12, 1),
                        "rel_err": err,
                    }
                )
                print(rows[-1], flush=True)
        print({"layer": name, "offered": [c.name for c in offered]}, flush=True)
    Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
