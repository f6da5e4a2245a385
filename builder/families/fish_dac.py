"""Fish Speech S2 Pro DAC codec stages: `dac_decoder` (codes → 44.1 kHz wave) and `dac_encoder` (reference
audio → codes for voice cloning, always fp32). Modules: fish_dac_modules.py; facts: STAGES.md §1.4.

Checkpoint: `codec.pth` (torch.load, weights_only), optionally wrapped under `"generator"`. Causal convs are
new-style weight norm, the VQ projections legacy `weight_g`/`weight_v` (either style is accepted anywhere).
Loading is strict: every key is loaded or on the explicit ignore list (the transformers' `causal_mask` and
`freqs_cis` buffers, which the reference never reads: masks are passed explicitly and the rope table is
rebuilt here — and checked against the stored one)."""

from __future__ import annotations

import math
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...runtime.artifact import sha256_of
from ..buckets import BucketPlan, batch_sizes, frame_sizes
from ..checkpoint import CheckpointError, load_strict
from ..passes import bake_snake, bake_weight_norm, fuse_projections, legacy_weight_norm_to_new, prune_submodules
from ..stage_spec import StageSpec
from .fish_dac_modules import (
    DAC,
    PRESETS,
    DACConfig,
    DACDecoder,
    DACEncoder,
    WindowLimitedTransformer,
)

FAMILY = "fish-s2-pro"
CODEC_FILE = "codec.pth"
# Persistent buffers of the three WindowLimitedTransformers; never read (see module docstring).
IGNORED_BUFFERS = re.compile(
    r"(encoder\.block\.\d+\.block\.5|quantizer\.(pre|post)_module)\.(causal_mask|freqs_cis)")

__all__ = ["DAC", "PRESETS", "DACConfig", "dac_decoder_stage", "dac_encoder_stage", "init_random",
           "load_codec", "write_codec_pth"]


# ------------------------------------------------------------------------------------------ checkpoint
def codec_path(path: str | Path) -> Path:
    p = Path(path)
    return p / CODEC_FILE if p.is_dir() else p


