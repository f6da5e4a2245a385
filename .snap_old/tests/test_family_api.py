"""The family contract (builder/family.py): every registered family is a `Family` whose options declare their CLI
flags, whose recipes match its stage list, and whose passes account for every parameter; a family outside the
repository plugs in through `register_family` alone and builds and loads on CPU."""

from __future__ import annotations

import copy
import dataclasses
import sys
import textwrap

import pytest
import torch
from click.testing import CliRunner

from ttsaot.builder.cli import main
from ttsaot.builder.families import FAMILIES, get_family, register_family
from ttsaot.builder.family import Family
from ttsaot.builder.options import OptionsError, flags_of
from ttsaot.builder.passes import count_parameters

ALL = list(FAMILIES)


@pytest.mark.parametrize("name", ALL)
def test_every_family_is_a_family_object_with_one_layout(name):
    fam = get_family(name)
    assert isinstance(fam, Family) and fam.name == name
    recipes = fam._recipes()
    assert tuple(recipes.STAGES) == fam.stages
    for part in ("options", "config", "checkpoint", "stages"):
        __import__(f"{fam.package}.{part}")
    defaults = fam.Options()
    for fl in flags_of(fam.Options):
        assert fl.name.startswith("--") and fl.help, fl
        value = defaults
        for attr in fl.path:
            value = getattr(value, attr)
        if not fl.is_switch and value is not None:  # a default can be given back on the command line
            shown = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
            assert fl.parse(shown) == value, fl.name


@pytest.mark.parametrize("name", ALL)
def test_options_are_strict(name):
    fam = get_family(name)
    with pytest.raises(OptionsError, match=f"{name} has no option 'no_such_option'"):
        fam.options(no_such_option=1)
    with pytest.raises(OptionsError, match="unknown preset"):
        fam.options(preset="huge")
    with pytest.raises(OptionsError, match="unknown stage"):
        fam.specs(fam.options(), ["vocoder"])
    with pytest.raises(OptionsError, match="max_batch"):
        fam.options(max_batch=0)


def test_fish_has_no_max_len():
    """Issue 18: `--max-len` on fish-s2-pro was silently ignored."""
    with pytest.raises(OptionsError, match="fish-s2-pro has no option 'max_len'"):
        get_family("fish-s2-pro").options(max_len=64)


@pytest.mark.parametrize("name", ALL)
def test_passes_account_for_every_parameter(name):
    """loaded = kept + pruned + folded for every stage (what `inspect` shows), measured on the tiny preset."""
    fam = get_family(name)
    for spec in fam.specs(fam.options(preset="tiny")):
        module = spec.make_module()
        loaded = count_parameters(module)["params"]
        rewritten = copy.deepcopy(module)
        reports = [p(rewritten) for p in spec.passes]
        kept = count_parameters(rewritten)["params"]
        pruned = sum(v for r in reports for v in (r.get("dropped") or {}).values())
        folded = sum(v for r in reports for v in (r.get("folded") or {}).values())
        assert loaded == kept + pruned + folded, (spec.name, loaded, kept, pruned, folded)


# ------------------------------------------------------------------------------------------ a toy family
TOY = {
    "__init__.py": '''
        """A toy family: one stage, y = relu(x W + b)."""
        from ttsaot.builder.family import Family
        from .options import ToyOptions

        FAMILY = Family(name="toy-scaler", presets=("tiny",), Options=ToyOptions, stages=("scale",),
                        package=__name__)
        ''',
    "options.py": """
        from dataclasses import dataclass
        from ttsaot.builder.options import BuildOptions, flag, positive_int

        @dataclass
        class ToyOptions(BuildOptions):
            width: int = flag(8, parse=positive_int, help="Features per row.")
        """,
    "config.py": """
        from dataclasses import dataclass

        @dataclass(frozen=True)
        class ToyConfig:
            width: int
        """,
    "modules.py": """
        import torch
        from torch import nn

        class Scaler(nn.Module):
            def __init__(self, width: int) -> None:
                super().__init__()
                self.proj = nn.Linear(width, width)

            def forward(self, x):
                return torch.relu(self.proj(x))
        """,
    "checkpoint.py": """
        import torch

        def init_random(module, seed):
            g = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for p in module.parameters():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            return module.eval()
        """,
    "stages.py": """
        import torch
        from ttsaot.builder.buckets import BucketPlan, batch_sizes
        from ttsaot.builder.stage_spec import StageSpec
        from .checkpoint import init_random
        from .config import ToyConfig
        from .modules import Scaler

        def scale_stage(opts):
            cfg = ToyConfig(opts.width)

            def make_inputs(sizes, g):
                return {"x": torch.randn(sizes["batch"], cfg.width, generator=g)}

            return StageSpec(family="toy-scaler", name="scale", kind="generic",
                             make_module=lambda: init_random(Scaler(cfg.width), opts.seed), passes=[],
                             plan=BucketPlan({"batch": batch_sizes(opts.max_batch, opts.batch_buckets)}),
                             make_inputs=make_inputs,
                             inputs=[{"name": "x", "dtype": "float32", "shape": ["batch", cfg.width], "pad": 0}],
                             outputs=[{"name": "y", "dtype": "float32", "shape": ["batch", cfg.width]}],
                             dtype=opts.dtype or torch.float32, tolerance=1e-4, config={"width": cfg.width})

        STAGES = {"scale": scale_stage}

        def default_stages(opts):
            return tuple(STAGES)
        """,
}


