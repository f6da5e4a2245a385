"""`build --jobs N`: bucket packages compiled in spawned worker processes make the same artifact as a serial
build (package signatures, weights, golden), and a failing worker names its stage/bucket."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ttsaot.builder.buckets import BucketPlan
from ttsaot.builder.build import _preparation_order, build_family, compile_cost, compile_priority
from ttsaot.builder.export import CompileError
from ttsaot.builder.families.qwen3_tts_12hz import FAMILY as QWEN
from ttsaot.builder.parallel_compile import CompilePool, CompileTask, compile_in_workers, default_jobs

from .test_build_atomic import _specs


def _two_buckets():
    # one static package per bucket (`off`), so that --jobs 2 has two compiles to spread over its workers
    return [replace(_specs()[0], plan=BucketPlan({"batch": (1,), "frames": (8, 16)}), dynamic_packages="off")]


def _package_metadata(path: Path) -> dict:
    from torch._C._aoti import AOTIModelPackageLoader

    return dict(AOTIModelPackageLoader.load_metadata_from_package(str(path), "model"))


@pytest.mark.heavy
def test_jobs_2_builds_the_same_artifact_as_jobs_1(tmp_path):
    serial = build_family(QWEN.name, _two_buckets(), tmp_path / "serial", "cpu", jobs=1).path
    parallel = build_family(QWEN.name, _two_buckets(), tmp_path / "parallel", "cpu", jobs=2).path
    for rel in ("code2wav.safetensors", "golden/code2wav.safetensors"):
        assert (serial / rel).read_bytes() == (parallel / rel).read_bytes(), rel
    m1, m2 = (json.loads((p / "manifest.json").read_text())["stages"]["code2wav"] for p in (serial, parallel))
    assert [b["key"] for b in m2["buckets"]] == ["b1_f8", "b1_f16"]
    drop = ("sha256", "bytes", "created")
    assert {k: v for k, v in m1.items() if k != "buckets"} == {k: v for k, v in m2.items() if k != "buckets"}
    assert [{k: v for k, v in b.items() if k not in drop} for b in m1["buckets"]] == [
        {k: v for k, v in b.items() if k not in drop} for b in m2["buckets"]
    ]
    for b in m1["buckets"]:
        meta1, meta2 = _package_metadata(serial / b["file"]), _package_metadata(parallel / b["file"])
        keys = [k for k in meta1 if k.startswith("ttsaot_")]
        assert keys and {k: meta1[k] for k in keys} == {k: meta2[k] for k in keys}
    assert not [p for p in (tmp_path / "parallel").iterdir() if p.name.startswith(".")]


def test_a_failing_worker_names_its_bucket(tmp_path):
    task = CompileTask(
        "code2wav/b1_f8",
        tmp_path / "missing.pt2",
        (torch.zeros(1),),
        torch.device("cpu"),
        tmp_path / "out.pt2",
        "m",
        {},
        None,
    )
    done = []
    with pytest.raises(CompileError, match="code2wav/b1_f8: compile worker failed: FileNotFoundError"):
        compile_in_workers([task], 2, lambda t, w: done.append(t.label))
    assert done == [] and not (tmp_path / "out.pt2").exists()


def test_a_failure_stops_the_compiles_still_running(tmp_path):
    """The running compiles are terminated, not awaited: here one worker blocks for ever (its program is a FIFO
    nobody writes) while the other fails; compile_in_workers must still return promptly with the failure."""
    import os
    import threading

    fifo = tmp_path / "never.pt2"
    os.mkfifo(fifo)

    def task(label: str, program: Path) -> CompileTask:
        return CompileTask(
            label, program, (torch.zeros(1),), torch.device("cpu"), tmp_path / f"{label}.pt2", "m", {}, None
        )

    raised: list[BaseException] = []

    def run() -> None:
        try:
            compile_in_workers([task("blocked", fifo), task("failing", tmp_path / "missing.pt2")], 2, lambda t, w: None)
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion below
            raised.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(120)
    try:
        assert not t.is_alive(), "compile_in_workers waited on a running compile after a failure"
        assert len(raised) == 1 and isinstance(raised[0], CompileError) and "failing" in str(raised[0])
    finally:
        if t.is_alive():  # unblock the worker so the test process can exit
            with open(fifo, "wb"):
                pass


class _Chain(torch.nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def test_the_largest_compiles_start_first():
    """compile_cost ranks by operator calls, then input elements; compile_priority keeps that order, and the pool
    starts the waiting task of the highest priority first, ties in submission order."""

    def cost(depth: int, rows: int) -> tuple[int, int]:
        x = torch.randn(rows, 4)
        return compile_cost(torch.export.export(_Chain(depth), (x,)), (x,))

    small, deep, wide = cost(1, 2), cost(3, 2), cost(1, 8)
    assert deep[0] > small[0] and wide == (small[0], 32) and small[1] == 8
    pool = CompilePool(1)  # never entered: no workers, only its queue
    for name, c in [("a", small), ("b", wide), ("c", deep), ("d", small)]:
        pool.submit(
            CompileTask(name, Path(name), (), torch.device("cpu"), Path(name), name, {}, None),
            None,
            priority=compile_priority(c),
        )
    assert [pool._next()[0].label for _ in range(4)] == ["c", "b", "a", "d"]
    big = compile_priority((10**6, 0))
    assert big > compile_priority((10**6 - 1, 10**9)) and compile_priority((5, 3)) > compile_priority((5, 2))


def test_default_jobs_is_bounded_by_cores_and_memory():
    import os

    assert 1 <= default_jobs() <= len(os.sched_getaffinity(0))


def test_each_worker_gets_its_share_of_the_cores_unless_the_user_set_one(monkeypatch):
    """Inductor's own default is a pool as large as the host per process: N compiles side by side would start N
    such pools. A worker's pool is cores // workers (at least 1); TORCHINDUCTOR_COMPILE_THREADS wins."""
    from torch._inductor import config

    from ttsaot.builder import parallel_compile as pc

    monkeypatch.setattr(config, "compile_threads", config.compile_threads)
    monkeypatch.delenv(pc.COMPILE_THREADS_ENV, raising=False)
    pc._share_cores(3)
    assert config.compile_threads == 3
    monkeypatch.setenv(pc.COMPILE_THREADS_ENV, "7")
    pc._share_cores(2)
    assert config.compile_threads == 3  # the user's setting, which Inductor read itself, stays


