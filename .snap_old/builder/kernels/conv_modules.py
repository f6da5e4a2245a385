"""Build-time modules over the conv kernels (builder/kernels/conv1d.py), free of family code.

- `KernelConv1d`, `KernelConvTranspose1d`, `KernelDwConv1d`: the channels-last ([B, T, C]) counterparts of
  CausalConv1d / CausalConvTranspose1d / a causal depthwise conv (weights baked once by `from_conv`), each with an
  optional fused epilogue (residual input, per-channel affine, SnakeBeta / tanh / clamp, second `pre` output,
  output dtype); `SnakeNLC`, a standalone channels-last SnakeBeta.
- `fuse_conv_chain(items, input_layout=..., output_layout=...)`: turns a codec decoder/encoder written as a flat
  list of generic items (snakes, convs, `Residual([...])` branches, `Affine`, "tanh"/"clamp", `Opaque(module,
  layout)` steps) into a `FusedConvChain` that runs every conv with the activation that FOLLOWS it, the residual
  add that closes its branch, and the second output that the next branch needs as its skip, all in the conv's
  epilogue: Snake → conv(k, d) → Snake → conv(1) → +skip → next Snake costs 2 launches per residual unit instead
  of ~6 passes. Inside the chain everything is channels-last; the declared input/output layouts add at most one
  layout change at each end ("to_nlc", a copy, free for a 1-channel input; "to_ncl", a view, free for a
  1-channel output, whose [B, T, 1] is already the contiguous [B, 1, T] wave), and an `Opaque` module declared
  "NCL" is the only other place one appears (`ChainPlan.layout_changes`).
- `KernelConvNeXt`: layers.conv.ConvNeXtBlock on [B, T, C] (its depthwise conv as `ttsaot::dwconv1d`), for the
  codecs' up/downsampling stages, as an `Opaque(..., "NLC")` step of a chain.
- `conv_graph_report(ep)`: the conv nodes of an exported program and every layout change between the first and
  the last of them (what the codec stages' tests assert is empty).

Mapping the three codecs (the families' `*_nlc.py` modules build the item lists from their stage modules):
- Qwen3-TTS ResidualUnit and Fish DAC ResidualUnit: `Residual([snake1, conv1(k7, d), snake2, conv2(k1)])`
  (SnakeBeta log-scale and Snake1d linear-alpha both bake to BakedSnakeBeta; causal convs keep the length, so the
  skip is never cropped);
- VoxCPM2 CausalResidualUnit: the same with a DEPTHWISE conv1 (groups = channels, `KernelDwConv1d`), and the
  baked sample-rate conditioning before each decoder block as `Affine(scale, shift)`;
- decoder blocks: `snake, conv_transpose, Residual(...)×3`; heads: `snake, conv(k7), "tanh"` (Fish, VoxCPM2) or
  `"clamp"` with `out_dtype=torch.float32` (Qwen's clamp(−1, 1).float());
- encoder blocks (Fish DAC): `Residual(...)×3, snake, strided conv(2s, s)`, then the block's transformer as
  `Opaque(transformer, "NLC")` when it takes [B, T, C] (its own layout changes then disappear as well).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.snake import BakedSnakeBeta, Snake1d, SnakeBeta
from . import conv1d as _ops  # noqa: F401  (registers torch.ops.ttsaot.conv*)
from .conv1d import ACTS, PRECISIONS, ConvBakeError, ConvMeta, bake_conv1d, bake_conv_transpose1d, bake_dwconv1d

LAYOUTS = ("NCL", "NLC")


def _param(t: torch.Tensor | None) -> nn.Parameter | None:
    # contiguous_format: a weight with a size-1 dim (depthwise [C, 1, K]) can be "contiguous" with other strides,
    # and the artifact's constants must have the canonical strides the packages index
    return (
        None
        if t is None
        else nn.Parameter(t.detach().clone(memory_format=torch.contiguous_format), requires_grad=False)
    )


def _snake_params(snake: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(alpha, inv_beta) fp32 of a BakedSnakeBeta, or of an unbaked SnakeBeta / Snake1d (baked here)."""
    if isinstance(snake, SnakeBeta):
        snake = BakedSnakeBeta.from_log_scale(snake.alpha, snake.beta)
    elif isinstance(snake, Snake1d):
        snake = BakedSnakeBeta.from_linear(snake.alpha)
    if not (hasattr(snake, "alpha") and hasattr(snake, "inv_beta")):
        raise ConvBakeError(f"{type(snake).__name__}: not a snake (needs alpha and inv_beta)")
    return snake.alpha.detach().float().flatten(), snake.inv_beta.detach().float().flatten()