def read_codec_state(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict]:
    """(tensors to load with new-style weight-norm names, ignored buffers, report). Never unpickles code."""
    p = codec_path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: codec.pth not found")
    try:
        sd = torch.load(str(p), map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:      # an old (non-zip) serialization cannot be memory-mapped
        sd = torch.load(str(p), map_location="cpu", weights_only=True)
    if isinstance(sd, dict) and isinstance(sd.get("generator"), dict):
        sd = sd["generator"]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{p}: expected a state dict of tensors (optionally under 'generator')")
    ignored = {k: v for k, v in sd.items() if IGNORED_BUFFERS.fullmatch(k)}
    load = legacy_weight_norm_to_new({k: v for k, v in sd.items() if k not in ignored})
    report = {"path": str(p),
              "ignored": {"tensors": len(ignored), "params": sum(v.numel() for v in ignored.values())},
              "legacy_weight_norm": sum(k.endswith(".weight_g") for k in sd)}
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
            raise CheckpointError(f"{source}: {key} does not match the RoPE table of the configured "
                                  f"transformer (shape {tuple(t.shape)} vs {tuple(ours.shape)}); "
                                  "wrong config?")


def load_codec(path: str | Path, cfg: DACConfig | None = None, cls: type[DAC] = DAC) -> tuple[DAC, dict]:
    cfg = cfg or PRESETS["full"]
    tensors, ignored, report = read_codec_state(path)
    model = cls(cfg)
    src = str(codec_path(path))
    load_strict(model, tensors, source=src)
    _check_rope_buffers(model, ignored, src)
    report["sha256"] = sha256_of(codec_path(path))
    return model.eval(), report


def init_random(model: DAC, seed: int = 0) -> DAC:
    """Deterministic random weights with trained-like scales: unit-ish activations through the residual
    stacks, snake alphas around 1, codebooks spread on the sphere: decode gives audio-range, unsaturated
    output."""
    g = torch.Generator().manual_seed(seed)
    last_conv = f"decoder.model.{len(model.decoder.model) - 2}.conv."
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "alpha":
                p.copy_(torch.rand(p.shape, generator=g) * 1.5 + 0.25)
            elif leaf == "gamma":
                p.copy_(torch.rand(p.shape, generator=g) * 0.2 + 0.05)
            elif leaf == "original0":            # weight-norm magnitude g: sets each output channel's gain
                # residual branches (ResidualUnit's k1 conv) and the final decoder conv start small
                gain = 0.3 if (".block.3.conv." in name or name.startswith(last_conv)) else 1.0
                p.copy_(gain * (0.5 + torch.rand(p.shape, generator=g)))
            elif "norm" in name and leaf == "weight" and p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif leaf == "bias":
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
            elif "codebook" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel() if p.dim() > 1 else p.numel()
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
    return model.eval()


def write_codec_pth(model: DAC, path: str | Path, generator_wrapper: bool = True, legacy_vq: bool = True,
                    legacy_all: bool = False, with_buffers: bool = True) -> Path:
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


# ----------------------------------------------------------------------------------------------- passes


def decoder_unused(cfg: DACConfig) -> list[str]:
    """What decode never reads: the encoder, the encode-side quantizer modules and every VQ in_proj."""
    return (["encoder", "quantizer.pre_module", "quantizer.downsample",
             "quantizer.semantic_quantizer.quantizers.0.in_proj"]
            + [f"quantizer.quantizer.quantizers.{i}.in_proj" for i in range(cfg.n_codebooks)])


def encoder_unused(cfg: DACConfig) -> list[str]:
    """What encode never reads: the decoder, post_module/upsample (they only rebuild z, which encode discards)
    and the last residual out_proj (it only feeds Σ z_q)."""
    return ["decoder", "quantizer.post_module", "quantizer.upsample",
            f"quantizer.quantizer.quantizers.{cfg.n_codebooks - 1}.out_proj"]


def _prune(names: list[str]):
    def prune(m: nn.Module) -> dict[str, Any]:
        return prune_submodules(m, names)
    return prune


def count_stage_params(cfg: DACConfig) -> dict[str, dict]:
    """Parameter counts of the whole codec and of each pruned stage, on the meta device (no memory)."""
    from ..passes import count_parameters

    out = {}
    with torch.device("meta"):
        full = DAC(cfg)
        out["codec"] = count_parameters(full)
        for stage, names in (("dac_decoder", decoder_unused(cfg)), ("dac_encoder", encoder_unused(cfg))):
            m = DAC(cfg)
            rep = prune_submodules(m, names)
            out[stage] = {"kept": rep["kept"], "dropped": rep["dropped"]}
    return out


# ------------------------------------------------------------------------------------------- stage specs
def config_for_checkpoint(path: str | Path, prefer: str | None = None) -> DACConfig:
    """codec.pth carries no config: pick the preset whose module tree has exactly the checkpoint's tensor
    names and shapes (the requested preset first, then `full`). No match is an error naming the first
    difference."""
    tensors, _, _ = read_codec_state(path)
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    order = [n for n in (prefer, "full") if n in PRESETS] + [n for n in PRESETS if n not in (prefer, "full")]
    first_diff = None
    for name in dict.fromkeys(order):
        with torch.device("meta"):
            own = {k: tuple(v.shape) for k, v in DAC(PRESETS[name]).state_dict().items()}
        if own == shapes:
            return PRESETS[name]
        if first_diff is None:
            diff = sorted(set(own) ^ set(shapes)) or [k for k in sorted(own) if own[k] != shapes[k]]
            first_diff = f"{name}: {diff[0]!r}"
    raise CheckpointError(f"{codec_path(path)}: matches no DAC preset ({', '.join(PRESETS)}); "
                          f"first difference against {first_diff}")


def _config(opts) -> DACConfig:
    return config_for_checkpoint(opts.checkpoint, opts.preset) if opts.checkpoint else PRESETS[opts.preset]


def _config_json(cfg: DACConfig) -> dict:
    d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}
    d["samples_per_frame"] = cfg.samples_per_frame
    return d


def _module_factory(opts, cfg: DACConfig, cls: type[DAC], report: dict):
    def make_module() -> nn.Module:
        if opts.checkpoint:
            model, rep = load_codec(opts.checkpoint, cfg, cls)
            report.update(rep)
            return model
        report.update({"random_weights": True, "seed": opts.seed})
        return init_random(cls(cfg), opts.seed)
    return make_module


def codes_input(cfg: DACConfig) -> dict:
    return {"name": "codes", "dtype": "int64", "shape": ["batch", cfg.num_codebooks, "frames"], "pad": 0,
            "range": {"dim": 1, "low": 0, "high": cfg.codebook_sizes}}


def random_codes(cfg: DACConfig, batch: int, frames: int, g: torch.Generator) -> torch.Tensor:
    cols = [torch.randint(0, n, (batch, 1, frames), generator=g) for n in cfg.codebook_sizes]
    return torch.cat(cols, dim=1)


