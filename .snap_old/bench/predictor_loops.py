"""Per-step loop baselines for the codebook-predictor stages, timed next to the ttsaot artifact, which runs a whole
frame (every codebook step + sampling) as one graph.

- `loop_eager_host`: the eager reference loop. Per codebook step one eager forward of the predictor transformer
  (static KV cache, one new position per step: no re-prefill), the step's logits sampled with plain torch ops,
  and the host reading the sampled codes (`.tolist()`, a device sync) before the next step, as the reference's
  Python loop does.
- `loop_compile_graph`: the vLLM-Omni pattern. The same per-step forward compiled with torch.compile
  (`ctx.compile_mode`, fixed shapes) and captured in one CUDA graph per codebook step index, replayed per step;
  sampling runs eagerly between the replays, with no host sync.

Both loops run the stage module's own submodules (decoder blocks, embeddings, heads, after the stage's passes, in
the stage dtype; a family's `StepAdapter` in bench/families/ says which) and `builder/predictor.py` on the stage's
explicit noise, so their codes are the stage's codes (bitwise in fp32 up to attention rounding; bf16 may differ a
little).

Step 1 decodes positions 0 and 1 with `DecoderBlock.forward` (causal, no past), exactly as `decode()`; every later
step s writes position s of a preallocated KV cache and attends over the whole cache with a visibility mask. The
position (and any per-step head / embedding tables) are tensor inputs, so one compiled program serves every step
≥ 2 (two compiles per batch size instead of one per step), while each step index still gets its own CUDA graph
with its own static inputs."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ttsaot.runtime.graphs import new_pool

from .common import Skipped
from .variants import PREDICTOR_LOOPS, Variant, VariantContext, capture_graph, cast_module

# Keys of the KV cache are padded to a multiple of this many positions (never visible: masked) so the attention
# mask's last dimension meets the alignment the fused SDPA kernels want; the extra keys cost nothing measurable.
_KEY_ALIGN = 16

Step = Callable[..., torch.Tensor]
Capture = Callable[..., Callable[[list[torch.Tensor]], torch.Tensor]]


# ------------------------------------------------------------------------------------------ the protocol
class StepAdapter:
    """What differs between the predictors (each family module implements one). The transformer is the module's
    own `DecoderBlock`s."""

    first_input = ""  # the input carrying code 0 (or the token it comes from)
    layers: nn.ModuleList
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    n_steps: int  # sampled codebooks (steps 1..n_steps)

    @property
    def dtype(self) -> torch.dtype:
        return self.norm_weight().dtype

    def norm_weight(self) -> torch.Tensor:
        raise NotImplementedError

    def code0(self, first: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def prefix(self, hidden: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """Rows of positions 0 and 1: [B,2,D]."""
        raise NotImplementedError

    def embed_weights(self, step: int) -> tuple[torch.Tensor, ...]:
        """Step-specific tables read by `embed` at step ≥ 2 (passed as tensor inputs: one program for all steps)."""
        return ()

    def head_weights(self, step: int) -> tuple[torch.Tensor, ...]:
        return ()

    def embed(self, code: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        """Input row of step s ≥ 2 from code s−1: [B,1,D]."""
        raise NotImplementedError

    def head(self, h: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        """Logits of a step from the last position's hidden state [B,D] (final norm included)."""
        raise NotImplementedError

    def outputs(self, named: dict[str, torch.Tensor], codes: list[torch.Tensor]):
        raise NotImplementedError


def adapter_for(ctx: VariantContext, module: nn.Module) -> StepAdapter:
    """The family's StepAdapter of this stage around `module` (the stage module, cast to its dtype)."""
    from .families import bench_family

    make = bench_family(ctx.family).step_loops.get(ctx.stage)
    if make is None:
        raise Skipped(f"no per-step loop for {ctx.family}/{ctx.stage}")
    return make(module)


