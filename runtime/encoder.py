"""Codec encoders (kind `codec_encoder`): reference audio → codes, e.g. the Fish DAC encoder (voice cloning).

Buckets are audio lengths in samples (axis `samples`, batch 1). The encoder is causal, so audio is
right-padded with zeros to the smallest bucket and the codes are trimmed to the real length
⌈T / samples_per_frame⌉: the output axis `frames` is not a bucket axis, this class derives it from `samples`.
Longer audio than the largest bucket is refused (chunked encoding would not be exact: the encoder's attention
and convolutions look back across any chunk boundary)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from .errors import InputShapeError
from .stage import Stage


class CodecEncoderStage(Stage):
    """`encode(audio, sample_rate)` → codes [K, F] int64; `stage(audio [1,1,T] float32)` → codes [1,K,F]."""

    @property
    def sample_rate(self) -> int:
        return int(self.metadata["sample_rate"])

    @property
    def samples_per_frame(self) -> int:
        return int(self.metadata["samples_per_frame"])

    @property
    def max_samples(self) -> int:
        return self.max_sizes["samples"]

    def _derived_sizes(self, sizes: dict[str, int]) -> dict[str, int]:
        # `frames` is not a bucket axis: S samples (a request, or a bucket for the output check) yield ⌈S / spf⌉
        # frames. Padding to the bucket (zeros: causal, so the real frames' codes do not change) is the generic
        # bucket runner's, which also gives CPU packages the slack their vectorised tail loops read past the input.
        return {**sizes, "frames": math.ceil(sizes["samples"] / self.samples_per_frame)}

    def _run(self, named, sizes, pending=False):
        if sizes["samples"] > self.max_samples:
            n, sr = sizes["samples"], self.sample_rate
            raise InputShapeError(
                f"{self.name}: audio of {n} samples ({n / sr:.2f} s) exceeds the largest bucket "
                f"({self.max_samples} samples, {self.max_samples / sr:.2f} s); trim the reference audio or "
                f"rebuild with longer encoder buckets"
            )
        return self._run_bucket(named, sizes, pending)

    def encode(
        self, audio: str | Path | np.ndarray | torch.Tensor, sample_rate: int | None = None, keep_batch: bool = False
    ) -> torch.Tensor:
        """Read/mix down/resample `audio` (a path, or an array at `sample_rate`, default the codec's rate) and
        return its codes [K, ⌈T/spf⌉] (or [1, K, F] with `keep_batch`) on the stage device."""
        from .audio import prepare_audio

        wav = prepare_audio(audio, sample_rate, self.sample_rate)
        if wav.shape[0] > self.max_samples:
            sr = self.sample_rate
            raise InputShapeError(
                f"{self.name}: reference audio is {wav.shape[0] / sr:.2f} s at {sr} Hz, longer than the "
                f"largest bucket ({self.max_samples / sr:.2f} s); trim it or rebuild with longer encoder "
                "buckets"
            )
        codes = self(torch.from_numpy(wav).view(1, 1, -1))
        return codes if keep_batch else codes[0]