def dac_decoder_stage(opts) -> StageSpec:
    cfg = _config(opts)
    report: dict = {}
    frames = frame_sizes(opts.streaming, pow2=opts.pow2_frames, explicit=opts.frame_buckets)
    if frames[-1] > cfg.quantizer_block_size:
        raise ValueError(f"dac_decoder: frame bucket {frames[-1]} exceeds the post_module block_size "
                         f"{cfg.quantizer_block_size}")
    plan = BucketPlan({"batch": batch_sizes(opts.max_batch, opts.batch_buckets), "frames": frames})
    dtype = opts.dtype or torch.float32

    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        return {"codes": random_codes(cfg, sizes["batch"], sizes["frames"], g)}

    return StageSpec(
        family=FAMILY, name="dac_decoder", kind="codec_decoder",
        make_module=_module_factory(opts, cfg, DACDecoder, report),
        passes=[_prune(decoder_unused(cfg)), bake_weight_norm, bake_snake, fuse_projections],
        plan=plan, make_inputs=make_inputs, inputs=[codes_input(cfg)],
        outputs=[{"name": "wav", "dtype": "float32",
                  "shape": ["batch", 1, ["frames", cfg.samples_per_frame]]}],
        dtype=dtype,
        # measured on the tiny preset (CPU): fp32 ≈7e-7 (kernel-order noise); bf16 ≈1.3e-2 vs fp32 eager.
        tolerance=1e-4 if dtype == torch.float32 else 5e-2,
        metadata={"sample_rate": cfg.sample_rate, "samples_per_frame": cfg.samples_per_frame,
                  "num_codebooks": cfg.num_codebooks, "codebook_sizes": cfg.codebook_sizes,
                  "streaming": asdict(opts.streaming)},
        config=_config_json(cfg), checkpoint_report=report,
        golden_sizes=[{"batch": 1, "frames": max(1, frames[0] - 3)}],
    )


def encoder_sample_buckets(cfg: DACConfig, seconds: tuple[float, ...]) -> tuple[int, ...]:
    spf = cfg.samples_per_frame
    return tuple(sorted({math.ceil(s * cfg.sample_rate / spf) * spf for s in seconds}))


def dac_encoder_stage(opts) -> StageSpec:
    cfg = _config(opts)
    report: dict = {}
    samples = encoder_sample_buckets(cfg, tuple(opts.encoder_seconds))
    if samples[-1] // cfg.hop_length > cfg.encoder_block_size:
        raise ValueError(f"dac_encoder: {samples[-1]} samples exceed the encoder transformer block_size "
                         f"({cfg.encoder_block_size} latent frames)")
    if samples[-1] // cfg.samples_per_frame > cfg.quantizer_block_size:
        raise ValueError(f"dac_encoder: {samples[-1]} samples exceed the pre_module block_size")
    plan = BucketPlan({"samples": samples})

    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        n = sizes["samples"]
        t = torch.arange(n, dtype=torch.float32) / cfg.sample_rate
        f0 = 110.0 + 330.0 * torch.rand((), generator=g)
        tone = 0.3 * torch.sin(2 * math.pi * f0 * t * (1 + 0.5 * t))          # a chirp: varying frames
        noise = 0.05 * torch.randn(n, generator=g)
        return {"audio": (tone + noise).view(1, 1, n)}

    return StageSpec(
        family=FAMILY, name="dac_encoder", kind="codec_encoder",
        make_module=_module_factory(opts, cfg, DACEncoder, report),
        passes=[_prune(encoder_unused(cfg)), bake_weight_norm, bake_snake, fuse_projections],
        plan=plan, make_inputs=make_inputs,
        inputs=[{"name": "audio", "dtype": "float32", "shape": [1, 1, "samples"], "pad": 0.0}],
        # "frames" is not a bucket axis: codec_encoder derives it as ⌈samples / samples_per_frame⌉
        outputs=[{"name": "codes", "dtype": "int64", "shape": [1, cfg.num_codebooks, "frames"]}],
        dtype=opts.dtype or torch.float32, fp32_only=True,
        tolerance=1e-4,        # codes are integers: they must match exactly whatever this says
        metadata={"sample_rate": cfg.sample_rate, "samples_per_frame": cfg.samples_per_frame,
                  "num_codebooks": cfg.num_codebooks, "codebook_sizes": cfg.codebook_sizes,
                  "max_samples": samples[-1]},
        config=_config_json(cfg), checkpoint_report=report,
        golden_sizes=[{"samples": samples[0] - 3000}],
    )
