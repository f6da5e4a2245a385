"""ONNX export of a stage: one model per stage, dynamic where the stage allows it (AOTI.md §7).

The module handed in is the one the AOTI packages are compiled from (faithful module → passes → compute dtype),
so both formats run the same rewritten graph. `torch.export` with `Dim`s built from the stage's bucket plan gives
one ONNX model for every size the AOTI buckets serve (1 … largest bucket, without padding) instead of one file
per bucket. An axis that the graph cannot keep symbolic (a constraint violation at export) falls back to a static
size, the largest bucket: a consumer pads it as the ttsaot runtime does (the I/O descriptors' `pad`).

Custom ops are lowered to standard ONNX ops (default domain only, so no consumer needs a custom-op library):
`ONNX_TRANSLATIONS` maps an OpOverload to an onnxscript function (`register_onnx_translation`), and
`ONNX_DECOMPOSITIONS` maps one to an aten decomposition, used when no translation exists. Any other custom op
fails the export with its name.

Optional dependency: onnx, onnxscript (the `onnx` extra). The runtime never imports this module."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .buckets import BucketPlan
from .dynamic_shapes import DynamicExportError, export_dynamic, first_line, plan_ranges, range_record
from .kernels.snake_beta import CPU_DECOMPOSITIONS
from .stage_spec import StageSpec

# torchlib implements the aten ops at opset 18 and the exporter writes 20 by default; bf16/fp16 Conv, Sin, ...
# are only valid ONNX from opset 22 (onnx.checker rejects `Conv` on bfloat16 at 20), so low-precision graphs
# are written at 22.
FP32_OPSET = 20
LOW_PRECISION_OPSET = 22
# Initializers above this total go to `<file>.data` (external data); the protobuf limit is 2 GiB per file.
EXTERNAL_DATA_THRESHOLD = 64 << 20
EXTERNAL_TENSOR_MIN_BYTES = 1024  # smaller tensors stay inline even in external-data models
STANDARD_DOMAINS = ("", "ai.onnx")
# torch's ONNX optimizer runs onnxscript's pattern rewriter, whose cost grows with graph size × rules: on the
# unrolled 15-step code predictor (~3200 nodes) it took ~60% of a 20-minute export on a loaded 2-core machine.
# Above this many nodes only the cheap passes run (constant folding, dead code, CSE, initializer dedup).
FULL_OPTIMIZE_MAX_NODES = 1500

ONNX_TRANSLATIONS: dict[Any, Callable] = {}
ONNX_DECOMPOSITIONS: dict[Any, Callable] = dict(CPU_DECOMPOSITIONS)


class OnnxExportError(RuntimeError):
    """The ONNX export of one stage failed (unsupported op, checker failure, ...)."""


def register_onnx_translation(op) -> Callable[[Callable], Callable]:
    """Register an onnxscript translation for a custom op (an OpOverload such as
    `torch.ops.ns.name.default`): `fn(*op_args)` builds standard ONNX ops and returns the output value(s)."""

    def deco(fn: Callable) -> Callable:
        ONNX_TRANSLATIONS[op] = fn
        return fn

    return deco


def register_onnx_decomposition(op, fn: Callable) -> None:
    """Fallback for a custom op without a translation: decompose it into aten ops before the ONNX export."""
    ONNX_DECOMPOSITIONS[op] = fn


def default_opset(dtype: torch.dtype) -> int:
    return FP32_OPSET if dtype in (torch.float32, torch.float64) else LOW_PRECISION_OPSET


# ------------------------------------------------------------------------------------- translations
def _snake_beta_onnx(x, alpha, inv_beta):
    """y = x + inv_beta·sin²(alpha·x), in fp32 whatever x's dtype (the kernel's math), cast back to x's dtype.
    x [B,C,T]; alpha, inv_beta [C] (fp32 after the bake pass)."""
    from onnxscript import ir
    from onnxscript import opset18 as op

    f32 = ir.DataType.FLOAT
    xdt = x.dtype
    low = xdt is not None and xdt != f32
    xf = op.Cast(x, to=f32) if low else x
    a = alpha if alpha.dtype in (None, f32) else op.Cast(alpha, to=f32)
    ib = inv_beta if inv_beta.dtype in (None, f32) else op.Cast(inv_beta, to=f32)
    axes = op.Constant(value_ints=[0, 2])
    s = op.Sin(op.Mul(xf, op.Unsqueeze(a, axes)))
    y = op.Add(xf, op.Mul(op.Unsqueeze(ib, axes), op.Mul(s, s)))
    return op.Cast(y, to=xdt) if low else y


register_onnx_translation(torch.ops.ttsaot.snake_beta.default)(_snake_beta_onnx)


# ------------------------------------------------------------------------------------------ export
@dataclass
class OnnxResult:
    path: Path
    external_data: list[Path]
    opset: int
    dynamic_axes: dict[str, dict[str, int]]  # axis → {min, max}
    static_axes: dict[str, int]  # axes fixed at their largest bucket (consumer pads)
    ops: list[str]
    custom_ops: dict[str, str]  # custom op → "translation" | "decomposition"
    seconds: float
    notes: list[str] = field(default_factory=list)
    updated_inputs: dict[str, str] = field(default_factory=dict)  # extra output → the input it updates


def axis_ranges(plan: BucketPlan) -> dict[str, tuple[int, int]]:
    """Axes with more than one bucket size become dynamic over [1, largest bucket]: the AOTI stage serves every
    size in that range (padding up to a bucket), so the ONNX model covers the same range. Single-size axes stay
    static (nothing to choose between)."""
    return plan_ranges(plan.axes, low=1)


def _custom_ops(ep: torch.export.ExportedProgram) -> list:
    found = []
    for node in ep.graph.nodes:
        t = node.target
        if node.op == "call_function" and isinstance(t, torch._ops.OpOverload):
            ns = t.namespace
            if ns not in ("aten", "prims", "_operator") and t not in found:
                found.append(t)
    return found


def export_program(
    module: nn.Module, spec: StageSpec, example: dict[str, torch.Tensor], dyn: dict[str, tuple]
) -> tuple[torch.export.ExportedProgram, dict[str, tuple], list[str]]:
    """torch.export with as many plan axes dynamic as the graph allows (builder/dynamic_shapes.py; an axis that
    fails stays static at its largest bucket)."""
    args = tuple(example[n] for n in spec.input_names)

    def export(shapes):
        if shapes is not None and isinstance(module, _ReturnUpdated):
            shapes = (tuple(shapes),)  # forward(*args): one varargs parameter
        with torch.no_grad():
            return torch.export.export(module, args, dynamic_shapes=shapes, strict=False)

    try:
        res = export_dynamic(export, spec.inputs, spec.plan.axes, dyn, spec.name)
    except DynamicExportError as e:
        raise OnnxExportError(str(e)) from e
    notes: list[str] = []
    if res.dropped:
        notes.append(f"axes {res.dropped} cannot be dynamic in this graph ({res.reason}); static at the largest bucket")
    sub = res.dynamic
    if any(len(r) > 2 for r in sub.values()):
        notes.append(
            f"axes dynamic in steps { ({a: r[2] for a, r in sub.items() if len(r) > 2}) }: pad inputs to a multiple"
        )
    return res.program, sub, notes


def _lower_custom_ops(ep: torch.export.ExportedProgram, stage: str):
    table: dict[Any, Callable] = {}
    decomp: dict[Any, Callable] = {}
    how: dict[str, str] = {}
    for op in _custom_ops(ep):
        if op in ONNX_TRANSLATIONS:
            table[op] = ONNX_TRANSLATIONS[op]
            how[str(op)] = "translation"
        elif op in ONNX_DECOMPOSITIONS:
            decomp[op] = ONNX_DECOMPOSITIONS[op]
            how[str(op)] = "decomposition"
        else:
            raise OnnxExportError(
                f"{stage}: custom op {op} has no ONNX lowering; register one with "
                "ttsaot.builder.onnx_export.register_onnx_translation (onnxscript, standard ops) or "
                "register_onnx_decomposition (aten)"
            )
    if decomp:
        ep = ep.run_decompositions(decomp)
    return ep, table, how


def mutated_inputs(ep: torch.export.ExportedProgram, names: list[str]) -> list[str]:
    """Inputs the program writes in place (KV caches: `index_put_`). Functionalizing reveals them; only done
    when the graph has a mutable op at all (re-tracing costs seconds)."""
    if not any(
        n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
        for n in ep.graph.nodes
    ):
        return []
    sig = ep.run_decompositions({}).graph_signature
    placeholders = list(sig.user_inputs)
    written = set(sig.user_inputs_to_mutate.values())
    return [names[i] for i, p in enumerate(placeholders) if p in written]


class _ReturnUpdated(nn.Module):
    """ONNX graphs are functional and the exporter drops writes into graph inputs: copy the written inputs and
    return them after the stage's outputs (`<input>_out`), so a consumer feeds them back on the next call."""

    def __init__(self, inner: nn.Module, positions: list[int]) -> None:
        super().__init__()
        self.inner, self.positions = inner, positions

    def forward(self, *args):
        args = tuple(a.clone() if i in self.positions else a for i, a in enumerate(args))
        out = self.inner(*args)
        out = out if isinstance(out, tuple) else (out,)
        return (*out, *(args[i] for i in self.positions))


