"""What a family hands the builder for each stage. Nothing else in the builder knows about a family."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from .buckets import BucketPlan
from .options import DYNAMIC_PACKAGES

KERNELS = ("ttsaot", "inductor")
KERNELS_AUTO = "auto"


def resolve_kernels(choice: str, device: torch.device, cuda_auto: str = "ttsaot") -> str:
    """`auto` is `cuda_auto` on CUDA (the kernel layer, where its Triton kernels run, unless the stage keeps Inductor
    by default: StageSpec.cuda_auto_kernels) and Inductor's own code on CPU (where the custom ops would only run
    their aten references)."""
    if choice == KERNELS_AUTO:
        return cuda_auto if device.type == "cuda" else "inductor"
    if choice not in KERNELS:
        raise ValueError(f"kernels must be one of auto, {', '.join(KERNELS)}; got {choice!r}")
    return choice


def resolve_dynamic_packages(choice: str, device: torch.device, cuda_auto: str = "off") -> str:
    """What the build packages: "on" (one dynamic-shape package for as many buckets as the graph allows), "off" (a
    static package per bucket) or "cold" (a static package per hot bucket, StageSpec.hot_sizes, and dynamic ones
    for the rest: the buckets a stream hits on every chunk keep their per-shape tuning, the ones hit about once
    per request stop costing a compile each). `auto` is on for CPU builds (one package instead of one per
    bucket: the 3-minute tiny CPU build, issue 17; bench/results/cpu/probes/dynamic_package) and `cuda_auto` on
    CUDA (StageSpec.cuda_auto_packages): "off" unless a GPU showed a stage's per-call cost worth the compiles it
    saves, because where the Triton kernels autotune per static shape a dynamic package ran 6-17% slower per call
    (qwen code2wav, bench/results/nvidia-h100/probes/cuda_dynamic_package/)."""
    if choice == "auto":
        choice = "on" if device.type == "cpu" else cuda_auto
    if choice not in DYNAMIC_PACKAGES or choice == "auto":
        raise ValueError(f"dynamic_packages must be one of {', '.join(DYNAMIC_PACKAGES)}; got {choice!r}")
    return choice


# A module → module rewrite, applied in place, returning its report for the manifest (`build-artifacts inspect`):
# {"pass": name, ...facts} and, where it removes parameters, "dropped": {what: params} (pruned: never read by
# the stage) or "folded": {what: params} (baked into other tensors, e.g. usage counts into a codebook table), so
# that kept + dropped + folded = the parameters the faithful module loaded.
Pass = Callable[[nn.Module], dict[str, Any]]
# For sampling stages: the eager reference's near-tie margins per sampled output, {output name: [B, codes] fp32}
# (builder/predictor.py `draw_margin`), given the original module and a golden case's inputs.
Margins = Callable[[nn.Module, dict[str, torch.Tensor]], dict[str, torch.Tensor]]


@dataclass
class StageSpec:
    family: str
    name: str
    kind: str  # runtime behaviour: "codec_decoder", "generic", ...
    make_module: Callable[[], nn.Module]  # faithful eager module, fp32, weights loaded, on CPU
    passes: list[Pass]  # applied in order to a copy of the module
    plan: BucketPlan
    # random, valid (never all-zero) inputs for a bucket: {input name: tensor}; sizes may be below the bucket
    make_inputs: Callable[[dict[str, int], torch.Generator], dict[str, torch.Tensor]]
    inputs: list[dict[str, Any]]  # io descriptors (artifacts/README.md § I/O descriptors)
    outputs: list[dict[str, Any]]
    dtype: torch.dtype  # compute dtype of the artifact
    tolerance: float  # max ‖out − ref‖/‖ref‖ against the fp32 eager reference
    metadata: dict[str, Any] = field(default_factory=dict)  # runtime facts (sample rate, streaming, ...)
    config: dict[str, Any] = field(default_factory=dict)  # the model config, for the manifest
    checkpoint_report: dict[str, Any] = field(default_factory=dict)  # what loading read / dropped
    fp32_only: bool = False  # refuse any other dtype (DAC encoder)
    golden_sizes: list[dict[str, int]] = field(default_factory=list)  # extra off-bucket golden cases
    golden_buckets: bool = True  # False: golden cases are golden_sizes only (big state inputs)
    reference_margins: Margins | None = None  # sampling stages: stored as golden `<case>/margin/<output>`
    # The ttsaot kernel layer (builder/kernels): passes that swap the stage's hot paths for the Triton custom ops,
    # applied after `passes` when the build uses `kernels == "ttsaot"`. Their parity with the faithful module is
    # checked like any pass (on CPU the ops run their exact aten references).
    kernel_passes: list[Pass] = field(default_factory=list)
    kernels: str = KERNELS_AUTO  # "auto" | "ttsaot" | "inductor" (BuildOptions.kernels)
    # What `auto` means on CUDA for this stage: "ttsaot" once its kernel passes have built, verified and been timed
    # on a GPU; "inductor" keeps them opt-in (`--kernels ttsaot`) until then.
    cuda_auto_kernels: str = "ttsaot"
    dynamic_packages: str = "auto"  # DYNAMIC_PACKAGES (BuildOptions.dynamic_packages)
    # What `auto` means on CUDA for this stage ("off", "on" or "cold"): "off" keeps a static package per bucket;
    # another choice once a GPU has measured what the stage's dynamic package costs per call against the compiles
    # it saves, and the spec cites it (resolve_dynamic_packages).
    cuda_auto_packages: str = "off"
    # The sizes per axis that serving hits on every call of a stream (a codec decoder's steady and first-chunk
    # windows: buckets.hot_frames); a bucket is hot when each listed axis has one of them (an empty tuple: no
    # hot size on that axis, every bucket cold). None: every bucket is hot (decode steps, prefills): `cold`
    # packaging is then static throughout.
    hot_sizes: dict[str, tuple[int, ...]] | None = None
    # Axes whose sizes the graph takes only in whole steps ({axis: step}: an encoder's samples in whole frames, its
    # strided convs guard `samples // step`): a dynamic package exports such an axis stepped from its first try,
    # instead of a plain range that torch.export refuses and a retry (the tiny Fish DAC encoder on a 2-core CPU: 2.8
    # and 8.7 s less export time in two alternating rounds, bench/results/cpu/probes/declared_axis_step/).
    axis_steps: dict[str, int] = field(default_factory=dict)
    # The device types ("cpu", "cuda") on which a parallel build prepares this stage before the others
    # (builder/build.py `_preparation_order`): a stage whose export and compiles, started later, end the build. Its
    # compiles then run from as early as possible, and the cheaper stages prepare while they run.
    prepare_first_on: tuple[str, ...] = ()

    def kernels_on(self, device: torch.device) -> str:
        """The kernel choice this spec builds with on `device` ("ttsaot" or "inductor")."""
        return resolve_kernels(self.kernels, device, self.cuda_auto_kernels)

    def dynamic_mode(self, device: torch.device) -> str:
        """How the build packages this stage on `device`: "on", "off" or "cold" (resolve_dynamic_packages)."""
        return resolve_dynamic_packages(self.dynamic_packages, device, self.cuda_auto_packages)

    def is_hot(self, sizes: dict[str, int]) -> bool:
        """Whether a bucket is one serving hits on every call of a stream (`hot_sizes`)."""
        return self.hot_sizes is None or all(sizes[a] in hot for a, hot in self.hot_sizes.items())

    @property
    def input_names(self) -> list[str]:
        return [d["name"] for d in self.inputs]


# TF32 tensor-core convolutions/matmuls for an fp32 stage (what PyTorch's default cuDNN flags give the reference):
# the Fish DAC decoder's artifact ran at 7.3e-4 relative error vs exact fp32 with TF32 on an H200; exact, it took
# 30.1 ms at B=4 / 29 frames where eager with TF32 took 13.2 ms
# (bench/results/nvidia-h200/fish-s2-pro__dac_decoder.json).
TF32_TOLERANCE = 2e-3


def with_tf32(spec: StageSpec) -> StageSpec:
    """The stage built to run with TF32 allowed on CUDA (`build-artifacts --tf32`). Only fp32 stages that are not
    fp32 by policy change (the DAC encoder's codes and the VAE stay exact); others are returned as they are."""
    if spec.dtype != torch.float32 or spec.fp32_only:
        return spec
    return replace(spec, metadata={**spec.metadata, "allow_tf32": True}, tolerance=max(spec.tolerance, TF32_TOLERANCE))
