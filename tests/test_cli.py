"""`build-artifacts` end to end: build, inspect, verify (incl. regression exit 1), list, one-line errors."""

import hashlib
import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from ttsaot.builder.cli import main

from . import package_cache_fixtures as pcf
from .conftest import built_artifact
from .package_cache_fixtures import cache_copy

CLI_BUILD = [
    "build",
    "qwen3-tts-12hz",
    "--stages",
    "code2wav",
    "--preset",
    "tiny",
    "--random-weights",
    "--dtype",
    "fp32",
    "--batch-buckets",
    "1",
    "--frame-buckets",
    "8",
]


def _cli_build(out, cache):
    # the CLI's package cache is $TTSAOT_CACHE_DIR (the run's, tests/conftest.py), here a copy of a cache that holds
    # this build's one package (tests/package_cache_fixtures.py `filled_cache`): the CLI reuses it, not compiles it
    with tempfile.TemporaryDirectory() as tmp:
        env = {"TTSAOT_CACHE_DIR": str(cache_copy(cache, Path(tmp) / "cache"))}
        r = CliRunner().invoke(main, [*CLI_BUILD, "--out", str(out)], env=env)
    assert r.exit_code == 0, r.output
    # not a terminal: one progress line per compiled package (what `bench builds` keeps of a stopped build)
    assert re.search(r"\[\s*\d+\.\ds\] code2wav/b1_f8 compiled \(\d+s\)", r.output), r.output
    return out / "qwen3-tts-12hz"


filled_cache = pcf.filled_cache


@pytest.fixture(scope="session")
def cli_artifact(filled_cache):
    """Built once per run (tests/conftest.py `built_artifact`; a module fixture built it again on each xdist worker
    that ran a test of this file). Read-only: the tests that edit it take a copy."""
    return built_artifact("cli-qwen-b1-f8", lambda out: _cli_build(out, filled_cache[0]))


def test_build_writes_a_verified_artifact(cli_artifact):
    m = json.loads((cli_artifact / "manifest.json").read_text())
    assert [b["key"] for b in m["stages"]["code2wav"]["buckets"]] == ["b1_f8"]
    assert not list(cli_artifact.parent.glob(".qwen3-tts-12hz.tmp-*"))


