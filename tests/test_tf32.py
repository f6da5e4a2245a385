"""`--tf32`: fp32 stages may opt into TF32 on CUDA (what PyTorch's defaults give the reference); stages that are fp32
by policy stay exact, and the runtime enforces the built-for setting around every call whatever the global flags."""

import json

import pytest
import torch
from click.testing import CliRunner

from ttsaot.builder.cli import main
from ttsaot.builder.families import get_family
from ttsaot.builder.stage_spec import TF32_TOLERANCE, with_tf32
from ttsaot.runtime.stage import fp32_mode

from . import fish_fixtures

fish_dac_ckpt = fish_fixtures.fish_dac_ckpt  # the session fixture's codec.pth


def _fish_specs(dtype=None):
    fam = get_family("fish-s2-pro")
    return {s.name: s for s in fam.specs(fam.options(preset="tiny", dtype=dtype))}


def test_only_fp32_stages_that_are_not_fp32_by_policy_opt_in():
    specs = _fish_specs()
    dec = with_tf32(specs["dac_decoder"])
    assert dec.metadata["allow_tf32"] is True and dec.tolerance == max(specs["dac_decoder"].tolerance, TF32_TOLERANCE)
    assert with_tf32(specs["dac_encoder"]) is specs["dac_encoder"]  # codes stay exact
    bf16 = _fish_specs(torch.bfloat16)["dac_decoder"]
    assert with_tf32(bf16) is bf16


@pytest.mark.parametrize("tf32", [False, True])
def test_fp32_mode_sets_the_built_for_flags_and_restores_the_callers(tf32):
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = not tf32
    try:
        with fp32_mode(True, tf32=tf32):
            assert torch.backends.cudnn.allow_tf32 is tf32 and torch.backends.cuda.matmul.allow_tf32 is tf32
        assert torch.backends.cudnn.allow_tf32 is (not tf32)
        with fp32_mode(False, tf32=tf32):  # bf16 / CPU stages: untouched
            assert torch.backends.cudnn.allow_tf32 is (not tf32)
        with fp32_mode(True, tf32=False):
            assert torch.backends.cudnn.allow_tf32 is False
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.slow
def test_cli_tf32_is_recorded_in_the_manifest(fish_dac_ckpt, tmp_path):
    # The codec, plan and streaming of tests/fish_fixtures.py `fish_dac_tiny`: --tf32 changes no CPU program, so
    # this build reuses that fixture's packages from the run's package cache (exported, checked, not compiled).
    stream = fish_fixtures._streaming()
    r = CliRunner().invoke(
        main,
        [
            "build",
            "fish-s2-pro",
            "--stages",
            "dac_decoder,dac_encoder",
            "--preset",
            "tiny",
            "--checkpoint",
            str(fish_dac_ckpt),
            "--batch-buckets",
            ",".join(map(str, fish_fixtures.DECODER_BATCH)),
            "--frame-buckets",
            ",".join(map(str, fish_fixtures.DECODER_FRAMES)),
            "--encoder-seconds",
            ",".join(map(str, fish_fixtures.ENCODER_SECONDS)),
            "--chunk-frames",
            str(stream.chunk_frames),
            "--left-context-frames",
            str(stream.left_context_frames),
            "--first-chunk-frames",
            str(stream.first_chunk_frames),
            "--nonstreaming-chunk-frames",
            str(stream.nonstreaming_chunk_frames),
            "--tf32",
            "--out",
            str(tmp_path),
        ],
    )
    assert r.exit_code == 0, r.output
    stages = json.loads((tmp_path / "fish-s2-pro" / "manifest.json").read_text())["stages"]
    assert stages["dac_decoder"]["metadata"]["allow_tf32"] is True
    assert stages["dac_decoder"]["tolerance"] >= TF32_TOLERANCE
    assert "allow_tf32" not in stages["dac_encoder"]["metadata"]
    shown = CliRunner().invoke(main, ["inspect", str(tmp_path / "fish-s2-pro"), "--json"])
    rows = {r["stage"]: r for r in json.loads(shown.output)["stages"]}
    assert rows["dac_decoder"]["tf32"] is True and rows["dac_encoder"]["tf32"] is False


def test_regions_of_different_settings_never_interleave_across_threads():
    """While one thread runs an exact-fp32 stage, another thread's TF32 stage waits: the flags are global."""
    import threading

    exact, fast = fp32_mode(True, tf32=False), fp32_mode(True, tf32=True)
    inside, release, seen = threading.Event(), threading.Event(), []

    def hold_exact():
        with exact:
            inside.set()
            release.wait(5)
            seen.append(("exact", torch.backends.cudnn.allow_tf32))

    def run_fast():
        with fast:
            seen.append(("fast", torch.backends.cudnn.allow_tf32))

    before = torch.backends.cudnn.allow_tf32
    t1 = threading.Thread(target=hold_exact)
    t1.start()
    assert inside.wait(5)
    t2 = threading.Thread(target=run_fast)
    t2.start()
    t2.join(0.3)
    assert t2.is_alive()  # blocked until the exact region ends
    release.set()
    t1.join(5)
    t2.join(5)
    assert seen == [("exact", False), ("fast", True)]
    assert torch.backends.cudnn.allow_tf32 == before
