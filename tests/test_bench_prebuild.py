"""`python -m bench build`: artifacts built ahead of `bench run`, into the cache `bench run` then reuses."""

import argparse

import pytest

from bench.artifacts import artifact_key
from bench.prebuild import parse_target
from bench.specs import make_spec

from . import bench_fixtures

local_encoder_bench_cache = bench_fixtures.local_encoder_bench_cache  # one prebuild, shared with test_bench_profile


def test_targets_parse_and_bad_ones_are_refused():
    assert parse_target("voxcpm2/locdit") == ("voxcpm2", "locdit", None)
    assert parse_target("fish-s2-pro/dac_decoder:bf16") == ("fish-s2-pro", "dac_decoder", "bf16")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_target("locdit")


@pytest.mark.slow
def test_build_lands_where_bench_run_looks(local_encoder_bench_cache):
    # the fixture ran `python -m bench build voxcpm2/local_encoder:fp32 --axis batch=1 --device cpu --cache-dir ...`
    import torch

    family, stage, dtype = parse_target(bench_fixtures.TARGET)
    spec, desc = make_spec(family, stage, "tiny", axes=bench_fixtures.AXES, dtype=dtype, device="cpu")
    key = artifact_key(spec, desc, torch.device("cpu"))
    cache = local_encoder_bench_cache
    assert (cache / key / ".done").is_file() and (cache / key / "voxcpm2" / "manifest.json").is_file()


def test_a_second_kernel_choice_is_built_only_where_it_changes_the_program():
    from dataclasses import replace

    import torch

    from bench.artifacts import same_program_as_auto

    spec, _ = make_spec("fish-s2-pro", "fast_ar", "tiny")
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    # a stage that is opt-in on CUDA (auto = inductor): kernels=inductor names the auto artifact itself
    spec = replace(spec, cuda_auto_kernels="inductor")
    assert same_program_as_auto(spec, "inductor", cuda) is None
    spec = replace(spec, cuda_auto_kernels="ttsaot")
    plain, wired = replace(spec, kernel_passes=[]), replace(spec, kernel_passes=[lambda m: {"pass": "k"}])
    assert "no kernel passes" in same_program_as_auto(plain, "inductor", cuda)
    assert same_program_as_auto(wired, "inductor", cuda) is None
    assert same_program_as_auto(plain, "auto", cuda) is None and same_program_as_auto(plain, "ttsaot", cuda) is None
    assert same_program_as_auto(plain, "inductor", cpu) is None  # one shared artifact on CPU (keys equal)


def test_ttsaot_kernels_variant_loads_the_kernel_layer_build():
    """`ttsaot_kernels` measures the opt-in kernel layer (kernels=ttsaot) beside `ttsaot_graph` (auto), where the
    stage keeps Inductor's code by default: the codebook predictors."""
    from types import SimpleNamespace

    import torch

    from bench.variants import ALL_VARIANTS, TTSAOT, VARIANT_KERNELS, TtsaotVariant, make_variant

    assert "ttsaot_kernels" in ALL_VARIANTS and "ttsaot_kernels" in TTSAOT
    assert VARIANT_KERNELS["ttsaot_kernels"] == "ttsaot" != VARIANT_KERNELS["ttsaot_graph"]
    v = make_variant("ttsaot_kernels", SimpleNamespace(device=torch.device("cpu")))
    assert isinstance(v, TtsaotVariant) and v.kernels == "ttsaot" and v.graphs is False and v.name == "ttsaot_kernels"
