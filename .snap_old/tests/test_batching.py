"""Cross-request batching (runtime/batching.py) on tiny CPU artifacts: every caller gets exactly its rows (equal to
a direct call of the same batch, within the stage tolerance of its own call), per-request sampling, streams with
their own context, overload, cancellation and bad requests. Timing is the bench's business, not asserted here."""

from __future__ import annotations

import asyncio
import gc
import threading
import types
from concurrent.futures import CancelledError, ThreadPoolExecutor

import pytest
import torch

from ttsaot.runtime import InputDTypeError, InputRangeError, InputShapeError, InputValueError, load
from ttsaot.runtime.batching import Batcher, BatcherConfig, ContextWindow, OverloadedError

from . import test_code_predictor as _cp
from .conftest import rel_err

code_predictor_fp32 = _cp.code_predictor_fp32  # the session artifact of tests/test_code_predictor.py
T = 30  # seconds: every wait in these tests is bounded


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: the worker and the test thread each drive their own OpenMP team, and on a loaded
    2-core machine their spin-waits starve each other (10-20x slower calls; OMP_WAIT_POLICY=PASSIVE has the same
    cure). Results do not depend on it."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class Gate:
    """Holds the worker inside the metrics hook after a primer batch, so the requests submitted meanwhile are all
    queued when it resumes: batches then form deterministically (FIFO, up to the largest batch bucket)."""

    def __init__(self, batcher: Batcher) -> None:
        self.entered, self.opened = threading.Event(), threading.Event()
        self.records = []
        batcher.observers.append(self)

    def __call__(self, record) -> None:
        self.records.append(record)
        if not self.opened.is_set():
            self.entered.set()
            assert self.opened.wait(T)

    def hold(self, batcher: Batcher, primer) -> None:
        batcher.submit(primer)
        assert self.entered.wait(T)

    def open(self) -> None:
        self.opened.set()


@pytest.fixture(scope="module")
def code2wav(qwen_tiny_fp32):
    return load(qwen_tiny_fp32)["code2wav"]


def _codes(stage, frames: int, seed: int, batch: int = 1) -> torch.Tensor:
    spec = stage.entry.inputs[0]
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, spec.range["high"][0], (batch, spec.shape[1], frames), generator=g)


def _pad(codes: torch.Tensor, frames: int, value: int) -> torch.Tensor:
    out = torch.full((*codes.shape[:-1], frames), value, dtype=codes.dtype)
    out[..., : codes.shape[-1]] = codes
    return out


def test_threads_mixed_lengths_get_exactly_their_rows(code2wav):
    """Pairs of requests of different lengths share one call (bucket batch 2); each caller's wave equals its rows
    of a direct call of the same right-padded pair, trimmed to its own frames, and its own call within tolerance."""
    lengths = [5, 12, 16, 3, 40, 48, 9, 9]
    reqs = [_codes(code2wav, n, seed=i) for i, n in enumerate(lengths)]
    spf, pad = code2wav.samples_per_frame, code2wav.entry.inputs[0].pad or 0
    with Batcher(code2wav, BatcherConfig(max_wait_s=0.0)) as b:
        gate = Gate(b)
        gate.hold(b, reqs[0])
        with ThreadPoolExecutor(len(reqs)) as pool:
            futs = []
            for r in reqs:  # submitted in order from one thread, run from many: FIFO pairs
                futs.append(b.submit(r))
            gate.open()
            outs = list(pool.map(lambda f: f.result(T), futs))
    assert [rec.rows for rec in gate.records[1:]] == [2, 2, 2, 2]  # read after close: the worker has finished
    for i in range(0, len(reqs), 2):
        a, c = reqs[i], reqs[i + 1]
        n = max(a.shape[-1], c.shape[-1])
        direct = code2wav(torch.cat([_pad(a, n, pad), _pad(c, n, pad)]))
        for j, r in ((0, a), (1, c)):
            got = outs[i + j]
            assert got.shape == (1, 1, r.shape[-1] * spf)
            assert torch.equal(got, direct[j : j + 1, :, : r.shape[-1] * spf])
            assert rel_err(got, code2wav(r)) <= code2wav.entry.tolerance


def test_threads_without_gate_match_their_own_calls(code2wav):
    """Free-running threads (whatever batches form): every caller gets its own wave, within tolerance."""
    reqs = [_codes(code2wav, 4 + 5 * i, seed=100 + i) for i in range(9)]
    alone = [code2wav(r) for r in reqs]
    with Batcher(code2wav) as b, ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda r: b(r), reqs * 2))
    assert sum(k * n for k, n in b.stats.rows_histogram.items()) == len(reqs) * 2 == b.stats.requests
    for got, want in zip(outs, alone * 2):
        assert got.shape == want.shape and rel_err(got, want) <= code2wav.entry.tolerance


