"""Bucket planning: computed from the streaming configuration and --max-batch, never hard-coded lists.

Torch-free: the streaming plan's fields are CLI flags (builder/options.py), declared here once for every family
with a streaming codec stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from .options import BuildOptions, flag, flag_group, non_negative_int, positive_int, positive_ints, switch

# Frame buckets below this are not worth a package: shorter windows pad to it.
POW2_MIN_FRAMES = 8


@dataclass(frozen=True)
class StreamingConfig:
    """How a codec stage is fed in serving.

    chunk_frames: new frames per steady-state chunk; left_context_frames: frames of history re-decoded and
    dropped; first_chunk_frames: size of the first chunks while total ≤ chunk_frames (each decoded with all
    previous frames as context, the Fish/vLLM-Omni pattern; 0 = first chunk is a normal chunk);
    nonstreaming_chunk_frames: chunk length used to decode long requests in one go (0 = off)."""

    chunk_frames: int = flag(25, parse=positive_int, help="Streaming: new frames per chunk.")
    left_context_frames: int = flag(25, parse=non_negative_int, help="Streaming: frames of left context.")
    first_chunk_frames: int = flag(0, parse=non_negative_int, help="Streaming: initial chunk size (0 = off).")
    nonstreaming_chunk_frames: int = flag(300, parse=non_negative_int, help="Chunk for one-shot long decode (0 = off).")

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

    def hot_windows(self) -> list[int]:
        """The windows a service decodes on every chunk of a stream, or that decide its time to first audio: the
        first chunk (first_chunk_frames, or a whole chunk when there is no first-chunk ramp), the steady window
        (chunk + left context) and the long one-shot window (nonstreaming chunk + context), which a long request
        hits once per 300-odd frames. The rest of a stage's frame buckets (the ramp windows' and a tail's padding
        targets, the power-of-two targets of one-shot requests) are each hit about once per request."""
        sizes = {self.first_chunk_frames or self.chunk_frames, self.chunk_frames + self.left_context_frames}
        if self.nonstreaming_chunk_frames:
            sizes.add(self.nonstreaming_chunk_frames + self.left_context_frames)
        return sorted(sizes)


def hot_frames(streaming: StreamingConfig, frames: tuple[int, ...]) -> tuple[int, ...]:
    """The frame buckets that serve the hot windows (each window pads to the smallest bucket that holds it): what
    `--dynamic-packages cold` keeps static (StageSpec.hot_sizes)."""
    return tuple(sorted({min(f for f in frames if f >= w) for w in streaming.hot_windows() if w <= max(frames)}))


def powers_of_two(upto: int, start: int = 1) -> list[int]:
    out, n = [], start
    while n <= upto:
        out.append(n)
        n *= 2
    return out


@dataclass(frozen=True)
class BucketPlan:
    """The static shapes a stage is compiled for: the cross product of its axes' sizes, less the batch > 1
    buckets whose batch × frames exceeds `max_batch_frames` (None: none left out). One row at every size is
    always kept; the runtime serves a batch no bucket covers in smaller batches."""

    axes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    max_batch_frames: int | None = None

    def buckets(self) -> list[dict[str, int]]:
        out: list[dict[str, int]] = [{}]
        for axis, sizes in self.axes.items():
            out = [{**b, axis: s} for b in out for s in sizes]
        cap = self.max_batch_frames
        if cap and "batch" in self.axes and "frames" in self.axes:
            out = [b for b in out if b["batch"] == 1 or b["batch"] * b["frames"] <= cap]
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


def frame_sizes(
    streaming: StreamingConfig,
    pow2: bool = True,
    pow2_min: int = POW2_MIN_FRAMES,
    explicit: tuple[int, ...] | None = None,
) -> tuple[int, ...]:
    """Streaming windows plus powers of two from pow2_min up to the largest window, above the smallest window:
    padding targets for one-shot requests between the windows. None below the smallest window: only requests
    shorter than a stream's first chunk would use them, a serving mix never did (bench bucket-hits: Qwen code2wav's
    8- and 16-frame buckets, 6 of its 22 packages, 0 hits), and padding such a request to the smallest window costs
    a fraction of a millisecond (H100, bf16 code2wav, 8 / 16 / 25 frames: 0.74 / 0.87 / 1.07 ms at B=1, 1.17 /
    1.72 / 2.41 ms at B=4; bench/results/nvidia-h100/codec_stages_code2wav_small_frames.json) where each package
    costs minutes of every cold build.

    With the powers of two on, a stream's ramp windows after its first chunk (Fish: 8, 12, ..., 24 frames while the
    first chunks grow to the chunk) have no bucket of their own: each is hit once per stream, at most a few
    chunks in, and pads to the power of two or the chunk above it. On an H100 (bf16 dac_decoder, ttsaot kernels)
    12 → 16 frames costs 0.03 / 0.27 ms at B=1 / B=4 and 20 → 25 frames 0.25 / 0.76 ms, for 4 frames (186 ms) of
    audio each (bench/results/nvidia-h100/codec_stages_dac_decoder_ramp_frames.json), where the 9 packages they
    took were a third of Fish's default build. The first chunk keeps its bucket: it decides time to first audio."""
    if explicit:
        return tuple(sorted(set(explicit)))
    windows = set(streaming.window_sizes())
    sizes = set(windows)
    if pow2:
        sizes -= set(sorted(w for w in windows if w < streaming.chunk_frames)[1:])
        sizes.update(p for p in powers_of_two(max(windows), start=pow2_min) if p > min(windows))
    return tuple(sorted(sizes))