class SnakeNLC(nn.Module):
    """`ttsaot::snake_beta_nlc` on x [B, T, C]: a snake the chain could not fuse into a conv epilogue."""

    keep_fp32 = True

    def __init__(self, alpha: torch.Tensor, inv_beta: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("alpha", alpha.detach().float().flatten().contiguous())
        self.register_buffer("inv_beta", inv_beta.detach().float().flatten().contiguous())

    @classmethod
    def from_snake(cls, snake: Any) -> SnakeNLC:
        return cls(*_snake_params(snake))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.ttsaot.snake_beta_nlc(x, self.alpha, self.inv_beta)


class _KernelConvBase(nn.Module):
    """Epilogue state shared by the three kernel modules. alpha/inv_beta stay fp32 through
    passes.cast.cast_to_compute_dtype (`<name>_keep_fp32`); weight, bias, scale and shift take the compute dtype,
    as the eager modules' parameters do."""

    alpha_keep_fp32 = inv_beta_keep_fp32 = True

    def _init_epilogue(
        self, channels: int, act: str, snake: Any, affine: tuple | None, write_pre: bool, out_dtype: torch.dtype | None
    ) -> None:
        if act not in ACTS:
            raise ConvBakeError(f"act must be one of {ACTS}, got {act!r}")
        if (act == "snake") != (snake is not None):
            raise ConvBakeError("a snake module is given exactly when act='snake'")
        self.act, self.write_pre, self.out_dtype = act, write_pre, out_dtype
        a, ib = _snake_params(snake) if snake is not None else (None, None)
        for name, t in (("alpha", a), ("inv_beta", ib)):
            if t is not None and t.shape != (channels,):
                raise ConvBakeError(f"{name} has {t.numel()} channels, the conv outputs {channels}")
            self.register_buffer(name, None if t is None else t.contiguous())
        sc, sh = (None, None) if affine is None else (affine[0].detach().flatten(), affine[1].detach().flatten())
        for name, t in (("scale", sc), ("shift", sh)):
            if t is not None and t.shape != (channels,):
                raise ConvBakeError(f"affine {name} has {t.numel()} channels, the conv outputs {channels}")
            self.register_buffer(name, None if t is None else t.clone().contiguous())

    def _epilogue_args(self) -> tuple:
        return self.scale, self.shift, self.alpha, self.inv_beta

    def extra_repr(self) -> str:
        return (
            f"act={self.act}, write_pre={self.write_pre}, affine={self.scale is not None}, out_dtype={self.out_dtype}"
        )


class KernelConv1d(_KernelConvBase):
    """`ttsaot::conv1d` (or `conv1d_dual` with write_pre) on x [B, T, Cin]: forward(x, residual=None) → out
    [B, T_out, Cout], or (pre, out)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        meta: ConvMeta,
        *,
        act: str = "none",
        snake: Any = None,
        affine: tuple | None = None,
        write_pre: bool = False,
        out_dtype: torch.dtype | None = None,
        precision: str = "ieee",
    ) -> None:
        super().__init__()
        if precision not in PRECISIONS:
            raise ConvBakeError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        self.weight, self.bias, self.meta, self.precision = _param(weight), _param(bias), meta, precision
        self._init_epilogue(meta.cout, act, snake, affine, write_pre, out_dtype)

    @classmethod
    def from_conv(cls, conv: nn.Module, **epilogue) -> KernelConv1d:
        w, b, meta = bake_conv1d(conv)
        return cls(w, b, meta, **epilogue)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        m = self.meta
        op = torch.ops.ttsaot.conv1d_dual if self.write_pre else torch.ops.ttsaot.conv1d
        return op(
            x,
            self.weight,
            self.bias,
            residual,
            *self._epilogue_args(),
            m.stride,
            m.dilation,
            m.left_pad,
            self.act,
            self.out_dtype,
            self.precision,
        )


class KernelLinear(nn.Module):
    """nn.Linear on the conv kernel as a 1-tap `ttsaot::conv1d` over the rows of x [..., K] → [..., N], with its
    fp32 GEMM `precision`. Why: with TF32 off (the exact fp32 stages) cuBLAS runs an fp32 Linear on FMA units
    (the Fish DAC encoder's fp32 GEMMs, mostly its transformer's linears: 4.7 of 18.3 ms in the H100 profile), where
    "tf32x3" keeps fp32 accuracy on the tensor cores. The weight keeps nn.Linear's [N, K] memory as a [N, 1, K]
    baked conv."""

    def __init__(self, linear: nn.Linear, precision: str) -> None:
        super().__init__()
        if precision not in PRECISIONS:
            raise ConvBakeError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        w = linear.weight.detach()
        self.in_features, self.out_features, self.precision = w.shape[1], w.shape[0], precision
        self.weight = _param(w[:, None, :].contiguous())
        self.bias = _param(None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(1, -1, self.in_features)  # one "batch" of rows: a 1-tap conv is a GEMM over rows
        y = torch.ops.ttsaot.conv1d(
            rows, self.weight, self.bias, None, None, None, None, None, 1, 1, 0, "none", None, self.precision
        )
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, precision={self.precision}"


def linears_on_conv_kernel(module: nn.Module, precision: str) -> int:
    """Replace every nn.Linear inside `module` by a KernelLinear of `precision`; returns how many."""
    n = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, KernelLinear(child, precision))
            n += 1
        else:
            n += linears_on_conv_kernel(child, precision)
    return n


class KernelConvTranspose1d(_KernelConvBase):
    """`ttsaot::conv_transpose1d(_dual)` on x [B, T, Cin] → [B, T·stride, Cout] (CausalConvTranspose1d's trimmed
    form)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        act: str = "none",
        snake: Any = None,
        affine: tuple | None = None,
        write_pre: bool = False,
        out_dtype: torch.dtype | None = None,
        precision: str = "ieee",
    ) -> None:
        super().__init__()
        if precision not in PRECISIONS:
            raise ConvBakeError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        self.weight, self.bias, self.precision = _param(weight), _param(bias), precision
        self.stride = weight.shape[0]
        self._init_epilogue(weight.shape[1], act, snake, affine, write_pre, out_dtype)

    @classmethod
    def from_conv(cls, conv: nn.Module, **epilogue) -> KernelConvTranspose1d:
        w, b, _ = bake_conv_transpose1d(conv)
        return cls(w, b, **epilogue)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        op = torch.ops.ttsaot.conv_transpose1d_dual if self.write_pre else torch.ops.ttsaot.conv_transpose1d
        return op(x, self.weight, self.bias, residual, *self._epilogue_args(), self.act, self.out_dtype, self.precision)