def optimize_model(model, mode: str = "auto") -> str:
    """In place. "full": torch's optimizer (folding + pattern rewrites + fusions); "light": folding and
    cleanup only; "auto": full up to FULL_OPTIMIZE_MAX_NODES nodes. Returns the mode used."""
    import onnx_ir.passes.common as common_passes
    import onnxscript.optimizer as oopt
    from onnxscript._framework_apis.torch_2_8 import optimize as torch_optimize

    if mode == "auto":
        mode = "full" if len(list(model.graph)) <= FULL_OPTIMIZE_MAX_NODES else "light"
    if mode == "full":
        torch_optimize(model)
    elif mode == "light":
        oopt.inline(model)
        oopt.fold_constants_ir(model)
        oopt.remove_unused_nodes(model)
        for p in (
            common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
            common_passes.DeduplicateInitializersPass(),
            common_passes.CommonSubexpressionEliminationPass(),
            common_passes.RemoveUnusedNodesPass(),
        ):
            p(model)
    elif mode != "none":
        raise ValueError(f"optimize mode {mode!r}: full, light, auto or none")
    return mode


def example_sizes(spec: StageSpec) -> dict[str, int]:
    """The largest bucket: dynamic dims need example sizes ≥ 2 (0/1 specialization), static ones their max."""
    return {a: max(sizes) for a, sizes in spec.plan.axes.items()}