def batch_frames_cap(streaming: StreamingConfig, batches: tuple[int, ...], frames: tuple[int, ...]) -> int:
    """Default `max_batch_frames`: the largest batch at a steady streaming window (chunk + left context), or the
    longest window at one row, whichever is more. Batches exist for concurrent streams, whose windows are short;
    one row of a long one-shot window is already as much work as the largest streaming batch (a codec's compute
    per frame-row is fixed), while a graph's activation memory, held for the life of the process, grows with
    batch × frames: Qwen code2wav's 4 × 325-frame graph alone reserved 4.0 GiB on an H100."""
    window = streaming.chunk_frames + streaming.left_context_frames
    return max(max(batches) * window, max(frames))


@dataclass
class StreamingCodecOptions(BuildOptions):
    """Options of a family with a streaming codec stage: its frame buckets come from the streaming plan (plus
    powers of two) unless given. A family sets its own `streaming` default by redeclaring the field."""

    frame_buckets: tuple[int, ...] | None = flag(
        None, parse=positive_ints, metavar="N,N", help="Explicit frame buckets instead of the streaming plan."
    )
    pow2_frames: bool = switch(True, name="--no-pow2", help="Do not add power-of-two frame buckets.")
    max_batch_frames: int | None = flag(
        None,
        parse=non_negative_int,
        metavar="N",
        help="Leave out batch > 1 buckets whose batch × frames exceeds N (served in smaller batches) "
        "[default: max(largest batch × (chunk + left context), longest window); 0 = keep every one].",
    )

    streaming: StreamingConfig = flag_group(StreamingConfig)

    def codec_plan(self, batches: tuple[int, ...], frames: tuple[int, ...]) -> BucketPlan:
        """The batch × frames plan of the family's streaming codec stage."""
        cap = self.max_batch_frames
        if cap is None:
            cap = batch_frames_cap(self.streaming, batches, frames)
        return BucketPlan({"batch": batches, "frames": frames}, max_batch_frames=cap or None)

    def codec_hot_sizes(self, frames: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        """StageSpec.hot_sizes of the streaming codec stage: the frame buckets of its hot windows, every batch."""
        return {"frames": hot_frames(self.streaming, frames)}


# A golden case this many frames short of the smallest frame bucket exercises padding and trimming.
OFF_BUCKET_FRAMES = 3


def off_bucket_frames(frames: tuple[int, ...]) -> dict[str, int]:
    """The off-bucket golden case of a batch × frames stage: one row, a few frames below the smallest bucket."""
    return {"batch": 1, "frames": max(1, frames[0] - OFF_BUCKET_FRAMES)}