def test_cpu_builds_pool_every_stage():
    from ttsaot.builder.build import _pooled_device_bytes

    assert _pooled_device_bytes(torch.device("cpu")) == float("inf")


@pytest.mark.heavy
def test_stages_pool_their_compiles_within_the_device_budget(monkeypatch, tmp_path):
    """With --jobs > 1 the stages' packages compile side by side, but a CUDA build drains the pool before the
    prepared stages' modules would exceed their share of the GPU (`_pooled_device_bytes`); here a budget of one
    byte makes every stage compile alone, in spec order, and the artifact holds both."""
    import ttsaot.builder.build as build

    events: list[tuple[str, str]] = []
    real_submit, real_wait = build._submit_compiles, build._wait

    def submit(st, pool):
        events.append(("submit", st.spec.name))
        return real_submit(st, pool)

    def wait(pool, block=True, any_=False):
        if block:
            events.append(("wait", ""))
        return real_wait(pool, block, any_)

    monkeypatch.setattr(build, "_submit_compiles", submit)
    monkeypatch.setattr(build, "_wait", wait)
    monkeypatch.setattr(build, "_pooled_device_bytes", lambda dev: 1)
    first = _specs()[0]
    specs = [first, replace(first, name="code2wav_again")]
    res = build_family(QWEN.name, specs, tmp_path / "out", "cpu", jobs=2)
    assert events == [("submit", "code2wav"), ("wait", ""), ("submit", "code2wav_again"), ("wait", "")]
    assert list(res.manifest.stages) == ["code2wav", "code2wav_again"]


class _Stop(Exception):
    pass


def test_a_stage_compiles_while_the_next_is_prepared(monkeypatch, tmp_path):
    """A stage's packages go to the workers as soon as it is prepared, before the next stage is exported (a 2-core
    CPU build otherwise idles its second core through every export); a build stopped then stops its running
    compiles and leaves nothing behind."""
    import ttsaot.builder.build as build

    events: list[tuple[str, str]] = []
    real_prepare, real_submit = build.prepare_stage, build._submit_compiles

    def prepare(spec, *a, **kw):
        events.append(("prepare", spec.name))
        if spec.name == "code2wav_again":
            raise _Stop
        return real_prepare(spec, *a, **kw)

    def submit(st, pool):
        events.append(("submit", st.spec.name))
        real_submit(st, pool)
        assert pool._outstanding == 1

    monkeypatch.setattr(build, "prepare_stage", prepare)
    monkeypatch.setattr(build, "_submit_compiles", submit)
    first = _specs()[0]
    with pytest.raises(_Stop):
        build_family(QWEN.name, [first, replace(first, name="code2wav_again")], tmp_path / "out", "cpu", jobs=2)
    assert events == [("prepare", "code2wav"), ("submit", "code2wav"), ("prepare", "code2wav_again")]
    assert not list((tmp_path / "out").iterdir())


