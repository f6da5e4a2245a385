"""VoxCPM2 stage recipes: the LM decode steps and prefills (`base_lm_*`, `residual_lm_*`, static KV caches passed
in), the patch generator `locdit`, the patch encoder `local_encoder` and the AudioVAE `vae_decoder` (fp32 always)."""

from __future__ import annotations

from dataclasses import asdict

import torch
from torch import nn

from ....runtime.dtypes import dtype_name
from ...buckets import BucketPlan, batch_sizes, frame_sizes, off_bucket_frames
from ...checkpoint import construct
from ...options import OptionsError
from ...passes import bake_snake, bake_weight_norm, fuse_projections
from ...stage_spec import StageSpec
from . import FAMILY
from .audio import LocalEncoderStage, LocDiTStage, euler_schedule, fold_time_embeddings, use_sequence_kernels
from .checkpoint import (
    init_random_audio,
    init_random_lm,
    init_random_vae,
    load_audio_stage_module,
    load_lm_stage_module,
    load_vae_decoder,
)
from .config import (
    AUDIO_PRESETS,
    DEFAULT_TIMESTEPS,
    LM_PRESETS,
    AudioConfig,
    MiniCPM4Config,
    audio_config_from_checkpoint,
    lm_config_from_checkpoint,
)
from .lm import STAGE_MODULES, use_decode_kernels
from .options import VoxCPM2Options
from .vae import AudioVAEDecoder, bake_sample_rate, receptive_field_frames
from .vae_nlc import channels_last_vae_decoder

LM_STAGES = ("base_lm_prefill", "base_lm_step", "residual_lm_prefill", "residual_lm_step")
AUDIO_STAGES = ("locdit", "local_encoder", "vae_decoder")
# Random weights: each audio stage draws from its own stream (seed + offset), so stages are independent.
SEED_OFFSET = {"locdit": 1, "local_encoder": 2, "vae_decoder": 3}


# ---------------------------------------------------------------------------------------------------- LMs
def cache_shape(cfg: MiniCPM4Config, batch: int | str, max_len: int) -> list:
    return [cfg.num_hidden_layers, batch, cfg.num_key_value_heads, max_len + 1, cfg.head_dim]


# fp32: kernel-order noise only (measured ≤ 5e-7 through the tiny CPU artifacts). bf16, measured eager bf16 vs
# fp32 on CPU (random weights, tiny and a 6-layer/512-wide config, 3 seeds): hidden ≤ 1.3e-2 and residual ≤ 1.2e-2,
# but fsq's round(tanh(x)·9)/9 is discontinuous: bf16 noise (≈ 9·2⁻⁸ before rounding) flips a few % of the latent
# levels, so lm_hidden reaches 5.6e-2 and the 2-wide stop logits 1.24e-1 (upstream in bf16 does the same);
# prefill mixes fsq at audio positions (≤ 2.5e-2).
BF16_TOLERANCE = {"base_lm_step": 0.25, "base_lm_prefill": 0.1, "residual_lm_step": 5e-2, "residual_lm_prefill": 5e-2}


