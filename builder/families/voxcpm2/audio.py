"""VoxCPM2 patch generation and audio: `locdit`, `local_encoder`, `vae_decoder` (STAGES.md §3.1–3.3).

Per LM step the reference generates one latent patch [B,64,4] by flow matching (UnifiedCFM + LocDiT V2:
Euler from t=1 to 0 on a sway-warped grid, zero-init first step, classifier-free guidance with CFG-zero*, the
estimator run on a doubled batch), then re-encodes it with the local encoder into the next LM input embedding.

Stage boundaries (what the runtime replays per decode step):
* `locdit`: (lm_hidden [B,2048] after FSQ, residual_hidden [B,2048], cond [B,64,4] = previous patch,
  noise [B,64,4] ~ N(0,1)) → patch [B,64,4]. The `lm_to_dit_proj` / `res_to_dit_proj` projections and the
  concat into mu live INSIDE this stage, so the whole patch generation is one graph and the LM steps stay
  DiT-agnostic.
  The whole CFM solve is unrolled (n_timesteps − 1 estimator calls for the default single zero-init step).
* `local_encoder`: patch [B,1,4,64] → next input embedding [B,2048] (special token + 4 patch tokens,
  bidirectional, token 0 → enc_to_lm_proj).
* `vae_decoder` (vae.py): latents [B,64,F] → wave [B,1,F·1920], fp32.

Float I/O is float32 at the stage boundary whatever the compute dtype (cast inside the graph); values that
come from a bf16 stage are exactly representable, so nothing is lost between stages.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from ...kernels.decode_modules import KernelAttention, KernelLinear, KernelSwiGLU
from ...layers import RMSNorm, SwiGLU, apply_rope_neox, rope_table
from ...layers.attention import Attention
from .config import DEFAULT_TIMESTEPS, AudioConfig, TransformerConfig


class MiniCPMLayer(nn.Module):
    """Pre-norm: RMSNorm → GQA attention (rope on q,k in fp32) → residual; RMSNorm → SwiGLU → residual."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = Attention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim)
        self.mlp = SwiGLU(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        # use_mup=false in VoxCPM2: plain residual adds
        self.residual_scale = c.scale_depth / math.sqrt(c.num_hidden_layers) if c.use_mup else None

    def _res(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return x + h * self.residual_scale if self.residual_scale is not None else x + h

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if isinstance(self.self_attn, KernelAttention):  # use_sequence_kernels: the same math in 5 ops
            return self.forward_kernels(x, cos, sin)[0]
        q, k, v = self.self_attn.project_qkv(self.input_layernorm(x))
        x = self._res(x, self.self_attn.attend(_rope(q, cos, sin), _rope(k, cos, sin), v, None))
        return self._res(x, self.mlp(self.post_attention_layernorm(x)))

    def forward_kernels(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        x_normed: torch.Tensor | None = None,
        next_norm: RMSNorm | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The layer on the kernel layer (use_sequence_kernels): (output, next_norm(output) or None). `x_normed`:
        input_layernorm(x) if the layer before computed it; each RMSNorm is computed by the projection before it
        where that pays (decode_modules.residual_projection), else in the next projection's prologue."""
        scale = 1.0 if self.residual_scale is None else self.residual_scale
        x, xn = self.self_attn.sequence(
            x, self.input_layernorm, cos, sin, scale, x_normed=x_normed, next_norm=self.post_attention_layernorm
        )
        return self.mlp.sequence(x, self.post_attention_layernorm, scale, x_normed=xn, next_norm=next_norm)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX RoPE in fp32 whatever x's dtype (the reference), back in x's dtype."""
    return apply_rope_neox(x.float(), cos, sin).to(x.dtype)


class BidirectionalMiniCPM(nn.Module):
    """MiniCPMModel with vocab_size 0 run with is_causal=False (names: layers.N.*, norm.weight)."""

    def __init__(self, c: TransformerConfig, max_tokens: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(MiniCPMLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        factors = torch.tensor(c.rope_factors) if c.rope_factors is not None else None
        cos, sin = rope_table(c.head_dim, max_tokens, c.rope_theta, scale_factors=factors)
        # fp32 tables whatever the compute dtype (the reference applies rope in fp32)
        self.register_buffer("rope_cos", cos * c.rope_scaling, persistent=False)
        self.register_buffer("rope_sin", sin * c.rope_scaling, persistent=False)
        self.rope_cos_keep_fp32 = self.rope_sin_keep_fp32 = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        if isinstance(self.layers[0].self_attn, KernelAttention):
            # each layer hands the next RMSNorm (the next layer's input norm, then the final norm) to its last
            # projection where that pays
            xn = None
            for i, layer in enumerate(self.layers):
                next_norm = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.norm
                x, xn = layer.forward_kernels(x, cos, sin, x_normed=xn, next_norm=next_norm)
            return xn if xn is not None else self.norm(x)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class LocalEncoder(nn.Module):
    """`feat_encoder`: [B,T,P,D] → [B,T,H] (learned special token prepended per patch, token 0 kept)."""

    def __init__(self, c: TransformerConfig, feat_dim: int, patch_size: int) -> None:
        super().__init__()
        self.special_token = nn.Parameter(torch.zeros(1, 1, 1, c.hidden_size))
        self.in_proj = nn.Linear(feat_dim, c.hidden_size)
        self.encoder = BidirectionalMiniCPM(c, patch_size + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, P, _ = x.shape
        h = self.in_proj(x)
        h = torch.cat([self.special_token.expand(B, T, 1, -1), h], dim=2).reshape(B * T, P + 1, -1)
        return self.encoder(h)[:, 0, :].reshape(B, T, -1)


class LocalEncoderStage(nn.Module):
    """patch [B,1,P,D] (float32) → next LM input embedding [B,H_lm] (float32)."""

    def __init__(self, cfg: AudioConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.feat_encoder = LocalEncoder(cfg.encoder, cfg.feat_dim, cfg.patch_size)
        self.enc_to_lm_proj = nn.Linear(cfg.encoder.hidden_size, cfg.lm_hidden_size)

    def forward(self, patch: torch.Tensor) -> torch.Tensor:
        x = patch.to(self.enc_to_lm_proj.weight.dtype)
        return self.enc_to_lm_proj(self.feat_encoder(x)[:, 0, :]).float()


class TimestepEmbedding(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(dim, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


def sinusoidal_embedding(t: torch.Tensor, dim: int, scale: float = 1000.0) -> torch.Tensor:
    """SinusoidalPosEmb, in t's dtype (bf16 in serving) like the reference: [sin | cos] of scale·t·freqs."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, dtype=t.dtype, device=t.device) * -(math.log(10000) / (half - 1)))
    e = scale * t.unsqueeze(1) * freqs.unsqueeze(0)
    return torch.cat((e.sin(), e.cos()), dim=-1)


class LocDiT(nn.Module):
    """LocDiT V2 estimator (`feat_decoder.estimator`): [mu₁..mu_k, t, cond×P, x×P] → velocity of x."""

    def __init__(self, c: TransformerConfig, feat_dim: int, patch_size: int, mu_tokens: int) -> None:
        super().__init__()
        self.hidden = c.hidden_size
        self.in_proj = nn.Linear(feat_dim, c.hidden_size)
        self.cond_proj = nn.Linear(feat_dim, c.hidden_size)
        self.out_proj = nn.Linear(c.hidden_size, feat_dim)
        self.time_mlp = TimestepEmbedding(c.hidden_size)
        self.delta_time_mlp = TimestepEmbedding(c.hidden_size)
        self.decoder = BidirectionalMiniCPM(c, mu_tokens + 1 + 2 * patch_size)

    def forward(
        self,
        x: torch.Tensor,
        mu: torch.Tensor,
        t: torch.Tensor,
        cond: torch.Tensor,
        dt: torch.Tensor,
        te: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x, cond [N,C,P]; mu [N, k·H]; t, dt [N] → [N,C,P]. te: the time conditioning [H] when precomputed
        (CFM.fold_time_embeddings), else computed from t and dt."""
        h = self.in_proj(x.transpose(1, 2))
        c = self.cond_proj(cond.transpose(1, 2))
        if te is None:
            te = self.time_embedding(t, dt, h.dtype)
        else:
            te = te.to(h.dtype).expand(h.shape[0], -1)
        mu = mu.view(h.shape[0], -1, h.shape[-1])
        seq = torch.cat([mu, te.unsqueeze(1), c, h], dim=1)
        out = self.decoder(seq)[:, mu.shape[1] + 1 + c.shape[1] :, :]
        return self.out_proj(out).transpose(1, 2)

    def time_embedding(self, t: torch.Tensor, dt: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """time_mlp(sin(t)) + delta_time_mlp(sin(dt)) in `dtype` (the sinusoids in t's dtype, as the reference)."""
        te = self.time_mlp(sinusoidal_embedding(t, self.hidden).to(dtype))
        return te + self.delta_time_mlp(sinusoidal_embedding(dt, self.hidden).to(dtype))


def euler_schedule(n_timesteps: int, dtype: torch.dtype, sway: float = 1.0) -> list[tuple[float, float, bool]]:
    """(t, dt, zero_step) per Euler step, computed exactly as UnifiedCFM does in the model dtype: the grid
    u + sway·(cos(πu/2) − 1 + u) on u = linspace(1, 0, n+1), t advanced by t ← t − dt and
    dt ← t − grid[k+1] (0-dim tensors of `dtype`, so bf16 rounding matches), and the first
    max(1, ⌊0.04·(n+1)⌋) steps zero-init."""
    grid = torch.linspace(1, 0, n_timesteps + 1, dtype=dtype, device="cpu")  # also under a meta-device init
    grid = grid + sway * (torch.cos(torch.pi / 2 * grid) - 1 + grid)
    t, dt = grid[0], grid[0] - grid[1]
    zero_steps = max(1, int((n_timesteps + 1) * 0.04))
    out = []
    for step in range(1, n_timesteps + 1):
        out.append((float(t), float(dt), step <= zero_steps))
        t = t - dt
        if step < n_timesteps:
            dt = t - grid[step + 1]
    return out


class CFM(nn.Module):
    """UnifiedCFM inference (`feat_decoder`): Euler solve with CFG-zero*, the estimator on a doubled batch
    (conditional rows first, unconditional rows with mu = 0)."""

    def __init__(self, cfg: AudioConfig, n_timesteps: int, cfg_rate: float) -> None:
        super().__init__()
        # mu = cat[lm_to_dit, res_to_dit] = 2 tokens of the DiT width
        self.estimator = LocDiT(cfg.dit, cfg.feat_dim, cfg.patch_size, mu_tokens=2)
        self.n_timesteps, self.cfg_rate, self.mean_mode = n_timesteps, float(cfg_rate), cfg.dit_mean_mode
        # Computed here, on real tensors: computed inside forward, a bf16 export would trace the grid with fake
        # tensors and float(t) would become an unbacked symbol (seen on torch 2.11: GuardOnDataDependentSymNode).
        self._schedules: dict[torch.dtype, list] = {
            dt: euler_schedule(n_timesteps, dt) for dt in (torch.float32, torch.bfloat16, torch.float16)
        }

    def schedule(self, dtype: torch.dtype) -> list[tuple[float, float, bool]]:
        return self._schedules[dtype]

    def fold_time_embeddings(self) -> int:
        """Compute the estimator's time conditioning once per Euler step (it depends only on the fixed schedule
        and the weights) instead of inside every call: on the H100 the b1 stage spent ~90 sinusoid kernels and 36
        small projections per call on it. One table per schedule dtype (`time_table_<dtype>` [steps, H], held in
        fp32, `keep_fp32`), each computed as the reference computes it in that dtype (the sinusoids of t in t's
        dtype, the MLPs on weights cast to it: a bf16 stage reads exactly its bf16 values). Computed from the
        weights the module has now: a pass, run after the checkpoint is loaded. Returns the steps folded."""
        est = self.estimator
        steps = 0
        for dtype, schedule in self._schedules.items():
            mlps = (copy.deepcopy(est.time_mlp).to(dtype), copy.deepcopy(est.delta_time_mlp).to(dtype))
            rows = []
            for t, dt, zero_step in schedule:
                if zero_step:
                    continue
                t_in = torch.full((1,), t, dtype=dtype)
                dt_in = torch.full((1,), dt if self.mean_mode else 0.0, dtype=dtype)
                with torch.no_grad():
                    te = mlps[0](sinusoidal_embedding(t_in, est.hidden))
                    rows.append((te + mlps[1](sinusoidal_embedding(dt_in, est.hidden)))[0].float())
            name = f"time_table_{str(dtype).removeprefix('torch.')}"
            self.register_buffer(name, torch.stack(rows), persistent=False)
            setattr(self, f"{name}_keep_fp32", True)
            steps = len(rows)
        return steps

    def _time_table(self, dtype: torch.dtype) -> torch.Tensor | None:
        return getattr(self, f"time_table_{str(dtype).removeprefix('torch.')}", None)

    def forward(self, mu: torch.Tensor, cond: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        B = x.shape[0]
        mu2 = torch.cat([mu, torch.zeros_like(mu)], dim=0)
        cond2 = torch.cat([cond, cond], dim=0)
        table = self._time_table(x.dtype)
        step = 0
        for t, dt, zero_step in self.schedule(x.dtype):
            if zero_step:
                continue  # velocity 0: x − dt·0 = x
            t_in = torch.full((2 * B,), t, dtype=x.dtype, device=x.device)
            # dt input is the step size in mean mode, zeros otherwise (the reference's "not used now")
            dt_in = torch.full((2 * B,), dt if self.mean_mode else 0.0, dtype=x.dtype, device=x.device)
            te = table[step] if table is not None else None
            v = self.estimator(torch.cat([x, x], dim=0), mu2, t_in, cond2, dt_in, te)
            step += 1
            v_c, v_u = v[:B], v[B:]
            pos, neg = v_c.reshape(B, -1), v_u.reshape(B, -1)
            s = (pos * neg).sum(dim=1, keepdim=True) / ((neg**2).sum(dim=1, keepdim=True) + 1e-8)
            s = s.view(B, 1, 1)
            v = v_u * s + self.cfg_rate * (v_c - v_u * s)
            x = x - dt * v
        return x


class LocDiTStage(nn.Module):
    """(lm_hidden, residual_hidden, cond, noise) → patch [B,C,P] (all float32 at the boundary)."""

    def __init__(self, cfg: AudioConfig, n_timesteps: int = DEFAULT_TIMESTEPS, cfg_rate: float | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.feat_decoder = CFM(cfg, n_timesteps, cfg.inference_cfg_rate if cfg_rate is None else cfg_rate)
        self.lm_to_dit_proj = nn.Linear(cfg.lm_hidden_size, cfg.dit.hidden_size)
        self.res_to_dit_proj = nn.Linear(cfg.lm_hidden_size, cfg.dit.hidden_size)

    def forward(
        self, lm_hidden: torch.Tensor, residual_hidden: torch.Tensor, cond: torch.Tensor, noise: torch.Tensor
    ) -> torch.Tensor:
        dtype = self.lm_to_dit_proj.weight.dtype
        mu = torch.cat(
            [self.lm_to_dit_proj(lm_hidden.to(dtype)), self.res_to_dit_proj(residual_hidden.to(dtype))], dim=-1
        )
        return self.feat_decoder(mu, cond.to(dtype), noise.to(dtype)).float()


def fold_time_embeddings(module: nn.Module) -> dict:
    """Pass of `locdit` (StageSpec.passes): every CFM's time conditioning precomputed per Euler step
    (CFM.fold_time_embeddings)."""
    solvers = [m for m in module.modules() if isinstance(m, CFM)]
    steps = [cfm.fold_time_embeddings() for cfm in solvers]
    return {"pass": "fold_time_embeddings", "solvers": len(solvers), "steps": steps}


def use_sequence_kernels(module: nn.Module) -> dict:
    """Kernel pass of `locdit` and `local_encoder` (StageSpec.kernel_passes): every MiniCPMLayer's attention and MLP
    become the kernel layer's sequence-form blocks and every other nn.Linear a KernelLinear, all holding the same
    weights (builder/kernels/decode_modules.py); the T × T bidirectional attention with its RoPE is one
    sequence_attention op per layer.
    Needs the fused projections (`passes.fuse_projections`, which both stages run first)."""
    layers = linears = 0
    for sub in list(module.modules()):
        if isinstance(sub, MiniCPMLayer) and isinstance(sub.self_attn, Attention):
            sub.self_attn, sub.mlp = KernelAttention(sub.self_attn), KernelSwiGLU(sub.mlp)
            layers += 1
    for sub in list(module.modules()):
        if isinstance(sub, (KernelAttention, KernelSwiGLU)):
            continue  # their projections run inside their own ops
        for name, child in list(sub.named_children()):
            if type(child) is nn.Linear:
                setattr(sub, name, KernelLinear(child))
                linears += 1
    return {
        "pass": "use_sequence_kernels",
        "layers": layers,
        "linears": linears,
        "ops": ["ttsaot::skinny_linear", "ttsaot::sequence_attention"],
        "attention": "sequence_attention",
    }
