"""The runtime's one execution core: graph primitive, input validator, output check, metric, dtype table, CPU
threads. Each contract has one definition, used by every stage kind, the builder and the bench."""

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ttsaot.runtime import BindingError, InputDTypeError, InputRangeError, InputShapeError, InputValueError, load
from ttsaot.runtime.artifact import TensorSpec
from ttsaot.runtime.dtypes import DTYPE_ALIASES, DTYPE_NAMES, canonical_dtype_name, dtype_name, torch_dtype
from ttsaot.runtime.graphs import StaticGraph
from ttsaot.runtime.metrics import rel_error
from ttsaot.runtime.threads import cpu_threads_mode
from ttsaot.runtime.validation import InputChecker, check_outputs, flag_ok

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ one definition
def _sources(*dirs: str):
    for d in dirs:
        for py in (ROOT / d).rglob("*.py"):
            if "results" not in py.parts:
                yield py, py.read_text()


@pytest.mark.parametrize(
    "pattern, home",
    [
        (r"torch\.cuda\.CUDAGraph\(|torch\.cuda\.graph\(", "runtime/graphs.py"),
        (r"graph_pool_handle\(", "runtime/graphs.py"),
        (r"\(o - r\)\.norm\(\)|\(a - b\)\.norm\(\)", "runtime/metrics.py"),
        (r"\"bf16\": ", "runtime/dtypes.py"),
    ],
)
def test_each_contract_has_one_definition(pattern, home):
    where = sorted(
        {str(py.relative_to(ROOT)) for py, text in _sources("runtime", "builder", "bench") if re.search(pattern, text)}
    )
    assert where == [home], where


