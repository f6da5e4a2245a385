"""The built tiny Fish DAC artifact (dac_decoder + dac_encoder, from a real-layout codec.pth) through the
runtime: every bucket vs eager, padding/splitting/streaming, code-range errors, the encoder's audio API."""

import json

import numpy as np
import pytest
import torch

from ttsaot.builder.families.fish_s2_pro import config as fcfg
from ttsaot.builder.families.fish_s2_pro import dac as fdac
from ttsaot.builder.families.fish_s2_pro import stages as fst
from ttsaot.runtime import InputDTypeError, InputRangeError, InputShapeError, InputValueError, load
from ttsaot.runtime.audio import AudioReadError
from ttsaot.runtime.verify import verify_bundle

from . import fish_fixtures
from .conftest import rel_err
from .fish_fixtures import tiny_codec

fish_dac_ckpt = fish_fixtures.fish_dac_ckpt  # session fixtures shared with the oracle tests
fish_dac_tiny = fish_fixtures.fish_dac_tiny

CFG = fcfg.DAC_PRESETS["tiny"]
SPF = CFG.samples_per_frame
SR = CFG.sample_rate


@pytest.fixture(scope="module")
def bundle(fish_dac_tiny):
    return load(fish_dac_tiny)


@pytest.fixture(scope="module")
def eager_dec():
    m = fdac.DACDecoder(CFG)
    m.load_state_dict(tiny_codec().state_dict())
    return m.eval()


@pytest.fixture(scope="module")
def eager_enc():
    m = fdac.DACEncoder(CFG)
    m.load_state_dict(tiny_codec().state_dict())
    return m.eval()


def _codes(B, F, seed=0):
    return fst.random_codes(CFG, B, F, torch.Generator().manual_seed(seed))


def _audio(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n) / SR
    tone = 0.4 * torch.sin(2 * torch.pi * 180 * t * (1 + 2 * t))
    return (tone + 0.05 * torch.randn(n, generator=g)).float()


def _eager(m, x):
    with torch.no_grad():
        return m(x)


# ------------------------------------------------------------------------------------------- decoder
def test_manifest_records_pruning_checkpoint_and_metadata(fish_dac_tiny):
    m = json.loads((fish_dac_tiny / "manifest.json").read_text())
    dec, enc = m["stages"]["dac_decoder"], m["stages"]["dac_encoder"]
    assert dec["kind"] == "codec_decoder" and enc["kind"] == "codec_encoder" and enc["dtype"] == "float32"
    assert dec["metadata"]["sample_rate"] == 44100 and dec["metadata"]["samples_per_frame"] == 2048
    assert dec["metadata"]["streaming"]["first_chunk_frames"] == 4
    assert {"encoder", "quantizer.pre_module", "quantizer.downsample"} <= set(dec["passes"][0]["dropped"])
    assert {"decoder", "quantizer.post_module", "quantizer.upsample"} <= set(enc["passes"][0]["dropped"])
    assert dec["checkpoint"]["ignored"]["tensors"] == 6 and dec["checkpoint"]["legacy_weight_norm"] == 20
    assert dec["checkpoint"]["params_after"]["params"] < dec["checkpoint"]["params_before"]["params"]
    assert dec["inputs"][0]["range"]["high"] == [4096] + [1024] * 9


def test_every_decoder_bucket_matches_eager(bundle, eager_dec):
    stage = bundle["dac_decoder"]
    assert [b["frames"] for b in stage.buckets] == [8, 16]
    for i, sizes in enumerate(stage.buckets):
        x = _codes(sizes["batch"], sizes["frames"], seed=i)
        out = stage(x)
        assert out.shape == (sizes["batch"], 1, sizes["frames"] * SPF) and out.dtype == torch.float32
        ref = _eager(eager_dec, x)
        assert 0.01 < ref.abs().max() < 0.99  # audio range, not saturated by tanh
        assert rel_err(out, ref) < 1e-5, sizes  # measured ~1e-7


def test_padding_batch_splitting_and_trimming(bundle, eager_dec):
    stage = bundle["dac_decoder"]
    assert stage.pick_bucket({"batch": 1, "frames": 9}).key == "b2_f16"
    for B, F in ((1, 5), (3, 11)):  # batch padded to 2; batch 3 split into 2 + 1
        x = _codes(B, F, seed=B * 10 + F)
        out = stage(x)
        assert out.shape == (B, 1, F * SPF)
        assert rel_err(out, _eager(eager_dec, x)) < 1e-5


def test_streaming_with_whole_history_equals_one_shot(bundle):
    stage = bundle["dac_decoder"]
    x = _codes(1, 16, seed=3)
    one_shot = stage(x)
    pieces = list(stage.stream(x.split(4, dim=-1), left_context_frames=16))  # Fish first-chunk pattern
    assert [p.shape[-1] for p in pieces] == [4 * SPF] * 4
    assert rel_err(torch.cat(pieces, -1), one_shot) < 1e-6


def test_long_requests_are_decoded_in_chunks(bundle):
    out = bundle["dac_decoder"](_codes(1, 30, seed=4))  # > the 16-frame bucket: chunks of 8 new + 8 context
    assert out.shape == (1, 1, 30 * SPF) and torch.isfinite(out).all()


