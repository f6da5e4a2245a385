"""Qwen3-TTS 12 Hz stage recipes: what the builder exports for `code2wav` and `code_predictor`."""

from __future__ import annotations

import functools
from dataclasses import asdict

import torch
from torch import nn

from ...buckets import BucketPlan, batch_sizes, frame_sizes, off_bucket_frames
from ...checkpoint import construct
from ...options import OptionsError
from ...passes import bake_snake, depthwise_conv_as_shifts, fuse_projections
from ...predictor import (
    off_bucket_batch,
    random_sampling_inputs,
    reference_margins,
    sampling_inputs,
    use_predictor_kernels,
    use_sampler_kernel,
)
from ...stage_spec import StageSpec
from . import FAMILY
from .checkpoint import init_random_code2wav, init_random_code_predictor, load_code2wav, load_code_predictor
from .code2wav import Code2Wav
from .code2wav_nlc import channels_last_code2wav
from .code_predictor import CodePredictor, prune_code_predictor
from .config import (
    CODE2WAV_PRESETS,
    CODE_PREDICTOR_PRESETS,
    SAMPLE_RATE,
    Code2WavConfig,
    CodePredictorConfig,
    code2wav_config_from_checkpoint,
    code_predictor_config_from_checkpoint,
    has_code_predictor,
)
from .options import Qwen3TTSOptions

# Golden inputs: this fraction of code_predictor rows get a special talker token as code0 (EOS-like: zero row).
SPECIAL_CODE0_FRACTION = 0.15
EOS_OFFSET = 102  # an EOS-like talker token: vocab_size + 102 (clipped to the talker vocabulary)


# ---------------------------------------------------------------------------------------------- code2wav
def _codes_input(cfg: Code2WavConfig) -> dict:
    return {
        "name": "codes",
        "dtype": "int64",
        "shape": ["batch", cfg.num_quantizers, "frames"],
        "pad": 0,
        "range": {"dim": 1, "low": 0, "high": [cfg.codebook_size] * cfg.num_quantizers},
    }


def code2wav_stage(opts: Qwen3TTSOptions) -> StageSpec:
    cfg = code2wav_config_from_checkpoint(opts.checkpoint) if opts.checkpoint else CODE2WAV_PRESETS[opts.preset]
    report: dict = {}

    def make_module() -> nn.Module:
        if opts.checkpoint:
            model, rep = load_code2wav(opts.checkpoint, cfg)
            report.update(rep)
            return model
        report.update({"random_weights": True, "seed": opts.seed})
        return init_random_code2wav(construct(Code2Wav, cfg), opts.seed)

    def bake_codebooks(m: nn.Module) -> dict:
        folded = m.quantizer.bake_codebooks()
        return {
            "pass": "bake_codebooks",
            "books": cfg.num_quantizers,
            "folded": {"quantizer codebooks (cluster_usage into the table)": folded},
        }

    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        return {
            "codes": torch.randint(
                0, cfg.codebook_size, (sizes["batch"], cfg.num_quantizers, sizes["frames"]), generator=g
            )
        }

    streaming = opts.streaming
    frames = frame_sizes(streaming, pow2=opts.pow2_frames, explicit=opts.frame_buckets)
    if frames[-1] > cfg.max_position_embeddings:
        raise OptionsError(
            f"code2wav: frame bucket {frames[-1]} exceeds max_position_embeddings {cfg.max_position_embeddings}"
        )
    plan = opts.codec_plan(batch_sizes(opts.max_batch, opts.batch_buckets), frames)
    dtype = opts.dtype or torch.bfloat16
    cfg_json = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}
    return StageSpec(
        family=FAMILY.name,
        name="code2wav",
        kind="codec_decoder",
        make_module=make_module,
        passes=[bake_codebooks, bake_snake, fuse_projections, depthwise_conv_as_shifts],
        # kernels=ttsaot: channels-last on the conv kernels; an fp32 build's convs run tf32x3 (≈ fp32 accuracy)
        kernel_passes=[functools.partial(channels_last_code2wav, precision="tf32x3")],
        # bf16 (the default) is built and timed on the H100 (1.48 / 4.12 ms, 50 frames, B=1 / 4); fp32 (tf32x3) opt-in
        cuda_auto_kernels="ttsaot" if dtype == torch.bfloat16 else "inductor",
        plan=plan,
        hot_sizes=opts.codec_hot_sizes(frames),
        make_inputs=make_inputs,
        inputs=[_codes_input(cfg)],
        outputs=[{"name": "wav", "dtype": "float32", "shape": ["batch", 1, ["frames", cfg.samples_per_frame]]}],
        dtype=dtype,
        # fp32: kernel-order noise only; bf16: measured ~1e-2 on random weights vs the fp32 reference.
        tolerance=1e-4 if dtype == torch.float32 else 5e-2,
        metadata={
            "sample_rate": SAMPLE_RATE,
            "samples_per_frame": cfg.samples_per_frame,
            "streaming": asdict(streaming),
            "receptive_field_frames": cfg.receptive_field_frames,
        },
        config=cfg_json,
        checkpoint_report=report,
        golden_sizes=[off_bucket_frames(frames)],
    )


