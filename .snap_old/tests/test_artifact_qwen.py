"""The built tiny code2wav artifact through the runtime: every bucket vs eager, padding, splitting, chunking,
streaming, golden verify, typed input errors, threads."""

import dataclasses
import json
import threading

import pytest
import torch

from ttsaot.builder.families.qwen3_tts_12hz import checkpoint as qck
from ttsaot.builder.families.qwen3_tts_12hz import code2wav as qm
from ttsaot.builder.families.qwen3_tts_12hz import config as qcfg
from ttsaot.runtime import (
    InputDTypeError,
    InputRangeError,
    InputShapeError,
    InputValueError,
    load,
)
from ttsaot.runtime.artifact import parse_manifest, read_manifest
from ttsaot.runtime.verify import verify_bundle

from .conftest import rel_err

CFG = qcfg.CODE2WAV_PRESETS["tiny"]
SPF = CFG.samples_per_frame


@pytest.fixture(scope="module")
def bundle(qwen_tiny_fp32):
    return load(qwen_tiny_fp32)


@pytest.fixture(scope="module")
def eager():
    return qck.init_random_code2wav(qm.Code2Wav(CFG), seed=0)  # the same weights the artifact was built from (seed 0)


def _codes(B, F, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CFG.codebook_size, (B, CFG.num_quantizers, F), generator=g)


def test_every_bucket_matches_eager(bundle, eager):
    stage = bundle["code2wav"]
    assert len(stage.buckets) == 6
    for i, sizes in enumerate(stage.buckets):
        x = _codes(sizes["batch"], sizes["frames"], seed=i)
        out = stage(x)
        assert out.shape == (sizes["batch"], 1, sizes["frames"] * SPF)
        assert rel_err(out, eager(x)) < 1e-4, sizes


def test_padding_picks_smallest_bucket_and_trims(bundle, eager):
    stage = bundle["code2wav"]
    assert stage.pick_bucket({"batch": 1, "frames": 9}).key == "b1_f16"
    assert stage.pick_bucket({"batch": 2, "frames": 3}).key == "b2_f8"
    x = _codes(1, 11, seed=5)
    out = stage(x)
    assert out.shape == (1, 1, 11 * SPF)
    assert rel_err(out, eager(x)) < 1e-4


def test_batch_above_largest_bucket_is_split(bundle, eager):
    x = _codes(5, 8, seed=6)
    out = bundle["code2wav"](x)
    assert out.shape == (5, 1, 8 * SPF)
    assert rel_err(out, eager(x)) < 1e-4


def test_batch_without_a_covering_bucket_runs_in_smaller_batches(qwen_tiny_fp32, eager):
    # a plan capped by max_batch_frames has b1 at every window but no b2 at the longest: 2 rows × 40 frames go
    # through b1_f48 twice (the stage's largest batch, 2, and largest frames, 48, are still buckets)
    stage = load(qwen_tiny_fp32)["code2wav"]
    stage.entry = dataclasses.replace(stage.entry, buckets=[b for b in stage.entry.buckets if b.key != "b2_f48"])
    assert stage.pick_bucket({"batch": 2, "frames": 40}) is None
    x = _codes(2, 40, seed=9)
    out = stage(x)
    assert out.shape == (2, 1, 40 * SPF)
    assert rel_err(out, eager(x)) < 1e-4
    assert stage(x[:, :, :16]).shape == (2, 1, 16 * SPF)  # b2_f16 still covers the short window in one call


def test_frames_above_largest_bucket_are_chunked_not_rejected(bundle, eager):
    # 100 frames > the 48-frame bucket: decoded in chunks with 32 frames of context (≥ the 28-frame receptive field)
    x = _codes(1, 100, seed=7)
    out = bundle["code2wav"](x)
    assert out.shape == (1, 1, 100 * SPF)
    assert rel_err(out, eager(x)) < 1e-4


def test_streaming_equals_one_shot(bundle):
    stage = bundle["code2wav"]
    x = _codes(2, 45, seed=8)
    one_shot = stage(x)
    pieces = list(stage.stream(x.split(16, dim=-1)))
    assert [p.shape[-1] for p in pieces] == [16 * SPF, 16 * SPF, 13 * SPF]
    assert rel_err(torch.cat(pieces, -1), one_shot) < 1e-4


