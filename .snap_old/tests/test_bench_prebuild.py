"""`python -m bench build`: artifacts built ahead of `bench run`, into the cache `bench run` then reuses."""

import argparse
import subprocess
import sys

import pytest

from bench.artifacts import artifact_key
from bench.prebuild import parse_target
from bench.specs import make_spec


def test_targets_parse_and_bad_ones_are_refused():
    assert parse_target("voxcpm2/locdit") == ("voxcpm2", "locdit", None)
    assert parse_target("fish-s2-pro/dac_decoder:bf16") == ("fish-s2-pro", "dac_decoder", "bf16")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_target("locdit")


@pytest.mark.slow
def test_build_lands_where_bench_run_looks(tmp_path):
    import torch

    cmd = [
        sys.executable,
        "-m",
        "bench",
        "build",
        "voxcpm2/local_encoder",
        "--device",
        "cpu",
        "--jobs",
        "1",
        "--cache-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    spec, desc = make_spec("voxcpm2", "local_encoder", "tiny")
    key = artifact_key(spec, desc, torch.device("cpu"))
    assert (tmp_path / key / ".done").is_file() and (tmp_path / key / "voxcpm2" / "manifest.json").is_file()


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
