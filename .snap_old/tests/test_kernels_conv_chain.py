"""Kernel conv modules and `fuse_conv_chain`: the fused channels-last chains of the three codec layouts (Qwen/Fish
residual units, VoxCPM2's depthwise units with the sample-rate affine, an encoder with strided convs and opaque
modules in either layout) against the eager (NCL) module sequences, their launch plans and declared layouts,
casting, export (one node per fused conv, no layout conversion between conv layers) and an AOTI CPU build."""

import copy

import pytest
import torch
from torch import nn

from ttsaot.builder.kernels.conv1d import CPU_DECOMPOSITIONS, ConvBakeError
from ttsaot.builder.kernels.conv_modules import (
    Affine,
    KernelConv1d,
    KernelConvTranspose1d,
    KernelLinear,
    Opaque,
    Residual,
    SnakeNLC,
    fuse_conv_chain,
    linears_on_conv_kernel,
)
from ttsaot.builder.kernels.snake_beta import CPU_DECOMPOSITIONS as SNAKE_DECOMPOSITIONS
from ttsaot.builder.layers import BakedSnakeBeta, Snake1d, SnakeBeta
from ttsaot.builder.layers.conv import CausalConv1d, CausalConvTranspose1d
from ttsaot.builder.passes import bake_snake, cast_to_compute_dtype


class LeftPadConv1d(nn.Conv1d):
    """VoxCPM2's causal conv form: a Conv1d subclass padding `left_pad` zeros (stride 1)."""

    def __init__(self, *args, left_pad: int = 0, **kw) -> None:
        super().__init__(*args, **kw)
        self.left_pad = left_pad

    def forward(self, x):
        return super().forward(nn.functional.pad(x, (self.left_pad, 0)))


class TrimConvTranspose1d(nn.ConvTranspose1d):
    def __init__(self, *args, trim: int = 0, **kw) -> None:
        super().__init__(*args, **kw)
        self.trim = trim

    def forward(self, x):
        y = super().forward(x)
        return y[..., : y.shape[-1] - self.trim]


class Unit(nn.Module):
    """x + block(x), block = [snake, conv(k7, d), snake, conv(k1)]: the residual unit of all three codecs."""

    def __init__(self, block: list[nn.Module]) -> None:
        super().__init__()
        self.block = nn.Sequential(*block)

    def forward(self, x):
        return x + self.block(x)

    def item(self) -> Residual:
        return Residual(list(self.block))