def export_stage_onnx(
    spec: StageSpec,
    module: nn.Module,
    out_path: str | Path,
    seed: int = 0,
    opset: int | None = None,
    external_threshold: int = EXTERNAL_DATA_THRESHOLD,
    check: bool = True,
    optimize: str = "auto",
) -> OnnxResult:
    """Export `module` (the rewritten, compute-dtype module of `spec`) to `out_path` (+ `<name>.data` when the
    initializers exceed `external_threshold` bytes). Runs onnx.checker (full check) on the written file."""
    import onnx
    from onnxscript import ir

    t0 = time.time()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    opset = opset or default_opset(spec.dtype)
    module = module.eval()
    dev = next(itertools.chain(module.parameters(), module.buffers()), torch.empty(0)).device
    sizes = example_sizes(spec)
    example = {k: v.to(dev) for k, v in spec.make_inputs(sizes, torch.Generator().manual_seed(seed)).items()}
    ep, dyn, notes = export_program(module, spec, example, axis_ranges(spec.plan))
    updated = mutated_inputs(ep, spec.input_names)
    if updated:
        wrapped = _ReturnUpdated(module, [spec.input_names.index(n) for n in updated]).eval()
        ep, _, _ = export_program(wrapped, spec, example, dyn)
        notes.append(f"inputs written in place {updated} are returned as extra outputs")
    ep, table, how = _lower_custom_ops(ep, spec.name)
    out_names = [d["name"] for d in spec.outputs] + [f"{n}_out" for n in updated]
    try:
        prog = torch.onnx.export(
            ep,
            tuple(example[n] for n in spec.input_names),
            dynamo=True,
            input_names=spec.input_names,
            output_names=out_names,
            opset_version=opset,
            custom_translation_table=table or None,
            optimize=False,
            verbose=False,
        )
    except Exception as e:  # noqa: BLE001
        raise OnnxExportError(f"{spec.name}: torch.onnx.export failed: {type(e).__name__}: {first_line(e)}") from e
    model = prog.model
    mode = optimize_model(model, optimize)
    if mode != "full":
        notes.append(f"optimizer: {mode} ({len(list(model.graph))} nodes)")
    if len(model.graph.outputs) != len(out_names):
        raise OnnxExportError(
            f"{spec.name}: the ONNX graph has {len(model.graph.outputs)} outputs, the stage declares {len(out_names)}"
        )
    # Name the symbolic dims after the plan axes ("batch", "frames") instead of torch's s0, s1.
    rename: dict[Any, str] = {}
    for value, desc in zip(model.graph.inputs, spec.inputs):
        for d, s in enumerate(desc["shape"]):
            if isinstance(s, str) and s in dyn and len(dyn[s]) == 2 and value.shape is not None:
                dim = value.shape[d]
                if isinstance(dim, ir.SymbolicDim) and dim.value and dim.value.isidentifier() and dim.value != s:
                    rename[dim.value] = s
    if rename:
        prog.rename_axes(rename)
    ops, domains = set(), set()
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        ops.add(node.op_type)
        domains.add(node.domain)
    odd = sorted(d for d in domains if d not in STANDARD_DOMAINS)
    if odd or model.functions:
        raise OnnxExportError(
            f"{spec.name}: the ONNX graph uses non-standard domains {odd or '(functions)'}; "
            "every custom op must lower to standard ONNX ops"
        )
    init_bytes = sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)
    data_path = out_path.with_name(out_path.name + ".data")
    for p in (out_path, data_path):
        p.unlink(missing_ok=True)
    if init_bytes > external_threshold:
        ir.save(model, out_path, external_data=data_path.name, size_threshold_bytes=EXTERNAL_TENSOR_MIN_BYTES)
    else:
        ir.save(model, out_path)
    if data_path.exists() and data_path.stat().st_size == 0:
        data_path.unlink()  # every tensor stayed inline (each below EXTERNAL_TENSOR_MIN_BYTES)
    external = [data_path] if data_path.exists() else []
    if check:
        try:
            onnx.checker.check_model(str(out_path), full_check=True)
        except Exception as e:  # noqa: BLE001
            raise OnnxExportError(f"{spec.name}: onnx.checker rejected the exported model: {first_line(e)}") from e
    static = {a: max(s) for a, s in spec.plan.axes.items() if a not in dyn}
    return OnnxResult(
        path=out_path,
        external_data=external,
        opset=opset,
        dynamic_axes={a: range_record(r) for a, r in dyn.items()},
        static_axes=static,
        ops=sorted(ops),
        custom_ops=how,
        seconds=time.time() - t0,
        notes=notes,
        updated_inputs={f"{n}_out": n for n in updated},
    )


def manifest_entry(result: OnnxResult, root: Path) -> dict:
    """The stage's `onnx` field (artifacts/README.md): files relative to the artifact root, with sha256."""
    from ..runtime.artifact import sha256_of

    def entry(p: Path) -> dict:
        return {"file": p.relative_to(root).as_posix(), "sha256": sha256_of(p), "bytes": p.stat().st_size}

    return {
        **entry(result.path),
        "opset": result.opset,
        "external_data": [entry(p) for p in result.external_data],
        "dynamic_axes": result.dynamic_axes,
        "static_axes": result.static_axes,
        "ops": result.ops,
        "custom_ops": result.custom_ops,
        "updated_inputs": result.updated_inputs,
    }
