"""Parity with the upstream `qwen-tts` speech tokenizer v2 decoder: same random weights saved in the real
`speech_tokenizer/model.safetensors` layout, our built artifact vs their module, fp32 on CPU."""

import os
from dataclasses import asdict

import pytest
import torch
from safetensors.torch import load_file

from ttsaot.builder.buckets import StreamingConfig
from ttsaot.builder.build import build_family
from ttsaot.builder.families.qwen3_tts_12hz import FAMILY as QWEN
from ttsaot.builder.families.qwen3_tts_12hz import checkpoint as qck
from ttsaot.builder.families.qwen3_tts_12hz import code2wav as qm
from ttsaot.builder.families.qwen3_tts_12hz import config as qcfg
from ttsaot.builder.families.qwen3_tts_12hz import stages as qst
from ttsaot.builder.families.qwen3_tts_12hz.options import Qwen3TTSOptions
from ttsaot.runtime import load

from ..conftest import rel_err
from .upstream import import_upstream

pytestmark = pytest.mark.oracle


@pytest.fixture(scope="module")
def upstream_modules():
    pytest.importorskip("transformers")
    cfg_mod = import_upstream("qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2")
    model_mod = import_upstream("qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2")
    return cfg_mod, model_mod


def test_artifact_matches_upstream_decoder(upstream_modules, tmp_path):
    cfg_mod, model_mod = upstream_modules
    cfg = qcfg.CODE2WAV_PRESETS["tiny"]
    ours = qck.init_random_code2wav(qm.Code2Wav(cfg), seed=0)  # the qwen_tiny_fp32 fixture's weights
    ckpt = tmp_path / "Qwen3-TTS-tiny"
    tok = qck.write_code2wav_checkpoint(ours, ckpt)

    d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}
    up_cfg = cfg_mod.Qwen3TTSTokenizerV2DecoderConfig(**d)
    up_cfg._attn_implementation = "sdpa"
    upstream = model_mod.Qwen3TTSTokenizerV2Decoder(up_cfg).eval()
    sd = {
        k[len("decoder.") :]: v
        for k, v in load_file(str(tok / "model.safetensors")).items()
        if k.startswith("decoder.")
    }
    upstream.load_state_dict(sd, strict=True)

    # the plan and streaming of tests/conftest.py `qwen_tiny_fp32`, through the run's package cache: the same
    # program as that fixture's (packages hold no weights), compiled once for both
    opts = Qwen3TTSOptions(
        checkpoint=str(ckpt),
        dtype=torch.float32,
        batch_buckets=(1, 2),
        frame_buckets=(8, 16, 48),
        streaming=StreamingConfig(16, 32, 0, 0),
    )
    cache = os.environ["TTSAOT_CACHE_DIR"]
    art = build_family(QWEN.name, [qst.code2wav_stage(opts)], tmp_path / "art", "cpu", cache_dir=cache).path
    stage = load(art)["code2wav"]
    g = torch.Generator().manual_seed(4)
    for F in (48, 17):  # a bucket length and one padded into the 48 bucket
        codes = torch.randint(0, cfg.codebook_size, (2, cfg.num_quantizers, F), generator=g)
        with torch.no_grad():
            ref = upstream(codes)
        out = stage(codes)
        assert out.shape == ref.shape
        assert ref.abs().max() < 1.0  # not saturated by the clamp: the comparison means something
        assert rel_err(out, ref) <= 1e-4, F
    # chunked decode agrees with upstream's own chunked_decode semantics at a long length too
    codes = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, 60), generator=g)
    with torch.no_grad():
        ref = upstream.chunked_decode(codes, chunk_size=24, left_context_size=0)
    out = stage.decode_chunked(codes, chunk_frames=24, left_context_frames=0)
    assert rel_err(out, ref) <= 1e-4