class KernelDwConv1d(_KernelConvBase):
    """`ttsaot::dwconv1d` on x [B, T, C]: causal depthwise conv (stride 1). No second output: where a skip must
    be kept, the chain writes the plain conv output and runs the snake separately."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        dilation: int,
        left_pad: int,
        *,
        act: str = "none",
        snake: Any = None,
        affine: tuple | None = None,
        out_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.weight, self.bias, self.dilation, self.left_pad = _param(weight), _param(bias), dilation, left_pad
        self._init_epilogue(weight.shape[1], act, snake, affine, False, out_dtype)

    @classmethod
    def from_conv(cls, conv: nn.Module, **epilogue) -> KernelDwConv1d:
        w, b, dil, left = bake_dwconv1d(conv)
        return cls(w, b, dil, left, **epilogue)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return torch.ops.ttsaot.dwconv1d(
            x,
            self.weight,
            self.bias,
            residual,
            *self._epilogue_args(),
            self.dilation,
            self.left_pad,
            self.act,
            self.out_dtype,
        )


class KernelConvNeXt(nn.Module):
    """layers.conv.ConvNeXtBlock (causal depthwise k7 → LayerNorm → Linear ×4 → GELU → Linear → ×gamma → +x) on
    x [B, T, C]: the block's own math on rows, so it needs none of the eager block's two transposes. The depthwise
    conv (a CausalConv1d with groups = channels, or its passes.conv.ShiftDepthwiseConv1d form) becomes
    `ttsaot::dwconv1d`; the norm and the two linears are the block's own modules."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.dwconv = KernelDwConv1d.from_conv(block.dwconv)
        self.norm, self.pwconv1, self.pwconv2 = block.norm, block.pwconv1, block.pwconv2
        self.gamma = block.gamma

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(self.dwconv(x)))))
        return x + self.gamma * h


