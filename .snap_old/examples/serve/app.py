"""A streaming TTS service on the ttsaot runtime (Starlette on uvicorn): codes in, chunked 16-bit PCM / WAV out.

Endpoints (`README.md` beside this file has the protocol and examples):
  POST /v1/{stage}/stream   whole codes [K, F] as JSON → chunked response, one PCM piece per decoded chunk
  WS   /v1/{stage}/ws       codes arriving over time (one JSON message per chunk) → one binary PCM message each
  POST /v1/voxcpm2/stream   VoxCPM2: text tokens → prefill → the runtime's decode loop, chunked 48 kHz PCM
  GET  /health, /metrics    liveness + stages; Prometheus (queue depth, batch sizes, waits, TTFA)

Every codec stream is a `StreamSession` of its stage's `Batcher`: chunks of concurrent streams share one stage call
(one CUDA-graph replay). `batching=False` serves the same way with batches of one (the one-at-a-time baseline).
Bad requests end in a 4xx naming the runtime's typed error; a full queue in a 503 with Retry-After."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import struct
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from ttsaot.runtime import (
    InputDTypeError,
    InputError,
    InputRangeError,
    InputShapeError,
    InputValueError,
    TTSAOTError,
    load,
    read_manifest,
)
from ttsaot.runtime.batching import Batcher, BatcherConfig, OverloadedError

from .metrics import Metrics

VOXCPM2_STAGES = (
    "base_lm_prefill",
    "residual_lm_prefill",
    "base_lm_step",
    "residual_lm_step",
    "locdit",
    "local_encoder",
    "vae_decoder",
)


@dataclass
class ServeConfig:
    artifacts: str  # an artifact directory, or a directory of them (artifacts/<family>/)
    device: str | None = None  # default: each artifact's own device type
    batching: bool = True  # False: batches of one (the one-request-at-a-time baseline)
    max_wait_ms: float = 2.0  # how long a batch waits for more streams' chunks
    max_queue: int = 256  # queued chunks per stage before 503
    max_streams: int = 256  # open streams per stage before 503
    max_request_frames: int = 6000  # longest POST request (frames); longer → 413
    max_body_bytes: int = 16 << 20  # request bodies above this → 413
    voxcpm2_slots: int = 2  # concurrent VoxCPM2 requests (one KV-cache pair each, allocated at start)
    cuda_graphs: bool = True


class PayloadTooLarge(InputShapeError):
    """A request above the service's configured limits (413)."""


# ------------------------------------------------------------------------------------------ audio encoding
def pcm16(wav: torch.Tensor) -> bytes:
    """Float wave (any shape, mono) → little-endian int16 bytes."""
    x = wav.detach().reshape(-1).float().cpu().clamp_(-1.0, 1.0).mul_(32767.0).round_()
    return x.to(torch.int16).numpy().astype("<i2", copy=False).tobytes()


def wav_header(sample_rate: int) -> bytes:
    """A WAV header for a stream of unknown length (sizes 0xFFFFFFFF, what streaming players accept)."""
    return (
        b"RIFF"
        + struct.pack("<I", 0xFFFFFFFF)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", 0xFFFFFFFF)
    )


def _media(fmt: str, sample_rate: int) -> str:
    if fmt == "wav":
        return "audio/wav"
    if fmt == "pcm":
        return f"audio/L16;rate={sample_rate};channels=1"
    raise InputValueError(f"format must be 'wav' or 'pcm', got {fmt!r}")


