"""`python -m bench builds`: what a deployment pays once — each family's default build, cold and cached — and what
every process start pays: fresh process → first output for every stage of the built artifact.

Per family, through the public CLI (`python -m ttsaot.builder.cli build ...`, what `build-artifacts` runs), each in
a fresh process:
  cold    empty package cache (--cache-dir) and empty Inductor/Triton caches, as on a new machine;
  warm    the same command again, nothing changed: the installed artifact is checked and left as it was
          (builder/build_inputs.py);
  then, for every stage of the artifact, bench/coldstart.py's fresh-process measurement (import torch → load →
          first call → output on the host), fed the stage's own first golden case;
  cached  the same command into a new --out: every package should come from the package cache.
Each build's console output is kept, every line stamped with its time, in build_logs/<family>-<phase>.log.

--budget bounds the whole run: a section that cannot start with SECTION_MIN_S left, or runs past the budget (the
build is stopped with SIGTERM, which leaves no temporary folder), is recorded `skipped` with the reason; the JSON
is rewritten after every section so a killed run keeps what it measured."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .common import REPO, git_commit, now_iso, short_error, write_json

SECTION_MIN_S = 20.0  # a section with less budget left than this is not started
BUILD_GRACE_S = 20.0  # SIGTERM → SIGKILL: time for the build to remove its temporary folder
STOP_WAIT_S = 15.0  # the same when the bench itself is terminated (inside a `timeout -k 20`)
_RUNNING: list[subprocess.Popen] = []  # the build in flight: a SIGTERM to the bench stops it too (own session)
REUSED_NOTE = re.compile(r"(\w+): (\d+) of (\d+) packages reused from the (?:package cache|installed artifact)")
UP_TO_DATE_NOTE = "is up to date: built from the same inputs"
PHASES = ("cold", "warm", "cached")
# The measurements first (cold build, no-change rebuild, fresh process → first output), then the cached build
# into a new --out: on the H100 Fish's three builds used the whole budget and the cold starts were skipped.
COLD_STARTS_AFTER = "warm"


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def add_parser(sub) -> None:
    p = sub.add_parser("builds", help="each family's default build, cold and cached, and every stage's cold start")
    p.add_argument("--families", type=_csv, default=None, help="comma-separated (default: every family)")
    p.add_argument(
        "--stages",
        type=_csv,
        default=None,
        help="only these stages of each family (a deviation from the default build, recorded)",
    )
    p.add_argument("--preset", default=None, help="full (default on CUDA) or tiny (default on CPU)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--jobs", type=int, default=None, help="build --jobs (default: the builder's default_jobs())")
    p.add_argument("--budget", type=float, default=3600.0, help="seconds for the whole run; later sections skipped")
    p.add_argument("--coldstart-budget", type=float, default=180.0, help="seconds per cold-start process")
    p.add_argument(
        "--build-args",
        default="",
        help="extra `build` flags, e.g. '--max-batch 1' (a deviation from the default build, recorded)",
    )
    p.add_argument("--result", default=None, help="JSON path (default: <out>/<device-slug>/builds.json)")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))


# a stopped build's record keeps this many of its last progress lines (one per compiled package, the notes)
LOG_TAIL_LINES = 40


def progress_lines(log: str) -> list[str]:
    """The build's own lines, without the libraries' warnings that crowd a stopped build's output (a warning's
    line, and the indented source line Python prints under it)."""
    noise = ("warn", "cudaipctypes", "resource_tracker")
    out, after_warning = [], False
    for ln in log.strip().splitlines():
        if any(n in ln.lower() for n in noise):
            after_warning = True
            continue
        if after_warning and ln.startswith((" ", "\t")):
            continue
        after_warning = False
        if ln.strip():
            out.append(ln)
    return out


def parse_reuse(log: str) -> dict[str, dict[str, int]]:
    """The build's per-stage cache note → {stage: {"packages": n, "reused": r, "compiled": n - r}}."""
    out = {}
    for stage, reused, total in REUSED_NOTE.findall(log):
        out[stage] = {"packages": int(total), "reused": int(reused), "compiled": int(total) - int(reused)}
    return out


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the build's process group (its compile workers with it), SIGKILL what is left after the grace."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=BUILD_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()


