"""Reference-audio preparation (runtime/audio.py): empty or bad audio is a typed error saying what is wrong, with
no library warning leaking to the caller."""

import warnings

import numpy as np
import pytest

from ttsaot.runtime.audio import prepare_audio
from ttsaot.runtime.errors import InputValueError


@pytest.mark.parametrize("shape", [(0,), (0, 2), (2, 0), (1, 2, 0)])
def test_empty_audio_says_so_without_warnings(shape):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NumPy's "Mean of empty slice" must not reach the caller
        with pytest.raises(InputValueError, match=r"audio is empty \(shape"):
            prepare_audio(np.zeros(shape, dtype=np.float32), 24000, 24000)


def test_empty_audio_file_is_named(tmp_path):
    sf = pytest.importorskip("soundfile")
    path = tmp_path / "silence.wav"
    sf.write(path, np.zeros((0, 2), dtype=np.float32), 22050)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputValueError, match=f"{path}: audio is empty"):
            prepare_audio(path, None, 44100)


def test_stereo_integer_pcm_is_mixed_and_scaled():
    x = np.stack([np.full(100, 16384, np.int16), np.zeros(100, np.int16)], axis=1)  # [T, C]
    out = prepare_audio(x, None, 24000)
    assert out.shape == (100,) and out.dtype == np.float32 and np.allclose(out, 0.25)
