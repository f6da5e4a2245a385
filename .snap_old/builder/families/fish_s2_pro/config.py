"""Fish Speech S2 Pro configs: the DAC codec (`codec.pth`, upstream `modded_dac_vq.yaml`) and the Fast AR
(`config.json` `audio_decoder_config`), named presets, and the readers of a checkpoint folder. Facts:
shared/reference/STAGES.md §1.3–1.4.

codec.pth carries no config: its sizes are inferred from the tensors' shapes (`dac_config_from_checkpoint`);
what the tensors cannot tell (attention windows, RoPE base, norm eps, sample rate) comes from a sibling
`modded_dac_vq.yaml` when there is one, else from the preset with the same sizes, else the upstream defaults."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from ...checkpoint import CheckpointError

CODEC_FILE = "codec.pth"
CODEC_YAML = "modded_dac_vq.yaml"  # fish-speech's codec config, if the user keeps it next to codec.pth


@dataclass(frozen=True)
class DACConfig:
    """`modded_dac_vq.yaml` (vLLM-Omni `dac_utils.build_dac_codec`); names as in the upstream constructors."""

    sample_rate: int = 44100
    encoder_dim: int = 64
    encoder_rates: tuple[int, ...] = (2, 4, 8, 8)
    latent_dim: int = 1024  # = encoder_dim · 2^len(encoder_rates) upstream
    decoder_dim: int = 1536
    decoder_rates: tuple[int, ...] = (8, 8, 4, 2)
    encoder_transformer_layers: tuple[int, ...] = (0, 0, 0, 4)
    encoder_window: int = 512  # hard-coded in the upstream EncoderBlock
    encoder_block_size: int = 16384  # rope table length of the encoder transformer
    transformer_head_dim: int = 64  # encoder transformer: n_head = dim // 64 upstream
    # DownsampleResidualVectorQuantize
    n_codebooks: int = 9
    codebook_size: int = 1024
    semantic_codebook_size: int = 4096
    codebook_dim: int = 8
    downsample_factor: tuple[int, ...] = (2, 2)
    quantizer_layers: int = 8
    quantizer_heads: int = 16
    quantizer_head_dim: int = 64
    quantizer_intermediate: int = 3072
    quantizer_window: int = 128
    quantizer_block_size: int = 4096
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.latent_dim != self.encoder_dim * 2 ** len(self.encoder_rates):
            raise ValueError("latent_dim must equal encoder_dim · 2^len(encoder_rates) (upstream default)")
        if math.prod(self.decoder_rates) != self.hop_length:
            raise ValueError("decoder_rates must upsample by the encoder hop")
        if self.quantizer_heads * self.quantizer_head_dim != self.latent_dim:
            raise ValueError("quantizer transformer: heads · head_dim must equal latent_dim")

    @property
    def hop_length(self) -> int:
        return math.prod(self.encoder_rates)

    @property
    def samples_per_frame(self) -> int:
        return self.hop_length * math.prod(self.downsample_factor)

    @property
    def num_codebooks(self) -> int:
        return 1 + self.n_codebooks

    @property
    def codebook_sizes(self) -> list[int]:
        return [self.semantic_codebook_size] + [self.codebook_size] * self.n_codebooks


DAC_PRESETS: dict[str, DACConfig] = {
    "full": DACConfig(),
    # Same topology and the real strides (2048 samples per frame), codebook sizes and encoder window; narrow
    # channels, one layer per transformer, quantizer window 8 so windowing is exercised at small frame counts.
    "tiny": DACConfig(
        encoder_dim=4,
        latent_dim=64,
        decoder_dim=64,
        encoder_transformer_layers=(0, 0, 0, 1),
        encoder_block_size=4096,
        quantizer_layers=1,
        quantizer_heads=2,
        quantizer_head_dim=32,
        quantizer_intermediate=192,
        quantizer_window=8,
        quantizer_block_size=1024,
    ),
}


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
    vocab_size: int = 4096  # fast embeddings / output head rows (semantic codebook size)
    num_codebooks: int = 10
    attention_qk_norm: bool = False
    residual_codebook_size: int = 1024  # codebooks 1..9 (vLLM-Omni slices the logits to this)
    codebook_size: int = 4096  # text_config.codebook_size: row stride of codebook_embeddings
    semantic_start_token_id: int = 151678
    text_vocab_size: int = 155776  # text_config.vocab_size: the slow AR's tokens (the `token` input's range)

    @classmethod
    def from_json(cls, d: dict) -> FastARConfig:
        a = d.get("audio_decoder_config", d)
        known = set(cls.__dataclass_fields__)
        kw: dict[str, Any] = {k: v for k, v in a.items() if k in known and k not in ("codebook_size",)}
        if "norm_eps" in a and "rms_norm_eps" not in a:  # the Fish codebase's name for it
            kw["rms_norm_eps"] = a["norm_eps"]
        if "codebook_size" in d.get("text_config", {}):
            kw["codebook_size"] = d["text_config"]["codebook_size"]
        if "vocab_size" in d.get("text_config", {}):
            kw["text_vocab_size"] = d["text_config"]["vocab_size"]
        if "semantic_start_token_id" in d:
            kw["semantic_start_token_id"] = d["semantic_start_token_id"]
        cfg = cls(**kw)
        if cfg.attention_qk_norm:
            raise ValueError("fast_ar: attention_qk_norm=True is not the S2 Pro Fast AR (no q/k norm)")
        return cfg


FAST_AR_PRESETS: dict[str, FastARConfig] = {
    "full": FastARConfig(),
    # Same topology (10 codebooks, GQA 2:1, interleaved rope, residual slice), small widths and one layer (AOTI
    # compile time of the unrolled frame scales with the layer count): CPU tests.
    "tiny": FastARConfig(
        dim=64,
        n_head=4,
        n_local_heads=2,
        head_dim=16,
        n_layer=1,
        intermediate_size=128,
        vocab_size=128,
        residual_codebook_size=32,
        codebook_size=128,
    ),
}


# ------------------------------------------------------------------------------------------ checkpoint dir
def fast_ar_config_from_checkpoint(path: str | Path) -> FastARConfig:
    p = Path(path) / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: config.json not found (the Fast AR needs the S2 Pro config.json)")
    return FastARConfig.from_json(json.loads(p.read_text()))


def codec_path(path: str | Path) -> Path:
    p = Path(path)
    return p / CODEC_FILE if p.is_dir() else p


WN_V = "parametrizations.weight.original1"  # a weight-normed conv's direction: the weight's shape


def _count(shapes: dict[str, tuple[int, ...]], pattern: str, start: int = 0) -> int:
    """How many indices start, start+1, … have a key pattern.format(i); a gap (a later index present, an earlier
    one missing) is an inconsistent checkpoint, named by the missing key."""
    rx = re.compile(re.escape(pattern).replace(re.escape("{}"), r"(\d+)"))
    present = {int(m.group(1)) for k in shapes if (m := rx.fullmatch(k))}
    n = 0
    while start + n in present:
        n += 1
    if any(i >= start + n for i in present):
        raise CheckpointError(
            f"tensor {pattern.format(start + n)!r} is missing "
            f"(indices {sorted(present)} of {pattern.format('N')!r} are present)"
        )
    return n


def dac_sizes_from_shapes(shapes: dict[str, tuple[int, ...]], buffers: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """The DACConfig fields a codec state dict determines (new-style weight-norm names; `buffers` = the
    transformers' stored `freqs_cis`, which give block sizes and head dims when present). Relations between the
    sizes that upstream's constructors assume are checked here, naming the tensors involved."""

    def shape(key: str) -> tuple[int, ...]:
        if key not in shapes:
            raise CheckpointError(f"no tensor {key!r} (not a Fish S2 Pro DAC codec?)")
        return shapes[key]

    s: dict[str, Any] = {"encoder_dim": shape(f"encoder.block.0.conv.{WN_V}")[0]}
    n_enc = _count(shapes, "encoder.block.{}.block.4.conv." + WN_V, start=1)
    if n_enc == 0:
        raise CheckpointError(f"no encoder block (tensor 'encoder.block.1.block.4.conv.{WN_V}')")
    s["encoder_rates"] = tuple(shape(f"encoder.block.{i}.block.4.conv.{WN_V}")[2] // 2 for i in range(1, n_enc + 1))
    s["encoder_transformer_layers"] = tuple(
        _count(shapes, f"encoder.block.{i}.block.5.layers.{{}}.attention.wqkv.weight") for i in range(1, n_enc + 1)
    )
    last = f"encoder.block.{n_enc + 2}.conv.{WN_V}"
    s["latent_dim"] = shape(last)[0]
    if s["latent_dim"] != s["encoder_dim"] * 2**n_enc:
        raise CheckpointError(
            f"tensor {last!r} has {s['latent_dim']} output channels, the {n_enc} encoder blocks "
            f"give {s['encoder_dim'] * 2**n_enc}"
        )
    for i in range(1, n_enc + 1):
        fc = buffers.get(f"encoder.block.{i}.block.5.freqs_cis")
        if fc is not None:
            s["encoder_block_size"], s["transformer_head_dim"] = fc[0], 2 * fc[1]
    s["decoder_dim"] = shape(f"decoder.model.0.conv.{WN_V}")[0]
    n_dec = _count(shapes, "decoder.model.{}.block.1.conv." + WN_V, start=1)
    s["decoder_rates"] = tuple(shape(f"decoder.model.{j}.block.1.conv.{WN_V}")[2] // 2 for j in range(1, n_dec + 1))
    if math.prod(s["decoder_rates"]) != math.prod(s["encoder_rates"]):
        raise CheckpointError(
            f"the decoder blocks' strides {s['decoder_rates']} (tensors 'decoder.model.N.block.1."
            f"conv.{WN_V}') do not undo the encoder's {s['encoder_rates']}"
        )
    q = "quantizer"
    s["semantic_codebook_size"] = shape(f"{q}.semantic_quantizer.quantizers.0.codebook.weight")[0]
    s["n_codebooks"] = _count(shapes, q + ".quantizer.quantizers.{}.codebook.weight")
    s["codebook_size"], s["codebook_dim"] = shape(f"{q}.quantizer.quantizers.0.codebook.weight")
    n_down = _count(shapes, q + ".downsample.{}.0.conv.weight")
    s["downsample_factor"] = tuple(shape(f"{q}.downsample.{k}.0.conv.weight")[2] for k in range(n_down))
    s["quantizer_layers"] = _count(shapes, q + ".pre_module.layers.{}.attention.wqkv.weight")
    s["quantizer_intermediate"] = shape(f"{q}.pre_module.layers.0.feed_forward.w1.weight")[0]
    fc = buffers.get(f"{q}.pre_module.freqs_cis")
    if fc is not None:
        s["quantizer_block_size"], s["quantizer_head_dim"] = fc[0], 2 * fc[1]
        if s["latent_dim"] % s["quantizer_head_dim"]:
            raise CheckpointError(
                f"buffer '{q}.pre_module.freqs_cis' gives head_dim {s['quantizer_head_dim']}, "
                f"which does not divide the latent width {s['latent_dim']}"
            )
    return s


def _yaml_settings(path: Path) -> dict[str, Any]:
    """The fields of a fish-speech `modded_dac_vq.yaml` that the tensors cannot tell."""
    try:
        import yaml
    except ImportError:
        raise RuntimeError(
            f"{path}: reading it needs PyYAML (pip install pyyaml), or remove it to infer the codec "
            "config from codec.pth alone"
        ) from None
    d = yaml.safe_load(path.read_text()) or {}
    general = d.get("transformer_general_config") or {}
    post = (d.get("quantizer") or {}).get("post_module") or {}
    out = {
        "sample_rate": d.get("sample_rate"),
        "rope_base": general.get("rope_base"),
        "norm_eps": general.get("norm_eps"),
        "quantizer_window": post.get("window_size"),
    }
    return {k: type(getattr(DACConfig(), k))(v) for k, v in out.items() if v is not None}


def dac_config_from_state(
    shapes: dict[str, tuple[int, ...]],
    buffers: dict[str, tuple[int, ...]],
    source: str,
    prefer: str | None = None,
    yaml_path: Path | None = None,
) -> DACConfig:
    """The DACConfig of a codec state dict (see the module docstring for where each field comes from)."""
    try:
        sizes = dac_sizes_from_shapes(shapes, buffers)
    except CheckpointError as e:
        raise CheckpointError(f"{source}: {e}") from None
    order = [n for n in (prefer, "full") if n in DAC_PRESETS] + list(DAC_PRESETS)
    base = next(
        (
            DAC_PRESETS[n]
            for n in dict.fromkeys(order)
            if all(getattr(DAC_PRESETS[n], k) == v for k, v in sizes.items())
        ),
        DACConfig(),
    )
    unshaped = _yaml_settings(yaml_path) if yaml_path is not None and yaml_path.is_file() else {}
    derived = {}
    if "quantizer_head_dim" not in sizes:  # no stored RoPE table: heads · head_dim = latent_dim, head_dim kept
        derived["quantizer_heads"] = sizes["latent_dim"] // base.quantizer_head_dim
    else:
        derived["quantizer_heads"] = sizes["latent_dim"] // sizes["quantizer_head_dim"]
    try:
        return replace(base, **{**sizes, **derived, **unshaped})
    except ValueError as e:  # DACConfig's own consistency rules
        raise CheckpointError(f"{source}: the tensors' sizes are inconsistent ({e}): {sizes}") from None


def dac_config_from_checkpoint(path: str | Path, prefer: str | None = None) -> DACConfig:
    """codec.pth (+ a sibling modded_dac_vq.yaml) → DACConfig, checked against every tensor: a checkpoint whose
    tensors the inferred config does not reproduce exactly is refused, naming the first differing key."""
    from .checkpoint import read_codec_state
    from .dac import DAC

    p = codec_path(path)
    tensors, ignored, _ = read_codec_state(p)
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    cfg = dac_config_from_state(
        shapes, {k: tuple(v.shape) for k, v in ignored.items()}, str(p), prefer, p.parent / CODEC_YAML
    )
    import torch

    with torch.device("meta"):
        own = {k: tuple(v.shape) for k, v in DAC(cfg).state_dict().items()}
    for key in sorted(set(own) | set(shapes)):
        if own.get(key) != shapes.get(key):
            what = (
                "is missing"
                if key not in shapes
                else "is not part of a DAC"
                if key not in own
                else f"has shape {shapes[key]}, the inferred config gives {own[key]}"
            )
            raise CheckpointError(f"{p}: tensor {key!r} {what} (inferred {_changed(cfg)})")
    return cfg


def _changed(cfg: DACConfig) -> str:
    full = DACConfig()
    diff = {f.name: getattr(cfg, f.name) for f in fields(cfg) if getattr(cfg, f.name) != getattr(full, f.name)}
    return "the full config" if not diff else ", ".join(f"{k}={v}" for k, v in diff.items())


__all__ = [
    "CODEC_FILE",
    "DAC_PRESETS",
    "FAST_AR_PRESETS",
    "DACConfig",
    "FastARConfig",
    "codec_path",
    "dac_config_from_checkpoint",
    "dac_config_from_state",
    "fast_ar_config_from_checkpoint",
]