def test_the_same_build_again_is_up_to_date_and_another_is_not(cli_artifact, tmp_path, monkeypatch):
    """The CLI names its inputs (builder/build_inputs.py): the same command over the artifact it built checks it
    and leaves it; another seed starts a build (stopped where it would prepare the stages)."""
    shutil.copytree(cli_artifact, tmp_path / cli_artifact.name)
    manifest = (tmp_path / cli_artifact.name / "manifest.json").read_text()
    r = CliRunner().invoke(main, [*CLI_BUILD, "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "is up to date" in r.output and "up to date, checked" in r.output, r.output
    assert (tmp_path / cli_artifact.name / "manifest.json").read_text() == manifest
    from ttsaot.builder import build as build_mod

    def prepare(*a, **k):
        raise RuntimeError("the build started")

    monkeypatch.setattr(build_mod, "prepare_stage", prepare)
    r = CliRunner().invoke(main, [*CLI_BUILD, "--out", str(tmp_path), "--seed", "1"])
    assert r.exit_code != 0 and "the build started" in r.output and "up to date" not in r.output, r.output
    assert (tmp_path / cli_artifact.name / "manifest.json").read_text() == manifest


def test_inspect_json(cli_artifact):
    r = CliRunner().invoke(main, ["inspect", str(cli_artifact), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    st = d["stages"][0]
    assert st["stage"] == "code2wav" and st["buckets"] == ["b1_f8"]
    assert "decoder.quantizer.rvq_first.input_proj.weight" not in st["dropped"]  # random weights: no checkpoint
    assert st["params_after"]["params"] > 0


def test_inspect_counts_a_shared_package_once(qwen_tiny_fp32, cli_artifact):
    from ttsaot.builder.cli import _packaging_cell

    r = CliRunner().invoke(main, ["inspect", str(qwen_tiny_fp32), "--json"])
    assert r.exit_code == 0, r.output
    st = json.loads(r.output)["stages"][0]
    assert len(st["buckets"]) == 6 and st["packages"] == 1 and st["packaging"]["mode"] == "dynamic"
    assert st["packages_mib"] == round((qwen_tiny_fp32 / "code2wav/dynamic.pt2").stat().st_size / 2**20, 3)
    assert _packaging_cell(1, st["packaging"]) == " in 1 package (dynamic batch 1-2, frames 8-48)"
    one = json.loads(CliRunner().invoke(main, ["inspect", str(cli_artifact), "--json"]).output)["stages"][0]
    assert one["packages"] == 1 and one["packaging"]["mode"] == "static"  # one bucket: nothing to make dynamic
    assert _packaging_cell(1, one["packaging"]) == " in 1 package (static: no axis has more than one size)"


def test_inspect_table(cli_artifact):
    r = CliRunner().invoke(main, ["inspect", str(cli_artifact)])
    assert r.exit_code == 0 and "code2wav" in r.output


def _package(path, meta):
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("b1/data/aotinductor/model/s_b1.wrapper_metadata.json", json.dumps(meta))
    return str(path)


def test_inspect_names_the_packages_launched_with_pdl(cli_artifact, tmp_path):
    """A package's programmatic-launch and streamed-tile choices are read from its AOTI metadata without loading it:
    only CUDA packages built with them count (a CPU package records the bucket's wish but launches nothing)."""
    from ttsaot.builder.cli import _cuda, _launches_with_pdl, _package_metadata

    def meta(name, m):
        return _package_metadata(_package(tmp_path / name, m))

    assert _launches_with_pdl(meta("a.pt2", {"AOTI_DEVICE_KEY": "cuda", "ttsaot_pdl": "1"}))
    assert not _launches_with_pdl(meta("b.pt2", {"AOTI_DEVICE_KEY": "cuda", "ttsaot_pdl": "0"}))
    assert not _launches_with_pdl(meta("c.pt2", {"AOTI_DEVICE_KEY": "cpu", "ttsaot_pdl": "1"}))
    assert not _launches_with_pdl(meta("d.pt2", {"AOTI_DEVICE_KEY": "cuda"}))
    assert _cuda(meta("s.pt2", {"AOTI_DEVICE_KEY": "cuda", "ttsaot_skinny_stream": "1"}), "ttsaot_skinny_stream")
    assert not _cuda(meta("q.pt2", {"AOTI_DEVICE_KEY": "cpu", "ttsaot_qkv_attention": "1"}), "ttsaot_qkv_attention")
    (tmp_path / "e.pt2").write_bytes(b"not a zip")
    assert _package_metadata(str(tmp_path / "e.pt2")) == {} == _package_metadata(str(tmp_path / "missing.pt2"))
    r = CliRunner().invoke(main, ["inspect", str(cli_artifact), "--json"])
    stage = json.loads(r.output)["stages"][0]
    # a CPU build
    assert stage["pdl_buckets"] == [] == stage["stream_buckets"] == stage["qkv_attention_buckets"]
    assert stage["swap_ab_buckets"] == []
    assert stage["norm_out_off_buckets"] == [] == stage["attention_o_buckets"]


def test_packages_record_the_norm_hand_over_switch(monkeypatch):
    """Each package's metadata says whether it was traced with TTSAOT_NORM_OUT=0, which inspect lists."""
    from ttsaot.builder.build import _trace_switches

    monkeypatch.delenv("TTSAOT_NORM_OUT", raising=False)
    assert _trace_switches()["ttsaot_norm_out_off"] == "0"
    monkeypatch.setenv("TTSAOT_NORM_OUT", "0")
    assert _trace_switches()["ttsaot_norm_out_off"] == "1"


def test_packages_record_the_attention_o_switch(monkeypatch):
    """And whether they were traced with TTSAOT_ATTENTION_O=1 (off by default), which inspect lists too."""
    from ttsaot.builder.build import _trace_switches

    monkeypatch.delenv("TTSAOT_ATTENTION_O", raising=False)
    assert _trace_switches()["ttsaot_attention_o"] == "0"
    monkeypatch.setenv("TTSAOT_ATTENTION_O", "1")
    assert _trace_switches()["ttsaot_attention_o"] == "1"


def test_verify_ok_then_regression_exits_1(cli_artifact, tmp_path):
    r = CliRunner().invoke(main, ["verify", str(cli_artifact)])
    assert r.exit_code == 0, r.output
    import shutil

    art = tmp_path / "a"
    shutil.copytree(cli_artifact, art)
    gpath = art / "golden" / "code2wav.safetensors"
    g = load_file(str(gpath))
    for k in g:
        if "/out/" in k:
            g[k] = g[k] * 1.5
    save_file(g, str(gpath))
    m = json.loads((art / "manifest.json").read_text())
    m["stages"]["code2wav"]["golden"]["sha256"] = hashlib.sha256(gpath.read_bytes()).hexdigest()
    m["stages"]["code2wav"]["golden"]["bytes"] = gpath.stat().st_size
    (art / "manifest.json").write_text(json.dumps(m))
    r = CliRunner().invoke(main, ["verify", str(art)])
    assert r.exit_code == 1
    assert "regression" in r.output


def test_list():
    r = CliRunner().invoke(main, ["list"])
    assert r.exit_code == 0 and "qwen3-tts-12hz" in r.output and "code2wav" in r.output


@pytest.mark.parametrize(
    "args, needle",
    [
        (["build", "no-such-family", "--random-weights"], "unknown family"),
        (["build", "qwen3-tts-12hz"], "exactly one of"),
        (["build", "qwen3-tts-12hz", "--random-weights", "--stages", "vocoder"], "unknown stage"),
        (["build", "qwen3-tts-12hz", "--random-weights", "--frame-buckets", "8,x"], "comma-separated"),
    ],
)
def test_errors_are_one_line(args, needle):
    r = CliRunner().invoke(main, args)
    assert r.exit_code != 0
    assert needle in r.output
    assert "Traceback" not in r.output


def test_corrupt_artifact_one_line_error(cli_artifact, tmp_path):
    import shutil

    art = tmp_path / "b"
    shutil.copytree(cli_artifact, art)
    (art / "code2wav.safetensors").write_bytes(b"garbage")
    r = CliRunner().invoke(main, ["verify", str(art)])
    assert r.exit_code == 1 and "error:" in r.output and "Traceback" not in r.output


# --------------------------------------------------------------------------- answers at once, exit codes
# Runs the CLI in a fresh interpreter and reports its exit code and whether torch (seconds to import) was loaded.
_PROBE = """
import sys
from ttsaot.builder.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code
else:
    code = 0
family_parts = sorted({m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("ttsaot.builder.families.")
                       and m.count(".") == 4})
print("PROBE", code, "torch" in sys.modules, ",".join(family_parts))
"""


def _probe(*args: str) -> tuple[int, bool, str, str]:
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=120)
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("PROBE"))
    _, code, torch_loaded, parts = (line.split(" ") + [""])[:4]
    return int(code), torch_loaded == "True", parts, p.stdout + p.stderr


@pytest.mark.parametrize(
    "args, code",
    [
        (["--help"], 0),
        (["build", "--help"], 0),
        (["list"], 0),
        (["--debug", "list"], 0),
        (["list", "--debug"], 0),
        (["build", "qwen3-tts-12hz", "--random-weights", "--max-batch", "0"], 2),
        (["build", "qwen3-tts-12hz", "--random-weights", "--batch-buckets", "0,4"], 2),
        (["build", "fish-s2-pro", "--random-weights", "--max-len", "64"], 2),
        (["build", "voxcpm2", "--random-weights", "--n-timesteps", "1", "--debug"], 2),
        (["--debug", "build", "voxcpm2", "--random-weights", "--chunk-frames", "0"], 2),
        (["build", "no-such-family", "--random-weights"], 2),
        (["build", "qwen3-tts-12hz"], 2),
        (["build", "qwen3-tts-12hz", "--random-weights", "--stages", "vocoder"], 2),
        (["build", "qwen3-tts-12hz", "--random-weights", "--preset", "huge"], 2),
        (["build", "qwen3-tts-12hz", "--random-weights", "--talker-size", "3B"], 2),
        (["build", "qwen3-tts-12hz", "--random-weights", "--format", "tflite"], 2),
        (["build", "qwen3-tts-12hz", "--random-weights", "--dtype", "int8"], 2),
        (["build", "qwen3-tts-12hz", "--random-weights", "--no-such-flag"], 2),
    ],
)
def test_help_list_and_usage_errors_answer_before_torch_is_imported(args, code):
    """Issue 19: --help, list and every usage error answer at once (torch and the family modules are imported only
    once the arguments are valid); usage errors exit 2."""
    got, torch_loaded, parts, out = _probe(*args)
    assert got == code, out
    assert not torch_loaded, out
    assert set(filter(None, parts.split(","))) <= {"options"}, parts  # the families' options, nothing else


def test_failures_exit_1_and_say_what_to_do():
    from ttsaot.builder import cli

    hint = cli._hint("code_predictor/b3: artifact output 'codes' differs from eager (mismatches 1 > 0)")
    assert "--dtype fp32" in hint and "--no-verify" in hint
    r = CliRunner().invoke(main, ["inspect", "."])  # a folder without a manifest
    assert r.exit_code == 1 and "error:" in r.output and "Traceback" not in r.output


def test_names_the_cli_checks_before_torch_match_the_builders():

    from ttsaot.builder import cli
    from ttsaot.builder.build import FORMATS

    assert cli.ARTIFACT_FORMATS == FORMATS


def test_verify_on_a_folder_of_artifacts_names_them(cli_artifact):
    r = CliRunner().invoke(main, ["verify", str(cli_artifact.parent)])
    assert r.exit_code == 2 and str(cli_artifact) in r.output


def test_inspect_accounts_for_every_parameter(cli_artifact):
    """Issue 19: 'kept 124297 / dropped 0 (of 125321 loaded)' left 1,024 parameters unexplained: the codebook usage
    counts folded into the baked table."""
    r = CliRunner().invoke(main, ["inspect", str(cli_artifact), "--json"])
    p = json.loads(r.output)["stages"][0]["params"]
    assert p["loaded"] == p["kept"] + p["pruned"] + p["folded"] and p["unaccounted"] == 0
    assert p["folded"] == 16 * 64  # 16 books × 64 codes of cluster_usage (tiny preset)
    r = CliRunner().invoke(main, ["inspect", str(cli_artifact)])
    assert "None" not in r.output and "folded" in r.output and "1024" in r.output


def test_readme_lists_every_build_option_and_every_error():
    """The README's CLI reference cannot drift from the CLI: every `build` flag (generic or a family's) and every
    typed error appears in it."""
    import inspect as pyinspect
    from pathlib import Path

    import click

    from ttsaot.builder import cli
    from ttsaot.runtime import audio, errors

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    flags = {
        o
        for p in cli.build.get_params(click.Context(cli.build))
        if isinstance(p, click.Option)
        for o in p.opts
        if o.startswith("--") and o != "--help"
    }
    assert flags and not [f for f in sorted(flags) if f"`{f}" not in readme]
    typed = [
        c.__name__
        for mod in (errors, audio)
        for _, c in pyinspect.getmembers(mod, pyinspect.isclass)
        if issubclass(c, errors.TTSAOTError) and c.__module__ == mod.__name__
    ]
    typed += ["OptionsError", "CheckpointError", "BuildError", "CompileError", "OnnxExportError"]
    assert not [e for e in typed if f"`{e}`" not in readme and f"`{e}`," not in readme]
