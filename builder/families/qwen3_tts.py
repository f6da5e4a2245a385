"""Qwen3-TTS 12 Hz (`qwen3-tts-12hz`): the `code2wav` stage (speech tokenizer v2 decoder).

codes [B,16,F] int64 → wav [B,1,F·1920] float32 at 24 kHz. Facts: shared/reference/STAGES.md §2.2.
The module tree mirrors `speech_tokenizer/model.safetensors` under the `decoder.` prefix, so the checkpoint
mapping below is a prefix plus two explicitly dropped keys.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ...runtime.artifact import sha256_of
from ..buckets import BucketPlan, StreamingConfig, batch_sizes, frame_sizes
from ..checkpoint import KeyRules, load_strict, read_safetensors_selected
from ..layers import (
    CausalConv1d,
    CausalConvTranspose1d,
    ConvNeXtBlock,
    LayerScale,
    RMSNorm,
    SnakeBeta,
    SwiGLU,
    apply_rope_neox,
    rope_table,
)
from ..layers.attention import Attention, sliding_window_causal_mask
from ..passes import bake_snake, depthwise_conv_as_shifts, fuse_projections
from ..stage_spec import StageSpec

FAMILY = "qwen3-tts-12hz"
SAMPLE_RATE = 24000


@dataclass(frozen=True)
class Code2WavConfig:
    """`decoder_config` of speech_tokenizer/config.json (names as there)."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    latent_dim: int = 1024
    decoder_dim: int = 1536
    hidden_size: int = 512
    intermediate_size: int = 1024
    head_dim: int = 64
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    num_hidden_layers: int = 8
    sliding_window: int = 72
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8000
    layer_scale_initial_scale: float = 0.01
    num_quantizers: int = 16
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    attention_bias: bool = False
    hidden_act: str = "silu"

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)

    @property
    def receptive_field_frames(self) -> int:
        """Frames of left context after which a chunk's output no longer depends on earlier codes: pre_conv (2) +
        the sliding-window attention stack + the conv tail (≈10 frames, STAGES.md §2.2), rounded up."""
        return 2 + self.num_hidden_layers * (self.sliding_window - 1) + 12

    @classmethod
    def from_json(cls, d: dict) -> Code2WavConfig:
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in known}
        if "head_dim" not in d and "hidden_size" in d and "num_attention_heads" in d:
            kw["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        if kw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"code2wav: hidden_act {kw['hidden_act']!r} is not supported (silu only)")
        return cls(**kw)


PRESETS: dict[str, Code2WavConfig] = {
    "full": Code2WavConfig(),
    # Same topology (16 codebooks, 8→2 layers, 4 decoder blocks, 29 SnakeBeta), small widths: CPU tests and demo.
    "tiny": Code2WavConfig(
        codebook_size=64, codebook_dim=32, latent_dim=32, decoder_dim=64, hidden_size=32, intermediate_size=64,
        head_dim=8, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2, sliding_window=8,
        max_position_embeddings=1024, upsample_rates=(2, 2, 2, 2), upsampling_ratios=(2, 2),
    ),
}

STREAMING_DEFAULTS = StreamingConfig(chunk_frames=25, left_context_frames=25, first_chunk_frames=0,
                                     nonstreaming_chunk_frames=300)


# --------------------------------------------------------------------------------------------- modules
class EuclideanCodebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def table(self) -> torch.Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _VQLayer(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = EuclideanCodebook(size, dim)


class _VQStack(nn.Module):
    def __init__(self, n: int, size: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_VQLayer(size, dim) for _ in range(n))


class RVQGroup(nn.Module):
    """`rvq_first` / `rvq_rest`: Σ codebook lookups → bias-free 1×1 conv output_proj (input_proj is encode-only)."""

    def __init__(self, n: int, size: int, dim: int, out_dim: int) -> None:
        super().__init__()
        self.vq = _VQStack(n, size, dim)
        self.output_proj = nn.Conv1d(dim, out_dim, 1, bias=False)


class QuantizerDecoder(nn.Module):
    """SplitResidualVectorQuantizer.decode with the codebook tables precomputable (`bake_codebooks`)."""

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.num_quantizers, self.codebook_size = cfg.num_quantizers, cfg.codebook_size
        self.rvq_first = RVQGroup(1, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = RVQGroup(cfg.num_quantizers - 1, cfg.codebook_size, dim, cfg.codebook_dim)
        self.register_buffer("offsets", torch.arange(cfg.num_quantizers) * cfg.codebook_size, persistent=False)
        self.baked = False

    def bake_codebooks(self) -> None:
        """embedding_sum / clamp(cluster_usage) for all 16 books, once, in fp32, as one flat [16·N, d] table:
        the decode becomes a single gather."""
        tables = [layer._codebook.table() for g in (self.rvq_first, self.rvq_rest) for layer in g.vq.layers]
        self.register_buffer("table", torch.cat(tables).detach().contiguous())
        for g in (self.rvq_first, self.rvq_rest):
            del g.vq
        self.baked = True

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        if self.baked:
            emb = F.embedding(codes + self.offsets[None, :, None], self.table)      # [B,16,F,d]
            first = emb[:, 0].transpose(1, 2)
            rest = emb[:, 1:].sum(1).transpose(1, 2)
        else:
            first = F.embedding(codes[:, 0], self.rvq_first.vq.layers[0]._codebook.table()).transpose(1, 2)
            rest = 0
            for k, layer in enumerate(self.rvq_rest.vq.layers):
                rest = rest + F.embedding(codes[:, k + 1], layer._codebook.table()).transpose(1, 2)
        return self.rvq_first.output_proj(first) + self.rvq_rest.output_proj(rest)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                                   cfg.head_dim, bias=cfg.attention_bias)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x, cos, sin, mask):
        q, k, v = self.self_attn.project_qkv(self.input_layernorm(x))
        q, k = apply_rope_neox(q, cos, sin), apply_rope_neox(k, cos, sin)
        x = x + self.self_attn_layer_scale(self.self_attn.attend(q, k, v, mask))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class PreTransformer(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.window = cfg.sliding_window
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        cos, sin = rope_table(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)
        # Non-persistent: derived from the config, not checkpoint tensors.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        h = self.input_proj(x)
        # HF computes the tables in fp32 and casts them to the activation dtype before applying.
        cos, sin = self.rope_cos[:T].to(h.dtype), self.rope_sin[:T].to(h.dtype)
        mask = sliding_window_causal_mask(T, self.window, h.device)
        for layer in self.layers:
            h = layer(h, cos, sin, mask)
        return self.output_proj(self.norm(h))


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x):
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int) -> None:
        super().__init__()
        self.block = nn.ModuleList([SnakeBeta(cin), CausalConvTranspose1d(cin, cout, 2 * rate, rate),
                                    *(ResidualUnit(cout, d) for d in (1, 3, 9))])

    def forward(self, x):
        for m in self.block:
            x = m(x)
        return x