class ChannelAffine(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.scale, self.shift = nn.Parameter(torch.rand(c) + 0.5), nn.Parameter(torch.randn(c) * 0.1)

    def forward(self, x):
        return x * self.scale.view(1, -1, 1) + self.shift.view(1, -1, 1)


class Mixer(nn.Module):
    """An opaque non-conv module on [B, C, T] (stands for a channels-first encoder transformer)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.lin = nn.Linear(c, c)

    def forward(self, x):
        return x + self.lin(x.transpose(1, 2)).transpose(1, 2)


class MixerNLC(nn.Module):
    """The same on [B, T, C] (a transformer as it is written: no transposes)."""

    def __init__(self, mixer: Mixer) -> None:
        super().__init__()
        self.lin = mixer.lin

    def forward(self, x):
        return x + self.lin(x)


def _randomize(m: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(("alpha", "beta")):
                p.copy_(torch.rand(p.shape, generator=g) * 0.5 + 0.6)
            elif name.endswith("scale"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            else:
                fan = p[0].numel() if p.dim() > 1 else 1
                p.copy_(torch.randn(p.shape, generator=g) * (0.6 / fan**0.5 if p.dim() > 1 else 0.05))
    return m.eval()


def qwen_like(snake=SnakeBeta):
    """conv → [snake, convT(2r, r), unit(d) × 3] × 2 → snake → conv(→1) → clamp; items and eager module."""
    mods: list[nn.Module] = [CausalConv1d(8, 12, 7)]
    items: list = [mods[0]]
    for cin, cout, r in ((12, 6, 2), (6, 5, 3)):
        s, ct = snake(cin), CausalConvTranspose1d(cin, cout, 2 * r, r)
        units = [
            Unit([snake(cout), CausalConv1d(cout, cout, 7, dilation=d), snake(cout), CausalConv1d(cout, cout, 1)])
            for d in (1, 3, 9)
        ]
        mods += [s, ct, *units]
        items += [s, ct, *[u.item() for u in units]]
    s, c = snake(5), CausalConv1d(5, 1, 7)
    mods += [s, c]
    items += [s, c, "clamp"]
    return items, _randomize(nn.Sequential(*mods))


def vox_like():
    """depthwise conv → pointwise → [affine, snake, convT, unit(depthwise d) × 3] → snake → conv(→1) → tanh."""
    mods: list[nn.Module] = [LeftPadConv1d(4, 4, 7, groups=4, left_pad=6), LeftPadConv1d(4, 8, 1)]
    items: list = list(mods)
    for cin, cout, r in ((8, 6, 2),):
        aff, s = ChannelAffine(cin), Snake1d(cin)
        ct = TrimConvTranspose1d(cin, cout, 2 * r, stride=r, trim=r)
        units = [
            Unit(
                [
                    Snake1d(cout),
                    LeftPadConv1d(cout, cout, 7, dilation=d, groups=cout, left_pad=6 * d),
                    Snake1d(cout),
                    LeftPadConv1d(cout, cout, 1),
                ]
            )
            for d in (1, 3, 9)
        ]
        mods += [aff, s, ct, *units]
        items += [Affine(aff.scale, aff.shift), s, ct, *[u.item() for u in units]]
    s, c = Snake1d(6), LeftPadConv1d(6, 1, 7, left_pad=6)
    mods += [s, c, nn.Tanh()]
    items += [s, c, nn.Tanh()]
    return items, _randomize(nn.Sequential(*mods))


def encoder_like(mixer_layout: str = "NCL"):
    """conv(1→4) → unit × 3 → snake → strided conv(k=2s) → mixer → snake → conv(k3)."""
    mods: list[nn.Module] = [CausalConv1d(1, 4, 7)]
    units = [
        Unit([Snake1d(4), CausalConv1d(4, 4, 7, dilation=d), Snake1d(4), CausalConv1d(4, 4, 1)]) for d in (1, 3, 9)
    ]
    mixer = Mixer(8)
    mods += [*units, Snake1d(4), CausalConv1d(4, 8, 8, stride=4), mixer, Snake1d(8), CausalConv1d(8, 6, 3)]
    eager = _randomize(nn.Sequential(*mods))
    opaque = Opaque(mixer, "NCL") if mixer_layout == "NCL" else Opaque(MixerNLC(mixer), "NLC")
    items = [mods[0], *[u.item() for u in units], mods[4], mods[5], opaque, *mods[7:]]
    return items, eager


def test_qwen_like_chain_plan_and_fp32_numerics():
    items, eager = qwen_like()
    chain = fuse_conv_chain(items, out_dtype=torch.float32)  # NCL in and out, like the eager modules
    unit = ["conv(+snake)", "conv(+skip+snake, pre→skip)"] * 2 + ["conv(+snake)", "conv(+skip+snake)"]
    assert chain.plan.steps == [
        "to_nlc",
        "conv(+snake)",
        "convT(+snake, pre→skip)",
        *unit,
        "convT(+snake, pre→skip)",
        *unit,
        "conv(+clamp)",
        "to_ncl",
    ]
    assert chain.plan.launches == 17  # eager: 31 convs + pads, 15 snakes, 6 adds, clamp, cast
    assert chain.plan.layout_changes == [0, 17]
    x = torch.randn(2, 8, 10)
    with torch.no_grad():
        ref = eager(x).clamp(-1, 1)
        y = chain(x)
    assert y.shape == (2, 1, 60) and y.dtype == torch.float32
    assert y.is_contiguous()  # the 1-channel [B, T, 1] result is the [B, 1, T] wave as it is
    assert (ref.abs() < 1).float().mean() > 0.8 and ref.std() > 0.05  # the clamp must not hide the comparison
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)
    # the same chain between channels-last neighbours (a transformer before it): no layout change at all
    nlc = fuse_conv_chain(items, input_layout="NLC", output_layout="NLC", out_dtype=torch.float32)
    assert nlc.plan.launches == 16 and nlc.plan.layout_changes == []
    with torch.no_grad():
        y2 = nlc(x.transpose(1, 2).contiguous())
    assert y2.shape == (2, 60, 1)
    torch.testing.assert_close(y2, ref.transpose(1, 2), rtol=1e-4, atol=1e-5)


def test_residual_chain_bf16_follows_the_eager_bf16_modules():
    """Units + head in bf16: the fused epilogues round where the eager bf16 modules round. (Without a transposed
    conv: PyTorch's CPU bf16 conv_transpose1d rounds differently from an fp32-accumulating GEMM, unlike cuDNN.)"""
    units = [
        Unit([SnakeBeta(6), CausalConv1d(6, 6, 7, dilation=d), SnakeBeta(6), CausalConv1d(6, 6, 1)]) for d in (1, 3, 9)
    ]
    s, c = SnakeBeta(6), CausalConv1d(6, 1, 7)
    eager = _randomize(nn.Sequential(*units, s, c))
    items = [*[u.item() for u in units], s, c, "clamp"]
    x = torch.randn(2, 6, 40)
    with torch.no_grad():
        ref32 = eager(x).clamp(-1, 1)
        chain = cast_to_compute_dtype(fuse_conv_chain(items, out_dtype=torch.float32), torch.bfloat16)
        bake_snake(eager)
        e16 = cast_to_compute_dtype(eager, torch.bfloat16)(x.bfloat16()).clamp(-1, 1).float()
        y = chain(x.bfloat16())
    assert chain.plan.launches == 9 and y.dtype == torch.float32  # 8 + the copy to channels-last
    snakes = [m for m in chain.modules() if hasattr(m, "alpha") and m.alpha is not None]
    assert snakes and all(m.alpha.dtype == torch.float32 and m.inv_beta.dtype == torch.float32 for m in snakes)
    convs = [m for m in chain.modules() if isinstance(m, (KernelConv1d, KernelConvTranspose1d))]
    assert all(m.weight.dtype == torch.bfloat16 and m.bias.dtype == torch.bfloat16 for m in convs)
    err_eager = ((e16 - ref32).norm() / ref32.norm()).item()
    err_chain = ((y - e16).norm() / e16.norm()).item()
    # the same roundings as the eager bf16 modules: only summation-order ulps separate them
    assert (y == e16).float().mean() > 0.9 and err_chain < 0.25 * err_eager, (err_chain, err_eager)


def test_vox_like_chain_depthwise_affine_tanh():
    items, eager = vox_like()
    chain = fuse_conv_chain(items)
    assert chain.plan.steps[:5] == ["to_nlc", "dw", "conv(+affine+snake)", "convT(+snake, pre→skip)", "dw(+snake)"]
    assert chain.plan.steps[-3:] == ["conv(+skip+snake)", "conv(+tanh)", "to_ncl"]
    x = torch.randn(3, 4, 7)
    with torch.no_grad():
        torch.testing.assert_close(chain(x), eager(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mixer_layout", ["NCL", "NLC"])
def test_encoder_like_chain_strided_and_opaque(mixer_layout):
    items, eager = encoder_like(mixer_layout)
    chain = fuse_conv_chain(items, precision="tf32x3")
    assert chain.plan.steps[:2] == ["to_nlc", "conv(+snake, pre→skip)"]
    assert "conv(+skip+snake)" in chain.plan.steps and f"opaque({mixer_layout})" in chain.plan.steps
    # the 1-channel input and output ends are free; only an NCL opaque module converts, around itself
    assert len(chain.plan.layout_changes) == (3 if mixer_layout == "NCL" else 2)
    strided = [m for m in chain.modules() if isinstance(m, KernelConv1d) and m.meta.stride == 4]
    assert len(strided) == 1 and strided[0].weight.shape == (8, 8, 4) and strided[0].precision == "tf32x3"
    for T in (64, 61, 3):  # whole strides, a ragged tail, shorter than one window
        x = torch.randn(1, 1, T)
        with torch.no_grad():
            ref = eager(x)
            torch.testing.assert_close(chain(x), ref, rtol=1e-4, atol=1e-5)


def test_chain_edges_unabsorbed_steps():
    s1, c1, s2 = SnakeBeta(4), CausalConv1d(4, 4, 3), SnakeBeta(4)
    ends_in_snake = Residual([s1, c1, s2])  # branch ends in a snake: the add cannot be fused
    chain = fuse_conv_chain([ends_in_snake, nn.Tanh()])
    assert chain.plan.steps == ["to_nlc", "set_skip", "snake", "conv(+snake)", "add_skip", "act(tanh)", "to_ncl"]
    eager = _randomize(nn.Sequential(s1, c1, s2))
    chain = fuse_conv_chain([ends_in_snake, nn.Tanh()])
    assert isinstance(chain.steps[2].mod, SnakeNLC)  # the standalone snake is channels-last
    x = torch.randn(2, 4, 9)
    with torch.no_grad():
        torch.testing.assert_close(chain(x), torch.tanh(x + eager(x)), rtol=1e-5, atol=1e-6)
    with pytest.raises(ConvBakeError, match="Opaque"):
        fuse_conv_chain([c1, Mixer(4)])  # a bare module: which layout does it take?
    with pytest.raises(ConvBakeError, match="layout"):
        fuse_conv_chain([c1], input_layout="NTC")
    with pytest.raises(ConvBakeError, match="layout"):
        Opaque(Mixer(4), "CL")
    with pytest.raises(ConvBakeError, match="nested"):
        fuse_conv_chain([Residual([Residual([c1])])])
    with pytest.raises(ConvBakeError, match="unknown chain item"):
        fuse_conv_chain([c1, "relu"])
    with pytest.raises(ConvBakeError, match="exactly when"):
        KernelConv1d.from_conv(c1, act="snake")
    with pytest.raises(ConvBakeError, match="channels"):
        KernelConv1d.from_conv(c1, act="snake", snake=BakedSnakeBeta(torch.ones(5), torch.ones(5)))
    with pytest.raises(ConvBakeError, match="precision"):
        KernelConv1d.from_conv(c1, precision="fp64")


def _ops_in(ep) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in ep.graph.nodes:
        if n.op == "call_function" and "ttsaot" in str(n.target):
            out[str(n.target)] = out.get(str(n.target), 0) + 1
    return out


def test_chain_exports_one_node_per_launch():
    items, _ = qwen_like()
    chain = fuse_conv_chain(items, out_dtype=torch.float32)
    ep = torch.export.export(chain, (torch.randn(1, 8, 10),), strict=False)
    assert _ops_in(ep) == {
        "ttsaot.conv1d.default": 10,
        "ttsaot.conv1d_dual.default": 4,
        "ttsaot.conv_transpose1d_dual.default": 2,
    }


# aten ops that change or copy a layout (views included: a strided view handed to a kernel becomes a copy)
_LAYOUT_OPS = (
    "permute",
    "transpose",
    "clone",
    "contiguous",
    "copy",
    "view",
    "reshape",
    "_to_copy",
    "as_strided",
    "expand",
    "t.default",
    "unsqueeze",
    "squeeze",
)


def _layout_ops_between_convs(ep) -> tuple[list[str], list[str], list[str]]:
    """(before the first conv, between the first and the last conv, after the last conv): the layout ops."""
    nodes = [n for n in ep.graph.nodes if n.op == "call_function"]
    conv_at = [i for i, n in enumerate(nodes) if "ttsaot" in str(n.target) and "conv" in str(n.target)]
    names = [str(n.target) for n in nodes]

    def layout(sl):
        return [t for t in sl if t.startswith("aten.") and any(k in t for k in _LAYOUT_OPS)]

    return (layout(names[: conv_at[0]]), layout(names[conv_at[0] : conv_at[-1] + 1]), layout(names[conv_at[-1] + 1 :]))


@pytest.mark.parametrize("family", ["qwen", "vox", "encoder"])
def test_exported_chain_has_no_layout_conversion_between_conv_layers(family):
    """Issue 15: the chosen layout leaves no layout-conversion ops between conv layers in the exported graph; the
    declared NCL ends cost one transpose in (none for a 1-channel input) and a view out."""
    items, _ = {"qwen": qwen_like, "vox": vox_like, "encoder": lambda: encoder_like("NLC")}[family]()
    cin = {"qwen": 8, "vox": 4, "encoder": 1}[family]
    chain = fuse_conv_chain(items, out_dtype=torch.float32 if family == "qwen" else None)
    x = torch.randn(2, cin, 12)
    ep = torch.export.export(chain, (x,), strict=False)
    before, between, after = _layout_ops_between_convs(ep)
    assert between == [], between
    assert len(before) <= 2 and all("transpose" in t or "clone" in t or "contiguous" in t for t in before), before
    assert len(after) <= 1 and all("transpose" in t for t in after), after
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), chain(x))
    # channels-last neighbours on both sides: no layout op anywhere
    nlc = fuse_conv_chain(
        items, input_layout="NLC", output_layout="NLC", out_dtype=torch.float32 if family == "qwen" else None
    )
    ep = torch.export.export(nlc, (x.transpose(1, 2).contiguous(),), strict=False)
    assert _layout_ops_between_convs(ep) == ([], [], [])


@pytest.mark.slow
def test_chain_aoti_cpu_build_matches_eager(tmp_path):
    items, _ = qwen_like()
    chain = fuse_conv_chain(items[:4], out_dtype=torch.float32)  # conv, snake, convT, one unit
    x = torch.randn(2, 8, 10)
    with torch.no_grad():
        ref = chain(x)
        ep = torch.export.export(chain, (x,), strict=False)
    table = torch.export.default_decompositions()
    table.update(SNAKE_DECOMPOSITIONS)
    table.update(CPU_DECOMPOSITIONS)
    ep = ep.run_decompositions(table)
    assert not _ops_in(ep)
    path = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "chain.pt2"))
    got = torch._inductor.aoti_load_package(path)(x)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lead", [(7,), (2, 5), (1, 3, 4)])
