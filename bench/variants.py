"""The serving paths compared for each stage. A variant is set up once, then prepared per bucket (compile /
capture for that shape) and returns a callable taking the stage inputs in the StageSpec's order.

| name              | what                                                                                  |
|-------------------|---------------------------------------------------------------------------------------|
| eager_raw         | the faithful module (no passes), cast to the stage dtype                              |
| eager             | the module after the stage's passes (what is exported), cast to the stage dtype       |
| eager_graph       | `eager` captured by hand in a CUDA graph                                              |
| compile_graph     | torch.compile(max-autotune-no-cudagraphs) + manual CUDA graph capture (vLLM-Omni)     |
| compile_ro        | torch.compile(mode="reduce-overhead") (CUDA-graph trees)                              |
| ttsaot_nograph    | the built artifact, `load(..., cuda_graphs=False)`                                    |
| ttsaot_graph      | the built artifact, `load(...)` (AOTI + CUDA graph per bucket)                        |
| ttsaot_inductor   | `ttsaot_graph` of the same stage built with kernels="inductor" (Inductor's own code   |
|                   | where the other two run the kernel layer: `--kernels auto` is ttsaot on CUDA);        |
|                   | skipped on CUDA for a stage without kernel passes (artifacts.same_program_as_auto)    |
| ttsaot_kernels    | `ttsaot_graph` of the same stage built with kernels="ttsaot" (the Triton kernel layer |
|                   | where `auto` keeps Inductor's code: the codebook predictors); skipped where `auto`    |
|                   | already resolves to ttsaot (the same program)                                         |
| upstream_eager    | the upstream implementation with the same random weights, cast to the stage dtype     |
| upstream_compile  | upstream + torch.compile(max-autotune-no-cudagraphs) + manual CUDA graph              |
| loop_eager_host   | codebook predictors: eager forward per codebook step (KV cache) + eager sampling +   |
|                   | a host read of the codes per step (the reference loop; bench/predictor_loops.py)      |
| loop_compile_graph| codebook predictors: torch.compile'd step forward, one CUDA graph per step index,    |
|                   | eager sampling between replays, no host sync (vLLM-Omni; bench/predictor_loops.py)    |
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ttsaot.runtime.graphs import StaticGraph, new_pool

from .common import Skipped, as_tuple

# Cheap variants first: when a run is cut short by its budget, the expensive compiles are what is missing.
ALL_VARIANTS = (
    "eager_raw",
    "eager",
    "eager_graph",
    "ttsaot_nograph",
    "ttsaot_graph",
    "ttsaot_inductor",
    "ttsaot_kernels",
    "upstream_eager",
    "compile_graph",
    "compile_ro",
    "loop_eager_host",
    "loop_compile_graph",
    "upstream_compile",
)
CUDA_ONLY = {"eager_graph", "ttsaot_graph", "compile_ro", "loop_compile_graph"}
COMPILED = {"compile_graph", "compile_ro", "upstream_compile", "loop_compile_graph"}  # time-boxed by --compile-budget
TTSAOT = {"ttsaot_nograph", "ttsaot_graph", "ttsaot_inductor", "ttsaot_kernels"}
# the build's kernel choice (BuildOptions.kernels) of each ttsaot variant's artifact
VARIANT_KERNELS = {
    "ttsaot_nograph": "auto",
    "ttsaot_graph": "auto",
    "ttsaot_inductor": "inductor",
    "ttsaot_kernels": "ttsaot",
}
DEFAULT_CPU = ("eager_raw", "eager", "ttsaot_nograph")

Call = Callable[[list[torch.Tensor]], object]


@dataclass
class VariantContext:
    family: str
    stage: str
    spec: object  # StageSpec
    device: torch.device
    original: nn.Module  # faithful fp32 module on CPU
    rewritten: nn.Module  # after passes, fp32 on CPU
    artifact: Path | None
    artifact_error: str | None
    compile_mode: str = "max-autotune-no-cudagraphs"
    # kernels choice → (artifact, build error) for the choices other than "auto" (ttsaot_inductor, ttsaot_kernels)
    other_artifacts: dict[str, tuple[Path | None, str | None]] = field(default_factory=dict)

    def artifact_for(self, kernels: str) -> tuple[Path | None, str | None]:
        if kernels == "auto":
            return self.artifact, self.artifact_error
        return self.other_artifacts.get(kernels, (None, f"no artifact built with kernels={kernels!r}"))


def cast_module(module: nn.Module, ctx: VariantContext) -> nn.Module:
    from ttsaot.builder.passes import cast_to_compute_dtype

    return cast_to_compute_dtype(copy.deepcopy(module), ctx.spec.dtype).to(ctx.device).eval()


def capture_graph(fn: Callable, static_inputs: list[torch.Tensor], device: torch.device, pool=None) -> Call:
    """`fn(*static_inputs)` captured with the runtime's one graph primitive (runtime/graphs.py: warm-up on a side
    stream, capture into `pool`); the returned call copies its inputs into the static buffers and replays."""
    return StaticGraph(lambda xs: fn(*xs), static_inputs, device, pool)


class Variant:
    name = ""
    description = ""

    def __init__(self, ctx: VariantContext) -> None:
        self.ctx = ctx

    def setup(self) -> None: ...

    def prepare(self, sizes: dict[str, int], inputs: list[torch.Tensor]) -> Call:
        raise NotImplementedError

    def weight_bytes(self) -> int | None:
        return None

    def close(self) -> None: ...


class EagerVariant(Variant):
    def __init__(self, ctx, raw: bool, graph: bool, upstream: bool = False) -> None:
        super().__init__(ctx)
        self.raw, self.graph, self.upstream = raw, graph, upstream
        self.pool = None

    def _module(self) -> nn.Module:
        if self.upstream:
            from .upstream import upstream_module

            self.upstream_name, up = upstream_module(self.ctx.family, self.ctx.stage, self.ctx.original)
            # upstream runs its own way in low precision: the whole module cast (as its serving code does)
            return up.to(device=self.ctx.device, dtype=self.ctx.spec.dtype).eval()
        return cast_module(self.ctx.original if self.raw else self.ctx.rewritten, self.ctx)

    def setup(self) -> None:
        self.module = self._module()
        if self.graph:
            self.pool = new_pool()

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.module.state_dict().values())

    def prepare(self, sizes, inputs):
        if self.graph:
            return capture_graph(self.module, [x.clone() for x in inputs], self.ctx.device, self.pool)
        m = self.module
        return lambda xs: m(*xs)

    def close(self) -> None:
        self.module = None


class CompileVariant(EagerVariant):
    """torch.compile of the (passed) module; `manual_graph` captures the compiled callable in a CUDA graph
    per bucket (what vLLM-Omni does for its codec decoders)."""

    def __init__(self, ctx, mode: str, manual_graph: bool, upstream: bool = False) -> None:
        super().__init__(ctx, raw=False, graph=False, upstream=upstream)
        self.mode, self.manual_graph = mode, manual_graph

    def setup(self) -> None:
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        super().setup()
        self.compiled = torch.compile(self.module, mode=self.mode, dynamic=False)
        if self.manual_graph and self.ctx.device.type == "cuda":
            self.pool = new_pool()

    def prepare(self, sizes, inputs):
        c = self.compiled
        if self.manual_graph and self.ctx.device.type == "cuda":
            c(*inputs)  # compile (and autotune) on the default stream, outside the capture warm-up
            torch.cuda.synchronize(self.ctx.device)
            return capture_graph(c, [x.clone() for x in inputs], self.ctx.device, self.pool)
        if self.mode == "reduce-overhead":

            def run(xs):
                torch.compiler.cudagraph_mark_step_begin()
                return c(*xs)
        else:

            def run(xs):
                return c(*xs)

        for _ in range(3):  # compile + cudagraph-tree recording happen here, inside the time box
            run(inputs)
        return run

    def close(self) -> None:
        import torch._dynamo

        self.compiled = None
        super().close()
        torch._dynamo.reset()


class TtsaotVariant(Variant):
    def __init__(self, ctx, graphs: bool, kernels: str = "auto") -> None:
        super().__init__(ctx)
        self.graphs, self.kernels = graphs, kernels

    def setup(self) -> None:
        from ttsaot.runtime import load

        artifact, error = self.ctx.artifact_for(self.kernels)
        if artifact is None:
            raise Skipped(f"no artifact: {error}")
        self.stage = load(artifact, device=self.ctx.device, stages=[self.ctx.stage], cuda_graphs=self.graphs)[
            self.ctx.stage
        ]
        self.built_kernels = self.stage.entry.kernels  # what the manifest says the build ran

    def weight_bytes(self) -> int:
        return self.stage.weight_bytes

    def prepare(self, sizes, inputs):
        st = self.stage
        if self.ctx.spec.kind in ("lm_step", "lm_prefill") and hasattr(st, "new_cache"):
            return self._prepare_lm(sizes, inputs)
        self.api = "stage(*inputs)"
        return lambda xs: st(*xs)

    def _prepare_lm(self, sizes, inputs):
        """The serving API of LM stages (`lm_serving_call`)."""
        run, cache, self.api = lm_serving_call(self.stage, sizes, inputs)
        self.caches = getattr(self, "caches", []) + [cache]
        return run

    def close(self) -> None:
        self.caches = []
        self.stage = None


def lm_serving_call(st, sizes: dict[str, int], inputs) -> tuple[Call, object, str]:
    """An LM stage's serving API on one bucket's program inputs: (run(xs), its runtime-owned KVCache, the API's
    name). The cache (graphs captured per cache on CUDA) is filled with the inputs' cache contents, and the
    positions / lengths input becomes the call's control, so the outputs stay comparable with the plain call. A
    step's positions are restored before every call: every call decodes the same token. `run` takes the program
    inputs and passes the rows' own."""
    md = st.entry.metadata
    names = st.input_names
    k_idx, v_idx = (names.index(n) for n in md["cache_inputs"])
    step = st.entry.kind == "lm_step"
    ctl = names.index(md["position_input" if step else "length_input"])
    row_idx = [i for i in range(len(names)) if i not in (k_idx, v_idx, ctl)]
    cache = st.new_cache(sizes["batch"])
    if tuple(cache.k.shape) != tuple(inputs[k_idx].shape):
        raise Skipped(f"cache shape {tuple(cache.k.shape)} differs from the input's {tuple(inputs[k_idx].shape)}")
    cache.k.copy_(inputs[k_idx])
    cache.v.copy_(inputs[v_idx])
    control = inputs[ctl].detach().cpu().to(torch.int64)
    if step:

        def run(xs):
            cache.positions.copy_(control)
            return st.step(*[xs[i] for i in row_idx], cache=cache)

        return run, cache, "step(*row_inputs, cache=KVCache)"

    def run(xs):
        return st.prefill(*[xs[i] for i in row_idx], lengths=control, cache=cache)

    return run, cache, "prefill(*row_inputs, lengths=..., cache=KVCache)"