# ------------------------------------------------------------------------------------------ codec endpoints
class CodecEndpoint:
    """One codec decoder stage (`code2wav`, `dac_decoder`) and its batcher."""

    def __init__(self, stage, config: ServeConfig, metrics: Metrics) -> None:
        self.stage, self.name = stage, stage.name
        # A stream has one chunk in flight: with a queue at least as long as the stream slots, an admitted stream
        # is never refused mid-way (overload is answered at admission, before any audio).
        bc = BatcherConfig(
            max_wait_s=config.max_wait_ms / 1000 if config.batching else 0.0,
            max_queue=max(config.max_queue, config.max_streams),
            max_streams=config.max_streams,
            max_batch=None if config.batching else 1,
            output_device="cpu",
        )
        self.batcher = Batcher(stage, bc)
        metrics.watch(self.batcher)
        spec = stage.entry.inputs[0]
        self.codebooks = int(spec.shape[1])
        self.code_range = spec.range
        streaming = stage.metadata.get("streaming", {})
        self.left_context = int(streaming.get("left_context_frames", 0))
        self.chunk_frames = int(streaming.get("chunk_frames") or max(1, stage.max_sizes["frames"] - self.left_context))
        self.sample_rate, self.samples_per_frame = stage.sample_rate, stage.samples_per_frame
        self.max_request_frames = config.max_request_frames

    def codes(self, value: Any, max_frames: int | None = None) -> torch.Tensor:
        """JSON codes [K, F] → int64 tensor [1, K, F], checked against the stage's codebooks before anything runs
        (a bad code in the last chunk must be a 4xx, not a stream cut short)."""
        if value is None:
            raise InputValueError(f'{self.name}: no codes (send {{"codes": [[...], ...]}}, [K, frames])')
        try:
            arr = np.asarray(value)
        except ValueError:
            raise InputShapeError(f"{self.name}: codes must be a rectangular [K, F] array of integers") from None
        if arr.ndim != 2 or arr.shape[0] != self.codebooks:
            raise InputShapeError(f"{self.name}: codes must be [{self.codebooks}, frames], got {list(arr.shape)}")
        if arr.shape[1] == 0:
            raise InputValueError(f"{self.name}: no frames")
        if arr.dtype.kind not in "iu":
            raise InputDTypeError(f"{self.name}: codes must be integers, got {arr.dtype.name}")
        limit = self.max_request_frames if max_frames is None else max_frames
        if arr.shape[1] > limit:
            raise PayloadTooLarge(f"{self.name}: {arr.shape[1]} frames exceed this service's limit of {limit}")
        if self.code_range is not None:
            high = np.asarray(self.code_range["high"]).reshape(-1, 1)
            low = int(self.code_range.get("low", 0))
            bad = (arr < low) | (arr >= high)
            if bad.any():
                k, f = (int(i) for i in np.argwhere(bad)[0])
                raise InputRangeError(
                    f"{self.name}: codes[{k}, {f}] = {int(arr[k, f])} is outside "
                    f"[{low}, {int(high[k if len(high) > 1 else 0, 0])}) (codebook {k})"
                )
        return torch.from_numpy(arr.astype(np.int64, copy=False))[None]

    def chunk(self, value: Any) -> int:
        n = self.chunk_frames if value is None else value
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InputValueError(f"{self.name}: chunk_frames must be a positive integer, got {value!r}")
        largest = int(self.stage.max_sizes["frames"])
        if n + self.left_context > largest:
            raise InputShapeError(
                f"{self.name}: chunk_frames {n} + left context {self.left_context} exceeds the "
                f"largest bucket ({largest})"
            )
        return n


# ------------------------------------------------------------------------------------------ VoxCPM2
def voxcpm2_pipeline() -> ModuleType:
    """The runtime's VoxCPM2 decode loop (imported on first use: a codec-only service never loads it)."""
    return importlib.import_module("ttsaot.runtime.pipelines.voxcpm2")