def test_kernel_linear_is_the_linear_on_any_leading_shape(lead):
    torch.manual_seed(0)
    lin = nn.Linear(24, 40, bias=True)
    k = KernelLinear(lin, "tf32x3")
    x = torch.randn(*lead, 24)
    got, want = k(x), lin(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert k.weight.shape == (40, 1, 24) and k.weight.data_ptr() != lin.weight.data_ptr()


def test_linears_on_conv_kernel_replaces_nested_linears_and_exports_one_node_each():
    torch.manual_seed(0)
    body = nn.Sequential(nn.Linear(8, 16, bias=False), nn.GELU(), nn.Sequential(nn.Linear(16, 8)))
    ref = copy.deepcopy(body)
    assert linears_on_conv_kernel(body, "tf32x3") == 2
    assert not any(isinstance(m, nn.Linear) for m in body.modules())
    x = torch.randn(2, 9, 8)
    torch.testing.assert_close(body(x), ref(x), rtol=1e-5, atol=1e-6)
    ep = torch.export.export(body, (x,), strict=False)
    convs = [n for n in ep.graph.nodes if n.op == "call_function" and "ttsaot.conv1d" in str(n.target)]
    assert len(convs) == 2
    with pytest.raises(ConvBakeError):
        KernelLinear(nn.Linear(2, 2), "fp16")
