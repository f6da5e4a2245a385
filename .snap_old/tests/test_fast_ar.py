"""Fish S2 Pro `fast_ar`: the faithful module against a from-the-facts reference loop (STAGES.md §1.3: full
re-prefill of an 11-row buffer, host-side sampling the vLLM-Omni way, Gumbel-max on the same noise), strict
checkpoint loading in the real layout, the build passes, and the built artifact against eager."""

import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from ttsaot.builder.checkpoint import CheckpointError
from ttsaot.builder.families.fish_s2_pro import FAMILY as FISH
from ttsaot.builder.families.fish_s2_pro import checkpoint as fck
from ttsaot.builder.families.fish_s2_pro import config as fcfg
from ttsaot.builder.families.fish_s2_pro import fast_ar as far
from ttsaot.builder.families.fish_s2_pro import stages as fst
from ttsaot.builder.families.fish_s2_pro.options import FishS2Options
from ttsaot.builder.predictor import random_sampling_inputs
from ttsaot.runtime import load
from ttsaot.runtime.verify import verify_bundle

from .conftest import built_artifact, rel_err
from .test_sampling import reference_draw

FAMILY = FISH.name

CFG = fcfg.FAST_AR_PRESETS["tiny"]
START = CFG.semantic_start_token_id


@pytest.fixture(scope="module")
def model():
    return fck.init_random_fast_ar(far.FastAR(CFG, with_embedding=True), seed=0)  # = the artifact's weights (seed 0)


@pytest.fixture(scope="module")
def ckpt(model, tmp_path_factory):
    return fck.write_fast_ar_checkpoint(model, tmp_path_factory.mktemp("s2pro-tiny"))


@pytest.fixture(scope="session")
def fast_ar_fp32():
    from ttsaot.builder.build import build_family

    def build(root):
        opts = FishS2Options(dtype=torch.float32, batch_buckets=(4,), fast_ar_with_embedding=True)
        return build_family(FAMILY, [fst.fast_ar_stage(opts)], root, "cpu").path

    return built_artifact("fish-fast-ar-fp32", build)


def _inputs(B, seed, T=None, k=None, p=None):
    g = torch.Generator().manual_seed(seed)
    token = torch.randint(START, START + CFG.vocab_size, (B,), generator=g)
    token[torch.rand(B, generator=g) < 0.25] = 151645  # non-semantic rows
    samp = random_sampling_inputs(B, CFG.num_codebooks - 1, CFG.residual_codebook_size, g)
    if T is not None:
        samp["temperature"] = torch.full((B,), float(T))
    if k is not None:
        samp["top_k"] = torch.full((B,), int(k))
    if p is not None:
        samp["top_p"] = torch.full((B,), float(p))
    return {
        "hidden": torch.randn(B, CFG.dim, generator=g) * 2,
        "token": token,
        **samp,
        "token_embed": torch.randn(B, CFG.dim, generator=g),
    }


def _args(x):
    return [x[n] for n in ("hidden", "token", "noise", "temperature", "top_k", "top_p", "token_embed")]


