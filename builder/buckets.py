"""Bucket planning: computed from the streaming configuration and --max-batch, never hard-coded lists."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StreamingConfig:
    """How a codec stage is fed in serving.

    chunk_frames: new frames per steady-state chunk; left_context_frames: frames of history re-decoded and
    dropped; first_chunk_frames: size of the first chunks while total ≤ chunk_frames (each decoded with all
    previous frames as context, the Fish/vLLM-Omni pattern; 0 = first chunk is a normal chunk);
    nonstreaming_chunk_frames: chunk length used to decode long requests in one go (0 = off)."""

    chunk_frames: int = 25
    left_context_frames: int = 25
    first_chunk_frames: int = 0
    nonstreaming_chunk_frames: int = 300

    def __post_init__(self) -> None:
        if self.chunk_frames <= 0:
            raise ValueError("chunk_frames must be > 0")
        if min(self.left_context_frames, self.first_chunk_frames, self.nonstreaming_chunk_frames) < 0:
            raise ValueError("frame counts must be >= 0")

    def window_sizes(self) -> list[int]:
        """Every decode-window length the streaming pattern produces (new frames + left context)."""
        sizes = {self.chunk_frames, self.chunk_frames + self.left_context_frames}
        if self.first_chunk_frames:
            # windows 4, 8, ..., up to chunk_frames while the whole history is the context
            n = self.first_chunk_frames
            while n < self.chunk_frames:
                sizes.add(n)
                n += self.first_chunk_frames
        if self.nonstreaming_chunk_frames:
            sizes.add(self.nonstreaming_chunk_frames + self.left_context_frames)
        return sorted(sizes)


def powers_of_two(upto: int, start: int = 1) -> list[int]:
    out, n = [], start
    while n <= upto:
        out.append(n)
        n *= 2
    return out


@dataclass(frozen=True)
class BucketPlan:
    """The static shapes a stage is compiled for: the cross product of its axes' sizes."""

    axes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def buckets(self) -> list[dict[str, int]]:
        out: list[dict[str, int]] = [{}]
        for axis, sizes in self.axes.items():
            out = [{**b, axis: s} for b in out for s in sizes]
        return out

    @staticmethod
    def key(sizes: dict[str, int]) -> str:
        return "_".join(f"{axis[0]}{n}" for axis, n in sizes.items())


def batch_sizes(max_batch: int, explicit: tuple[int, ...] | None = None) -> tuple[int, ...]:
    if explicit:
        return tuple(sorted(set(explicit)))
    if max_batch < 1:
        raise ValueError("--max-batch must be >= 1")
    sizes = powers_of_two(max_batch)
    if sizes[-1] != max_batch:
        sizes.append(max_batch)  # the largest batch a server admits must be servable without splitting
    return tuple(sizes)


def frame_sizes(streaming: StreamingConfig, pow2: bool = True, pow2_min: int = 8,
                explicit: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Streaming windows plus powers of two from pow2_min up to the largest window (padding targets for
    tails and odd request lengths)."""
    if explicit:
        return tuple(sorted(set(explicit)))
    sizes = set(streaming.window_sizes())
    if pow2:
        sizes.update(powers_of_two(max(sizes), start=pow2_min))
    return tuple(sorted(sizes))