def _record_build_order(monkeypatch, events: list[tuple[str, str]], stop_at_wait: bool = True):
    """Record when each stage is exported (prepare_stage returns), its compiles submitted and its golden cases run;
    the blocking wait for the pool raises _Stop (the compiles are not needed to see the order)."""
    import ttsaot.builder.build as build

    real_prepare, real_submit, real_golden, real_wait = (
        build.prepare_stage,
        build._submit_compiles,
        build._golden_cases,
        build._wait,
    )

    def prepare(spec, *a, **kw):
        out = real_prepare(spec, *a, **kw)
        events.append(("prepared", spec.name))
        return out

    def submit(st, pool):
        events.append(("submit", st.spec.name))
        return real_submit(st, pool)

    def golden(spec, *a, **kw):
        events.append(("golden", spec.name))
        return real_golden(spec, *a, **kw)

    def wait(pool, block=True, any_=False):
        if block and stop_at_wait:
            raise _Stop
        return real_wait(pool, block, any_)

    monkeypatch.setattr(build, "prepare_stage", prepare)
    monkeypatch.setattr(build, "_submit_compiles", submit)
    monkeypatch.setattr(build, "_golden_cases", golden)
    monkeypatch.setattr(build, "_wait", wait)


def _two_stages_until_the_wait(monkeypatch, tmp_path) -> tuple[list[tuple[str, str]], tuple[str, str]]:
    """A parallel build of two stages, stopped when it first waits for its pool: (its events, the stage names)."""
    events: list[tuple[str, str]] = []
    _record_build_order(monkeypatch, events)
    first = _specs()[0]
    with pytest.raises(_Stop):
        build_family(QWEN.name, [first, replace(first, name="code2wav_again")], tmp_path / "out", "cpu", jobs=2)
    return events, ("code2wav", "code2wav_again")


def test_golden_cases_wait_until_every_stage_is_compiling(monkeypatch, tmp_path):
    """A parallel build runs the stages' golden cases (fp32 eager on the host) after the last stage's packages went
    to the workers, not between the stages' exports: there they held back every later stage's compiles (the H100
    Fish build started its DAC encoder's compile ~250 s in, behind the encoder's golden cases)."""
    events, names = _two_stages_until_the_wait(monkeypatch, tmp_path)
    assert events == [e for n in names for e in (("prepared", n), ("submit", n))] + [("golden", n) for n in names]
    assert not list((tmp_path / "out").iterdir())


def test_golden_cases_run_at_once_when_the_host_cannot_keep_their_modules(monkeypatch, tmp_path):
    """Deferred cases keep the fp32 modules on the host: beyond DEFERRED_GOLDEN_SHARE of its memory they run while
    the stage is prepared, as in a serial build."""
    import ttsaot.builder.build as build

    monkeypatch.setattr(build, "DEFERRED_GOLDEN_SHARE", 0.0)
    events, names = _two_stages_until_the_wait(monkeypatch, tmp_path)
    assert events == [e for n in names for e in (("golden", n), ("prepared", n), ("submit", n))]


def test_a_deferred_golden_case_that_fails_pass_parity_stops_the_build(monkeypatch, tmp_path):
    """The pass-parity check rides on the golden cases: deferred, it still stops the build (naming the stage),
    stops the compiles and leaves nothing behind."""
    import ttsaot.builder.build as build

    real = build.pass_parity_problem

    def parity(spec, *a, **kw):
        if spec.name == "code2wav_again":
            return "code2wav_again: passes changed output 'audio'"
        return real(spec, *a, **kw)

    monkeypatch.setattr(build, "pass_parity_problem", parity)
    events: list[tuple[str, str]] = []
    _record_build_order(monkeypatch, events, stop_at_wait=False)
    first = _specs()[0]
    with pytest.raises(build.BuildError, match="code2wav_again: passes changed"):
        build_family(QWEN.name, [first, replace(first, name="code2wav_again")], tmp_path / "out", "cpu", jobs=2)
    assert events[-1] == ("golden", "code2wav_again") and ("submit", "code2wav_again") in events
    assert not list((tmp_path / "out").iterdir())


@pytest.mark.heavy
def test_deferred_golden_cases_equal_a_serial_builds(tmp_path):
    first = _specs()[0]
    specs = [first, replace(first, name="code2wav_again")]
    serial = build_family(QWEN.name, specs, tmp_path / "serial", "cpu", jobs=1).path
    parallel = build_family(QWEN.name, specs, tmp_path / "parallel", "cpu", jobs=2).path
    for name in ("code2wav", "code2wav_again"):
        rel = f"golden/{name}.safetensors"
        assert (serial / rel).read_bytes() == (parallel / rel).read_bytes(), rel