def test_streaming_with_short_context_is_an_approximation(bundle):
    # Context shorter than the receptive field: output differs (documented), but each piece is well-formed.
    stage = bundle["code2wav"]
    x = _codes(1, 40, seed=9)
    streamed = torch.cat(list(stage.stream(x.split(8, dim=-1), left_context_frames=2)), -1)
    assert streamed.shape == stage(x).shape
    assert rel_err(streamed, stage(x)) > 1e-3


def test_golden_verify_passes(bundle):
    results = verify_bundle(bundle)
    assert results and all(r.ok for r in results)
    assert {r.case for r in results} >= {"b1_f8", "b1_f16", "b1_f48", "b2_f8"}


def test_typed_input_errors_and_stage_stays_usable(bundle, eager):
    stage = bundle["code2wav"]
    good = _codes(1, 8)
    with pytest.raises(InputDTypeError, match="int64"):
        stage(good.int())
    with pytest.raises(InputShapeError, match="3 dims"):
        stage(good[0])
    with pytest.raises(InputShapeError, match="dim 1 must be 16"):
        stage(good[:, :8])
    bad = good.clone()
    bad[0, 5, 3] = CFG.codebook_size
    with pytest.raises(InputRangeError, match=r"\[0, 5, 3\]"):
        stage(bad)
    bad[0, 5, 3] = -1
    with pytest.raises(InputRangeError):
        stage(bad)
    with pytest.raises(InputValueError, match="empty"):
        stage(good[..., :0])
    with pytest.raises(InputShapeError, match="unknown input"):
        stage(wrong=good)
    with pytest.raises(InputDTypeError):
        stage([1, 2, 3])
    assert rel_err(stage(good), eager(good)) < 1e-4  # no poisoned state


def test_numpy_input_accepted(bundle):
    x = _codes(1, 8)
    torch.testing.assert_close(bundle["code2wav"](x.numpy()), bundle["code2wav"](x))


def test_concurrent_calls_each_get_their_own_result(bundle):
    stage = bundle["code2wav"]
    inputs = [_codes(1 + i % 2, 5 + 3 * i, seed=100 + i) for i in range(6)]
    expected = [stage(x) for x in inputs]
    errors, results = [], {}

    def worker(t):
        try:
            for rep in range(3):
                for i in range(len(inputs)):
                    j = (i + t) % len(inputs)
                    results[(t, rep, j)] = stage(inputs[j])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert len(results) == 4 * 3 * len(inputs)
    for (_, _, j), out in results.items():
        assert torch.equal(out, expected[j])


def test_manifest_roundtrip_and_contents(qwen_tiny_fp32):
    m = read_manifest(qwen_tiny_fp32)
    again = parse_manifest(json.loads(m.to_json()))
    assert again == m
    st = m.stages["code2wav"]
    assert m.format_version == 1 and m.family == "qwen3-tts-12hz" and m.device == "cpu"
    assert m.build_env["torch"] == torch.__version__ and m.build_env["cxx"]
    assert st.kind == "codec_decoder" and st.dtype == "float32"
    assert st.metadata["samples_per_frame"] == SPF and st.metadata["sample_rate"] == 24000
    assert all(len(b.sha256) == 64 for b in st.buckets)
    assert st.weights.file == "code2wav.safetensors"
    # weights are stored ONCE per stage, packages carry code only
    assert all(b.bytes < 5 * 2**20 for b in st.buckets)
    assert [p["pass"] for p in st.passes] == [
        "bake_codebooks",
        "bake_snake",
        "fuse_projections",
        "depthwise_conv_as_shifts",
    ]


def test_bf16_artifact_within_policy_tolerance(qwen_tiny_bf16):
    b = load(qwen_tiny_bf16)
    st = b["code2wav"]
    assert st.entry.dtype == "bfloat16" and st.entry.tolerance == 5e-2
    results = verify_bundle(b)
    assert results and all(r.ok for r in results)
    out = st(_codes(1, 16, seed=11))
    assert out.dtype == torch.float32