# ---------------------------------------------------------------------------------------- code_predictor
def code_predictor_config(opts: Qwen3TTSOptions) -> CodePredictorConfig:
    if opts.checkpoint:
        return code_predictor_config_from_checkpoint(opts.checkpoint)
    return CODE_PREDICTOR_PRESETS["tiny" if opts.preset == "tiny" else opts.talker_size]


def code_predictor_stage(opts: Qwen3TTSOptions) -> StageSpec:
    cfg = code_predictor_config(opts)
    with_emb = opts.code_predictor_with_embedding
    report: dict = {}

    def make_module() -> nn.Module:
        if opts.checkpoint:
            model, rep = load_code_predictor(opts.checkpoint, cfg, with_emb)
            report.update(rep)
            return model
        report.update({"random_weights": True, "seed": opts.seed})
        return init_random_code_predictor(construct(CodePredictor, cfg, with_emb), opts.seed)

    n_steps, V = cfg.num_code_groups - 1, cfg.vocab_size
    dtype = opts.dtype or torch.bfloat16

    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        B = sizes["batch"]
        code0 = torch.randint(0, V, (B,), generator=g)
        code0[torch.rand(B, generator=g) < SPECIAL_CODE0_FRACTION] = min(V + EOS_OFFSET, cfg.talker_vocab_size - 1)
        return {
            "hidden": torch.randn(B, cfg.talker_hidden_size, generator=g),
            "code0": code0,
            **random_sampling_inputs(B, n_steps, V, g, noise_dominated=dtype != torch.float32),
        }

    batches = batch_sizes(opts.max_batch, opts.batch_buckets)
    outputs = [{"name": "codes", "dtype": "int64", "shape": ["batch", cfg.num_code_groups]}]
    if with_emb:
        outputs.append({"name": "next_embed", "dtype": "float32", "shape": ["batch", cfg.talker_hidden_size]})
    return StageSpec(
        family=FAMILY.name,
        name="code_predictor",
        kind="codebook_predictor",
        make_module=make_module,
        passes=[prune_code_predictor, fuse_projections],
        kernel_passes=[use_predictor_kernels, use_sampler_kernel],
        # bf16 on CUDA: the kernel layer by default (H100, 0.6B, batch 1, one process: 3.18 vs 4.18 ms per frame
        # with Inductor's code, golden codes verified on the GPU; bench/results/nvidia-h100/probes/predictor_copies/)
        cuda_auto_kernels="ttsaot" if dtype == torch.bfloat16 else "inductor",
        plan=BucketPlan({"batch": batches}),
        make_inputs=make_inputs,
        inputs=[
            {"name": "hidden", "dtype": "float32", "shape": ["batch", cfg.talker_hidden_size]},
            # any talker token: codec codes (< vocab_size) are predicted from; special tokens (EOS, …) give
            # an all-zero row; anything outside the talker vocabulary is an InputRangeError
            {
                "name": "code0",
                "dtype": "int64",
                "shape": ["batch"],
                "pad": 0,
                "range": {"dim": 0, "low": 0, "high": [cfg.talker_vocab_size]},
            },
            *sampling_inputs(n_steps, V),
        ],
        outputs=outputs,
        dtype=dtype,
        tolerance=1e-4 if dtype == torch.float32 else 2e-2,
        metadata={
            "num_codebooks": cfg.num_code_groups,
            "sampled_codebooks": n_steps,
            "noise_width": V,
            "code0": {"from": "code0", "offset": 0, "size": V, "invalid_rows": "zeroed"},
            "codebook_sizes": [V] * cfg.num_code_groups,
            "with_embedding": with_emb,
            "sampling_defaults": {"temperature": 0.9, "top_k": 50, "top_p": 1.0},
        },
        config=asdict(cfg),
        checkpoint_report=report,
        golden_sizes=off_bucket_batch(batches),
        reference_margins=functools.partial(reference_margins, first="code0"),
        # its export (~33 s on 2 cores) and one dynamic package, prepared after code2wav's, ended the tiny CPU build
        # 60 s after code2wav's compile; prepared first the two compiles end together: 151.1 / 172.9 s against
        # 172.4 / 177.8 s, within the 2-core box's spread (bench/results/cpu/probes/tiny_prepare_first_lending/).
        # On CUDA it goes first anyway (fewest buckets).
        prepare_first_on=("cpu",),
    )


STAGES = {"code2wav": code2wav_stage, "code_predictor": code_predictor_stage}


def default_stages(opts: Qwen3TTSOptions) -> tuple[str, ...]:
    # A speech-tokenizer-only checkpoint (no talker config) serves code2wav alone.
    if opts.checkpoint and not has_code_predictor(opts.checkpoint):
        return ("code2wav",)
    return tuple(STAGES)