class _TimedLog:
    """A build's console output, read as it comes: the text (for the notes parsed above) and each line stamped
    with the seconds since the build started, written to `path` (the build's timeline: when each stage was
    prepared, when its compiles were submitted and finished)."""

    def __init__(self, proc: subprocess.Popen, t0: float, path: Path) -> None:
        self.lines: list[str] = []
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._pump, args=(proc, t0), daemon=True)
        self._thread.start()

    def _pump(self, proc: subprocess.Popen, t0: float) -> None:
        with self.path.open("w") as f:
            for ln in proc.stdout:
                self.lines.append(ln)
                f.write(f"[{time.perf_counter() - t0:7.1f} s] {ln}")
                f.flush()

    def text(self) -> str:
        self._thread.join(timeout=BUILD_GRACE_S)
        return "".join(self.lines)


def run_build(
    family: str,
    stages: list[str] | None,
    art: Path,
    cache: Path,
    env: dict[str, str],
    a,
    timeout: float,
    log_path: Path,
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "ttsaot.builder.cli",
        "build",
        family,
        "--random-weights",
        "--preset",
        a.preset,
        "--device",
        a.device,
        "--out",
        str(art),
        "--cache-dir",
        str(cache),
        "--jobs",
        str(a.jobs),
    ]
    if stages:
        cmd += ["--stages", ",".join(stages)]
    cmd += shlex.split(a.build_args)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=str(REPO), start_new_session=True
    )
    _RUNNING.append(proc)
    out = _TimedLog(proc, t0, log_path)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        return {
            "status": "skipped",
            "wall_s": round(time.perf_counter() - t0, 1),
            "reason": f"stopped at the end of the budget ({timeout:.0f} s left when it started)",
            "log_tail": progress_lines(out.text())[-LOG_TAIL_LINES:],
            "log": log_path.name,
        }
    finally:
        _RUNNING.remove(proc)
    wall = time.perf_counter() - t0
    log = out.text()
    rec: dict[str, Any] = {
        "command": " ".join(["build-artifacts", *cmd[4:]]),
        "wall_s": round(wall, 1),
        "jobs": a.jobs,
        "log": log_path.name,
    }
    if proc.returncode != 0:
        return {
            **rec,
            "status": "failed",
            "reason": f"exit {proc.returncode}",
            "log_tail": log.strip().splitlines()[-5:],
        }
    per_stage = parse_reuse(log)
    manifest = json.loads((art / family / "manifest.json").read_text())
    built = {name: len(s["buckets"]) for name, s in manifest["stages"].items()}
    missing = sorted(set(built) - set(per_stage))
    if missing:
        return {**rec, "status": "failed", "reason": f"no package-cache note for stage(s) {missing} in the output"}
    rec.update(
        status="ok",
        up_to_date=UP_TO_DATE_NOTE in log,
        stages=per_stage,
        # packages compiled or reused (a dynamic package serves several buckets: --dynamic-packages cold / on)
        packages=sum(s["packages"] for s in per_stage.values()),
        buckets=sum(built.values()),
        reused=sum(s["reused"] for s in per_stage.values()),
        compiled=sum(s["compiled"] for s in per_stage.values()),
    )
    return rec


def golden_inputs(artifact: Path, stage: str, dest: Path) -> Path:
    """The stage's first golden case's inputs, in input order, saved for the cold-start child."""
    import torch

    from ttsaot.runtime.artifact import check_file, read_manifest
    from ttsaot.runtime.verify import load_golden

    entry = read_manifest(artifact).stages[stage]
    if entry.golden is None or not entry.golden_cases:
        raise ValueError(f"stage {stage!r} has no golden case to feed it")
    golden = load_golden(check_file(artifact, entry.golden))
    case = entry.golden_cases[0]
    torch.save([golden[f"{case}/in/{s.name}"] for s in entry.inputs], dest)
    return dest