PREDICTOR_LOOPS = ("loop_eager_host", "loop_compile_graph")  # bench/predictor_loops.py


def applies(name: str, spec) -> bool:
    """Whether a variant means anything for this stage (the predictor loops exist for codebook predictors only);
    the harness does not record the ones that don't."""
    return name not in PREDICTOR_LOOPS or spec.kind == "codebook_predictor"


def make_variant(name: str, ctx: VariantContext) -> Variant:
    if name in CUDA_ONLY and ctx.device.type != "cuda":
        raise Skipped("needs CUDA")
    v: Variant
    if name == "eager_raw":
        v = EagerVariant(ctx, raw=True, graph=False)
    elif name == "eager":
        v = EagerVariant(ctx, raw=False, graph=False)
    elif name == "eager_graph":
        v = EagerVariant(ctx, raw=False, graph=True)
    elif name == "compile_graph":
        v = CompileVariant(ctx, ctx.compile_mode, manual_graph=True)
    elif name == "compile_ro":
        v = CompileVariant(ctx, "reduce-overhead", manual_graph=False)
    elif name == "ttsaot_nograph":
        v = TtsaotVariant(ctx, graphs=False)
    elif name == "ttsaot_graph":
        v = TtsaotVariant(ctx, graphs=True)
    elif name in ("ttsaot_inductor", "ttsaot_kernels"):  # graphs where there are any: on CPU the plain package call
        v = TtsaotVariant(ctx, graphs=ctx.device.type == "cuda", kernels=VARIANT_KERNELS[name])
    elif name == "upstream_eager":
        v = EagerVariant(ctx, raw=True, graph=False, upstream=True)
    elif name == "upstream_compile":
        v = CompileVariant(ctx, ctx.compile_mode, manual_graph=True, upstream=True)
    elif name in PREDICTOR_LOOPS:
        from .predictor_loops import make_loop_variant  # imports this module: import on use

        v = make_loop_variant(name, ctx)  # Skipped for a stage that is not a codebook_predictor
    else:
        raise KeyError(f"unknown variant {name!r} (known: {', '.join(ALL_VARIANTS)})")
    v.name = name
    return v


def first_output(out) -> torch.Tensor:
    return as_tuple(out)[0]
