"""Parity with the upstream `qwen-tts` code predictor (`Qwen3TTSTalkerCodePredictorModelForConditionalGeneration`):
the same random weights saved in the real `model.safetensors` layout and loaded strictly into their module; fp32
on CPU. Logits (teacher-forced on the same codes) within 1e-4; greedy codes from their HF `generate` identical to
our built artifact's."""

import importlib.machinery
import sys
import types

import pytest
import torch
from safetensors.torch import load_file

from ttsaot.builder.families.qwen3_tts_12hz import checkpoint as qck
from ttsaot.builder.families.qwen3_tts_12hz import code_predictor as qpm
from ttsaot.builder.families.qwen3_tts_12hz import config as qcfg
from ttsaot.runtime import load

from ..conftest import rel_err
from ..test_code_predictor import code_predictor_fp32  # noqa: F401  (shared session artifact)
from .upstream import import_upstream

pytestmark = pytest.mark.oracle

CFG = qcfg.CODE_PREDICTOR_PRESETS["tiny"]
NG = CFG.num_code_groups


def _stub(name: str, **attrs) -> None:
    """modeling_qwen3_tts imports librosa (mel filters) and the tokenizer package at module level; neither is
    used by the code predictor, so stand-ins are enough when they are not installed."""
    if name in sys.modules:
        return
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None)
    m.__path__ = []
    m.__dict__.update(attrs)
    sys.modules[name] = m


@pytest.fixture(scope="module")
def upstream_mod():
    pytest.importorskip("transformers")
    try:
        import librosa.filters  # noqa: F401
    except ImportError:  # not installed, or another test's stand-in `librosa` without `filters` (bench voxcpm-loop)
        _stub("librosa.filters", mel=lambda *a, **k: None)
        _stub("librosa", filters=sys.modules["librosa.filters"])
        sys.modules["librosa"].filters = sys.modules["librosa.filters"]
    try:
        import soundfile  # noqa: F401
    except (ImportError, OSError):
        _stub("soundfile")
    cfg_mod = import_upstream("qwen_tts.core.models.configuration_qwen3_tts")
    _stub("qwen_tts.inference")
    _stub("qwen_tts.inference.qwen3_tts_tokenizer", Qwen3TTSTokenizer=object)
    return cfg_mod, import_upstream("qwen_tts.core.models.modeling_qwen3_tts")


@pytest.fixture(scope="module")
def pair(upstream_mod, tmp_path_factory):
    """(ours, theirs): our faithful module (the artifact's weights, seed 0) and upstream loaded from the
    checkpoint file we wrote in the real layout."""
    cfg_mod, model_mod = upstream_mod
    ours = qck.init_random_code_predictor(qpm.CodePredictor(CFG, with_embedding=True), seed=0)
    ck = qck.write_code_predictor_checkpoint(ours, tmp_path_factory.mktemp("qwen3-tts-tiny"))
    up_cfg = cfg_mod.Qwen3TTSTalkerCodePredictorConfig(
        vocab_size=CFG.vocab_size,
        hidden_size=CFG.hidden_size,
        intermediate_size=CFG.intermediate_size,
        num_hidden_layers=CFG.num_hidden_layers,
        num_attention_heads=CFG.num_attention_heads,
        num_key_value_heads=CFG.num_key_value_heads,
        head_dim=CFG.head_dim,
        rms_norm_eps=CFG.rms_norm_eps,
        rope_theta=CFG.rope_theta,
        num_code_groups=NG,
        max_position_embeddings=64,
    )
    up_cfg._attn_implementation = "eager"
    theirs = model_mod.Qwen3TTSTalkerCodePredictorModelForConditionalGeneration(
        up_cfg, types.SimpleNamespace(hidden_size=CFG.talker_hidden_size)
    ).eval()
    W = load_file(str(ck / "model.safetensors"))
    pre = "talker.code_predictor."
    theirs.load_state_dict({k[len(pre) :]: v for k, v in W.items() if k.startswith(pre)}, strict=True)
    return ours, theirs, W["talker.model.codec_embedding.weight"]


def _embeds(theirs, talker_table, hidden, codes):
    """The upstream input rows: talker hidden, talker codec embedding of code0, predictor embeddings of 1..14."""
    rows = [hidden[:, None], talker_table[codes[:, 0]][:, None]]
    rows += [theirs.model.codec_embedding[i - 1](codes[:, i : i + 1]) for i in range(1, NG - 1)]
    return torch.cat(rows, dim=1)


def test_teacher_forced_logits_match_upstream(pair):
    ours, theirs, table = pair
    g = torch.Generator().manual_seed(0)
    B = 3
    hidden = torch.randn(B, CFG.talker_hidden_size, generator=g)
    codes = torch.randint(0, CFG.vocab_size, (B, NG), generator=g)
    with torch.no_grad():
        _, logits, _ = ours.decode(hidden, codes[:, 0], lambda s, lg: codes[:, s])
        ref = theirs.forward_finetune(inputs_embeds=_embeds(theirs, table, hidden, codes)).logits  # [B,15,V]
    assert ref.shape == (B, NG - 1, CFG.vocab_size)
    for s in range(NG - 1):
        assert rel_err(logits[s], ref[:, s]) <= 1e-4, s
    assert rel_err(torch.stack(logits, 1), ref) <= 1e-5


def test_greedy_codes_match_upstream_generate(pair, code_predictor_fp32):  # noqa: F811
    ours, theirs, table = pair
    stage = load(code_predictor_fp32)["code_predictor"]
    g = torch.Generator().manual_seed(1)
    B = 4
    hidden = torch.randn(B, CFG.talker_hidden_size, generator=g)
    code0 = torch.randint(0, CFG.vocab_size, (B,), generator=g)
    codes, _ = stage.generate(hidden, code0, temperature=0.0, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        first = torch.cat((hidden[:, None], table[code0][:, None]), dim=1)
        out = theirs.generate(
            inputs_embeds=first,
            max_new_tokens=NG - 1,
            do_sample=False,
            return_dict_in_generate=True,
            pad_token_id=0,
            eos_token_id=None,
        )
    theirs_codes = torch.cat((code0[:, None], out.sequences[:, -(NG - 1) :]), dim=1)
    assert torch.equal(codes, theirs_codes)
    assert len(set(codes[:, 1:].flatten().tolist())) > 3  # not a degenerate constant sequence
