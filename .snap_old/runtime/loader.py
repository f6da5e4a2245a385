"""`load`: an artifact directory → a `Bundle` of ready stages (validated, weights bound, graphs captured)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from .artifact import Manifest, check_compatible, check_files, read_manifest
from .errors import ManifestError
from .stage import Stage, check_weights, load_weights
from .threads import DEFAULT_CPU_THREADS, cpu_threads_mode

# Runtime behaviour per manifest `kind`: "module:Class", imported when an artifact uses the kind. A new kind
# adds a Stage subclass in its own runtime module and a line here.
STAGE_CLASSES: dict[str, str] = {
    "generic": "ttsaot.runtime.stage:Stage",
    "codec_decoder": "ttsaot.runtime.streaming:CodecDecoderStage",
    "codec_encoder": "ttsaot.runtime.encoder:CodecEncoderStage",
    "codebook_predictor": "ttsaot.runtime.predictor:CodebookPredictorStage",
    "lm_step": "ttsaot.runtime.lm:LMStepStage",
    "lm_prefill": "ttsaot.runtime.lm:LMPrefillStage",
}


def stage_class(kind: str) -> type[Stage]:
    import importlib

    target = STAGE_CLASSES.get(kind)
    if target is None:
        raise ManifestError(f"stage kind {kind!r} is unknown to this runtime")
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)


class Bundle(Mapping[str, Stage]):
    """The loaded stages of one artifact directory."""

    def __init__(self, root: Path, manifest: Manifest, device: torch.device, stages: dict[str, Stage]) -> None:
        self.root, self.manifest, self.device = root, manifest, device
        self._stages = stages

    def __getitem__(self, name: str) -> Stage:
        try:
            return self._stages[name]
        except KeyError:
            raise KeyError(f"no stage {name!r} in this bundle (have: {', '.join(self._stages)})") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._stages)

    def __len__(self) -> int:
        return len(self._stages)

    def __repr__(self) -> str:
        return f"Bundle({self.manifest.family!r}, device={self.device}, stages={list(self._stages)})"


def _resolve_device(device: str | torch.device | None, manifest: Manifest) -> torch.device:
    if device is None:
        device = manifest.device
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return d


def load(
    path: str | Path,
    device: str | torch.device | None = None,
    stages: list[str] | None = None,
    cuda_graphs: bool = True,
    trusted_sha256: str | None = None,
    cpu_threads: int | None = DEFAULT_CPU_THREADS,
) -> Bundle:
    """Validate, load weights once per stage, bind them into every bucket package, capture graphs (CUDA).

    Order matters for safety: manifest schema → compatibility → sha256 of every file of the selected stages →
    weights checked against the manifest → only then are packages dlopen'ed and bound.

    cpu_threads (CPU artifacts): OpenMP threads of every package call, set around the call in the calling thread
    (README "CPU threads"); None leaves the process's torch/OMP setting in charge."""
    t_start = time.perf_counter()
    cpu_threads_mode(cpu_threads)  # refuses a bad value before anything is read
    root = Path(path)
    manifest = read_manifest(root, trusted_sha256=trusted_sha256)
    dev = _resolve_device(device, manifest)
    check_compatible(manifest, dev)
    names = list(manifest.stages) if stages is None else list(stages)
    for n in names:
        if n not in manifest.stages:
            raise ManifestError(f"{root}: no stage {n!r} (have: {', '.join(manifest.stages)})")
    for n in names:
        if not manifest.stages[n].buckets:
            raise ManifestError(
                f"{root}: stage {n!r} has only an ONNX model (built with --format onnx), no AOTI "
                "packages for this runtime; run it with onnxruntime, or rebuild with "
                "--format aoti,onnx"
            )
    check_files(root, [f for n in names for f in manifest.stages[n].files()])
    stats = {"validate_s": time.perf_counter() - t_start}
    loaded: dict[str, Stage] = {}
    for n in names:
        entry = manifest.stages[n]
        t0 = time.perf_counter()
        weights = load_weights(root / entry.weights.file, entry, dev)
        check_weights(entry, weights, dev)
        t_weights = time.perf_counter() - t0
        cls = stage_class(entry.kind)
        loaded[n] = cls(root, entry, dev, weights, cuda_graphs=cuda_graphs, cpu_threads=cpu_threads)
        loaded[n].load_stats["weights_s"] = round(t_weights, 3)
    stats["total_s"] = time.perf_counter() - t_start
    bundle = Bundle(root, manifest, dev, loaded)
    bundle.load_stats = {k: round(v, 3) for k, v in stats.items()}
    return bundle
