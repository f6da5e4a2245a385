"""Qwen3-TTS 12 Hz `code_predictor` (MTP, `talker.code_predictor`): codes 1..15 of a frame in one program.

talker hidden [B,Ht] + code0 [B] + noise → codes [B,16] (code 0 as given; codes 1..15 sampled on device with
runtime/sampling.py). Facts: shared/reference/STAGES.md §2.3.

Row 0 of the predictor input is proj(talker hidden), row 1 proj(talker.codec_embedding(code0)); step s reads
lm_head[s−1] at row s and appends proj(codec_embedding[s−1](code_s)). The reference re-prefills a 17-row buffer
per step and samples on the host; here the 16 positions are unrolled with an explicit KV cache and the sampler
traced in: one package (one CUDA graph) per batch bucket does a whole frame. The talker's own `codec_embedding`
row for code0 is looked up inside (its 2048 code rows only: code0 ≥ 2048, a special token such as EOS, yields
an all-zero row as in vLLM-Omni's talker_mtp). Optional second output (`code_predictor_with_embedding`): the
summed embedding talker_emb(code0) + Σ_s codec_embedding[s−1](code_s) [B,Ht] for the next talker step (the
caller adds the text-side embedding)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...runtime.artifact import sha256_of
from ...runtime.sampling import sample
from ..buckets import BucketPlan, batch_sizes
from ..checkpoint import KeyRules, load_strict, read_safetensors_selected
from ..layers.norms import RMSNorm
from ..layers.rope import rope_table
from ..layers.transformer import DecoderBlock
from ..passes import fuse_projections
from ..stage_spec import StageSpec
from .fish_fast_ar import off_bucket_batch, random_sampling_inputs, sampling_inputs

FAMILY = "qwen3-tts-12hz"


@dataclass(frozen=True)
class CodePredictorConfig:
    """`talker_config.code_predictor_config` (HF names) plus the two talker sizes it depends on."""

    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 5
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    vocab_size: int = 2048
    num_code_groups: int = 16
    talker_hidden_size: int = 1024          # 0.6B: 1024 (no projection); 1.7B: 2048
    talker_vocab_size: int = 3072

    @property
    def has_projection(self) -> bool:
        return self.talker_hidden_size != self.hidden_size

    @classmethod
    def from_json(cls, d: dict) -> CodePredictorConfig:
        talker = d.get("talker_config", d)
        cp = talker.get("code_predictor_config")
        if cp is None:
            raise ValueError("config.json has no talker_config.code_predictor_config")
        known = set(cls.__dataclass_fields__)
        kw: dict[str, Any] = {k: v for k, v in cp.items() if k in known and not k.startswith("talker_")}
        if "head_dim" not in cp:
            kw["head_dim"] = cp["hidden_size"] // cp["num_attention_heads"]
        if cp.get("hidden_act", "silu") != "silu":
            raise ValueError(f"code_predictor: hidden_act {cp['hidden_act']!r} is not supported (silu only)")
        if cp.get("rope_scaling") or cp.get("use_sliding_window"):
            raise ValueError("code_predictor: rope_scaling / sliding window are not the Qwen3-TTS predictor")
        kw["talker_hidden_size"] = talker["hidden_size"]
        kw["talker_vocab_size"] = talker.get("vocab_size", 3072)
        return cls(**kw)


PRESETS: dict[str, CodePredictorConfig] = {
    "0.6B": CodePredictorConfig(talker_hidden_size=1024),
    "1.7B": CodePredictorConfig(talker_hidden_size=2048),
    # Same topology (16 code groups, GQA 2:1, q/k norm, projection from a wider talker), small widths and one
    # layer: the 15 unrolled steps make AOTI compile time scale with the layer count (CPU CI budget).
    "tiny": CodePredictorConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=8, vocab_size=64, talker_hidden_size=48,
                                talker_vocab_size=96),
}


# --------------------------------------------------------------------------------------------- module
class _Inner(nn.Module):
    """`talker.code_predictor.model`."""

    def __init__(self, cfg: CodePredictorConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderBlock(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                         cfg.intermediate_size, cfg.rms_norm_eps, qk_norm=True, rope_style="neox")
            for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.codec_embedding = nn.ModuleList(nn.Embedding(cfg.vocab_size, cfg.talker_hidden_size)
                                             for _ in range(cfg.num_code_groups - 1))


class CodePredictor(nn.Module):
    """forward(hidden, code0, noise, temperature, top_k, top_p) → codes [B,16] (, next_embed [B,Ht])."""

    def __init__(self, cfg: CodePredictorConfig, with_embedding: bool = False) -> None:
        super().__init__()
        self.cfg, self.with_embedding = cfg, with_embedding
        self.model = _Inner(cfg)
        self.lm_head = nn.ModuleList(nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
                                     for _ in range(cfg.num_code_groups - 1))
        self.small_to_mtp_projection = (nn.Linear(cfg.talker_hidden_size, cfg.hidden_size, bias=True)
                                        if cfg.has_projection else nn.Identity())
        # `talker.model.codec_embedding`: the talker's table, for the code0 row.
        self.talker_codec_embedding = nn.Embedding(cfg.talker_vocab_size, cfg.talker_hidden_size)
        cos, sin = rope_table(cfg.head_dim, cfg.num_code_groups, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def decode(self, hidden: torch.Tensor, code0: torch.Tensor, pick,
               collect_embedding: bool = False) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor | None]:
        """`pick(step, logits [B,V]) → code [B]`. Returns codes [B,16] (invalid code0 rows zeroed), the logits
        of every step and, if asked, the summed talker-side embedding."""
        cfg = self.cfg
        dt = self.model.norm.weight.dtype
        valid = (code0 >= 0) & (code0 < cfg.vocab_size)
        emb0 = self.talker_codec_embedding(code0.clamp(0, cfg.vocab_size - 1))
        x = self.small_to_mtp_projection(torch.stack((hidden.to(dt), emb0), dim=1))       # rows 0, 1
        caches: list = [None] * len(self.model.layers)
        codes, all_logits, pos = [code0], [], 0
        summed = emb0 if collect_embedding else None
        for step in range(1, cfg.num_code_groups):
            T = x.shape[1]
            cos, sin = self.rope_cos[pos:pos + T], self.rope_sin[pos:pos + T]
            for i, layer in enumerate(self.model.layers):
                x, caches[i] = layer(x, cos, sin, caches[i])
            pos += T
            logits = self.lm_head[step - 1](self.model.norm(x[:, -1]))
            code = pick(step, logits)
            codes.append(code)
            all_logits.append(logits)
            if step < cfg.num_code_groups - 1 or collect_embedding:
                e = self.model.codec_embedding[step - 1](code)
                if collect_embedding:
                    summed = summed + e
                if step < cfg.num_code_groups - 1:
                    x = self.small_to_mtp_projection(e)[:, None]
        out = torch.where(valid[:, None], torch.stack(codes, dim=1), torch.zeros_like(code0)[:, None])
        if summed is not None:
            summed = torch.where(valid[:, None], summed, torch.zeros_like(summed))
        return out, all_logits, summed

    def forward(self, hidden, code0, noise, temperature, top_k, top_p):
        def pick(step, logits):
            return sample(logits, noise[:, step - 1], temperature, top_k, top_p)

        codes, _, summed = self.decode(hidden, code0, pick, collect_embedding=self.with_embedding)
        if not self.with_embedding:
            return codes
        return codes, summed.float()


def prune_code_predictor(m: CodePredictor) -> dict:
    """Drop what is never read: talker codec-embedding rows ≥ 2048 (special tokens: such rows are zeroed) and,
    without the embedding output, the last codec_embedding table (code 15's embedding is never fed back)."""
    cfg, dropped = m.cfg, {}
    if m.talker_codec_embedding.num_embeddings > cfg.vocab_size:
        W = m.talker_codec_embedding.weight.detach()
        dropped["talker_codec_embedding"] = (W.shape[0] - cfg.vocab_size) * W.shape[1]
        m.talker_codec_embedding = nn.Embedding.from_pretrained(W[:cfg.vocab_size].clone(), freeze=False)
    tables = m.model.codec_embedding
    if not m.with_embedding and len(tables) == cfg.num_code_groups - 1:
        dropped[f"model.codec_embedding.{len(tables) - 1}"] = tables[-1].weight.numel()
        m.model.codec_embedding = nn.ModuleList(list(tables)[:-1])
    return {"pass": "prune_code_predictor", "dropped_params": dropped}


# ------------------------------------------------------------------------------------------ checkpoint
# model.safetensors: `talker.code_predictor.*` is this module (HF names); the talker's codec_embedding gives the
# code0 row; the rest of the talker and the speaker encoder are other stages (never read).
CHECKPOINT_RULES = KeyRules(
    prefix="talker.code_predictor.",
    ignore_prefixes=("talker.model.layers.", "talker.model.norm.", "talker.model.text_embedding.",
                     "talker.model.rotary_emb.", "talker.text_projection.", "talker.codec_head.",
                     "speaker_encoder."),
    rename={"talker.model.codec_embedding.weight": "talker_codec_embedding.weight"},
)


def has_code_predictor(path: str | Path) -> bool:
    """True for a main Qwen3-TTS checkpoint dir (config.json with a talker), False for a speech tokenizer dir."""
    p = Path(path) / "config.json"
    try:
        return p.is_file() and "talker_config" in json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return False


def config_from_checkpoint(path: str | Path) -> CodePredictorConfig:
    p = Path(path) / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: config.json (model_type qwen3_tts) not found")
    return CodePredictorConfig.from_json(json.loads(p.read_text()))


def load_code_predictor(path: str | Path, cfg: CodePredictorConfig,
                        with_embedding: bool) -> tuple[CodePredictor, dict]:
    st = Path(path) / "model.safetensors"
    if not st.is_file():
        raise FileNotFoundError(f"{st}: model.safetensors (talker.*) not found")
    tensors, report = read_safetensors_selected(st, CHECKPOINT_RULES)
    model = CodePredictor(cfg, with_embedding)
    load_strict(model, tensors, report.pop("unknown"), source=str(st))
    report.update(sha256=sha256_of(st), path=str(st))
    return model.eval(), report


def init_random(model: CodePredictor, seed: int = 0) -> CodePredictor:
    """Deterministic random weights; lm heads scaled so logits spread over a few units (peaked distributions)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif "embedding" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                gain = 4.0 if name.startswith("lm_head") else 1.0
                p.copy_(torch.randn(p.shape, generator=g) * gain / math.sqrt(p.shape[1]))
    return model.eval()


def write_checkpoint(model: CodePredictor, out_dir: str | Path) -> Path:
    """Save in the real layout: <out>/config.json (talker_config.code_predictor_config) and model.safetensors
    with `talker.code_predictor.*`, `talker.model.codec_embedding.weight` and a token talker/speaker tensor."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg
    sd = {("talker.model.codec_embedding.weight" if k == "talker_codec_embedding.weight"
           else f"talker.code_predictor.{k}"): v.detach().contiguous() for k, v in model.state_dict().items()}
    sd["talker.model.norm.weight"] = torch.ones(cfg.talker_hidden_size)
    sd["speaker_encoder.fc.weight"] = torch.zeros(4, 4)
    save_file(sd, str(out / "model.safetensors"))
    cp = {k: v for k, v in asdict(cfg).items() if not k.startswith("talker_")}
    cp.update(hidden_act="silu", max_position_embeddings=65536, attention_bias=False, use_sliding_window=False)
    (out / "config.json").write_text(json.dumps({
        "model_type": "qwen3_tts", "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "talker_config": {"hidden_size": cfg.talker_hidden_size, "vocab_size": cfg.talker_vocab_size,
                          "num_code_groups": cfg.num_code_groups, "code_predictor_config": cp}}, indent=2))
    return out