def test_asyncio_callers_share_calls(code2wav):
    reqs = [_codes(code2wav, n, seed=200 + n) for n in (7, 16, 20, 33, 48, 1)]
    spf, pad = code2wav.samples_per_frame, code2wav.entry.inputs[0].pad or 0

    async def main(b: Batcher):
        return await asyncio.gather(*(b.acall(r) for r in reqs))

    with Batcher(code2wav) as b:
        gate = Gate(b)
        gate.hold(b, reqs[0])
        threading.Timer(0.2, gate.open).start()  # the coroutines queue while the worker is held
        outs = asyncio.run(asyncio.wait_for(main(b), T))
    assert [rec.rows for rec in gate.records[1:]] == [2, 2, 2]
    for i in range(0, len(reqs), 2):
        n = max(reqs[i].shape[-1], reqs[i + 1].shape[-1])
        direct = code2wav(torch.cat([_pad(reqs[i], n, pad), _pad(reqs[i + 1], n, pad)]))
        for j in (0, 1):
            f = reqs[i + j].shape[-1]
            assert torch.equal(outs[i + j], direct[j : j + 1, :, : f * spf])


def test_streams_keep_their_own_context(code2wav):
    """Streams starting and ending at different times, chunks of different streams sharing calls: each stream's
    audio equals the stage's own stream() of it, and the one-shot decode (context ≥ receptive field)."""
    lengths = [48, 20, 64, 33, 5]
    utts = [_codes(code2wav, n, seed=300 + i) for i, n in enumerate(lengths)]
    chunk = code2wav.metadata["streaming"]["chunk_frames"]
    tol = code2wav.entry.tolerance
    b = Batcher(code2wav, BatcherConfig(max_wait_s=0.005))

    def run(i: int):
        if i % 2:
            threading.Event().wait(0.01 * i)  # staggered starts
        with b.open_stream() as s:
            return torch.cat([s.push(c, timeout=T) for c in utts[i].split(chunk - i % 3, dim=-1)], dim=-1)

    with b, ThreadPoolExecutor(len(utts)) as pool:
        outs = list(pool.map(run, range(len(utts))))
        assert b.open_streams == 0
    assert max(b.stats.rows_histogram) == 2  # chunks of different streams did share calls
    for i, got in enumerate(outs):
        ref = torch.cat(list(code2wav.stream(utts[i].split(chunk - i % 3, dim=-1))), dim=-1)
        assert got.shape == ref.shape == (1, 1, lengths[i] * code2wav.samples_per_frame)
        assert rel_err(got, ref) <= tol and rel_err(got, code2wav(utts[i])) <= tol


def test_async_streams(code2wav):
    utts = [_codes(code2wav, n, seed=400 + n) for n in (30, 45)]

    async def one(b: Batcher, codes: torch.Tensor) -> torch.Tensor:
        async with b.open_stream() as s:
            return torch.cat([await s.apush(c) for c in codes.split(16, dim=-1)], dim=-1)

    async def main(b: Batcher):
        return await asyncio.gather(*(one(b, u) for u in utts))

    with Batcher(code2wav) as b:
        outs = asyncio.run(asyncio.wait_for(main(b), T))
        assert b.open_streams == 0
    for u, got in zip(utts, outs):
        assert rel_err(got, code2wav(u)) <= code2wav.entry.tolerance


def test_context_window_is_the_stage_stream_windowing(code2wav):
    """ContextWindow reproduces CodecDecoderStage.stream's windows exactly (same context, same cut)."""
    codes = _codes(code2wav, 70, seed=5)
    w = ContextWindow(32, code2wav.max_sizes["frames"])
    spf = code2wav.samples_per_frame
    pieces = []
    for c in codes.split(16, dim=-1):
        window, used = w.next(c)
        pieces.append(code2wav(window)[..., used * spf :])
    assert torch.equal(torch.cat(pieces, -1), torch.cat(list(code2wav.stream(codes.split(16, dim=-1))), -1))
    with pytest.raises(InputShapeError, match="largest bucket"):
        ContextWindow(32, 48).next(_codes(code2wav, 49, seed=1))
    with pytest.raises(InputShapeError, match=r"\[B, K, frames\]"):
        w.next(codes[0])


