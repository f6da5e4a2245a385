"""Fish Speech S2 Pro checkpoints: what each stage loads (strict: every key loaded, or explicitly ignored or
dropped), random weights for the presets, and writers of test checkpoints in the real layout.

A fishaudio/s2-pro folder holds `codec.pth` (the DAC: `torch.load`, weights only, optionally wrapped under
`"generator"`) and `config.json` + `model*.safetensors` (the slow AR `text_model.*` and the Fast AR
`audio_decoder.*`). Causal convs are new-style weight norm, the VQ projections legacy `weight_g`/`weight_v`
(either style is accepted anywhere). The transformers' `causal_mask` and `freqs_cis` buffers are never read
(masks are built in the graph and the RoPE tables rebuilt — and checked against the stored ones)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ....runtime.artifact import sha256_of
from ...checkpoint import CheckpointError, KeyRules, fan_in_fill, fill_by_name, load_strict, read_safetensors_selected
from ...passes import legacy_weight_norm_to_new
from .config import DACConfig, FastARConfig, codec_path, dac_config_from_checkpoint
from .dac import DAC, WindowLimitedTransformer
from .fast_ar import FastAR

# -------------------------------------------------------------------------------------------------- codec
# Persistent buffers of the three WindowLimitedTransformers; never read (see module docstring).
IGNORED_BUFFERS = re.compile(r"(encoder\.block\.\d+\.block\.5|quantizer\.(pre|post)_module)\.(causal_mask|freqs_cis)")


def read_codec_state(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict]:
    """(tensors to load with new-style weight-norm names, ignored buffers, report). Never unpickles code."""
    p = codec_path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: codec.pth not found")
    try:
        sd = torch.load(str(p), map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # an old (non-zip) serialization cannot be memory-mapped
        sd = torch.load(str(p), map_location="cpu", weights_only=True)
    if isinstance(sd, dict) and isinstance(sd.get("generator"), dict):
        sd = sd["generator"]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{p}: expected a state dict of tensors (optionally under 'generator')")
    ignored = {k: v for k, v in sd.items() if IGNORED_BUFFERS.fullmatch(k)}
    load = legacy_weight_norm_to_new({k: v for k, v in sd.items() if k not in ignored})
    report = {
        "path": str(p),
        "ignored": {"tensors": len(ignored), "params": sum(v.numel() for v in ignored.values())},
        "legacy_weight_norm": sum(k.endswith(".weight_g") for k in sd),
    }
    return load, ignored, report


def _check_rope_buffers(model: DAC, ignored: dict[str, torch.Tensor], source: str) -> None:
    """The stored `freqs_cis` must equal the table we rebuild (catches a head_dim / rope_base mismatch)."""
    for key, t in ignored.items():
        if not key.endswith(".freqs_cis"):
            continue
        mod = model.get_submodule(key[: -len(".freqs_cis")])
        assert isinstance(mod, WindowLimitedTransformer)
        ours = torch.stack([mod.rope_cos, mod.rope_sin], dim=-1)
        if tuple(t.shape) != tuple(ours.shape) or not torch.equal(t.float(), ours):
            raise CheckpointError(
                f"{source}: {key} does not match the RoPE table of the configured "
                f"transformer (shape {tuple(t.shape)} vs {tuple(ours.shape)}); "
                "wrong config?"
            )


def load_codec(path: str | Path, cfg: DACConfig | None = None, cls: type[DAC] = DAC) -> tuple[DAC, dict]:
    cfg = cfg or dac_config_from_checkpoint(path)
    tensors, ignored, report = read_codec_state(path)
    model = cls(cfg)
    src = str(codec_path(path))
    load_strict(model, tensors, source=src)
    _check_rope_buffers(model, ignored, src)
    report["sha256"] = sha256_of(codec_path(path))
    return model.eval(), report


def init_random_dac(model: DAC, seed: int = 0) -> DAC:
    """Deterministic random weights with trained-like scales: unit-ish activations through the residual
    stacks, snake alphas around 1, codebooks spread on the sphere: decode gives audio-range, unsaturated
    output. Keyed by parameter name (`fill_by_name`)."""
    last_conv = f"decoder.model.{len(model.decoder.model) - 2}.conv."

    def fill(name: str, p: torch.Tensor, g: torch.Generator) -> None:
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "alpha":
            p.uniform_(0.25, 1.75, generator=g)
        elif leaf == "gamma":
            p.uniform_(0.05, 0.25, generator=g)
        elif leaf == "original0":  # weight-norm magnitude g: sets each output channel's gain
            # residual branches (ResidualUnit's k1 conv) and the final decoder conv start small
            gain = 0.3 if (".block.3.conv." in name or name.startswith(last_conv)) else 1.0
            p.uniform_(0.5 * gain, 1.5 * gain, generator=g)
        elif "codebook" in name:  # (no codebook tensor is a norm weight or a bias)
            p.normal_(0.0, 1.0, generator=g)
        else:
            fan_in_fill(name, p, g)

    fill_by_name(dict(model.named_parameters()), fill, seed)
    return model.eval()


def write_codec_pth(
    model: DAC,
    path: str | Path,
    generator_wrapper: bool = True,
    legacy_vq: bool = True,
    legacy_all: bool = False,
    with_buffers: bool = True,
) -> Path:
    """Save in the real `codec.pth` layout: new-style weight norm on the causal convs, legacy `weight_g/_v` on
    the VQ projections (`legacy_all`: everywhere), the transformers' `freqs_cis` (bf16) and `causal_mask`
    buffers, optionally under `"generator"`."""
    p = codec_path(path) if Path(path).is_dir() else Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    sd: dict[str, torch.Tensor] = {}
    vq = re.compile(r"quantizer\.(semantic_quantizer|quantizer)\.quantizers\.\d+\.(in|out)_proj\.")
    for k, v in model.state_dict().items():
        legacy = legacy_all or (legacy_vq and vq.match(k))
        if legacy and k.endswith(".parametrizations.weight.original0"):
            k = k[: -len("parametrizations.weight.original0")] + "weight_g"
        elif legacy and k.endswith(".parametrizations.weight.original1"):
            k = k[: -len("parametrizations.weight.original1")] + "weight_v"
        sd[k] = v.detach().clone().contiguous()
    if with_buffers:
        for name, mod in model.named_modules():
            if isinstance(mod, WindowLimitedTransformer):
                sd[f"{name}.freqs_cis"] = torch.stack([mod.rope_cos, mod.rope_sin], dim=-1).to(torch.bfloat16)
                n = mod.block_size
                sd[f"{name}.causal_mask"] = torch.ones(n, n, dtype=torch.bool).tril()
    torch.save({"generator": sd} if generator_wrapper else sd, str(p))
    return p


# ------------------------------------------------------------------------------------------------ fast_ar
def fast_ar_rules(cfg: FastARConfig, with_embedding: bool) -> KeyRules:
    """HF safetensors: `audio_decoder.*` is the Fast AR (Fish names, `wqkv` already fused: loaded as is);
    `text_model.*` is the slow AR (never read). Without the embedding output the slow-AR-side
    `codebook_embeddings` is known but unused (dropped, counted as pruned)."""
    ren = {
        "audio_decoder.norm.weight": "norm.weight",
        "audio_decoder.output.weight": "output.weight",
        "audio_decoder.embeddings.weight": "embeddings.weight",
    }
    per_layer = {
        "attention.wqkv": "self_attn.qkv_proj",
        "attention.wo": "self_attn.o_proj",
        "feed_forward.w1": "mlp.gate_proj",
        "feed_forward.w3": "mlp.up_proj",
        "feed_forward.w2": "mlp.down_proj",
        "attention_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
    }
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


def _safetensors_files(path: Path) -> list[Path]:
    files = sorted(p for p in path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors (the S2 Pro LLM weights)")
    return files


def load_fast_ar(path: str | Path, cfg: FastARConfig, with_embedding: bool) -> tuple[FastAR, dict]:
    rules = fast_ar_rules(cfg, with_embedding)
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


def init_random_fast_ar(model: FastAR, seed: int = 0) -> FastAR:
    """Deterministic random weights, keyed by parameter name (`fill_by_name`); the output head is scaled so logits
    spread over a few units (peaked but not one-hot distributions, as a trained head gives), so sampling tests
    exercise top-k/top-p."""

    def fill(name: str, p: torch.Tensor, g: torch.Generator) -> None:
        if p.dim() == 1:
            p.normal_(1.0, 0.1, generator=g)
        elif "embeddings" in name:
            p.normal_(0.0, 1.0, generator=g)
        else:
            gain = 4.0 if name == "output.weight" else 1.0
            p.normal_(0.0, gain / math.sqrt(p.shape[1]), generator=g)

    fill_by_name(dict(model.named_parameters()), fill, seed)
    return model.eval()


def write_fast_ar_checkpoint(model: FastAR, out_dir: str | Path, seed: int = 0) -> Path:
    """Save in the real S2 Pro layout: config.json + model.safetensors with `audio_decoder.*` (Fish names, fused
    wqkv) and a token `text_model.*` tensor (never read); `codebook_embeddings` always present, as in the HF
    checkpoint."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg
    inverse = {v: k for k, v in fast_ar_rules(cfg, True).rename.items()}
    sd = {inverse[k]: v.detach().contiguous() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(seed + 1)
    sd.setdefault(
        "audio_decoder.codebook_embeddings.weight",
        torch.randn(cfg.num_codebooks * cfg.codebook_size, cfg.dim, generator=g),
    )
    sd["text_model.model.norm.weight"] = torch.ones(cfg.dim)
    save_file(sd, str(out / "model.safetensors"))
    adc = {
        k: v
        for k, v in asdict(cfg).items()
        if k not in ("codebook_size", "semantic_start_token_id", "residual_codebook_size", "text_vocab_size")
    }
    (out / "config.json").write_text(
        json.dumps(
            {
                "model_type": "fish_qwen3_omni",
                "semantic_start_token_id": cfg.semantic_start_token_id,
                "semantic_end_token_id": cfg.semantic_start_token_id + cfg.vocab_size - 1,
                "text_config": {
                    "model_type": "fish_qwen3",
                    "dim": cfg.dim,
                    "codebook_size": cfg.codebook_size,
                    "num_codebooks": cfg.num_codebooks,
                    "vocab_size": cfg.text_vocab_size,
                },
                "audio_decoder_config": {"model_type": "fish_qwen3_audio_decoder", **adc},
            },
            indent=2,
        )
    )
    return out