class VoxCPM2Endpoint:
    """Text tokens → prefill of both LMs → `VoxCPM2Decoder.stream`. Each request holds one pair of KV caches from
    a pool allocated at start (so CUDA graphs are captured per cache once, not per request); no free pair → 503.
    Concurrent requests interleave stage by stage (the stages' locks); they are not batched with each other:
    that needs a scheduler over cache rows, which is the serving engine's job (vLLM-Omni), not this example's."""

    def __init__(self, stages: dict, slots: int) -> None:
        self.stages = stages
        self.decoder = voxcpm2_pipeline().VoxCPM2Decoder(stages)
        self.prefill = stages["base_lm_prefill"], stages["residual_lm_prefill"]
        base_step, res_step = stages["base_lm_step"], stages["residual_lm_step"]
        self.slots: list[tuple[Any, Any]] = [(base_step.new_cache(1), res_step.new_cache(1)) for _ in range(slots)]
        self._lock = threading.Lock()
        spec = {s.name: s for s in stages["base_lm_prefill"].entry.inputs}
        self.hidden = int(spec["feat_embed"].shape[-1])
        self.vocab = int(spec["text_tokens"].range["high"][0]) if spec["text_tokens"].range else None
        noise = {s.name: s for s in stages["locdit"].entry.inputs}["noise"]
        self.feat_dim, self.patch = int(noise.shape[1]), int(noise.shape[2])
        self.sample_rate = stages["vae_decoder"].sample_rate
        self.device = stages["locdit"].device

    def acquire(self) -> tuple[Any, Any]:
        with self._lock:
            if not self.slots:
                raise OverloadedError("voxcpm2: every decode slot is busy; retry later")
            return self.slots.pop()

    def release(self, slot: tuple[Any, Any]) -> None:
        with self._lock:
            self.slots.append(slot)

    def tokens(self, value: Any) -> torch.Tensor:
        try:
            arr = np.asarray(value)
        except ValueError:
            raise InputShapeError("voxcpm2: text_tokens must be a flat list of integers") from None
        if arr.ndim != 1 or arr.dtype.kind not in "iu" or arr.size == 0:
            raise InputShapeError(
                f"voxcpm2: text_tokens must be a non-empty flat list of integers, got "
                f"{arr.dtype.name} {list(arr.shape)}"
            )
        return torch.from_numpy(arr.astype(np.int64, copy=False))[None]

    def start(self, tokens: torch.Tensor, slot, seed: int, max_steps: int):
        """Prefill (raises the runtime's typed errors) → the decode loop's event iterator (not started)."""
        bp, rp = self.prefill
        base_cache, res_cache = slot
        T = tokens.shape[1]
        dev = self.device
        text_mask = torch.ones(1, T, device=dev)
        feat_embed = torch.zeros(1, T, self.hidden, device=dev)
        feat_mask = torch.zeros(1, T, device=dev)
        tok = tokens.to(dev)
        lm = bp.prefill(tok, text_mask, feat_embed, feat_mask, lengths=[T], cache=base_cache)
        res = rp.prefill(lm, feat_embed, feat_mask, lengths=[T], cache=res_cache)
        cond = torch.zeros(1, self.feat_dim, self.patch, device=dev)
        gen = torch.Generator(device=dev).manual_seed(seed)
        return self.decoder.stream(
            lm[:, T - 1],
            res[:, T - 1],
            cond,
            base_cache=base_cache,
            residual_cache=res_cache,
            generators=[gen],
            max_steps=max_steps,
        )


# ------------------------------------------------------------------------------------------ the service
def find_artifacts(root: Path) -> list[Path]:
    if (root / "manifest.json").is_file():
        return [root]
    found = sorted(p.parent for p in root.glob("*/manifest.json"))
    if not found:
        raise FileNotFoundError(f"{root}: no artifact (no manifest.json in it or in its subdirectories)")
    return found


