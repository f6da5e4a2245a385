"""Every real checkpoint layout builds (issue 17): only the stages asked for (or held by the folder) are set up,
from folders the tests write in the real layout. The DAC config inferred from any consistent codec.pth is in
tests/test_fish_dac.py; the codec-only folder is also built end to end by tests/fish_fixtures.py."""

from __future__ import annotations

import json

import pytest
import torch

from ttsaot.builder.families import get_family
from ttsaot.builder.families.fish_s2_pro import checkpoint as fck
from ttsaot.builder.families.fish_s2_pro.config import DAC_PRESETS, FAST_AR_PRESETS
from ttsaot.builder.families.fish_s2_pro.dac import DAC
from ttsaot.builder.families.fish_s2_pro.fast_ar import FastAR
from ttsaot.builder.families.qwen3_tts_12hz import checkpoint as qck
from ttsaot.builder.families.qwen3_tts_12hz.code2wav import Code2Wav
from ttsaot.builder.families.qwen3_tts_12hz.config import CODE2WAV_PRESETS
from ttsaot.builder.families.voxcpm2 import checkpoint as vck
from ttsaot.builder.families.voxcpm2.config import (
    AUDIO_SECTIONS,
    LM_PRESETS,
    audio_config_from_checkpoint,
    lm_config_from_checkpoint,
)
from ttsaot.builder.families.voxcpm2.lm import VoxCPM2LM

FISH, QWEN = get_family("fish-s2-pro"), get_family("qwen3-tts-12hz")


@pytest.fixture(scope="module")
def codec_only(tmp_path_factory):
    d = tmp_path_factory.mktemp("s2-pro-codec")
    fck.write_codec_pth(fck.init_random_dac(DAC(DAC_PRESETS["tiny"]), seed=1), d / "codec.pth")
    return d


def test_a_codec_only_fish_folder_sets_up_the_dac_stages(codec_only):
    """`build fish-s2-pro --checkpoint DIR --stages dac_decoder` with only codec.pth in DIR failed with
    `DIR/config.json: config.json not found`: the Fast AR was set up before --stages filtered it."""
    opts = FISH.options(checkpoint=str(codec_only), frame_buckets=(8,), batch_buckets=(1,))
    [spec] = FISH.specs(opts, ["dac_decoder"])
    assert spec.name == "dac_decoder" and spec.config["n_codebooks"] == DAC_PRESETS["tiny"].n_codebooks
    assert FISH.default_stages(opts) == ("dac_decoder", "dac_encoder")
    with pytest.raises(FileNotFoundError, match="config.json"):
        FISH.specs(opts, ["fast_ar"])


def test_an_llm_only_fish_folder_sets_up_the_fast_ar(tmp_path):
    fck.write_fast_ar_checkpoint(fck.init_random_fast_ar(FastAR(FAST_AR_PRESETS["tiny"]), seed=1), tmp_path)
    opts = FISH.options(checkpoint=str(tmp_path))
    assert FISH.default_stages(opts) == ("fast_ar",)
    [spec] = FISH.specs(opts)
    assert spec.name == "fast_ar" and spec.checkpoint_report == {}  # the checkpoint is read at build time
    with pytest.raises(FileNotFoundError, match="codec.pth"):
        FISH.specs(opts, ["dac_decoder"])


def test_a_speech_tokenizer_folder_sets_up_code2wav(tmp_path):
    qck.write_code2wav_checkpoint(qck.init_random_code2wav(Code2Wav(CODE2WAV_PRESETS["tiny"])), tmp_path)
    for folder in (tmp_path, tmp_path / "speech_tokenizer"):
        opts = QWEN.options(checkpoint=str(folder), frame_buckets=(8,), batch_buckets=(1,))
        assert QWEN.default_stages(opts) == ("code2wav",)
        assert [s.name for s in QWEN.specs(opts)] == ["code2wav"]
    with pytest.raises(FileNotFoundError, match="config.json"):
        QWEN.specs(QWEN.options(checkpoint=str(tmp_path)), ["code_predictor"])


@pytest.mark.parametrize("stored", [None, False, True])
def test_voxcpm2_use_mup_defaults_to_upstreams(tmp_path, stored):
    """`lm_config` without `use_mup`: upstream's MiniCPM4Config takes True, and so do the LM and the audio
    stages here (one default); an explicit value is kept."""
    vck.write_lm_checkpoint(vck.init_random_lm(VoxCPM2LM(LM_PRESETS["tiny"], max_len=8)), tmp_path)
    cfg_path = tmp_path / "config.json"
    d = json.loads(cfg_path.read_text())
    d.update(json.loads(json.dumps(AUDIO_SECTIONS["tiny"])))
    d["lm_config"].pop("use_mup")
    if stored is not None:
        d["lm_config"]["use_mup"] = stored
    cfg_path.write_text(json.dumps(d))
    want = True if stored is None else stored
    lm = lm_config_from_checkpoint(tmp_path)
    audio = audio_config_from_checkpoint(tmp_path)
    assert lm.lm.use_mup is want and lm.residual.use_mup is want
    assert audio.encoder.use_mup is want and audio.dit.use_mup is want
    module, _ = vck.load_lm_stage_module("base_lm_step", tmp_path, lm, max_len=8)
    assert (module.base_lm.layers[0].branch_scale is not None) is want
    assert torch.isfinite(torch.stack([p.float().sum() for p in module.parameters()])).all()
