"""Parity with the upstream `qwen-tts` speech tokenizer v2 decoder: same random weights saved in the real
`speech_tokenizer/model.safetensors` layout, our built artifact vs their module, fp32 on CPU."""

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
    ours = qck.init_random_code2wav(qm.Code2Wav(cfg), seed=11)
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

    opts = Qwen3TTSOptions(
        checkpoint=str(ckpt),
        dtype=torch.float32,
        batch_buckets=(2,),
        frame_buckets=(24,),
        streaming=StreamingConfig(24, 0, 0, 0),
    )
    art = build_family(QWEN.name, [qst.code2wav_stage(opts)], tmp_path / "art", "cpu").path
    stage = load(art)["code2wav"]
    g = torch.Generator().manual_seed(4)
    for F in (24, 17):
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
