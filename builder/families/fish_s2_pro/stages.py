"""Fish Speech S2 Pro stage recipes: `fast_ar` (codebook predictor), `dac_decoder` and `dac_encoder` (pruned DAC,
encoder always fp32)."""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...buckets import BucketPlan, batch_sizes, frame_sizes, off_bucket_frames
from ...checkpoint import construct
from ...options import OptionsError
from ...passes import bake_snake, bake_weight_norm, count_parameters, fuse_projections, prune_submodules
from ...passes.numerics import measure_numerics
from ...predictor import (
    off_bucket_batch,
    random_sampling_inputs,
    reference_margins,
    sampling_inputs,
    use_predictor_kernels,
    use_sampler_kernel,
)
from ...stage_spec import TF32_TOLERANCE, StageSpec
from . import FAMILY
from .checkpoint import init_random_dac, init_random_fast_ar, load_codec, load_fast_ar
from .config import (
    DAC_PRESETS,
    FAST_AR_PRESETS,
    DACConfig,
    codec_path,
    dac_config_from_checkpoint,
    fast_ar_config_from_checkpoint,
)
from .dac import DAC, DACDecoder, DACEncoder
from .dac_nlc import channels_last_dac_decoder, channels_last_dac_encoder
from .fast_ar import FastAR, prune_fast_ar
from .options import DAC_DECODER_PRECISION_BY_DEVICE, FishS2Options

# The encoder's off-bucket golden case: this many samples short of the smallest length bucket (padding).
OFF_BUCKET_SAMPLES = 3000
# Golden fast_ar inputs: this fraction of rows carry <|im_end|>, a non-semantic slow-AR token.
NON_SEMANTIC_FRACTION = 0.2
IM_END_TOKEN = 151645


# ---------------------------------------------------------------------------------------------- DAC codec
def decoder_unused(cfg: DACConfig) -> list[str]:
    """What decode never reads: the encoder, the encode-side quantizer modules and every VQ in_proj."""
    return [
        "encoder",
        "quantizer.pre_module",
        "quantizer.downsample",
        "quantizer.semantic_quantizer.quantizers.0.in_proj",
    ] + [f"quantizer.quantizer.quantizers.{i}.in_proj" for i in range(cfg.n_codebooks)]


def encoder_unused(cfg: DACConfig) -> list[str]:
    """What encode never reads: the decoder, post_module/upsample (they only rebuild z, which encode discards)
    and the last residual out_proj (it only feeds Σ z_q)."""
    return [
        "decoder",
        "quantizer.post_module",
        "quantizer.upsample",
        f"quantizer.quantizer.quantizers.{cfg.n_codebooks - 1}.out_proj",
    ]


def _prune(names: list[str]):
    def prune(m: nn.Module) -> dict[str, Any]:
        return prune_submodules(m, names)

    return prune


def count_stage_params(cfg: DACConfig) -> dict[str, dict]:
    """Parameter counts of the whole codec and of each pruned stage, on the meta device (no memory)."""
    out = {}
    with torch.device("meta"):
        full = DAC(cfg)
        out["codec"] = count_parameters(full)
        for stage, names in (("dac_decoder", decoder_unused(cfg)), ("dac_encoder", encoder_unused(cfg))):
            m = DAC(cfg)
            rep = prune_submodules(m, names)
            out[stage] = {"kept": rep["kept"], "dropped": rep["dropped"]}
    return out


def dac_config(opts: FishS2Options) -> DACConfig:
    return dac_config_from_checkpoint(opts.checkpoint, opts.preset) if opts.checkpoint else DAC_PRESETS[opts.preset]


def _config_json(cfg: DACConfig) -> dict:
    d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}
    d["samples_per_frame"] = cfg.samples_per_frame
    return d


def _module_factory(opts: FishS2Options, cfg: DACConfig, cls: type[DAC], report: dict):
    def make_module() -> nn.Module:
        if opts.checkpoint:
            model, rep = load_codec(opts.checkpoint, cfg, cls)
            report.update(rep)
            return model
        report.update({"random_weights": True, "seed": opts.seed})
        return init_random_dac(construct(cls, cfg), opts.seed)

    return make_module