# ------------------------------------------------------------------------------------------ chains
@dataclass
class Residual:
    """x + branch(x): the branch is a list of chain items (no nested Residual)."""

    branch: Sequence[Any]


@dataclass
class Affine:
    """x · scale + shift per channel (VoxCPM2's baked sample-rate conditioning); scale, shift [C]."""

    scale: torch.Tensor
    shift: torch.Tensor


@dataclass
class Opaque:
    """A module the chain runs as it is (a transformer, a ConvNeXt block), on activations in `layout`:
    "NLC" ([B, T, C], the chain's own: no conversion) or "NCL" ([B, C, T]: the chain converts around it)."""

    module: nn.Module
    layout: str = "NLC"

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ConvBakeError(f"Opaque layout must be one of {LAYOUTS}, got {self.layout!r}")


@dataclass
class _Tok:
    kind: str  # conv | convT | dw | snake | res_begin | res_end | affine | act | opaque
    obj: Any = None


def _is_depthwise(m: nn.Module) -> bool:
    inner = getattr(m, "conv", m)
    if isinstance(inner, nn.Conv1d):
        return inner.groups > 1 and inner.groups == inner.in_channels == inner.out_channels
    return type(m).__name__ == "ShiftDepthwiseConv1d"


def _classify(item: Any) -> _Tok:
    if isinstance(item, str):
        if item not in ("tanh", "clamp"):
            raise ConvBakeError(f"unknown chain item {item!r} (string items: 'tanh', 'clamp')")
        return _Tok("act", item)
    if isinstance(item, nn.Tanh):
        return _Tok("act", "tanh")
    if isinstance(item, Affine):
        return _Tok("affine", item)
    if isinstance(item, Opaque):
        return _Tok("opaque", item)
    if isinstance(item, (SnakeBeta, Snake1d, BakedSnakeBeta, SnakeNLC)):
        return _Tok("snake", item)
    inner = getattr(item, "conv", item)
    if isinstance(inner, nn.ConvTranspose1d):
        return _Tok("convT", item)
    if _is_depthwise(item):
        return _Tok("dw", item)
    if isinstance(inner, nn.Conv1d) and hasattr(item, "left_pad"):
        return _Tok("conv", item)
    if isinstance(item, nn.Module):
        raise ConvBakeError(
            f"{type(item).__name__}: wrap modules the chain does not fuse in Opaque(module, layout) "
            "to say which layout they take"
        )
    raise ConvBakeError(f"unsupported chain item {type(item).__name__}")


