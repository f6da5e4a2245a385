"""Probe: do one-step conv GEMMs want fewer pipeline stages? (issue 15, the DAC encoder's first conv)

The encoder's first conv (1 → 64 channels, k7, a 10 s clip = 442,368 rows, tf32x3, dual snake epilogue) reduces its
7 (tap, channel) pairs in ONE step since the joint reduction, yet ran 403 µs against the 75 µs it takes to write
its two 113 MB outputs (bench/results/nvidia-h100/probes/codec_timeline). Its tiles keep 4 pipeline stages of
shared memory (64-88 KiB: 2-3 programs per SM) for a loop of one iteration; 1 stage takes 16 KiB. This times the
layer (and the VAE's 1-channel head, 32 → 1, k7, 69,120 rows) at explicit tiles, 4 stages vs 1, next to a copy of
the same output bytes, each in a CUDA graph of 20 launches (inputs hot in L2 as in a stage's graph). Writes JSON.

    CXX=/usr/bin/g++ python3 bench/probes/thin_conv_stages.py --out thin_conv_stages.json
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
from ttsaot.builder.layers.conv import CausalConv1d  # noqa: E402

# (name, cin, cout, kernel, rows, dual): the DAC encoder's first conv and the VAE decoder's head
LAYERS = [("dac_encoder_in", 1, 64, 7, 442368, True), ("vae_head", 32, 1, 7, 69120, False)]
TILES = [(64, 64), (128, 64), (128, 32), (64, 16), (128, 16), (256, 16)]


def _graph_us(fn, launches: int = 20, reps: int = 7) -> float:
    """µs per launch of `fn`: `launches` of it in one CUDA graph, the bench's timing of captured sequences."""
    return graph_replay_ms([fn] * launches, reps) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="thin_conv_stages.json")
    a = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for name, cin, cout, k, T, dual in LAYERS:
        with torch.device("cuda"):
            w, b, m = K.bake_conv1d(CausalConv1d(cin, cout, k))
            x = torch.randn(1, T, cin)
            alpha, inv_beta = torch.rand(cout) + 0.5, torch.rand(cout)
        args = (x, w, b, None, None, None, alpha, inv_beta, 1, 1, m.left_pad, "snake", None, "tf32x3")
        ref = K.conv1d_dual_reference(*args)[1] if dual else K.conv1d_reference(*args)
        out_bytes = ref.numel() * 4 * (2 if dual else 1)
        src = torch.empty(out_bytes // 4, device="cuda").uniform_()
        dst = torch.empty_like(src)
        copy_us = _graph_us(lambda: dst.copy_(src))  # noqa: B023 - called at once
        for bt, bn in TILES:
            if bn > max(16, 1 << (cout - 1).bit_length()) or (bn == 16) != (cout <= 16):
                continue
            for stages in (4, 1):
                cfg = K.ConvKernelConfig(bt, bn, 32, 4, stages)

                def run(cfg=cfg, args=args, dual=dual):
                    return K.conv1d_forward(*args, dual, config=cfg)

                got = run()[1]
                err = ((got - ref).norm() / ref.norm()).item()
                us = _graph_us(run)
                rows.append(
                    {
                        "layer": name,
                        "tile": cfg.name,
                        "us": round(us, 2),
                        "copy_of_output_us": round(copy_us, 2),
                        "x_copy": round(us / copy_us, 2),
                        "rel_err": err,
                    }
                )
                print(rows[-1], flush=True)
    Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
