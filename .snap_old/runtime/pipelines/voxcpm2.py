"""VoxCPM2 decode on artifacts: per token base step → residual step → locdit → local_encoder; VAE streamed.

    bundle = load("artifacts/voxcpm2", device="cuda")
    dec = VoxCPM2Decoder(bundle)
    # prefill (runtime/lm.py) fills the caches and gives the last prompt position's lm_hidden / residual
    for ev in dec.stream(lm_hidden, residual_hidden, prefix_cond, base_cache=bc, residual_cache=rc,
                         generators=[torch.Generator("cuda").manual_seed(s) for s in seeds]):
        play(ev.row, ev.wav)                      # [1, n] float32 at 48 kHz

Per step and per active set of rows: one replay each of `base_lm_step`, `residual_lm_step`, `locdit` and
`local_encoder` (the order of the reference loop: the patch is generated from the current hidden states,
then the stop flag of that same hidden state is read, then the LMs advance on the patch's embedding). The
only host sync is reading the stop flags (one [n] tensor per step), copied out asynchronously a step ahead of
their use (runtime/host_copies.py), so the host queues the next step while the GPU runs this one. Noise for
the flow-matching solve is drawn from a caller-supplied torch.Generator per request, so a request's audio does
not depend on its batch.

The VAE decodes every `decode_every` steps (3 = 12 new latent frames) with `left_context_frames` of history
from the `vae_decoder` metadata: when that covers the VAE's receptive field (`receptive_field_frames`), the
streamed audio equals one-shot decoding of all latents (up to kernel-order noise).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from ..errors import InputShapeError, InputValueError
from ..host_copies import PendingHost

STAGES = ("base_lm_step", "residual_lm_step", "locdit", "local_encoder", "vae_decoder")


@dataclass
class AudioChunk:
    row: int  # index of the request in the batch given to stream()
    wav: torch.Tensor  # [1, n] float32, on the stage device
    final: bool  # the request stopped (stop head or max_steps); no more chunks for this row


@dataclass
class _Row:
    generator: torch.Generator | None
    latents: list[torch.Tensor] = field(default_factory=list)  # new patches [C, P] not yet decoded
    history: torch.Tensor | None = None  # [C, ≤ctx] frames kept as left context
    steps: int = 0
    done: bool = False


def draw_noise(
    batch: int,
    feat_dim: int,
    patch_size: int,
    device: torch.device,
    generators: Sequence[torch.Generator | None] | torch.Generator | None = None,
) -> torch.Tensor:
    """Standard normal [batch, feat_dim, patch_size] float32 for the `locdit` stage.

    One generator per row gives per-request reproducibility; one generator for the batch (or None = the global
    RNG) draws the whole tensor at once."""
    if generators is None or isinstance(generators, torch.Generator):
        return torch.randn(batch, feat_dim, patch_size, generator=generators, device=device)
    if len(generators) != batch:
        raise InputShapeError(f"draw_noise: {len(generators)} generators for a batch of {batch}")
    return torch.stack([torch.randn(feat_dim, patch_size, generator=g, device=device) for g in generators])


class PatchGenerator:
    """The audio half of a step: `locdit` then `local_encoder`, with noise drawn here."""

    def __init__(self, locdit, local_encoder) -> None:
        self.locdit, self.local_encoder = locdit, local_encoder
        spec = {s.name: s for s in locdit.entry.inputs}["noise"]
        self.feat_dim, self.patch_size = int(spec.shape[1]), int(spec.shape[2])
        self.device = locdit.device

    def __call__(
        self,
        lm_hidden: torch.Tensor,
        residual_hidden: torch.Tensor,
        cond: torch.Tensor,
        generators=None,
        noise: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """→ (patch [n, C, P], next input embedding [n, H]) on the device, float32."""
        n = lm_hidden.shape[0]
        if noise is None:
            noise = draw_noise(n, self.feat_dim, self.patch_size, self.device, generators)
        patch = self.locdit(lm_hidden.float(), residual_hidden.float(), cond.float(), noise)
        embed = self.local_encoder(patch.transpose(1, 2).unsqueeze(1))
        return patch, embed


class VoxCPM2Decoder:
    def __init__(self, bundle, decode_every: int = 3, min_len: int = 2, max_steps: int = 2000) -> None:
        missing = [s for s in STAGES if s not in bundle]
        if missing:
            raise KeyError(f"VoxCPM2Decoder: the bundle lacks stage(s) {missing} (have: {list(bundle)})")
        self.base, self.residual = bundle["base_lm_step"], bundle["residual_lm_step"]
        self.vae = bundle["vae_decoder"]
        self.patches = PatchGenerator(bundle["locdit"], bundle["local_encoder"])
        self.device = self.patches.device
        self.decode_every, self.min_len, self.max_steps = decode_every, min_len, max_steps
        self.left_context = int(self.vae.metadata.get("streaming", {}).get("left_context_frames", 0))

    # ------------------------------------------------------------------------------ audio
    def _decode(self, rows: dict[int, _Row], which: list[int], final: bool) -> list[AudioChunk]:
        """Decode the pending latents of `which`, batching rows whose windows have the same shape."""
        groups: dict[tuple[int, int], list[int]] = {}
        for i in which:
            r = rows[i]
            if not r.latents:
                continue
            ctx = 0 if r.history is None else r.history.shape[-1]
            groups.setdefault((ctx, len(r.latents)), []).append(i)
        out = []
        for (ctx, _), idx in groups.items():
            windows = []
            for i in idx:
                r = rows[i]
                new = torch.cat(r.latents, dim=-1)
                windows.append(new if r.history is None else torch.cat([r.history, new], dim=-1))
                r.latents = []
            window = torch.stack(windows)
            wav = self.vae(window)[..., ctx * self.vae.samples_per_frame :]
            for j, i in enumerate(idx):
                r = rows[i]
                keep = min(self.left_context, window.shape[-1])
                r.history = window[j, :, window.shape[-1] - keep :] if keep else None
                out.append(AudioChunk(i, wav[j], final or r.done))
        return out

    # ------------------------------------------------------------------------------ decode loop
    def stream(
        self,
        lm_hidden: torch.Tensor,
        residual_hidden: torch.Tensor,
        prefix_cond: torch.Tensor,
        *,
        base_cache,
        residual_cache,
        rows: Sequence[int] | None = None,
        generators: Sequence[torch.Generator | None] | torch.Generator | None = None,
        context_latents: torch.Tensor | None = None,
        max_steps: int | None = None,
        validate_inputs: bool = False,
    ) -> Iterator[AudioChunk]:
        """Decode from prefilled caches. lm_hidden / residual_hidden [n, H]: the last prompt position's
        (FSQ'd) base hidden and residual hidden; prefix_cond [n, C, P]: the last prompt patch (zeros without
        prompt audio); `rows`: the cache rows of the n requests; context_latents [n, C, F0]: prompt latents
        used as VAE left context (continuation), never emitted. Yields AudioChunk events; each row ends with
        final=True."""
        n = lm_hidden.shape[0]
        if residual_hidden.shape[0] != n or prefix_cond.shape[0] != n:
            raise InputShapeError("VoxCPM2Decoder: lm_hidden, residual_hidden, prefix_cond disagree on batch")
        if self.min_len < 0:
            raise InputValueError("min_len must be >= 0")
        cache_rows = list(range(n)) if rows is None else list(rows)
        gens = list(generators) if isinstance(generators, Sequence) else [None] * n if generators is None else None
        state = {i: _Row(gens[i] if gens is not None else None) for i in range(n)}
        if context_latents is not None:
            for i in range(n):
                ctx = context_latents[i].to(self.device, torch.float32)
                state[i].history = ctx[:, ctx.shape[-1] - min(self.left_context, ctx.shape[-1]) :]
        limit = self.max_steps if max_steps is None else max_steps
        stages = (self.base, self.residual, self.patches.locdit, self.patches.local_encoder, self.vae)
        saved = [s.validate_inputs for s in stages]
        for s in stages:
            s.validate_inputs = validate_inputs
        try:
            yield from self._loop(
                state,
                cache_rows,
                lm_hidden.to(self.device),
                residual_hidden.to(self.device),
                prefix_cond.to(self.device),
                base_cache,
                residual_cache,
                generators,
                gens,
                limit,
            )
        finally:
            for s, v in zip(stages, saved):
                s.validate_inputs = v

    def _loop(self, state, cache_rows, lm_h, res_h, cond, base_cache, residual_cache, generators, gens, limit):
        active = list(state)  # indices into the request batch
        # The stop flags of the current lm_h (none yet for the prefill's last state), on their way to the host:
        # queued right after the base step, read a step later once this step's patch is queued behind them, so
        # the host never waits for the GPU's current work and the GPU never idles for the host's next launches.
        flags_pending: PendingHost | None = None
        for step in range(limit):
            g = [gens[i] for i in active] if gens is not None else generators
            patch, embed = self.patches(lm_h, res_h, cond, g)
            for j, i in enumerate(active):
                state[i].latents.append(patch[j])
                state[i].steps += 1
            # the reference reads the stop flag of the hidden state that produced this patch
            stopped: list[int] = []
            if flags_pending is not None and step > self.min_len:
                flags = flags_pending.wait()  # the one host sync of a step
                stopped = [active[j] for j in range(len(active)) if int(flags[j]) == 1]
            if step == limit - 1:
                stopped = list(active)
            for i in stopped:
                state[i].done = True
            due = [i for i in active if state[i].done or len(state[i].latents) >= self.decode_every]
            if due:
                yield from self._decode(state, due, final=False)
            keep = [j for j, i in enumerate(active) if not state[i].done]
            if not keep:
                return
            if len(keep) != len(active):
                sel = torch.tensor(keep, device=self.device)
                active = [active[j] for j in keep]
                embed, patch = embed.index_select(0, sel), patch.index_select(0, sel)
            rows = [cache_rows[i] for i in active]
            _, lm_h, stop_logits = self.base.step(embed, cache=base_cache, rows=rows)
            flags_pending = PendingHost(stop_logits.argmax(dim=-1))
            res_h = self.residual.step(lm_h, embed, cache=residual_cache, rows=rows)
            cond = patch

    def generate(self, *args, **kw) -> list[torch.Tensor]:
        """Run `stream` to the end; one [1, samples] wave per request."""
        n = args[0].shape[0] if args else kw["lm_hidden"].shape[0]
        parts: list[list[torch.Tensor]] = [[] for _ in range(n)]
        for ev in self.stream(*args, **kw):
            parts[ev.row].append(ev.wav)
        return [torch.cat(p, dim=-1) if p else torch.zeros(1, 0, device=self.device) for p in parts]