def lm_stage(name: str, opts: VoxCPM2Options) -> StageSpec:
    cfg = lm_config_from_checkpoint(opts.checkpoint) if opts.checkpoint else LM_PRESETS[opts.preset]
    max_len = int(opts.max_len)
    is_base = name.startswith("base")
    is_step = name.endswith("_step")
    mcfg = cfg.lm if is_base else cfg.residual
    if max_len < 1 or max_len > mcfg.max_position_embeddings:
        raise OptionsError(
            f"{name}: max_len {max_len} must be in [1, max_position_embeddings={mcfg.max_position_embeddings}]"
        )
    dtype = opts.dtype or torch.bfloat16
    cdt = dtype_name(dtype)
    H = mcfg.hidden_size
    batches = batch_sizes(opts.max_batch, opts.batch_buckets)
    tokens = tuple(sorted(set(opts.prefill_buckets)))
    if not is_step and tokens[-1] > max_len:
        raise OptionsError(f"{name}: prefill bucket {tokens[-1]} exceeds max_len {max_len}")
    report: dict = {}

    def make_module() -> nn.Module:
        if opts.checkpoint:
            m, rep = load_lm_stage_module(name, opts.checkpoint, cfg, max_len)
            report.update(rep)
            return m
        report.update({"random_weights": True, "seed": opts.seed})
        return init_random_lm(construct(STAGE_MODULES[name], cfg, max_len), opts.seed)

    cache_in = [
        {"name": n, "dtype": cdt, "shape": cache_shape(mcfg, "batch", max_len), "pad": 0}
        for n in ("k_cache", "v_cache")
    ]
    f32 = "float32"
    if is_step:
        plan = BucketPlan({"batch": batches})
        rows = (
            [{"name": "embeds", "dtype": f32, "shape": ["batch", H], "pad": 0}]
            if is_base
            else [
                {"name": "lm_hidden", "dtype": f32, "shape": ["batch", H], "pad": 0},
                {"name": "feat_embed", "dtype": f32, "shape": ["batch", H], "pad": 0},
            ]
        )
        # positions may name the scratch slot (max_len) for idle rows
        inputs = (
            rows
            + [
                {
                    "name": "positions",
                    "dtype": "int64",
                    "shape": ["batch"],
                    "pad": max_len,
                    "range": {"dim": 0, "low": 0, "high": [max_len + 1]},
                }
            ]
            + cache_in
        )
        outputs = (
            [
                {"name": "hidden", "dtype": f32, "shape": ["batch", H]},
                {"name": "lm_hidden", "dtype": f32, "shape": ["batch", H]},
                {"name": "stop_logits", "dtype": f32, "shape": ["batch", 2]},
            ]
            if is_base
            else [{"name": "hidden", "dtype": f32, "shape": ["batch", H]}]
        )
        meta = {"position_input": "positions"}
    else:
        plan = BucketPlan({"batch": batches, "tokens": tokens})
        bt, bth = ["batch", "tokens"], ["batch", "tokens", H]
        rows = (
            [
                {
                    "name": "text_tokens",
                    "dtype": "int64",
                    "shape": bt,
                    "pad": 0,
                    "range": {"dim": 0, "low": 0, "high": [cfg.lm.vocab_size]},
                },
                {"name": "text_mask", "dtype": f32, "shape": bt, "pad": 0},
                {"name": "feat_embed", "dtype": f32, "shape": bth, "pad": 0},
                {"name": "feat_mask", "dtype": f32, "shape": bt, "pad": 0},
            ]
            if is_base
            else [
                {"name": "lm_hidden", "dtype": f32, "shape": bth, "pad": 0},
                {"name": "feat_embed", "dtype": f32, "shape": bth, "pad": 0},
                {"name": "feat_mask", "dtype": f32, "shape": bt, "pad": 0},
            ]
        )
        inputs = rows + [{"name": "lengths", "dtype": "int64", "shape": ["batch"], "pad": 0}] + cache_in
        outputs = [{"name": "lm_hidden" if is_base else "hidden", "dtype": f32, "shape": bth}]
        meta = {"length_input": "lengths"}
    cshape = cache_shape(mcfg, 1, max_len)

    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        B = sizes["batch"]
        caches = {n: torch.randn([*cshape[:1], B, *cshape[2:]], generator=g).to(dtype) for n in ("k_cache", "v_cache")}
        if is_step:
            pos = torch.randint(0, max_len, (B,), generator=g)
            x = (
                {"embeds": torch.randn(B, H, generator=g)}
                if is_base
                else {"lm_hidden": torch.randn(B, H, generator=g), "feat_embed": torch.randn(B, H, generator=g)}
            )
            return {**x, "positions": pos, **caches}
        T = sizes["tokens"]
        lengths = torch.randint(1, T + 1, (B,), generator=g)
        lengths[0] = T
        fm = (torch.rand(B, T, generator=g) < 0.5).float()
        x = {"feat_embed": torch.randn(B, T, H, generator=g), "feat_mask": fm}
        if is_base:
            x = {"text_tokens": torch.randint(0, cfg.lm.vocab_size, (B, T), generator=g), "text_mask": 1.0 - fm, **x}
        else:
            x = {"lm_hidden": torch.randn(B, T, H, generator=g), **x}
        return {**x, "lengths": lengths, **caches}

    golden = [{"batch": batches[0]}] if is_step else [{"batch": batches[0], "tokens": tokens[0]}]
    return StageSpec(
        family=FAMILY.name,
        name=name,
        kind="lm_step" if is_step else "lm_prefill",
        make_module=make_module,
        passes=[fuse_projections],
        plan=plan,
        make_inputs=make_inputs,
        inputs=inputs,
        outputs=outputs,
        dtype=dtype,
        tolerance=1e-4 if dtype == torch.float32 else BF16_TOLERANCE[name],
        metadata={
            "lm": "base_lm" if is_base else "residual_lm",
            "max_len": max_len,
            "scratch_position": max_len,
            "cache_inputs": ["k_cache", "v_cache"],
            "cache_shape": cache_shape(mcfg, "batch", max_len),
            "cache_dtype": cdt,
            "hidden_size": H,
            **meta,
        },
        config=cfg.to_json(),
        checkpoint_report=report,
        golden_sizes=golden,
        golden_buckets=False,
        kernel_passes=[use_decode_kernels] if is_step else [],
        # Kernel layer by default on CUDA where it was built, checked and timed on a GPU, i.e. both bf16 steps (H100,
        # bench/results/nvidia-h100/decode_stages*.json, outputs within the stage tolerance): base_lm_step 1.30x /
        # 1.22x torch.compile + graph at B=1 / 16, residual_lm_step 1.36x at B=1 (2.85x the Inductor artifact).
        cuda_auto_kernels="ttsaot" if is_step and dtype == torch.bfloat16 else "inductor",
        # A prefill runs once per request: ONE dynamic package serves its whole plan on CUDA too. H200, base LM,
        # bf16: 1 package for 12 buckets built in 125 s where 4 static ones took 177 s, per call +6.8 % at b1_t64,
        # +3.6 % at b1_t256, none at b4 (bench/results/nvidia-h200/probes/cuda_dynamic_prefill/).
        cuda_auto_packages="off" if is_step else "on",
    )


