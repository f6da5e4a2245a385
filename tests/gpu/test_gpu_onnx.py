"""ONNX export from a CUDA build (run on the GPU machine): the module lives on the GPU and `ttsaot::snake_beta` is
the Triton op there, which must still lower to standard ONNX ops; onnxruntime checks the result (CPU provider,
and the CUDA provider when the installed onnxruntime has it)."""

import json

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from ttsaot.builder.families.qwen3_tts_12hz import FAMILY as QWEN  # noqa: E402
from ttsaot.builder.families.qwen3_tts_12hz import stages as qst  # noqa: E402
from ttsaot.builder.onnx_verify import default_providers, verify_onnx  # noqa: E402
from ttsaot.runtime import load  # noqa: E402

from ..conftest import rel_err  # noqa: E402
from . import build_on_gpu, code2wav_options  # noqa: E402


@pytest.mark.parametrize(
    "dtype",
    [
        pytest.param(torch.float32, marks=pytest.mark.compiles(120)),
        pytest.param(torch.bfloat16, marks=pytest.mark.compiles(18)),
    ],
)
def test_cuda_build_with_onnx(dtype, tmp_path):
    # One batch bucket. fp32: two frame buckets, as the ONNX model's frames axis is dynamic only where the plan has
    # more than one size (the off-bucket comparison below). bf16: the code2wav fixture's b2_f16 package (the
    # package cache), no compile of its own (b2_f8 compiled here cost the cold suite 100 s at its end).
    frames = (8, 16) if dtype == torch.float32 else (16,)
    opts = code2wav_options(dtype, batch_buckets=(2,), frame_buckets=frames)
    art = build_on_gpu(QWEN.name, [qst.code2wav_stage(opts)], tmp_path, formats="aoti,onnx")
    st = json.loads((art / "manifest.json").read_text())["stages"]["code2wav"]
    o = st["onnx"]
    if st["kernels"] == "inductor":  # fp32 code2wav on CUDA: Inductor's convs, the snake op
        assert o["custom_ops"] == {"ttsaot.snake_beta.default": "translation"}
    else:  # bf16: the conv kernel layer (--kernels auto): snake_beta, where it is still a node of its own, leaves
        # as its onnxscript translation; the conv ops (snake fused into them) through their aten decompositions
        # (decompositions.py, the CPU builds' lowering)
        ops = o["custom_ops"]
        assert any(op.startswith("ttsaot.conv") for op in ops), ops
        for op, how in ops.items():
            assert op.startswith("ttsaot."), ops
            assert how == ("translation" if op == "ttsaot.snake_beta.default" else "decomposition"), ops
    assert o["opset"] == (20 if dtype == torch.float32 else 22)
    model = onnx.load(str(art / o["file"]))
    onnx.checker.check_model(model, full_check=True)
    assert {n.domain for n in model.graph.node} <= {"", "ai.onnx"}
    results = verify_onnx(art)
    ran = [r for r in results if not r.skipped]
    assert all(r.ok for r in ran), [r for r in ran if not r.ok]
    if dtype == torch.float32:
        assert {r.provider for r in ran} == set(default_providers())
        # the dynamic ONNX model and the CUDA-graph AOTI stage agree at a bucket and an off-bucket length
        stage = load(art, device="cuda")["code2wav"]
        sess = ort.InferenceSession(str(art / o["file"]), providers=default_providers())
        for frames in (16, 11):
            codes = torch.randint(0, 64, (2, 16, frames))
            a = stage(codes.cuda()).cpu()
            b = torch.from_numpy(sess.run(None, {"codes": codes.numpy()})[0])
            assert rel_err(b, a) < st["tolerance"]