def _tokens(items: Sequence[Any], nested: bool = False) -> list[_Tok]:
    out: list[_Tok] = []
    for it in items:
        if isinstance(it, Residual):
            if nested:
                raise ConvBakeError("nested Residual branches are not supported")
            out += [_Tok("res_begin"), *_tokens(it.branch, nested=True), _Tok("res_end")]
        else:
            out.append(_classify(it))
    return out


class _Step(nn.Module):
    """One launch (or an opaque module, or a layout change) of a chain: (cur, skip) → (cur, skip)."""

    def __init__(self, mod: nn.Module, kind: str, use_skip: bool = False, set_skip: str | None = None) -> None:
        super().__init__()
        self.mod, self.kind, self.use_skip, self.set_skip = mod, kind, use_skip, set_skip

    def forward(self, cur: torch.Tensor, skip: torch.Tensor | None):
        if self.kind == "kernel":
            y = self.mod(cur, skip if self.use_skip else None)
            if isinstance(y, tuple):  # dual output: (pre → skip, act → cur)
                return y[1], y[0]
            return y, (y if self.set_skip == "out" else skip)
        if self.kind == "set_skip":
            return cur, cur
        if self.kind == "add_skip":
            return cur + skip, skip
        return self.mod(cur), skip  # snake / affine / act / opaque / cast / layout

    def extra_repr(self) -> str:
        return f"kind={self.kind}, use_skip={self.use_skip}, set_skip={self.set_skip}"


class _Transpose(nn.Module):
    """[B, X, Y] → [B, Y, X]. To the chain's layout: a contiguous copy (the kernels read rows). Out of it: a view
    (free for a 1-channel output; a consumer that needs other strides copies once, where it reads)."""

    def __init__(self, copy: bool) -> None:
        super().__init__()
        self.copy = copy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.transpose(1, 2)
        return y.contiguous() if self.copy else y


class _OpaqueNCL(nn.Module):
    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x.transpose(1, 2)).transpose(1, 2).contiguous()


