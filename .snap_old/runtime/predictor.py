"""Codebook predictors (Fish `fast_ar`, Qwen `code_predictor`): one graph replay per acoustic frame.

The compiled program takes the backbone hidden state, the first code (or the token it comes from), uniform
noise for every sampled codebook and per-row sampling parameters, and returns all codes of the frame (plus,
optionally, the next backbone input embedding). Sampling happens inside the graph (builder/predictor.py
semantics); this class only draws the noise with the caller's generator, so a request seeded once is
reproducible whatever else shares its batch."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .errors import InputValueError
from .stage import Stage

Param = float | int | Sequence | torch.Tensor


class CodebookPredictorStage(Stage):
    @property
    def noise_shape(self) -> tuple[int, int]:
        """(sampled codebooks, vocabulary width) of the noise each row needs."""
        spec = next(s for s in self.entry.inputs if s.name == "noise")
        return int(spec.shape[1]), int(spec.shape[2])

    def draw_noise(
        self, batch: int, generator: torch.Generator | Sequence[torch.Generator] | None = None
    ) -> torch.Tensor:
        """Uniforms [B, steps, width] in [0,1) (0 is clamped inside the graph). One generator for the batch, or
        one per row (each request keeps its own stream when batched with others). Noise is drawn on the
        generator's device: on a GPU stage pass `torch.Generator(device="cuda")` to avoid a host→device copy of
        B·steps·width floats per frame."""
        steps, width = self.noise_shape
        if generator is None or isinstance(generator, torch.Generator):
            dev = generator.device if generator is not None else self.device
            return torch.rand((batch, steps, width), generator=generator, device=dev).to(self.device)
        gens = list(generator)
        if len(gens) != batch:
            raise InputValueError(f"{self.name}: {len(gens)} generators for a batch of {batch}")
        return torch.stack([torch.rand((steps, width), generator=g, device=g.device).to(self.device) for g in gens])

    def _rows(self, value: Param, batch: int, dtype: torch.dtype, what: str) -> torch.Tensor:
        t = torch.as_tensor(value, dtype=dtype)
        if t.dim() == 0:
            t = t.expand(batch)
        if tuple(t.shape) != (batch,):
            raise InputValueError(
                f"{self.name}: {what} must be a scalar or have one value per row ({batch}), got shape {tuple(t.shape)}"
            )
        return t.contiguous().to(self.device)

    def generate(
        self,
        hidden: torch.Tensor,
        code0_or_token: torch.Tensor,
        temperature: Param | None = None,
        top_k: Param | None = None,
        top_p: Param | None = None,
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
        noise: torch.Tensor | None = None,
        **extra: torch.Tensor,
    ):
        """Codes [B, num_codebooks] int64 (and the next input embedding when the artifact has that output).

        temperature ≤ 0 is greedy; top_k = 0 disables top-k; top_p = 1 disables top-p; each may be a scalar
        or one value per row; unset ones take the family's serving defaults (manifest `sampling_defaults`).
        `extra`: further inputs of the artifact (Fish with embedding: `token_embed`)."""
        defaults = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, **self.metadata.get("sampling_defaults", {})}
        temperature = defaults["temperature"] if temperature is None else temperature
        top_k = defaults["top_k"] if top_k is None else top_k
        top_p = defaults["top_p"] if top_p is None else top_p
        B = int(hidden.shape[0])
        t = self._rows(temperature, B, torch.float32, "temperature")
        k = self._rows(top_k, B, torch.int64, "top_k")
        p = self._rows(top_p, B, torch.float32, "top_p")
        if bool((p <= 0).any()) or bool((p > 1).any()):
            raise InputValueError(f"{self.name}: top_p must be in (0, 1]")
        if bool((k < 0).any()):
            raise InputValueError(f"{self.name}: top_k must be >= 0 (0 disables it)")
        if noise is None:
            noise = self.draw_noise(B, generator)
        names = self.input_names
        named = {
            names[0]: hidden,
            names[1]: code0_or_token,
            "noise": noise,
            "temperature": t,
            "top_k": k,
            "top_p": p,
            **extra,
        }
        return self(**named)


__all__ = ["CodebookPredictorStage"]