def cold_starts(family: str, artifact: Path, a, left, save, rec: dict) -> None:
    from .coldstart import measure

    manifest = json.loads((artifact / "manifest.json").read_text())
    for stage in manifest["stages"]:
        if left() < SECTION_MIN_S:
            rec[stage] = {"status": "skipped", "reason": "the --budget was used up"}
            save()
            continue
        try:
            inputs = golden_inputs(artifact, stage, artifact.parent / f"{stage}.coldstart.pt")
        except Exception as e:  # noqa: BLE001 - recorded; the other stages go on
            rec[stage] = {"status": "failed", "reason": f"golden inputs: {short_error(e)}"}
            save()
            continue
        stage_res = {"stage": {"family": family, "stage": stage, "preset": a.preset, "seed": 0, "axes": {}}}
        r = measure(
            "ttsaot",
            {"artifact": str(artifact), "inputs": str(inputs)},
            stage_res,
            a.device,
            min(a.coldstart_budget, left()),
            "default",
        )
        if r.get("status") == "ok":
            # the target is stated beyond interpreter start + import torch (+ CUDA init, inside load on CUDA)
            r["beyond_import_s"] = round(r["first_output_s"] - r["startup_s"], 3)
        rec[stage] = r
        print(
            f"[bench builds] {family}/{stage} cold start: {r.get('first_output_s', r.get('reason'))}",
            file=sys.stderr,
            flush=True,
        )
        save()


def cold_caches_env(env: dict[str, str], root: Path) -> dict[str, str]:
    """`env` with empty compile caches under `root` (one family's builds share them). The builder keys its own
    Inductor cache under TTSAOT_INDUCTOR_CACHE_DIR and sets TORCHINDUCTOR_CACHE_DIR itself: without the first, a
    "cold" build reused /tmp/ttsaot_inductor_<uid> from earlier runs on the same host."""
    inductor = str(root / "inductor")
    return dict(
        env, TTSAOT_INDUCTOR_CACHE_DIR=inductor, TORCHINDUCTOR_CACHE_DIR=inductor, TRITON_CACHE_DIR=str(root / "triton")
    )


