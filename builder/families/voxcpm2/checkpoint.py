"""VoxCPM2 checkpoints: which tensors each stage loads (strict: every key loaded, or explicitly ignored or
dropped), random weights for the presets, and writers of test checkpoints in the real layout.

An openbmb/VoxCPM2 folder holds `config.json`, `model.safetensors` (every part: the LMs, the local encoder,
LocDiT and their projections; each stage loads its own prefixes) and `audiovae.safetensors` (or `audiovae.pth`
with a `state_dict`: the AudioVAE, whose `decoder.*` is the `vae_decoder` stage; legacy weight-norm names)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from ....runtime.artifact import sha256_of
from ...checkpoint import CheckpointError, KeyRules, fill_by_name, load_strict, read_safetensors_selected
from ...passes.weight_norm import NEW_G, NEW_V, legacy_weight_norm_to_new
from .audio import LocalEncoderStage, LocDiTStage
from .config import AudioConfig, VAEConfig, VoxCPM2LMConfig, preset_config_json
from .lm import STAGE_MODULES, VoxCPM2LM
from .vae import AudioVAEDecoder

# model.safetensors: the parts each stage may load; a stage ignores the others by name, anything else is an error.
LM_PREFIXES = ("base_lm.", "residual_lm.", "fsq_layer.", "fusion_concat_proj.", "stop_proj.", "stop_head.")
AUDIO_PREFIXES = (
    "feat_encoder.",
    "feat_decoder.",
    "enc_to_lm_proj.",
    "lm_to_dit_proj.",
    "res_to_dit_proj.",
    "audio_vae.",
)
AUDIO_STAGE_PREFIXES = {
    "locdit": ("feat_decoder.", "lm_to_dit_proj.", "res_to_dit_proj."),
    "local_encoder": ("feat_encoder.", "enc_to_lm_proj."),
}


# ---------------------------------------------------------------------------------------------------- LMs
def lm_rules(stage: str) -> KeyRules:
    """What each stage reads from model.safetensors: its own parts load; `base_lm.embed_tokens` is dropped
    (counted as pruned) by the step; every other part is ignored. Anything unknown is an error."""
    own = {
        "base_lm_prefill": ("base_lm.", "fsq_layer."),
        "base_lm_step": ("base_lm.", "fsq_layer.", "stop_proj.", "stop_head."),
        "residual_lm_prefill": ("residual_lm.", "fusion_concat_proj."),
        "residual_lm_step": ("residual_lm.", "fusion_concat_proj."),
        "all": LM_PREFIXES,
    }[stage]
    drop = (r"base_lm\.embed_tokens\.weight",) if stage == "base_lm_step" else ()
    ignore = tuple(p for p in LM_PREFIXES if p not in own) + AUDIO_PREFIXES
    return KeyRules(prefix="", ignore_prefixes=ignore, drop_patterns=drop)


def load_lm_stage_module(stage: str, path: str | Path, cfg: VoxCPM2LMConfig, max_len: int) -> tuple[nn.Module, dict]:
    st = Path(path) / "model.safetensors"
    if not st.is_file():
        raise FileNotFoundError(f"{st}: VoxCPM2 model.safetensors not found")
    module = STAGE_MODULES[stage](cfg, max_len) if stage != "all" else VoxCPM2LM(cfg, max_len)
    tensors, report = read_safetensors_selected(st, lm_rules(stage))
    load_strict(module, tensors, report["unknown"], source=str(st))
    report.update({"path": str(st), "sha256": sha256_of(st)})
    return module.eval(), report


def init_random_lm(module: nn.Module, seed: int = 0) -> nn.Module:
    """Deterministic random weights keyed by checkpoint NAME (`fill_by_name`), so every stage module built with the
    same seed holds the same tensor for the same name (base_lm_step and base_lm_prefill share base_lm.*)."""

    def fill(name: str, p: torch.Tensor, g: torch.Generator) -> None:
        if "norm" in name and p.dim() == 1:
            p.normal_(1.0, 0.1, generator=g)
        elif name.rsplit(".", 1)[-1] == "bias":
            p.normal_(0.0, 0.02, generator=g)
        elif "embed_tokens" in name:
            p.normal_(0.0, 1.0, generator=g)
        else:
            p.normal_(0.0, 1 / math.sqrt(p.shape[-1]), generator=g)

    fill_by_name(module.state_dict(), fill, seed)
    return module.eval()


def write_lm_checkpoint(model: VoxCPM2LM, out_dir: str | Path, extra: dict[str, torch.Tensor] | None = None) -> Path:
    """Write <out>/model.safetensors (LM tensors under their real names, + `extra`) and <out>/config.json
    (`lm_config` and the LM's top-level fields). Both are MERGED into existing files, so the audio stages'
    writer can add its parts before or after this one."""
    from safetensors.torch import load_file, save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    st = out / "model.safetensors"
    tensors = load_file(str(st)) if st.is_file() else {}
    tensors.update({k: v.detach().contiguous() for k, v in model.state_dict().items()})
    tensors.update({k: v.contiguous() for k, v in (extra or {}).items()})
    save_file(tensors, str(st))
    cp = out / "config.json"
    cfg = json.loads(cp.read_text()) if cp.is_file() else {"architecture": "voxcpm2"}
    cfg.update(model.cfg.to_json())
    cp.write_text(json.dumps(cfg, indent=2))
    return out


# ------------------------------------------------------------------------------------ locdit, local_encoder
def audio_rules(stage: str) -> KeyRules:
    own = AUDIO_STAGE_PREFIXES[stage]
    return KeyRules(prefix="", ignore_prefixes=tuple(p for p in LM_PREFIXES + AUDIO_PREFIXES if p not in own))


def load_audio_stage_module(stage: str, ckpt_dir: str | Path, module: nn.Module) -> dict:
    """Strictly load `module` from <ckpt_dir>/model.safetensors (bf16 tensors upcast to the fp32 module)."""
    st = Path(ckpt_dir) / "model.safetensors"
    if not st.is_file():
        raise FileNotFoundError(f"{st}: VoxCPM2 model.safetensors not found")
    tensors, report = read_safetensors_selected(st, audio_rules(stage))
    load_strict(module, tensors, report["unknown"], source=str(st))
    report.update(path=str(st), sha256=sha256_of(st))
    return report


def init_random_audio(module: nn.Module, seed: int = 0) -> nn.Module:
    """Deterministic random weights with realistic scales for the transformer stages (locdit, local_encoder), keyed
    by parameter name (`fill_by_name`)."""

    def fill(name: str, p: torch.Tensor, g: torch.Generator) -> None:
        if name.endswith("special_token"):
            p.normal_(0.0, 1.0, generator=g)
        elif p.dim() == 1 and ("norm" in name):
            p.normal_(1.0, 0.1, generator=g)
        elif name.endswith("bias"):
            p.normal_(0.0, 0.02, generator=g)
        else:
            p.normal_(0.0, 1 / math.sqrt(p.shape[-1]), generator=g)

    fill_by_name(dict(module.named_parameters()), fill, seed)
    return module.eval()


def write_audio_checkpoint(
    out_dir: str | Path,
    cfg: AudioConfig,
    locdit: LocDiTStage,
    encoder: LocalEncoderStage,
    vae_decoder: AudioVAEDecoder,
    extra: dict[str, torch.Tensor] | None = None,
    vae_extra: dict[str, torch.Tensor] | None = None,
    dtype: torch.dtype = torch.float32,
    vae_format: str = "safetensors",
    config_json: dict | None = None,
) -> Path:
    """config.json + model.safetensors (+ `extra` tensors of the other parts, e.g. the LMs) + audiovae.* in
    the real layout. The real model.safetensors is bf16: pass dtype=torch.bfloat16 to mimic it."""
    from safetensors.torch import save_file

    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(dtype).contiguous() for m in (locdit, encoder) for k, v in m.state_dict().items()}
    if extra is None:  # a few tensors of the other parts, so loading must ignore them by name
        extra = {
            "stop_head.weight": torch.zeros(2, cfg.lm_hidden_size),
            "base_lm.norm.weight": torch.ones(cfg.lm_hidden_size),
        }
    sd.update({k: v.contiguous() for k, v in extra.items()})
    save_file(sd, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(config_json or preset_config_json(cfg), indent=2))
    write_vae_checkpoint(vae_decoder, d, vae_extra, fmt=vae_format)
    return d


# ----------------------------------------------------------------------------------------------- AudioVAE
# audiovae.safetensors: `decoder.*` is this module; `encoder.*` (voice-clone encoder, 184.8 MiB) is not read.
VAE_RULES = KeyRules(prefix="", ignore_prefixes=("encoder.",))


def _classify(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]:
    loaded, report = {}, {"ignored": {"tensors": 0, "params": 0}, "dropped": {}, "unknown": []}
    for k, v in state.items():
        kind = VAE_RULES.classify(k)
        if kind == "load":
            loaded[VAE_RULES.module_key(k)] = v
        elif kind == "ignore":
            report["ignored"]["tensors"] += 1
            report["ignored"]["params"] += v.numel()
    return loaded, report


def read_vae_state(ckpt_dir: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """audiovae.safetensors, else audiovae.pth (`state_dict` inside, torch.load weights_only=True)."""
    d = Path(ckpt_dir)
    st, pth = d / "audiovae.safetensors", d / "audiovae.pth"
    if st.is_file():
        from safetensors.torch import load_file

        path, state = st, load_file(str(st))
    elif pth.is_file():
        obj = torch.load(str(pth), map_location="cpu", weights_only=True)
        path, state = pth, obj.get("state_dict", obj)
    else:
        raise FileNotFoundError(f"{d}: neither audiovae.safetensors nor audiovae.pth found")
    loaded, report = _classify(state)
    report["path"], report["sha256"] = str(path), sha256_of(path)
    return legacy_weight_norm_to_new(loaded), report


def load_vae_decoder(ckpt_dir: str | Path, cfg: VAEConfig) -> tuple[AudioVAEDecoder, dict]:
    tensors, report = read_vae_state(ckpt_dir)
    model = AudioVAEDecoder(cfg)
    try:
        load_strict(model, tensors, source=report["path"])
    except CheckpointError as e:
        raise CheckpointError(f"{e} (audio_vae_config in config.json: {cfg.to_json()})") from None
    return model.eval(), report


def init_random_vae(model: AudioVAEDecoder, seed: int = 0) -> AudioVAEDecoder:
    """Deterministic random weights with audio-range output (tanh not saturated, not silent), keyed by parameter
    name (`fill_by_name`)."""
    last = f"decoder.model.{len(model.decoder.model) - 2}."

    def fill(name: str, p: torch.Tensor, g: torch.Generator) -> None:
        if name.endswith("alpha"):
            p.uniform_(0.5, 1.5, generator=g)
        elif name.endswith(NEW_G):
            # row norm of the effective weight; 1×1 convs closing residual branches start small
            gain = 0.1 if (".block.3." in name or name.startswith(last)) else 0.7
            p.uniform_(0.8 * gain, 1.2 * gain, generator=g)
        elif name.endswith(NEW_V):
            p.normal_(0.0, 1.0, generator=g)
        elif name.endswith("scale_embed.weight"):
            p.normal_(1.0, 0.1, generator=g)
        elif name.endswith("bias"):
            p.normal_(0.0, 0.02, generator=g)
        else:
            p.normal_(0.0, 0.05, generator=g)

    fill_by_name(dict(model.named_parameters()), fill, seed)
    return model.eval()


def vae_state_dict_legacy(model: AudioVAEDecoder) -> dict[str, torch.Tensor]:
    """The decoder in the checkpoint's own layout (legacy weight_g / weight_v names)."""
    out = {}
    for k, v in model.state_dict().items():
        if k.endswith(NEW_G):
            k = k[: -len(NEW_G)] + "weight_g"
        elif k.endswith(NEW_V):
            k = k[: -len(NEW_V)] + "weight_v"
        out[k] = v.detach().contiguous()
    return out


def write_vae_checkpoint(
    model: AudioVAEDecoder, out_dir: str | Path, extra: dict[str, torch.Tensor] | None = None, fmt: str = "safetensors"
) -> Path:
    """audiovae.safetensors (or audiovae.pth with a `state_dict`) in the real layout: decoder + `extra`
    (encoder tensors; a token one when none are given)."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    sd = vae_state_dict_legacy(model)
    sd.update(extra if extra is not None else {"encoder.fc_logvar.bias": torch.zeros(model.cfg.latent_dim)})
    if fmt == "safetensors":
        from safetensors.torch import save_file

        path = d / "audiovae.safetensors"
        save_file(sd, str(path))
    else:
        path = d / "audiovae.pth"
        torch.save({"state_dict": sd}, str(path))
    return path