@pytest.fixture
def toy_family(tmp_path, monkeypatch):
    pkg = tmp_path / "plugins" / "ttsaot_toy_family"
    pkg.mkdir(parents=True)
    for name, text in TOY.items():
        (pkg / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    fam = register_family("ttsaot_toy_family")
    yield fam
    FAMILIES.pop(fam.name)
    for mod in [m for m in sys.modules if m.startswith("ttsaot_toy_family")]:
        del sys.modules[mod]


def test_a_family_outside_the_repository_builds_and_loads(toy_family, tmp_path):
    """Issue 18's done-when: a toy family from a temporary package, registered with one call, gets its own CLI
    flag, is refused flags it does not declare, and builds + loads on CPU."""
    from ttsaot.runtime import load

    runner = CliRunner()
    r = runner.invoke(main, ["list"])
    assert r.exit_code == 0 and "toy-scaler" in r.output and "--width" in r.output
    r = runner.invoke(main, ["build", "toy-scaler", "--random-weights", "--max-len", "4"])
    assert r.exit_code == 2 and "--max-len is not an option of toy-scaler" in r.output
    r = runner.invoke(main, ["build", "qwen3-tts-12hz", "--random-weights", "--width", "4"])
    assert r.exit_code == 2 and "--width is not an option of qwen3-tts-12hz" in r.output
    r = runner.invoke(
        main,
        [
            "build",
            "toy-scaler",
            "--random-weights",
            "--width",
            "6",
            "--batch-buckets",
            "2",
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert r.exit_code == 0, r.output
    stage = load(tmp_path / "out" / "toy-scaler")["scale"]
    x = torch.randn(1, 6)
    module = toy_family.specs(toy_family.options(width=6), ["scale"])[0].make_module()
    with torch.no_grad():
        assert torch.allclose(stage(x), module(x), atol=1e-6)


def test_register_refuses_a_package_without_a_family(tmp_path, monkeypatch):
    pkg = tmp_path / "not_a_family"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("FAMILY = 'qwen3-tts-12hz'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TypeError, match="does not export FAMILY = Family"):
        register_family("not_a_family")


def test_a_flag_is_a_switch_or_takes_a_value_for_every_family():
    """One CLI option per flag name: families declaring the same flag agree on its kind."""
    from ttsaot.builder.cli import _family_flags

    for name, owners in _family_flags().items():
        assert len({fl.is_switch for _, fl in owners}) == 1, name
    assert dataclasses.is_dataclass(get_family("voxcpm2").Options)


def test_auto_kernels_on_cuda_follow_what_the_gpu_verified():
    """`--kernels auto` takes the kernel layer on CUDA only where its build was verified and timed on a GPU
    (bf16 code2wav, dac_decoder at every precision, dac_encoder, vae_decoder, bf16 base_lm_step and
    residual_lm_step, bf16 code_predictor and fast_ar); the others keep Inductor unless asked (`--kernels ttsaot`);
    CPU is Inductor."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    expect = {
        ("qwen3-tts-12hz", "code2wav"): "ttsaot",
        ("fish-s2-pro", "dac_decoder"): "ttsaot",  # the CPU default, exact fp32, too
        ("qwen3-tts-12hz", "code_predictor"): "ttsaot",
        ("fish-s2-pro", "fast_ar"): "ttsaot",
        ("fish-s2-pro", "dac_encoder"): "ttsaot",
        ("voxcpm2", "base_lm_step"): "ttsaot",
        ("voxcpm2", "residual_lm_step"): "ttsaot",
        ("voxcpm2", "vae_decoder"): "ttsaot",
    }
    for (family, stage), on_cuda in expect.items():
        fam = get_family(family)
        for kernels, want_cuda in (("auto", on_cuda), ("ttsaot", "ttsaot"), ("inductor", "inductor")):
            spec = fam.specs(fam.options(preset="tiny", kernels=kernels), [stage])[0]
            assert spec.kernel_passes, (family, stage)
            assert spec.kernels_on(cuda) == want_cuda, (family, stage, kernels)
            assert spec.kernels_on(cpu) == ("ttsaot" if kernels == "ttsaot" else "inductor"), (family, stage, kernels)
    bf16_dac = get_family("fish-s2-pro").options(preset="tiny", dac_decoder_precision="bf16")
    assert get_family("fish-s2-pro").specs(bf16_dac, ["dac_decoder"])[0].kernels_on(cuda) == "ttsaot"
    fp32_lm = get_family("voxcpm2").options(preset="tiny", dtype=torch.float32)
    assert get_family("voxcpm2").specs(fp32_lm, ["base_lm_step"])[0].kernels_on(cuda) == "inductor"
    fp32_c2w = get_family("qwen3-tts-12hz").options(preset="tiny", dtype=torch.float32)
    assert get_family("qwen3-tts-12hz").specs(fp32_c2w, ["code2wav"])[0].kernels_on(cuda) == "inductor"
    assert get_family("qwen3-tts-12hz").specs(fp32_c2w, ["code_predictor"])[0].kernels_on(cuda) == "inductor"
    fp32_fish = get_family("fish-s2-pro").options(preset="tiny", dtype=torch.float32)
    assert get_family("fish-s2-pro").specs(fp32_fish, ["fast_ar"])[0].kernels_on(cuda) == "inductor"