def codes_input(cfg: DACConfig) -> dict:
    return {
        "name": "codes",
        "dtype": "int64",
        "shape": ["batch", cfg.num_codebooks, "frames"],
        "pad": 0,
        "range": {"dim": 1, "low": 0, "high": cfg.codebook_sizes},
    }


def random_codes(cfg: DACConfig, batch: int, frames: int, g: torch.Generator) -> torch.Tensor:
    cols = [torch.randint(0, n, (batch, 1, frames), generator=g) for n in cfg.codebook_sizes]
    return torch.cat(cols, dim=1)


@dataclass(frozen=True)
class DecoderPrecision:
    """What one `--dac-decoder-precision` value builds: compute dtype, the conv kernels' fp32 GEMM mode, whether
    aten convs/matmuls may use TF32 (runtime `allow_tf32`), the golden-check tolerance and the issue's criterion."""

    dtype: torch.dtype
    conv_precision: str
    allow_tf32: bool
    # measured on the tiny preset (CPU): fp32 ≈7e-7 (kernel-order noise); bf16 ≈1.3e-2 vs fp32 eager; TF32: the
    # builder's TF32 tolerance (H200 artifact 7.3e-4, stage_spec.TF32_TOLERANCE)
    tolerance: float
    criterion: dict[str, float]


DECODER_PRECISIONS = dict(  # keyed by the option's values (not a dtype table: those live in runtime/dtypes.py)
    bf16=DecoderPrecision(torch.bfloat16, "ieee", False, 5e-2, {"snr_db_min": 35.0}),
    tf32=DecoderPrecision(torch.float32, "tf32", True, TF32_TOLERANCE, {"rel_error_max": 1e-3}),
    fp32=DecoderPrecision(torch.float32, "tf32x3", False, 1e-4, {"rel_error_max": 1e-4}),
)
_DTYPE_PRECISIONS = {torch.float32: ("fp32", "tf32"), torch.bfloat16: ("bf16",)}


def dac_decoder_precision(opts: FishS2Options) -> tuple[str, str]:
    """(precision, what chose it): `--dac-decoder-precision`, else `--dtype` (float32 → exact fp32, bfloat16 →
    bf16), else the default of the device built for (DAC_DECODER_PRECISION_BY_DEVICE; options without a device:
    the CPU one). A `--dtype` that contradicts the precision is an OptionsError."""
    allowed = _DTYPE_PRECISIONS.get(opts.dtype) if opts.dtype is not None else None
    if opts.dtype is not None and allowed is None:
        raise OptionsError(
            f"dac_decoder: --dtype {str(opts.dtype).removeprefix('torch.')} is not one of its "
            f"numerics; use --dac-decoder-precision {'|'.join(DECODER_PRECISIONS)}"
        )
    if opts.dac_decoder_precision is not None:
        if allowed is not None and opts.dac_decoder_precision not in allowed:
            raise OptionsError(
                f"dac_decoder: --dtype {str(opts.dtype).removeprefix('torch.')} contradicts "
                f"--dac-decoder-precision {opts.dac_decoder_precision}"
            )
        return opts.dac_decoder_precision, "--dac-decoder-precision"
    if allowed is not None:
        return allowed[0], "--dtype"
    return _default_precision(opts), f"default ({opts.device or 'cpu'})"


def _default_precision(opts: FishS2Options) -> str:
    """The dac_decoder's default precision on the device the options are for (none said: the CPU one)."""
    return DAC_DECODER_PRECISION_BY_DEVICE[opts.device or "cpu"]


