"""Qwen3-TTS code2wav module: passes preserve the math, strict checkpoint loading in the real layout."""

import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from ttsaot.builder.checkpoint import CheckpointError
from ttsaot.builder.families.qwen3_tts_12hz import checkpoint as qck
from ttsaot.builder.families.qwen3_tts_12hz import code2wav as qm
from ttsaot.builder.families.qwen3_tts_12hz import config as qcfg
from ttsaot.builder.passes import bake_snake, fuse_projections

from .conftest import rel_err


@pytest.fixture(scope="module")
def tiny_model():
    return qck.init_random_code2wav(qm.Code2Wav(qcfg.CODE2WAV_PRESETS["tiny"]), seed=3)


def _codes(B=2, F=12, seed=0):
    cfg = qcfg.CODE2WAV_PRESETS["tiny"]
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.codebook_size, (B, cfg.num_quantizers, F), generator=g)


def test_topology_matches_the_real_decoder(tiny_model):
    from ttsaot.builder.layers import SnakeBeta

    assert sum(isinstance(m, SnakeBeta) for m in tiny_model.modules()) == 29
    full = qcfg.CODE2WAV_PRESETS["full"]
    assert full.samples_per_frame == 1920 and full.sliding_window == 72 and full.num_hidden_layers == 8


def test_output_shape_range_dtype(tiny_model):
    y = tiny_model(_codes())
    cfg = qcfg.CODE2WAV_PRESETS["tiny"]
    assert y.shape == (2, 1, 12 * cfg.samples_per_frame) and y.dtype == torch.float32
    assert y.abs().max() <= 1.0 and y.std() > 1e-3  # random weights still give a non-trivial signal


def test_passes_preserve_output(tiny_model):
    x = _codes()
    ref = tiny_model(x)
    m = copy.deepcopy(tiny_model)
    m.quantizer.bake_codebooks()
    assert rel_err(m(x), ref) < 1e-6
    bake_snake(m)
    fuse_projections(m)
    assert rel_err(m(x), ref) < 1e-5
    names = set(m.state_dict())
    assert not any(".q_proj." in n or ".gate_proj." in n for n in names)  # no duplicate weights kept
    assert any(".qkv_proj." in n for n in names) and any(".gate_up_proj." in n for n in names)
    assert not any("embedding_sum" in n for n in names)


def test_causal_prefix_invariance(tiny_model):
    # Right padding a request to a bucket must not change the samples of its real frames.
    x = _codes(1, 20)
    spf = qcfg.CODE2WAV_PRESETS["tiny"].samples_per_frame
    short = tiny_model(x[..., :13])
    long = tiny_model(x)
    assert rel_err(long[..., : 13 * spf], short) < 1e-6


def test_checkpoint_roundtrip_real_layout(tiny_model, tmp_path):
    tok = qck.write_code2wav_checkpoint(tiny_model, tmp_path)
    keys = set(load_file(str(tok / "model.safetensors")))
    assert "decoder.decoder.1.block.0.alpha" in keys
    assert "decoder.pre_transformer.layers.0.self_attn.q_proj.weight" in keys
    assert "decoder.quantizer.rvq_rest.vq.layers.14._codebook.embedding_sum" in keys
    model, report = qck.load_code2wav(tmp_path)
    assert report["ignored"]["tensors"] >= 1  # encoder.* never read
    assert set(report["dropped"]) == {
        "decoder.quantizer.rvq_first.input_proj.weight",
        "decoder.quantizer.rvq_rest.input_proj.weight",
    }
    x = _codes()
    assert torch.equal(model(x), tiny_model(x))
    assert qcfg.code2wav_config_from_checkpoint(tmp_path) == qcfg.CODE2WAV_PRESETS["tiny"]


def _rewrite(tok, fn):
    sd = load_file(str(tok / "model.safetensors"))
    fn(sd)
    save_file(sd, str(tok / "model.safetensors"))


def test_strict_loading_names_the_key(tiny_model, tmp_path):
    tok = qck.write_code2wav_checkpoint(tiny_model, tmp_path)
    _rewrite(tok, lambda sd: sd.pop("decoder.pre_conv.conv.bias"))
    with pytest.raises(CheckpointError, match="missing key 'pre_conv.conv.bias'"):
        qck.load_code2wav(tmp_path)
    tok = qck.write_code2wav_checkpoint(tiny_model, tmp_path)
    _rewrite(tok, lambda sd: sd.__setitem__("decoder.pre_conv.extra", torch.zeros(1)))
    with pytest.raises(CheckpointError, match="unexpected key 'pre_conv.extra'"):
        qck.load_code2wav(tmp_path)
    tok = qck.write_code2wav_checkpoint(tiny_model, tmp_path)
    _rewrite(tok, lambda sd: sd.__setitem__("talker.something", torch.zeros(1)))
    with pytest.raises(CheckpointError, match="unexpected key 'talker.something'"):
        qck.load_code2wav(tmp_path)
    tok = qck.write_code2wav_checkpoint(tiny_model, tmp_path)
    _rewrite(tok, lambda sd: sd.__setitem__("decoder.pre_conv.conv.bias", torch.zeros(3)))
    with pytest.raises(CheckpointError, match="shape"):
        qck.load_code2wav(tmp_path)


def test_config_from_json_reads_real_field_names(tmp_path):
    d = {
        "decoder_config": {
            "codebook_size": 2048,
            "hidden_size": 512,
            "num_attention_heads": 16,
            "head_dim": 64,
            "latent_dim": 1024,
            "codebook_dim": 512,
            "decoder_dim": 1536,
            "upsample_rates": [8, 5, 4, 3],
            "upsampling_ratios": [2, 2],
            "sliding_window": 72,
            "unrelated_field": 1,
        }
    }
    (tmp_path / "speech_tokenizer").mkdir()
    (tmp_path / "speech_tokenizer" / "config.json").write_text(json.dumps(d))
    cfg = qcfg.code2wav_config_from_checkpoint(tmp_path)
    assert cfg == qcfg.CODE2WAV_PRESETS["full"]
