"""Reference-audio preparation for codec encoders: read (any format soundfile reads), mix down, resample.

soundfile and soxr are optional dependencies (`pip install ttsaot[audio]`), imported only when needed: a
serving process that never encodes reference audio does not need them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .errors import InputError, InputShapeError, InputValueError

MAX_CHANNELS = 8  # a dimension this small next to a long one is the channel axis


class AudioReadError(InputError):
    """The audio file is missing, unreadable or not audio."""


def _need(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"reading/resampling reference audio needs {module!r}: pip install 'ttsaot[audio]'") from None


def read_audio(path: str | Path) -> tuple[np.ndarray, int]:
    """(samples [T, C] float32, sample rate)."""
    sf = _need("soundfile")
    p = Path(path)
    if not p.is_file():
        raise AudioReadError(f"{p}: no such audio file")
    try:
        data, sr = sf.read(str(p), dtype="float32", always_2d=True)
    except Exception as e:  # noqa: BLE001 - libsndfile raises several types for bad files
        raise AudioReadError(f"{p}: cannot read audio ({e})") from None
    return data, int(sr)


def to_mono(x: np.ndarray) -> np.ndarray:
    """[T], [C, T], [T, C] or [1, C, T] → [T] float32 (channel mean). The channel axis is the short one
    (≤ 8 channels); anything else is refused rather than guessed."""
    x = np.asarray(x)
    if x.ndim == 3 and x.shape[0] == 1:
        x = x[0]
    if x.ndim == 1:
        return x.astype(np.float32, copy=False)
    if x.ndim == 2:
        c0, c1 = x.shape
        if c0 <= MAX_CHANNELS and c1 > c0:
            return x.mean(axis=0, dtype=np.float64).astype(np.float32)
        if c1 <= MAX_CHANNELS and c0 > c1:
            return x.mean(axis=1, dtype=np.float64).astype(np.float32)
        if c0 == c1 == 1:
            return x.reshape(1).astype(np.float32)
    raise InputShapeError(
        f"audio of shape {tuple(x.shape)}: expected [T], [C, T], [T, C] or [1, C, T] with "
        f"at most {MAX_CHANNELS} channels"
    )


def resample(x: np.ndarray, sr: int, target_sr: int) -> np.ndarray:
    if sr == target_sr:
        return x
    soxr = _need("soxr")
    return soxr.resample(x, sr, target_sr, quality="HQ").astype(np.float32, copy=False)


def prepare_audio(audio: str | Path | np.ndarray | torch.Tensor, sample_rate: int | None, target_sr: int) -> np.ndarray:
    """Any accepted input → mono float32 [T] at `target_sr`. Arrays without `sample_rate` are taken to be at
    `target_sr` already. Raises typed InputErrors for empty, non-finite or unreadable input."""
    if isinstance(audio, (str, Path)):
        data, sr = read_audio(audio)
        if sample_rate is not None and sample_rate != sr:
            raise InputValueError(f"{audio}: the file is {sr} Hz but sample_rate={sample_rate} was given")
        sample_rate = sr
    elif isinstance(audio, torch.Tensor):
        data = audio.detach().to("cpu", torch.float32).numpy()
    elif isinstance(audio, np.ndarray):
        data = np.asarray(audio)
    else:
        raise InputValueError(f"audio must be a path, numpy array or tensor, not {type(audio).__name__}")
    where = f"{audio}: " if isinstance(audio, (str, Path)) else ""
    if data.size == 0:  # before mixing down: the mean of no samples is NaN (and a NumPy warning)
        raise InputValueError(f"{where}audio is empty (shape {tuple(data.shape)}, no samples)")
    if data.dtype.kind not in "fiu":
        raise InputValueError(f"audio has dtype {data.dtype}; expected float or integer PCM")
    if data.dtype.kind in "iu":  # integer PCM → [-1, 1)
        data = data.astype(np.float32) / float(2 ** (8 * data.dtype.itemsize - 1))
    mono = to_mono(data)
    if not np.isfinite(mono).all():
        raise InputValueError("audio contains NaN or Inf")
    sr = target_sr if sample_rate is None else int(sample_rate)
    if sr <= 0:
        raise InputValueError(f"sample_rate must be positive, got {sr}")
    return np.ascontiguousarray(resample(mono, sr, target_sr), dtype=np.float32)
