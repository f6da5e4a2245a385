"""VoxCPM2 audio stages and the decode pipeline on a GPU (run on the GPU machine: `make test-gpu`).

`decode_end_to_end(device, dtype)` also runs on CPU by hand (it builds the LM steps too: too slow for the CPU
suite): python -m tests.gpu.test_gpu_voxcpm2_audio"""

from __future__ import annotations

import pytest
import torch

from ttsaot.builder.buckets import StreamingConfig

from . import GPU_BUILD_JOBS, VOXCPM2_LM_MAX_LEN, build_on_gpu
from . import gpu_artifact as shared_artifact

STREAM = StreamingConfig(12, 24, 0, 0)
E2E_STAGES = ("base_lm_step", "residual_lm_step", "locdit", "local_encoder", "vae_decoder")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _opts(dtype, **kw):
    from ttsaot.builder.families.voxcpm2.options import VoxCPM2Options

    base = dict(
        dtype=dtype, batch_buckets=(1, 2), frame_buckets=(12, 36), streaming=STREAM, max_len=64, prefill_buckets=(16,)
    )
    base.update(kw)
    return VoxCPM2Options(**base)


def decode_end_to_end(
    device: str = "cuda", dtype: torch.dtype = torch.float32, out_root=None, steps: int = 9, **opts_kw
) -> dict:
    """Artifacts (LM steps + locdit + local_encoder + vae_decoder) driven by VoxCPM2Decoder vs an eager loop
    over the same modules in the reference's order, same per-request noise; returns the measured errors."""
    import tempfile

    from ttsaot.builder.build import build_family
    from ttsaot.builder.families.voxcpm2 import FAMILY as VOX
    from ttsaot.builder.families.voxcpm2 import config as vcfg
    from ttsaot.builder.families.voxcpm2 import stages as vst
    from ttsaot.runtime import load
    from ttsaot.runtime.pipelines.voxcpm2 import VoxCPM2Decoder, draw_noise

    opts = _opts(dtype, **{"n_timesteps": 4, **opts_kw})
    specs = VOX.specs(opts, E2E_STAGES)
    root = out_root or tempfile.mkdtemp(prefix="vx-e2e-")
    if device == "cuda":
        art = build_on_gpu(VOX.name, specs, root, verify_in_subprocess=False)
    else:
        art = build_family(VOX.name, specs, root, device, verify_in_subprocess=False, jobs=GPU_BUILD_JOBS).path
    bundle = load(art, device=device)
    eager = {s.name: s.make_module().to(device).eval() for s in specs}

    dev = torch.device(device)
    B, H = 2, bundle["locdit"].entry.inputs[0].shape[1]
    C, P = (int(x) for x in bundle["locdit"].entry.inputs[2].shape[1:])
    g = torch.Generator().manual_seed(0)
    lm_h, res_h = torch.randn(B, H, generator=g).to(dev), torch.randn(B, H, generator=g).to(dev)
    cond = torch.zeros(B, C, P, device=dev)
    seeds = (11, 22)

    def gens():
        return [torch.Generator(device=dev).manual_seed(s) for s in seeds]

    # --- artifacts through the pipeline (empty caches: the decode loop itself is under test)
    base_cache = bundle["base_lm_step"].new_cache(B)
    res_cache = bundle["residual_lm_step"].new_cache(B)
    dec = VoxCPM2Decoder(bundle, min_len=2)
    chunks = list(
        dec.stream(
            lm_h, res_h, cond, base_cache=base_cache, residual_cache=res_cache, generators=gens(), max_steps=steps
        )
    )
    wav = [torch.cat([c.wav for c in chunks if c.row == r], dim=-1) for r in range(B)]

    # --- the eager reference loop (VoxCPM2Model._inference order), per-row noise from the same seeds
    max_len = opts.max_len
    shape = vst.cache_shape(vcfg.LM_PRESETS[opts.preset].lm, B, max_len)
    res_shape = vst.cache_shape(vcfg.LM_PRESETS[opts.preset].residual, B, max_len)
    kb, vb = torch.zeros(shape, device=dev), torch.zeros(shape, device=dev)
    kr, vr = torch.zeros(res_shape, device=dev), torch.zeros(res_shape, device=dev)
    cdt = next(eager["base_lm_step"].parameters()).dtype
    kb, vb, kr, vr = (t.to(cdt) for t in (kb, vb, kr, vr))
    g_ref = gens()
    latents: list[list[torch.Tensor]] = [[] for _ in range(B)]
    active, x_lm, x_res, x_cond, stop = list(range(B)), lm_h, res_h, cond, None
    with torch.no_grad():
        for step in range(steps):
            noise = draw_noise(len(active), C, P, dev, [g_ref[i] for i in active])
            patch = eager["locdit"](x_lm, x_res, x_cond, noise)
            embed = eager["local_encoder"](patch.transpose(1, 2).unsqueeze(1))
            for j, i in enumerate(active):
                latents[i].append(patch[j])
            flags = stop.argmax(-1).tolist() if (stop is not None and step > 2) else [0] * len(active)
            keep = [j for j in range(len(active)) if flags[j] != 1]
            if step == steps - 1 or not keep:
                break
            sel = torch.tensor(keep, device=dev)
            active = [active[j] for j in keep]
            embed, patch = embed[sel], patch[sel]
            full_e = torch.zeros(B, H, device=dev)
            full_e[active] = embed
            pos = torch.full((B,), max_len, dtype=torch.int64, device=dev)
            pos[active] = step
            _, lm_full, stop_full = eager["base_lm_step"](full_e, pos, kb, vb)
            res_full = eager["residual_lm_step"](lm_full, full_e, pos, kr, vr)
            x_lm, x_res, stop, x_cond = lm_full[active], res_full[active], stop_full[active], patch

    errs = {}
    for r in range(B):
        z = torch.cat(latents[r], dim=-1)[None]
        with torch.no_grad():
            ref_wav = eager["vae_decoder"](z.float())[0]
        assert wav[r].shape == ref_wav.shape, (r, wav[r].shape, ref_wav.shape)
        errs[f"wav{r}"] = _rel(wav[r], ref_wav)
    errs["finals"] = sum(c.final for c in chunks)
    return errs