def main(a) -> int:
    import torch

    from ttsaot.builder.parallel_compile import default_jobs

    from .common import device_info
    from .specs import family_names, stage_names

    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = a.device.startswith("cuda")
    a.preset = a.preset or ("full" if cuda else "tiny")
    a.jobs = a.jobs or default_jobs()
    env = dict(os.environ, COLUMNS="400")  # the cache notes must not be wrapped by the console
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if cuda and "CXX" not in env and Path("/usr/bin/g++").exists():
        env["CXX"] = "/usr/bin/g++"  # AOTI packages built with another compiler segfault on load (GPU box)
    dev = torch.device(a.device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", 0)
    info = device_info(dev)
    path = Path(a.result) if a.result else Path(a.out) / info["slug"] / "builds.json"
    families = a.families or family_names()
    deviations = ([f"stages limited to {a.stages}"] if a.stages else []) + (
        [f"build flags {a.build_args!r}"] if a.build_args.strip() else []
    )
    res: dict[str, Any] = {
        "kind": "builds",
        "schema": 1,
        "status": "running",
        "device": info,
        "git_commit": git_commit(),
        "started": now_iso(),
        "preset": a.preset,
        "jobs": a.jobs,
        "budget_s": a.budget,
        "default_build": not deviations,
        "deviations": deviations,
        "cxx": env.get("CXX"),
        "families": {},
        "notes": [
            "cold = empty --cache-dir and empty Inductor/Triton caches; warm = the same command again, no "
            "change (the installed artifact is checked, not rebuilt: builder/build_inputs.py); cached = the same "
            "command into a new --out, every package from the package cache. Cold start: bench/coldstart.py "
            "(fresh process, empty Inductor cache), the stage's first "
            "golden case as input; beyond_import_s = first_output_s - startup_s (interpreter + import torch)."
        ],
    }
    t_begin = time.time()

    def stop(signum, frame):  # an outer timeout must not leave a build running in its own session
        for proc in list(_RUNNING):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)  # the build removes its temporary folder on SIGTERM ...
            deadline = time.time() + STOP_WAIT_S  # ... once its compile step returns to Python
            while proc.poll() is None and time.time() < deadline:
                time.sleep(0.2)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)

    def left() -> float:
        return a.budget - (time.time() - t_begin)

    def save() -> None:
        res["wall_s"] = round(time.time() - t_begin, 1)
        write_json(path, res)

    save()
    with tempfile.TemporaryDirectory(prefix="bench-builds-") as tmp:
        for fam in families:
            try:
                stages = [s for s in stage_names(fam, a.preset) if s in a.stages] if a.stages else None
            except Exception as e:  # noqa: BLE001 - an unknown family is recorded, the others go on
                res["families"][fam] = {"status": "failed", "reason": short_error(e)}
                save()
                continue
            if stages == []:
                res["families"][fam] = {"status": "skipped", "reason": f"none of {a.stages} in this family"}
                save()
                continue
            root = Path(tmp) / fam
            art, cache = root / "artifacts", root / "package-cache"
            fenv = cold_caches_env(env, root)
            rec: dict[str, Any] = {"stages_asked": stages or "all", "cold_start": {}}
            res["families"][fam] = rec
            for phase in PHASES:
                if phase != "cold" and rec["cold"].get("status") != "ok":
                    rec[phase] = {"status": "skipped", "reason": "no cold build to reuse"}
                elif left() < SECTION_MIN_S:
                    rec[phase] = {"status": "skipped", "reason": "the --budget was used up"}
                else:
                    print(
                        f"[bench builds] {fam}: {phase} build ({left():.0f} s of budget left)",
                        file=sys.stderr,
                        flush=True,
                    )
                    # cached: the same command into a new --out, so that only the package cache can serve it
                    out = art if phase != "cached" else root / "artifacts-cached"
                    log = path.parent / "build_logs" / f"{fam}-{phase}.log"  # the timeline, lines stamped
                    rec[phase] = run_build(fam, stages, out, cache, fenv, a, left(), log)
                    print(
                        f"[bench builds] {fam}: {phase} {rec[phase].get('status')} {rec[phase].get('wall_s')} s, "
                        f"{rec[phase].get('compiled')} compiled / {rec[phase].get('reused')} reused",
                        file=sys.stderr,
                        flush=True,
                    )
                save()
                if phase == COLD_STARTS_AFTER and (art / fam / "manifest.json").is_file():
                    cold_starts(fam, art / fam, a, left, save, rec["cold_start"])
            rec["status"] = (
                "ok"
                if all(rec[p].get("status") == "ok" for p in PHASES)
                and all(r.get("status") == "ok" for r in rec["cold_start"].values())
                and rec["cold_start"]
                else "incomplete"
            )
            save()
    res["status"] = "ok" if all(f.get("status") == "ok" for f in res["families"].values()) else "incomplete"
    save()
    print(summary(res))
    print(f"→ {path}")
    return 0 if res["status"] == "ok" else 1


def _load_cell(r: dict) -> str:
    """A cold start's load seconds, with its phases where the run recorded them (`load_stats`, from 2026-11-28)."""
    ls = r.get("load_stats")
    if not ls:
        return f"{r['load_s']:.2f}"
    parts = [ls.get(k) for k in ("validate_s", "weights_s", "package_load_s", "warmup_capture_s")]
    return f"{r['load_s']:.2f} (" + " / ".join("—" if p is None else f"{p:.2f}" for p in parts) + ")"


