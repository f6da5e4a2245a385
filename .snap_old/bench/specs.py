"""Which stages exist and which buckets the bench measures for each (small by default: GPU time is scarce).

Generic over StageSpec: a stage is measured at its family's bench buckets (bench/families/, `BenchFamily.buckets`),
else at the first one or two sizes of each axis of its own default plan (`--axis name=1,2` overrides any axis)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ttsaot.runtime.dtypes import SHORT_DTYPE_NAMES, torch_dtype

from .families import bench_family


def layer_passes(family: str, stage: str, entry) -> dict[str, Any] | None:
    """{"passes": n, "how": ...} for a stage whose family names its layers (BenchFamily.layers); LM stages count
    the layers of their KV cache (metadata cache_shape[0]); else None."""
    rule = bench_family(family).layers.get(stage)
    if rule is not None:
        n, how = rule(entry)
        return {"passes": int(n), "how": how}
    shape = entry.metadata.get("cache_shape")
    if entry.kind in ("lm_step", "lm_prefill") and shape:
        return {"passes": int(shape[0]), "how": "layers of the KV cache"}
    return None


DTYPES = {alias: torch_dtype(alias) for alias in SHORT_DTYPE_NAMES}  # `--dtype` choices


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
    options: dict[str, Any] | None = None,
    full_plan: bool = False,
    device: str | None = None,
):
    """The StageSpec as the builder would make it (`Family.specs`), restricted to the benchmark buckets, built with
    the kernel choice `kernels` (BuildOptions.kernels: auto | ttsaot | inductor) and the family `options` given over
    the bench's. Returns (spec, description of the choices for the JSON and the cache key). full_plan: the family's
    own default options and every bucket of its default plan (what `build-artifacts` builds), not the bench's
    subset; `axes` still overrides an axis. device: the device the build is for ("cuda", "cuda:0", "cpu"), for the
    defaults that differ by device (BuildOptions.device)."""
    from ttsaot.builder.buckets import BucketPlan

    fam = family_module(family)
    chosen = None if full_plan else bench_family(family).buckets.get(stage, {}).get(preset)
    want_axes = {**({k: tuple(v) for k, v in chosen.axes.items()} if chosen else {}), **(axes or {})}
    kw: dict[str, Any] = {"preset": preset, "seed": seed, "kernels": kernels}
    if device:
        kw["device"] = str(device).split(":", 1)[0]
    if dtype:
        kw["dtype"] = DTYPES[dtype]
    if "batch" in want_axes:
        kw["batch_buckets"] = want_axes["batch"]
    if "frames" in want_axes:
        kw["frame_buckets"] = want_axes["frames"]
    kw.update(chosen.options if chosen else {})
    kw.update(options or {})
    stream_over = chosen.streaming if chosen else None
    if stream_over:
        kw["streaming"] = replace(fam.Options().streaming, **stream_over)
    fam.check_stages([stage])
    spec = fam.specs(fam.options(**kw), [stage])[0]
    per_axis = None if full_plan else 2 if preset != "tiny" else 1
    plan_axes = {}
    for axis, sizes in spec.plan.axes.items():
        if axis in want_axes:
            plan_axes[axis] = tuple(want_axes[axis])
        else:
            plan_axes[axis] = tuple(sorted(sizes))[:per_axis]
    # the default plan's batch × frames cap holds for the memory bench (what `build-artifacts` builds, an axis
    # override included); the bench's own subsets compile exactly the buckets they name
    cap = spec.plan.max_batch_frames if full_plan else None
    spec = replace(spec, plan=BucketPlan(plan_axes, max_batch_frames=cap))
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
        "streaming_override": stream_over or None,
        # the kernel choice is keyed resolved (bench/artifacts.py artifact_key), not as asked; the device type is
        # keyed there too (what `device` changes, the Fish dac_decoder's default dtype, is in "dtype" above)
        "options": {k: repr(v) for k, v in kw.items() if k not in ("kernels", "device")},
    }
    if full_plan:  # recorded only when set: the cache keys of the bench's own artifacts stay what they were
        desc["full_plan"] = True
        desc["max_batch_frames"] = cap
    return spec, desc
