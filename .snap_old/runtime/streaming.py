"""Codec decoders: chunked decode with left context, for streaming and for requests longer than every bucket.

A chunk is decoded together with up to `left_context` previous frames and the samples of those context frames
are dropped. The codecs are causal, so when the left context covers the receptive field the concatenated chunks
equal the one-shot decode (up to kernel-order noise); with less context they are the usual approximation."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from .errors import InputShapeError
from .stage import Stage


class CodecDecoderStage(Stage):
    """codes [B, K, F] → wave [B, 1, F·samples_per_frame]."""

    @property
    def samples_per_frame(self) -> int:
        return int(self.metadata["samples_per_frame"])

    @property
    def sample_rate(self) -> int:
        return int(self.metadata["sample_rate"])

    def _streaming(self) -> dict:
        return dict(self.metadata.get("streaming", {}))

    def _run_overflow(self, named, sizes, axis):
        if axis != "frames":
            return super()._run_overflow(named, sizes, axis)
        (codes,) = named.values()
        return [self.decode_chunked(codes)]

    def decode_chunked(
        self, codes: torch.Tensor, chunk_frames: int | None = None, left_context_frames: int | None = None
    ) -> torch.Tensor:
        """Decode a long request in chunks of new frames, each with left context, in buckets we have."""
        st = self._streaming()
        ctx = st.get("left_context_frames", 0) if left_context_frames is None else left_context_frames
        largest = self.max_sizes["frames"]
        chunk = chunk_frames or st.get("nonstreaming_chunk_frames") or (largest - ctx)
        chunk = min(chunk, largest - ctx)
        if chunk <= 0:
            raise InputShapeError(f"{self.name}: left context {ctx} leaves no room in the largest bucket {largest}")
        return torch.cat(list(self.stream(codes.split(chunk, dim=-1), left_context_frames=ctx)), dim=-1)

    def stream(self, chunks: Iterable[torch.Tensor], left_context_frames: int | None = None) -> Iterator[torch.Tensor]:
        """Yield the wave of each chunk of NEW frames ([B, K, n] each), re-decoding up to `left_context_frames`
        previous frames and dropping their samples."""
        ctx = self._streaming().get("left_context_frames", 0) if left_context_frames is None else left_context_frames
        spf = self.samples_per_frame
        history: torch.Tensor | None = None
        for new in chunks:
            if new.dim() != 3:
                raise InputShapeError(f"{self.name}: each chunk must be [B, K, frames], got {tuple(new.shape)}")
            window = new if history is None else torch.cat([history.to(new.device), new], dim=-1)
            used_ctx = window.shape[-1] - new.shape[-1]
            if window.shape[-1] > self.max_sizes["frames"]:
                raise InputShapeError(
                    f"{self.name}: chunk of {new.shape[-1]} frames + {used_ctx} context exceeds "
                    f"the largest bucket ({self.max_sizes['frames']}); send smaller chunks"
                )
            wav = self(window)
            yield wav[..., used_ctx * spf :]
            history = window[..., window.shape[-1] - min(ctx, window.shape[-1]) :] if ctx else None