# ------------------------------------------------------------------ the reference, written from the facts
def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, cis):
    """x [B,L,H,hd]; cis complex [L, hd/2]: pairs (x[2i], x[2i+1]) rotate as complex numbers."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * cis[None, :, None, :]).flatten(-2)


def reference_frame(W, cfg, hidden, token, noise, T, k, p, token_embed):
    """Full re-prefill of a [B,11,D] buffer per step (cache-free, causal), host sampling row by row."""
    H, Hkv, hd, D = cfg.n_head, cfg.n_local_heads, cfg.head_dim, cfg.dim
    inv = 1.0 / cfg.rope_base ** (torch.arange(0, hd, 2).float() / hd)
    ang = torch.outer(torch.arange(cfg.max_seq_len).float(), inv)
    cis = torch.complex(ang.cos().bfloat16().float(), ang.sin().bfloat16().float())  # bf16-rounded caches
    B, L = hidden.shape[0], cfg.max_seq_len
    emb = W["audio_decoder.embeddings.weight"]

    def forward(buf):
        x = buf
        mask = torch.ones(L, L, dtype=torch.bool).tril()
        for i in range(cfg.n_layer):
            pre = f"audio_decoder.layers.{i}."
            h = _rms(x, W[pre + "attention_norm.weight"], cfg.rms_norm_eps)
            q, kk, v = (h @ W[pre + "attention.wqkv.weight"].T).split((H * hd, Hkv * hd, Hkv * hd), -1)
            q = _rope(q.view(B, L, H, hd), cis).transpose(1, 2)
            kk = _rope(kk.view(B, L, Hkv, hd), cis).transpose(1, 2).repeat_interleave(H // Hkv, 1)
            v = v.view(B, L, Hkv, hd).transpose(1, 2).repeat_interleave(H // Hkv, 1)
            att = ((q @ kk.transpose(-1, -2)) / math.sqrt(hd)).masked_fill(~mask, float("-inf")).softmax(-1)
            x = x + (att @ v).transpose(1, 2).reshape(B, L, H * hd) @ W[pre + "attention.wo.weight"].T
            h = _rms(x, W[pre + "ffn_norm.weight"], cfg.rms_norm_eps)
            ff = F.silu(h @ W[pre + "feed_forward.w1.weight"].T) * (h @ W[pre + "feed_forward.w3.weight"].T)
            x = x + ff @ W[pre + "feed_forward.w2.weight"].T
        return _rms(x, W["audio_decoder.norm.weight"], cfg.rms_norm_eps)

    code0 = (token - cfg.semantic_start_token_id).clamp(0, cfg.vocab_size - 1)
    buf = torch.zeros(B, L, D)
    buf[:, 0], buf[:, 1] = hidden, emb[code0]
    codes, logits_all = [code0], []
    for s in range(1, cfg.num_codebooks):
        logits = (forward(buf)[:, s] @ W["audio_decoder.output.weight"].T)[:, : cfg.residual_codebook_size]
        code = torch.tensor(
            [reference_draw(logits[b], noise[b, s - 1], float(T[b]), int(k[b]), float(p[b])) for b in range(B)]
        )
        codes.append(code)
        logits_all.append(logits)
        if s + 1 < L:
            buf[:, s + 1] = emb[code]
    codes = torch.stack(codes, 1)
    table = W["audio_decoder.codebook_embeddings.weight"]
    summed = table[codes + torch.arange(cfg.num_codebooks) * cfg.codebook_size].sum(1)
    semantic = (token >= cfg.semantic_start_token_id) & (token < cfg.semantic_start_token_id + cfg.vocab_size)
    nxt = torch.where(semantic[:, None], (token_embed + summed) / math.sqrt(cfg.num_codebooks + 1), token_embed)
    return codes, logits_all, nxt


# ------------------------------------------------------------------------------------------- module tests
@pytest.mark.parametrize(
    "seed,T,k,p", [(0, None, None, None), (1, 0.8, 30, 0.9), (2, 0.0, 0, 1.0), (3, 1.2, 4, 1.0), (4, 1.0, 0, 0.6)]
)
def test_module_matches_reference_loop(model, ckpt, seed, T, k, p):
    W = load_file(str(ckpt / "model.safetensors"))
    x = _inputs(6, seed, T, k, p)
    with torch.no_grad():
        codes, emb = model(*_args(x))
        _, logits = model.decode(x["hidden"], x["token"], lambda s, lg: codes[:, s])
    ref_codes, ref_logits, ref_emb = reference_frame(W, CFG, *_args(x))
    assert codes.shape == (6, CFG.num_codebooks) and codes.dtype == torch.int64
    assert torch.equal(codes, ref_codes)
    for a, b in zip(logits, ref_logits):  # teacher-forced on the same codes
        assert rel_err(a, b) < 1e-5
    assert rel_err(emb, ref_emb) < 1e-6
    assert ((codes[:, 1:] >= 0) & (codes[:, 1:] < CFG.residual_codebook_size)).all()


def test_code0_and_plain_embedding_for_non_semantic_tokens(model):
    x = _inputs(4, 9)
    x["token"] = torch.tensor([START - 33, START, START + 5, START + CFG.vocab_size + 7])
    with torch.no_grad():
        codes, emb = model(*_args(x))
    assert codes[:, 0].tolist() == [0, 0, 5, CFG.vocab_size - 1]
    assert torch.equal(emb[0], x["token_embed"][0]) and torch.equal(emb[3], x["token_embed"][3])
    assert not torch.allclose(emb[1], x["token_embed"][1])


def test_checkpoint_roundtrip_is_strict(model, ckpt, tmp_path):
    loaded, report = fck.load_fast_ar(ckpt, fcfg.fast_ar_config_from_checkpoint(ckpt), with_embedding=True)
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    assert report["ignored"]["tensors"] == 1  # text_model.*
    plain, rep2 = fck.load_fast_ar(ckpt, CFG, with_embedding=False)
    assert list(rep2["dropped"]) == ["audio_decoder.codebook_embeddings.weight"]
    assert not hasattr(plain, "codebook_embeddings")
    from safetensors.torch import save_file

    W = load_file(str(ckpt / "model.safetensors"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((ckpt / "config.json").read_text())
    save_file(
        {**W, "audio_decoder.layers.0.attention.q_norm.weight": torch.ones(CFG.head_dim)},
        str(bad / "model.safetensors"),
    )
    with pytest.raises(CheckpointError, match="q_norm"):
        fck.load_fast_ar(bad, CFG, with_embedding=True)
    W.pop("audio_decoder.layers.0.feed_forward.w3.weight")
    save_file(W, str(bad / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing key 'layers.0.mlp.up_proj.weight'"):
        fck.load_fast_ar(bad, CFG, with_embedding=True)


def test_passes_prune_and_fuse_without_changing_codes(model):
    import copy

    from ttsaot.builder.passes import fuse_projections

    m = copy.deepcopy(model)
    rep = far.prune_fast_ar(m)
    fuse_projections(m)
    R, D, nc = CFG.residual_codebook_size, CFG.dim, CFG.num_codebooks
    assert rep["dropped"] == {
        "output": (CFG.vocab_size - R) * D,
        "codebook_embeddings": (nc - 1) * (CFG.codebook_size - R) * D,
    }
    names = set(m.state_dict())
    assert "layers.0.mlp.gate_up_proj.weight" in names and "layers.0.mlp.gate_proj.weight" not in names
    assert "layers.0.self_attn.qkv_proj.weight" in names and "layers.0.self_attn.q_proj.weight" not in names
    for seed in range(3):
        x = _inputs(8, 100 + seed)
        with torch.no_grad():
            c0, e0 = model(*_args(x))
            c1, e1 = m(*_args(x))
        assert torch.equal(c0, c1)
        assert rel_err(e1, e0) < 1e-6


def test_full_config_parameter_counts():
    """STAGES.md §1.3: 424 696 320 params; pruning drops 7 864 320 output rows (and 3/4 of books 1..9)."""
    with torch.device("meta"):
        m = far.FastAR(fcfg.FAST_AR_PRESETS["full"], with_embedding=True)
    n = {k: v.numel() for k, v in m.state_dict().items()}
    assert sum(v for k, v in n.items() if not k.startswith("codebook_embeddings")) == 424_696_320
    assert n["codebook_embeddings.weight"] == 104_857_600
    cfg = fcfg.FAST_AR_PRESETS["full"]
    assert (cfg.vocab_size - cfg.residual_codebook_size) * cfg.dim == 7_864_320


# ------------------------------------------------------------------------------------------ artifact tests
@pytest.fixture(scope="module")
def stage(fast_ar_fp32):
    return load(fast_ar_fp32)["fast_ar"]


@pytest.mark.parametrize(
    "B,seed,T,k,p",
    [
        (1, 0, None, None, None),
        (4, 1, 0.8, 30, 0.9),
        (3, 2, 0.0, 0, 1.0),
        (2, 3, 1.3, 3, 1.0),
        (4, 4, 0.9, 0, 0.5),
        (6, 5, None, None, None),
    ],
)
def test_artifact_codes_equal_eager(stage, model, B, seed, T, k, p):
    """Same noise ⇒ identical codes; B < 4 pads to the bucket (padded rows dropped), B=6 splits 4 + 2."""
    x = _inputs(B, seed, T, k, p)
    codes, emb = stage(*_args(x))
    with torch.no_grad():
        ref_codes, ref_emb = model(*_args(x))
    assert codes.shape == (B, CFG.num_codebooks)
    assert torch.equal(codes, ref_codes)
    assert rel_err(emb, ref_emb) < 1e-5


def test_generate_is_reproducible_per_request(stage, model):
    g = torch.Generator().manual_seed(0)
    hidden, token = torch.randn(3, CFG.dim, generator=g), torch.randint(START, START + 100, (3,), generator=g)
    te = torch.randn(3, CFG.dim, generator=g)
    a = stage.generate(
        hidden, token, temperature=0.9, top_k=20, top_p=1.0, generator=torch.Generator().manual_seed(7), token_embed=te
    )
    b = stage.generate(
        hidden, token, temperature=0.9, top_k=20, top_p=1.0, generator=torch.Generator().manual_seed(7), token_embed=te
    )
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    # the same noise through the eager module
    noise = torch.rand(
        (3, CFG.num_codebooks - 1, CFG.residual_codebook_size), generator=torch.Generator().manual_seed(7)
    )
    with torch.no_grad():
        ref = model(hidden, token, noise, torch.full((3,), 0.9), torch.full((3,), 20), torch.ones(3), te)
    assert torch.equal(a[0], ref[0])
    # one generator per row: a request's codes do not depend on what it is batched with
    gens = [torch.Generator().manual_seed(s) for s in (11, 12, 13)]
    batched = stage.generate(
        hidden, token, temperature=[0.7, 1.1, 0.0], top_p=[0.9, 1.0, 1.0], generator=gens, token_embed=te
    )[0]
    alone = stage.generate(
        hidden[1:2],
        token[1:2],
        temperature=1.1,
        top_p=1.0,
        generator=torch.Generator().manual_seed(12),
        token_embed=te[1:2],
    )[0]
    assert torch.equal(batched[1:2], alone)
    with pytest.raises(ValueError, match="top_p"):
        stage.generate(hidden, token, top_p=0.0, token_embed=te)
    # unset parameters take the family's serving defaults (T 0.8, top-k 30, top-p 0.9)
    d = stage.generate(hidden, token, generator=torch.Generator().manual_seed(7), token_embed=te)[0]
    e = stage.generate(
        hidden, token, temperature=0.8, top_k=30, top_p=0.9, generator=torch.Generator().manual_seed(7), token_embed=te
    )[0]
    assert torch.equal(d, e)


def test_artifact_golden_and_manifest(stage, fast_ar_fp32):
    results = verify_bundle(load(fast_ar_fp32))
    assert results and all(r.ok for r in results), [r for r in results if not r.ok]
    assert {r.case for r in results} == {"b4", "b1"}  # b1: off-bucket, padded
    e = stage.entry
    assert e.kind == "codebook_predictor" and [b.sizes["batch"] for b in e.buckets] == [4]
    assert [s.name for s in e.inputs] == ["hidden", "token", "noise", "temperature", "top_k", "top_p", "token_embed"]
    dropped = e.passes[0]["dropped"]
    assert dropped["output"] == (CFG.vocab_size - CFG.residual_codebook_size) * CFG.dim
    shapes = [tuple(c.shape) for c in e.constants.values()]
    assert (CFG.residual_codebook_size, CFG.dim) in shapes  # the pruned head
    packed = CFG.codebook_size + (CFG.num_codebooks - 1) * CFG.residual_codebook_size
    assert (packed, CFG.dim) in shapes  # the pruned codebook table
    assert (CFG.num_codebooks * CFG.codebook_size, CFG.dim) not in shapes


@pytest.mark.parametrize("token", [-1, 10**9])
def test_tokens_outside_the_text_vocabulary_are_refused(stage, token):
    """Non-semantic slow-AR tokens keep upstream's clamp (code 0 = the nearest semantic code); ids that are no
    token at all are an InputRangeError instead of a silent clamp."""
    from ttsaot.runtime.errors import InputRangeError

    hidden, te = torch.randn(2, CFG.dim), torch.randn(2, CFG.dim)
    with pytest.raises(InputRangeError, match="token"):
        stage.generate(hidden, torch.tensor([START, token]), token_embed=te)
    codes, _ = stage.generate(hidden, torch.tensor([START, 151645]), token_embed=te)  # <|im_end|>: clamped
    assert codes[1, 0] == 0