# ------------------------------------------------------------------------------ locdit, local_encoder, VAE
def _audio_config(opts: VoxCPM2Options) -> AudioConfig:
    return audio_config_from_checkpoint(opts.checkpoint) if opts.checkpoint else AUDIO_PRESETS[opts.preset]


def _report_random(report: dict, seed: int) -> None:
    report.update({"random_weights": True, "seed": seed})


def locdit_stage(opts: VoxCPM2Options) -> StageSpec:
    cfg = _audio_config(opts)
    n_steps = opts.n_timesteps or DEFAULT_TIMESTEPS
    cfg_rate = cfg.inference_cfg_rate if opts.cfg_rate is None else float(opts.cfg_rate)
    if n_steps < 2:
        raise OptionsError("locdit: n_timesteps must be >= 2 (the first Euler step is zero-init)")
    report: dict = {}

    def make_module() -> nn.Module:
        m = construct(LocDiTStage, cfg, n_steps, cfg_rate)  # every parameter is loaded or random-initialised next
        if opts.checkpoint:
            report.update(load_audio_stage_module("locdit", opts.checkpoint, m))
            return m.eval()
        _report_random(report, opts.seed)
        return init_random_audio(m, opts.seed + SEED_OFFSET["locdit"])

    C, P, H = cfg.feat_dim, cfg.patch_size, cfg.lm_hidden_size

    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        B = sizes["batch"]
        return {
            "lm_hidden": torch.randn(B, H, generator=g),
            "residual_hidden": torch.randn(B, H, generator=g),
            "cond": torch.randn(B, C, P, generator=g),
            "noise": torch.randn(B, C, P, generator=g),
        }

    dtype = opts.dtype or torch.bfloat16
    plan = BucketPlan({"batch": batch_sizes(opts.max_batch, opts.batch_buckets)})
    estimator_calls = sum(1 for *_, z in euler_schedule(n_steps, dtype) if not z)
    return StageSpec(
        family=FAMILY.name,
        name="locdit",
        kind="generic",
        make_module=make_module,
        passes=[fuse_projections, fold_time_embeddings],
        plan=plan,
        make_inputs=make_inputs,
        inputs=[
            {"name": "lm_hidden", "dtype": "float32", "shape": ["batch", H]},
            {"name": "residual_hidden", "dtype": "float32", "shape": ["batch", H]},
            {"name": "cond", "dtype": "float32", "shape": ["batch", C, P]},
            {"name": "noise", "dtype": "float32", "shape": ["batch", C, P]},
        ],
        outputs=[{"name": "patch", "dtype": "float32", "shape": ["batch", C, P]}],
        dtype=dtype,
        # fp32: kernel-order noise. bf16 vs the fp32 reference (whose time grid is fp32; the bf16 grid is what
        # the reference serves with): measured 1.6e-2..3.9e-2 on tiny random weights over seeds and batches.
        tolerance=1e-4 if dtype == torch.float32 else 8e-2,
        metadata={
            "n_timesteps": n_steps,
            "cfg_rate": cfg_rate,
            "estimator_calls": estimator_calls,
            "cfg_zero_star": True,
            "noise": "standard normal [B, feat_dim, patch_size], caller-drawn",
            "projections_inside": ["lm_to_dit_proj", "res_to_dit_proj"],
        },
        config=cfg.to_json(),
        checkpoint_report=report,
        golden_sizes=[],
        # the solver unrolled (estimator_calls copies of the DiT in one graph): in each full build on the 16-core
        # H200 hosts its batch-1 package took the family's longest (187, 256, 174 s at 9667827, a6ee558, fe69f18,
        # counted, as the build log does, from the stage's preparation; bench/results/nvidia-h200/build_logs/). Not
        # on CPU: the tiny build on 2 cores took 190.2 s with it first against 161.1 s in the family's order
        # (bench/results/cpu/probes/tiny_prepare_first_lending/)
        prepare_first_on=("cuda",),
        kernel_passes=[use_sequence_kernels],
        # bf16 on CUDA: the kernel layer (H100, batch 1: 5.20 ms vs the Inductor artifact's 5.98 ms in another run,
        # golden within tolerance; bench/results/nvidia-h100/profiles/, probes/audio_kernels/); fp32: Inductor
        cuda_auto_kernels="ttsaot" if dtype == torch.bfloat16 else "inductor",
    )


