"""Fish S2 Pro `fast_ar`: the 4-layer codebook predictor, the whole per-frame loop in one exported program.

slow-AR hidden [B,D] (post-norm) + semantic token id [B] + noise → codes [B,10] (code0 = clamp(tok − 151678,
0, 4095), codes 1..9 sampled on device with runtime/sampling.py). Facts: shared/reference/STAGES.md §1.1–1.3.

The reference replays a one-position graph 10× and samples on the host in between; here positions 0..9 are
unrolled with an explicit KV cache (positions 0 and 1 in one causal pass, then one position per step), the
sampler is traced in, and one package (one CUDA graph) per batch bucket does a whole frame.

Optional second output (`fast_ar_with_embedding`, the talker_mtp contract of §1.2): the next slow-AR input
embedding, `(token_embed + Σ_i codebook_embeddings[code_i + 4096·i]) / √11` for semantic tokens and
`token_embed` otherwise. The 400 MiB text embedding table stays with the slow AR: the caller passes the plain
embedding of the token (`token_embed`, as vLLM-Omni's `preprocess` does); the stage carries only the pruned
codebook table (book 0: 4096 rows, books 1..9: the 1024 rows residual codes can reach)."""

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
from ..layers.rope import rope_table_interleaved
from ..layers.transformer import DecoderBlock
from ..passes import fuse_projections
from ..stage_spec import StageSpec

FAMILY = "fish-s2-pro"


@dataclass(frozen=True)
class FastARConfig:
    """`audio_decoder_config` of the HF config.json (Fish names), plus the top-level token ids."""

    dim: int = 2560
    n_head: int = 32
    n_local_heads: int = 8
    head_dim: int = 128
    n_layer: int = 4
    intermediate_size: int = 9728
    max_seq_len: int = 11
    rope_base: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    vocab_size: int = 4096                 # fast embeddings / output head rows (semantic codebook size)
    num_codebooks: int = 10
    attention_qk_norm: bool = False
    residual_codebook_size: int = 1024     # codebooks 1..9 (vLLM-Omni slices the logits to this)
    codebook_size: int = 4096              # text_config.codebook_size: row stride of codebook_embeddings
    semantic_start_token_id: int = 151678

    @classmethod
    def from_json(cls, d: dict) -> FastARConfig:
        a = d.get("audio_decoder_config", d)
        known = set(cls.__dataclass_fields__)
        kw: dict[str, Any] = {k: v for k, v in a.items() if k in known and k not in ("codebook_size",)}
        if "norm_eps" in a and "rms_norm_eps" not in a:        # the Fish codebase's name for it
            kw["rms_norm_eps"] = a["norm_eps"]
        if "codebook_size" in d.get("text_config", {}):
            kw["codebook_size"] = d["text_config"]["codebook_size"]
        if "semantic_start_token_id" in d:
            kw["semantic_start_token_id"] = d["semantic_start_token_id"]
        cfg = cls(**kw)
        if cfg.attention_qk_norm:
            raise ValueError("fast_ar: attention_qk_norm=True is not the S2 Pro Fast AR (no q/k norm)")
        return cfg


PRESETS: dict[str, FastARConfig] = {
    "full": FastARConfig(),
    # Same topology (10 codebooks, GQA 2:1, interleaved rope, residual slice), small widths and one layer (AOTI
    # compile time of the unrolled frame scales with the layer count): CPU tests.
    "tiny": FastARConfig(dim=64, n_head=4, n_local_heads=2, head_dim=16, n_layer=1, intermediate_size=128,
                         vocab_size=128, residual_codebook_size=32, codebook_size=128),
}


