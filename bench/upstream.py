"""Upstream implementations with OUR random weights, where they run without their serving engine.

Upstream code is never vendored: it is imported from the installed package (one module at a time, without the
package __init__, which pulls audio and hub stacks). Where it is not importable the bench records
"unavailable: <reason>" instead of failing."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from torch import nn

from .common import Skipped, short_error


def import_module_alone(dotted: str):
    """Import `a.b.c` with its parent packages stubbed (real __path__, no __init__ executed)."""
    top = dotted.split(".")[0]
    if top in sys.modules and getattr(sys.modules[top], "__path__", None):   # already stubbed by an earlier call
        root = Path(list(sys.modules[top].__path__)[0])
    else:
        spec = importlib.util.find_spec(top)
        if spec is None or not spec.submodule_search_locations:
            raise Skipped(f"unavailable: upstream package {top!r} is not installed")
        root = Path(list(spec.submodule_search_locations)[0])
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        name = ".".join(parts[:i])
        if name in sys.modules:
            continue
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(root.joinpath(*parts[1:i]))]
        sys.modules[name] = pkg
    try:
        return importlib.import_module(dotted)
    except Exception as e:  # noqa: BLE001
        raise Skipped(f"unavailable: import {dotted} failed ({short_error(e)})") from e


def _qwen_code2wav(ours: nn.Module) -> nn.Module:
    """qwen-tts Qwen3TTSTokenizerV2Decoder with our faithful module's weights (same key names; upstream also
    has the encode-only `input_proj` convs, which decoding never reads)."""
    cfg_mod = import_module_alone("qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2")
    model_mod = import_module_alone("qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2")
    d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(ours.cfg).items()}
    cfg = cfg_mod.Qwen3TTSTokenizerV2DecoderConfig(**d)
    cfg._attn_implementation = "sdpa"
    up = model_mod.Qwen3TTSTokenizerV2Decoder(cfg).eval()
    missing, unexpected = up.load_state_dict(ours.state_dict(), strict=False)
    bad_missing = [k for k in missing if ".input_proj." not in k]
    if unexpected or bad_missing:
        raise Skipped(
            f"unavailable: weights do not map onto upstream (missing {bad_missing[:3]}, "
            f"unexpected {list(unexpected)[:3]})"
        )
    return up


# (family, stage) → builder(our faithful fp32 module) → upstream nn.Module with the same weights, same forward
# signature (inputs in the StageSpec's order).
UPSTREAM: dict[tuple[str, str], tuple[str, Callable[[nn.Module], nn.Module]]] = {
    ("qwen3-tts-12hz", "code2wav"): ("qwen_tts Qwen3TTSTokenizerV2Decoder", _qwen_code2wav),
}


def upstream_module(family: str, stage: str, ours: nn.Module) -> tuple[str, nn.Module]:
    entry = UPSTREAM.get((family, stage))
    if entry is None:
        raise Skipped("unavailable: no standalone upstream module for this stage is wired into the bench")
    name, build = entry
    try:
        return name, build(ours).eval()
    except Skipped:
        raise
    except Exception as e:  # noqa: BLE001
        raise Skipped(f"unavailable: building {name} failed ({short_error(e)})") from e
