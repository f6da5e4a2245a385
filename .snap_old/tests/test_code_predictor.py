"""Qwen3-TTS `code_predictor`: the faithful module (host-sampled loop, invalid code0 rows, strict checkpoint in
the real `model.safetensors` layout, passes, full-size parameter counts) and the built artifact against eager.
Parity with the upstream `qwen-tts` module is in tests/oracle/test_qwen_code_predictor_oracle.py."""

import copy

import pytest
import torch
from safetensors.torch import load_file, save_file

from ttsaot.builder.checkpoint import CheckpointError
from ttsaot.builder.families.qwen3_tts_12hz import FAMILY as QWEN
from ttsaot.builder.families.qwen3_tts_12hz import checkpoint as qck
from ttsaot.builder.families.qwen3_tts_12hz import code_predictor as qpm
from ttsaot.builder.families.qwen3_tts_12hz import config as qcfg
from ttsaot.builder.families.qwen3_tts_12hz import stages as qst
from ttsaot.builder.families.qwen3_tts_12hz.options import Qwen3TTSOptions
from ttsaot.builder.passes import fuse_projections
from ttsaot.builder.predictor import random_sampling_inputs
from ttsaot.runtime import load
from ttsaot.runtime.verify import verify_bundle

from .conftest import built_artifact, rel_err
from .test_sampling import reference_draw

CFG = qcfg.CODE_PREDICTOR_PRESETS["tiny"]
NG = CFG.num_code_groups


@pytest.fixture(scope="module")
def model():
    # = the artifact's weights
    return qck.init_random_code_predictor(qpm.CodePredictor(CFG, with_embedding=True), seed=0)


@pytest.fixture(scope="session")
def code_predictor_fp32():
    from ttsaot.builder.build import build_family

    def build(root):
        opts = Qwen3TTSOptions(dtype=torch.float32, batch_buckets=(4,), code_predictor_with_embedding=True)
        return build_family(QWEN.name, [qst.code_predictor_stage(opts)], root, "cpu").path

    return built_artifact("qwen-code-predictor-fp32", build)


def _inputs(B, seed, T=None, k=None, p=None):
    g = torch.Generator().manual_seed(seed)
    samp = random_sampling_inputs(B, NG - 1, CFG.vocab_size, g)
    for name, v, dt in (("temperature", T, torch.float32), ("top_k", k, torch.int64), ("top_p", p, torch.float32)):
        if v is not None:
            samp[name] = torch.full((B,), v, dtype=dt)
    return {
        "hidden": torch.randn(B, CFG.talker_hidden_size, generator=g),
        "code0": torch.randint(0, CFG.vocab_size, (B,), generator=g),
        **samp,
    }


def _args(x):
    return [x[n] for n in ("hidden", "code0", "noise", "temperature", "top_k", "top_p")]


@pytest.mark.parametrize("seed,T,k,p", [(0, None, None, None), (1, 0.9, 50, 1.0), (2, 0.0, 0, 1.0), (3, 1.3, 5, 0.8)])
def test_traced_sampler_equals_host_sampling_loop(model, seed, T, k, p):
    """The same loop with host-side sampling (row by row, the vLLM-Omni algorithm) gives the same codes."""
    x = _inputs(5, seed, T, k, p)
    with torch.no_grad():
        codes, emb = model(*_args(x))

        def host(step, logits):
            return torch.tensor(
                [
                    reference_draw(
                        logits[b],
                        x["noise"][b, step - 1],
                        float(x["temperature"][b]),
                        int(x["top_k"][b]),
                        float(x["top_p"][b]),
                    )
                    for b in range(5)
                ]
            )

        ref, _, summed = model.decode(x["hidden"], x["code0"], host, collect_embedding=True)
    assert codes.shape == (5, NG) and torch.equal(codes, ref)
    assert torch.equal(codes[:, 0], x["code0"])
    # the embedding output: talker row of code0 + the 15 predictor rows of codes 1..15
    want = model.talker_codec_embedding.weight[codes[:, 0]] + sum(
        model.model.codec_embedding[i].weight[codes[:, i + 1]] for i in range(NG - 1)
    )
    assert rel_err(emb, want) < 1e-6 and rel_err(summed, want) < 1e-6