# ------------------------------------------------------------------------------------------ step programs
class PredictorSteps:
    """The two per-step programs, pure functions of their tensor arguments (the KV cache is written in place):

    first_step(hidden, first, *kv) → logits of step 1 (positions 0, 1)
    next_step(code, pos, *embed_weights, *head_weights, *kv) → logits of step `pos` (code = code pos−1)

    `kv` = k0, v0, k1, v1, … per layer, each [B, Hkv, keys, hd]. Stateless apart from the module, so one compiled
    callable of each serves every loop (batch size) of a variant."""

    def __init__(self, adapter: StepAdapter) -> None:
        self.a = adapter
        self.n_layers = len(self.a.layers)
        self.positions = self.a.n_steps + 1  # positions 0..n_steps
        self.keys = math.ceil(self.positions / _KEY_ALIGN) * _KEY_ALIGN
        self.n_embed_w = len(self.a.embed_weights(2))
        self.n_head_w = len(self.a.head_weights(2))

    def first_step(self, hidden: torch.Tensor, first: torch.Tensor, *kv: torch.Tensor) -> torch.Tensor:
        x = self.a.prefix(hidden, first)
        cos, sin = self.a.rope_cos[0:2], self.a.rope_sin[0:2]
        for i, layer in enumerate(self.a.layers):
            x, (k, v) = layer(x, cos, sin, None)  # the stage's own block, causal over positions 0 and 1
            kv[2 * i][:, :, 0:2].copy_(k)
            kv[2 * i + 1][:, :, 0:2].copy_(v)
        return self.a.head(x[:, -1], *self.a.head_weights(1))

    def next_step(self, code: torch.Tensor, pos: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
        ne, nh = self.n_embed_w, self.n_head_w
        embed_w, head_w, kv = tensors[:ne], tensors[ne : ne + nh], tensors[ne + nh :]
        x = self.a.embed(code, *embed_w)
        cos, sin = self.a.rope_cos.index_select(0, pos), self.a.rope_sin.index_select(0, pos)
        visible = (torch.arange(self.keys, device=x.device) <= pos).view(1, 1, 1, self.keys)
        for i, layer in enumerate(self.a.layers):
            x = _block_at(layer, x, cos, sin, kv[2 * i], kv[2 * i + 1], pos, visible)
        return self.a.head(x[:, -1], *head_w)

    def step_tensors(self, step: int) -> tuple[torch.Tensor, ...]:
        return (*self.a.embed_weights(step), *self.a.head_weights(step))


def _block_at(
    layer: nn.Module,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pos: torch.Tensor,
    visible: torch.Tensor,
) -> torch.Tensor:
    """`DecoderBlock.forward` for one new position with a static cache: the block's own submodules, the new k/v
    written at `pos`, attention over every cached key with future/padding keys masked out (zero-initialised
    cache: masked keys are finite, so they weigh exactly zero)."""
    q, k, v = layer.self_attn.project_qkv(layer.input_layernorm(x))
    q, k = layer.rope(q, cos, sin), layer.rope(k, cos, sin)
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, v)
    x = x + layer.self_attn.attend(q, k_cache, v_cache, visible)
    return x + layer.mlp(layer.post_attention_layernorm(x))


# ----------------------------------------------------------------------------------------------- the loop
class PredictorLoop:
    """One batch size: the KV cache and per-step position tensors, and the frame loop over step callables."""

    def __init__(self, steps: PredictorSteps, input_names: Sequence[str], batch: int, device: torch.device) -> None:
        self.steps, self.names, self.batch, self.device = steps, list(input_names), batch, torch.device(device)
        a = steps.a
        attn = a.layers[0].self_attn
        shape = (batch, attn.n_kv_heads, steps.keys, attn.head_dim)
        self.kv = [torch.zeros(shape, dtype=a.dtype, device=self.device) for _ in range(2 * steps.n_layers)]
        self.pos = {s: torch.tensor([s], dtype=torch.int64, device=self.device) for s in range(2, a.n_steps + 1)}

    def direct(self, first_fn: Step, next_fn: Step) -> list[Callable[..., torch.Tensor]]:
        """Step callables that call `first_fn` / `next_fn` (eager or compiled) directly."""
        kv = self.kv
        out: list[Callable[..., torch.Tensor]] = [lambda hidden, first: first_fn(hidden, first, *kv)]
        for s in range(2, self.steps.a.n_steps + 1):
            extra = (self.pos[s], *self.steps.step_tensors(s))
            out.append(lambda code, extra=extra: next_fn(code, *extra, *kv))
        return out

    def graphed(
        self, first_fn: Step, next_fn: Step, inputs: Sequence[torch.Tensor], capture: Capture = capture_graph, pool=None
    ) -> list[Callable[..., torch.Tensor]]:
        """Step callables replaying one captured graph per step index (captured in step order, sharing `pool`).
        Static inputs: a copy of the bucket's hidden/first inputs for step 1, one code buffer for the others;
        positions, step tables and the KV cache are the same tensors at every replay (never copied)."""
        named = dict(zip(self.names, inputs))
        hidden, first = named["hidden"].clone(), named[self.steps.a.first_input].clone()
        kv = self.kv
        g1 = capture(first_fn, [hidden, first, *kv], self.device, pool)
        out: list[Callable[..., torch.Tensor]] = [lambda h, f: g1([h, f, *kv])]
        code_buf = torch.zeros(self.batch, dtype=torch.int64, device=self.device)  # a valid id for every table
        for s in range(2, self.steps.a.n_steps + 1):
            rest = [self.pos[s], *self.steps.step_tensors(s), *kv]
            g = capture(next_fn, [code_buf, *rest], self.device, pool)
            out.append(lambda code, g=g, rest=rest: g([code, *rest]))
        return out

    def run(self, xs: Sequence[torch.Tensor], step_fns: Sequence[Callable[..., torch.Tensor]], host_sync: bool):
        """One frame: step 1, then per step: sample its logits (eager, the stage's noise and parameters), feed
        the code to the next step. Returns the stage's outputs (codes[, next embedding])."""
        # on use: every `python -m bench` process imports this module (the family tables), and the builder pulls in
        # Triton and the kernel layer (2 s), which the cold-start child must not count as its start-up
        from ttsaot.builder.predictor import sample

        named = dict(zip(self.names, xs))
        a = self.steps.a
        first = named[a.first_input]
        noise, temperature, top_k, top_p = (named[n] for n in ("noise", "temperature", "top_k", "top_p"))
        codes = [a.code0(first)]
        host_codes: list[list[int]] = []
        for s in range(1, a.n_steps + 1):
            logits = step_fns[0](named["hidden"], first) if s == 1 else step_fns[s - 1](codes[-1])
            code = sample(logits, noise[:, s - 1], temperature, top_k, top_p)
            if host_sync:
                host_codes.append(code.tolist())  # the reference loop reads every code on the host
            codes.append(code)
        return a.outputs(named, codes)