class _Upsample(nn.Module):
    """`upsample.{i}` is a ModuleList [CausalTransConv, ConvNeXtBlock] in the checkpoint."""


class Code2Wav(nn.Module):
    """Qwen3TTSTokenizerV2Decoder: codes [B,16,F] → wav [B,1,F·spf], clamped to [-1,1], returned as fp32."""

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.quantizer = QuantizerDecoder(cfg)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = PreTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalConvTranspose1d(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXtBlock(cfg.latent_dim)])
            for r in cfg.upsampling_ratios)
        dec: list[nn.Module] = [CausalConv1d(cfg.latent_dim, cfg.decoder_dim, 7)]
        for i, rate in enumerate(cfg.upsample_rates):
            dec.append(DecoderBlock(cfg.decoder_dim // 2**i, cfg.decoder_dim // 2 ** (i + 1), rate))
        out_dim = cfg.decoder_dim // 2 ** len(cfg.upsample_rates)
        dec += [SnakeBeta(out_dim), CausalConv1d(out_dim, 1, 7)]
        self.decoder = nn.ModuleList(dec)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        h = self.quantizer(codes)
        h = self.pre_transformer(self.pre_conv(h).transpose(1, 2)).transpose(1, 2)
        for pair in self.upsample:
            for m in pair:
                h = m(h)
        for m in self.decoder:
            h = m(h)
        return h.clamp(-1.0, 1.0).float()


# ------------------------------------------------------------------------------------------ checkpoint
# speech_tokenizer/model.safetensors: `decoder.*` is this module; `encoder.*` (Mimi) is never read; the two
# quantizer input projections serve encoding only and are dropped (counted as pruned).
CHECKPOINT_RULES = KeyRules(
    prefix="decoder.",
    ignore_prefixes=("encoder.",),
    drop_patterns=(r"decoder\.quantizer\.rvq_(first|rest)\.input_proj\.weight",),
)


def _tokenizer_dir(path: str | Path) -> Path:
    p = Path(path)
    return p / "speech_tokenizer" if (p / "speech_tokenizer").is_dir() else p


def config_from_checkpoint(path: str | Path) -> Code2WavConfig:
    cfg_path = _tokenizer_dir(path) / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path}: speech_tokenizer/config.json not found")
    d = json.loads(cfg_path.read_text())
    return Code2WavConfig.from_json(d.get("decoder_config", d))


def load_code2wav(path: str | Path, cfg: Code2WavConfig | None = None) -> tuple[Code2Wav, dict]:
    tok = _tokenizer_dir(path)
    cfg = cfg or config_from_checkpoint(tok)
    st = tok / "model.safetensors"
    if not st.is_file():
        raise FileNotFoundError(f"{st}: speech_tokenizer/model.safetensors not found")
    tensors, report = read_safetensors_selected(st, CHECKPOINT_RULES)
    model = Code2Wav(cfg)
    load_strict(model, tensors, report["unknown"], source=str(st))
    report["sha256"] = sha256_of(st)
    report["path"] = str(st)
    return model.eval(), report


def init_random(model: Code2Wav, seed: int = 0) -> Code2Wav:
    """Deterministic random weights with realistic scales (codebooks non-zero, snake log-params spread), so
    the tiny preset produces audio-range signals rather than zeros or saturated clamps."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "embedding_sum":
                p.copy_(torch.randn(p.shape, generator=g))
            elif leaf == "cluster_usage":
                p.copy_(torch.rand(p.shape, generator=g) * 1.5 + 0.5)
            elif leaf in ("alpha", "beta"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            elif leaf in ("scale", "gamma"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1 + 0.3)
            elif "norm" in name and leaf == "weight" and p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif leaf == "bias":
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel() if p.dim() > 1 else p.numel()
                # Residual branches and the output conv start small, as trained vocoders are: otherwise 29
                # residual snakes grow the signal ~3x per block and the clamp saturates everything.
                gain = 0.1 if (".conv2." in name or name.startswith(f"decoder.{len(model.decoder) - 1}.")) else 1.0
                p.copy_(torch.randn(p.shape, generator=g) * gain / math.sqrt(fan_in))
    return model.eval()


def write_checkpoint(model: Code2Wav, out_dir: str | Path, seed: int = 0) -> Path:
    """Save `model` in the real layout: <out>/speech_tokenizer/{config.json, model.safetensors} with
    `decoder.*` plus the encode-only input projections and a token `encoder.*` tensor (both never read)."""
    from safetensors.torch import save_file

    tok = Path(out_dir) / "speech_tokenizer"
    tok.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg
    g = torch.Generator().manual_seed(seed + 1)
    sd = {f"decoder.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}
    for grp in ("rvq_first", "rvq_rest"):
        sd[f"decoder.quantizer.{grp}.input_proj.weight"] = torch.randn(cfg.codebook_dim // 2, cfg.codebook_dim, 1,
                                                                       generator=g)
    sd["encoder.encoder.layers.0.conv.weight"] = torch.randn(4, 1, 7, generator=g)
    save_file(sd, str(tok / "model.safetensors"))
    dcfg = asdict(cfg)
    dcfg = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dcfg.items()}
    (tok / "config.json").write_text(json.dumps({
        "model_type": "qwen3_tts_tokenizer_12hz", "input_sample_rate": SAMPLE_RATE, "output_sample_rate": SAMPLE_RATE,
        "decode_upsample_rate": cfg.samples_per_frame, "encoder_valid_num_quantizers": cfg.num_quantizers,
        "decoder_config": dcfg}, indent=2))
    return tok


# ------------------------------------------------------------------------------------------- stage spec
@dataclass
class Qwen3TTSOptions:
    preset: str = "tiny"
    checkpoint: str | None = None
    seed: int = 0
    dtype: torch.dtype | None = None            # default bf16 (numerics policy); fp32 selectable
    max_batch: int = 4
    batch_buckets: tuple[int, ...] | None = None
    frame_buckets: tuple[int, ...] | None = None
    pow2_frames: bool = True
    streaming: StreamingConfig = field(default_factory=lambda: STREAMING_DEFAULTS)
    talker_size: str = "0.6B"                    # code_predictor config for preset "full": "0.6B" or "1.7B"
    code_predictor_with_embedding: bool = False  # also output the summed codec embedding for the next talker step


def _codes_input(cfg: Code2WavConfig) -> dict:
    return {"name": "codes", "dtype": "int64", "shape": ["batch", cfg.num_quantizers, "frames"], "pad": 0,
            "range": {"dim": 1, "low": 0, "high": [cfg.codebook_size] * cfg.num_quantizers}}


def code2wav_stage(opts: Qwen3TTSOptions) -> StageSpec:
    if opts.checkpoint:
        cfg = config_from_checkpoint(opts.checkpoint)
    else:
        cfg = PRESETS[opts.preset]
    report: dict = {}

    def make_module() -> nn.Module:
        if opts.checkpoint:
            model, rep = load_code2wav(opts.checkpoint, cfg)
            report.update(rep)
            return model
        report.update({"random_weights": True, "seed": opts.seed})
        return init_random(Code2Wav(cfg), opts.seed)

    def fold_codebooks(m: nn.Module) -> dict:
        m.quantizer.bake_codebooks()
        return {"pass": "bake_codebooks", "books": cfg.num_quantizers}

    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        return {"codes": torch.randint(0, cfg.codebook_size, (sizes["batch"], cfg.num_quantizers, sizes["frames"]),
                                       generator=g)}

    streaming = opts.streaming
    frames = frame_sizes(streaming, pow2=opts.pow2_frames, explicit=opts.frame_buckets)
    if frames[-1] > cfg.max_position_embeddings:
        raise ValueError(f"frame bucket {frames[-1]} exceeds max_position_embeddings {cfg.max_position_embeddings}")
    plan = BucketPlan({"batch": batch_sizes(opts.max_batch, opts.batch_buckets), "frames": frames})
    dtype = opts.dtype or torch.bfloat16
    cfg_json = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}
    return StageSpec(
        family=FAMILY, name="code2wav", kind="codec_decoder", make_module=make_module,
        passes=[fold_codebooks, bake_snake, fuse_projections, depthwise_conv_as_shifts],
        plan=plan, make_inputs=make_inputs,
        inputs=[_codes_input(cfg)],
        outputs=[{"name": "wav", "dtype": "float32", "shape": ["batch", 1, ["frames", cfg.samples_per_frame]]}],
        dtype=dtype,
        # fp32: kernel-order noise only; bf16: measured ~1e-2 on random weights vs the fp32 reference.
        tolerance=1e-4 if dtype == torch.float32 else 5e-2,
        metadata={"sample_rate": SAMPLE_RATE, "samples_per_frame": cfg.samples_per_frame,
                  "streaming": asdict(streaming), "receptive_field_frames": cfg.receptive_field_frames},
        config=cfg_json, checkpoint_report=report,
        golden_sizes=[{"batch": 1, "frames": max(1, frames[0] - 3)}],
    )


def stages(opts: Qwen3TTSOptions) -> list[StageSpec]:
    from .qwen3_tts_predictor import code_predictor_stage, has_code_predictor

    specs = [code2wav_stage(opts)]
    # A speech-tokenizer-only checkpoint (no talker config) serves code2wav alone.
    if not opts.checkpoint or has_code_predictor(opts.checkpoint):
        specs.append(code_predictor_stage(opts))
    return specs


def options_from_cli(**kw) -> Qwen3TTSOptions:
    o = Qwen3TTSOptions()
    return replace(o, **{k: v for k, v in kw.items() if k in o.__dataclass_fields__ and v is not None})


STAGE_NAMES = ("code2wav", "code_predictor")