def test_bad_requests_get_their_own_typed_errors(code2wav):
    """A bad request in a batch gets its own typed error; the others in that batch still get their results."""
    good = [_codes(code2wav, n, seed=500 + n) for n in (10, 14, 16)]
    bad_range = good[0].clone()
    bad_range[0, 3, 2] = code2wav.entry.inputs[0].range["high"][3] + 7
    bad = {
        "range": (bad_range, InputRangeError),
        "dtype": (good[1].to(torch.int32), InputDTypeError),
        "rank": (good[1][0], InputShapeError),
        "empty": (good[1][..., :0], InputValueError),
        "type": ([1, 2, 3], InputDTypeError),
        "two": ((good[0], good[1]), InputShapeError),
    }
    with Batcher(code2wav) as b:
        gate = Gate(b)
        gate.hold(b, good[0])
        futs = []
        for name, (x, _) in bad.items():
            futs.append(b.submit(*x) if name == "two" else b.submit(x))
            futs.append(b.submit(good[len(futs) % 3]))
        gate.open()
        for (name, (_, err)), i in zip(bad.items(), range(0, len(futs), 2)):
            with pytest.raises(err):
                futs[i].result(T)
            g = good[(i + 1) % 3]
            assert rel_err(futs[i + 1].result(T), code2wav(g)) <= code2wav.entry.tolerance, name
        assert rel_err(b(good[2]), code2wav(good[2])) <= code2wav.entry.tolerance  # still serving
    assert b.stats.isolated_batches >= 1 and b.stats.failed == len(bad)


def test_a_bad_chunk_ends_only_its_stream(code2wav):
    ok, broken = _codes(code2wav, 32, seed=1), _codes(code2wav, 32, seed=2)
    broken[0, 0, 20] = -1
    with Batcher(code2wav) as b:
        s1, s2 = b.open_stream(), b.open_stream()
        a = [s1.push(ok[..., :16], T), s2.push(broken[..., :16], T)]
        with pytest.raises(InputRangeError):
            s2.push(broken[..., 16:], T)
        with pytest.raises(InputShapeError, match="closed"):
            s2.push(broken[..., :16], T)
        a.append(s1.push(ok[..., 16:], T))
        s1.close()
        assert b.open_streams == 0
    assert rel_err(torch.cat([a[0], a[2]], -1), code2wav(ok)) <= code2wav.entry.tolerance


def test_overload_is_a_typed_error_and_slots_free_up(code2wav):
    x = _codes(code2wav, 8, seed=0)
    with Batcher(code2wav, BatcherConfig(max_queue=3, max_streams=2)) as b:
        gate = Gate(b)
        gate.hold(b, x)
        futs = [b.submit(x) for _ in range(3)]
        with pytest.raises(OverloadedError, match="max_queue=3"):
            b.submit(x)
        assert b.stats.rejected == 1 and b.queue_depth == 3
        gate.open()
        assert all(rel_err(f.result(T), code2wav(x)) <= code2wav.entry.tolerance for f in futs)
        s1, s2 = b.open_stream(), b.open_stream()
        with pytest.raises(OverloadedError, match="stream slots"):
            b.open_stream()
        s1.close()
        s3 = b.open_stream()
        del s2  # abandoned without close: garbage collection frees the slot
        gc.collect()
        assert b.open_streams == 1
        s3.close()
        assert b.open_streams == 0
    with pytest.raises(OverloadedError, match="shut down"):
        b.submit(x)


def test_cancelled_requests_are_not_run(code2wav):
    x = [_codes(code2wav, 8, seed=i) for i in range(3)]
    with Batcher(code2wav) as b:
        gate = Gate(b)
        gate.hold(b, x[0])
        futs = [b.submit(c) for c in x]
        assert futs[1].cancel()
        assert b.queue_depth == 2 and b.stats.cancelled == 1
        gate.open()
        for i in (0, 2):
            assert rel_err(futs[i].result(T), code2wav(x[i])) <= code2wav.entry.tolerance
        with pytest.raises(CancelledError):
            futs[1].result(T)
    assert gate.records[1].requests == 2


def test_cancelled_async_stream_frees_its_slot(code2wav):
    x = _codes(code2wav, 16, seed=3)

    async def main(b: Batcher, gate: Gate):
        s = b.open_stream()
        task = asyncio.create_task(s.apush(x))
        await asyncio.sleep(0.05)
        assert b.queue_depth == 1 and b.open_streams == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert s.closed and b.open_streams == 0 and b.queue_depth == 0
        gate.open()
        return await b.acall(x)  # the batcher goes on serving

    with Batcher(code2wav) as b:
        gate = Gate(b)
        gate.hold(b, x)
        out = asyncio.run(asyncio.wait_for(main(b, gate), T))
    assert rel_err(out, code2wav(x)) <= code2wav.entry.tolerance


def test_failing_observer_does_not_stop_the_worker(code2wav):
    x = _codes(code2wav, 8, seed=4)

    def boom(record):
        raise RuntimeError("metrics backend down")

    with Batcher(code2wav, observer=boom) as b:
        assert torch.equal(b(x), b(x))


def test_lm_stages_are_refused():
    with pytest.raises(ValueError, match="KV caches"):
        Batcher(types.SimpleNamespace(kind="lm_step", name="base_lm_step"))


