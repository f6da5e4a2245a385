"""The streaming service (examples/serve) over real HTTP: uvicorn on 127.0.0.1 (a free port) in a thread, tiny CPU
artifacts, every client call with a timeout. Streamed audio equals the runtime's own decode; bad requests get a
4xx naming the runtime's typed error and the service keeps serving; overload is a 503."""

from __future__ import annotations

import asyncio
import json
import struct
import threading

import httpx
import numpy as np
import pytest
import torch

from examples.serve.app import ServeConfig, Service, ThreadedServer, create_app, pcm16, voxcpm2_pipeline
from ttsaot.runtime import load

from . import test_voxcpm2_audio as _audio
from . import test_voxcpm2_lm as _lm

voxcpm2_lm_tiny = _lm.voxcpm2_lm_tiny  # session artifacts of the VoxCPM2 tests, reused
voxcpm2_audio_fp32 = _audio.voxcpm2_audio_fp32
T = 60  # seconds: the bound on every client call


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: server, batcher worker and test threads each drive an OpenMP team, and busy-waiting
    teams starve each other on a loaded 2-core machine (the service's __main__ sets OMP_WAIT_POLICY=PASSIVE)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def code2wav(qwen_tiny_fp32):
    return load(qwen_tiny_fp32)["code2wav"]


def serve(artifacts, **kw) -> ThreadedServer:
    return ThreadedServer(create_app(Service(ServeConfig(artifacts=str(artifacts), **kw))))


def _codes(stage, frames: int, seed: int) -> torch.Tensor:
    spec = stage.entry.inputs[0]
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, spec.range["high"][0], (spec.shape[1], frames), generator=g)


def _pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.int32)


def _want(stage, codes: torch.Tensor) -> np.ndarray:
    return _pcm(pcm16(stage(codes[None])))


def test_streamed_request_end_to_end(qwen_tiny_fp32, code2wav):
    codes = _codes(code2wav, 40, seed=1)
    with serve(qwen_tiny_fp32) as url, httpx.Client(base_url=url, timeout=T) as c:
        health = c.get("/health").json()
        assert health["status"] == "ok" and health["stages"]["code2wav"]["codebooks"] == 16
        pieces = []
        with c.stream("POST", "/v1/code2wav/stream", json={"codes": codes.tolist(), "chunk_frames": 16}) as r:
            assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"
            assert int(r.headers["x-sample-rate"]) == code2wav.sample_rate
            pieces = list(r.iter_bytes())
        body = b"".join(pieces)
        assert body[:4] == b"RIFF" and body[8:16] == b"WAVEfmt "
        assert struct.unpack("<I", body[24:28])[0] == code2wav.sample_rate
        pcm = _pcm(body[44:])
        assert len(pcm) == 40 * code2wav.samples_per_frame
        assert np.abs(pcm - _want(code2wav, codes)).max() <= 1  # streamed = one-shot, to the int16 LSB
        raw = c.post("/v1/code2wav/stream", json={"codes": codes.tolist(), "format": "pcm"})
        assert raw.headers["content-type"].startswith("audio/L16") and len(raw.content) == len(pcm) * 2
        text = c.get("/metrics").text
        assert 'ttsaot_ttfa_seconds_count{endpoint="code2wav"} 2.0' in text
        assert 'ttsaot_requests_total{endpoint="code2wav",outcome="ok"} 2.0' in text
        assert "ttsaot_queue_depth" in text and "ttsaot_batch_rows_bucket" in text