# --------------------------------------------------------------------------------------------- module
class FastAR(nn.Module):
    """forward(hidden, token, noise, temperature, top_k, top_p[, token_embed]) → codes [B,10] (, embed [B,D])."""

    def __init__(self, cfg: FastARConfig, with_embedding: bool = False) -> None:
        super().__init__()
        self.cfg, self.with_embedding = cfg, with_embedding
        self.layers = nn.ModuleList(
            DecoderBlock(cfg.dim, cfg.n_head, cfg.n_local_heads, cfg.head_dim, cfg.intermediate_size,
                         cfg.rms_norm_eps, qk_norm=False, rope_style="interleaved", fused_qkv=True)
            for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.rms_norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        if with_embedding:
            self.codebook_embeddings = nn.Embedding(cfg.num_codebooks * cfg.codebook_size, cfg.dim)
            self.register_buffer("codebook_offsets", torch.arange(cfg.num_codebooks) * cfg.codebook_size,
                                 persistent=False)
        cos, sin = rope_table_interleaved(cfg.head_dim, cfg.max_seq_len, cfg.rope_base, round_to=torch.bfloat16)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def decode(self, hidden: torch.Tensor, token: torch.Tensor, pick) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The per-frame loop; `pick(step, logits [B,R]) → code [B]` chooses each residual code. Returns codes
        [B,nc] and the residual logits of every step (fp32 eager reference for tests)."""
        cfg = self.cfg
        dt = self.norm.weight.dtype
        code0 = (token - cfg.semantic_start_token_id).clamp(0, cfg.vocab_size - 1)
        x = torch.stack((hidden.to(dt), self.embeddings(code0)), dim=1)            # positions 0, 1
        caches: list = [None] * len(self.layers)
        codes, all_logits, pos = [code0], [], 0
        for step in range(1, cfg.num_codebooks):
            T = x.shape[1]
            cos, sin = self.rope_cos[pos:pos + T], self.rope_sin[pos:pos + T]
            for i, layer in enumerate(self.layers):
                x, caches[i] = layer(x, cos, sin, caches[i])
            pos += T
            logits = self.output(self.norm(x[:, -1]))[:, : cfg.residual_codebook_size]
            code = pick(step, logits)
            codes.append(code)
            all_logits.append(logits)
            if step < cfg.num_codebooks - 1:
                x = self.embeddings(code)[:, None]
        return torch.stack(codes, dim=1), all_logits

    def next_input_embedding(self, token: torch.Tensor, codes: torch.Tensor,
                             token_embed: torch.Tensor) -> torch.Tensor:
        dt = self.norm.weight.dtype
        plain = token_embed.to(dt)
        summed = self.codebook_embeddings(codes + self.codebook_offsets[None, :]).sum(dim=1)
        mixed = (plain + summed) / math.sqrt(self.cfg.num_codebooks + 1)
        start = self.cfg.semantic_start_token_id
        is_semantic = (token >= start) & (token < start + self.cfg.vocab_size)
        return torch.where(is_semantic[:, None], mixed, plain).float()

    def forward(self, hidden, token, noise, temperature, top_k, top_p, token_embed=None):
        def pick(step, logits):
            return sample(logits, noise[:, step - 1], temperature, top_k, top_p)

        codes, _ = self.decode(hidden, token, pick)
        if not self.with_embedding:
            return codes
        return codes, self.next_input_embedding(token, codes, token_embed)


def prune_fast_ar(m: FastAR) -> dict:
    """Drop what is never read: output-head rows ≥ 1024 (only residual codes are predicted) and, with the
    embedding output, codebook-table rows ≥ 1024 of books 1..9. Offsets are rewritten to the packed table."""
    cfg = m.cfg
    R, dropped = cfg.residual_codebook_size, {}
    if m.output.out_features > R:
        dropped["output"] = (m.output.out_features - R) * cfg.dim
        head = nn.Linear(cfg.dim, R, bias=False)
        with torch.no_grad():
            head.weight.copy_(m.output.weight[:R])
        m.output = head
    if m.with_embedding and m.codebook_embeddings.num_embeddings == cfg.num_codebooks * cfg.codebook_size:
        W = m.codebook_embeddings.weight.detach()
        rows = [W[:cfg.codebook_size]] + [W[i * cfg.codebook_size: i * cfg.codebook_size + R]
                                          for i in range(1, cfg.num_codebooks)]
        packed = torch.cat(rows)
        dropped["codebook_embeddings"] = (W.shape[0] - packed.shape[0]) * cfg.dim
        m.codebook_embeddings = nn.Embedding.from_pretrained(packed.clone(), freeze=False)
        m.codebook_offsets = torch.tensor([0] + [cfg.codebook_size + (i - 1) * R
                                                 for i in range(1, cfg.num_codebooks)])
    return {"pass": "prune_fast_ar", "dropped_params": dropped}


# ------------------------------------------------------------------------------------------ checkpoint
def checkpoint_rules(cfg: FastARConfig, with_embedding: bool) -> KeyRules:
    """HF safetensors: `audio_decoder.*` is the Fast AR (Fish names, `wqkv` already fused: loaded as is);
    `text_model.*` is the slow AR (never read). Without the embedding output the slow-AR-side
    `codebook_embeddings` is known but unused (dropped, counted as pruned)."""
    ren = {"audio_decoder.norm.weight": "norm.weight", "audio_decoder.output.weight": "output.weight",
           "audio_decoder.embeddings.weight": "embeddings.weight"}
    per_layer = {"attention.wqkv": "self_attn.qkv_proj", "attention.wo": "self_attn.o_proj",
                 "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj",
                 "feed_forward.w2": "mlp.down_proj", "attention_norm": "input_layernorm",
                 "ffn_norm": "post_attention_layernorm"}
    for i in range(cfg.n_layer):
        for src, dst in per_layer.items():
            ren[f"audio_decoder.layers.{i}.{src}.weight"] = f"layers.{i}.{dst}.weight"
    drop: tuple[str, ...] = ()
    if with_embedding:
        ren["audio_decoder.codebook_embeddings.weight"] = "codebook_embeddings.weight"
    else:
        drop = (r"audio_decoder\.codebook_embeddings\.weight",)
    # Every module key comes from the table: a prefix-only match would silently accept an unknown tensor.
    return KeyRules(prefix="\0", ignore_prefixes=("text_model.",), drop_patterns=drop, rename=ren)


def config_from_checkpoint(path: str | Path) -> FastARConfig:
    p = Path(path) / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: config.json not found")
    return FastARConfig.from_json(json.loads(p.read_text()))


def _safetensors_files(path: Path) -> list[Path]:
    files = sorted(p for p in path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors (the S2 Pro LLM weights)")
    return files


def load_fast_ar(path: str | Path, cfg: FastARConfig, with_embedding: bool) -> tuple[FastAR, dict]:
    rules = checkpoint_rules(cfg, with_embedding)
    tensors: dict[str, torch.Tensor] = {}
    report: dict[str, Any] = {"ignored": {"tensors": 0, "params": 0}, "dropped": {}, "unknown": [], "files": []}
    for f in _safetensors_files(Path(path)):
        t, r = read_safetensors_selected(f, rules)
        tensors.update(t)
        report["ignored"]["tensors"] += r["ignored"]["tensors"]
        report["ignored"]["params"] += r["ignored"]["params"]
        report["dropped"].update(r["dropped"])
        report["unknown"] += r["unknown"]
        report["files"].append({"path": str(f), "sha256": sha256_of(f)})
    model = FastAR(cfg, with_embedding)
    load_strict(model, tensors, report.pop("unknown"), source=str(path))
    return model.eval(), report


def init_random(model: FastAR, seed: int = 0) -> FastAR:
    """Deterministic random weights; the output head is scaled so logits spread over a few units (peaked but
    not one-hot distributions, as a trained head gives), so sampling tests exercise top-k/top-p."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif "embeddings" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                gain = 4.0 if name == "output.weight" else 1.0
                p.copy_(torch.randn(p.shape, generator=g) * gain / math.sqrt(p.shape[1]))
    return model.eval()


def write_checkpoint(model: FastAR, out_dir: str | Path, seed: int = 0) -> Path:
    """Save in the real S2 Pro layout: config.json + model.safetensors with `audio_decoder.*` (Fish names, fused
    wqkv) and a token `text_model.*` tensor (never read); `codebook_embeddings` always present, as in the HF
    checkpoint."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg
    inverse = {v: k for k, v in checkpoint_rules(cfg, True).rename.items()}
    sd = {inverse[k]: v.detach().contiguous() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(seed + 1)
    sd.setdefault("audio_decoder.codebook_embeddings.weight",
                  torch.randn(cfg.num_codebooks * cfg.codebook_size, cfg.dim, generator=g))
    sd["text_model.model.norm.weight"] = torch.ones(cfg.dim)
    save_file(sd, str(out / "model.safetensors"))
    adc = {k: v for k, v in asdict(cfg).items()
           if k not in ("codebook_size", "semantic_start_token_id", "residual_codebook_size")}
    (out / "config.json").write_text(json.dumps({
        "model_type": "fish_qwen3_omni", "semantic_start_token_id": cfg.semantic_start_token_id,
        "semantic_end_token_id": cfg.semantic_start_token_id + cfg.vocab_size - 1,
        "text_config": {"model_type": "fish_qwen3", "dim": cfg.dim, "codebook_size": cfg.codebook_size,
                        "num_codebooks": cfg.num_codebooks},
        "audio_decoder_config": {"model_type": "fish_qwen3_audio_decoder", **adc}}, indent=2))
    return out


# ------------------------------------------------------------------------------------------- stage spec
def sampling_inputs(n_steps: int, width: int) -> list[dict]:
    """I/O descriptors shared by the codebook predictors: noise + per-row sampling parameters (pads keep padded
    rows finite; their outputs are dropped)."""
    return [
        {"name": "noise", "dtype": "float32", "shape": ["batch", n_steps, width], "pad": 0.5},
        {"name": "temperature", "dtype": "float32", "shape": ["batch"], "pad": 1.0},
        {"name": "top_k", "dtype": "int64", "shape": ["batch"], "pad": 0},
        {"name": "top_p", "dtype": "float32", "shape": ["batch"], "pad": 1.0},
    ]


# Temperature of the golden cases of reduced-precision builds: the draw is decided by the noise, not by logit
# differences at the bf16 rounding level, so the fp32 reference codes are a well-posed target (measured on the tiny
# presets: 0 of 2048 rows differ at T=1000 with top-k/top-p off, 8–15% of rows at T∈[0.3,1.5]).
NOISE_DOMINATED_T = 1000.0


def random_sampling_inputs(B: int, n_steps: int, width: int, g: torch.Generator,
                           noise_dominated: bool = False) -> dict[str, torch.Tensor]:
    """Valid sampling inputs mixing greedy rows, top-k, top-p and plain temperature rows (or, for golden cases
    of bf16 builds, noise-dominated sampling: see NOISE_DOMINATED_T)."""
    temperature = torch.rand(B, generator=g) * 1.2 + 0.3
    temperature[torch.rand(B, generator=g) < 0.2] = 0.0
    top_k = torch.randint(0, width + 1, (B,), generator=g)
    top_p = torch.where(torch.rand(B, generator=g) < 0.5, torch.rand(B, generator=g) * 0.8 + 0.2,
                        torch.ones(B))
    noise = torch.rand(B, n_steps, width, generator=g).clamp(1e-6, 1 - 1e-6)
    if noise_dominated:
        temperature, top_k, top_p = torch.full((B,), NOISE_DOMINATED_T), torch.zeros_like(top_k), torch.ones(B)
    return {"noise": noise, "temperature": temperature, "top_k": top_k, "top_p": top_p}


def off_bucket_batch(batches: tuple[int, ...]) -> list[dict[str, int]]:
    """A golden case between two buckets (exercises padding and dropping padded rows), when one exists."""
    for b in range(1, max(batches)):
        if b not in batches:
            return [{"batch": b}]
    return []


def fast_ar_stage(opts) -> StageSpec:
    """`opts` is fish_s2.FishS2Options."""
    cfg = config_from_checkpoint(opts.checkpoint) if opts.checkpoint else PRESETS[opts.preset]
    with_emb = bool(opts.fast_ar_with_embedding)
    report: dict = {}

    def make_module() -> nn.Module:
        if opts.checkpoint:
            model, rep = load_fast_ar(opts.checkpoint, cfg, with_emb)
            report.update(rep)
            return model
        report.update({"random_weights": True, "seed": opts.seed})
        return init_random(FastAR(cfg, with_emb), opts.seed)

    n_steps, R = cfg.num_codebooks - 1, cfg.residual_codebook_size
    dtype = opts.dtype or torch.bfloat16
    batches = batch_sizes(opts.max_batch, opts.batch_buckets)

    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        B = sizes["batch"]
        start = cfg.semantic_start_token_id
        token = torch.randint(start, start + cfg.vocab_size, (B,), generator=g)
        token[torch.rand(B, generator=g) < 0.2] = 151645          # <|im_end|>: a non-semantic row
        out = {"hidden": torch.randn(B, cfg.dim, generator=g), "token": token,
               **random_sampling_inputs(B, n_steps, R, g, noise_dominated=dtype != torch.float32)}
        if with_emb:
            out["token_embed"] = torch.randn(B, cfg.dim, generator=g)
        return out

    inputs = [{"name": "hidden", "dtype": "float32", "shape": ["batch", cfg.dim]},
              {"name": "token", "dtype": "int64", "shape": ["batch"], "pad": cfg.semantic_start_token_id},
              *sampling_inputs(n_steps, R)]
    outputs = [{"name": "codes", "dtype": "int64", "shape": ["batch", cfg.num_codebooks]}]
    if with_emb:
        inputs.append({"name": "token_embed", "dtype": "float32", "shape": ["batch", cfg.dim]})
        outputs.append({"name": "next_embed", "dtype": "float32", "shape": ["batch", cfg.dim]})
    return StageSpec(
        family=FAMILY, name="fast_ar", kind="codebook_predictor", make_module=make_module,
        passes=[prune_fast_ar, fuse_projections],
        plan=BucketPlan({"batch": batches}),
        make_inputs=make_inputs, inputs=inputs, outputs=outputs, dtype=dtype,
        # next_embed: fp32 kernel-order noise; bf16 rounding of a [B,D] sum (measured < 1e-2 on tiny).
        tolerance=1e-4 if dtype == torch.float32 else 2e-2,
        metadata={"num_codebooks": cfg.num_codebooks, "sampled_codebooks": n_steps, "noise_width": R,
                  "code0": {"from": "token", "offset": cfg.semantic_start_token_id, "size": cfg.vocab_size},
                  "codebook_sizes": [cfg.vocab_size] + [R] * n_steps, "with_embedding": with_emb,
                  "sampling_defaults": {"temperature": 0.8, "top_k": 30, "top_p": 0.9}},
        config=asdict(cfg), checkpoint_report=report,
        golden_sizes=off_bucket_batch(batches),
    )


__all__ = ["FastAR", "FastARConfig", "PRESETS", "fast_ar_stage", "init_random", "load_fast_ar",
           "prune_fast_ar", "write_checkpoint"]