class Service:
    """Loads the artifacts once and owns the batchers; `create_app(service)` serves it over HTTP."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.codecs: dict[str, CodecEndpoint] = {}
        self.voxcpm2: VoxCPM2Endpoint | None = None
        self.devices: set[str] = set()
        vox: dict[str, Any] = {}
        for path in find_artifacts(Path(config.artifacts)):
            manifest = read_manifest(path)
            codecs = [
                n
                for n, e in manifest.stages.items()
                if e.kind == "codec_decoder" and e.inputs[0].dtype == "int64" and e.buckets
            ]
            pipeline = [n for n in VOXCPM2_STAGES if manifest.family == "voxcpm2" and n in manifest.stages]
            if not codecs and not pipeline:
                continue
            bundle = load(path, device=config.device, stages=codecs + pipeline, cuda_graphs=config.cuda_graphs)
            self.devices.add(str(bundle.device))
            for n in codecs:
                if n in self.codecs:
                    raise ValueError(f"stage {n!r} is in two artifacts under {config.artifacts}")
                self.codecs[n] = CodecEndpoint(bundle[n], config, self.metrics)
            vox.update({n: bundle[n] for n in pipeline})  # a family built in parts (separate dirs) joins up
        if all(n in vox for n in VOXCPM2_STAGES):
            self.voxcpm2 = VoxCPM2Endpoint(vox, config.voxcpm2_slots)
        if not self.codecs and self.voxcpm2 is None:
            raise FileNotFoundError(f"{config.artifacts}: no codec decoder or complete VoxCPM2 pipeline to serve")

    def health(self) -> dict:
        return {
            "status": "ok" if all(c.batcher.alive for c in self.codecs.values()) else "degraded",
            "devices": sorted(self.devices),
            "batching": self.config.batching,
            "max_wait_ms": self.config.max_wait_ms,
            "stages": {
                n: {
                    "sample_rate": c.sample_rate,
                    "samples_per_frame": c.samples_per_frame,
                    "codebooks": c.codebooks,
                    "code_high": (c.code_range or {}).get("high"),
                    "chunk_frames": c.chunk_frames,
                    "left_context_frames": c.left_context,
                    "max_batch": c.batcher.max_rows,
                    "queue_depth": c.batcher.queue_depth,
                    "open_streams": c.batcher.open_streams,
                }
                for n, c in self.codecs.items()
            },
            "voxcpm2": None
            if self.voxcpm2 is None
            else {"sample_rate": self.voxcpm2.sample_rate, "free_slots": len(self.voxcpm2.slots)},
        }

    def close(self) -> None:
        for c in self.codecs.values():
            c.batcher.close()


def _runtime_error_name(e: BaseException) -> str:
    """The runtime's class name for an error (a service-local subclass reports its runtime parent)."""
    return next((c.__name__ for c in type(e).__mro__ if c.__module__.startswith("ttsaot.runtime")), type(e).__name__)


def _error_response(e: BaseException) -> JSONResponse:
    if isinstance(e, OverloadedError):
        return JSONResponse({"error": "OverloadedError", "detail": str(e)}, 503, headers={"Retry-After": "1"})
    if isinstance(e, InputError):
        return JSONResponse(
            {"error": _runtime_error_name(e), "detail": str(e)}, 413 if isinstance(e, PayloadTooLarge) else 422
        )
    return JSONResponse({"error": type(e).__name__, "detail": str(e)}, 500)


def _outcome(e: BaseException) -> str:
    return "overloaded" if isinstance(e, OverloadedError) else "client_error" if isinstance(e, InputError) else "error"


async def _json_body(request: Request, limit: int) -> dict:
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise PayloadTooLarge(f"request body of {size} bytes exceeds this service's limit of {limit}")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise PayloadTooLarge(f"request body exceeds this service's limit of {limit} bytes")
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputValueError(f"request body is not JSON ({e})") from None
    if not isinstance(data, dict):
        raise InputValueError("request body must be a JSON object")
    return data