def local_encoder_stage(opts: VoxCPM2Options) -> StageSpec:
    cfg = _audio_config(opts)
    report: dict = {}

    def make_module() -> nn.Module:
        m = construct(LocalEncoderStage, cfg)  # every parameter is loaded or random-initialised next
        if opts.checkpoint:
            report.update(load_audio_stage_module("local_encoder", opts.checkpoint, m))
            return m.eval()
        _report_random(report, opts.seed)
        return init_random_audio(m, opts.seed + SEED_OFFSET["local_encoder"])

    C, P, H = cfg.feat_dim, cfg.patch_size, cfg.lm_hidden_size

    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        return {"patch": torch.randn(sizes["batch"], 1, P, C, generator=g)}

    dtype = opts.dtype or torch.bfloat16
    return StageSpec(
        family=FAMILY.name,
        name="local_encoder",
        kind="generic",
        make_module=make_module,
        passes=[fuse_projections],
        plan=BucketPlan({"batch": batch_sizes(opts.max_batch, opts.batch_buckets)}),
        make_inputs=make_inputs,
        inputs=[{"name": "patch", "dtype": "float32", "shape": ["batch", 1, P, C]}],
        outputs=[{"name": "embed", "dtype": "float32", "shape": ["batch", H]}],
        dtype=dtype,
        tolerance=1e-4 if dtype == torch.float32 else 3e-2,
        config=cfg.to_json(),
        checkpoint_report=report,
        kernel_passes=[use_sequence_kernels],
        # bf16 on CUDA: the kernel layer (H100, batch 1, same run: local_encoder 0.553 vs Inductor 0.634 ms, golden
        # within tolerance; bench/results/nvidia-h100/probes/audio_kernels/); fp32 keeps Inductor's GEMMs
        cuda_auto_kernels="ttsaot" if dtype == torch.bfloat16 else "inductor",
    )


