"""The CPU side of `python -m bench conv-kernels`: layer cases reconstructed from the committed H100 survey, the
conv stacks the chain measurements build, and the command's registration."""

import json

import pytest
import torch
from torch import nn

from bench import conv_kernels as C
from bench.__main__ import COMMANDS
from ttsaot.builder.kernels.conv_modules import fuse_conv_chain


def test_command_is_registered():
    assert "conv-kernels" in COMMANDS


@pytest.mark.parametrize("stage,dtype,batch,precisions", C.LAYER_PLAN)
def test_survey_cases_reproduce_the_surveyed_layers(stage, dtype, batch, precisions):
    survey = json.loads(C.SURVEY.read_text())
    run = next(r for r in survey["runs"] if r.get("stage") == stage and r.get("dtype") == dtype
               and (r.get("sizes") or {}).get("batch", 1) == batch)
    rows = {r["layer"]: r for r in run["convs"]}
    cases = C.survey_cases(survey, stage, dtype, batch, precisions[0])
    assert sum(len(c.layers) for c in cases) == len(rows)          # every layer, identical shapes timed once
    for c in cases:
        for name in c.layers:
            r = rows[name]
            eff = (r["kernel"] - 1) * r["dilation"] + 1
            if c.kind == "convT":
                want = r["in"][2] * r["stride"]
            elif r["type"] == "Conv1d":                             # hooked on the padded input
                want = (r["in"][2] - eff) // r["stride"] + 1
            else:
                want = r["in"][2]
            assert c.tout == want, (name, c.tout, want)
            assert (c.B, c.cin, c.cout, c.k) == (r["in"][0], r["in"][1], r["out_channels"], r["kernel"])
        assert c.role in C.ROLES and c.flops > 0


@pytest.mark.parametrize("spec", [s for s in C.CHAIN_PLAN if s[0] in ("qwen_decoder_block_192", "qwen_ru_d9_192")])
def test_chain_slices_are_whole_blocks(spec):
    name, family, B, T, precision, blocks, sl = spec
    eager, items, _ = C.decoder_stack(family, blocks)
    eager = nn.Sequential(*list(eager)[sl[0]:sl[1]])
    first = next(m for m in eager.modules() if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d)))
    assert first.in_channels == (384 if "block" in name else 192)
    C._randomize(eager)
    chain = fuse_conv_chain(items[sl[0]:sl[1]])
    x = torch.randn(1, first.in_channels, 8)
    with torch.no_grad():
        torch.testing.assert_close(chain(x), eager(x), rtol=1e-4, atol=1e-5)
