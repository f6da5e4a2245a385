"""Which stages exist and which buckets the bench measures for each (small by default: GPU time is scarce).

Generic over StageSpec: a stage without an entry in BENCH_DEFAULTS is measured at the first one or two sizes
of each axis of its own default plan (`--axis name=1,2` overrides any axis)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ttsaot.runtime.dtypes import SHORT_DTYPE_NAMES, torch_dtype

# Both codec decoders: one 50-frame decode at B=1 and B=4 with streaming chunk 25 / left context 25 (full); a
# single small bucket whose streaming window fits it (tiny, CPU smoke).
_CODEC_DECODER: dict[str, dict[str, Any]] = {
    "full": {"axes": {"batch": (1, 4), "frames": (25, 50)}},
    "tiny": {
        "axes": {"batch": (1,), "frames": (16,)},
        "streaming": {"chunk_frames": 8, "left_context_frames": 8, "first_chunk_frames": 0,
                      "nonstreaming_chunk_frames": 0},
    },
}

# (family, stage) → preset → {"axes": {axis: sizes}, "streaming": StreamingConfig overrides}
BENCH_DEFAULTS: dict[tuple[str, str], dict[str, dict[str, Any]]] = {
    # The evidence: one 50-frame decode at B=1 and B=4, streaming chunk 25 with left context 25.
    ("qwen3-tts-12hz", "code2wav"): _CODEC_DECODER,
    # Fish streams a 4-frame first chunk, then 25 new frames with 25 of context: windows of 29 (4 + 25) and 50.
    ("fish-s2-pro", "dac_decoder"): {**_CODEC_DECODER, "full": {"axes": {"batch": (1, 4), "frames": (29, 50)}}},
    # Issue evidence: predictors at B=1 and B=8; LM steps at B=1 and B=16 with a 512-token context; the VoxCPM2
    # patch stages at B=1 and B=16; the VAE's streaming window (12 new + 24 context frames); a 10 s reference clip.
    ("qwen3-tts-12hz", "code_predictor"): {"full": {"axes": {"batch": (1, 8)}}},
    ("fish-s2-pro", "fast_ar"): {"full": {"axes": {"batch": (1, 8)}}},
    ("fish-s2-pro", "dac_encoder"): {"full": {"options": {"encoder_seconds": (10.0,)}}},
    ("voxcpm2", "base_lm_step"): {"full": {"axes": {"batch": (1, 16)}, "options": {"max_len": 512}}},
    ("voxcpm2", "residual_lm_step"): {"full": {"axes": {"batch": (1, 16)}, "options": {"max_len": 512}}},
    ("voxcpm2", "base_lm_prefill"): {
        "full": {"axes": {"batch": (1, 4), "tokens": (64, 256)}, "options": {"max_len": 512}}
    },
    ("voxcpm2", "residual_lm_prefill"): {
        "full": {"axes": {"batch": (1, 4), "tokens": (64, 256)}, "options": {"max_len": 512}}
    },
    ("voxcpm2", "locdit"): {"full": {"axes": {"batch": (1, 16)}}},
    ("voxcpm2", "local_encoder"): {"full": {"axes": {"batch": (1, 16)}}},
    ("voxcpm2", "vae_decoder"): {"full": {"axes": {"batch": (1,), "frames": (36,)}}},
}

# (family, stage) → (manifest StageEntry) → (transformer layer passes in one call, how they are counted), for
# `bench profile`'s kernels per layer. LM stages count the layers of their KV cache (metadata cache_shape[0]).
LAYER_PASSES: dict[tuple[str, str], Any] = {
    ("qwen3-tts-12hz", "code_predictor"): lambda e: (
        e.config["num_hidden_layers"] * e.metadata["sampled_codebooks"], "num_hidden_layers × codebook steps"),
    ("fish-s2-pro", "fast_ar"): lambda e: (
        e.config["n_layer"] * e.metadata["sampled_codebooks"], "n_layer × codebook steps"),
    ("voxcpm2", "locdit"): lambda e: (
        e.config["dit"]["num_hidden_layers"] * e.metadata["estimator_calls"], "DiT layers × estimator calls"),
    ("voxcpm2", "local_encoder"): lambda e: (e.config["encoder"]["num_hidden_layers"], "encoder layers"),
}


def layer_passes(family: str, stage: str, entry) -> dict[str, Any] | None:
    """{"passes": n, "how": ...} for a stage whose family config names its layers, else None."""
    rule = LAYER_PASSES.get((family, stage))
    if rule is not None:
        n, how = rule(entry)
        return {"passes": int(n), "how": how}
    shape = entry.metadata.get("cache_shape")
    if entry.kind in ("lm_step", "lm_prefill") and shape:
        return {"passes": int(shape[0]), "how": "layers of the KV cache"}
    return None


DTYPES = {alias: torch_dtype(alias) for alias in SHORT_DTYPE_NAMES}   # `--dtype` choices


def family_module(family: str):
    from ttsaot.builder.families import get_family

    return get_family(family)


def family_names() -> list[str]:
    from ttsaot.builder.families import FAMILIES

    return list(FAMILIES)


def stage_names(family: str, preset: str) -> list[str]:
    return list(family_module(family).stages)


def parse_axes(items: list[str] | None) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for item in items or []:
        name, _, sizes = item.partition("=")
        if not name or not sizes:
            raise ValueError(f"--axis expects name=1,2,4, got {item!r}")
        out[name.strip()] = tuple(int(s) for s in sizes.split(","))
    return out


def make_spec(
    family: str,
    stage: str,
    preset: str,
    seed: int = 0,
    axes: dict[str, tuple[int, ...]] | None = None,
    dtype: str | None = None,
    kernels: str = "auto",
    full_plan: bool = False,
):
    """The StageSpec as the builder would make it, restricted to the benchmark buckets, built with the kernel
    choice `kernels` (BuildOptions.kernels: auto | ttsaot | inductor). Returns (spec, description of the choices
    for the JSON and the cache key). full_plan: the family's own default options and every bucket of its default
    plan (what `build-artifacts` builds), not the bench's subset; `axes` still overrides an axis."""
    from ttsaot.builder.buckets import BucketPlan

    fam = family_module(family)
    defaults = {} if full_plan else BENCH_DEFAULTS.get((family, stage), {}).get(preset, {})
    want_axes = {**{k: tuple(v) for k, v in defaults.get("axes", {}).items()}, **(axes or {})}
    kw: dict[str, Any] = {"preset": preset, "seed": seed, "kernels": kernels}
    if dtype:
        kw["dtype"] = DTYPES[dtype]
    if "batch" in want_axes:
        kw["batch_buckets"] = want_axes["batch"]
    if "frames" in want_axes:
        kw["frame_buckets"] = want_axes["frames"]
    kw.update(defaults.get("options", {}))
    stream_over = defaults.get("streaming")
    if stream_over:
        kw["streaming"] = replace(fam.Options().streaming, **stream_over)
    if stage not in fam.stages:
        raise KeyError(f"{family} has no stage {stage!r} (have: {', '.join(fam.stages)})")
    spec = fam.specs(fam.options(**kw), [stage])[0]
    per_axis = None if full_plan else 2 if preset != "tiny" else 1
    plan_axes = {}
    for axis, sizes in spec.plan.axes.items():
        if axis in want_axes:
            plan_axes[axis] = tuple(want_axes[axis])
        else:
            plan_axes[axis] = tuple(sorted(sizes))[:per_axis]
    spec = replace(spec, plan=BucketPlan(plan_axes))
    desc = {
        "family": family,
        "stage": stage,
        "preset": preset,
        "seed": seed,
        "kind": spec.kind,
        "dtype": str(spec.dtype).removeprefix("torch."),
        "dtype_override": dtype,
        "kernels": kernels,
        "axes": {k: list(v) for k, v in plan_axes.items()},
        "streaming_override": stream_over,
        # the kernel choice is keyed resolved (bench/stage.py artifact_key), not as asked
        "options": {k: repr(v) for k, v in kw.items() if k != "kernels"},
    }
    if full_plan:   # recorded only when set: the cache keys of the bench's own artifacts stay what they were
        desc["full_plan"] = True
    return spec, desc