def vae_decoder_stage(opts: VoxCPM2Options) -> StageSpec:
    cfg = _audio_config(opts).vae
    report: dict = {}

    def make_module() -> nn.Module:
        if opts.checkpoint:
            m, rep = load_vae_decoder(opts.checkpoint, cfg)
            report.update(rep)
            return m
        _report_random(report, opts.seed)
        return init_random_vae(construct(AudioVAEDecoder, cfg), opts.seed + SEED_OFFSET["vae_decoder"])

    def make_inputs(sizes: dict[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        return {"latents": torch.randn(sizes["batch"], cfg.latent_dim, sizes["frames"], generator=g)}

    streaming = opts.streaming
    rf = receptive_field_frames(cfg)
    frames = frame_sizes(streaming, pow2=opts.pow2_frames, explicit=opts.frame_buckets)
    plan = opts.codec_plan(batch_sizes(opts.max_batch, opts.batch_buckets), frames)
    spf = cfg.samples_per_frame
    return StageSpec(
        family=FAMILY.name,
        name="vae_decoder",
        kind="codec_decoder",
        make_module=make_module,
        passes=[bake_weight_norm, bake_snake, bake_sample_rate],
        # kernels=ttsaot: channels-last on the conv kernels, tf32x3 (≈ fp32: the stage is fp32 by policy)
        kernel_passes=[channels_last_vae_decoder],
        # H100, 36-frame window: 1.05 ms (7e-8 relative error vs fp32; bench/results/nvidia-h100/
        # codec_stages_dac_encoder_vae_decoder_fp32_kernels.json) vs 2.30 ms for the Inductor artifact in an
        # earlier run (codec_stages_dac_encoder_vae_decoder_vs_inductor.json)
        cuda_auto_kernels="ttsaot",
        plan=plan,
        hot_sizes=opts.codec_hot_sizes(frames),
        make_inputs=make_inputs,
        inputs=[{"name": "latents", "dtype": "float32", "shape": ["batch", cfg.latent_dim, "frames"], "pad": 0}],
        outputs=[{"name": "wav", "dtype": "float32", "shape": ["batch", 1, ["frames", spf]]}],
        dtype=torch.float32,
        fp32_only=True,
        tolerance=1e-4,  # fp32: kernel-order noise only
        metadata={
            "sample_rate": cfg.out_sample_rate,
            "samples_per_frame": spf,
            "streaming": asdict(streaming),
            "receptive_field_frames": rf,
            "streaming_exact": streaming.left_context_frames >= rf,
        },
        config=cfg.to_json(),
        checkpoint_report=report,
        golden_sizes=[off_bucket_frames(frames)],
    )


def _lm_recipe(name: str):
    def recipe(opts: VoxCPM2Options) -> StageSpec:
        return lm_stage(name, opts)

    recipe.__name__ = f"{name}_stage"
    return recipe


STAGES = {
    **{n: _lm_recipe(n) for n in LM_STAGES},
    "locdit": locdit_stage,
    "local_encoder": local_encoder_stage,
    "vae_decoder": vae_decoder_stage,
}


def default_stages(opts: VoxCPM2Options) -> tuple[str, ...]:
    return tuple(STAGES)
