"""Fish DAC stages on the GPU (run on the GPU machine: `make test-gpu`): decoder graph replay vs the package
run directly and vs eager; encoder codes on CUDA (fp32) equal the CPU eager codes. Capturing a CUDA graph at
all also shows the graphs hold no host→device copies (masks from iota, rope tables bound constants)."""

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from ttsaot.builder.buckets import StreamingConfig  # noqa: E402
from ttsaot.builder.families.fish_s2_pro import FAMILY as FISH  # noqa: E402
from ttsaot.builder.families.fish_s2_pro import checkpoint as fck  # noqa: E402
from ttsaot.builder.families.fish_s2_pro import config as fcfg  # noqa: E402
from ttsaot.builder.families.fish_s2_pro import dac as fdac  # noqa: E402
from ttsaot.builder.families.fish_s2_pro import stages as fst  # noqa: E402
from ttsaot.builder.families.fish_s2_pro.options import FishS2Options  # noqa: E402
from ttsaot.runtime import load  # noqa: E402
from ttsaot.runtime.stage import fp32_mode  # noqa: E402

from ..conftest import rel_err  # noqa: E402
from . import gpu_artifact as shared_artifact  # noqa: E402

FP32_GROUP = pytest.mark.xdist_group("fish-dac-fp32")  # the tests of one fixture run on one worker (tests/conftest.py)
CFG = fcfg.DAC_PRESETS["tiny"]
SEED = 0


@pytest.fixture(scope="module")
def gpu_artifact():
    # one decoder frame bucket, as code2wav's fixture (tests/gpu/__init__.py code2wav_options): a graph per batch
    # bucket, lengths that pad; each package costs the cold suite ~100 CPU seconds
    opts = FishS2Options(
        seed=SEED,
        batch_buckets=(1, 2),
        frame_buckets=(16,),
        streaming=StreamingConfig(8, 8, 4, 0),
        encoder_seconds=(1.0, 2.0),
    )
    return shared_artifact("fish-dac-fp32", FISH.name, [fst.dac_decoder_stage(opts), fst.dac_encoder_stage(opts)])


@pytest.fixture(scope="module")
def gpu_artifact_bf16():
    opts = FishS2Options(
        seed=SEED, dtype=torch.bfloat16, batch_buckets=(2,), frame_buckets=(16,), streaming=StreamingConfig(16, 0, 0, 0)
    )
    return shared_artifact("fish-dac-bf16", FISH.name, [fst.dac_decoder_stage(opts)])


def _eager(cls, device):
    return fck.init_random_dac(cls(CFG), SEED).to(device).eval()


@FP32_GROUP
@pytest.mark.compiles(164)
def test_decoder_graph_replay_equals_package_run_and_eager(gpu_artifact):
    graphs = load(gpu_artifact, device="cuda")["dac_decoder"]
    direct = load(gpu_artifact, device="cuda", cuda_graphs=False)["dac_decoder"]
    assert graphs.uses_cuda_graphs and not direct.uses_cuda_graphs
    eager = _eager(fdac.DACDecoder, "cuda")
    g = torch.Generator().manual_seed(0)
    for B, F in ((1, 16), (2, 16), (1, 11), (2, 3)):
        codes = fst.random_codes(CFG, B, F, g).cuda()
        a, b = graphs(codes), direct(codes)
        assert a.shape == (B, 1, F * 2048)
        assert torch.equal(a, b)  # replay is bit-identical to running the package
        # the artifact runs fp32 with TF32 off (fp32_mode), so must its reference: cuDNN allows TF32 by
        # default (6e-4 off on an H200)
        with torch.no_grad(), fp32_mode(True, tf32=False):
            assert rel_err(a, eager(codes)) < 1e-4  # fp32, the manifest tolerance


@FP32_GROUP
def test_decoder_outputs_are_not_aliased_between_calls(gpu_artifact):
    st = load(gpu_artifact, device="cuda")["dac_decoder"]
    g = torch.Generator().manual_seed(1)
    o1 = st(fst.random_codes(CFG, 1, 8, g).cuda())
    keep = o1.clone()
    st(fst.random_codes(CFG, 1, 8, g).cuda())
    assert torch.equal(o1, keep)


@pytest.mark.compiles(41)
def test_decoder_bf16_within_tolerance(gpu_artifact_bf16):
    st = load(gpu_artifact_bf16, device="cuda")["dac_decoder"]
    eager = _eager(fdac.DACDecoder, "cuda")
    codes = fst.random_codes(CFG, 2, 16, torch.Generator().manual_seed(2)).cuda()
    out = st(codes)
    assert out.dtype == torch.float32
    with torch.no_grad():
        assert rel_err(out, eager(codes)) < st.entry.tolerance


@FP32_GROUP
def test_encoder_codes_on_cuda_equal_cpu_eager_codes(gpu_artifact):
    st = load(gpu_artifact, device="cuda")["dac_encoder"]
    assert st.uses_cuda_graphs
    cpu_eager = _eager(fdac.DACEncoder, "cpu")
    g = torch.Generator().manual_seed(3)
    for n in (45_056, 60_000, 5_000):
        t = torch.arange(n) / 44100.0
        audio = 0.3 * torch.sin(2 * torch.pi * (150 + 300 * t) * t) + 0.05 * torch.randn(n, generator=g)
        codes = st.encode(audio)
        assert codes.device.type == "cuda"
        with torch.no_grad():
            ref = cpu_eager(audio.view(1, 1, -1))[0]
        assert torch.equal(codes.cpu(), ref), n
