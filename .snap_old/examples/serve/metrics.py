"""Prometheus metrics of the service: the batchers' hooks (queue depth, batch sizes, waits) and per-endpoint TTFA,
outcomes and audio served. One registry per service, so several services (tests, Ray replicas) never collide."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ttsaot.runtime.batching import Batcher, BatchRecord

ROWS_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
SECONDS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge("ttsaot_queue_depth", "Requests waiting for a stage's batcher", ["stage"], registry=r)
        self.open_streams = Gauge("ttsaot_open_streams", "Open streaming sessions per stage", ["stage"], registry=r)
        self.batch_rows = Histogram(
            "ttsaot_batch_rows",
            "Rows per stage call (batch size before bucket padding)",
            ["stage"],
            buckets=ROWS_BUCKETS,
            registry=r,
        )
        self.batch_requests = Histogram(
            "ttsaot_batch_requests", "Requests served by one stage call", ["stage"], buckets=ROWS_BUCKETS, registry=r
        )
        self.batch_wait = Histogram(
            "ttsaot_batch_wait_seconds",
            "Per request: queued until its stage call started",
            ["stage"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.batch_run = Histogram(
            "ttsaot_batch_run_seconds",
            "Duration of one batched stage call",
            ["stage"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.ttfa = Histogram(
            "ttsaot_ttfa_seconds",
            "Request received until its first audio chunk is sent",
            ["endpoint"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "ttsaot_requests",
            "Requests by outcome (ok, client_error, overloaded, error, cancelled)",
            ["endpoint", "outcome"],
            registry=r,
        )
        self.audio_seconds = Counter("ttsaot_audio_seconds", "Seconds of audio sent", ["endpoint"], registry=r)

    def watch(self, batcher: Batcher) -> None:
        """Map one batcher's hooks onto the metrics (gauges read at scrape time, the rest per stage call)."""
        name = batcher.stage.name
        self.queue_depth.labels(name).set_function(lambda: batcher.queue_depth)
        self.open_streams.labels(name).set_function(lambda: batcher.open_streams)
        rows, reqs = self.batch_rows.labels(name), self.batch_requests.labels(name)
        wait, run = self.batch_wait.labels(name), self.batch_run.labels(name)

        def observe(rec: BatchRecord) -> None:
            rows.observe(rec.rows)
            reqs.observe(rec.requests)
            run.observe(rec.run_s)
            for w in rec.waits_s:
                wait.observe(w)

        batcher.observers.append(observe)

    def render(self) -> bytes:
        return generate_latest(self.registry)