def test_invalid_code0_rows_are_zeroed(model):
    x = _inputs(3, 7)
    x["code0"] = torch.tensor([CFG.vocab_size + 5, 3, CFG.talker_vocab_size - 1])  # special tokens (EOS…)
    with torch.no_grad():
        codes, emb = model(*_args(x))
    assert (codes[0] == 0).all() and (codes[2] == 0).all() and (emb[0] == 0).all() and (emb[2] == 0).all()
    assert codes[1, 0] == 3 and emb[1].abs().sum() > 0


def test_projection_only_when_talker_is_wider():
    assert isinstance(qpm.CodePredictor(CFG).small_to_mtp_projection, torch.nn.Linear)
    same = qcfg.CodePredictorConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=64,
        talker_hidden_size=32,
        talker_vocab_size=96,
    )
    m = qck.init_random_code_predictor(qpm.CodePredictor(same), 1)
    assert isinstance(m.small_to_mtp_projection, torch.nn.Identity)
    g = torch.Generator().manual_seed(0)
    x = {
        "hidden": torch.randn(2, 32, generator=g),
        "code0": torch.tensor([1, 2]),
        **random_sampling_inputs(2, NG - 1, 64, g),
    }
    with torch.no_grad():
        assert m(*_args(x)).shape == (2, NG)


def test_checkpoint_roundtrip_is_strict(model, tmp_path):
    ck = qck.write_code_predictor_checkpoint(model, tmp_path / "Qwen3-TTS-tiny")
    assert qcfg.has_code_predictor(ck) and not qcfg.has_code_predictor(tmp_path)
    cfg = qcfg.code_predictor_config_from_checkpoint(ck)
    assert cfg == CFG
    loaded, report = qck.load_code_predictor(ck, cfg, with_embedding=True)
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    assert report["ignored"]["tensors"] == 2  # talker.model.norm, speaker_encoder
    W = load_file(str(ck / "model.safetensors"))
    assert "talker.code_predictor.small_to_mtp_projection.bias" in W
    assert "talker.code_predictor.model.layers.0.self_attn.q_norm.weight" in W
    save_file(
        {**W, "talker.code_predictor.model.layers.0.self_attn.rotary.weight": torch.ones(2)},
        str(ck / "model.safetensors"),
    )
    with pytest.raises(CheckpointError, match="rotary"):
        qck.load_code_predictor(ck, cfg, with_embedding=True)
    W.pop("talker.model.codec_embedding.weight")
    save_file(W, str(ck / "model.safetensors"))
    with pytest.raises(CheckpointError, match="talker_codec_embedding"):
        qck.load_code_predictor(ck, cfg, with_embedding=True)


@pytest.mark.parametrize("with_embedding", [False, True])
def test_passes_prune_and_fuse_without_changing_codes(with_embedding):
    m0 = qck.init_random_code_predictor(qpm.CodePredictor(CFG, with_embedding), seed=3)
    m = copy.deepcopy(m0)
    rep = qpm.prune_code_predictor(m)
    fuse_projections(m)
    Ht = CFG.talker_hidden_size
    want = {"talker_codec_embedding": (CFG.talker_vocab_size - CFG.vocab_size) * Ht}
    if not with_embedding:
        want["model.codec_embedding.14"] = CFG.vocab_size * Ht
    assert rep["dropped"] == want
    names = set(m.state_dict())
    assert "model.layers.0.self_attn.qkv_proj.weight" in names and "model.layers.0.self_attn.k_proj.weight" not in names
    assert "model.layers.0.mlp.gate_up_proj.weight" in names and "model.layers.0.mlp.up_proj.weight" not in names
    for seed in range(3):
        x = _inputs(6, 50 + seed)
        with torch.no_grad():
            a, b = m0(*_args(x)), m(*_args(x))
        if with_embedding:
            assert torch.equal(a[0], b[0]) and rel_err(b[1], a[1]) < 1e-6
        else:
            assert torch.equal(a, b)