# ------------------------------------------------------------------------------------------------ dtypes
def test_dtype_table_is_importable_without_torch():
    code = (
        "import sys, ttsaot.runtime.dtypes as d, ttsaot.runtime.errors; "
        "assert d.canonical_dtype_name('bf16') == 'bfloat16'; sys.exit('torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dtype_names_and_aliases():
    for name in DTYPE_NAMES:
        assert dtype_name(torch_dtype(name)) == name
    for alias, name in DTYPE_ALIASES.items():
        assert canonical_dtype_name(alias) == name and torch_dtype(alias) == getattr(torch, name)
    with pytest.raises(ValueError, match="unknown dtype 'f8'"):
        canonical_dtype_name("f8")
    with pytest.raises(ValueError, match="unsupported"):
        dtype_name(torch.float64)


# ------------------------------------------------------------------------------------------------ metric
def test_rel_error_is_double_precision_and_safe_on_zero_reference():
    ref = torch.tensor([1e8, 1.0], dtype=torch.float32)
    out = ref + torch.tensor([0.0, 1.0])
    assert rel_error(out, ref) == pytest.approx(1.0 / 1e8, rel=1e-6)  # float32 norms would lose the 1.0
    assert rel_error(torch.ones(3), torch.zeros(3)) == pytest.approx(3**0.5)
    assert rel_error(torch.zeros(3), torch.zeros(3)) == 0.0
    assert math.isnan(rel_error(torch.tensor([float("nan")]), torch.ones(1)))  # NaN never passes a bound


# ------------------------------------------------------------------------------------------------ graphs
def test_static_graph_without_capture_runs_on_its_buffers():
    calls = []

    def fn(xs):
        calls.append([x.data_ptr() for x in xs])
        return [xs[0] * 2 + xs[1]]

    a, b = torch.zeros(3), torch.ones(3)
    g = StaticGraph(fn, [a, b], capture=False, keep_alive="cache")
    assert not g.captured and calls == []  # no warm-up without capture
    out = g([torch.arange(3.0), b])  # copied into the static buffers, b not copied
    assert torch.equal(out[0], torch.tensor([1.0, 3.0, 5.0])) and torch.equal(a, torch.arange(3.0))
    assert calls == [[a.data_ptr(), b.data_ptr()]]
    a.fill_(1)
    assert torch.equal(g.replay()[0], torch.full((3,), 3.0))


@pytest.mark.gpu
def test_static_graph_capture_and_replay_on_cuda():
    dev = torch.device("cuda")
    x = torch.zeros(4, device=dev)
    g = StaticGraph(lambda xs: (xs[0] + 1).sin(), [x], dev, pool=torch.cuda.graph_pool_handle())
    assert g.captured
    y = torch.randn(4, device=dev)
    torch.testing.assert_close(g([y]).clone(), (y + 1).sin())


@pytest.mark.gpu
def test_warmup_calls_are_read_at_construction_and_timed(monkeypatch):
    """WARMUP_CALLS calls before the capture (the module constant as it is when the graph is made; the cold-start
    probe sets it), one call captured, none at replay; the warm-up and capture seconds recorded apart."""
    from ttsaot.runtime import graphs

    dev = torch.device("cuda")
    calls = []

    def fn(xs):
        calls.append(torch.cuda.is_current_stream_capturing())
        return xs[0] * 2

    for n in (1, 3):
        monkeypatch.setattr(graphs, "WARMUP_CALLS", n)
        calls.clear()
        g = StaticGraph(fn, [torch.ones(4, device=dev)], dev)
        assert calls == [False] * n + [True]
        assert g.warmup_s > 0 and g.capture_s > 0
        g.replay()
        assert len(calls) == n + 1 and float(g.outputs[0]) == 2.0


def test_only_the_first_capture_into_a_pool_reserves(monkeypatch):
    from ttsaot.runtime import graphs

    monkeypatch.setattr(graphs, "_CAPTURED_POOLS", set())
    assert graphs._claim_pool((0, 7)) and not graphs._claim_pool((0, 7))  # the pool's later (smaller) graphs
    assert graphs._claim_pool((0, 8))
    assert graphs._claim_pool(None) and graphs._claim_pool(None)  # a graph's own private pool: always first


@pytest.mark.gpu
def test_first_capture_reserves_one_segment_for_growing_activations():
    """A codec's activations grow layer by layer; without the pool reserve every new size got its own segment
    (code2wav's 325-frame graph: 1.1 GB for a 0.49 GB warm-up peak), with it the capture is carved out of one
    segment of the warm-up's peak (plus what best-fit placement cannot fit in it), and a second, smaller graph of
    the pool adds nothing."""
    from ttsaot.runtime.graphs import new_pool

    dev = torch.device("cuda")
    mib = 2**20 // 4  # floats per MiB
    sizes = [24 * mib, 40 * mib, 64 * mib, 100 * mib, 150 * mib]

    def grow(xs, sizes=sizes):
        t = xs[0].expand(sizes[0]).clone()
        for n in sizes[1:]:
            t = torch.nn.functional.pad(t, (0, n - t.numel()), value=1.0) * 2  # the old size is freed here
        return t.sum(dim=0, keepdim=True)

    def pool_reserved(pool):
        return sum(
            s["total_size"] for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", (0, 0))) == pool
        )

    x = torch.ones(1, device=dev)
    want = float(grow([x]))
    torch.cuda.synchronize()
    plain_pool = new_pool()
    plain = StaticGraph(grow, [x], dev, plain_pool, pool_reserve=False)
    assert plain.warmup_peak_bytes is None
    without = pool_reserved(plain_pool)
    del plain
    pool = new_pool()
    g = StaticGraph(grow, [x], dev, pool)
    # live at the peak: the previous size, the padded copy and its product
    assert g.warmup_peak_bytes is not None and g.warmup_peak_bytes >= (sizes[-2] + 2 * sizes[-1]) * 4
    reserved = pool_reserved(pool)
    assert reserved < 0.85 * without, (reserved, without, g.warmup_peak_bytes)
    assert reserved <= 1.5 * g.warmup_peak_bytes, (reserved, g.warmup_peak_bytes)
    assert float(g.replay()[0]) == want
    half = [s // 2 for s in sizes]
    small = StaticGraph(lambda xs: grow(xs, half), [torch.ones(1, device=dev)], dev, pool)
    assert small.warmup_peak_bytes is None  # not the pool's first capture
    assert pool_reserved(pool) == reserved
    assert float(g.replay()[0]) == want and float(small.replay()[0]) == float(grow([x], half))


# ------------------------------------------------------------------------------------------ validation
def _specs():
    return [
        TensorSpec("codes", "int64", ["batch", 2, "frames"], pad=0, range={"dim": 1, "low": 0, "high": [4, 8]}),
        TensorSpec("scale", "float32", ["batch"]),
    ]


@pytest.mark.parametrize(
    "named, sizes, err, match",
    [
        ({"codes": torch.zeros(1, 2, 3), "scale": torch.ones(1)}, None, InputDTypeError, "must be int64"),
        ({"codes": torch.zeros(1, 2, dtype=torch.long), "scale": torch.ones(1)}, None, InputShapeError, "3 dims"),
        (
            {"codes": torch.zeros(1, 3, 3, dtype=torch.long), "scale": torch.ones(1)},
            None,
            InputShapeError,
            r"must have shape \[batch, 2, frames\] \(dim 1 must be 2\)",
        ),
        (
            {"codes": torch.zeros(2, 2, 3, dtype=torch.long), "scale": torch.ones(1)},
            None,
            InputShapeError,
            "disagree on 'batch'",
        ),
        (
            {"codes": torch.zeros(1, 2, 3, dtype=torch.long), "scale": torch.ones(1)},
            {"batch": 2},
            InputShapeError,
            "with batch = 2",
        ),
        ({"codes": torch.zeros(1, 2, 0, dtype=torch.long), "scale": torch.ones(1)}, None, InputValueError, "empty"),
        (
            {"codes": torch.tensor([[[0], [8]]]), "scale": torch.ones(1)},
            None,
            InputRangeError,
            r"\[0, 1, 0\] = 8 is outside \[0, 8\) \(codebook 1\)",
        ),
        (
            {"codes": torch.zeros(1, 2, 3, dtype=torch.long), "scale": torch.tensor([float("inf")])},
            None,
            InputValueError,
            "NaN or Inf",
        ),
    ],
)
def test_input_checker_errors(named, sizes, err, match):
    with pytest.raises(err, match=match):
        InputChecker("s", torch.device("cpu")).check(_specs(), dict(named), sizes=sizes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_all_finite_is_isfinite_all(dtype):
    from ttsaot.runtime.validation import all_finite

    big = torch.finfo(dtype).max
    cases = [
        torch.randn(3, 4, 5, dtype=dtype)[:, ::2],  # non-contiguous
        torch.tensor([big, -big], dtype=dtype),  # the largest finite values
        torch.tensor([1.0, float("nan")], dtype=dtype),
        torch.tensor([float("inf"), 2.0], dtype=dtype),
        torch.tensor([-float("inf")], dtype=dtype),
        torch.empty(0, 3, dtype=dtype),
    ]
    chk, spec = InputChecker("s", torch.device("cpu")), TensorSpec("x", str(dtype).removeprefix("torch."), [])
    for x in cases:
        assert all_finite(x) == bool(torch.isfinite(x).all()), x
        if x.numel():  # the device checks' flag (an empty input is never checked)
            assert flag_ok("finite", chk.flag(spec, "finite", x).item()) == bool(torch.isfinite(x).all()), x
    assert all_finite(torch.arange(5)) and all_finite(torch.ones(2, dtype=torch.bool))  # codes and masks


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_input_checker_reads_device_checks_back_once():
    """Inputs already on the GPU: every range and NaN/Inf check is read back in one synchronising copy (before,
    each check synchronised on its own: five per predictor frame), and a failure still names the input and value."""
    import warnings

    dev = torch.device("cuda", torch.cuda.current_device())  # a stage's device carries its index
    chk = InputChecker("s", dev)
    named = {"codes": torch.tensor([[[0], [7]]], device=dev), "scale": torch.ones(1, device=dev)}
    chk.check(_specs(), dict(named))  # warm-up: the bounds tensors are built once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            chk.check(_specs(), dict(named))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len([w for w in caught if "synchroniz" in str(w.message)]) == 1, [str(w.message) for w in caught]
    bad_code = {"codes": torch.tensor([[[0], [8]]], device=dev), "scale": torch.ones(1, device=dev)}
    with pytest.raises(InputRangeError, match=r"\[0, 1, 0\] = 8 is outside \[0, 8\) \(codebook 1\)"):
        chk.check(_specs(), bad_code)
    bad_scale = {
        "codes": torch.zeros(1, 2, 1, dtype=torch.long, device=dev),
        "scale": torch.tensor([float("nan")], device=dev),
    }
    with pytest.raises(InputValueError, match="'scale' contains NaN or Inf"):
        chk.check(_specs(), bad_scale)


def test_input_checker_sizes_and_value_switch():
    chk = InputChecker("s", torch.device("cpu"))
    named = {"codes": torch.full((2, 2, 5), 9, dtype=torch.long), "scale": torch.ones(2)}
    assert chk.check(_specs(), named, values=False) == {"batch": 2, "frames": 5}  # structure only
    with pytest.raises(InputRangeError):
        chk.check(_specs(), named)


def test_device_value_checks_run_on_the_buffers_and_explain_from_the_callers_tensors():
    """The checks a CUDA-graph stage replays over its bucket's static buffers (here run without capture): a pass,
    then each failure raised with the same typed error and details as the eager checker's (index and value from
    the caller's tensor, not the padded buffer); pads that would fail their own checks are refused."""
    from ttsaot.runtime.validation import DeviceValueChecks

    specs = _specs()
    chk = InputChecker("s", torch.device("cpu"))
    bufs = [torch.zeros(2, 2, 6, dtype=torch.long), torch.zeros(2)]  # a bucket of batch 2, 6 frames
    checks = DeviceValueChecks(chk, specs, bufs, torch.device("cpu"), capture=False)
    assert [(i, what) for i, _, what in checks.items] == [(0, "range"), (1, "finite")]

    def call(codes, scale):
        bufs[0].zero_(), bufs[1].zero_()
        bufs[0][: codes.shape[0], :, : codes.shape[2]] = codes
        bufs[1][: scale.shape[0]] = scale
        checks.run({"codes": codes, "scale": scale})

    call(torch.tensor([[[3, 1], [7, 0]]]), torch.ones(1))
    assert bufs[0][0, :, :2].tolist() == [[3, 1], [7, 0]]  # values that pass are left as they are
    with pytest.raises(InputRangeError, match=r"\[0, 1, 1\] = 8 is outside \[0, 8\) \(codebook 1\)"):
        call(torch.tensor([[[3, 1], [7, 8]]]), torch.ones(1))
    # what failed is cleared in the buffer (a package launched before the verdict reads no code out of range)
    assert bufs[0][0, :, :2].tolist() == [[3, 1], [7, 0]]
    with pytest.raises(InputValueError, match="'scale' contains NaN or Inf"):
        call(torch.zeros(1, 2, 2, dtype=torch.long), torch.tensor([float("nan")]))
    assert bufs[1].tolist() == [0.0, 0.0]  # NaN → 0 (±Inf too)
    # launch, then whatever the caller launches, then the verdict: the same checks, split around a package
    bufs[1][0] = float("inf")
    flags = checks.launch()
    assert bufs[1].tolist() == [0.0, 0.0]
    scale = torch.tensor([float("inf"), 1.0])
    with pytest.raises(InputValueError, match="'scale' contains NaN or Inf"):
        checks.verdict(flags, {"codes": torch.zeros(2, 2, 6, dtype=torch.long), "scale": scale})
    assert scale[0] == float("inf")  # the caller's tensor is never cleared
    bufs[0][1, 0, 5] = -1
    with pytest.raises(InputRangeError, match=r"\[1, 0, 5\] = -1 is outside \[0, 4\)"):
        checks.run({"codes": bufs[0].clone(), "scale": torch.ones(2)})
    assert bufs[0][1, 0, 5] == 0
    assert DeviceValueChecks.capturable(specs, [0, None])
    assert not DeviceValueChecks.capturable(specs, [4, 0])  # codebook 0 holds 4 codes: pad 4 is out of range
    assert not DeviceValueChecks.capturable(specs, [0, float("inf")])
    none = DeviceValueChecks(chk, [TensorSpec("mask", "bool", ["batch"])], [torch.ones(2, dtype=torch.bool)], None)
    assert none.graph is None and none.run({}) is None  # nothing to check: no graph, no synchronisation
    assert none.launch() is None and none.verdict(None, {}) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_value_checks_around_a_package_graph_on_cuda():
    """The order every CUDA-graph stage now uses: the check graph, the package's graph (captured FIRST into the same
    pool, as the runners do), then the verdict. Both capture (the clearing ops included); the flags survive the
    package's replay (copied out before it); the host waits without a stream synchronisation; a bad code is refused
    after the package ran on the cleared buffer, which read nothing out of bounds (the context stays usable)."""
    import warnings

    from ttsaot.runtime.graphs import new_pool
    from ttsaot.runtime.validation import DeviceValueChecks

    dev = torch.device("cuda")
    specs, chk, pool = _specs(), InputChecker("s", dev), new_pool()
    bufs = [torch.zeros(2, 2, 6, dtype=torch.long, device=dev), torch.zeros(2, device=dev)]
    table = torch.randn(8, 64, device=dev)

    def package(b):  # an embedding gather (out of bounds on a bad code) and an intermediate the pool can reuse
        h = torch.relu(table[b[0]] * 3.0)
        return (h.sum(-1) * b[1][:, None, None]).contiguous()

    main = StaticGraph(package, bufs, dev, pool)
    checks = DeviceValueChecks(chk, specs, bufs, dev, pool)
    assert main.captured and checks.graph.captured

    def call(codes, scale):
        bufs[0].copy_(codes)
        bufs[1].copy_(scale)
        flags = checks.launch()
        out = main.replay().clone()
        checks.verdict(flags, {"codes": codes, "scale": scale})
        return out

    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 4, (2, 2, 6), generator=g).to(dev)
    scale = (torch.rand(2, generator=g) + 0.5).to(dev)
    torch.testing.assert_close(call(codes, scale), package([codes, scale]))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call(codes, scale)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert not [w for w in caught if "synchroniz" in str(w.message)], [str(w.message) for w in caught]
    bad = codes.clone()
    bad[1, 1, 4] = 10**6
    with pytest.raises(InputRangeError, match=r"'codes'\[1, 1, 4\] = 1000000 is outside \[0, 8\) \(codebook 1\)"):
        call(bad, scale)
    assert int(bufs[0][1, 1, 4]) == 0
    nan_scale = scale.clone()
    nan_scale[0] = float("nan")
    with pytest.raises(InputValueError, match="'scale' contains NaN or Inf"):
        call(codes, nan_scale)
    assert bool(main.outputs.isfinite().all())  # the package ran on the cleared scale
    torch.testing.assert_close(call(codes, scale), package([codes, scale]))  # the context is fine
    torch.cuda.synchronize()


def test_checks_of_device_inputs_can_be_deferred_host_inputs_never_are():
    chk = InputChecker("s", torch.device("cpu"))
    bad = {"codes": torch.full((1, 2, 3), 9, dtype=torch.long), "scale": torch.ones(1)}
    with pytest.raises(InputRangeError):  # host inputs: checked before their copy, deferred or not
        chk.check_deferring(_specs(), dict(bad), defer=True)
    good = {"codes": torch.zeros(1, 2, 3, dtype=torch.long), "scale": torch.ones(1)}
    assert chk.check_deferring(_specs(), dict(good), defer=True) == ({"batch": 1, "frames": 3}, False)
    chk.check_values(_specs(), dict(good))
    with pytest.raises(InputRangeError, match=r"\[0, 0, 0\] = 9"):
        chk.check_values(_specs(), dict(bad))


def test_output_check_uses_derived_axes():
    spec = [TensorSpec("codes", "int64", [1, 4, "frames"])]
    check_outputs("enc", "s4096", spec, {"samples": 4096, "frames": 2}, [torch.zeros(1, 4, 2, dtype=torch.long)])
    with pytest.raises(BindingError, match="enc/s4096: package outputs"):
        check_outputs("enc", "s4096", spec, {"samples": 4096, "frames": 3}, [torch.zeros(1, 4, 2, dtype=torch.long)])


# ------------------------------------------------------------------------------------------- CPU threads
def test_cpu_threads_mode_sets_and_restores():
    before = torch.get_num_threads()
    with cpu_threads_mode(1):
        assert torch.get_num_threads() == 1
        with cpu_threads_mode(2):
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with cpu_threads_mode(None):
        assert torch.get_num_threads() == before
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="cpu_threads"):
            cpu_threads_mode(bad)


@pytest.mark.parametrize("threads", [1, 2, None])
def test_every_package_call_runs_with_the_stage_threads(qwen_tiny_fp32, threads):
    stage = load(qwen_tiny_fp32, cpu_threads=threads)["code2wav"]
    seen = []
    for runner in stage._runners.values():
        run = runner.run_fn
        runner.run_fn = lambda xs, run=run: (seen.append(torch.get_num_threads()), run(xs))[1]
    outside = torch.get_num_threads()
    ref = stage(torch.randint(0, 64, (1, 16, 8)))
    assert seen == [threads or outside] and torch.get_num_threads() == outside and ref.shape == (1, 1, 512)


def test_bad_cpu_threads_is_refused_before_loading(tmp_path):
    with pytest.raises(ValueError, match="cpu_threads"):
        load(tmp_path, cpu_threads=0)


def test_weight_bytes_counts_the_stage_weights_file(qwen_tiny_fp32):
    from safetensors.torch import load_file

    stage = load(qwen_tiny_fp32)["code2wav"]
    stored = load_file(str(qwen_tiny_fp32 / stage.entry.weights.file))
    assert stage.weight_bytes == sum(t.numel() * t.element_size() for t in stored.values()) > 0