def test_a_compile_is_timed_when_its_worker_finishes_not_when_the_parent_looks():
    """The pool stamps a task's finish as its result arrives; the parent, busy with the deferred golden cases,
    may poll much later, and the build log's compile seconds come from the stamp (an H100 log showed every
    package "compiled" at the end of the golden cases)."""
    import time
    from concurrent.futures import Future

    pool = CompilePool(1)  # never entered: no workers, only its queues
    task = CompileTask("a/b1", Path("a"), (), torch.device("cpu"), Path("a"), "a", {}, None)
    seen: list = []
    pool.submit(task, lambda t, weights: seen.append((t.finished_at, time.time(), weights)))
    started, on_done = pool._next()
    pool._running += 1
    fut: Future = Future()
    fut.set_result({"w": torch.ones(1)})
    before = time.time()
    pool._done(started, on_done, fut)
    time.sleep(0.2)  # the parent looks later
    pool.poll()
    ((finished, noticed, weights),) = seen
    assert before <= finished <= noticed - 0.15 and list(weights) == ["w"]


def _stage_compile_stand_in(jobs: list, tmp_path, **more):
    """What `_submit_compiles` reads of a `_StageCompile`: stage "s" on the CPU, no package cache, `jobs` to do."""
    from types import SimpleNamespace

    from ttsaot.builder.saved_programs import StageTensors

    return SimpleNamespace(
        todo=lambda: list(jobs),
        cache=None,
        awaiting=[],
        handed=StageTensors(),
        spec=SimpleNamespace(name="s"),
        device=torch.device("cpu"),
        tmp=tmp_path,
        extra=None,
        **more,
    )


def test_a_stage_hands_its_largest_compiles_to_the_workers_first(tmp_path):
    """With workers free a task starts when it is submitted, so within a stage the saves and submissions go in
    compile_priority order (plan order for ties), not plan order, which handed a codec's largest windows, its
    costliest compiles, over last."""
    from types import SimpleNamespace

    from ttsaot.builder.build import _Job, _submit_compiles

    def job(key: str, depth: int, rows: int) -> _Job:
        x = torch.randn(rows, 4)
        j = _Job([key], [{"rows": rows}], f"s/{key}.pt2", (x,), f"s_{key}", {})
        j.ep = torch.export.export(_Chain(depth), (x,))
        return j

    jobs = [job("small", 1, 2), job("wide", 1, 8), job("deep", 3, 2), job("small_too", 1, 2)]
    submitted: list[tuple[str, bool]] = []
    pool = SimpleNamespace(
        programs=tmp_path,
        submit=lambda task, on_done, priority: submitted.append((task.label, task.program.is_file())),
        poll=lambda: None,
    )
    _submit_compiles(_stage_compile_stand_in(jobs, tmp_path), pool)
    assert submitted == [("s/deep", True), ("s/wide", True), ("s/small", True), ("s/small_too", True)]


def test_each_stage_is_finished_once_its_own_packages_are_in():
    """The pooled stages' files are written as each one's packages come in, not all after the last compile (the
    H200 VoxCPM2 build spent its last 37 s finishing 7 stages one after another)."""
    from types import SimpleNamespace

    from ttsaot.builder.build import _finish_as_compiled

    events: list[str] = []
    stages: dict = {}

    def stage(name: str, compiled: bool) -> SimpleNamespace:
        st = SimpleNamespace(entry=SimpleNamespace(name=name), compiled=compiled, compile=None)
        st.finish = lambda: events.append(f"finish {name}") or name
        return st

    slow, fast, ready = stage("slow", False), stage("fast", False), stage("ready", True)
    arriving = [fast, slow]

    def wait_any(timeout=None) -> None:  # CompilePool.wait_any's signature
        st = arriving.pop(0)
        st.compiled = True
        events.append(f"compiled {st.entry.name}")

    _finish_as_compiled([slow, fast, ready], SimpleNamespace(wait_any=wait_any), stages)
    assert events == ["finish ready", "compiled fast", "finish fast", "compiled slow", "finish slow"]
    assert stages == {"ready": "ready", "fast": "fast", "slow": "slow"}


def test_wait_any_refuses_an_idle_pool():
    pool = CompilePool(1)
    with pytest.raises(RuntimeError, match="no task"):
        pool.wait_any()


