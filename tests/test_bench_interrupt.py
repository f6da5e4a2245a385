"""A bench run interrupted (SIGINT: a device plan's `timeout -s INT`) keeps what its stage worker had measured.

An H100 call at a816fdd lost both LM steps' results this way: the worker, in its own session, never saw the signal,
while the parent stopped before it read the worker's partial JSON."""

from __future__ import annotations

import json
import selectors
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest

import bench.__main__ as bench_main
from bench.common import INTERRUPTED, spawn


class _InterruptedSelector(selectors.DefaultSelector):
    """A selector whose first wait is interrupted, as Ctrl-C / SIGINT interrupts the parent's wait for output."""

    def __init__(self) -> None:
        super().__init__()
        self._fired = False

    def select(self, timeout=None):
        if not self._fired:
            self._fired = True
            raise KeyboardInterrupt
        return super().select(timeout)


def test_an_interrupted_spawn_kills_its_worker_and_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(selectors, "DefaultSelector", _InterruptedSelector)
    marker = tmp_path / "still_running"
    worker = f"import time, pathlib; time.sleep(20); pathlib.Path({str(marker)!r}).write_text('x')"
    t0 = time.time()
    rc, tail = spawn([sys.executable, "-c", worker], {}, timeout=60)
    assert rc == INTERRUPTED and "interrupted" in tail
    assert time.time() - t0 < 15  # the worker was killed, not waited for
    time.sleep(0.5)
    assert not marker.exists()


def test_an_interrupted_stage_writes_what_it_measured_then_stops_the_run(monkeypatch, tmp_path):
    partial = {
        "schema": 1,
        "stage": {"family": "fam", "stage": "st"},
        "device": {"slug": "dev"},
        "variants": {
            "eager": {"status": "ok", "buckets": {"b1": {"ms": 2.0}}},
            "compile_graph": {"status": "running", "buckets": {}},
        },
    }

    def fake_spawn(cmd, env, timeout, log_path=None):
        Path(cmd[cmd.index("--result") + 1]).write_text(json.dumps(partial))
        return INTERRUPTED, "interrupted (SIGINT) while running; last output: autotuning"

    monkeypatch.setattr(bench_main, "spawn", fake_spawn)
    monkeypatch.setattr(bench_main, "_worker_args", lambda a: [])
    a = Namespace(out=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"), merge=False, record_failures=True,
                  dtype_explicit=None)  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        bench_main._run_stage_worker(a, "fam", "st", {}, 60)
    res = json.loads((tmp_path / "out" / "dev" / "fam__st.json").read_text())
    assert res["status"] == "incomplete" and "interrupted" in res["reason"]
    assert res["variants"]["eager"]["buckets"]["b1"]["ms"] == 2.0
    assert res["variants"]["compile_graph"]["status"] == "incomplete"