def test_full_config_parameter_counts():
    """STAGES.md §2.3: 141 570 304 (0.6B) and 175 125 760 (1.7B) predictor params; + the talker codec table."""
    for size, n_cp in (("0.6B", 141_570_304), ("1.7B", 175_125_760)):
        with torch.device("meta"):
            m = qpm.CodePredictor(qcfg.CODE_PREDICTOR_PRESETS[size], with_embedding=True)
        n = {k: v.numel() for k, v in m.state_dict().items()}
        assert sum(v for k, v in n.items() if not k.startswith("talker_")) == n_cp, size
        assert n["talker_codec_embedding.weight"] == 3072 * qcfg.CODE_PREDICTOR_PRESETS[size].talker_hidden_size


def test_family_lists_the_stage():
    assert "code_predictor" in QWEN.stages
    names = [s.name for s in QWEN.specs(Qwen3TTSOptions(dtype=torch.float32))]
    assert names == ["code2wav", "code_predictor"]
    full = qst.code_predictor_stage(Qwen3TTSOptions(preset="full", talker_size="1.7B"))
    assert full.config["talker_hidden_size"] == 2048 and full.dtype == torch.bfloat16


# ------------------------------------------------------------------------------------------ artifact tests
@pytest.fixture(scope="module")
def stage(code_predictor_fp32):
    return load(code_predictor_fp32)["code_predictor"]


@pytest.mark.parametrize(
    "B,seed,T,k,p",
    [
        (1, 0, None, None, None),
        (4, 1, 0.9, 50, 1.0),
        (3, 2, 0.0, 0, 1.0),
        (2, 3, 1.2, 4, 0.7),
        (5, 4, None, None, None),
    ],
)
def test_artifact_codes_equal_eager(stage, model, B, seed, T, k, p):
    x = _inputs(B, seed, T, k, p)
    if B >= 3:
        x["code0"][1] = CFG.vocab_size + 3  # an EOS-like row inside the batch
    codes, emb = stage(*_args(x))
    with torch.no_grad():
        ref_codes, ref_emb = model(*_args(x))
    assert codes.shape == (B, NG) and torch.equal(codes, ref_codes)
    assert rel_err(emb, ref_emb) < 1e-5


def test_generate_and_golden(stage, model, code_predictor_fp32):
    g = torch.Generator().manual_seed(1)
    hidden, code0 = torch.randn(2, CFG.talker_hidden_size, generator=g), torch.tensor([5, 9])
    codes, emb = stage.generate(hidden, code0, temperature=0.9, top_k=50, generator=torch.Generator().manual_seed(3))
    noise = torch.rand((2, NG - 1, CFG.vocab_size), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(hidden, code0, noise, torch.full((2,), 0.9), torch.full((2,), 50), torch.ones(2))
    assert torch.equal(codes, ref[0])
    assert stage.noise_shape == (NG - 1, CFG.vocab_size)
    results = verify_bundle(load(code_predictor_fp32))
    assert results and all(r.ok for r in results), [r for r in results if not r.ok]
    assert {r.case for r in results} == {"b4", "b1"}


@pytest.mark.parametrize("code0", [-1, 100_000])
def test_out_of_range_code0_is_refused(stage, code0):
    """Issue 19: code0 = -1 or 1e5 silently returned an all-zero row. Special talker tokens (≥ the predictor's
    vocabulary, < the talker's) keep upstream's zero row; anything outside the talker vocabulary is an error."""
    from ttsaot.runtime.errors import InputRangeError

    hidden = torch.randn(2, CFG.talker_hidden_size)
    with pytest.raises(InputRangeError, match="code0"):
        stage.generate(hidden, torch.tensor([3, code0]))
    codes, _ = stage.generate(hidden, torch.tensor([3, CFG.talker_vocab_size - 1]))
    assert (codes[1] == 0).all() and codes[0, 0] == 3