class _AffineMod(nn.Module):
    def __init__(self, a: Affine) -> None:
        super().__init__()
        self.register_buffer("scale", a.scale.detach().flatten().clone().contiguous())
        self.register_buffer("shift", a.shift.detach().flatten().clone().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift


class _ActMod(nn.Module):
    def __init__(self, act: str, out_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.act, self.out_dtype = act, out_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act == "tanh":
            x = torch.tanh(x)
        elif self.act == "clamp":
            x = x.clamp(-1.0, 1.0)
        return x if self.out_dtype is None else x.to(self.out_dtype)


LAYOUT_STEPS = ("to_nlc", "to_ncl")


@dataclass
class ChainPlan:
    """What fuse_conv_chain made of the items: one line per step (for the manifest/inspect and tests)."""

    steps: list[str] = field(default_factory=list)

    @property
    def launches(self) -> int:
        return sum(1 for s in self.steps if not s.startswith(("set_skip", "opaque", "to_ncl")))  # to_ncl: a view

    @property
    def layout_changes(self) -> list[int]:
        """Indices of the steps that change the activation layout (copies or views)."""
        return [i for i, s in enumerate(self.steps) if s.startswith(LAYOUT_STEPS) or s == "opaque(NCL)"]


class FusedConvChain(nn.Module):
    """forward(x) runs the fused steps on x in `input_layout` and returns `output_layout`; `plan` describes them."""

    def __init__(self, steps: list[_Step], plan: ChainPlan, input_layout: str, output_layout: str) -> None:
        super().__init__()
        self.steps = nn.ModuleList(steps)
        self.plan = plan
        self.input_layout, self.output_layout = input_layout, output_layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cur, skip = x, None
        for step in self.steps:
            cur, skip = step(cur, skip)
        return cur

    def extra_repr(self) -> str:
        return f"input_layout={self.input_layout}, output_layout={self.output_layout}"


def fuse_conv_chain(
    items: Sequence[Any],
    *,
    input_layout: str = "NCL",
    output_layout: str = "NCL",
    out_dtype: torch.dtype | None = None,
    precision: str = "ieee",
) -> FusedConvChain:
    """Compile a flat item list into fused channels-last kernel launches (see the module docstring). The chain
    takes x in `input_layout` and returns `output_layout` ("NCL" [B, C, T] or "NLC" [B, T, C]); `out_dtype` is the
    dtype of the chain's result (Qwen: fp32 after the clamp); `precision` is used by every fp32 GEMM conv."""
    for name, lay in (("input_layout", input_layout), ("output_layout", output_layout)):
        if lay not in LAYOUTS:
            raise ConvBakeError(f"{name} must be one of {LAYOUTS}, got {lay!r}")
    toks = _tokens(items)
    steps: list[_Step] = []
    plan = ChainPlan()
    if input_layout == "NCL":
        steps.append(_Step(_Transpose(copy=True), "layout"))
        plan.steps.append("to_nlc")
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.kind in ("conv", "convT", "dw"):
            j = i + 1
            use_skip = j < len(toks) and toks[j].kind == "res_end"
            j += use_skip
            affine = None
            if j < len(toks) and toks[j].kind == "affine":
                affine, j = (toks[j].obj.scale, toks[j].obj.shift), j + 1
            need_pre = j < len(toks) and toks[j].kind == "res_begin" and t.kind != "dw"
            if need_pre and j + 1 < len(toks) and toks[j + 1].kind in ("snake", "act"):
                j += 1
            else:
                need_pre = False
            act, snake = "none", None
            if j < len(toks) and toks[j].kind == "snake":
                act, snake, j = "snake", toks[j].obj, j + 1
            elif j < len(toks) and toks[j].kind == "act":
                act, j = toks[j].obj, j + 1
            set_skip = None
            if not need_pre and j < len(toks) and toks[j].kind == "res_begin":
                set_skip, j = "out", j + 1  # the activated output itself is the next skip
            last = j >= len(toks)
            ep = dict(act=act, snake=snake, affine=affine, out_dtype=out_dtype if last else None)
            if t.kind == "conv":
                mod = KernelConv1d.from_conv(t.obj, write_pre=need_pre, precision=precision, **ep)
            elif t.kind == "convT":
                mod = KernelConvTranspose1d.from_conv(t.obj, write_pre=need_pre, precision=precision, **ep)
            else:
                mod = KernelDwConv1d.from_conv(t.obj, **ep)
            steps.append(_Step(mod, "kernel", use_skip=use_skip, set_skip=set_skip))
            parts = "".join(
                p
                for p, on in (
                    ("+skip", use_skip),
                    ("+affine", affine is not None),
                    (f"+{act}", act != "none"),
                    (", pre→skip", need_pre),
                    (", out→skip", set_skip is not None),
                )
                if on
            )
            plan.steps.append(f"{t.kind}({parts.lstrip(', ')})" if parts else t.kind)
            i = j
            continue
        if t.kind == "snake":
            steps.append(_Step(SnakeNLC.from_snake(t.obj), "snake"))
            plan.steps.append("snake")
        elif t.kind == "res_begin":
            steps.append(_Step(nn.Identity(), "set_skip"))
            plan.steps.append("set_skip")
        elif t.kind == "res_end":
            steps.append(_Step(nn.Identity(), "add_skip"))
            plan.steps.append("add_skip")
        elif t.kind == "affine":
            steps.append(_Step(_AffineMod(t.obj), "affine"))
            plan.steps.append("affine")
        elif t.kind == "act":
            steps.append(_Step(_ActMod(t.obj), "act"))
            plan.steps.append(f"act({t.obj})")
        else:
            op = t.obj
            steps.append(_Step(op.module if op.layout == "NLC" else _OpaqueNCL(op.module), "opaque"))
            plan.steps.append(f"opaque({op.layout})")
        i += 1
    if out_dtype is not None and not (steps and steps[-1].kind == "kernel"):
        steps.append(_Step(_ActMod("none", out_dtype), "cast"))
        plan.steps.append(f"cast({out_dtype})")
    if output_layout == "NCL":
        steps.append(_Step(_Transpose(copy=False), "layout"))
        plan.steps.append("to_ncl")
    return FusedConvChain(steps, plan, input_layout, output_layout)


# ------------------------------------------------------------------------------------------ graph check
CONV_OPS = ("conv1d", "conv1d_dual", "conv_transpose1d", "conv_transpose1d_dual", "dwconv1d")


@dataclass
class ConvGraphReport:
    """The ttsaot conv nodes of an exported graph (op names, in graph order) and its layout changes: a
    transpose/permute of a 3-D activation ([B, C, T] ↔ [B, T, C]) or a channels-last memory-format conversion,
    split into those before the first conv (`entry`), between the first and the last (`layout_changes`: what a
    channels-last stage must not have) and after the last (`exit`). Transposes inside attention (4-D heads) are not
    layout changes."""

    conv_ops: list[str]
    layout_changes: list[str]
    entry: list[str] = field(default_factory=list)
    exit: list[str] = field(default_factory=list)


def _is_layout_change(node: torch.fx.Node) -> bool:
    tgt = node.target
    if node.op != "call_function" or not hasattr(tgt, "__name__"):
        return False
    name = getattr(tgt, "_opname", None) or tgt.__name__.split(".")[0]
    val = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], torch.fx.Node) else None
    rank3 = val is not None and getattr(val, "dim", lambda: 0)() == 3
    if name in ("transpose", "permute", "t", "swapaxes", "movedim") and rank3:
        if name == "permute":
            return list(node.args[1]) != [0, 1, 2]
        if name == "transpose":
            return sorted(int(d) % 3 for d in node.args[1:3]) == [1, 2]
        return True
    if name in ("contiguous", "clone", "_to_copy", "to") and node.kwargs.get("memory_format") not in (
        None,
        torch.contiguous_format,
        torch.preserve_format,
    ):
        return True
    return False