@pytest.mark.parametrize("book,value", [(0, 4096), (1, 1024), (9, 4095), (0, -1), (5, -3)])
def test_out_of_range_codes_are_rejected(bundle, book, value):
    x = _codes(1, 8)
    x[0, book, 3] = value
    with pytest.raises(InputRangeError, match=f"codebook {book}"):
        bundle["dac_decoder"](x)


def test_valid_edge_codes_are_accepted(bundle):
    x = _codes(1, 8)
    x[0, 0, :] = 4095
    x[0, 1:, :] = 1023
    x[0, :, 0] = 0
    assert torch.isfinite(bundle["dac_decoder"](x)).all()


def test_golden_cases_verify(bundle):
    results = verify_bundle(bundle)
    assert results and all(r.ok for r in results), [r for r in results if not r.ok]
    codes = [r for r in results if r.stage == "dac_encoder"]
    assert codes and all(r.metric == "mismatches" and r.value == 0 for r in codes)


# ------------------------------------------------------------------------------------------- encoder
def test_encoder_matches_eager_codes_and_trims_to_the_real_length(bundle, eager_enc):
    stage = bundle["dac_encoder"]
    assert stage.buckets == [{"samples": 45056}]
    for n in (45056, 30_001, 2048, 1):
        a = _audio(n, seed=n)
        codes = stage.encode(a.numpy())
        assert codes.shape == (10, -(-n // SPF)) and codes.dtype == torch.int64
        assert torch.equal(codes, _eager(eager_enc, a.view(1, 1, -1))[0]), n
        assert codes[0].max() < 4096 and codes[1:].max() < 1024


def test_encoder_padding_does_not_change_the_codes_of_real_frames(bundle):
    stage = bundle["dac_encoder"]
    a = _audio(20_000, seed=5)
    ref = stage.encode(a)
    for n in (20_480, 40_000, 45_056):
        padded = stage.encode(torch.nn.functional.pad(a, (0, n - a.shape[0])))
        assert torch.equal(padded[:, : ref.shape[1]], ref), n


def test_generic_call_on_raw_wave_tensors(bundle, eager_enc):
    a = _audio(10_000, seed=6).view(1, 1, -1)
    codes = bundle["dac_encoder"](a)
    assert codes.shape == (1, 10, 5)
    assert torch.equal(codes, _eager(eager_enc, a))


def test_files_are_read_mixed_down_and_resampled(bundle, tmp_path):
    sf = pytest.importorskip("soundfile")
    soxr = pytest.importorskip("soxr")
    sr = 22050
    t = np.arange(int(0.7 * sr)) / sr
    stereo = np.stack([0.5 * np.sin(2 * np.pi * 220 * t), 0.3 * np.sin(2 * np.pi * 330 * t)], axis=1)
    path = tmp_path / "ref.wav"
    sf.write(path, stereo.astype(np.float32), sr, subtype="FLOAT")
    stage = bundle["dac_encoder"]
    from_file = stage.encode(path)
    mono = soxr.resample(
        stereo.astype(np.float32).mean(axis=1, dtype=np.float64).astype(np.float32), sr, SR, quality="HQ"
    )
    assert torch.equal(from_file, stage.encode(mono))
    assert from_file.shape[1] == -(-mono.shape[0] // SPF)
    # the same audio given as an array at its own rate, channels-first
    assert torch.equal(stage.encode(torch.from_numpy(stereo.T.copy()).float(), sample_rate=sr), from_file)


def test_silence_is_valid(bundle):
    codes = bundle["dac_encoder"].encode(np.zeros(5000, dtype=np.float32))
    assert codes.shape == (10, 3)


def test_encoder_input_errors(bundle, tmp_path):
    stage = bundle["dac_encoder"]
    with pytest.raises(InputValueError, match="empty"):
        stage.encode(np.zeros(0, dtype=np.float32))
    with pytest.raises(InputShapeError, match="longer than the largest bucket"):
        stage.encode(np.zeros(45_057, dtype=np.float32))
    with pytest.raises(InputShapeError, match="exceeds the largest bucket"):
        stage(torch.zeros(1, 1, 45_057))
    bad = _audio(3000).numpy()
    bad[100] = np.nan
    with pytest.raises(InputValueError, match="NaN"):
        stage.encode(bad)
    with pytest.raises(InputValueError, match="NaN"):
        stage(torch.from_numpy(bad).view(1, 1, -1))
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"this is not audio")
    with pytest.raises(AudioReadError, match="cannot read audio"):
        stage.encode(junk)
    with pytest.raises(AudioReadError, match="no such audio file"):
        stage.encode(tmp_path / "missing.wav")
    with pytest.raises(InputShapeError, match="channels"):
        stage.encode(np.zeros((100, 100), dtype=np.float32))
    with pytest.raises(InputDTypeError):
        stage(torch.zeros(1, 1, 100, dtype=torch.float64))
    # the stage stays usable after refusals
    assert stage.encode(_audio(3000)).shape == (10, 2)
