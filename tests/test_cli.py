"""`build-artifacts` end to end: build, inspect, verify (incl. regression exit 1), list, one-line errors."""

import hashlib
import json

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from ttsaot.builder.cli import main


@pytest.fixture(scope="module")
def cli_artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli")
    r = CliRunner().invoke(main, ["build", "qwen3-tts-12hz", "--stages", "code2wav", "--preset", "tiny",
                                  "--random-weights", "--dtype", "fp32", "--batch-buckets", "1",
                                  "--frame-buckets", "8", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out / "qwen3-tts-12hz"


def test_build_writes_a_verified_artifact(cli_artifact):
    m = json.loads((cli_artifact / "manifest.json").read_text())
    assert [b["key"] for b in m["stages"]["code2wav"]["buckets"]] == ["b1_f8"]
    assert not list(cli_artifact.parent.glob(".qwen3-tts-12hz.tmp-*"))


def test_inspect_json(cli_artifact):
    r = CliRunner().invoke(main, ["inspect", str(cli_artifact), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    st = d["stages"][0]
    assert st["stage"] == "code2wav" and st["buckets"] == ["b1_f8"]
    assert "decoder.quantizer.rvq_first.input_proj.weight" not in st["dropped"]   # random weights: no checkpoint
    assert st["params_after"]["params"] > 0


def test_inspect_table(cli_artifact):
    r = CliRunner().invoke(main, ["inspect", str(cli_artifact)])
    assert r.exit_code == 0 and "code2wav" in r.output


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


@pytest.mark.parametrize("args, needle", [
    (["build", "no-such-family", "--random-weights"], "unknown family"),
    (["build", "qwen3-tts-12hz"], "exactly one of"),
    (["build", "qwen3-tts-12hz", "--random-weights", "--stages", "vocoder"], "unknown stage"),
    (["build", "qwen3-tts-12hz", "--random-weights", "--frame-buckets", "8,x"], "comma-separated"),
])
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
