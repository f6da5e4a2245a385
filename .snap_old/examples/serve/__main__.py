"""`python -m examples.serve --artifacts artifacts --port 8000`: serve every codec decoder (and a complete VoxCPM2
pipeline) found under --artifacts. See examples/serve/README.md."""

from __future__ import annotations

import os

# CPU serving runs stage calls on the batcher's worker while the event loop and the VoxCPM2 threads run torch ops
# too: each thread drives its own OpenMP team, and busy-waiting teams starve each other on a loaded CPU (10-20x
# slower calls seen on 2 cores). Must be set before torch loads; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m examples.serve", description=__doc__)
    p.add_argument("--artifacts", default="artifacts", help="an artifact dir, or a dir of them (artifacts/<family>)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: the artifact's device type)")
    p.add_argument(
        "--no-batching",
        action="store_true",
        help="one request per stage call (the baseline the load test compares against)",
    )
    p.add_argument("--max-wait-ms", type=float, default=2.0, help="how long a batch waits for other streams")
    p.add_argument("--max-queue", type=int, default=256, help="queued chunks per stage before 503")
    p.add_argument("--max-streams", type=int, default=256, help="open streams per stage before 503")
    p.add_argument("--voxcpm2-slots", type=int, default=2, help="concurrent VoxCPM2 requests (KV-cache pairs)")
    p.add_argument("--no-cuda-graphs", action="store_true")
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    import uvicorn

    from .app import ServeConfig, Service, create_app

    service = Service(
        ServeConfig(
            artifacts=a.artifacts,
            device=a.device,
            batching=not a.no_batching,
            max_wait_ms=a.max_wait_ms,
            max_queue=a.max_queue,
            max_streams=a.max_streams,
            voxcpm2_slots=a.voxcpm2_slots,
            cuda_graphs=not a.no_cuda_graphs,
        )
    )
    served = list(service.codecs) + (["voxcpm2"] if service.voxcpm2 else [])
    print(
        f"ttsaot serve: {', '.join(served)} on {', '.join(sorted(service.devices))}, batching "
        f"{'on' if service.config.batching else 'off'} — http://{a.host}:{a.port}",
        flush=True,
    )
    uvicorn.run(create_app(service), host=a.host, port=a.port, log_level=a.log_level)


if __name__ == "__main__":
    main()