if __name__ == "__main__":  # pragma: no cover
    print(decode_end_to_end("cpu", batch_buckets=(2,), frame_buckets=(36,)))


# ---------------------------------------------------------------------------------------------- GPU tests
pytestmark = pytest.mark.gpu
AUDIO_GROUP = pytest.mark.xdist_group("voxcpm2-audio-bf16")  # one fixture's tests on one worker (tests/conftest.py)


@pytest.fixture(scope="module")
def gpu_audio_artifact():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from ttsaot.builder.families.voxcpm2 import FAMILY as VOX

    return shared_artifact("voxcpm2-audio-bf16", VOX.name, _audio_specs())


def _audio_specs() -> list:
    """The audio fixture's stages, bf16: locdit and local_encoder at batch 1 and 2 (one request, and two whose
    per-row noise must match it), vae_decoder at batch 2 only (its tests run two rows): each codec package costs
    the CPU-bound cold GPU suite ~100 CPU seconds (bench/results/nvidia-h200/probes/gpu_suite_cpu/)."""
    from ttsaot.builder.families.voxcpm2 import FAMILY as VOX

    patch = VOX.specs(_opts(torch.bfloat16), ("locdit", "local_encoder"))
    return patch + VOX.specs(_opts(torch.bfloat16, batch_buckets=(2,)), ("vae_decoder",))


@AUDIO_GROUP
@pytest.mark.compiles(159)
def test_graph_replay_equals_direct_run_and_eager(gpu_audio_artifact):
    from ttsaot.builder.families.voxcpm2.stages import AUDIO_STAGES
    from ttsaot.runtime import load

    graphs = load(gpu_audio_artifact, device="cuda")
    direct = load(gpu_audio_artifact, device="cuda", cuda_graphs=False)
    specs = {s.name: s for s in _audio_specs()}
    for name in AUDIO_STAGES:
        spec = specs[name]
        eager = spec.make_module().cuda()
        sizes = {"batch": 2, "frames": 30} if name == "vae_decoder" else {"batch": 1}
        x = spec.make_inputs(sizes, torch.Generator().manual_seed(3))
        args = [x[n].cuda() for n in spec.input_names]
        out_g, out_d = graphs[name](*args), direct[name](*args)
        assert graphs[name].uses_cuda_graphs
        assert torch.equal(out_g, out_d)
        with torch.no_grad():
            assert _rel(out_g, eager(*args)) < spec.tolerance, name


@AUDIO_GROUP
def test_streamed_vae_equals_one_shot_on_gpu(gpu_audio_artifact):
    from ttsaot.runtime import load

    st = load(gpu_audio_artifact, device="cuda")["vae_decoder"]
    assert st.metadata["streaming_exact"]
    z = torch.randn(2, st.entry.inputs[0].shape[1], 36, device="cuda")
    one_shot = st(z)
    streamed = torch.cat(list(st.stream(z.split(12, dim=-1))), dim=-1)
    assert _rel(streamed, one_shot) < 1e-4


@AUDIO_GROUP
def test_per_request_noise_is_reproducible_on_gpu(gpu_audio_artifact):
    from ttsaot.runtime import load
    from ttsaot.runtime.pipelines.voxcpm2 import PatchGenerator

    b = load(gpu_audio_artifact, device="cuda")
    pg = PatchGenerator(b["locdit"], b["local_encoder"])
    H = b["locdit"].entry.inputs[0].shape[1]
    C, P = (int(x) for x in b["locdit"].entry.inputs[2].shape[1:])
    lm, res = torch.randn(2, H, device="cuda"), torch.randn(2, H, device="cuda")
    cond = torch.randn(2, C, P, device="cuda")
    p2, _ = pg(lm, res, cond, [torch.Generator("cuda").manual_seed(s) for s in (1, 2)])
    p1, _ = pg(lm[1:], res[1:], cond[1:], [torch.Generator("cuda").manual_seed(2)])
    assert _rel(p1, p2[1:]) < 2e-2  # batch-1 vs batch-2 buckets: same noise, bf16 kernel-order noise only


@pytest.mark.compiles(46)
def test_pipeline_end_to_end_on_gpu(tmp_path):
    """fp32, so the stop decisions of artifact and eager agree (bf16 parity is checked per stage above). One batch
    bucket (its two rows, then one once a row stops, padded), one vae_decoder window (the stream's 12- and 24-frame
    windows pad to the 36-frame one, as a one-shot 30-frame call does in the fixture's test) and the LM fixture's
    cache length: its fp32 LM step packages are this build's too (test_gpu_voxcpm2_lm; the package cache), and the
    CPU-bound cold suite builds 5 packages here instead of 12 (bench/results/nvidia-h200/probes/gpu_suite_cpu/)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    errs = decode_end_to_end(
        "cuda", torch.float32, out_root=tmp_path, batch_buckets=(2,), frame_buckets=(36,), max_len=VOXCPM2_LM_MAX_LEN
    )
    assert all(v < 1e-3 for k, v in errs.items() if k.startswith("wav")), errs
    assert errs["finals"] == 2
