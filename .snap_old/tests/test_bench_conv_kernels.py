"""The CPU side of `python -m bench conv-kernels`: layer cases reconstructed from the committed H100 survey, the
measured forms of each layer (cuDNN NCL and NHWC, the channels-last op, the eager chain) computing the same thing,
the conv stacks the chain measurements build, and the command's registration."""

import json

import pytest
import torch
from torch import nn

from bench import conv_kernels as C
from bench.__main__ import commands
from ttsaot.builder.kernels.conv_modules import fuse_conv_chain


def test_command_is_registered():
    assert "conv-kernels" in commands()


@pytest.mark.parametrize("stage,dtype,batch,precisions", C.LAYER_PLAN)
def test_survey_cases_reproduce_the_surveyed_layers(stage, dtype, batch, precisions):
    survey = json.loads(C.SURVEY.read_text())
    run = next(
        r
        for r in survey["runs"]
        if r.get("stage") == stage and r.get("dtype") == dtype and (r.get("sizes") or {}).get("batch", 1) == batch
    )
    rows = {r["layer"]: r for r in run["convs"]}
    cases = C.survey_cases(survey, stage, dtype, batch, precisions[0])
    assert sum(len(c.layers) for c in cases) == len(rows)  # every layer, identical shapes timed once
    for c in cases:
        for name in c.layers:
            r = rows[name]
            eff = (r["kernel"] - 1) * r["dilation"] + 1
            if c.kind == "convT":
                want = r["in"][2] * r["stride"]
            elif r["type"] == "Conv1d":  # hooked on the padded input
                want = (r["in"][2] - eff) // r["stride"] + 1
            else:
                want = r["in"][2]
            assert c.tout == want, (name, c.tout, want)
            assert (c.B, c.cin, c.cout, c.k) == (r["in"][0], r["in"][1], r["out_channels"], r["kernel"])
        assert c.role in C.ROLES and c.flops > 0


@pytest.mark.parametrize(
    "kind,cin,cout,k,s,d,role",
    [
        ("conv", 12, 12, 7, 1, 3, "res_snake_dual"),
        ("conv", 8, 16, 4, 2, 1, "snake"),
        ("convT", 12, 6, 8, 4, 1, "snake_dual"),
        ("dw", 10, 10, 7, 1, 9, "snake"),
        ("conv", 6, 1, 7, 1, 1, "clamp_f32"),
        ("conv", 16, 8, 1, 1, 1, "tanh"),
    ],
)
def test_measured_forms_compute_the_same_layer(monkeypatch, kind, cin, cout, k, s, d, role):
    """On CPU (the op bodies take their exact reference there): cuDNN's NCL and NHWC forms, the channels-last
    kernel path with the layer's epilogue and the eager chain agree, so the GPU rows compare like with like."""
    monkeypatch.setattr(C, "DEVICE", "cpu")
    eff = (k - 1) * d + 1
    case = C.Case(
        "test",
        "ieee",
        kind,
        2,
        cin,
        cout,
        k,
        s,
        d,
        21 if kind != "convT" else 9,
        0 if kind == "convT" else eff - s,
        role,
        ["layer"],
        [None],
    )
    gen = torch.Generator().manual_seed(0)
    sets = C._Set(case, gen, C._prototype(case, gen))
    ncl = C._cudnn(case, sets)()[..., : case.tout]
    nhwc = C._cudnn_nlc(case, sets)()[:, :, 0, : case.tout]
    torch.testing.assert_close(nhwc, ncl, rtol=1e-5, atol=1e-5)
    plain = C._kernel(case, sets, None, "bias")()
    assert plain.shape == (2, case.tout, cout)
    torch.testing.assert_close(plain.transpose(1, 2), ncl, rtol=1e-5, atol=1e-5)
    fused, eager = C._kernel(case, sets, None, role)(), C._unfused(case, sets, role)()
    conv64, pre64, out64 = C._ref64(case, sets, role)
    if isinstance(fused, tuple):
        torch.testing.assert_close(fused[0].transpose(1, 2), eager[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fused[1].transpose(1, 2), eager[1], rtol=1e-5, atol=1e-5)
        fused = fused[1]
    else:  # the eager chain returns (conv, snake) for a snake role
        torch.testing.assert_close(
            fused.transpose(1, 2), eager[1] if isinstance(eager, tuple) else eager, rtol=1e-5, atol=1e-5
        )
    torch.testing.assert_close(fused.transpose(1, 2).double(), out64, rtol=1e-4, atol=1e-5)


def test_random_vq_codes_see_latent_changes():
    z = torch.randn(1, 64, 500)
    codes = C._vq_codes(z)
    assert codes.shape == (1, 500) and torch.equal(C._vq_codes(z.clone()), codes)
    assert 0.5 < (C._vq_codes(z + 1e-2 * torch.randn_like(z)) == codes).double().mean() < 1.0


def test_chain_plan_specs():
    assert len({c.name for c in C.CHAIN_PLAN}) == len(C.CHAIN_PLAN)
    core = C.CHAIN_PLAN[: C.CORE_CHAINS]
    # the targets before the budget can cut anything: code2wav and Fish decoder at B=1 and B=4, the
    # encoder's exact-numerics chain, the VAE
    assert {(c.family, c.B) for c in core} >= {
        ("qwen", 1),
        ("qwen", 4),
        ("fish", 1),
        ("fish", 4),
        ("enc", 1),
        ("vox", 1),
    }


@pytest.mark.parametrize("spec", [s for s in C.CHAIN_PLAN if s.units_only is not None], ids=lambda s: s.name)
def test_chain_slices_are_whole_blocks(spec):
    name, family, sl = spec.name, spec.family, spec.units_only
    eager, items, _ = C.decoder_stack(family)
    eager = nn.Sequential(*list(eager)[sl[0] : sl[1]])
    first = next(m for m in eager.modules() if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d)))
    assert first.in_channels == (384 if "block" in name else 192)
    C._randomize(eager)
    chain = fuse_conv_chain(items[sl[0] : sl[1]])
    x = torch.randn(1, first.in_channels, 8)
    with torch.no_grad():
        torch.testing.assert_close(chain(x), eager(x), rtol=1e-4, atol=1e-5)