def test_a_build_prepares_its_first_stages_first_then_fewest_buckets_first_on_cuda():
    """Preparation exports one program per bucket, one stage after another: on CUDA the few-bucket stages' long
    compiles start first (the H200 Fish build's DAC encoder started 117 s in, behind the DAC decoder's 18 exports);
    a stage that goes first on the device before them all (the VoxCPM2 LocDiT's 256-s compile started 92 s in,
    third; the tiny Fish DAC encoder on CPU ended the build, prepared last). A CPU build keeps the family's order
    otherwise."""
    from types import SimpleNamespace

    def spec(name, n, first=()):
        return SimpleNamespace(name=name, plan=SimpleNamespace(buckets=lambda: list(range(n))), prepare_first_on=first)

    def names(specs, device):
        return [s.name for s in _preparation_order(specs, torch.device(device))]

    specs = [spec("fast_ar", 3), spec("dac_decoder", 18), spec("dac_encoder", 4), spec("other", 3)]
    assert names(specs, "cuda") == ["fast_ar", "other", "dac_encoder", "dac_decoder"]  # ties: the family's order
    assert _preparation_order(specs, torch.device("cpu")) == specs
    specs += [spec("unrolled", 3, first=("cuda",)), spec("encoder", 5, first=("cpu", "cuda"))]
    assert names(specs, "cuda")[:2] == ["unrolled", "encoder"]
    assert names(specs, "cpu") == ["encoder", "fast_ar", "dac_decoder", "dac_encoder", "other", "unrolled"]


def test_each_family_prepares_first_the_stage_that_ends_its_build():
    """The VoxCPM2 LocDiT on CUDA (its batch-1 package compiles longest), the Fish DAC encoder on both devices and
    the Qwen code predictor on CPU (their exports and compiles, started last, ended the tiny CPU builds)."""
    from ttsaot.builder.families import get_family

    vox = get_family("voxcpm2")
    specs = vox.specs(vox.options(preset="tiny"))
    assert [s.name for s in specs if s.prepare_first_on] == ["locdit"]
    assert _preparation_order(specs, torch.device("cuda", 0))[0].name == "locdit"
    assert _preparation_order(specs, torch.device("cpu")) == specs
    fish = get_family("fish-s2-pro")
    specs = fish.specs(fish.options(preset="tiny"))
    for device in ("cpu", "cuda"):
        assert _preparation_order(specs, torch.device(device))[0].name == "dac_encoder"
    qwen = get_family("qwen3-tts-12hz")
    specs = qwen.specs(qwen.options(preset="tiny"))
    assert [s.name for s in specs] == ["code2wav", "code_predictor"]
    for device in ("cpu", "cuda"):  # on CUDA by its fewer buckets
        assert _preparation_order(specs, torch.device(device))[0].name == "code_predictor"


def test_a_stage_exports_each_package_and_hands_it_over_at_once(tmp_path):
    """Static programs not yet exported are exported one by one, largest bucket first, each submitted before the
    next export (workers start while the stage's other buckets export: the H200 Fish DAC decoder's 18 exports took
    33 s before its first compile was handed over); the tensors every program shares are written once, and a later
    program's archive leaves them out."""
    from types import SimpleNamespace

    from ttsaot.builder.build import _Job, _submit_compiles

    net = torch.nn.Sequential(torch.nn.Linear(4, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4)).eval()
    events: list[str] = []

    def job(key: str, rows: int) -> _Job:
        return _Job([key], [{"rows": rows}], f"s/{key}.pt2", (torch.randn(rows, 4),), f"s_{key}", {})

    def export_static(j: _Job) -> None:
        events.append(f"export {j.keys[0]}")
        j.ep = torch.export.export(net, j.args)

    def submit(task, on_done, priority):
        events.append(f"submit {task.label.split('/')[1]}")
        assert task.program.is_file() and task.tensors.is_file()
        sizes.append(task.program.stat().st_size)

    sizes: list[int] = []
    jobs = [job("b2", 2), job("b8", 8), job("b4", 4)]
    notes: list[str] = []
    pool = SimpleNamespace(programs=tmp_path, submit=submit, poll=lambda: events.append("poll"))
    st = _stage_compile_stand_in(
        jobs, tmp_path, export_static=export_static, reporter=SimpleNamespace(note=notes.append)
    )
    _submit_compiles(st, pool)
    order = ["b8", "b4", "b2"]
    assert events == [e for k in order for e in (f"export {k}", f"submit {k}", "poll")]
    assert len(list(tmp_path.glob("*tensors.pt"))) == 1
    weights = 4 * sum(p.numel() for p in net.parameters())
    assert max(sizes) < weights  # no archive carries the shared parameters
    assert notes and notes[0].startswith("s: 3 program(s) exported while compiling")
