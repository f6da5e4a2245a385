"""Load test of the streaming service: c concurrent streams (c = 1 … 32) against one server, batched and
one-request-at-a-time (the same server with `--no-batching`), plus the batcher's own overhead at c=1.

    python -m examples.serve.load --artifacts artifacts/qwen3-tts-12hz --out bench/results     # GPU, ≤ 4 min
    python -m bench report                                                                     # → BENCHMARKS.md

Builds nothing: it starts the server on the given artifact (a subprocess by default, `--server thread` keeps it
in this process), and every stream POSTs a whole utterance of random codes and reads the chunked PCM as it comes.
Per cell (mode × c) for `--seconds`: TTFA (request sent → first audio bytes) p50/p95, RTF per request (request
time / audio duration) p50/p95, audio seconds per second over all streams, and the mean rows per stage call read
from the server's /metrics. The batcher overhead is measured in this process: the same chunk window through
`stage(codes)` and through `Batcher(stage)(codes)`, interleaved. Writes <out>/<device-slug>/serve_load.json."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the server does (see examples/serve/__main__.py)

import argparse  # noqa: E402
import asyncio  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TARGETS = {
    "concurrency": 16,
    "audio_s_per_s_speedup_min": 4.0,
    "ttfa_p95_ratio_max": 3.0,
    "batcher_overhead_pct_max": 5.0,
}


@dataclass
class LoadSettings:
    artifacts: str  # the artifact dir holding --stage (or a dir of artifacts)
    stage: str = "code2wav"
    device: str | None = None
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    modes: tuple[str, ...] = ("batched", "unbatched")
    seconds: float = 6.0  # measured window per cell
    warmup_s: float = 2.0  # per mode, at the largest concurrency, not recorded
    utterance_s: float = 10.0  # audio per request
    chunk_frames: int | None = None  # default: the stage's streaming chunk
    max_wait_ms: float = 2.0
    server: str = "subprocess"  # or "thread"
    overhead_reps: int = 300
    budget_s: float = 230.0  # whole run; cells that would overrun are recorded as skipped
    out: str = "bench/results"
    seed: int = 0


# ------------------------------------------------------------------------------------------ statistics
def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _ms(values: list[float]) -> dict[str, float | None]:
    v = [x * 1e3 for x in values]
    return {"p50": _pct(v, 50), "p95": _pct(v, 95), "mean": float(np.mean(v)) if v else None}


def _metric(text: str, name: str, stage: str) -> float:
    key = f'{name}{{stage="{stage}"}} '
    for line in text.splitlines():
        if line.startswith(key):
            return float(line[len(key) :])
    return 0.0


# ------------------------------------------------------------------------------------------ batcher overhead
def measure_overhead(
    artifact: Path, stage_name: str, device: str | None, frames: int, reps: int, max_wait_ms: float, seed: int
) -> dict[str, Any]:
    """Median of `stage(codes)` vs `Batcher(stage)(codes)` at c=1 on the steady-state chunk window, host codes in
    (as the service receives them), the device synchronised after each call; calls interleaved."""
    from ttsaot.runtime import load
    from ttsaot.runtime.batching import Batcher, BatcherConfig

    stage = load(artifact, device=device, stages=[stage_name])[stage_name]
    spec = stage.entry.inputs[0]
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, min(spec.range["high"]), (1, spec.shape[1], frames), generator=g)
    sync = torch.cuda.synchronize if stage.device.type == "cuda" else (lambda: None)
    direct, batched = [], []
    with Batcher(stage, BatcherConfig(max_wait_s=max_wait_ms / 1000)) as b:
        for _ in range(10):
            stage(codes)
            b(codes)
        sync()
        for i in range(reps):
            for which in (0, 1) if i % 2 else (1, 0):
                t0 = time.perf_counter()
                stage(codes) if which == 0 else b(codes)
                sync()
                (direct if which == 0 else batched).append(time.perf_counter() - t0)
        same = bool(torch.equal(stage(codes), b(codes)))
    d, bt = _ms(direct), _ms(batched)
    del stage, b
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {
        "frames": frames,
        "batch": 1,
        "reps": reps,
        "direct_ms": d,
        "batcher_ms": bt,
        "overhead_pct": 100.0 * (bt["p50"] / d["p50"] - 1.0),
        "overhead_ms": bt["p50"] - d["p50"],
        "same_output": same,
    }


# ------------------------------------------------------------------------------------------ server
class ServerProcess:
    """`python -m examples.serve` as a subprocess on a free local port."""

    def __init__(self, artifact: Path, settings: LoadSettings, batching: bool, log: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        cmd = [
            sys.executable,
            "-m",
            "examples.serve",
            "--artifacts",
            str(artifact),
            "--port",
            str(port),
            "--max-wait-ms",
            str(settings.max_wait_ms),
            "--log-level",
            "warning",
        ]
        if settings.device:
            cmd += ["--device", settings.device]
        if not batching:
            cmd.append("--no-batching")
        self.log = log
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT)

    def __enter__(self) -> str:
        import httpx

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server did not answer /health within 300 s: {self.log.read_text()[-2000:]}")

    def __exit__(self, *exc) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def _server(artifact: Path, settings: LoadSettings, batching: bool, tmp: Path):
    if settings.server == "subprocess":
        return ServerProcess(artifact, settings, batching, tmp / f"server_{'batched' if batching else 'unbatched'}.log")
    from .app import ServeConfig, Service, ThreadedServer, create_app

    service = Service(
        ServeConfig(
            artifacts=str(artifact), device=settings.device, batching=batching, max_wait_ms=settings.max_wait_ms
        )
    )
    return ThreadedServer(create_app(service))


# ------------------------------------------------------------------------------------------ load
async def _stream(client, path: str, payload: bytes, sample_rate: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    ttfa, n = None, 0
    async with client.stream("POST", path, content=payload, headers={"content-type": "application/json"}) as r:
        if r.status_code != 200:
            body = await r.aread()
            return {"error": f"{r.status_code} {body[:200].decode(errors='replace')}"}
        async for part in r.aiter_raw():
            if ttfa is None and part:
                ttfa = time.perf_counter() - t0
            n += len(part)
    total = time.perf_counter() - t0
    audio = n / 2 / sample_rate
    return {"ttfa_s": ttfa, "total_s": total, "audio_s": audio}


async def run_cell(
    url: str, stage: str, c: int, seconds: float, payloads: list[bytes], sample_rate: int
) -> dict[str, Any]:
    import httpx

    limits = httpx.Limits(max_connections=c + 4, max_keepalive_connections=c + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        before = (await client.get("/metrics")).text
        results: list[dict] = []
        deadline = time.perf_counter() + seconds

        async def worker(i: int) -> None:
            k = i
            while time.perf_counter() < deadline:
                results.append(await _stream(client, f"/v1/{stage}/stream", payloads[k % len(payloads)], sample_rate))
                k += c

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(c)))
        wall = time.perf_counter() - t0
        after = (await client.get("/metrics")).text
    ok = [r for r in results if "error" not in r]
    rows = _metric(after, "ttsaot_batch_rows_sum", stage) - _metric(before, "ttsaot_batch_rows_sum", stage)
    calls = _metric(after, "ttsaot_batch_rows_count", stage) - _metric(before, "ttsaot_batch_rows_count", stage)
    audio = sum(r["audio_s"] for r in ok)
    return {
        "concurrency": c,
        "requests": len(ok),
        "errors": len(results) - len(ok),
        "first_error": next((r["error"] for r in results if "error" in r), None),
        "wall_s": wall,
        "audio_s": audio,
        "audio_s_per_s": audio / wall if wall else None,
        "requests_per_s": len(ok) / wall if wall else None,
        "ttfa_ms": _ms([r["ttfa_s"] for r in ok if r["ttfa_s"] is not None]),
        "rtf": {
            k: (v / 1e3 if v is not None else None)
            for k, v in _ms([r["total_s"] / r["audio_s"] for r in ok if r["audio_s"]]).items()
        },
        "stage_calls": calls,
        "mean_rows_per_call": rows / calls if calls else None,
    }


def _payloads(k: int, highs: list[int], frames: int, chunk: int, seed: int, n: int = 8) -> list[bytes]:
    """`n` different utterances of random codes (each codebook within its range), as request bodies."""
    g = torch.Generator().manual_seed(seed)
    highs = highs * k if len(highs) == 1 else highs
    out = []
    for _ in range(n):
        codes = torch.stack([torch.randint(0, h, (frames,), generator=g) for h in highs])
        out.append(json.dumps({"codes": codes.tolist(), "chunk_frames": chunk, "format": "pcm"}).encode())
    return out


# ------------------------------------------------------------------------------------------ main
def _artifact_with(root: Path, stage: str) -> Path:
    from ttsaot.runtime import read_manifest

    from .app import find_artifacts

    for path in find_artifacts(root):
        if stage in read_manifest(path).stages:
            return path
    raise SystemExit(f"no artifact under {root} has a stage {stage!r}")


def run(settings: LoadSettings) -> dict[str, Any]:
    from bench.common import device_info, git_commit, now_iso

    t_start = time.perf_counter()
    from ttsaot.runtime import read_manifest

    artifact = _artifact_with(Path(settings.artifacts), settings.stage)
    manifest = read_manifest(artifact)
    entry = manifest.stages[settings.stage]
    if entry.kind != "codec_decoder":
        raise SystemExit(f"{settings.stage}: the load test drives codec decoders, this is {entry.kind!r}")
    spec, md = entry.inputs[0], entry.metadata
    streaming = md.get("streaming", {})
    chunk = settings.chunk_frames or int(streaming.get("chunk_frames", 25))
    ctx = int(streaming.get("left_context_frames", 0))
    sr, spf = int(md["sample_rate"]), int(md["samples_per_frame"])
    frames = max(1, round(settings.utterance_s * sr / spf))
    device = settings.device or manifest.device
    res: dict[str, Any] = {
        "kind": "serve_load",
        "status": "ok",
        "started": now_iso(),
        "git_commit": git_commit(),
        "device": device_info(torch.device(device if device != "cuda" else "cuda:0")),
        "settings": {**asdict(settings), "concurrency": list(settings.concurrency), "modes": list(settings.modes)},
        "artifact": {
            "path": str(artifact),
            "family": manifest.family,
            "stage": settings.stage,
            "dtype": entry.dtype,
            "buckets": [dict(b.sizes) for b in entry.buckets],
            "sample_rate": sr,
            "samples_per_frame": spf,
            "chunk_frames": chunk,
            "left_context_frames": ctx,
            "utterance_frames": frames,
            "utterance_s": frames * spf / sr,
        },
        "targets": TARGETS,
        "modes": {},
        # uvicorn uses these C parsers/loops when importable (much of a loopback benchmark's CPU is HTTP)
        "http": {m: importlib.util.find_spec(m) is not None for m in ("httptools", "uvloop")},
    }
    try:
        res["overhead"] = measure_overhead(
            artifact,
            settings.stage,
            settings.device,
            min(chunk + ctx, max(b.sizes["frames"] for b in entry.buckets)),
            settings.overhead_reps,
            settings.max_wait_ms,
            settings.seed,
        )
    except Exception as e:  # noqa: BLE001 - recorded, the load cells still run
        res["overhead"] = {"status": "error", "reason": f"{type(e).__name__}: {e}"}
    payloads = _payloads(int(spec.shape[1]), list(spec.range["high"]), frames, chunk, settings.seed)
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        for mode in settings.modes:
            rec: dict[str, Any] = {"status": "ok", "cells": []}
            res["modes"][mode] = rec
            try:
                with _server(artifact, settings, mode == "batched", Path(tmp)) as url:
                    import httpx

                    rec["server"] = httpx.get(url + "/health", timeout=10).json()
                    asyncio.run(
                        run_cell(url, settings.stage, max(settings.concurrency), settings.warmup_s, payloads, sr)
                    )
                    for c in settings.concurrency:
                        if time.perf_counter() - t_start + settings.seconds + 15 > settings.budget_s:
                            rec["cells"].append(
                                {
                                    "concurrency": c,
                                    "status": "skipped",
                                    "reason": f"time budget {settings.budget_s:.0f} s",
                                }
                            )
                            continue
                        cell = asyncio.run(run_cell(url, settings.stage, c, settings.seconds, payloads, sr))
                        rec["cells"].append(cell)
                        print(
                            f"{mode:9s} c={c:2d}: {cell['audio_s_per_s']:8.1f} audio-s/s, TTFA p50/p95 "
                            f"{cell['ttfa_ms']['p50'] or 0:7.1f}/{cell['ttfa_ms']['p95'] or 0:7.1f} ms, "
                            f"{cell['mean_rows_per_call'] or 0:4.1f} rows/call, {cell['errors']} errors",
                            flush=True,
                        )
            except Exception as e:  # noqa: BLE001 - recorded as the mode's status
                rec.update(status="error", reason=f"{type(e).__name__}: {str(e)[-1500:]}")
    res["summary"] = summarize(res)
    res["elapsed_s"] = time.perf_counter() - t_start
    return res


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    def cells(mode: str) -> dict[int, dict]:
        return {c["concurrency"]: c for c in res["modes"].get(mode, {}).get("cells", []) if "audio_s_per_s" in c}

    b, u = cells("batched"), cells("unbatched")
    out: dict[str, Any] = {"by_concurrency": {}}
    b1 = b.get(1, {}).get("ttfa_ms", {}).get("p95")
    for c in sorted(set(b) | set(u)):
        row: dict[str, Any] = {}
        if c in b and c in u and u[c]["audio_s_per_s"]:
            row["audio_s_per_s_speedup"] = b[c]["audio_s_per_s"] / u[c]["audio_s_per_s"]
        if c in b and b1 and b[c]["ttfa_ms"]["p95"] is not None:
            row["ttfa_p95_vs_c1"] = b[c]["ttfa_ms"]["p95"] / b1
        out["by_concurrency"][str(c)] = row
    t = res["targets"]
    at = out["by_concurrency"].get(str(t["concurrency"]), {})
    over = res.get("overhead", {}).get("overhead_pct")
    out["targets_met"] = {
        "audio_s_per_s_speedup": None
        if "audio_s_per_s_speedup" not in at
        else at["audio_s_per_s_speedup"] >= t["audio_s_per_s_speedup_min"],
        "ttfa_p95_ratio": None if "ttfa_p95_vs_c1" not in at else at["ttfa_p95_vs_c1"] <= t["ttfa_p95_ratio_max"],
        "batcher_overhead": None if over is None else over <= t["batcher_overhead_pct_max"],
    }
    return out


def parse_args(argv: list[str] | None = None) -> LoadSettings:
    d = LoadSettings(artifacts="")
    p = argparse.ArgumentParser(
        prog="python -m examples.serve.load", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--artifacts", required=True)
    p.add_argument("--stage", default=d.stage)
    p.add_argument("--device", default=None)
    p.add_argument("--concurrency", default=",".join(map(str, d.concurrency)))
    p.add_argument("--modes", default=",".join(d.modes), help="batched,unbatched (either or both)")
    p.add_argument("--seconds", type=float, default=d.seconds, help="measured window per cell")
    p.add_argument("--warmup-s", type=float, default=d.warmup_s)
    p.add_argument("--utterance-s", type=float, default=d.utterance_s)
    p.add_argument("--chunk-frames", type=int, default=None)
    p.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms)
    p.add_argument("--server", choices=("subprocess", "thread"), default=d.server)
    p.add_argument("--overhead-reps", type=int, default=d.overhead_reps)
    p.add_argument("--budget-s", type=float, default=d.budget_s)
    p.add_argument("--out", default=d.out, help="results root: writes <out>/<device-slug>/serve_load.json")
    p.add_argument("--seed", type=int, default=d.seed)
    a = p.parse_args(argv)
    modes = tuple(m for m in a.modes.split(",") if m)
    if not modes or set(modes) - {"batched", "unbatched"}:
        p.error("--modes takes batched and/or unbatched")
    return LoadSettings(
        artifacts=a.artifacts,
        stage=a.stage,
        device=a.device,
        concurrency=tuple(int(c) for c in a.concurrency.split(",") if c),
        modes=modes,
        seconds=a.seconds,
        warmup_s=a.warmup_s,
        utterance_s=a.utterance_s,
        chunk_frames=a.chunk_frames,
        max_wait_ms=a.max_wait_ms,
        server=a.server,
        overhead_reps=a.overhead_reps,
        budget_s=a.budget_s,
        out=a.out,
        seed=a.seed,
    )


def write(res: dict[str, Any], out: str) -> Path:
    from bench.common import write_json

    path = Path(out) / res["device"]["slug"] / "serve_load.json"
    write_json(path, res)
    return path


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)
    res = run(settings)
    path = write(res, settings.out)
    s, o = res["summary"], res.get("overhead", {})
    if "overhead_pct" in o:
        print(
            f"batcher overhead at c=1: {o['overhead_pct']:+.1f}% ({o['direct_ms']['p50']:.3f} ms direct, "
            f"{o['batcher_ms']['p50']:.3f} ms batched)"
        )
    print(f"targets: {s['targets_met']}; wrote {path} in {res['elapsed_s']:.0f} s")


if __name__ == "__main__":
    main()
