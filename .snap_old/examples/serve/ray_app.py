"""More than one GPU: Ray Serve runs one replica per GPU, each holding one `Service` (one bundle, one batcher per
codec stage) behind the same Starlette app as `python -m examples.serve`. Ray's proxy spreads streams over replicas;
batching happens inside each replica. No scheduler of our own beyond the in-process batcher.

    pip install -e ".[serve,ray]"
    serve run examples.serve.ray_app:build artifacts=$PWD/artifacts               # one replica per GPU
    python -m examples.serve.ray_app --artifacts artifacts --port 8000 --replicas 4

Every replica loads the artifacts from the same path: on several nodes, put them on a shared filesystem (or the
same path on every node). `build` arguments: artifacts, replicas (default: the cluster's GPUs, else 1),
max_ongoing_requests (streams routed to one replica at once, default 64: Ray's default of 5 would cap every batch
at 5 streams), device, batching (true/false), max_wait_ms, max_queue, max_streams, voxcpm2_slots,
cpus_per_replica."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from ray import serve


@serve.deployment
@serve.ingress()
class TTSReplica:
    """One GPU's worth of serving: Ray sets CUDA_VISIBLE_DEVICES, so `cuda` is this replica's own GPU."""

    def __init__(self, config: dict[str, Any]) -> None:
        from .app import ServeConfig, Service

        self.service = Service(ServeConfig(**config))

    def __serve_build_asgi_app__(self):
        from .app import create_app

        return create_app(self.service)


DEPLOYMENT_ARGS = ("replicas", "max_ongoing_requests", "cpus_per_replica")
DEFAULT_MAX_ONGOING_REQUESTS = 64


def _config(args: dict[str, Any]) -> dict[str, Any]:
    from .app import ServeConfig

    fields = {f.name: f for f in dataclasses.fields(ServeConfig)}
    out: dict[str, Any] = {}
    for k, v in args.items():
        if k in DEPLOYMENT_ARGS:
            continue
        if k not in fields:
            raise ValueError(f"unknown argument {k!r} (known: {', '.join([*fields, *DEPLOYMENT_ARGS])})")
        kind = fields[k].type
        if isinstance(v, str) and "bool" in str(kind):
            v = v.lower() in ("1", "true", "yes", "on")
        elif isinstance(v, str) and "int" in str(kind) and "str" not in str(kind):
            v = int(v)
        elif isinstance(v, str) and "float" in str(kind):
            v = float(v)
        out[k] = v
    if "artifacts" not in out:
        raise ValueError("the artifacts=PATH argument is required")
    return out


def build(args: dict[str, Any]) -> serve.Application:
    """Ray Serve application builder (`serve run examples.serve.ray_app:build artifacts=...`)."""
    import ray
    import torch

    config = _config(args)
    on_gpu = str(config.get("device") or "cuda").startswith("cuda") and (
        torch.cuda.is_available() or (ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0)
    )
    gpus = int(ray.cluster_resources().get("GPU", 0)) if ray.is_initialized() else torch.cuda.device_count()
    replicas = int(args.get("replicas") or 0) or max(gpus, 1)
    if not on_gpu:
        config["device"] = config.get("device") or "cpu"
    options: dict[str, Any] = {"num_gpus": 1 if on_gpu else 0}
    if args.get("cpus_per_replica"):
        options["num_cpus"] = float(args["cpus_per_replica"])
    ongoing = int(args.get("max_ongoing_requests") or DEFAULT_MAX_ONGOING_REQUESTS)
    return TTSReplica.options(num_replicas=replicas, max_ongoing_requests=ongoing, ray_actor_options=options).bind(
        config
    )


def main(argv: list[str] | None = None) -> None:
    import ray

    p = argparse.ArgumentParser(
        prog="python -m examples.serve.ray_app",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--artifacts", default="artifacts")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--replicas", type=int, default=0, help="default: one per GPU in the cluster")
    p.add_argument(
        "--max-ongoing-requests",
        type=int,
        default=DEFAULT_MAX_ONGOING_REQUESTS,
        help="streams routed to one replica at once",
    )
    p.add_argument("--device", default=None)
    p.add_argument("--no-batching", action="store_true")
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    p.add_argument("--address", default=None, help="an existing Ray cluster (default: start one here)")
    a = p.parse_args(argv)
    import os

    ray.init(address=a.address)
    serve.start(http_options={"host": a.host, "port": a.port})
    app = build(
        {
            "artifacts": os.path.abspath(a.artifacts),
            "replicas": a.replicas,
            "max_ongoing_requests": a.max_ongoing_requests,
            "device": a.device,
            "batching": not a.no_batching,
            "max_wait_ms": a.max_wait_ms,
        }
    )
    serve.run(app, name="ttsaot", route_prefix="/", blocking=True)


if __name__ == "__main__":
    main()