# ---------------------------------------------------------------------------------------------- variants
def _raise_recompile_limits() -> None:
    """One compile per (program, batch size): a throughput sweep over many batch sizes must not fall back to
    eager silently when Dynamo's per-function limit is reached."""
    import torch._dynamo

    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 64))
    for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 1024))


class _LoopVariant(Variant):
    def __init__(self, ctx: VariantContext) -> None:
        if getattr(ctx.spec, "kind", None) != "codebook_predictor":
            raise Skipped("only for codebook_predictor stages")
        super().__init__(ctx)
        self.loops: list[PredictorLoop] = []

    def setup(self) -> None:
        self.module = cast_module(self.ctx.rewritten, self.ctx)
        self.steps = PredictorSteps(adapter_for(self.ctx, self.module))

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.module.state_dict().values())

    def _loop(self, inputs: Sequence[torch.Tensor]) -> PredictorLoop:
        batch = int(inputs[self.ctx.spec.input_names.index("hidden")].shape[0])
        loop = PredictorLoop(self.steps, self.ctx.spec.input_names, batch, self.ctx.device)
        self.loops.append(loop)  # keeps caches (and graphs' static inputs) alive for the variant's lifetime
        return loop

    def close(self) -> None:
        self.loops = []
        self.module = self.steps = None


class LoopEagerHostVariant(_LoopVariant):
    """(a) eager forward per step + eager sampling + a host read of every step's codes."""

    def prepare(self, sizes, inputs):
        loop = self._loop(inputs)
        fns = loop.direct(self.steps.first_step, self.steps.next_step)
        self.api = "eager step forward + eager sampling + host read per codebook step"
        return lambda xs: loop.run(xs, fns, host_sync=True)


class LoopCompileGraphVariant(_LoopVariant):
    """(b) torch.compile'd step programs, one CUDA graph per step index, eager sampling between replays.

    `compile_backend` (tests: "eager"/"aot_eager" on CPU) replaces Inductor; `use_graphs` / `capture` let a CPU
    test run the graph plumbing with a stand-in for `capture_graph`."""

    compile_backend: str | None = None

    def setup(self) -> None:
        super().setup()
        _raise_recompile_limits()
        kw = {"backend": self.compile_backend} if self.compile_backend else {"mode": self.ctx.compile_mode}
        self.first_fn = torch.compile(self.steps.first_step, dynamic=False, **kw)
        self.next_fn = torch.compile(self.steps.next_step, dynamic=False, **kw)
        self.use_graphs = self.ctx.device.type == "cuda"
        self.capture: Capture = capture_graph
        self.pool = new_pool() if self.use_graphs else None

    def prepare(self, sizes, inputs):
        loop = self._loop(inputs)
        direct = loop.direct(self.first_fn, self.next_fn)
        loop.run(inputs, direct, host_sync=False)  # compile + autotune here, on the default stream, not in a capture
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)
        if not self.use_graphs:
            self.api = "compiled step programs + eager sampling (no graphs)"
            return lambda xs: loop.run(xs, direct, host_sync=False)
        fns = loop.graphed(self.first_fn, self.next_fn, inputs, self.capture, self.pool)
        self.api = (
            f"torch.compile({self.ctx.compile_mode}) step programs, one CUDA graph per codebook step "
            "index, eager sampling between replays"
        )
        return lambda xs: loop.run(xs, fns, host_sync=False)

    def close(self) -> None:
        import torch._dynamo

        self.first_fn = self.next_fn = None
        super().close()
        torch._dynamo.reset()


def make_loop_variant(name: str, ctx: VariantContext) -> Variant:
    if name == "loop_eager_host":
        return LoopEagerHostVariant(ctx)
    if name == "loop_compile_graph":
        return LoopCompileGraphVariant(ctx)
    raise KeyError(f"unknown loop variant {name!r} (known: {', '.join(PREDICTOR_LOOPS)})")