def conv_graph_report(ep: torch.export.ExportedProgram | torch.fx.GraphModule) -> ConvGraphReport:
    """See ConvGraphReport. Takes the program as `torch.export` gives it (before any CPU lowering)."""
    gm = ep.graph_module if isinstance(ep, torch.export.ExportedProgram) else ep
    nodes = list(gm.graph.nodes)
    conv_idx = [
        i
        for i, n in enumerate(nodes)
        if n.op == "call_function"
        and getattr(n.target, "namespace", None) == "ttsaot"
        and getattr(n.target, "_opname", None) in CONV_OPS
    ]
    changes = [i for i, n in enumerate(nodes) if _is_layout_change(n)]
    names = [f"{n.name}: {n.target}" for n in nodes]
    if not conv_idx:
        return ConvGraphReport([], [], entry=[names[i] for i in changes])
    first, last = conv_idx[0], conv_idx[-1]
    return ConvGraphReport(
        [nodes[i].target._opname for i in conv_idx],
        [names[i] for i in changes if first < i < last],
        entry=[names[i] for i in changes if i < first],
        exit=[names[i] for i in changes if i > last],
    )


__all__ = [
    "CONV_OPS",
    "LAYOUTS",
    "Affine",
    "ChainPlan",
    "ConvGraphReport",
    "FusedConvChain",
    "KernelConv1d",
    "KernelConvNeXt",
    "KernelConvTranspose1d",
    "KernelDwConv1d",
    "Opaque",
    "Residual",
    "SnakeNLC",
    "conv_graph_report",
    "fuse_conv_chain",
]
