"""Demo: decode random codes through a built artifact with the runtime and write WAV files.

Random weights make noise: this shows the path (build → load → decode → stream → WAV), not a voice. Point the
builder at a real checkpoint (`build-artifacts build qwen3-tts-12hz --checkpoint Qwen3-TTS-12Hz-0.6B-Base`) and
feed codes from the talker to hear speech. Timings are after one warm-up call, with the runtime's default CPU
threads (README "CPU threads")."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ttsaot.runtime import load
from ttsaot.runtime.metrics import rel_error


def qwen_demo(art: Path, out: Path, seconds: float) -> None:
    import soundfile as sf

    t0 = time.time()
    bundle = load(art / "qwen3-tts-12hz")
    stage = bundle["code2wav"]
    print(f"loaded {bundle} in {time.time() - t0:.2f}s")
    K = stage.entry.inputs[0].shape[1]
    high = stage.entry.inputs[0].range["high"][0]
    frames = max(1, int(seconds * stage.sample_rate / stage.samples_per_frame))
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, high, (1, K, frames), generator=g)
    chunk = stage.metadata["streaming"]["chunk_frames"]
    stage(codes)  # warm-up: first use of each bucket (page-in, output checks)
    list(stage.stream(codes.split(chunk, dim=-1)))
    t0 = time.perf_counter()
    wav = stage(codes)
    t_one = time.perf_counter() - t0
    t0 = time.perf_counter()
    pieces = list(stage.stream(codes.split(chunk, dim=-1)))
    t_stream = time.perf_counter() - t0
    streamed = torch.cat(pieces, dim=-1)
    out.mkdir(parents=True, exist_ok=True)
    sf.write(out / "qwen3_code2wav.wav", wav[0, 0].numpy(), stage.sample_rate)
    sf.write(out / "qwen3_code2wav_streamed.wav", streamed[0, 0].numpy(), stage.sample_rate)
    rel = rel_error(streamed, wav)
    print(
        f"code2wav: {frames} frames → {wav.shape[-1]} samples ({wav.shape[-1] / stage.sample_rate:.2f}s audio) "
        f"one-shot {t_one * 1e3:.0f} ms, streamed in {len(pieces)} chunks {t_stream * 1e3:.0f} ms, "
        f"streamed vs one-shot rel diff {rel:.2e}"
    )
    print(f"wrote {out / 'qwen3_code2wav.wav'} and {out / 'qwen3_code2wav_streamed.wav'}")


def fish_demo(art: Path, out: Path, seconds: float = 1.5) -> None:
    """Round-trip a generated WAV (stereo, 22.05 kHz: exercises mix-down and resampling) through the Fish DAC
    encoder and decoder artifacts, one-shot and streamed."""
    import numpy as np
    import soundfile as sf

    from ttsaot.runtime import read_manifest

    if not {"dac_encoder", "dac_decoder"} <= set(read_manifest(art / "fish-s2-pro").stages):
        print("fish-s2-pro: dac_encoder/dac_decoder not built, skipping the codec round trip")
        return
    t0 = time.time()
    bundle = load(art / "fish-s2-pro", stages=["dac_encoder", "dac_decoder"])
    enc, dec = bundle["dac_encoder"], bundle["dac_decoder"]
    print(f"loaded {bundle} in {time.time() - t0:.2f}s")
    sr = 22050
    seconds = min(seconds, enc.max_samples / enc.sample_rate * 0.9)
    t = np.arange(int(seconds * sr)) / sr
    left = 0.4 * np.sin(2 * np.pi * (180 + 120 * t) * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    right = 0.3 * np.sin(2 * np.pi * 330 * t)
    out.mkdir(parents=True, exist_ok=True)
    ref = out / "fish_reference.wav"
    sf.write(ref, np.stack([left, right], axis=1).astype(np.float32), sr)
    dec(enc.encode(ref)[None])  # warm-up: first use of each bucket
    t0 = time.perf_counter()
    codes = enc.encode(ref)  # [10, F] int64
    t_enc = time.perf_counter() - t0
    t0 = time.perf_counter()
    wav = dec(codes[None])  # [1, 1, F·2048] float32 at 44.1 kHz
    t_dec = time.perf_counter() - t0
    st, largest = dec.metadata["streaming"], dec.max_sizes["frames"]
    chunk = min(st["chunk_frames"], max(1, largest // 2))
    ctx = min(st["left_context_frames"], largest - chunk)
    streamed = torch.cat(list(dec.stream(codes[None].split(chunk, dim=-1), left_context_frames=ctx)), dim=-1)
    sf.write(out / "fish_roundtrip.wav", wav[0, 0].numpy(), dec.sample_rate)
    sf.write(out / "fish_roundtrip_streamed.wav", streamed[0, 0].numpy(), dec.sample_rate)
    print(
        f"dac_encoder: {seconds:.2f}s stereo {sr} Hz → codes {tuple(codes.shape)} in {t_enc * 1e3:.0f} ms; "
        f"dac_decoder: → {wav.shape[-1]} samples at {dec.sample_rate} Hz in {t_dec * 1e3:.0f} ms; "
        f"streamed ({chunk}-frame chunks, {ctx} context) vs one-shot rel diff "
        f"{rel_error(streamed, wav):.2e}"
    )
    print(f"wrote {ref}, {out / 'fish_roundtrip.wav'} and {out / 'fish_roundtrip_streamed.wav'}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--artifacts", default="artifacts")
    p.add_argument("--out", default="demo_out")
    p.add_argument("--seconds", type=float, default=2.0)
    a = p.parse_args()
    art, out = Path(a.artifacts), Path(a.out)
    if (art / "qwen3-tts-12hz").is_dir():
        qwen_demo(art, out, a.seconds)
    if (art / "fish-s2-pro").is_dir():
        fish_demo(art, out)


if __name__ == "__main__":
    main()
