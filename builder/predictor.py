"""What the two codebook predictors (Fish `fast_ar`, Qwen `code_predictor`) share: the sampler traced into their
graphs, the unrolled per-frame loop, their noise and sampling-parameter inputs, golden cases between batch
buckets, and how decided each reference draw was (the near-tie margins the golden check allows differences at).

Sampling (`sample`, its semantics and the kernel-layer op `ttsaot::sample_tokens`: kernels/sample.py): pure tensor
functions with static shapes and no host synchronisation, no `multinomial`, no boolean-mask indexing: they are
traced into the exported programs and run unchanged in eager mode, so the artifact and the eager reference compute
the same thing. The runtime never calls them: it only draws the noise."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from .kernels.decode_attention import attention_workspace, supports_head_dim
from .kernels.decode_modules import KernelAttention, KernelLinear, KernelSwiGLU
from .kernels.qkv_attention import enabled as qkv_attention_enabled
from .kernels.sample import gumbel, sample, support_mask
from .layers.norms import RMSNorm
from .layers.transformer import DecoderBlock


def kept_distribution(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """The distribution `sample` draws from (rows with temperature > 0): softmax(scaled) over the kept set."""
    x = logits.float()
    scaled = x / temperature.float().clamp(min=1e-30)[:, None]
    keep = support_mask(scaled, top_k, top_p)
    return torch.softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)


def draw_margin(
    logits: torch.Tensor, uniforms: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """How decided `sample`'s draw is, per row [B] fp32: the gap between the two best scores it takes the argmax
    of (scaled logits + Gumbel noise over the kept set; the logits for greedy rows), relative to the row's largest
    |scaled logit|. The noise is the same exact input for the artifact and the reference; only the logits carry
    rounding error, relative to their size: where this margin is below the stage's relative tolerance, a
    compiled stage within that tolerance may draw the other code (a near-tie); elsewhere it must not."""
    x = logits.float()
    t = temperature.float()
    greedy = t <= 0
    scaled = x / torch.where(greedy, torch.ones_like(t), t)[:, None]
    keep = support_mask(scaled, top_k, top_p)
    noisy = torch.where(greedy[:, None], x, scaled + gumbel(uniforms))
    scores = torch.where(keep | greedy[:, None], noisy, torch.full_like(noisy, float("-inf")))
    top2 = scores.topk(2, dim=-1).values
    gap = top2[:, 0] - top2[:, 1]  # +inf where only one token is kept: decided
    scale = torch.where(greedy[:, None], x, scaled).abs().amax(dim=-1).clamp_min(torch.finfo(torch.float32).tiny)
    return gap / scale


# ------------------------------------------------------------------------------------------ the frame loop
Pick = Callable[[int, torch.Tensor], torch.Tensor]  # (step, logits [B,V]) → code [B]


def traced_sampler(
    noise: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, kernel: bool = False
) -> Pick:
    """The `pick` of an exported predictor: step s draws with the noise of sampled codebook s (noise [B,S,V]).
    `kernel`: each draw is one `ttsaot::sample_tokens` node (the kernel layer's builds) instead of its aten ops."""

    def pick(step: int, logits: torch.Tensor) -> torch.Tensor:
        if kernel:
            return torch.ops.ttsaot.sample_tokens(logits, noise[:, step - 1], temperature, top_k, top_p)
        return sample(logits, noise[:, step - 1], temperature, top_k, top_p)

    return pick


def unrolled_frame(
    layers: Sequence[nn.Module],
    rope_cos: torch.Tensor,
    rope_sin: torch.Tensor,
    x: torch.Tensor,
    n_steps: int,
    logits_at: Callable[[int, torch.Tensor], torch.Tensor],
    feed: Callable[[int, torch.Tensor], torch.Tensor | None],
    pick: Pick,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One frame of a codebook predictor, unrolled with an explicit KV cache: x [B,T0,D] holds the first positions
    (the backbone hidden and code 0's row) and goes through the decoder blocks causally; then, per step s = 1..n,
    `logits_at(s, last hidden)` → `pick` → code s, and `feed(s, code)` gives the next position's input ([B,1,D];
    None after the last step). The reference re-prefills the whole buffer every step; with the cache each step
    runs one position, so the whole frame is one exported program. Returns the codes and logits of the steps."""
    if isinstance(layers[0].self_attn, KernelAttention):
        return _unrolled_frame_kernels(layers, rope_cos, rope_sin, x, n_steps, logits_at, feed, pick)
    caches: list[Any] = [None] * len(layers)
    codes, all_logits, pos = [], [], 0
    for step in range(1, n_steps + 1):
        T = x.shape[1]
        cos, sin = rope_cos[pos : pos + T], rope_sin[pos : pos + T]
        for i, layer in enumerate(layers):
            x, caches[i] = layer(x, cos, sin, caches[i])
        pos += T
        logits = logits_at(step, x[:, -1])
        code = pick(step, logits)
        codes.append(code)
        all_logits.append(logits)
        nxt = feed(step, code)
        if nxt is not None:
            x = nxt
    return codes, all_logits


def _unrolled_frame_kernels(
    layers: Sequence[nn.Module],
    rope_cos: torch.Tensor,
    rope_sin: torch.Tensor,
    x: torch.Tensor,
    n_steps: int,
    logits_at: Callable[[int, torch.Tensor], torch.Tensor],
    feed: Callable[[int, torch.Tensor], torch.Tensor | None],
    pick: Pick,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """`unrolled_frame` on the kernel layer (`use_predictor_kernels`): a static cache of the frame's positions,
    zeroed in the graph, and every position (the first T0 too: causal attention over T0 positions = T0 one-position
    steps) one decode step of skinny_linear + decode_attention per layer, with M = batch rows."""
    B, T0, _ = x.shape
    a = layers[0].self_attn
    shape = (len(layers), B, a.n_kv_heads, T0 + n_steps - 1, a.head_dim)
    k_cache, v_cache = x.new_zeros(shape), x.new_zeros(shape)
    workspace = attention_workspace(x, k_cache)  # decode_attention's split-merge tickets, zeroed by every call

    def position(h: torch.Tensor, p: int) -> torch.Tensor:
        # Every input of a user kernel that AOTInductor has not realized as a buffer is recomputed into a new one
        # at each use (it fixes the argument's strides by copying): a `torch.full` of the positions or an fp32
        # copy of the RoPE tables cost one fill kernel per layer each (H100 profiles, bench/probes/
        # functional_copies.py). Hence the module's own buffers, as they are: the tables in the compute dtype
        # (the op widens them as it loads) and a row of the positions table (`frame_positions`).
        table = getattr(layers[0].self_attn, "frame_positions", None)
        if table is not None and p < table.shape[0] and B <= table.shape[1]:
            positions = table[p, :B]
        else:
            positions = torch.full((B,), p, dtype=torch.long, device=h.device)
        for i, layer in enumerate(layers):
            h = layer.self_attn.decode_step(
                h, layer.input_layernorm, positions, k_cache, v_cache, i, rope_cos, rope_sin, workspace=workspace
            )
            h = layer.mlp.decode_step(h, layer.post_attention_layernorm)
        return h

    for t in range(T0):
        h = position(x[:, t], t)
    codes, all_logits, pos = [], [], T0
    for step in range(1, n_steps + 1):
        logits = logits_at(step, h)
        code = pick(step, logits)
        codes.append(code)
        all_logits.append(logits)
        nxt = feed(step, code)
        if nxt is not None:
            h = position(nxt[:, 0], pos)
            pos += 1
    return codes, all_logits


def head_logits(norm: RMSNorm, head: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """A step's logits, head(norm(h)). On the kernel layer (`use_predictor_kernels` made the head a KernelLinear)
    one skinny_linear with the RMSNorm as its prologue, where the eager modules take a norm kernel and a cuBLAS
    GEMV once per sampled codebook."""
    if isinstance(head, KernelLinear):
        return head.normed(h, norm)
    return head(norm(h))


FRAME_POSITION_ROWS = 64  # batch rows the frame's positions table covers (larger buckets fill theirs per position)


def use_predictor_kernels(module: nn.Module) -> dict:
    """Kernel pass of the codebook predictors (StageSpec.kernel_passes): every DecoderBlock's attention and MLP
    become kernel-layer blocks holding the same weights, and the output heads the module names in `LOGIT_HEADS`
    KernelLinears (`head_logits`: final RMSNorm and head in one op); `unrolled_frame` then runs the frame on
    them."""
    blocks = [
        sub
        for sub in module.modules()
        if isinstance(sub, DecoderBlock) and not isinstance(sub.self_attn, KernelAttention)
    ]
    if not all(supports_head_dim(b.self_attn.head_dim) for b in blocks):
        # (tiny test presets with head_dim 8): the stage stays on its eager blocks, and says so
        return {"pass": "use_predictor_kernels", "layers": 0, "skipped": "head_dim the kernel does not take"}
    for sub in blocks:
        sub.self_attn = KernelAttention(sub.self_attn, rope_interleaved=sub.rope_style == "interleaved")
        sub.mlp = KernelSwiGLU(sub.mlp)
    heads = 0
    for name in getattr(module, "LOGIT_HEADS", ()) if blocks else ():
        # the output heads (`head_logits`): KernelLinears hold the Linears' own parameters, names unchanged
        head = getattr(module, name)
        if isinstance(head, nn.ModuleList):
            for i, linear in enumerate(head):
                if isinstance(linear, nn.Linear):
                    head[i], heads = KernelLinear(linear), heads + 1
        elif isinstance(head, nn.Linear):
            setattr(module, name, KernelLinear(head))
            heads += 1
    # Row p = position p for every row of a batch: `unrolled_frame`'s positions, a constant the compiled graph
    # reads in place (a torch.full per position became a fill kernel per layer). One row per RoPE table row.
    rows = module.rope_cos.shape[0] if hasattr(module, "rope_cos") else 0
    if blocks and rows:
        table = torch.arange(rows, dtype=torch.long)[:, None].expand(rows, FRAME_POSITION_ROWS).contiguous()
        blocks[0].self_attn.register_buffer("frame_positions", table, persistent=False)
    return {
        "pass": "use_predictor_kernels",
        "layers": len(blocks),
        "heads": heads,
        "ops": ["ttsaot::skinny_linear", "ttsaot::decode_attention"]
        + (["ttsaot::qkv_attention"] if qkv_attention_enabled() else []),
        "frame_positions": list(blocks[0].self_attn.frame_positions.shape) if blocks and rows else None,
    }


def use_sampler_kernel(module: nn.Module) -> dict:
    """Kernel pass: every draw of the predictor's frame becomes one `ttsaot::sample_tokens` (its forward reads
    `sampler_kernel`) instead of a sort and a dozen small kernels. H100 (bench/results/nvidia-h100/probes/
    predictor_copies/): one draw alone 21.6 µs vs 97.7 µs for the aten sampler at V = 2048, 23.5 vs 94.2 µs at
    V = 4096, the same tokens; inside the predictors' graphs 35 µs (V = 2048) and 19.8-38 µs (V = 4096) per draw;
    its GPU tests pass there."""
    module.sampler_kernel = True
    return {"pass": "use_sampler_kernel", "ops": ["ttsaot::sample_tokens"]}


def reference_margins(module: nn.Module, inputs: dict[str, torch.Tensor], first: str) -> dict[str, torch.Tensor]:
    """The golden cases' near-tie margins of a predictor's `codes` output [B, 1 + steps] (fp32 eager reference;
    +inf for code 0, which is given, not drawn). `module.decode(hidden, inputs[first], pick)` runs the frame."""
    margins: list[torch.Tensor] = []
    noise, t, k, p = (inputs[n] for n in ("noise", "temperature", "top_k", "top_p"))

    def pick(step: int, logits: torch.Tensor) -> torch.Tensor:
        margins.append(draw_margin(logits, noise[:, step - 1], t, k, p))
        return sample(logits, noise[:, step - 1], t, k, p)

    with torch.no_grad():
        module.decode(inputs["hidden"], inputs[first], pick)
    given = torch.full_like(margins[0], float("inf"))
    return {"codes": torch.stack([given, *margins], dim=1).contiguous()}


# ------------------------------------------------------------------------------------------- stage inputs
def sampling_inputs(n_steps: int, width: int) -> list[dict]:
    """I/O descriptors of noise + per-row sampling parameters (pads keep padded rows finite; their outputs are
    dropped)."""
    return [
        {"name": "noise", "dtype": "float32", "shape": ["batch", n_steps, width], "pad": 0.5},
        {"name": "temperature", "dtype": "float32", "shape": ["batch"], "pad": 1.0},
        {"name": "top_k", "dtype": "int64", "shape": ["batch"], "pad": 0},
        {"name": "top_p", "dtype": "float32", "shape": ["batch"], "pad": 1.0},
    ]


# Temperature of the golden cases of reduced-precision builds: the draw is decided by the noise, not by logit
# differences at the bf16 rounding level, so the fp32 reference codes are a well-posed target (measured on the tiny
# presets: 0 of 2048 rows differ at T=1000 with top-k/top-p off, 8–15% of rows at T∈[0.3,1.5]). The draws that
# are still near-ties are allowed to differ (draw_margin).
NOISE_DOMINATED_T = 1000.0
GREEDY_FRACTION = 0.2  # rows of random sampling inputs that are greedy (temperature 0)


def random_sampling_inputs(
    B: int, n_steps: int, width: int, g: torch.Generator, noise_dominated: bool = False
) -> dict[str, torch.Tensor]:
    """Valid sampling inputs mixing greedy rows, top-k, top-p and plain temperature rows (or, for golden cases
    of bf16 builds, noise-dominated sampling: see NOISE_DOMINATED_T)."""
    temperature = torch.rand(B, generator=g) * 1.2 + 0.3
    temperature[torch.rand(B, generator=g) < GREEDY_FRACTION] = 0.0
    top_k = torch.randint(0, width + 1, (B,), generator=g)
    top_p = torch.where(torch.rand(B, generator=g) < 0.5, torch.rand(B, generator=g) * 0.8 + 0.2, torch.ones(B))
    noise = torch.rand(B, n_steps, width, generator=g).clamp(1e-6, 1 - 1e-6)
    if noise_dominated:
        temperature, top_k, top_p = torch.full((B,), NOISE_DOMINATED_T), torch.zeros_like(top_k), torch.ones(B)
    return {"noise": noise, "temperature": temperature, "top_k": top_k, "top_p": top_p}


def off_bucket_batch(batches: tuple[int, ...]) -> list[dict[str, int]]:
    """A golden case between two buckets (exercises padding and dropping padded rows), when one exists."""
    for b in range(1, max(batches)):
        if b not in batches:
            return [{"batch": b}]
    return []


__all__ = [
    "NOISE_DOMINATED_T",
    "draw_margin",
    "gumbel",
    "kept_distribution",
    "off_bucket_batch",
    "random_sampling_inputs",
    "reference_margins",
    "sample",
    "sampling_inputs",
    "support_mask",
    "traced_sampler",
    "unrolled_frame",
]
