"""builder/gpu_benchmark_lock.py: autotuning measurements on one GPU never overlap across processes."""

import multiprocessing as mp
import time
from pathlib import Path

import torch

from ttsaot.builder import gpu_benchmark_lock as L


def _timed_section(path: str, out: str) -> None:
    def section() -> None:
        t0 = time.monotonic()
        time.sleep(0.3)
        Path(out).write_text(f"{t0} {time.monotonic()}")

    L.exclusive(section, Path(path))()


def test_exclusive_sections_of_two_processes_do_not_overlap(tmp_path):
    ctx = mp.get_context("spawn")
    lock = tmp_path / "gpu.lock"
    outs = [tmp_path / f"p{i}.txt" for i in range(2)]
    procs = [ctx.Process(target=_timed_section, args=(str(lock), str(o))) for o in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    (a0, a1), (b0, b1) = (map(float, o.read_text().split()) for o in outs)
    assert a1 <= b0 or b1 <= a0  # one section ran after the other


def test_exclusive_returns_and_raises_through(tmp_path):
    lock = tmp_path / "gpu.lock"
    assert L.exclusive(lambda x, y=1: x + y, lock)(2, y=3) == 5

    def boom() -> None:
        raise ValueError("inside")

    try:
        L.exclusive(boom, lock)()
    except ValueError as e:
        assert str(e) == "inside"
    assert L.exclusive(lambda: "again", lock)() == "again"  # the lock was released by the failure


def test_a_read_only_or_unopenable_lock_file_does_not_fail_the_measurement(tmp_path):
    lock = tmp_path / "gpu.lock"
    lock.touch()
    lock.chmod(0o444)  # another user's lock file on a shared host
    assert L.exclusive(lambda: "ran", lock)() == "ran"
    missing_dir = tmp_path / "gone" / "gpu.lock"  # cannot be created: run unlocked
    assert L.exclusive(lambda: "ran", missing_dir)() == "ran"


def test_off_cuda_nothing_is_patched():
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    before = CachingAutotuner.benchmark_all_configs
    with L.serialized_gpu_benchmarks(torch.device("cpu")):
        assert CachingAutotuner.benchmark_all_configs is before


def test_on_cuda_the_autotuner_is_wrapped_and_restored(monkeypatch, tmp_path):
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    before = CachingAutotuner.benchmark_all_configs
    monkeypatch.setattr(L, "lock_path", lambda device: tmp_path / "gpu.lock")
    with L.serialized_gpu_benchmarks(torch.device("cuda", 0)):
        wrapped = CachingAutotuner.benchmark_all_configs
        assert wrapped is not before and getattr(wrapped, L._MARK) and wrapped.__wrapped__ is before
        with L.serialized_gpu_benchmarks(torch.device("cuda", 0)):  # nested: wrapped once
            assert CachingAutotuner.benchmark_all_configs is wrapped
    assert CachingAutotuner.benchmark_all_configs is before