def dac_decoder_stage(opts: FishS2Options) -> StageSpec:
    cfg = dac_config(opts)
    report: dict = {}
    frames = frame_sizes(opts.streaming, pow2=opts.pow2_frames, explicit=opts.frame_buckets)
    if frames[-1] > cfg.quantizer_block_size:
        raise OptionsError(
            f"dac_decoder: frame bucket {frames[-1]} exceeds the post_module block_size {cfg.quantizer_block_size}"
        )
    plan = opts.codec_plan(batch_sizes(opts.max_batch, opts.batch_buckets), frames)
    name, chosen_by = dac_decoder_precision(opts)
    prec = DECODER_PRECISIONS[name]

    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        return {"codes": random_codes(cfg, sizes["batch"], sizes["frames"], g)}

    numerics = {
        "precision": name,
        "chosen_by": chosen_by,
        "default": _default_precision(opts),
        "compute_dtype": str(prec.dtype).removeprefix("torch."),
        "conv_kernels": prec.conv_precision,
        "criterion": prec.criterion,
    }
    channels_last = functools.partial(channels_last_dac_decoder, precision=prec.conv_precision)
    # the error of this precision against fp32, measured at build time (metadata "numerics")
    measure = measure_numerics(
        numerics, prec.dtype, make_inputs, {"batch": 1, "frames": frames[0]}, prepare=channels_last
    )
    metadata = {
        "sample_rate": cfg.sample_rate,
        "samples_per_frame": cfg.samples_per_frame,
        "num_codebooks": cfg.num_codebooks,
        "codebook_sizes": cfg.codebook_sizes,
        "streaming": asdict(opts.streaming),
        "numerics": numerics,
    }
    if prec.allow_tf32:
        metadata["allow_tf32"] = True
    return StageSpec(
        family=FAMILY.name,
        name="dac_decoder",
        kind="codec_decoder",
        make_module=_module_factory(opts, cfg, DACDecoder, report),
        passes=[_prune(decoder_unused(cfg)), bake_weight_norm, bake_snake, fuse_projections, measure],
        kernel_passes=[channels_last],
        # every precision: the conv kernels beat Inductor's cuDNN code and eager at each timed bucket (H100, module
        # comment of options.py; exact fp32 24.6 ms vs 57.3 ms eager with TF32 off at b4_f50)
        cuda_auto_kernels="ttsaot",
        plan=plan,
        hot_sizes=opts.codec_hot_sizes(frames),
        make_inputs=make_inputs,
        inputs=[codes_input(cfg)],
        outputs=[{"name": "wav", "dtype": "float32", "shape": ["batch", 1, ["frames", cfg.samples_per_frame]]}],
        dtype=prec.dtype,
        tolerance=prec.tolerance,
        metadata=metadata,
        config=_config_json(cfg),
        checkpoint_report=report,
        golden_sizes=[off_bucket_frames(frames)],
    )


def encoder_sample_buckets(cfg: DACConfig, seconds: tuple[float, ...]) -> tuple[int, ...]:
    spf = cfg.samples_per_frame
    return tuple(sorted({math.ceil(s * cfg.sample_rate / spf) * spf for s in seconds}))