def test_config_is_checked():
    with pytest.raises(ValueError):
        BatcherConfig(max_queue=0)
    with pytest.raises(ValueError):
        BatcherConfig(max_wait_s=-1)


# --------------------------------------------------------------------------------------------- sampling
@pytest.fixture(scope="module")
def predictor(code_predictor_fp32):
    return load(code_predictor_fp32)["code_predictor"]


def _pred_inputs(stage, rows: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, stage.entry.inputs[0].shape[1], generator=g)
    code0 = torch.randint(0, stage.noise_shape[1], (rows,), generator=g)
    return hidden, code0


def test_sampled_codes_depend_only_on_the_request_generator(predictor):
    """Requests with their own generators batched together: codes equal the same rows of a direct generate() of
    the batch with the same noise, and equal each request's own generate() with the same seed; a request gives
    the same codes whichever partners share its batch."""
    reqs = [(*_pred_inputs(predictor, n, seed=i), 1000 + i, n) for i, n in enumerate((1, 2, 1, 3, 1))]
    params = dict(temperature=0.9, top_k=20, top_p=0.95)
    with Batcher(predictor) as b:
        futs = [b.submit_generate(h, c, generator=torch.Generator().manual_seed(s), **params) for h, c, s, _ in reqs]
        outs = [f.result(T) for f in futs]
    for (h, c, s, n), (codes, emb) in zip(reqs, outs):
        want_codes, want_emb = predictor.generate(h, c, generator=torch.Generator().manual_seed(s), **params)
        assert codes.shape == (n, predictor.entry.outputs[0].shape[1])
        assert torch.equal(codes, want_codes)
        assert rel_err(emb, want_emb) <= predictor.entry.tolerance
    # same request, different partners, deterministic batches (the worker held while they queue)
    h, c, s, _ = reqs[1]
    for partner in (reqs[0], reqs[2]):
        with Batcher(predictor) as b:
            gate = Gate(b)
            ph, pc, ps, _ = partner
            b.submit_generate(ph, pc, generator=torch.Generator().manual_seed(ps), **params)
            assert gate.entered.wait(T)
            f_partner = b.submit_generate(ph, pc, generator=torch.Generator().manual_seed(ps), **params)
            f = b.submit_generate(h, c, generator=torch.Generator().manual_seed(s), **params)
            gate.open()
            codes, _ = f.result(T)
            pcodes, _ = f_partner.result(T)
        assert gate.records[1].requests == 2
        noise = torch.cat(
            [
                predictor.draw_noise(ph.shape[0], torch.Generator().manual_seed(ps)),
                predictor.draw_noise(h.shape[0], torch.Generator().manual_seed(s)),
            ]
        )
        direct, _ = predictor.generate(torch.cat([ph, h]), torch.cat([pc, c]), noise=noise, **params)
        assert torch.equal(torch.cat([pcodes, codes]), direct)
        assert torch.equal(codes, outs[1][0])


def test_bad_sampling_parameters_fail_only_their_request(predictor):
    h, c = _pred_inputs(predictor, 2, seed=7)
    with Batcher(predictor) as b:
        gate = Gate(b)
        b.submit_generate(h, c, generator=torch.Generator().manual_seed(0))
        assert gate.entered.wait(T)
        bad = b.submit_generate(h, c, top_p=0.0, generator=torch.Generator().manual_seed(1))
        wrong_rows = b.submit_generate(h, c, temperature=[0.5, 0.6, 0.7], generator=torch.Generator().manual_seed(1))
        good = b.submit_generate(h, c, generator=torch.Generator().manual_seed(2))
        gate.open()
        with pytest.raises(InputValueError, match="top_p"):
            bad.result(T)
        with pytest.raises(InputValueError, match="one value per row"):
            wrong_rows.result(T)
        want, _ = predictor.generate(h, c, generator=torch.Generator().manual_seed(2))
        assert torch.equal(good.result(T)[0], want)
        with pytest.raises(InputValueError, match="generators"):
            b.submit_generate(h, c, generator=[torch.Generator()])  # raised in the caller, nothing queued


def test_a_refused_chunk_leaves_the_stream_usable(code2wav):
    """A chunk refused for overload was never queued: the stream continues as if it had not been sent."""
    codes = _codes(code2wav, 32, seed=8)
    with Batcher(code2wav, BatcherConfig(max_queue=1)) as b:
        gate = Gate(b)
        gate.hold(b, codes[..., :8])
        blocker = b.submit(codes[..., :8])  # fills the queue while the worker is held
        with b.open_stream() as s:
            with pytest.raises(OverloadedError):
                s.submit(codes[..., :16])
            gate.open()
            blocker.result(T)
            out = torch.cat([s.push(c, T) for c in codes.split(16, dim=-1)], dim=-1)
    assert rel_err(out, code2wav(codes)) <= code2wav.entry.tolerance