# ------------------------------------------------------------------------------------------- stage spec
def _config(opts) -> CodePredictorConfig:
    if opts.checkpoint:
        return config_from_checkpoint(opts.checkpoint)
    if opts.preset == "tiny":
        return PRESETS["tiny"]
    size = getattr(opts, "talker_size", "0.6B")
    if size not in PRESETS or size == "tiny":
        raise ValueError(f"talker_size {size!r} must be one of 0.6B, 1.7B")
    return PRESETS[size]


def code_predictor_stage(opts) -> StageSpec:
    """`opts` is qwen3_tts.Qwen3TTSOptions."""
    cfg = _config(opts)
    with_emb = bool(getattr(opts, "code_predictor_with_embedding", False))
    report: dict = {}

    def make_module() -> nn.Module:
        if opts.checkpoint:
            model, rep = load_code_predictor(opts.checkpoint, cfg, with_emb)
            report.update(rep)
            return model
        report.update({"random_weights": True, "seed": opts.seed})
        return init_random(CodePredictor(cfg, with_emb), opts.seed)

    n_steps, V = cfg.num_code_groups - 1, cfg.vocab_size
    dtype = opts.dtype or torch.bfloat16

    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        B = sizes["batch"]
        code0 = torch.randint(0, V, (B,), generator=g)
        code0[torch.rand(B, generator=g) < 0.15] = min(V + 102, cfg.talker_vocab_size - 1)   # EOS-like row
        return {"hidden": torch.randn(B, cfg.talker_hidden_size, generator=g), "code0": code0,
                **random_sampling_inputs(B, n_steps, V, g, noise_dominated=dtype != torch.float32)}

    batches = batch_sizes(opts.max_batch, opts.batch_buckets)
    outputs = [{"name": "codes", "dtype": "int64", "shape": ["batch", cfg.num_code_groups]}]
    if with_emb:
        outputs.append({"name": "next_embed", "dtype": "float32", "shape": ["batch", cfg.talker_hidden_size]})
    return StageSpec(
        family=FAMILY, name="code_predictor", kind="codebook_predictor", make_module=make_module,
        passes=[prune_code_predictor, fuse_projections],
        plan=BucketPlan({"batch": batches}), make_inputs=make_inputs,
        inputs=[{"name": "hidden", "dtype": "float32", "shape": ["batch", cfg.talker_hidden_size]},
                {"name": "code0", "dtype": "int64", "shape": ["batch"], "pad": 0},
                *sampling_inputs(n_steps, V)],
        outputs=outputs, dtype=dtype,
        tolerance=1e-4 if dtype == torch.float32 else 2e-2,
        metadata={"num_codebooks": cfg.num_code_groups, "sampled_codebooks": n_steps, "noise_width": V,
                  "code0": {"from": "code0", "offset": 0, "size": V, "invalid_rows": "zeroed"},
                  "codebook_sizes": [V] * cfg.num_code_groups, "with_embedding": with_emb,
                  "sampling_defaults": {"temperature": 0.9, "top_k": 50, "top_p": 1.0}},
        config=asdict(cfg), checkpoint_report=report, golden_sizes=off_bucket_batch(batches),
    )


__all__ = ["PRESETS", "CodePredictor", "CodePredictorConfig", "code_predictor_stage", "init_random",
           "load_code_predictor", "prune_code_predictor", "write_checkpoint"]
