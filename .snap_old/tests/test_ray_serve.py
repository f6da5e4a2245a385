"""The Ray Serve deployment (examples/serve/ray_app.py) serves a streamed request on CPU: a local Ray, one replica
holding the tiny code2wav artifact, HTTP through Ray's proxy on 127.0.0.1. Ray is an optional, heavy dependency
(`pip install -e ".[ray]"`): without it, or where Ray cannot start, the test is skipped and says why."""

from __future__ import annotations

import shutil
import socket
import tempfile
import time

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray", reason="ray[serve] is not installed: pip install -e '.[ray]' to run this test")
serve = pytest.importorskip("ray.serve", reason="ray[serve] is not installed: pip install -e '.[ray]'")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def local_ray():
    # a short private temp dir: Ray's socket paths must fit in 107 bytes, and /tmp/ray may be another run's
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    try:
        ray.init(
            num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False, _temp_dir=tmp, configure_logging=False
        )
    except Exception as e:  # noqa: BLE001 - the reason is the skip message
        shutil.rmtree(tmp, ignore_errors=True)
        pytest.skip(f"Ray cannot start here: {type(e).__name__}: {e}")
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def test_ray_serve_replica_streams_a_request(local_ray, qwen_tiny_fp32):
    import httpx

    from examples.serve.app import pcm16
    from examples.serve.ray_app import build
    from ttsaot.runtime import load

    stage = load(qwen_tiny_fp32)["code2wav"]
    spec = stage.entry.inputs[0]
    codes = torch.randint(0, spec.range["high"][0], (spec.shape[1], 30), generator=torch.Generator().manual_seed(0))
    serve.run(
        build({"artifacts": str(qwen_tiny_fp32), "replicas": "1", "max_wait_ms": "1"}),
        name="ttsaot",
        route_prefix="/",
        blocking=False,
    )
    with httpx.Client(base_url=local_ray, timeout=60) as c:
        deadline = time.monotonic() + 120
        while True:  # the proxy answers before the replica is ready
            try:
                h = c.get("/health")
                if h.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the replica did not become healthy within 120 s"
            time.sleep(0.5)
        assert h.json()["devices"] == ["cpu"] and h.json()["batching"] is True
        r = c.post("/v1/code2wav/stream", json={"codes": codes.tolist(), "chunk_frames": 16, "format": "pcm"})
        assert r.status_code == 200, r.text
        got = np.frombuffer(r.content, dtype="<i2").astype(np.int32)
        want = np.frombuffer(pcm16(stage(codes[None])), dtype="<i2").astype(np.int32)
        assert len(got) == 30 * stage.samples_per_frame and np.abs(got - want).max() <= 1
        bad = c.post("/v1/code2wav/stream", json={"codes": codes[:2].tolist()})
        assert (bad.status_code, bad.json()["error"]) == (422, "InputShapeError")


def test_build_rejects_unknown_arguments():
    from examples.serve.ray_app import _config

    with pytest.raises(ValueError, match="unknown argument"):
        _config({"artifacts": "a", "max_wiat_ms": "2"})
    assert _config({"artifacts": "a", "batching": "false", "max_wait_ms": "0.5", "max_queue": "9"}) == {
        "artifacts": "a",
        "batching": False,
        "max_wait_ms": 0.5,
        "max_queue": 9,
    }