def _s(rec: dict | None, key: str = "wall_s") -> str:
    if not rec:
        return "—"
    if rec.get("status") != "ok":
        return rec.get("status", "—")
    v = rec.get(key)
    return "—" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)


STOPPED_PROGRESS = re.compile(r"^compile (\w+)\b.*?\s(\d+)/(\d+)(?:\s|$)")


def stopped_progress(rec: dict) -> str:
    """What a build stopped by the budget had compiled, per stage, from its last progress bars in the record's
    log tail: "fast_ar 2/3, dac_decoder 7/27" ("" when the tail holds none)."""
    last: dict[str, str] = {}
    for ln in rec.get("log_tail") or []:
        m = STOPPED_PROGRESS.match(ln.strip())
        if m:
            last[m[1]] = f"{m[2]}/{m[3]}"
    return ", ".join(f"{stage} {done}" for stage, done in last.items())


def _cold_cells(cold: dict) -> tuple[str, str]:
    """The cold build's time and compiled-packages cells; a build the budget stopped shows how far it got."""
    if cold.get("status") == "skipped" and cold.get("wall_s") is not None:
        return f"> {cold['wall_s']:.0f} (stopped)", stopped_progress(cold) or "—"
    return _s(cold), _s(cold, "compiled")


def summary(res: dict) -> str:
    """The Markdown section of BENCHMARKS.md (bench/report.py) and the run's printed summary."""
    head = (
        f"Build time and cold start (`python -m bench builds`, preset {res.get('preset')}, --jobs "
        f"{res.get('jobs')}, commit `{str(res.get('git_commit', ''))[:12]}`"
        + ("" if res.get("default_build") else f"; NOT the default build: {'; '.join(res['deviations'])}")
        + "):"
    )
    rows = [
        "| family | cold build s | compiled | no-change rebuild s | cached build s (new --out) | reused / packages |",
        "|---|---|---|---|---|---|",
    ]
    cs = [
        "| stage | first output s | import torch s | beyond import s | load s (checks / weights / packages / "
        "warm-up + capture) | buckets |",
        "|---|---|---|---|---|---|",
    ]
    for fam, f in res.get("families", {}).items():
        cold, warm, cached = f.get("cold"), f.get("warm"), f.get("cached")
        if cold is None:
            rows.append(f"| {fam} | {f.get('status')}: {f.get('reason', '')} | | | | |")
            continue
        reuse = " · ".join(
            f"{r['reused']} / {r['packages']}" for r in (warm, cached) if r and r.get("status") == "ok"
        ) or _s(warm)
        cold_s, compiled = _cold_cells(cold)
        no_change = _s(warm) + (" (up to date)" if warm and warm.get("up_to_date") else "")
        rows.append(f"| {fam} | {cold_s} | {compiled} | {no_change} | {_s(cached)} | {reuse} |")
        for st, r in f.get("cold_start", {}).items():
            if r.get("status") != "ok":
                cs.append(f"| {fam}/{st} | {r.get('status')}: {str(r.get('reason', ''))[:80]} | | | | |")
                continue
            cs.append(
                f"| {fam}/{st} | {r['first_output_s']:.2f} | {r['startup_s']:.2f} | {r['beyond_import_s']:.2f}"
                f" | {_load_cell(r)} | {r.get('buckets_loaded', '—')} |"
            )
    skipped = [
        f"{fam}: {p} {f[p].get('reason')}"
        for fam, f in res.get("families", {}).items()
        for p in PHASES
        if isinstance(f.get(p), dict) and f[p].get("status") == "skipped"
    ]
    # notes after the run's own legend (the first) were added to a result by hand, e.g. a caveat found later
    extra = [f"Note: {n}" for n in res.get("notes", [])[1:]]
    tail = (["", "Skipped: " + "; ".join(skipped)] if skipped else []) + (["", *extra] if extra else [])
    return "\n".join([head, "", *rows, "", *cs, *tail])