def create_app(service: Service) -> Starlette:
    metrics = service.metrics

    async def _typed(request: Request, e: TTSAOTError) -> JSONResponse:
        return _error_response(e)

    async def _missing(request: Request, e: LookupError) -> JSONResponse:
        return JSONResponse({"error": "NotFound", "detail": str(e)}, 404)

    async def health(request: Request) -> JSONResponse:
        h = service.health()
        return JSONResponse(h, 200 if h["status"] == "ok" else 503)

    async def prometheus(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    def endpoint(stage: str) -> CodecEndpoint:
        ep = service.codecs.get(stage)
        if ep is None:
            raise _NotFound(f"no codec stage {stage!r} here (have: {', '.join(service.codecs) or 'none'})")
        return ep

    async def voxcpm2(request: Request):
        t0 = time.perf_counter()
        label = "voxcpm2"
        vx = service.voxcpm2
        if vx is None:
            raise _NotFound("no complete VoxCPM2 artifact here (needs " + ", ".join(VOXCPM2_STAGES) + ")")
        try:
            body = await _json_body(request, service.config.max_body_bytes)
            tokens = vx.tokens(body.get("text_tokens"))
            seed, max_steps = body.get("seed", 0), body.get("max_steps", 200)
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (seed, max_steps)) or max_steps < 1:
                raise InputValueError("seed and max_steps must be integers, max_steps >= 1")
            fmt = body.get("format", "wav")
            media = _media(fmt, vx.sample_rate)
            slot = vx.acquire()
        except TTSAOTError as e:
            metrics.requests.labels(label, _outcome(e)).inc()
            raise
        try:
            events = await asyncio.to_thread(vx.start, tokens, slot, seed, max_steps)  # prefill errors → 4xx
        except BaseException as e:
            vx.release(slot)
            metrics.requests.labels(label, _outcome(e) if isinstance(e, Exception) else "cancelled").inc()
            raise
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()

        def decode() -> None:  # the blocking decode loop, on a worker thread
            try:
                for ev in events:
                    loop.call_soon_threadsafe(queue.put_nowait, ("audio", pcm16(ev.wav)))
                    if stop.is_set():
                        break
                loop.call_soon_threadsafe(queue.put_nowait, ("end", None))
            except Exception as e:  # noqa: BLE001 - handed to the response
                loop.call_soon_threadsafe(queue.put_nowait, ("error", e))
            finally:
                events.close()
                vx.release(slot)

        worker = loop.run_in_executor(None, decode)

        async def audio() -> AsyncIterator[bytes]:
            outcome, first, samples = "cancelled", True, 0
            try:
                if fmt == "wav":
                    yield wav_header(vx.sample_rate)
                while True:
                    kind, value = await queue.get()
                    if kind == "end":
                        break
                    if kind == "error":
                        raise value
                    samples += len(value) // 2
                    yield value
                    if first:
                        metrics.ttfa.labels(label).observe(time.perf_counter() - t0)
                        first = False
                outcome = "ok"
                metrics.audio_seconds.labels(label).inc(samples / vx.sample_rate)
            except Exception as e:
                outcome = _outcome(e)
                raise
            finally:
                stop.set()
                metrics.requests.labels(label, outcome).inc()
                await asyncio.shield(worker)

        return StreamingResponse(audio(), media_type=media, headers={"X-Sample-Rate": str(vx.sample_rate)})

    async def stream(request: Request):
        t0 = time.perf_counter()
        stage = request.path_params["stage"]
        label = stage
        try:
            ep = endpoint(stage)
            body = await _json_body(request, service.config.max_body_bytes)
            codes = ep.codes(body.get("codes"))
            chunk = ep.chunk(body.get("chunk_frames"))
            fmt = body.get("format", "wav")
            media = _media(fmt, ep.sample_rate)
            session = ep.batcher.open_stream()
        except TTSAOTError as e:
            metrics.requests.labels(label, _outcome(e)).inc()
            raise
        pieces = list(codes.split(chunk, dim=-1))
        try:
            first = await session.apush(pieces[0])  # before the headers: a refusal is still a clean 4xx
        except BaseException as e:
            session.close()
            metrics.requests.labels(label, _outcome(e) if isinstance(e, Exception) else "cancelled").inc()
            raise

        async def audio() -> AsyncIterator[bytes]:
            outcome = "cancelled"
            try:
                head = wav_header(ep.sample_rate) if fmt == "wav" else b""
                yield head + pcm16(first)
                metrics.ttfa.labels(label).observe(time.perf_counter() - t0)
                for p in pieces[1:]:
                    yield pcm16(await session.apush(p))
                outcome = "ok"
                metrics.audio_seconds.labels(label).inc(codes.shape[-1] * ep.samples_per_frame / ep.sample_rate)
            except Exception as e:
                outcome = _outcome(e)
                raise
            finally:
                session.close()
                metrics.requests.labels(label, outcome).inc()

        return StreamingResponse(
            audio(),
            media_type=media,
            headers={
                "X-Sample-Rate": str(ep.sample_rate),
                "X-Frames": str(codes.shape[-1]),
                "X-Samples": str(codes.shape[-1] * ep.samples_per_frame),
            },
        )

    async def stream_ws(ws: WebSocket):
        stage = ws.path_params["stage"]
        await ws.accept()
        label = f"{stage}/ws"
        ep = service.codecs.get(stage)
        if ep is None:
            await ws.send_json({"error": "NotFound", "detail": f"no codec stage {stage!r} here"})
            await ws.close(1008)
            return
        try:
            session = ep.batcher.open_stream()
        except OverloadedError as e:
            metrics.requests.labels(label, "overloaded").inc()
            await ws.send_json({"error": "OverloadedError", "detail": str(e)})
            await ws.close(1013)
            return
        await ws.send_json(
            {
                "sample_rate": ep.sample_rate,
                "samples_per_frame": ep.samples_per_frame,
                "codebooks": ep.codebooks,
                "format": "pcm_s16le",
            }
        )
        t0, first, frames, outcome = time.perf_counter(), True, 0, "cancelled"
        largest = int(ep.stage.max_sizes["frames"]) - ep.left_context
        try:
            while True:
                raw = await ws.receive()
                if raw["type"] == "websocket.disconnect":
                    raise WebSocketDisconnect(raw.get("code", 1000))
                try:
                    msg = json.loads(raw.get("text") or "")
                except json.JSONDecodeError:
                    msg = None
                if not isinstance(msg, dict):
                    raise InputValueError('each message must be a JSON text: {"codes": [[...]]} or {"end": true}')
                if msg.get("end"):
                    outcome = "ok"
                    break
                codes = ep.codes(msg.get("codes"), max_frames=largest)
                await ws.send_bytes(pcm16(await session.apush(codes)))
                frames += codes.shape[-1]
                if first:
                    metrics.ttfa.labels(label).observe(time.perf_counter() - t0)
                    first = False
            metrics.audio_seconds.labels(label).inc(frames * ep.samples_per_frame / ep.sample_rate)
            await ws.close(1000)
        except WebSocketDisconnect:
            pass
        except TTSAOTError as e:
            outcome = _outcome(e)
            await ws.send_json({"error": _runtime_error_name(e), "detail": str(e)})
            await ws.close(1013 if isinstance(e, OverloadedError) else 1008)
        finally:
            session.close()
            metrics.requests.labels(label, outcome).inc()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        yield
        service.close()  # the batchers' workers stop with the server

    routes = [
        Route("/health", health),
        Route("/metrics", prometheus),
        # before /v1/{stage}/stream, which would match it
        Route("/v1/voxcpm2/stream", voxcpm2, methods=["POST"]),
        Route("/v1/{stage}/stream", stream, methods=["POST"]),
        WebSocketRoute("/v1/{stage}/ws", stream_ws),
    ]
    app = Starlette(routes=routes, exception_handlers={TTSAOTError: _typed, LookupError: _missing}, lifespan=lifespan)
    app.state.service = service
    return app


class _NotFound(LookupError):
    pass


class ThreadedServer:
    """uvicorn serving `app` on 127.0.0.1 (a free port by default) in a background thread: tests and the load
    generator's in-process mode. `with ThreadedServer(app) as url: ...`"""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        import socket

        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()