def encoder_code_margins(module: nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The golden cases' near-tie margins of `codes` [1, codebooks, frames] (StageSpec.reference_margins): each
    quantizer choice's distance gap between its two nearest codebook entries (`dac.nearest_code`). A choice with a
    gap below the stage's tolerance is not decided by the math at fp32: another implementation's rounding may pick
    the other entry (the tiny preset's 2-second golden case: a gap of 1.5e-6 at one frame, where fp64 eager and
    the H200 package both took the other code and the frame's nine residual codes changed with it). Verify then
    allows that code and the frame's later ones to differ (runtime/verify.py `code_rows`)."""
    margins: list[torch.Tensor] = []
    with torch.no_grad():
        module.encode(inputs["audio"], margins)
    return {"codes": torch.stack(margins, dim=1)}


def dac_encoder_stage(opts: FishS2Options) -> StageSpec:
    cfg = dac_config(opts)
    report: dict = {}
    samples = encoder_sample_buckets(cfg, tuple(opts.encoder_seconds))
    if samples[-1] // cfg.hop_length > cfg.encoder_block_size:
        raise OptionsError(
            f"dac_encoder: {samples[-1]} samples exceed the encoder transformer block_size "
            f"({cfg.encoder_block_size} latent frames)"
        )
    if samples[-1] // cfg.samples_per_frame > cfg.quantizer_block_size:
        raise OptionsError(f"dac_encoder: {samples[-1]} samples exceed the pre_module block_size")
    plan = BucketPlan({"samples": samples})

    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        n = sizes["samples"]
        t = torch.arange(n, dtype=torch.float32) / cfg.sample_rate
        f0 = 110.0 + 330.0 * torch.rand((), generator=g)
        tone = 0.3 * torch.sin(2 * math.pi * f0 * t * (1 + 0.5 * t))  # a chirp: varying frames
        noise = 0.05 * torch.randn(n, generator=g)
        return {"audio": (tone + noise).view(1, 1, n)}

    return StageSpec(
        family=FAMILY.name,
        name="dac_encoder",
        kind="codec_encoder",
        make_module=_module_factory(opts, cfg, DACEncoder, report),
        passes=[_prune(encoder_unused(cfg)), bake_weight_norm, bake_snake, fuse_projections],
        # code-exact by algorithm: the conv kernels' tf32x3 (≈ fp32) on the tensor cores, never a lower precision
        kernel_passes=[functools.partial(channels_last_dac_encoder, precision="tf32x3")],
        # H100, 10 s clip: 17.9 ms with codes equal to exact fp32's vs 31.0 ms for the Inductor (cuDNN, TF32 off)
        # artifact (bench/results/nvidia-h100/codec_stages_dac_encoder_vae_decoder_vs_inductor.json)
        cuda_auto_kernels="ttsaot",
        plan=plan,
        # reference audio of any length, encoded once per voice: no length is hit more than another
        hot_sizes={"samples": ()},
        # the buckets are whole frames and the strided conv stack needs them (torch.export refuses a plain range)
        axis_steps={"samples": cfg.samples_per_frame},
        make_inputs=make_inputs,
        inputs=[{"name": "audio", "dtype": "float32", "shape": [1, 1, "samples"], "pad": 0.0}],
        # "frames" is not a bucket axis: codec_encoder derives it as ⌈samples / samples_per_frame⌉
        outputs=[{"name": "codes", "dtype": "int64", "shape": [1, cfg.num_codebooks, "frames"]}],
        dtype=opts.dtype or torch.float32,
        fp32_only=True,
        # codes are integers: each must equal the reference's, except where the reference's choice was a near-tie
        # (two codebook entries closer than this in distance, `encoder_code_margins`)
        tolerance=1e-4,
        reference_margins=encoder_code_margins,
        metadata={
            "sample_rate": cfg.sample_rate,
            "samples_per_frame": cfg.samples_per_frame,
            "num_codebooks": cfg.num_codebooks,
            "codebook_sizes": cfg.codebook_sizes,
            "max_samples": samples[-1],
        },
        config=_config_json(cfg),
        checkpoint_report=report,
        golden_sizes=[{"samples": samples[0] - OFF_BUCKET_SAMPLES}],
        # Prepared last, its export (~35 s on 2 cores beside two compiles) and its one dynamic package ended the tiny
        # CPU build, compiling alone with the other core idle: 194-215 s in the family's order, 170-177 s prepared
        # first (bench/results/cpu/probes/tiny_prepare_first_lending/). On CUDA its 4 packages compile longest of the
        # family (one 320 s against 241-297 s for the DAC decoder's, nvidia-h200/probes/builds_3e10dc8.json).
        prepare_first_on=("cpu", "cuda"),
    )


# ------------------------------------------------------------------------------------------------ fast_ar
def fast_ar_stage(opts: FishS2Options) -> StageSpec:
    cfg = fast_ar_config_from_checkpoint(opts.checkpoint) if opts.checkpoint else FAST_AR_PRESETS[opts.preset]
    with_emb = bool(opts.fast_ar_with_embedding)
    report: dict = {}

    def make_module() -> nn.Module:
        if opts.checkpoint:
            model, rep = load_fast_ar(opts.checkpoint, cfg, with_emb)
            report.update(rep)
            return model
        report.update({"random_weights": True, "seed": opts.seed})
        return init_random_fast_ar(construct(FastAR, cfg, with_emb), opts.seed)

    n_steps, R = cfg.num_codebooks - 1, cfg.residual_codebook_size
    dtype = opts.dtype or torch.bfloat16
    batches = batch_sizes(opts.max_batch, opts.batch_buckets)

    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        B = sizes["batch"]
        start = cfg.semantic_start_token_id
        token = torch.randint(start, start + cfg.vocab_size, (B,), generator=g)
        token[torch.rand(B, generator=g) < NON_SEMANTIC_FRACTION] = IM_END_TOKEN  # a non-semantic row
        out = {
            "hidden": torch.randn(B, cfg.dim, generator=g),
            "token": token,
            **random_sampling_inputs(B, n_steps, R, g, noise_dominated=dtype != torch.float32),
        }
        if with_emb:
            out["token_embed"] = torch.randn(B, cfg.dim, generator=g)
        return out

    inputs = [
        {"name": "hidden", "dtype": "float32", "shape": ["batch", cfg.dim]},
        # any slow-AR token: a non-semantic one gives code 0 = the nearest semantic code (upstream's clamp);
        # ids outside the text vocabulary are an InputRangeError
        {
            "name": "token",
            "dtype": "int64",
            "shape": ["batch"],
            "pad": cfg.semantic_start_token_id,
            "range": {"dim": 0, "low": 0, "high": [cfg.text_vocab_size]},
        },
        *sampling_inputs(n_steps, R),
    ]
    outputs = [{"name": "codes", "dtype": "int64", "shape": ["batch", cfg.num_codebooks]}]
    if with_emb:
        inputs.append({"name": "token_embed", "dtype": "float32", "shape": ["batch", cfg.dim]})
        outputs.append({"name": "next_embed", "dtype": "float32", "shape": ["batch", cfg.dim]})
    return StageSpec(
        family=FAMILY.name,
        name="fast_ar",
        kind="codebook_predictor",
        make_module=make_module,
        passes=[prune_fast_ar, fuse_projections],
        kernel_passes=[use_predictor_kernels, use_sampler_kernel],
        # bf16 on CUDA: the kernel layer by default since its per-layer copies are gone (H100, full, batch 1, one
        # process: 4.26 vs 4.75 ms per frame with Inductor's code, 4.20 vs 4.40 in another run; 253 vs 574 kernels
        # per frame; golden codes verified on the GPU; bench/results/nvidia-h100/probes/predictor_copies/). Before,
        # the two were even (probes/predictor_kernels/).
        cuda_auto_kernels="ttsaot" if dtype == torch.bfloat16 else "inductor",
        plan=BucketPlan({"batch": batches}),
        make_inputs=make_inputs,
        inputs=inputs,
        outputs=outputs,
        dtype=dtype,
        # next_embed: fp32 kernel-order noise; bf16 rounding of a [B,D] sum (measured < 1e-2 on tiny).
        tolerance=1e-4 if dtype == torch.float32 else 2e-2,
        metadata={
            "num_codebooks": cfg.num_codebooks,
            "sampled_codebooks": n_steps,
            "noise_width": R,
            "code0": {"from": "token", "offset": cfg.semantic_start_token_id, "size": cfg.vocab_size},
            "codebook_sizes": [cfg.vocab_size] + [R] * n_steps,
            "with_embedding": with_emb,
            "sampling_defaults": {"temperature": 0.8, "top_k": 30, "top_p": 0.9},
        },
        config=asdict(cfg),
        checkpoint_report=report,
        golden_sizes=off_bucket_batch(batches),
        reference_margins=functools.partial(reference_margins, first="token"),
    )


STAGES = {"fast_ar": fast_ar_stage, "dac_decoder": dac_decoder_stage, "dac_encoder": dac_encoder_stage}


def default_stages(opts: FishS2Options) -> tuple[str, ...]:
    """A folder with only codec.pth serves the DAC stages; one with only the LLM (config.json + safetensors) the
    Fast AR; both, or random weights, all three."""
    if not opts.checkpoint:
        return tuple(STAGES)
    has_codec = codec_path(opts.checkpoint).is_file()
    has_lm = (Path(opts.checkpoint) / "config.json").is_file()
    chosen = tuple(n for n in STAGES if (has_lm if n == "fast_ar" else has_codec))
    return chosen or tuple(STAGES)  # neither: let every stage name the file it misses