def test_concurrent_streams_share_stage_calls(qwen_tiny_fp32, code2wav):
    reqs = [_codes(code2wav, n, seed=10 + n) for n in (30, 48, 17, 40)]

    async def one(client: httpx.AsyncClient, codes: torch.Tensor) -> bytes:
        async with client.stream(
            "POST", "/v1/code2wav/stream", json={"codes": codes.tolist(), "chunk_frames": 16, "format": "pcm"}
        ) as r:
            assert r.status_code == 200
            return b"".join([p async for p in r.aiter_bytes()])

    async def main(url: str):
        async with httpx.AsyncClient(base_url=url, timeout=T) as client:
            return await asyncio.gather(*(one(client, r) for r in reqs))

    def batches(text: str) -> tuple[float, float]:
        rows = float(text.split('ttsaot_batch_rows_sum{stage="code2wav"} ')[1].split()[0])
        return rows, float(text.split('ttsaot_batch_rows_count{stage="code2wav"} ')[1].split()[0])

    chunks = sum(-(-r.shape[-1] // 16) for r in reqs)
    with serve(qwen_tiny_fp32, max_wait_ms=50) as url:
        outs = asyncio.run(asyncio.wait_for(main(url), T))
        for _ in range(100):  # the metrics hook runs after a batch's results are out: let the last one land
            rows, calls = batches(httpx.get(url + "/metrics", timeout=T).text)
            if rows == chunks:
                break
            threading.Event().wait(0.05)
    for codes, body in zip(reqs, outs):
        assert np.abs(_pcm(body) - _want(code2wav, codes)).max() <= 1
    assert rows == chunks and calls < rows  # every chunk decoded once; chunks of different streams shared calls


def test_websocket_codes_arrive_over_time(qwen_tiny_fp32, code2wav):
    from websockets.sync.client import connect

    codes = _codes(code2wav, 37, seed=3)
    with (
        serve(qwen_tiny_fp32) as url,
        connect(url.replace("http", "ws") + "/v1/code2wav/ws", open_timeout=T, close_timeout=T) as ws,
    ):
        hello = json.loads(ws.recv(timeout=T))
        assert hello["sample_rate"] == code2wav.sample_rate and hello["format"] == "pcm_s16le"
        got = []
        for part in codes.split([5, 16, 16], dim=-1):  # as a talker would produce them
            threading.Event().wait(0.05)
            ws.send(json.dumps({"codes": part.tolist()}))
            got.append(ws.recv(timeout=T))
            assert len(got[-1]) == 2 * part.shape[-1] * code2wav.samples_per_frame
        ws.send(json.dumps({"end": True}))
    assert np.abs(_pcm(b"".join(got)) - _want(code2wav, codes)).max() <= 1


def test_bad_requests_are_4xx_with_the_runtime_error(qwen_tiny_fp32, code2wav):
    from websockets.sync.client import connect

    good = _codes(code2wav, 20, seed=4)
    out_of_range = good.clone()
    out_of_range[5, 17] = 64
    cases = [
        ({"codes": good[:3].tolist()}, 422, "InputShapeError"),  # wrong number of codebooks
        ({"codes": good[0].tolist()}, 422, "InputShapeError"),  # 1-D
        ({"codes": [[1, 2], [3]] + [[0, 0]] * 14}, 422, "InputShapeError"),  # ragged
        ({"codes": out_of_range.tolist()}, 422, "InputRangeError"),  # a code past its codebook
        ({"codes": (-good).tolist()}, 422, "InputRangeError"),
        ({"codes": (good.float() + 0.5).tolist()}, 422, "InputDTypeError"),
        ({"codes": good[:, :0].tolist()}, 422, "InputValueError"),
        ({"codes": _codes(code2wav, 101, seed=5).tolist()}, 413, "InputShapeError"),  # over max_request_frames
        ({"codes": good.tolist(), "chunk_frames": 40}, 422, "InputShapeError"),  # chunk + context > largest bucket
        ({"codes": good.tolist(), "chunk_frames": 0}, 422, "InputValueError"),
        ({"codes": good.tolist(), "format": "mp3"}, 422, "InputValueError"),
        ({}, 422, "InputValueError"),
    ]
    with (
        serve(qwen_tiny_fp32, max_request_frames=100, max_body_bytes=100_000) as url,
        httpx.Client(base_url=url, timeout=T) as c,
    ):
        for body, status, error in cases:
            r = c.post("/v1/code2wav/stream", json=body)
            assert (r.status_code, r.json()["error"]) == (status, error), (body, r.text)
        r = c.post("/v1/code2wav/stream", content=b"{not json")
        assert (r.status_code, r.json()["error"]) == (422, "InputValueError")
        r = c.post("/v1/code2wav/stream", content=b"[" + b"1," * 100_000 + b"1]")
        assert (r.status_code, r.json()["error"]) == (413, "InputShapeError")
        assert c.post("/v1/dac_decoder/stream", json={"codes": good.tolist()}).status_code == 404
        with connect(url.replace("http", "ws") + "/v1/code2wav/ws", open_timeout=T, close_timeout=T) as ws:
            ws.recv(timeout=T)
            ws.send(json.dumps({"codes": out_of_range[:, 10:].tolist()}))  # 10 frames, the bad code among them
            assert json.loads(ws.recv(timeout=T))["error"] == "InputRangeError"
        # still serving, nothing left open
        r = c.post("/v1/code2wav/stream", json={"codes": good.tolist(), "format": "pcm"})
        assert r.status_code == 200 and np.abs(_pcm(r.content) - _want(code2wav, good)).max() <= 1
        for _ in range(100):  # the socket's stream closes when the server's handler returns
            h = c.get("/health").json()
            if h["stages"]["code2wav"]["open_streams"] == 0:
                break
            threading.Event().wait(0.05)
        assert h["status"] == "ok" and h["stages"]["code2wav"]["open_streams"] == 0
        assert 'ttsaot_requests_total{endpoint="code2wav",outcome="client_error"} 14.0' in c.get("/metrics").text


def test_overload_is_503_and_recovers(qwen_tiny_fp32, code2wav):
    from websockets.sync.client import connect

    good = _codes(code2wav, 10, seed=6)
    with serve(qwen_tiny_fp32, max_streams=1) as url, httpx.Client(base_url=url, timeout=T) as c:
        with connect(url.replace("http", "ws") + "/v1/code2wav/ws", open_timeout=T, close_timeout=T) as ws:
            ws.recv(timeout=T)  # holds the only stream slot
            r = c.post("/v1/code2wav/stream", json={"codes": good.tolist()})
            assert (r.status_code, r.json()["error"], r.headers["retry-after"]) == (503, "OverloadedError", "1")
        for _ in range(100):  # the slot frees when the socket closes
            if c.get("/health").json()["stages"]["code2wav"]["open_streams"] == 0:
                break
            threading.Event().wait(0.05)
        assert c.post("/v1/code2wav/stream", json={"codes": good.tolist()}).status_code == 200


# --------------------------------------------------------------------------------------------- VoxCPM2
@pytest.fixture(scope="module")
def voxcpm2_dir(tmp_path_factory, voxcpm2_lm_tiny, voxcpm2_audio_fp32):
    """The two tiny VoxCPM2 artifacts (built in parts by their own tests) side by side: the service joins them."""
    root = tmp_path_factory.mktemp("vox")
    (root / "lm").symlink_to(voxcpm2_lm_tiny, target_is_directory=True)
    (root / "audio").symlink_to(voxcpm2_audio_fp32, target_is_directory=True)
    return root


def _reference_voxcpm2(stages: dict, tokens: list[int], seed: int, max_steps: int) -> np.ndarray:
    """What the endpoint promises: text-only prefill of both LMs, then VoxCPM2Decoder.stream from the last prompt
    position with a generator seeded `seed`."""
    bp, rp = stages["base_lm_prefill"], stages["residual_lm_prefill"]
    H = {s.name: s for s in bp.entry.inputs}["feat_embed"].shape[-1]
    C, P = (int(x) for x in {s.name: s for s in stages["locdit"].entry.inputs}["noise"].shape[1:])
    n = len(tokens)
    bc, rc = stages["base_lm_step"].new_cache(1), stages["residual_lm_step"].new_cache(1)
    fe, fm = torch.zeros(1, n, H), torch.zeros(1, n)
    lm = bp.prefill(torch.tensor([tokens]), torch.ones(1, n), fe, fm, lengths=[n], cache=bc)
    res = rp.prefill(lm, fe, fm, lengths=[n], cache=rc)
    dec = voxcpm2_pipeline().VoxCPM2Decoder(stages)
    wavs = dec.generate(
        lm[:, n - 1],
        res[:, n - 1],
        torch.zeros(1, C, P),
        base_cache=bc,
        residual_cache=rc,
        generators=[torch.Generator().manual_seed(seed)],
        max_steps=max_steps,
    )
    return _pcm(pcm16(wavs[0]))


def test_voxcpm2_endpoint_streams_the_decode_loop(voxcpm2_dir, voxcpm2_lm_tiny, voxcpm2_audio_fp32):
    stages = {**load(voxcpm2_lm_tiny), **load(voxcpm2_audio_fp32)}
    tokens, seed, steps = [5, 17, 3, 9, 11], 7, 7
    want = _reference_voxcpm2(stages, tokens, seed, steps)
    vocab = {s.name: s for s in stages["base_lm_prefill"].entry.inputs}["text_tokens"].range["high"][0]
    with serve(voxcpm2_dir, voxcpm2_slots=1) as url, httpx.Client(base_url=url, timeout=T) as c:
        assert c.get("/health").json()["voxcpm2"]["free_slots"] == 1
        with c.stream(
            "POST",
            "/v1/voxcpm2/stream",
            json={"text_tokens": tokens, "seed": seed, "max_steps": steps, "format": "pcm"},
        ) as r:
            assert r.status_code == 200 and int(r.headers["x-sample-rate"]) == stages["vae_decoder"].sample_rate
            body = b"".join(r.iter_bytes())
        got = _pcm(body)
        assert len(got) == len(want) > 0 and np.abs(got - want).max() <= 1
        r = c.post("/v1/voxcpm2/stream", json={"text_tokens": [vocab + 1], "max_steps": 2})
        assert (r.status_code, r.json()["error"]) == (422, "InputRangeError")
        r = c.post("/v1/voxcpm2/stream", json={"text_tokens": [[1, 2]]})
        assert (r.status_code, r.json()["error"]) == (422, "InputShapeError")
        assert c.get("/health").json()["voxcpm2"]["free_slots"] == 1  # refused requests returned their slot
        assert (
            c.post(
                "/v1/voxcpm2/stream", json={"text_tokens": tokens, "seed": seed, "max_steps": steps, "format": "pcm"}
            ).content
            == body
        )


# --------------------------------------------------------------------------------------------- load generator
def test_load_generator_runs_both_modes_and_reports(qwen_tiny_fp32, tmp_path):
    """The GPU load test's own code path on the tiny CPU artifact (in-process servers, short cells): every cell
    served its streams without errors, unbatched calls carry one row each, and the report renders the JSON."""
    from bench.report import serve_load_section
    from examples.serve.load import LoadSettings, run, write

    settings = LoadSettings(
        artifacts=str(qwen_tiny_fp32.parent),
        concurrency=(1, 3),
        seconds=1.0,
        warmup_s=0.3,
        utterance_s=0.1,
        server="thread",
        overhead_reps=10,
        out=str(tmp_path),
    )
    res = run(settings)
    assert res["overhead"]["same_output"] and res["overhead"]["direct_ms"]["p50"] > 0
    for mode in ("batched", "unbatched"):
        rec = res["modes"][mode]
        assert rec["status"] == "ok", rec
        assert [c["concurrency"] for c in rec["cells"]] == [1, 3]
        for c in rec["cells"]:
            assert c["requests"] >= c["concurrency"] and c["errors"] == 0, c
            assert c["audio_s"] == pytest.approx(c["requests"] * res["artifact"]["utterance_s"])
            assert c["ttfa_ms"]["p50"] > 0 and c["rtf"]["p95"] >= c["rtf"]["p50"] > 0
    assert all(c["mean_rows_per_call"] == 1.0 for c in res["modes"]["unbatched"]["cells"])
    assert res["modes"]["batched"]["server"]["batching"] and not res["modes"]["unbatched"]["server"]["batching"]
    assert set(res["summary"]["by_concurrency"]) == {"1", "3"}
    path = write(res, str(tmp_path))
    assert path == tmp_path / res["device"]["slug"] / "serve_load.json" and json.loads(path.read_text())["modes"]
    text = serve_load_section(json.loads(path.read_text()), None, "cpu", tmp_path / "BENCHMARKS.md")
    assert "| 3 |" in text and "Batcher overhead at c=1" in text
