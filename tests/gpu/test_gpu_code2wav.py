"""GPU correctness (run on the GPU machine: `make test-gpu`). Performance lives in bench/, not here."""

import json
import warnings

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from ttsaot.builder.families.qwen3_tts_12hz import FAMILY as QWEN  # noqa: E402
from ttsaot.builder.families.qwen3_tts_12hz import checkpoint as qck  # noqa: E402
from ttsaot.builder.families.qwen3_tts_12hz import code2wav as qm  # noqa: E402
from ttsaot.builder.families.qwen3_tts_12hz import config as qcfg  # noqa: E402
from ttsaot.builder.families.qwen3_tts_12hz import stages as qst  # noqa: E402
from ttsaot.builder.kernels.snake_beta import launch_snake_beta_kernel, snake_beta_reference  # noqa: E402
from ttsaot.runtime import InputRangeError, load  # noqa: E402

from ..conftest import rel_err  # noqa: E402
from . import code2wav_options  # noqa: E402
from . import gpu_artifact as shared_artifact  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 96, 7), (4, 1536, 2000), (2, 96, 96000)])
def test_snake_kernel_matches_reference(dtype, shape):
    x = (torch.randn(shape, device="cuda") * 3).to(dtype)
    a = torch.rand(shape[1], device="cuda") + 0.5
    ib = torch.rand(shape[1], device="cuda")
    y = launch_snake_beta_kernel(x, a, ib)
    r = snake_beta_reference(x, a, ib)
    assert rel_err(y.float(), r.float()) < (1e-6 if dtype == torch.float32 else 1e-2)


GROUP = pytest.mark.xdist_group("code2wav-gpu")  # the fixture's tests on one worker (tests/conftest.py)


@pytest.fixture(scope="module")
def gpu_artifact():
    # One frame bucket (a graph per batch bucket, and an off-bucket length that pads): each package costs this
    # CPU-bound suite ~100 CPU seconds cold (bench/results/nvidia-h200/probes/gpu_suite_cpu/), and bucket choice
    # is the CPU suite's to test. test_gpu_onnx's bf16 build reuses its b2_f16 package (the package cache).
    return shared_artifact("code2wav-bf16", QWEN.name, [qst.code2wav_stage(code2wav_options(torch.bfloat16))])


@GROUP
@pytest.mark.compiles(128)
def test_graph_replay_equals_direct_package_run_and_eager(gpu_artifact):
    # the conv kernel layer's ops in an AOTI package (test_gpu_kernels_conv.py leaves that to this build)
    assert json.loads((gpu_artifact / "manifest.json").read_text())["stages"]["code2wav"]["kernels"] == "ttsaot"
    graphs = load(gpu_artifact, device="cuda")["code2wav"]
    direct = load(gpu_artifact, device="cuda", cuda_graphs=False)["code2wav"]
    assert graphs.uses_cuda_graphs and not direct.uses_cuda_graphs
    eager = qck.init_random_code2wav(qm.Code2Wav(qcfg.CODE2WAV_PRESETS["tiny"]), seed=0).cuda()
    g = torch.Generator().manual_seed(0)
    for B, F in ((1, 16), (2, 16), (1, 11)):
        codes = torch.randint(0, 64, (B, 16, F), generator=g).cuda()
        a, b = graphs(codes), direct(codes)
        assert torch.equal(a, b)  # replay is bit-identical to running the package
        assert rel_err(a, eager(codes)) < 5e-2  # bf16 vs fp32 eager, the manifest tolerance


@GROUP
def test_outputs_are_not_aliased_between_calls(gpu_artifact):
    st = load(gpu_artifact, device="cuda")["code2wav"]
    c1 = torch.randint(0, 64, (1, 16, 16), device="cuda")
    c2 = torch.randint(0, 64, (1, 16, 16), device="cuda")
    o1 = st(c1)
    keep = o1.clone()
    st(c2)
    assert torch.equal(o1, keep)


@GROUP
def test_device_codes_are_checked_in_one_replay_without_a_stream_synchronisation(gpu_artifact):
    """Codes already on the GPU: their range checks run as each bucket's captured check graph over its padded
    buffers, right before the package's graph; the host waits for the flags' copy alone (an event, not a stream
    synchronisation), after launching the package. A bad code is refused with the index and value of the caller's
    tensor (also off-bucket, in the padded region's bucket); the package ran on the cleared buffer (the bad code
    replaced by the range's low end), so it read nothing out of bounds, and the next good call is unaffected."""
    st = load(gpu_artifact, device="cuda")["code2wav"]
    assert all(r.value_checks is not None and r.value_checks.graph.captured for r in st._runners.values())
    good = torch.randint(0, 64, (1, 16, 11), device="cuda")
    first = st(good)  # the bucket's one-time output check synchronises; not counted below
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            again = st(good)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert not [w for w in caught if "synchroniz" in str(w.message)], [str(w.message) for w in caught]
    assert torch.equal(first, again)
    runner = st._runners[st.pick_bucket({"batch": 1, "frames": 11}).key]
    bad = good.clone()
    bad[0, 3, 7] = 64
    with pytest.raises(InputRangeError, match=r"'codes'\[0, 3, 7\] = 64 is outside \[0, 64\)"):
        st(bad)
    cleared = bad.clone()
    cleared[0, 3, 7] = 0
    assert torch.equal(runner.graph.inputs[0][..., :11], cleared)
    assert torch.equal(st(good), first)
    st.validate_inputs = False
    st(bad)  # unchecked: the switch still skips the values
