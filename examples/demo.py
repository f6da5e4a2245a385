"""Demo: decode random codes through a built artifact with the runtime and write WAV files.

Random weights make noise: this shows the path (build → load → decode → stream → WAV), not a voice. Point the
builder at a real checkpoint (`build-artifacts build qwen3-tts-12hz --checkpoint Qwen3-TTS-12Hz-0.6B-Base`) and
feed codes from the talker to hear speech."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from ttsaot.runtime import load


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
    t0 = time.time()
    wav = stage(codes)
    t_one = time.time() - t0
    chunk = stage.metadata["streaming"]["chunk_frames"]
    t0 = time.time()
    pieces = list(stage.stream(codes.split(chunk, dim=-1)))
    t_stream = time.time() - t0
    streamed = torch.cat(pieces, dim=-1)
    out.mkdir(parents=True, exist_ok=True)
    sf.write(out / "qwen3_code2wav.wav", wav[0, 0].numpy(), stage.sample_rate)
    sf.write(out / "qwen3_code2wav_streamed.wav", streamed[0, 0].numpy(), stage.sample_rate)
    rel = ((streamed - wav).norm() / wav.norm()).item()
    print(f"code2wav: {frames} frames → {wav.shape[-1]} samples ({wav.shape[-1] / stage.sample_rate:.2f}s audio) "
          f"one-shot {t_one * 1e3:.0f} ms, streamed in {len(pieces)} chunks {t_stream * 1e3:.0f} ms, "
          f"streamed vs one-shot rel diff {rel:.2e}")
    print(f"wrote {out / 'qwen3_code2wav.wav'} and {out / 'qwen3_code2wav_streamed.wav'}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--artifacts", default="artifacts")
    p.add_argument("--out", default="demo_out")
    p.add_argument("--seconds", type=float, default=2.0)
    a = p.parse_args()
    art, out = Path(a.artifacts), Path(a.out)
    if (art / "qwen3-tts-12hz").is_dir():
        qwen_demo(art, out, a.seconds)


if __name__ == "__main__":
    main()
